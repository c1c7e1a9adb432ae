//! The data path of the safe `nccl` crate on real GPUs: every collective and point-to-point call
//! with the values each rank receives, both with one process driving every GPU (`Comm::init_all`
//! and `nccl::group`) and with one process per GPU; every element type and operator; streams per
//! call; CUDA graph capture and replay; the all-or-nothing group; one test per refused argument;
//! registered buffers, windows, custom operators and simulation. Every test works for any number
//! N ≥ 2 of GPUs (roots and peers are chosen away from rank 0).

use std::fmt::Debug;
use std::sync::Arc;

use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DeviceSlice, SyncOnDrop};
use gpucomm_launch::{Options, Rendezvous};
use gpucomm_tests::{device_count, multi_process, require_gpus};
use nccl::{group, Collectives, Comm, Error, MemBuffer, NcclType, PreMulSum, ReduceOp, Root, WindowFlags};
use nccl::{DeviceBuffer, DeviceBufferMut, DeviceMemory};

/// Elements per rank: odd, so that no size is a multiple of anything NCCL prefers.
const M: usize = 1001;

/// The value rank `r` contributes at index `i` (exact in f32 for every rank and index used here).
fn v(r: usize, i: usize) -> f32 {
    (r * 1000 + i) as f32
}

/// `v` summed over `n` ranks.
fn sum_v(n: usize, i: usize) -> f32 {
    (0..n).map(|r| v(r, i)).sum()
}

/// The communicators this process drives: every GPU's (one process) or its own (one process per
/// GPU). The checks below issue every call through a group over these, which works in both cases.
struct Local {
    comms: Vec<Comm>,
}

impl Local {
    /// Number of ranks in the communicators.
    fn size(&self) -> usize {
        self.comms[0].size()
    }

    /// One buffer per local rank, holding `f(rank)`.
    fn up<T: DeviceRepr>(&self, f: impl Fn(usize) -> Vec<T>) -> Vec<CudaSlice<T>> {
        self.comms.iter().map(|c| c.stream().clone_htod(&f(c.rank())).unwrap()).collect()
    }

    /// Checks every element of every local rank's buffer against `want(rank, index)`.
    fn expect<T: DeviceRepr + PartialEq + Debug>(
        &self,
        what: &str,
        bufs: &[impl DeviceBuffer<T>],
        want: impl Fn(usize, usize) -> Option<T>,
    ) {
        for (c, b) in self.comms.iter().zip(bufs) {
            let got = c.stream().clone_dtoh(b).unwrap();
            for (i, x) in got.iter().enumerate() {
                if let Some(w) = want(c.rank(), i) {
                    assert_eq!(*x, w, "{what}: rank {} of {}, element {i}", c.rank(), self.size());
                }
            }
        }
    }

    /// A small all-reduce over every rank, checked: the communicators still work.
    fn still_works(&self) {
        let mut bufs = self.up(|r| vec![(r + 1) as f32; 3]);
        group(|g| {
            for (c, b) in self.comms.iter().zip(bufs.iter_mut()) {
                g.with(c).all_reduce_in_place(b, ReduceOp::SUM)?;
            }
            Ok(())
        })
        .unwrap();
        let n = self.size();
        self.expect("all_reduce after a refused call", &bufs, |_, _| Some((n * (n + 1) / 2) as f32));
        for c in &self.comms {
            c.async_error().unwrap();
        }
    }

    fn finish(self) {
        for c in self.comms {
            c.finalize().map_err(|(_, e)| e).unwrap();
        }
    }
}

/// One process driving every GPU (at least 2), or `None` after skipping.
fn all_gpus(test: &str) -> Option<Local> {
    let streams = require_gpus(test, device_count().max(2))?;
    Some(Local { comms: Comm::init_all(&streams).unwrap() })
}

/// Runs `body` in one process per GPU (at least 2), each with its own communicator.
fn one_per_process(test: &str, body: impl FnOnce(Local)) {
    multi_process(test, device_count().max(2), |info, stream| {
        let mut rendezvous = Rendezvous::connect(&info, &Options::from_env().unwrap()).unwrap();
        let comm = Comm::from_rendezvous(stream, &mut rendezvous).unwrap();
        assert_eq!(comm.rank(), info.rank);
        body(Local { comms: vec![comm] });
    });
}

/// Every collective and point-to-point call, through groups, with roots and peers away from 0.
fn check_collectives(l: &Local) {
    let n = l.size();
    let last = n - 1;

    // all_reduce, out of place, on views at odd offsets: only the views change.
    let sends = l.up(|r| (0..M + 3).map(|i| if i < 3 { -7.0 } else { v(r, i - 3) }).collect());
    let mut recvs = l.up(|_| vec![-1.0f32; M + 9]);
    {
        let send_views: Vec<_> = sends.iter().map(|s| s.slice(3..3 + M)).collect();
        let mut recv_views: Vec<_> = recvs.iter_mut().map(|r| r.slice_mut(5..5 + M)).collect();
        group(|g| {
            for ((c, s), r) in l.comms.iter().zip(&send_views).zip(recv_views.iter_mut()) {
                g.with(c).all_reduce(s, r, ReduceOp::SUM)?;
            }
            Ok(())
        })
        .unwrap();
    }
    l.expect("all_reduce on views", &recvs, |_, i| Some(if (5..5 + M).contains(&i) { sum_v(n, i - 5) } else { -1.0 }));
    l.expect("all_reduce send views untouched", &sends, |r, i| Some(if i < 3 { -7.0 } else { v(r, i - 3) }));

    // all_reduce in place.
    let mut bufs = l.up(|r| (0..M).map(|i| v(r, i)).collect());
    group(|g| {
        for (c, b) in l.comms.iter().zip(bufs.iter_mut()) {
            g.with(c).all_reduce_in_place(b, ReduceOp::SUM)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("all_reduce_in_place", &bufs, |_, i| Some(sum_v(n, i)));

    // broadcast out of place from the last rank: only the root has a send buffer.
    let sends = l.up(|r| (0..M).map(|i| v(r, i)).collect());
    let mut recvs = l.up(|_| vec![-1.0f32; M]);
    group(|g| {
        for ((c, s), r) in l.comms.iter().zip(&sends).zip(recvs.iter_mut()) {
            g.with(c).broadcast(if c.rank() == last { Root::Here(s) } else { Root::Rank(last) }, r)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("broadcast from the last rank", &recvs, |_, i| Some(v(last, i)));

    // broadcast in place from rank 1.
    let mut bufs = l.up(|r| (0..M).map(|i| v(r, i)).collect());
    group(|g| {
        for (c, b) in l.comms.iter().zip(bufs.iter_mut()) {
            g.with(c).broadcast_in_place(b, 1)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("broadcast_in_place from rank 1", &bufs, |_, i| Some(v(1, i)));

    // reduce out of place to the last rank: only the root has a receive buffer.
    let sends = l.up(|r| (0..M).map(|i| v(r, i)).collect());
    let mut recvs = l.up(|_| vec![-1.0f32; M]);
    group(|g| {
        for ((c, s), r) in l.comms.iter().zip(&sends).zip(recvs.iter_mut()) {
            g.with(c).reduce(s, if c.rank() == last { Root::Here(r) } else { Root::Rank(last) }, ReduceOp::SUM)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("reduce to the last rank", &recvs, |r, i| Some(if r == last { sum_v(n, i) } else { -1.0 }));

    // reduce in place to rank 1: the other ranks' buffers are only read.
    let mut bufs = l.up(|r| (0..M).map(|i| v(r, i)).collect());
    group(|g| {
        for (c, b) in l.comms.iter().zip(bufs.iter_mut()) {
            g.with(c).reduce_in_place(b, ReduceOp::SUM, 1)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("reduce_in_place to rank 1", &bufs, |r, i| Some(if r == 1 { sum_v(n, i) } else { v(r, i) }));

    // all_gather.
    let sends = l.up(|r| (0..M).map(|i| v(r, i)).collect());
    let mut recvs = l.up(|_| vec![-1.0f32; n * M]);
    group(|g| {
        for ((c, s), r) in l.comms.iter().zip(&sends).zip(recvs.iter_mut()) {
            g.with(c).all_gather(s, r)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("all_gather", &recvs, |_, k| Some(v(k / M, k % M)));

    // all_gather in place: each rank fills only its own block.
    let mut bufs = l.up(|r| (0..n * M).map(|k| if k / M == r { v(r, k % M) } else { -1.0 }).collect());
    group(|g| {
        for (c, b) in l.comms.iter().zip(bufs.iter_mut()) {
            g.with(c).all_gather_in_place(b)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("all_gather_in_place", &bufs, |_, k| Some(v(k / M, k % M)));

    // reduce_scatter: rank r gets block r of the sum.
    let sends = l.up(|r| (0..n * M).map(|k| v(r, k)).collect());
    let mut recvs = l.up(|_| vec![-1.0f32; M]);
    group(|g| {
        for ((c, s), r) in l.comms.iter().zip(&sends).zip(recvs.iter_mut()) {
            g.with(c).reduce_scatter(s, r, ReduceOp::SUM)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("reduce_scatter", &recvs, |r, i| Some(sum_v(n, r * M + i)));

    // reduce_scatter in place: rank r's block of the sum lands in its own block.
    let mut bufs = l.up(|r| (0..n * M).map(|k| v(r, k)).collect());
    group(|g| {
        for (c, b) in l.comms.iter().zip(bufs.iter_mut()) {
            g.with(c).reduce_scatter_in_place(b, ReduceOp::SUM)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("reduce_scatter_in_place", &bufs, |r, k| (k / M == r).then(|| sum_v(n, k)));

    // all_to_all: block j of rank r's result is block r of rank j's input.
    let sends = l.up(|r| (0..n * M).map(|k| v(r, k)).collect());
    let mut recvs = l.up(|_| vec![-1.0f32; n * M]);
    group(|g| {
        for ((c, s), r) in l.comms.iter().zip(&sends).zip(recvs.iter_mut()) {
            g.with(c).all_to_all(s, r)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("all_to_all", &recvs, |r, k| Some(v(k / M, r * M + k % M)));

    // gather to the last rank (every rank passes a receive buffer; NCCL fills the root's).
    let sends = l.up(|r| (0..M).map(|i| v(r, i)).collect());
    let mut recvs = l.up(|_| vec![-1.0f32; n * M]);
    group(|g| {
        for ((c, s), r) in l.comms.iter().zip(&sends).zip(recvs.iter_mut()) {
            g.with(c).gather(s, r, last)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("gather to the last rank", &recvs, |r, k| (r == last).then(|| v(k / M, k % M)));

    // scatter from rank 1.
    let sends = l.up(|r| (0..n * M).map(|k| v(r, k)).collect());
    let mut recvs = l.up(|_| vec![-1.0f32; M]);
    group(|g| {
        for ((c, s), r) in l.comms.iter().zip(&sends).zip(recvs.iter_mut()) {
            g.with(c).scatter(s, r, 1)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("scatter from rank 1", &recvs, |r, i| Some(v(1, r * M + i)));

    // gather in place to the last rank: each rank's own block is its input; the others' buffers
    // are left as they were.
    let mut bufs = l.up(|r| (0..n * M).map(|k| if k / M == r { v(r, k % M) } else { -1.0 }).collect());
    group(|g| {
        for (c, b) in l.comms.iter().zip(bufs.iter_mut()) {
            g.with(c).gather_in_place(b, last)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("gather_in_place to the last rank", &bufs, |r, k| {
        Some(if r == last || k / M == r { v(k / M, k % M) } else { -1.0 })
    });

    // scatter in place from rank 1: block r of rank 1's buffer lands in block r of rank r's.
    let mut bufs = l.up(|r| (0..n * M).map(|k| if r == 1 { v(1, k) } else { -1.0 }).collect());
    group(|g| {
        for (c, b) in l.comms.iter().zip(bufs.iter_mut()) {
            g.with(c).scatter_in_place(b, 1)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("scatter_in_place from rank 1", &bufs, |r, k| Some(if r == 1 || k / M == r { v(1, k) } else { -1.0 }));

    // send/recv ring: each rank sends to the next and receives from the previous.
    let sends = l.up(|r| (0..M).map(|i| v(r, i)).collect());
    let mut recvs = l.up(|_| vec![-1.0f32; M]);
    group(|g| {
        for ((c, s), r) in l.comms.iter().zip(&sends).zip(recvs.iter_mut()) {
            let me = g.with(c);
            me.send(s, (c.rank() + 1) % n)?;
            me.recv(r, (c.rank() + n - 1) % n)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("send/recv ring", &recvs, |r, i| Some(v((r + n - 1) % n, i)));
}

/// An element type with exact conversions for the small integers used below, and how far NCCL's
/// arithmetic in it may stray (AVG multiplies by 1/N, inexact unless N is a power of two).
trait Elem: NcclType + Copy + Debug {
    fn of(x: f64) -> Self;
    fn get(self) -> f64;
    const TOLERANCE: f64 = 0.0;
}

macro_rules! elem {
    ($($t:ty: $of:expr, $get:expr, $tol:expr;)*) => {$(
        impl Elem for $t {
            fn of(x: f64) -> Self {
                $of(x)
            }
            fn get(self) -> f64 {
                $get(self)
            }
            const TOLERANCE: f64 = $tol;
        }
    )*};
}

elem! {
    i8: |x| x as i8, |v| v as f64, 0.0;
    u8: |x| x as u8, |v| v as f64, 0.0;
    i32: |x| x as i32, |v| v as f64, 0.0;
    u32: |x| x as u32, |v| v as f64, 0.0;
    i64: |x| x as i64, |v| v as f64, 0.0;
    u64: |x| x as u64, |v| v as f64, 0.0;
    f32: |x| x as f32, |v: f32| v as f64, 1e-6;
    f64: |x| x, |v| v, 1e-12;
    half::f16: half::f16::from_f64, half::f16::to_f64, 1e-2;
    half::bf16: half::bf16::from_f64, half::bf16::to_f64, 2e-2;
    float8::F8E4M3: float8::F8E4M3::from_f64, |v: float8::F8E4M3| v.to_f64(), 0.13;
    float8::F8E5M2: float8::F8E5M2::from_f64, |v: float8::F8E5M2| v.to_f64(), 0.26;
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

impl Op {
    const ALL: [Op; 5] = [Op::Sum, Op::Prod, Op::Max, Op::Min, Op::Avg];

    fn nccl(self) -> ReduceOp {
        match self {
            Op::Sum => ReduceOp::SUM,
            Op::Prod => ReduceOp::PROD,
            Op::Max => ReduceOp::MAX,
            Op::Min => ReduceOp::MIN,
            Op::Avg => ReduceOp::AVG,
        }
    }

    /// Rank `r`'s input at `i`: small values whose results, and every partial result, are exact
    /// even in FP8 for up to 8 ranks.
    fn input(self, r: usize, i: usize) -> f64 {
        match self {
            Op::Sum => ((r + i) % 2) as f64,
            Op::Prod => 1.0 + ((r + i) % 2) as f64,
            Op::Max | Op::Min => ((r * 3 + i) % 5) as f64,
            Op::Avg => (i % 3) as f64,
        }
    }

    fn expected(self, n: usize, i: usize) -> f64 {
        let xs = (0..n).map(|r| self.input(r, i));
        match self {
            Op::Sum => xs.sum(),
            Op::Prod => xs.product(),
            Op::Max => xs.fold(f64::MIN, f64::max),
            Op::Min => xs.fold(f64::MAX, f64::min),
            Op::Avg => xs.sum::<f64>() / n as f64,
        }
    }
}

/// Every operator on elements of type `T` (all_reduce, out of place).
fn check_ops<T: Elem>(l: &Local) {
    let n = l.size();
    for op in Op::ALL {
        let sends = l.up(|r| (0..M).map(|i| T::of(op.input(r, i))).collect());
        let mut recvs = l.up(|_| vec![T::of(0.0); M]);
        group(|g| {
            for ((c, s), r) in l.comms.iter().zip(&sends).zip(recvs.iter_mut()) {
                g.with(c).all_reduce(s, r, op.nccl())?;
            }
            Ok(())
        })
        .unwrap();
        for (c, b) in l.comms.iter().zip(&recvs) {
            for (i, x) in c.stream().clone_dtoh(b).unwrap().into_iter().enumerate() {
                let want = op.expected(n, i);
                let ok = (x.get() - want).abs() <= T::TOLERANCE * want.abs().max(1.0);
                assert!(
                    ok,
                    "{op:?} on {}: rank {}, element {i} is {x:?}, want {want}",
                    std::any::type_name::<T>(),
                    c.rank()
                );
            }
        }
    }
}

fn check_every_type(l: &Local) {
    check_ops::<i8>(l);
    check_ops::<u8>(l);
    check_ops::<i32>(l);
    check_ops::<u32>(l);
    check_ops::<i64>(l);
    check_ops::<u64>(l);
    check_ops::<f32>(l);
    check_ops::<f64>(l);
    check_ops::<half::f16>(l);
    check_ops::<half::bf16>(l);
    check_ops::<float8::F8E4M3>(l);
    check_ops::<float8::F8E5M2>(l);
}

/// An in-place all-reduce on every local rank, each with its own operator.
fn all_reduce_each<T: NcclType>(l: &Local, bufs: &mut [impl DeviceBufferMut<T>], ops: &[PreMulSum<'_, T>]) {
    group(|g| {
        for ((c, b), op) in l.comms.iter().zip(bufs.iter_mut()).zip(ops) {
            g.with(c).all_reduce_in_place(b, op)?;
        }
        Ok(())
    })
    .unwrap();
}

/// PreMulSum with a host scalar (f32 and i32) and a device scalar (a cudarc buffer and a
/// MemBuffer), one operator per communicator.
fn check_premulsum(l: &Local) {
    let n = l.size();
    let s = |i| sum_v(n, i);
    let values = |r| (0..M).map(|i| v(r, i)).collect();

    let host: Vec<_> = l.comms.iter().map(|c| PreMulSum::host(c, 2.0f32).unwrap()).collect();
    let mut bufs = l.up(values);
    all_reduce_each(l, &mut bufs, &host);
    l.expect("PreMulSum host scalar 2 (f32)", &bufs, |_, i| Some(2.0 * s(i)));

    let host_i: Vec<_> = l.comms.iter().map(|c| PreMulSum::host(c, 3i32).unwrap()).collect();
    let mut ints = l.up(|r| (0..M as i32).map(|i| r as i32 + i).collect());
    all_reduce_each(l, &mut ints, &host_i);
    let rank_sum = (n * (n - 1) / 2) as i32;
    l.expect("PreMulSum host scalar 3 (i32)", &ints, |_, i| Some(3 * (rank_sum + n as i32 * i as i32)));

    let scalars = l.up(|_| vec![0.5f32]);
    let device: Vec<_> = l.comms.iter().zip(&scalars).map(|(c, x)| PreMulSum::device(c, x).unwrap()).collect();
    let mut bufs = l.up(values);
    all_reduce_each(l, &mut bufs, &device);
    l.expect("PreMulSum device scalar 0.5 (cudarc buffer)", &bufs, |_, i| Some(0.5 * s(i)));
    drop(device);

    let mem_scalars: Vec<_> = l.comms.iter().map(|c| MemBuffer::from_host(c.stream(), &[4.0f32]).unwrap()).collect();
    let device: Vec<_> = l.comms.iter().zip(&mem_scalars).map(|(c, x)| PreMulSum::device(c, x).unwrap()).collect();
    let mut bufs = l.up(values);
    all_reduce_each(l, &mut bufs, &device);
    l.expect("PreMulSum device scalar 4 (MemBuffer)", &bufs, |_, i| Some(4.0 * s(i)));
    for op in device {
        op.destroy().map_err(|(_, e)| e).unwrap();
    }
}

/// Buffers registered with their communicator, and symmetric windows, used in all-reduces.
fn check_registration_and_windows(l: &Local) {
    let n = l.size();
    let mems: Vec<_> = l
        .comms
        .iter()
        .map(|c| MemBuffer::from_host(c.stream(), &(0..M).map(|i| v(c.rank(), i)).collect::<Vec<_>>()).unwrap())
        .collect();
    let mut registered: Vec<_> =
        l.comms.iter().zip(mems).map(|(c, b)| c.register(b).map_err(|(_, e)| e).unwrap()).collect();
    // A group borrows its buffers until it launches: the writable views live outside it.
    let mut views: Vec<_> = registered.iter_mut().map(|reg| reg.buffer_mut()).collect();
    group(|g| {
        for (c, view) in l.comms.iter().zip(views.iter_mut()) {
            g.with(c).all_reduce_in_place(view, ReduceOp::SUM)?;
        }
        Ok(())
    })
    .unwrap();
    drop(views);
    let mems: Vec<_> = registered.into_iter().map(|reg| reg.deregister().map_err(|(_, e)| e).unwrap()).collect();
    l.expect("all_reduce on registered MemBuffers", &mems, |_, i| Some(sum_v(n, i)));

    let mut windows = if l.comms.len() == 1 {
        vec![l.comms[0]
            .register_window(mems.into_iter().next().unwrap(), WindowFlags::COLL_SYMMETRIC)
            .map_err(|(_, e)| e)
            .unwrap()]
    } else {
        nccl::register_windows(l.comms.iter().zip(mems), WindowFlags::COLL_SYMMETRIC).map_err(|(_, e)| e).unwrap()
    };
    for (c, w) in l.comms.iter().zip(&windows) {
        assert!(!w.as_raw().is_null(), "rank {}: NCCL made no window", c.rank());
        assert_eq!(w.as_ptr(), w.buffer().as_raw());
        assert_eq!(w.comm().rank(), c.rank());
    }
    let mut views: Vec<_> = windows.iter_mut().map(|w| w.as_view_mut()).collect();
    group(|g| {
        for (c, view) in l.comms.iter().zip(views.iter_mut()) {
            g.with(c).all_reduce_in_place(view, ReduceOp::SUM)?;
        }
        Ok(())
    })
    .unwrap();
    drop(views);
    let mems: Vec<_> = windows.into_iter().map(|w| w.deregister().map_err(|(_, e)| e).unwrap()).collect();
    l.expect("all_reduce in symmetric windows", &mems, |_, i| Some(n as f32 * sum_v(n, i)));
    for m in mems {
        m.free().map_err(|(_, e)| e).unwrap();
    }
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn every_call_single_process() {
    let Some(l) = all_gpus("every_call_single_process") else { return };
    check_collectives(&l);
    l.finish();
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn every_call_one_process_per_gpu() {
    one_per_process("every_call_one_process_per_gpu", |l| {
        check_collectives(&l);
        check_direct_calls(&l.comms[0]);
        l.finish();
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn every_type_and_operator_single_process() {
    let Some(l) = all_gpus("every_type_and_operator_single_process") else { return };
    check_every_type(&l);
    l.finish();
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn every_type_and_operator_one_process_per_gpu() {
    one_per_process("every_type_and_operator_one_process_per_gpu", |l| {
        check_every_type(&l);
        l.finish();
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn custom_operators_registration_and_windows_single_process() {
    let Some(l) = all_gpus("custom_operators_registration_and_windows_single_process") else { return };
    check_premulsum(&l);
    check_registration_and_windows(&l);
    l.finish();
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn custom_operators_registration_and_windows_one_process_per_gpu() {
    one_per_process("custom_operators_registration_and_windows_one_process_per_gpu", |l| {
        check_premulsum(&l);
        check_registration_and_windows(&l);
        l.finish();
    });
}

/// Direct calls (no group) on one communicator per process: collectives, a single send and
/// receive, and a call on another stream.
fn check_direct_calls(comm: &Comm) {
    let (n, r, stream) = (comm.size(), comm.rank(), comm.stream());
    let last = n - 1;
    let mine: Vec<f32> = (0..M).map(|i| v(r, i)).collect();
    let send = stream.clone_htod(&mine).unwrap();

    let mut recv = stream.alloc_zeros::<f32>(M).unwrap();
    comm.all_reduce(&send, &mut recv, ReduceOp::MAX).unwrap();
    assert_eq!(stream.clone_dtoh(&recv).unwrap(), (0..M).map(|i| v(last, i)).collect::<Vec<_>>(), "rank {r}");

    let mut got = stream.alloc_zeros::<f32>(M).unwrap();
    comm.broadcast(if r == 1 { Root::Here(&send) } else { Root::Rank(1) }, &mut got).unwrap();
    assert_eq!(stream.clone_dtoh(&got).unwrap(), (0..M).map(|i| v(1, i)).collect::<Vec<_>>(), "rank {r}");

    let mut total = stream.clone_htod(&vec![-1.0f32; M]).unwrap();
    comm.reduce(&send, if r == last { Root::Here(&mut total) } else { Root::Rank(last) }, ReduceOp::SUM).unwrap();
    let want: Vec<f32> = (0..M).map(|i| if r == last { sum_v(n, i) } else { -1.0 }).collect();
    assert_eq!(stream.clone_dtoh(&total).unwrap(), want, "rank {r}");

    // One send, one receive, outside any group: rank 0 to the last rank.
    let mut inbox = stream.clone_htod(&vec![-1.0f32; M]).unwrap();
    if r == 0 {
        comm.send(&send, last).unwrap();
    } else if r == last {
        comm.recv(&mut inbox, 0).unwrap();
    }
    let want: Vec<f32> = (0..M).map(|i| if r == last { v(0, i) } else { -1.0 }).collect();
    assert_eq!(stream.clone_dtoh(&inbox).unwrap(), want, "rank {r}");

    // Another stream of the device: the buffer is ordered onto it and back.
    let side = stream.context().new_stream().unwrap();
    let mut buf = stream.clone_htod(&mine).unwrap();
    comm.on(&side).all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
    assert_eq!(stream.clone_dtoh(&buf).unwrap(), (0..M).map(|i| sum_v(n, i)).collect::<Vec<_>>(), "rank {r}");
    let mut mem = MemBuffer::from_host(stream, &mine).unwrap();
    comm.on(&side).all_reduce_in_place(&mut mem, ReduceOp::SUM).unwrap();
    assert_eq!(stream.clone_dtoh(&mem).unwrap(), (0..M).map(|i| sum_v(n, i)).collect::<Vec<_>>(), "rank {r}");
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn calls_on_other_streams_single_process() {
    let Some(l) = all_gpus("calls_on_other_streams_single_process") else { return };
    let n = l.size();
    let sides: Vec<Arc<CudaStream>> = l.comms.iter().map(|c| c.context().new_stream().unwrap()).collect();
    // One group, two streams per device: the communicator's own and a side stream.
    let mut a = l.up(|r| (0..M).map(|i| v(r, i)).collect());
    let mut b: Vec<_> = l
        .comms
        .iter()
        .map(|c| MemBuffer::from_host(c.stream(), &(0..M).map(|i| v(c.rank(), i)).collect::<Vec<_>>()).unwrap())
        .collect();
    group(|g| {
        for (((c, side), a), b) in l.comms.iter().zip(&sides).zip(a.iter_mut()).zip(b.iter_mut()) {
            g.with(c).on(side).all_reduce_in_place(a, ReduceOp::SUM)?;
            g.with(c).all_reduce_in_place(b, ReduceOp::MAX)?;
        }
        Ok(())
    })
    .unwrap();
    l.expect("all_reduce on side streams", &a, |_, i| Some(sum_v(n, i)));
    l.expect("all_reduce on the communicators' streams", &b, |_, i| Some(v(n - 1, i)));
    l.finish();
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn graph_capture_replays_safe_all_reduces() {
    one_per_process("graph_capture_replays_safe_all_reduces", |l| {
        let comm = &l.comms[0];
        let (n, r, stream) = (comm.size(), comm.rank(), comm.stream());
        // A second stream: cudarc now orders every CudaSlice with events (its multi-stream mode),
        // the case whose waits used to invalidate the capture.
        let capture = stream.context().new_stream().unwrap();
        let mut plain = stream.clone_htod(&vec![(r + 1) as f32; M]).unwrap();
        let mut mem = MemBuffer::from_host(stream, &vec![(r + 1) as f32; M]).unwrap();
        // Warm-up outside the capture (NCCL connects at a communicator's first collective).
        comm.on(&capture).all_reduce_in_place(&mut plain, ReduceOp::SUM).unwrap();
        comm.on(&capture).all_reduce_in_place(&mut mem, ReduceOp::SUM).unwrap();
        let s = (n * (n + 1) / 2) as f32;

        let mut graph = nccl::capture(&capture, (comm, plain, mem), |(comm, plain, mem)| {
            comm.on(&capture).all_reduce_in_place(plain, ReduceOp::SUM)?;
            comm.on(&capture).all_reduce_in_place(mem, ReduceOp::SUM)
        })
        .expect("safe all_reduces inside a capture");
        // Capturing ran nothing.
        let got = stream.clone_dtoh(&graph.kept().1).unwrap();
        assert!(got.iter().all(|&x| x == s), "rank {r}: capture ran the call");

        let mut want = s;
        for replay in 1..=2 {
            graph.launch().unwrap();
            // No synchronisation: the reads on the buffers' home stream wait for the launch on
            // the capture stream by themselves.
            want *= n as f32;
            let (_, plain, mem) = graph.kept();
            for (what, got) in
                [("CudaSlice", stream.clone_dtoh(plain).unwrap()), ("MemBuffer", stream.clone_dtoh(mem).unwrap())]
            {
                assert!(
                    got.iter().all(|&x| x == want),
                    "rank {r}, replay {replay}, {what}: {:?}, want {want}",
                    &got[..4]
                );
            }
        }
        drop(graph);
        l.finish();
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn a_refused_call_launches_nothing_in_its_group() {
    // Before groups were all or nothing, rank 0's call launched alone here and GPU 0 waited forever.
    let Some(l) = all_gpus("a_refused_call_launches_nothing_in_its_group") else { return };
    let mut bufs = l.up(|r| vec![(r + 1) as f32; M]);
    // Rank 1's buffer is on GPU 0: its call is refused.
    let mut misplaced = l.comms[0].stream().clone_htod(&vec![5.0f32; M]).unwrap();
    let mut spare = Some(&mut misplaced);
    let err = group(|g| {
        for (c, b) in l.comms.iter().zip(bufs.iter_mut()) {
            if c.rank() == 1 {
                let m = spare.take().expect("one misplaced buffer");
                g.with(c).all_reduce_in_place(m, ReduceOp::SUM)?;
            } else {
                g.with(c).all_reduce_in_place(b, ReduceOp::SUM)?;
            }
        }
        Ok(())
    })
    .unwrap_err();
    assert!(matches!(err, Error::WrongDevice { what: "buffer", expected: 1, got: 0 }), "{err}");
    for c in &l.comms {
        c.stream().synchronize().unwrap();
    }
    l.expect("buffers of a refused group", &bufs, |r, _| Some((r + 1) as f32));

    // The closure ignores the refusal: still nothing launches.
    let mut spare = Some(&mut misplaced);
    let err = group(|g| {
        for (c, b) in l.comms.iter().zip(bufs.iter_mut()) {
            if c.rank() == 1 {
                let m = spare.take().expect("one misplaced buffer");
                let _ignored = g.with(c).all_reduce_in_place(m, ReduceOp::SUM);
            } else {
                g.with(c).all_reduce_in_place(b, ReduceOp::SUM)?;
            }
        }
        Ok(())
    })
    .unwrap_err();
    assert!(matches!(err, Error::GroupRefused { refused: 1 }), "{err}");
    l.expect("buffers of a group whose refusal was ignored", &bufs, |r, _| Some((r + 1) as f32));
    assert_eq!(l.comms[0].stream().clone_dtoh(&misplaced).unwrap(), vec![5.0; M]);

    l.still_works();
    l.finish();
}

/// A buffer that claims more elements than memory holds: only the host-side checks may see it.
struct Huge {
    len: usize,
    stream: Arc<CudaStream>,
}

impl DeviceSlice<f32> for Huge {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl DevicePtr<f32> for Huge {
    fn device_ptr<'a>(&'a self, _: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        panic!("the checks must refuse this buffer before its pointer is taken")
    }
}

// SAFETY: not true — `Huge` owns no memory. It exists to show that the length checks refuse it
// before anything reads its address: `device_ptr` panics if they did not.
unsafe impl DeviceMemory for Huge {
    type Elem = f32;
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn bad_arguments_are_refused_and_lose_nothing() {
    let Some(l) = all_gpus("bad_arguments_are_refused_and_lose_nothing") else { return };
    let n = l.size();
    let (c0, c1) = (&l.comms[0], &l.comms[1]);
    let (s0, s1) = (c0.stream(), c1.stream());
    let send = s0.clone_htod(&[1.0f32; 8]).unwrap();

    // Lengths.
    let mut short = s0.clone_htod(&[5.0f32; 4]).unwrap();
    let err = c0.all_reduce(&send, &mut short, ReduceOp::SUM).unwrap_err();
    assert!(matches!(err, Error::LengthMismatch { what: "recv buffer", expected: 8, got: 4 }), "{err}");
    assert_eq!(s0.clone_dtoh(&short).unwrap(), [5.0; 4], "a refused call must not touch the buffer");
    l.still_works();
    let mut gathered = s0.alloc_zeros::<f32>(8 * n - 1).unwrap();
    let err = c0.all_gather(&send, &mut gathered).unwrap_err();
    assert!(
        matches!(err, Error::LengthMismatch { expected, got, .. } if expected == 8 * n && got == 8 * n - 1),
        "{err}"
    );
    l.still_works();
    let mut odd = s0.alloc_zeros::<f32>(n + 1).unwrap();
    let err = c0.reduce_scatter_in_place(&mut odd, ReduceOp::SUM).unwrap_err();
    assert!(matches!(err, Error::NotDivisible { what: "buffer", len, parts } if len == n + 1 && parts == n), "{err}");
    l.still_works();
    let err = c0.gather_in_place(&mut odd, 0).unwrap_err();
    assert!(matches!(err, Error::NotDivisible { what: "buffer", len, parts } if len == n + 1 && parts == n), "{err}");
    l.still_works();

    // Roots and peers.
    let mut buf = s0.alloc_zeros::<f32>(8).unwrap();
    let err = c0.broadcast_in_place(&mut buf, n).unwrap_err();
    assert!(matches!(err, Error::InvalidRank { what: "root", rank, size } if rank == n && size == n), "{err}");
    l.still_works();
    let mut blocks = s0.alloc_zeros::<f32>(8 * n).unwrap();
    let err = c0.scatter_in_place(&mut blocks, n).unwrap_err();
    assert!(matches!(err, Error::InvalidRank { what: "root", rank, size } if rank == n && size == n), "{err}");
    l.still_works();
    let err = c0.reduce(&send, Root::Rank(0), ReduceOp::SUM).unwrap_err();
    assert!(matches!(err, Error::RootWithoutBuffer { call: "ncclReduce", rank: 0 }), "{err}");
    l.still_works();
    let err = c0.send(&send, n).unwrap_err();
    assert!(matches!(err, Error::InvalidRank { what: "peer", rank, size } if rank == n && size == n), "{err}");
    l.still_works();

    // Devices: a buffer, and a stream, of another GPU.
    let mut elsewhere = s1.alloc_zeros::<f32>(8).unwrap();
    let err = c0.all_reduce(&send, &mut elsewhere, ReduceOp::SUM).unwrap_err();
    assert!(matches!(err, Error::WrongDevice { what: "recv buffer", expected: 0, got: 1 }), "{err}");
    l.still_works();
    let err = c0.on(s1).all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap_err();
    assert!(matches!(err, Error::WrongDevice { what: "stream", expected: 0, got: 1 }), "{err}");
    l.still_works();

    // Zero and overflowing counts. A zero-element collective is a no-op for NCCL (frameworks have
    // empty tensors and buckets), so one rank may make it alone.
    let mut empty = s0.null::<f32>().unwrap();
    c0.all_reduce_in_place(&mut empty, ReduceOp::SUM).unwrap();
    l.still_works();
    let err = MemBuffer::<f32>::zeroed(s0, 0).unwrap_err();
    assert!(matches!(err, Error::ZeroSize { call: "ncclMemAlloc" }), "{err}");
    let huge = Huge { len: usize::MAX / 2 + 1, stream: s0.clone() };
    let err = c0.all_gather(&huge, &mut buf).unwrap_err();
    assert!(
        matches!(err, Error::CountOverflow { what: "send buffer", count, factor } if count == huge.len && factor == n),
        "{err}"
    );
    l.still_works();
    // SAFETY: refused before anything is allocated.
    let err = unsafe { MemBuffer::<f32>::uninit(s0, usize::MAX / 2) }.unwrap_err();
    assert!(matches!(err, Error::CountOverflow { what: "MemBuffer bytes", factor: 4, .. }), "{err}");

    // A custom operator of another communicator, and a device scalar of the wrong length.
    let op1 = PreMulSum::host(c1, 2.0f32).unwrap();
    let err = c0.all_reduce_in_place(&mut buf, &op1).unwrap_err();
    assert!(matches!(err, Error::ForeignOp), "{err}");
    l.still_works();
    let two = s0.clone_htod(&[1.0f32, 2.0]).unwrap();
    let err = PreMulSum::device(c0, &two).unwrap_err();
    assert!(matches!(err, Error::LengthMismatch { what: "PreMulSum scalar", expected: 1, got: 2 }), "{err}");

    // Inside a group, direct calls and nested groups are refused.
    let err = group(|_| c0.all_reduce_in_place(&mut buf, ReduceOp::SUM)).unwrap_err();
    assert!(matches!(err, Error::InsideGroup), "{err}");
    let err = group(|_| group(|_| Ok(()))).unwrap_err();
    assert!(matches!(err, Error::InsideGroup), "{err}");
    l.still_works();
    drop(op1);
    l.finish();
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn simulation_estimates_a_group_without_launching_it() {
    let Some(l) = all_gpus("simulation_estimates_a_group_without_launching_it") else { return };
    let mut bufs = l.up(|r| vec![(r + 1) as f32; 1 << 20]);
    let simulated = nccl::simulate(|g| {
        for (c, b) in l.comms.iter().zip(bufs.iter_mut()) {
            g.with(c).all_reduce_in_place(b, ReduceOp::SUM)?;
        }
        Ok("the closure's value")
    })
    .unwrap();
    assert_eq!(simulated.value, "the closure's value");
    let time = simulated.estimated_time.expect("NCCL's estimate");
    assert!(time > std::time::Duration::ZERO, "{time:?}");
    println!("NCCL estimates a 4 MiB all_reduce over {} GPUs at {time:?}", l.size());
    for c in &l.comms {
        c.stream().synchronize().unwrap();
    }
    l.expect("buffers of a simulated group", &bufs, |r, _| Some((r + 1) as f32));
    // Sends and receives cannot be simulated: NCCL would keep them queued for the next group.
    let n = l.size();
    let err = nccl::simulate(|g| {
        for (c, b) in l.comms.iter().zip(bufs.iter_mut()) {
            g.with(c).send(&*b, (c.rank() + 1) % n)?;
        }
        Ok(())
    })
    .unwrap_err();
    assert!(matches!(err, Error::NotSimulable { call: "ncclSend" }), "{err}");
    l.still_works();
    l.finish();
}
