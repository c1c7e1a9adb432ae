//! gpucomm-kernels' dispatching all-reduce on real GPUs. One GPU: a one-rank communicator runs
//! every kernel path (each forced once, every element type, odd counts, unaligned views, in place,
//! eager and replayed from a CUDA graph), the table's choices, symmetric buffers, a calibration,
//! and — with two processes on the one GPU that NCCL takes for two nodes — the fallback to NCCL
//! when the ranks cannot reach each other by loads and stores. Two GPUs: every path summing two
//! ranks' inputs.

use std::sync::Arc;

use cudarc::driver::{sys, CudaStream, DeviceRepr, ValidAsZeroBits};
use gpucomm_kernels::{AllReduce, Calibration, Decision, Fallback, Mode, Options, Path, Table, Why};
use gpucomm_launch::{Options as RdzvOptions, Rendezvous};
use gpucomm_tests::{multi_node_on_one_gpu, multi_process, require_gpus};
use nccl::{Comm, MemBuffer, NcclType, ReduceOp, UniqueId};

/// A small integer pattern, exact in every element type: rank `r` contributes (r + 1)(i mod 13).
fn input<T>(rank: usize, count: usize, from: impl Fn(f32) -> T) -> Vec<T> {
    (0..count).map(|i| from(((rank + 1) * (i % 13)) as f32)).collect()
}

/// The sum of [`input`] over `n` ranks.
fn summed<T>(n: usize, count: usize, from: impl Fn(f32) -> T) -> Vec<T> {
    (0..count).map(|i| from((n * (n + 1) / 2 * (i % 13)) as f32)).collect()
}

/// Options with small staging areas, so that the two-shot takes several launches in the tests.
fn options() -> Options {
    Options { one_shot_max: 256 << 10, staged_max: 64 << 10, ..Options::default() }
}

/// A one-rank communicator on GPU 0, on a stream of its own (capturable).
fn one_rank(test: &str) -> Option<(Arc<CudaStream>, Comm)> {
    let streams = require_gpus(test, 1)?;
    let stream = streams[0].context().new_stream().unwrap();
    let comm = Comm::init_rank(stream.clone(), &UniqueId::new().unwrap(), 0, 1).unwrap();
    Some((stream, comm))
}

/// The counts each path is tried with: within its limits, odd ones included.
fn counts(path: Path, elem: usize) -> Vec<usize> {
    match path {
        Path::Ll => vec![1, 3, 1000, (64 << 10) / elem],
        Path::OneShot => vec![1, 3, 1000, 40_001.min((256 << 10) / elem)],
        // 40 001 f32 = 160 KiB: three launches of the 64 KiB staging regions.
        Path::TwoShot | Path::Nccl => vec![1, 3, 1000, 40_001],
    }
}

/// Runs `path` (forced) out of place and in place, at element offsets 0 and 1, twice each (both
/// slots and call parities), and checks every result against the host.
fn check_path<T>(ar: &mut AllReduce<'_>, stream: &Arc<CudaStream>, path: Path, from: impl Fn(f32) -> T + Copy)
where
    T: NcclType + DeviceRepr + ValidAsZeroBits + PartialEq + std::fmt::Debug + Copy,
{
    let (rank, n) = (ar.comm().rank(), ar.comm().size());
    ar.force(Some(path));
    for count in counts(path, size_of::<T>()) {
        for at in [0, 1] {
            let host = input(rank, count, from);
            let want = summed(n, count, from);
            let send_all = stream.clone_htod(&[vec![from(7.0); at], host.clone()].concat()).unwrap();
            let mut recv_all = stream.alloc_zeros::<T>(at + count).unwrap();
            let send = send_all.slice(at..);
            for _ in 0..2 {
                let mut recv = recv_all.slice_mut(at..);
                let d = ar.all_reduce(stream, &send, &mut recv, ReduceOp::SUM).unwrap();
                assert_eq!(d, Decision { path, why: Why::Forced, mode: Mode::Eager });
            }
            let got = stream.clone_dtoh(&recv_all.slice(at..)).unwrap();
            assert_eq!(got, want, "{path}, {} × {count} at offset {at}, out of place", std::any::type_name::<T>());
            // In place.
            let mut buf_all = stream.clone_htod(&[vec![from(7.0); at], host.clone()].concat()).unwrap();
            let mut buf = buf_all.slice_mut(at..);
            ar.all_reduce_in_place(stream, &mut buf, ReduceOp::SUM).unwrap();
            let got = stream.clone_dtoh(&buf_all.slice(at..)).unwrap();
            assert_eq!(got, want, "{path}, {} × {count} at offset {at}, in place", std::any::type_name::<T>());
            assert_eq!(ar.last().map(|d| d.path), Some(path));
        }
    }
    ar.force(None);
}

fn check_every_path(ar: &mut AllReduce<'_>, stream: &Arc<CudaStream>) {
    for path in Path::ALL {
        check_path(ar, stream, path, |x| x);
        check_path(ar, stream, path, half::bf16::from_f32);
        check_path(ar, stream, path, half::f16::from_f32);
    }
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn every_path_reduces_correctly_on_one_rank() {
    let Some((stream, comm)) = one_rank("every_path_reduces_correctly_on_one_rank") else { return };
    let mut ar = AllReduce::new(&comm, options()).unwrap();
    assert_eq!(ar.fallback(), None, "the kernels must be usable here: {:?}", ar.setup_error());
    check_every_path(&mut ar, &stream);
    println!("every path (nccl, ll, one-shot, two-shot) × f32/bf16/f16 correct on one rank");
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn the_table_and_the_fallbacks_pick_the_path() {
    let Some((stream, comm)) = one_rank("the_table_and_the_fallbacks_pick_the_path") else { return };
    let table = Table::parse("source: test\n[eager]\nll <= 64K\none-shot <= 256K\ntwo-shot <= 1M\nnccl\n").unwrap();
    let ar = AllReduce::new(&comm, Options { table: Some(table), ..options() }).unwrap();
    let run = |count: usize, op| {
        let send = stream.clone_htod(&input(0, count, |x| x)).unwrap();
        let mut recv = stream.alloc_zeros::<f32>(count).unwrap();
        let d = ar.all_reduce(&stream, &send, &mut recv, op).unwrap();
        // One rank: the sum and the maximum are the input.
        assert_eq!(stream.clone_dtoh(&recv).unwrap(), input(0, count, |x| x), "{d}");
        assert_eq!(ar.last(), Some(d));
        d
    };
    let paths: Vec<Path> =
        [2, 16 << 10, 64 << 10, 256 << 10, 2 << 20].iter().map(|&c| run(c, ReduceOp::SUM).path).collect();
    assert_eq!(paths, [Path::Ll, Path::Ll, Path::OneShot, Path::TwoShot, Path::Nccl]);
    let d = run(1024, ReduceOp::MAX);
    assert_eq!((d.path, d.why), (Path::Nccl, Why::Fallback(Fallback::UnsupportedOp)));
    // f64 has no kernel.
    let send = stream.clone_htod(&[1.5f64; 8]).unwrap();
    let mut recv = stream.alloc_zeros::<f64>(8).unwrap();
    let d = ar.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap();
    assert_eq!(d.why, Why::Fallback(Fallback::UnsupportedType { dtype: "f64" }));
    assert_eq!(stream.clone_dtoh(&recv).unwrap(), [1.5; 8]);
    // Refused calls enqueue nothing and say why.
    let mut short = stream.alloc_zeros::<f32>(7).unwrap();
    let err = ar.all_reduce(&stream, &stream.alloc_zeros::<f32>(8).unwrap(), &mut short, ReduceOp::SUM).unwrap_err();
    assert_eq!(err.to_string(), "recv buffer has 7 elements, 8 expected");
    println!("table choices and fallbacks as expected");
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn forced_paths_that_cannot_take_a_call_fail_plainly() {
    let Some((stream, comm)) = one_rank("forced_paths_that_cannot_take_a_call_fail_plainly") else { return };
    let mut ar = AllReduce::new(&comm, options()).unwrap();
    ar.force(Some(Path::Ll));
    let send = stream.alloc_zeros::<f32>(1 << 20).unwrap();
    let mut recv = stream.alloc_zeros::<f32>(1 << 20).unwrap();
    let err = ar.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap_err();
    assert_eq!(err.to_string(), "the forced ll path cannot take this call: larger than the ll kernel's 65536 bytes");
    drop(ar);
    let mut off = AllReduce::new(&comm, Options { kernels: false, ..options() }).unwrap();
    assert_eq!(off.fallback(), Some(Fallback::Disabled));
    let d = off.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap();
    assert_eq!(d.why, Why::Fallback(Fallback::Disabled));
    off.force(Some(Path::OneShot));
    let err = off.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap_err();
    assert_eq!(err.to_string(), "the forced one-shot path cannot take this call: turned off in the options");
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn every_path_replays_from_a_cuda_graph() {
    let Some((stream, comm)) = one_rank("every_path_replays_from_a_cuda_graph") else { return };
    let mut ar = AllReduce::new(&comm, options()).unwrap();
    let count = 5000; // 20 KiB of f32: every path can take it
    let host = input(0, count, |x| x);
    // The crate's buffers: cudarc's event-tracked CudaSlices cannot be captured on a context with
    // several streams (their events were recorded outside the capture).
    let send = MemBuffer::from_host(&stream, &host).unwrap();
    let mut outs: Vec<_> = Path::ALL.iter().map(|_| MemBuffer::<f32>::zeroed(&stream, count).unwrap()).collect();
    // Warm up every path eagerly (first launches load modules and connect NCCL).
    for (path, out) in Path::ALL.iter().zip(outs.iter_mut()) {
        ar.force(Some(*path));
        ar.all_reduce(&stream, &send, out, ReduceOp::SUM).unwrap();
    }
    stream.synchronize().unwrap();
    for out in outs.iter_mut() {
        stream.memset_zeros(out).unwrap();
    }
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    for (path, out) in Path::ALL.iter().zip(outs.iter_mut()) {
        ar.force(Some(*path));
        let d = ar.all_reduce(&stream, &send, out, ReduceOp::SUM).unwrap();
        assert_eq!(d.mode, Mode::Graph, "{d}");
    }
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).unwrap().expect("a graph");
    // Nothing ran during the capture.
    for out in &outs {
        assert!(stream.clone_dtoh(out).unwrap().iter().all(|&x| x == 0.0));
    }
    for _ in 0..3 {
        graph.launch().unwrap();
    }
    stream.synchronize().unwrap();
    for (path, out) in Path::ALL.iter().zip(&outs) {
        assert_eq!(stream.clone_dtoh(out).unwrap(), host, "{path} replayed from a graph");
    }
    // The table's graph section decides inside a capture.
    ar.force(None);
    assert_eq!(ar.plan::<f32>(count, ReduceOp::SUM, Mode::Graph).unwrap().mode, Mode::Graph);
    println!("every path replays from a CUDA graph");
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn symmetric_buffers_reduce_without_copies() {
    let Some((stream, comm)) = one_rank("symmetric_buffers_reduce_without_copies") else { return };
    let mut ar = AllReduce::new(&comm, options()).unwrap();
    let count = 40_001;
    let host = input(0, count, |x| x);
    let mut send = ar.alloc::<f32>(count + 1).unwrap();
    let mut recv = ar.alloc::<f32>(count + 1).unwrap();
    stream.memcpy_htod(&host, &mut send.slice_mut(1..).unwrap()).unwrap();
    for path in [Path::Nccl, Path::OneShot, Path::TwoShot] {
        ar.force(Some(path));
        let d = ar.all_reduce_symmetric(&stream, (&send, 1), (&mut recv, 1), count, ReduceOp::SUM).unwrap();
        assert_eq!(d.path, path);
        assert_eq!(stream.clone_dtoh(&recv.slice(1..).unwrap()).unwrap(), host, "{path}");
        stream.memset_zeros(&mut recv.slice_mut(..).unwrap()).unwrap();
    }
    // LL holds 64 KiB: a smaller range.
    ar.force(Some(Path::Ll));
    ar.all_reduce_symmetric(&stream, (&send, 1), (&mut recv, 1), 1000, ReduceOp::SUM).unwrap();
    assert_eq!(stream.clone_dtoh(&recv.slice(1..1001).unwrap()).unwrap(), &host[..1000]);
    // In place, every path.
    for path in Path::ALL {
        ar.force(Some(path));
        let n = if path == Path::Ll { 1000 } else { count };
        stream.memcpy_htod(&host[..n], &mut recv.slice_mut(1..n + 1).unwrap()).unwrap();
        ar.all_reduce_symmetric_in_place(&stream, &mut recv, 1, n, ReduceOp::SUM).unwrap();
        assert_eq!(stream.clone_dtoh(&recv.slice(1..n + 1).unwrap()).unwrap(), &host[..n], "{path} in place");
    }
    let err = ar.all_reduce_symmetric(&stream, (&send, 2), (&mut recv, 0), count, ReduceOp::SUM).unwrap_err();
    assert_eq!(err.to_string(), "send buffer: elements 2..40003 do not fit a window of 40002 elements");
    println!("symmetric buffers: every path correct, out of place and in place");
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn calibration_makes_a_table() {
    let Some((stream, comm)) = one_rank("calibration_makes_a_table") else { return };
    let mut ar = AllReduce::new(&comm, options()).unwrap();
    let how = Calibration { max_bytes: 1 << 20, iters: 5, ..Calibration::default() };
    let table = ar.calibrate(&stream, &how).unwrap().clone();
    assert!(table.source().starts_with("calibrated on this machine: 1 ranks"), "{}", table.source());
    assert_eq!(Table::parse(&table.to_text()).unwrap(), table);
    println!("calibrated table on one rank:\n{table}");
    // The legacy default stream cannot be captured for the graph timings.
    let err = ar.calibrate(&comm.context().default_stream(), &how).unwrap_err();
    assert!(err.to_string().contains("legacy default stream cannot be captured"), "{err}");
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn ranks_that_cannot_load_from_each_other_fall_back_to_nccl() {
    multi_node_on_one_gpu("ranks_that_cannot_load_from_each_other_fall_back_to_nccl", 2, |info, stream| {
        let stream = stream.context().new_stream().unwrap();
        let mut rdzv = Rendezvous::connect(&info, &RdzvOptions::from_env().unwrap()).unwrap();
        let comm = Comm::from_rendezvous(stream.clone(), &mut rdzv).unwrap();
        let ar = AllReduce::new(&comm, options()).unwrap();
        assert_eq!(ar.fallback(), Some(Fallback::NotOneLsaTeam { lsa: 1, ranks: 2 }));
        let count = 1000;
        let send = stream.clone_htod(&input(info.rank, count, |x| x)).unwrap();
        let mut recv = stream.alloc_zeros::<f32>(count).unwrap();
        let d = ar.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap();
        assert_eq!((d.path, d.why), (Path::Nccl, Why::Fallback(Fallback::NotOneLsaTeam { lsa: 1, ranks: 2 })));
        assert_eq!(stream.clone_dtoh(&recv).unwrap(), summed(2, count, |x| x));
        println!("rank {}: {d}", info.rank);
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn every_path_sums_two_ranks() {
    multi_process("every_path_sums_two_ranks", 2, |info, stream| {
        let stream = stream.context().new_stream().unwrap();
        let mut rdzv = Rendezvous::connect(&info, &RdzvOptions::from_env().unwrap()).unwrap();
        let comm = Comm::from_rendezvous(stream.clone(), &mut rdzv).unwrap();
        let mut ar = AllReduce::new(&comm, options()).unwrap();
        assert_eq!(ar.fallback(), None, "{:?}", ar.setup_error());
        check_every_path(&mut ar, &stream);
        // The table's choice, eagerly, over a range of sizes.
        for count in [1, 1000, 100_000, 1 << 20] {
            let send = stream.clone_htod(&input(info.rank, count, |x| x)).unwrap();
            let mut recv = stream.alloc_zeros::<f32>(count).unwrap();
            let d = ar.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap();
            assert_eq!(stream.clone_dtoh(&recv).unwrap(), summed(2, count, |x| x), "{d}");
        }
        println!("rank {}: every path sums two ranks", info.rank);
    });
}
