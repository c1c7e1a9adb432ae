//! gpucomm-kernels' dispatching all-reduce on real GPUs. One GPU: a one-rank communicator runs
//! every kernel path (each forced once, every element type, odd counts, unaligned views, in place,
//! eager and replayed from a CUDA graph captured through `nccl::capture`), the table's choices,
//! symmetric buffers, a calibration, the capture scope's refusals (a capture opened by cudarc, a
//! keep set without the dispatcher), and — with two processes on the one GPU that NCCL takes for
//! two nodes — the fallback to NCCL when the ranks cannot reach each other by loads and stores.
//! Two GPUs: every path summing two ranks' inputs, and a setup or calibration that fails on one
//! rank alone, which every rank must learn (one GPU runs the failed setup's letting-go on one rank).

use std::sync::Arc;

use cudarc::driver::{sys, CudaStream, DeviceRepr, ValidAsZeroBits};
use gpucomm_kernels::{AllReduce, Calibration, Decision, Fallback, Mode, Options, Path, Table, Why};
use gpucomm_launch::{Options as RdzvOptions, Rendezvous};
use gpucomm_ordering::OrderError;
use gpucomm_tests::{fill_gpu, multi_node_on_one_gpu, multi_process, require_gpus};
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
    ar.force(Some(path)).unwrap();
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
    ar.force(None).unwrap();
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
    ar.force(Some(Path::Ll)).unwrap();
    let send = stream.alloc_zeros::<f32>(1 << 20).unwrap();
    let mut recv = stream.alloc_zeros::<f32>(1 << 20).unwrap();
    let err = ar.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap_err();
    assert_eq!(err.to_string(), "the forced ll path cannot take this call: larger than the ll kernel's 65536 bytes");
    drop(ar);
    let mut off = AllReduce::new(&comm, Options { kernels: false, ..options() }).unwrap();
    assert_eq!(off.fallback(), Some(Fallback::Disabled));
    let d = off.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap();
    assert_eq!(d.why, Why::Fallback(Fallback::Disabled));
    off.force(Some(Path::OneShot)).unwrap();
    let err = off.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap_err();
    assert_eq!(err.to_string(), "the forced one-shot path cannot take this call: turned off in the options");
}

/// The `nccl` crate's error inside an `nccl::capture` closure: the dispatcher's own refusals
/// (lengths, sizes, …) are test failures here.
fn in_nccl(e: gpucomm_kernels::Error) -> nccl::Error {
    match e {
        gpucomm_kernels::Error::Nccl(e) => e,
        other => panic!("the dispatcher refused a captured call: {other}"),
    }
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn every_path_replays_from_a_graph_that_keeps_the_dispatcher() {
    let Some((stream, comm)) = one_rank("every_path_replays_from_a_graph_that_keeps_the_dispatcher") else { return };
    let mut ar = AllReduce::new(&comm, options()).unwrap();
    let count = 5000; // 20 KiB of f32: every path can take it
                      // The graphs are captured on a stream of their own; inputs are written and outputs read on
                      // the buffers' stream between launches, ordered by the launches themselves.
    let side = stream.context().new_stream().unwrap();
    for path in Path::ALL {
        ar.force(Some(path)).unwrap();
        // A cudarc slice (event-tracked) as input, an ncclMemAlloc buffer as output.
        let send = stream.clone_htod(&input(0, count, |x| x)).unwrap();
        let mut recv = MemBuffer::<f32>::zeroed(&stream, count).unwrap();
        // Warm up eagerly (first launches load modules and connect NCCL).
        ar.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap();
        stream.memset_zeros(&mut recv).unwrap();
        let mut decisions = Vec::new();
        // The graph keeps the dispatcher (communicator, device communicator, window) and owns
        // both buffers; the closure gets them back to make its calls.
        let mut graph = nccl::capture(&side, (&ar, send, recv), |(ar, send, recv)| {
            for _ in 0..2 {
                decisions.push(ar.all_reduce(&side, &*send, recv, ReduceOp::SUM).map_err(in_nccl)?);
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(decisions, [Decision { path, why: Why::Forced, mode: Mode::Graph }; 2]);
        // Nothing ran during the capture.
        assert!(stream.clone_dtoh(&graph.kept().2).unwrap().iter().all(|&x| x == 0.0), "{path}");
        for round in 1..=3 {
            // A new input for each replay (one rank: the sum is the input).
            let host = input(0, count, |x| x * round as f32);
            stream.memcpy_htod(&host, &mut graph.kept_mut().1).unwrap();
            graph.launch().unwrap();
            // Read on the buffers' stream without synchronising: the launch is the output's last
            // write, which the read waits for.
            assert_eq!(stream.clone_dtoh(&graph.kept().2).unwrap(), host, "{path}, replay {round}");
        }
        let (_, send, recv) = graph.into_kept();
        drop((send, recv));
    }
    // The table's graph section decides inside a capture.
    ar.force(None).unwrap();
    assert_eq!(ar.plan::<f32>(count, ReduceOp::SUM, Mode::Graph).unwrap().mode, Mode::Graph);
    println!("every path replays from a CUDA graph captured through nccl::capture, with new inputs each time");
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn captures_that_would_not_keep_what_the_calls_use_are_refused() {
    let Some((stream, comm)) = one_rank("captures_that_would_not_keep_what_the_calls_use_are_refused") else {
        return;
    };
    let mut ar = AllReduce::new(&comm, options()).unwrap();
    let count = 5000;
    let side = stream.context().new_stream().unwrap();
    let send = MemBuffer::from_host(&stream, &input(0, count, |x| x)).unwrap();
    let mut recv = MemBuffer::<f32>::zeroed(&stream, count).unwrap();
    // Every path once eagerly first (module loads, NCCL's first call), then a zeroed output.
    for path in Path::ALL {
        ar.force(Some(path)).unwrap();
        ar.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap();
    }
    stream.memset_zeros(&mut recv).unwrap();
    for path in Path::ALL {
        ar.force(Some(path)).unwrap();
        // A capture cudarc opened: its graph would keep nothing alive. Refused before anything is
        // enqueued.
        side.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        let refused = ar.all_reduce(&side, &send, &mut recv, ReduceOp::SUM);
        let _ = side.end_capture(sys::CUgraphInstantiate_flags(0));
        match refused {
            Err(gpucomm_kernels::Error::Nccl(nccl::Error::Ordering(OrderError::ForeignCapture))) => {}
            other => panic!("{path}: a foreign capture must be refused, got {other:?}"),
        }
        // The scope's capture, with a keep set that lacks the dispatcher: the kernels' window (or,
        // for NCCL, the communicator) would not outlive the graph. Memory is checked before
        // resources, so the kernel paths name the window's memory.
        let missing = nccl::capture(&side, (&send, &mut recv), |(send, recv)| {
            ar.all_reduce(&side, *send, *recv, ReduceOp::SUM).map(drop).map_err(in_nccl)
        })
        .map_err(|(_, e)| e);
        match (path, missing) {
            (Path::Nccl, Err(nccl::Error::Ordering(OrderError::ResourceNotKept { kind: "communicator" }))) => {}
            (Path::Ll | Path::OneShot | Path::TwoShot, Err(nccl::Error::Ordering(OrderError::NotKept { .. }))) => {}
            (_, other) => panic!("{path}: a keep set without the dispatcher must be refused, got {other:?}"),
        }
        // A kernel path uses the kernels (device communicator, window) and the buffers only:
        // keeping the kernels themselves is enough for it (`&ar` keeps them and the communicator).
        let kernels = ar.kernels().expect("the kernels are set up on one rank");
        if path != Path::Nccl {
            let kept = nccl::capture(&side, (&send, &mut recv, kernels), |(send, recv, _)| {
                ar.all_reduce(&side, *send, *recv, ReduceOp::SUM).map(drop).map_err(in_nccl)
            });
            assert!(kept.is_ok(), "{path}: the kernels and the buffers are all a kernel path uses: {kept:?}");
        }
    }
    stream.synchronize().unwrap();
    assert!(stream.clone_dtoh(&recv).unwrap().iter().all(|&x| x == 0.0), "a refused call wrote its output");
    println!("foreign captures and keep sets without the dispatcher refused, on every path");
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
        ar.force(Some(path)).unwrap();
        let d = ar.all_reduce_symmetric(&stream, (&send, 1), (&mut recv, 1), count, ReduceOp::SUM).unwrap();
        assert_eq!(d.path, path);
        assert_eq!(stream.clone_dtoh(&recv.slice(1..).unwrap()).unwrap(), host, "{path}");
        stream.memset_zeros(&mut recv.slice_mut(..).unwrap()).unwrap();
    }
    // LL holds 64 KiB: a smaller range.
    ar.force(Some(Path::Ll)).unwrap();
    ar.all_reduce_symmetric(&stream, (&send, 1), (&mut recv, 1), 1000, ReduceOp::SUM).unwrap();
    assert_eq!(stream.clone_dtoh(&recv.slice(1..1001).unwrap()).unwrap(), &host[..1000]);
    // In place, every path.
    for path in Path::ALL {
        ar.force(Some(path)).unwrap();
        let n = if path == Path::Ll { 1000 } else { count };
        stream.memcpy_htod(&host[..n], &mut recv.slice_mut(1..n + 1).unwrap()).unwrap();
        ar.all_reduce_symmetric_in_place(&stream, &mut recv, 1, n, ReduceOp::SUM).unwrap();
        assert_eq!(stream.clone_dtoh(&recv.slice(1..n + 1).unwrap()).unwrap(), &host[..n], "{path} in place");
    }
    let err = ar.all_reduce_symmetric(&stream, (&send, 2), (&mut recv, 0), count, ReduceOp::SUM).unwrap_err();
    assert_eq!(err.to_string(), "send buffer: elements 2..40003 do not fit a window of 40002 elements");
    // Replayed from a graph that keeps the dispatcher and both symmetric buffers (the two-shot
    // reads and writes the windows directly).
    let side = stream.context().new_stream().unwrap();
    for path in [Path::TwoShot, Path::OneShot, Path::Nccl] {
        ar.force(Some(path)).unwrap();
        stream.memset_zeros(&mut recv.slice_mut(..).unwrap()).unwrap();
        let mut graph = gpucomm_kernels::capture(&side, (&ar, &send, &mut recv), |(ar, send, recv)| {
            ar.all_reduce_symmetric(&side, (*send, 1), (*recv, 1), count, ReduceOp::SUM).map(drop)
        })
        .unwrap();
        graph.launch().unwrap();
        let (_, _, out) = graph.into_kept();
        assert_eq!(stream.clone_dtoh(&out.slice(1..).unwrap()).unwrap(), host, "{path} from a graph");
    }
    println!("symmetric buffers: every path correct, out of place and in place, eager and from a graph");
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

/// README "Known gaps" (gpucomm-kernels), narrowed in session 31: a rank that could not allocate
/// its calibration buffers (here rank 1, whose GPU other allocations fill) returned at once, and
/// the other waited in the first measurement for ever. Now the allocations are compared before
/// anything is measured: rank 1 gets its own error, rank 0 `Error::Mismatch`, and once rank 1's
/// memory is back both calibrate.
#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn a_rank_that_cannot_allocate_its_calibration_buffers_stops_every_rank() {
    multi_process("a_rank_that_cannot_allocate_its_calibration_buffers_stops_every_rank", 2, |info, stream| {
        let stream = stream.context().new_stream().unwrap();
        let mut rdzv = Rendezvous::connect(&info, &RdzvOptions::from_env().unwrap()).unwrap();
        let comm = Comm::from_rendezvous(stream.clone(), &mut rdzv).unwrap();
        let mut ar = AllReduce::new(&comm, options()).unwrap();
        assert_eq!(ar.fallback(), None, "{:?}", ar.setup_error());
        let how = Calibration { max_bytes: 1 << 30, iters: 2, ..Calibration::default() };
        let taken = if info.rank == 1 { fill_gpu(&stream, 256 << 20) } else { Vec::new() };
        match (info.rank, ar.calibrate(&stream, &how)) {
            (0, Err(gpucomm_kernels::Error::Mismatch { what, .. })) => {
                assert_eq!(what, "calibration buffers (allocated on every rank)")
            }
            (1, Err(e)) => assert!(!matches!(e, gpucomm_kernels::Error::Mismatch { .. }), "{e}"),
            (rank, other) => panic!("rank {rank}: expected the calibration to fail, got {other:?}"),
        }
        drop(taken);
        stream.synchronize().unwrap();
        let how = Calibration { max_bytes: 1 << 20, iters: 2, ..Calibration::default() };
        assert!(ar.calibrate(&stream, &how).unwrap().source().starts_with("calibrated on this machine: 2 ranks"));
        println!("rank {}: a calibration one rank could not allocate for failed on both", info.rank);
    });
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

#[test]
#[ignore = "needs 3 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn every_rank_gets_the_same_bits_from_three_ranks() {
    // Floating-point sums depend on their order. With three ranks the LL kernel began each sum
    // with the rank's own word (rank 2 summed 1 + 1e8 − 1e8 = 0, ranks 0 and 1 1e8 − 1e8 + 1 =
    // 1), and the one-shot's 16-bit vector path rounded after each addition where its scalar
    // path (taken by a rank whose output is not 16-byte aligned) rounds once (256 + 1 + 1 in bf16:
    // 256 against 258). Every path now sums in rank order and rounds once: every rank gets the
    // bits of that sum.
    multi_process("every_rank_gets_the_same_bits_from_three_ranks", 3, |info, stream| {
        let stream = stream.context().new_stream().unwrap();
        let mut rdzv = Rendezvous::connect(&info, &RdzvOptions::from_env().unwrap()).unwrap();
        let comm = Comm::from_rendezvous(stream.clone(), &mut rdzv).unwrap();
        let mut ar = AllReduce::new(&comm, options()).unwrap();
        assert_eq!(ar.fallback(), None, "{:?}", ar.setup_error());
        let rank = info.rank;
        let count = 1000;
        // rank 1's output one element into its buffer: not 16-byte aligned, the scalar path.
        let at = usize::from(rank == 1);
        ar.force(Some(Path::OneShot)).unwrap();
        let send = stream.clone_htod(&vec![half::bf16::from_f32([256.0, 1.0, 1.0][rank]); count]).unwrap();
        let mut recv_all = stream.alloc_zeros::<half::bf16>(at + count).unwrap();
        ar.all_reduce(&stream, &send, &mut recv_all.slice_mut(at..), ReduceOp::SUM).unwrap();
        let got = stream.clone_dtoh(&recv_all.slice(at..)).unwrap();
        assert!(got.iter().all(|x| x.to_f32() == 258.0), "rank {rank}: one-shot bf16 gave {:?}", &got[..8]);
        ar.force(Some(Path::Ll)).unwrap();
        let send = stream.clone_htod(&vec![[1e8f32, -1e8, 1.0][rank]; count]).unwrap();
        let mut recv = stream.alloc_zeros::<f32>(count).unwrap();
        ar.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap();
        let got = stream.clone_dtoh(&recv).unwrap();
        assert!(got.iter().all(|&x| x == 1.0), "rank {rank}: LL f32 gave {:?}", &got[..8]);
        println!("rank {rank}: one-shot bf16 and LL f32 sums in rank order, the same bits on every rank");
    });
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn a_graph_refuses_a_symmetric_buffer_swapped_for_another_window() {
    // A graph captured a two-shot into `recv`, whose kernels reach it through its window's handle.
    // The captured buffer is swapped out (through `kept_mut`) and freed with its window, and a new
    // symmetric buffer of the same length is swapped in. Before the fix the graph knew the member
    // by address only: when the new buffer reused the freed memory (ncclMemAlloc often does) the
    // launch went ahead with the freed window's handle. Now the member names its window, and the
    // launch is refused either way.
    let test = "a_graph_refuses_a_symmetric_buffer_swapped_for_another_window";
    let Some((stream, comm)) = one_rank(test) else { return };
    let mut ar = AllReduce::new(&comm, options()).unwrap();
    ar.force(Some(Path::TwoShot)).unwrap();
    let count = 4096;
    let mut send = ar.alloc::<f32>(count).unwrap();
    let mut recv = ar.alloc::<f32>(count).unwrap();
    stream.memcpy_htod(&input(0, count, |x| x), &mut send.slice_mut(..).unwrap()).unwrap();
    let side = stream.context().new_stream().unwrap();
    let mut graph = gpucomm_kernels::capture(&side, (&ar, &send, &mut recv), |(ar, send, recv)| {
        ar.all_reduce_symmetric(&side, (*send, 0), (*recv, 0), count, ReduceOp::SUM).map(drop)
    })
    .unwrap();
    graph.launch().unwrap();
    let captured = graph.kept().2.buffer().as_raw();
    let mut out = ar.alloc::<f32>(count).unwrap();
    std::mem::swap(graph.kept_mut().2, &mut out);
    drop(out);
    let mut again = ar.alloc::<f32>(count).unwrap();
    let reused = again.buffer().as_raw() == captured;
    std::mem::swap(graph.kept_mut().2, &mut again);
    let refused = graph.launch().unwrap_err();
    assert!(
        matches!(refused, OrderError::ResourceNotKept { kind: "window" } | OrderError::NotKept { .. }),
        "{refused:?}"
    );
    if reused {
        assert!(matches!(refused, OrderError::ResourceNotKept { kind: "window" }), "{refused:?}");
    }
    println!("a swapped symmetric buffer: launch refused ({refused}); the memory was reused: {reused}");
}

/// Each rank asks the collective setters for something of its own: every call is refused on both
/// ranks with [`gpucomm_kernels::Error::Mismatch`] naming what differs, nothing changes, and the
/// dispatcher still sums both ranks' inputs afterwards. Before, `force` and `set_table` took
/// each rank's word, and the ranks' kernels met different kernels or NCCL.
fn disagreeing_setters_are_refused(ar: &mut AllReduce<'_>, stream: &Arc<CudaStream>) {
    use gpucomm_kernels::Error;
    let rank = ar.comm().rank();
    let refused = |result: gpucomm_kernels::Result<()>, what: &str| match result {
        Err(Error::Mismatch { what: got, .. }) if got == what => {}
        other => panic!("rank {rank}: different {what} must be refused, got {other:?}"),
    };
    refused(ar.force(Some([Path::Ll, Path::OneShot][rank])), "forced paths");
    assert_eq!(ar.forced(), None);
    let before = ar.table().to_text();
    let tables = ["source: a\n[eager]\nll <= 64K\nnccl\n", "source: b\n[eager]\nll <= 32K\nnccl\n"];
    refused(ar.set_table(Table::parse(tables[rank]).unwrap()), "crossover tables");
    assert_eq!(ar.table().to_text(), before);
    let lengths = "symmetric buffer lengths (elements, element bytes, data type, allocated on every rank)";
    refused(ar.alloc::<f32>(1000 + rank).map(drop), lengths);
    // The same count of another element type: twice the bytes on one rank.
    refused(if rank == 0 { ar.alloc::<f32>(1000).map(drop) } else { ar.alloc::<f64>(1000).map(drop) }, lengths);
    let how = Calibration { max_bytes: [1 << 10, 4 << 10][rank], iters: 1, graph: false, ..Calibration::default() };
    refused(ar.calibrate(stream, &how).map(drop), "calibration settings (or whether they are usable on every rank)");
    assert_eq!(ar.table().to_text(), before);
    // The same word on both ranks is taken.
    ar.force(Some(Path::Nccl)).unwrap();
    assert_eq!(ar.forced(), Some(Path::Nccl));
    let count = 1000;
    let send = stream.clone_htod(&input(rank, count, |x| x)).unwrap();
    let mut recv = stream.alloc_zeros::<f32>(count).unwrap();
    ar.all_reduce(stream, &send, &mut recv, ReduceOp::SUM).unwrap();
    assert_eq!(stream.clone_dtoh(&recv).unwrap(), summed(2, count, |x| x));
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn disagreeing_setters_are_refused_between_nodes() {
    // Two processes on one GPU that NCCL takes for two nodes: the dispatcher falls back to NCCL,
    // and its setters are compared all the same.
    multi_node_on_one_gpu("disagreeing_setters_are_refused_between_nodes", 2, |info, stream| {
        let mut rdzv = Rendezvous::connect(&info, &RdzvOptions::from_env().unwrap()).unwrap();
        let comm = Comm::from_rendezvous(stream.clone(), &mut rdzv).unwrap();
        let mut ar = AllReduce::new(&comm, options()).unwrap();
        disagreeing_setters_are_refused(&mut ar, &stream);
        println!("rank {}: disagreeing setters refused on both ranks (NCCL fallback)", info.rank);
    });
}

/// One rank of [`a_setup_that_fails_on_one_rank_takes_every_rank_to_nccl`]: a setup made to fail
/// after its collective steps lets the device communicator and window it made go, falls back to
/// NCCL (which sums), and the next setup on the same communicator gets the kernels.
#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn a_setup_that_failed_lets_its_parts_go_and_the_next_one_works() {
    let Some((stream, comm)) = one_rank("a_setup_that_failed_lets_its_parts_go_and_the_next_one_works") else {
        return;
    };
    gpucomm_kernels::lsa::LsaKernels::fail_next_setup();
    let ar = AllReduce::new(&comm, options()).unwrap();
    assert_eq!(ar.fallback(), Some(Fallback::SetupFailed));
    assert!(ar.setup_error().is_some_and(|e| e.contains("CUDA_ERROR_OUT_OF_MEMORY")), "{:?}", ar.setup_error());
    let send = stream.clone_htod(&input(0, 1000, |x| x)).unwrap();
    let mut recv = stream.alloc_zeros::<f32>(1000).unwrap();
    let d = ar.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap();
    assert_eq!(d.path, Path::Nccl);
    assert_eq!(stream.clone_dtoh(&recv).unwrap(), summed(1, 1000, |x| x));
    drop(ar);
    let mut ar = AllReduce::new(&comm, options()).unwrap();
    assert_eq!(ar.fallback(), None, "{:?}", ar.setup_error());
    check_path(&mut ar, &stream, Path::OneShot, |x| x);
}

/// README "Known gaps" (gpucomm-kernels), closed in session 31 for failures after the collective
/// steps: a setup that failed on one rank alone (a window registration, here made to fail on rank
/// 1 with `CUDA_ERROR_OUT_OF_MEMORY` through the `test-hooks` feature) left that rank on NCCL and
/// the others on the kernels, which wait at their barriers for CTAs that never come. Before: rank
/// 0's dispatcher had its kernels (`fallback()` was `None`). Now every rank learns it and falls
/// back, and an all-reduce sums both ranks through NCCL; the next setup, which nothing makes
/// fail, gives both ranks the kernels.
#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn a_setup_that_fails_on_one_rank_takes_every_rank_to_nccl() {
    multi_process("a_setup_that_fails_on_one_rank_takes_every_rank_to_nccl", 2, |info, stream| {
        let stream = stream.context().new_stream().unwrap();
        let mut rdzv = Rendezvous::connect(&info, &RdzvOptions::from_env().unwrap()).unwrap();
        let comm = Comm::from_rendezvous(stream.clone(), &mut rdzv).unwrap();
        if info.rank == 1 {
            gpucomm_kernels::lsa::LsaKernels::fail_next_setup();
        }
        let ar = AllReduce::new(&comm, options()).unwrap();
        let expected = [Fallback::PeerCannot, Fallback::SetupFailed][info.rank];
        assert_eq!(ar.fallback(), Some(expected), "rank {}: {:?}", info.rank, ar.setup_error());
        let count = 1000;
        let send = stream.clone_htod(&input(info.rank, count, |x| x)).unwrap();
        let mut recv = stream.alloc_zeros::<f32>(count).unwrap();
        let d = ar.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap();
        assert_eq!((d.path, d.why), (Path::Nccl, Why::Fallback(expected)));
        assert_eq!(stream.clone_dtoh(&recv).unwrap(), summed(2, count, |x| x));
        drop(ar);
        let ar = AllReduce::new(&comm, options()).unwrap();
        assert_eq!(ar.fallback(), None, "{:?}", ar.setup_error());
        println!("rank {}: fell back with {expected:?}, then set up again", info.rank);
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn disagreeing_options_and_setters_are_refused_on_two_gpus() {
    multi_process("disagreeing_options_and_setters_are_refused_on_two_gpus", 2, |info, stream| {
        let stream = stream.context().new_stream().unwrap();
        let mut rdzv = Rendezvous::connect(&info, &RdzvOptions::from_env().unwrap()).unwrap();
        let comm = Comm::from_rendezvous(stream.clone(), &mut rdzv).unwrap();
        let rank = info.rank;
        let mismatched = Options { one_shot_max: [256 << 10, 512 << 10][rank], ..options() };
        match AllReduce::new(&comm, mismatched) {
            Err(gpucomm_kernels::Error::Mismatch { .. }) => {}
            other => panic!("rank {rank}: different staging sizes must be refused, got {other:?}"),
        }
        // Sizes one rank refuses by itself: before, that rank returned alone and the other waited
        // in the next collective step for ever.
        use gpucomm_kernels::lsa::MAX_AREA;
        let too_large = Options { staged_max: [MAX_AREA + 1, 64 << 10][rank], ..options() };
        match (rank, AllReduce::new(&comm, too_large)) {
            (0, Err(gpucomm_kernels::Error::AreaTooLarge { .. }))
            | (1, Err(gpucomm_kernels::Error::Mismatch { .. })) => {}
            (_, other) => panic!("rank {rank}: sizes refused on rank 0 must fail both ranks, got {other:?}"),
        }
        let mut ar = AllReduce::new(&comm, options()).unwrap();
        assert_eq!(ar.fallback(), None, "{:?}", ar.setup_error());
        let kernels = ar.kernels().unwrap();
        let shapes = [
            gpucomm_kernels::lsa::CtaBytes::default(),
            gpucomm_kernels::lsa::CtaBytes { ll: 4 << 10, ..Default::default() },
        ];
        let mut with_other_shapes = gpucomm_kernels::lsa::LsaKernels::new(&comm, kernels.sizes()).unwrap();
        match with_other_shapes.set_cta_bytes(shapes[rank]) {
            Err(gpucomm_kernels::Error::Mismatch { what: "launch shapes (CTA bytes)", .. }) => {}
            other => panic!("rank {rank}: different launch shapes must be refused, got {other:?}"),
        }
        assert_eq!(with_other_shapes.cta_bytes().ll, shapes[0].ll);
        drop(with_other_shapes);
        disagreeing_setters_are_refused(&mut ar, &stream);
        println!("rank {rank}: disagreeing options and setters refused on both ranks");
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle (./dev.sh bundle)"]
fn ll_words_left_from_2_pow_32_launches_earlier_are_not_taken_for_new_ones() {
    // LL's flags are call numbers in 32 bits. A full-size LL call writes every word of its slot;
    // 2^32 launches later (of small messages only, which rewrite the first words alone) the flag
    // of that call comes round again. Before the fix the words past the small messages still
    // carried it, and a rank whose peer had not pushed yet summed the peer's old words. The
    // launch counters are set (a test hook) instead of making 2^32 launches. One-shot launches
    // run between: while the two kernels shared their call counters, these took the call numbers
    // at which LL refreshes its regions (2^31 and 2^31 + 1 here), and the old words stayed.
    use gpucomm_kernels::lsa::{LsaKernels, Sizes, LL_MAX_BYTES};
    let test = "ll_words_left_from_2_pow_32_launches_earlier_are_not_taken_for_new_ones";
    multi_process(test, 2, |info, stream| {
        let stream = stream.context().new_stream().unwrap();
        let mut rdzv = Rendezvous::connect(&info, &RdzvOptions::from_env().unwrap()).unwrap();
        let comm = Comm::from_rendezvous(stream.clone(), &mut rdzv).unwrap();
        let mut lsa = LsaKernels::new(&comm, Sizes { one_shot: 64 << 10, staged: 0 }).unwrap();
        let rank = info.rank;
        let run = |lsa: &LsaKernels<'_>, count: usize, scale: f32| {
            let send = stream.clone_htod(&vec![(rank + 1) as f32 * scale; count]).unwrap();
            let mut recv = stream.alloc_zeros::<f32>(count).unwrap();
            lsa.ll(&stream, &send, &mut recv).unwrap();
            stream.clone_dtoh(&recv).unwrap()
        };
        let one_shot = |lsa: &LsaKernels<'_>| {
            let send = stream.clone_htod(&[(rank + 1) as f32; 2]).unwrap();
            let mut recv = stream.alloc_zeros::<f32>(2).unwrap();
            lsa.one_shot(&stream, &send, &mut recv).unwrap();
            stream.clone_dtoh(&recv).unwrap()
        };
        let full = LL_MAX_BYTES / size_of::<f32>();
        let start = (1u32 << 31) - 2;
        // SAFETY: nothing was launched yet; the first call below writes every word of slot 0.
        unsafe { lsa.set_launch_count(start) }.unwrap();
        // LL call 2^31 − 2 writes every word of slot 0; LL calls 2^31 − 1 to 2^31 + 1 are 8 bytes,
        // with two one-shot launches after the first of them.
        assert_eq!(run(&lsa, full, 1.0), vec![3.0; full]);
        assert_eq!(run(&lsa, 2, 1.0), vec![3.0; 2]);
        for _ in 0..2 {
            assert_eq!(one_shot(&lsa), vec![3.0; 2]);
        }
        for _ in 0..2 {
            assert_eq!(run(&lsa, 2, 1.0), vec![3.0; 2]);
        }
        // 2^32 launches after the full call, the counters read what they read then.
        // SAFETY: every launch above finished (their results were read back); the stale words this
        // test sets the count back onto are exactly what it checks the refresh against.
        unsafe { lsa.set_launch_count(start) }.unwrap();
        if rank == 1 {
            // Rank 0 reads rank 1's words before they come: old words must not pass for them.
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let sums = run(&lsa, full, 10.0);
        let wrong = sums.iter().filter(|&&x| x != 30.0).count();
        assert_eq!(wrong, 0, "rank {rank}: {wrong} of {full} sums are not 30 (first: {:?})", &sums[..4]);
        println!("rank {rank}: LL after a wrapped call number: every sum right");
    });
}

/// Session 21 audit: a revoked communicator's kernels were still launched. The kernels checked
/// only that the communicator was not aborted, so after `Comm::revoke` (NCCL's calls on it fail)
/// an eager call on a kernel path returned `Ok` and launched a kernel that waits for peers that
/// have stopped, and a graph that kept the dispatcher was still launched. Both are refused now.
#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn a_revoked_communicators_kernels_are_not_launched() {
    let test = "a_revoked_communicators_kernels_are_not_launched";
    let Some((stream, comm)) = one_rank(test) else { return };
    let mut ar = AllReduce::new(&comm, options()).unwrap();
    ar.force(Some(Path::Ll)).unwrap();
    let count = 1000;
    let side = stream.context().new_stream().unwrap();
    let send = stream.clone_htod(&input(0, count, |x| x)).unwrap();
    let recv = MemBuffer::<f32>::zeroed(&stream, count).unwrap();
    let mut graph = nccl::capture(&side, (&ar, send, recv), |(ar, send, recv)| {
        ar.all_reduce(&side, &*send, recv, ReduceOp::SUM).map_err(in_nccl)?;
        Ok(())
    })
    .unwrap();
    graph.launch().unwrap();
    assert_eq!(stream.clone_dtoh(&graph.kept().2).unwrap(), input(0, count, |x| x), "a launch before the revoke");
    // A graph that keeps the kernels alone (what a kernel path uses): before the fix the kernels
    // reported themselves open after a revoke, and this one launched.
    let kernels = ar.kernels().expect("the kernels are set up on one rank");
    let (send_k, recv_k) =
        (stream.clone_htod(&input(0, count, |x| x)).unwrap(), MemBuffer::<f32>::zeroed(&stream, count).unwrap());
    let mut kernels_graph = nccl::capture(&side, (kernels, send_k, recv_k), |(kernels, send, recv)| {
        kernels.ll(&side, &*send, recv).map_err(in_nccl)
    })
    .unwrap();
    kernels_graph.launch().unwrap();
    comm.revoke().unwrap();
    let err = graph.launch().unwrap_err();
    assert!(matches!(err, OrderError::ResourceClosed { .. }), "{err}");
    let err = kernels_graph.launch().unwrap_err();
    assert!(matches!(err, OrderError::ResourceClosed { .. }), "a graph keeping the kernels: {err}");
    drop(kernels_graph);
    let (_, send, mut recv) = graph.into_kept();
    stream.memset_zeros(&mut recv).unwrap();
    let refused = ar.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM);
    assert!(matches!(refused, Err(gpucomm_kernels::Error::Revoked)), "{refused:?}");
    assert!(stream.clone_dtoh(&recv).unwrap().iter().all(|&x| x == 0.0), "nothing was launched");
    drop((send, recv, ar));
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

/// Session 22 (a known gap of session 18): when the device communicator's destruction gave up
/// waiting for the device within the communicator's timeout (no abort), the kernels' module was
/// unloaded anyway, and unloading waits for every kernel the module launched: a kernel queued
/// behind other work (or spinning behind a dead peer) held the drop past the timeout, for ever
/// behind a dead peer. Now the module is leaked then. Here an LL launch waits behind 6 s of
/// other work on its stream, and the communicator's timeout is 1 s: before, dropping the
/// dispatcher took about 6 s (1 s for the device communicator, 1 s for the window, the rest in
/// the unload); now about 2 s, and the queued kernel still runs and sums correctly.
#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle (./dev.sh bundle)"]
fn dropping_the_kernels_while_one_is_queued_past_the_timeout_leaks_the_module() {
    let test = "dropping_the_kernels_while_one_is_queued_past_the_timeout_leaks_the_module";
    let Some((stream, comm)) = one_rank(test) else { return };
    let mut ar = AllReduce::new(&comm, options()).unwrap();
    ar.force(Some(Path::Ll)).unwrap();
    let count = 1000;
    let send = stream.clone_htod(&input(0, count, |x| x)).unwrap();
    let mut recv = MemBuffer::<f32>::zeroed(&stream, count).unwrap();
    stream.synchronize().unwrap();
    comm.set_timeout(Some(std::time::Duration::from_secs(1)));
    gpucomm_tests::occupy(&stream, std::time::Duration::from_secs(6));
    ar.all_reduce(&stream, &send, &mut recv, ReduceOp::SUM).unwrap();
    let started = std::time::Instant::now();
    drop(ar);
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(4), "dropping the dispatcher took {took:?}");
    stream.synchronize().unwrap();
    assert_eq!(stream.clone_dtoh(&recv).unwrap(), summed(1, count, |x| x), "the queued kernel's sum");
    comm.set_timeout(None);
    drop((send, recv));
    comm.finalize().map_err(|(_, e)| e).unwrap();
}
