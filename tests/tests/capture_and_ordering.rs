//! Soundness of graphs and stream ordering, on one GPU (issue 19, findings 1, 3, 6 and 10, and
//! zero-element calls): each test names what the code before the fix did in the same situation.
//!
//! * finding 1: reads and frees after a graph launch wait for the graph (`MemBuffer`, `CudaSlice`);
//! * finding 3: a capture keeps what its calls (and cudarc work on its stream) use, refuses what
//!   it does not keep, and calls on a capture the crates did not open are refused (the compile-time half is in `nccl/tests/ui` and
//!   `nvshmem/tests/ui`);
//! * finding 6: a write waits for every reader of a `MemBuffer` that two threads read at once,
//!   and for both readers of a cudarc buffer read on two streams (cudarc keeps one read event);
//!   an eager read of a buffer whose last reader was captured leaves the open capture intact;
//! * finding 10: forgetting a non-blocking put's handle does not skip its quiet;
//! * zero-element collectives are no-ops, also inside groups;
//! * a communicator with a timeout leaves its captured calls (direct and grouped) unwatched and
//!   watches its eager ones;
//! * a tracker that cannot order a buffer fails the call with its own error;
//! * registrations (which own their buffers) are kept by the graphs that use them, and ending one
//!   waits for the graph's launches; deregistering waits for nothing that captured calls used;
//! * calls on a capture that CUDA invalidated are refused before NCCL is called, and so are calls
//!   whose stream became captured after their admission (a group's closure, cudarc's waits).
//! * only the scope ends its capture: cudarc's `end_capture` on the scope's stream inside it
//!   gets no graph.
//! * a communicator whose graph was forgotten (`mem::forget`) is abandoned by its teardown,
//!   which NCCL would otherwise make wait for that graph for ever.
//! * a use whose guard drops after an error was recorded in the context is still recorded
//!   (a `MemBuffer`'s tracker event, a cudarc slice's event in the calls' guard), and a use on the
//!   per-thread default stream is still synchronised.
//!
//! One-rank communicators and one-PE NVSHMEM jobs: one GPU is enough for every test.

mod nvshmem_support;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUresult, CUstreamCaptureMode, CUstreamCaptureStatus};
use cudarc::driver::{result, CudaContext, CudaStream, DevicePtr, DevicePtrMut, DriverError};
use gpucomm_ordering::Guard;
use gpucomm_tests::{multi_process, occupy, require_gpus, skip};
use nccl::{group, Collectives, Comm, Error, MemBuffer, PreMulSum, ReduceOp};
use nvshmem::SymmetricMemory;
use nvshmem_support::start;

/// Elements of the small buffers.
const N: usize = 4096;

/// The context of the first GPU (`None`, with a skip line, without one).
fn one_gpu(test: &str) -> Option<Arc<CudaContext>> {
    Some(require_gpus(test, 1)?[0].context().clone())
}

/// A one-rank communicator on a stream of its own, and the context.
fn one_rank(test: &str) -> Option<(Comm, Arc<CudaContext>)> {
    let ctx = one_gpu(test)?;
    Some((warmed_rank(&ctx), ctx))
}

/// A one-rank communicator of `ctx` on a new stream of its own, connected.
fn warmed_rank(ctx: &Arc<CudaContext>) -> Comm {
    let comm = Comm::init_rank(ctx.new_stream().unwrap(), &nccl::UniqueId::new().unwrap(), 0, 1).unwrap();
    // NCCL connects at a communicator's first collective: do it here, on a buffer of its own.
    let mut warm = MemBuffer::from_host(comm.stream(), &[1.0f32; 4]).unwrap();
    comm.all_reduce_in_place(&mut warm, ReduceOp::SUM).unwrap();
    comm.stream().synchronize().unwrap();
    comm
}

/// Ends the capture of `origin` after `side` joined it and a refused call invalidated it, and
/// checks each step: `side` reads as invalidated (or, driver 580.159.04, its query fails with
/// that error); ending the capture fails with that error, once what cudarc kept in the context
/// (a guard's record refused by the invalidated capture) is cleared, since cudarc's
/// `end_capture` would return it before ending the capture; and both streams are out of capture.
fn end_joined_capture(ctx: &CudaContext, origin: &Arc<CudaStream>, side: &CudaStream) {
    let joined = side.capture_status();
    let _ = ctx.check_err();
    let ended = origin.end_capture(CUgraphInstantiate_flags(0)).map(|graph| graph.is_some());
    let _ = ctx.check_err();
    assert!(
        matches!(
            joined,
            Ok(CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED)
                | Err(DriverError(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED))
        ),
        "the stream's wait joined the capture, and the refusal invalidated it: {joined:?}"
    );
    assert_eq!(ended, Err(DriverError(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)));
    for s in [side, &**origin] {
        assert_eq!(s.capture_status().unwrap(), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
    }
}

fn all_equal(what: &str, got: &[f32], want: f32) {
    if let Some(i) = got.iter().position(|&x| x != want) {
        panic!("{what}: element {i} is {}, expected {want}", got[i]);
    }
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn reads_and_frees_after_a_graph_launch_wait_for_it() {
    // Before the fix (cudarc's begin_capture around the same safe calls, the graph launched 30
    // times on the side stream, then `clone_dtoh` on the home stream): the read returned 2 — one
    // launch's worth — instead of 2^30, and the drops freed the memory while the graph ran.
    let test = "reads_and_frees_after_a_graph_launch_wait_for_it";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let home = comm.stream().clone();
    let side = ctx.new_stream().unwrap();
    let double = PreMulSum::host(&comm, 2.0f32).unwrap();
    // Last used on the home stream, captured on the side stream.
    let mem = MemBuffer::from_host(&home, &[1.0f32; N]).unwrap();
    let plain = home.clone_htod(&[1.0f32; N]).unwrap();

    let mut graph = nccl::capture(&side, (&comm, &double, mem, plain), |(comm, double, mem, plain)| {
        comm.on(&side).all_reduce_in_place(mem, *double)?;
        comm.on(&side).all_reduce_in_place(plain, *double)
    })
    .unwrap();
    for _ in 0..30 {
        graph.launch().unwrap();
    }
    // No synchronisation: the reads on the home stream wait for the 30 launches.
    let (_, _, mem, plain) = graph.kept();
    all_equal("MemBuffer after 30 launches", &home.clone_dtoh(mem).unwrap(), (1u64 << 30) as f32);
    all_equal("CudaSlice after 30 launches", &home.clone_dtoh(plain).unwrap(), (1u64 << 30) as f32);

    // Launch again, give the buffers back and drop them at once: the frees wait for the graph.
    // The allocations made right after may reuse the memory; a graph still running would double
    // what they hold.
    for _ in 0..30 {
        graph.launch().unwrap();
    }
    let (_, _, mem, plain) = graph.into_kept();
    drop((mem, plain));
    let reused = MemBuffer::from_host(&home, &[7.0f32; N]).unwrap();
    let reused_plain = home.clone_htod(&[7.0f32; N]).unwrap();
    side.synchronize().unwrap();
    all_equal("a MemBuffer allocated after the free", &home.clone_dtoh(&reused).unwrap(), 7.0);
    all_equal("a CudaSlice allocated after the free", &home.clone_dtoh(&reused_plain).unwrap(), 7.0);
    drop(double);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_capture_keeps_what_its_calls_use_and_refuses_the_rest() {
    // Before the fix every case below was accepted: the calls were captured into a graph that
    // borrowed nothing, so the buffer or communicator could be freed before a launch.
    let test = "a_capture_keeps_what_its_calls_use_and_refuses_the_rest";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let home = comm.stream().clone();
    let side = ctx.new_stream().unwrap();
    let mut outside = MemBuffer::from_host(&home, &[3.0f32; N]).unwrap();
    let double = PreMulSum::host(&comm, 2.0f32).unwrap();

    // A buffer the capture does not keep.
    let (_, err) = nccl::capture(&side, (&comm, &double), |(comm, double)| {
        comm.on(&side).all_reduce_in_place(&mut outside, *double)
    })
    .unwrap_err();
    assert!(
        matches!(err, Error::Ordering(gpucomm_ordering::OrderError::NotKept { bytes, .. }) if bytes == 4 * N),
        "{err}"
    );
    // A communicator it does not keep.
    let (_, err) = nccl::capture(&side, (&double, &mut outside), |(double, buf)| {
        comm.on(&side).all_reduce_in_place(*buf, *double)
    })
    .unwrap_err();
    assert!(
        matches!(err, Error::Ordering(gpucomm_ordering::OrderError::ResourceNotKept { kind: "communicator" })),
        "{err}"
    );
    // Nothing ran: the buffer holds what it held.
    all_equal("a buffer of refused captures", &home.clone_dtoh(&outside).unwrap(), 3.0);

    // A capture cudarc opened: the safe call is refused (before the fix it was captured into a
    // graph that kept nothing alive), and cudarc's own copy into a MemBuffer makes CUDA refuse
    // the whole graph.
    side.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let refused = comm.on(&side).all_reduce_in_place(&mut outside, &double);
    let ended = side.end_capture(CUgraphInstantiate_flags(0));
    assert!(matches!(refused, Err(Error::Ordering(gpucomm_ordering::OrderError::ForeignCapture))), "{refused:?}");
    drop(ended);
    side.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    // The MemBuffer's tracker breaks the capture before the memset is enqueued (it queries the
    // capturing stream, which CUDA answers by invalidating the capture), so the memset fails, and
    // so does the end of the capture, which takes the stream out of capture mode. Before the fix
    // the tracker recorded its refusal in the context first, which made its own attempt to break
    // the capture fail (cudarc's calls return a recorded error first): the memset was captured,
    // and cudarc's `end_capture` returned the recorded error *without ending the capture*, so the
    // stream stayed captured and the scope's capture below was refused as foreign.
    let memset = side.memset_zeros(&mut outside);
    assert!(memset.is_err(), "a cudarc memset of a MemBuffer inside a foreign capture must fail");
    let ended = side.end_capture(CUgraphInstantiate_flags(0)).map(|graph| graph.is_some());
    assert_eq!(ended, Err(DriverError(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)), "memset: {memset:?}");
    assert_eq!(ctx.check_err(), Ok(()), "the tracker recorded nothing in the context");
    assert_eq!(side.capture_status().unwrap(), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
    all_equal("a buffer of foreign captures", &home.clone_dtoh(&outside).unwrap(), 3.0);

    // cudarc work on the scope's stream is covered like the calls: a memset of a kept MemBuffer
    // is captured and replayed, one of a buffer the capture does not keep refuses the capture.
    let kept = MemBuffer::from_host(&home, &[4.0f32; N]).unwrap();
    let mut graph = nccl::capture(&side, (kept,), |(buf,)| Ok(side.memset_zeros(buf)?)).unwrap();
    all_equal("a captured memset before the launch", &home.clone_dtoh(&graph.kept().0).unwrap(), 4.0);
    graph.launch().unwrap();
    all_equal("a captured memset after the launch", &home.clone_dtoh(&graph.kept().0).unwrap(), 0.0);
    drop(graph);
    let (_, err) = nccl::capture(&side, (), |_| Ok(side.memset_zeros(&mut outside)?)).unwrap_err();
    assert!(matches!(err, Error::Ordering(gpucomm_ordering::OrderError::NotKept { .. })), "{err}");
    // A refused capture hands its keep set back: a buffer moved into it comes back, still live and
    // holding what it held, instead of being freed with the failure.
    let owned = MemBuffer::from_host(&home, &[6.0f32; N]).unwrap();
    let ((owned,), err) = nccl::capture(&side, (owned,), |_| Ok(side.memset_zeros(&mut outside)?)).unwrap_err();
    assert!(matches!(err, Error::Ordering(gpucomm_ordering::OrderError::NotKept { .. })), "{err}");
    all_equal("a buffer handed back by a refused capture", &home.clone_dtoh(&owned).unwrap(), 6.0);
    all_equal("a buffer memset in a refused capture", &home.clone_dtoh(&outside).unwrap(), 3.0);

    // An error recorded in the context during the capture (as cudarc's guards record a failed
    // wait or event record) does not keep the scope from ending the capture, and is left in the
    // context for cudarc's next call to report. Before the fix the scope ended the capture through
    // cudarc's `end_capture`, which returned the recorded error before ending it: the capture was
    // refused (`CaptureBroken(CUDA_ERROR_UNKNOWN)`) and the stream stayed captured for good.
    let recorded = DriverError(CUresult::CUDA_ERROR_UNKNOWN);
    let kept = MemBuffer::from_host(&home, &[8.0f32; N]).unwrap();
    let mut graph = nccl::capture(&side, (kept,), |(buf,)| {
        side.memset_zeros(buf)?;
        ctx.record_err(Err::<(), _>(recorded));
        Ok(())
    })
    .unwrap();
    assert_eq!(ctx.check_err(), Err(recorded), "the recorded error is left in the context");
    assert_eq!(side.capture_status().unwrap(), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
    graph.launch().unwrap();
    all_equal("a memset captured around a recorded error", &home.clone_dtoh(&graph.kept().0).unwrap(), 0.0);
    drop(graph);

    // A kept buffer replaced between launches: the next launch refuses to run.
    let kept = MemBuffer::from_host(&home, &[1.0f32; N]).unwrap();
    let mut graph = nccl::capture(&side, (&comm, &double, kept), |(comm, double, buf)| {
        comm.on(&side).all_reduce_in_place(buf, *double)
    })
    .unwrap();
    graph.launch().unwrap();
    all_equal("one launch", &home.clone_dtoh(&graph.kept().2).unwrap(), 2.0);
    graph.kept_mut().2 = MemBuffer::from_host(&home, &[5.0f32; N]).unwrap();
    let err = graph.launch().unwrap_err();
    assert!(matches!(err, gpucomm_ordering::OrderError::NotKept { .. }), "{err}");
    all_equal("the replacement, not launched on", &home.clone_dtoh(&graph.kept().2).unwrap(), 5.0);
    drop(graph);

    // Session 29 audit: the captured buffer swapped out and freed, and a new one swapped in,
    // which `ncclMemAlloc` often places at the freed address. Before: such a replacement passed
    // for the captured buffer (same address, size and type), although NCCL registers the memory
    // of captured calls for the graph (`NCCL_GRAPH_REGISTER`) and other ranks' kernels reach it
    // through that registration, whose peers keep the freed memory. Now each allocation is a
    // numbered member of the graphs that keep it: the launch is refused either way.
    let kept = MemBuffer::from_host(&home, &[1.0f32; N]).unwrap();
    let mut graph = nccl::capture(&side, (&comm, &double, kept), |(comm, double, buf)| {
        comm.on(&side).all_reduce_in_place(buf, *double)
    })
    .unwrap();
    graph.launch().unwrap();
    let captured_at = graph.kept().2.as_raw();
    let captured = std::mem::replace(&mut graph.kept_mut().2, MemBuffer::from_host(&home, &[3.0f32; N]).unwrap());
    drop(captured);
    let again = MemBuffer::from_host(&home, &[4.0f32; N]).unwrap();
    let reused = again.as_raw() == captured_at;
    drop(std::mem::replace(&mut graph.kept_mut().2, again));
    let refused = graph.launch().unwrap_err();
    use gpucomm_ordering::OrderError::{NotKept, ResourceNotKept};
    assert!(matches!(refused, ResourceNotKept { kind: MemBuffer::<()>::KIND } | NotKept { .. }), "{refused:?}");
    if reused {
        assert!(matches!(refused, ResourceNotKept { kind: MemBuffer::<()>::KIND }), "{refused:?}");
    }
    all_equal("the buffer swapped in, not launched on", &home.clone_dtoh(&graph.kept().2).unwrap(), 4.0);
    println!(
        "a MemBuffer swapped for another allocation: launch refused ({refused}); the address was reused: {reused}"
    );
    drop(graph);
    drop(double);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_graph_of_a_revoked_communicator_is_not_launched() {
    // Comm::revoke left the communicator open to graphs: a graph that captured its calls was
    // launched after the revoke, and the launch's host node wrote into the proxy pools that
    // NCCL's revoke had unmapped (2.28.7 to 2.28.9). Now the launch is refused.
    let test = "a_graph_of_a_revoked_communicator_is_not_launched";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let loaded = nccl::version().unwrap();
    if loaded < nccl::Version::new(2, 28, 7) {
        return skip(test, &format!("ncclCommRevoke needs NCCL ≥ 2.28.7, loaded {loaded}"));
    }
    let side = ctx.new_stream().unwrap();
    let kept = MemBuffer::from_host(&side, &[1.0f32; N]).unwrap();
    let mut graph =
        nccl::capture(&side, (&comm, kept), |(comm, buf)| comm.on(&side).all_reduce_in_place(buf, ReduceOp::SUM))
            .unwrap();
    graph.launch().unwrap();
    all_equal("a launch before the revoke", &side.clone_dtoh(&graph.kept().1).unwrap(), 1.0);
    comm.revoke().unwrap();
    assert!(comm.is_revoked() && !comm.is_aborted());
    let err = graph.launch().unwrap_err();
    assert!(matches!(err, gpucomm_ordering::OrderError::ResourceClosed { .. }), "{err}");
    drop(graph);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_write_waits_for_every_reader_of_a_shared_membuffer() {
    // Two threads read one MemBuffer on two streams (the read on stream A held back behind a long
    // copy), then the buffer is zeroed on a third stream. Before the fix the tracker remembered
    // one reader (the last to finish enqueuing, B), so the zeroing ran before A's read, which
    // copied zeros.
    let test = "a_write_waits_for_every_reader_of_a_shared_membuffer";
    let Some(ctx) = one_gpu(test) else { return };
    let home = ctx.new_stream().unwrap();
    let len = 16 << 20; // 64 MiB of f32
    let mut x = MemBuffer::from_host(&home, &vec![1.0f32; len]).unwrap();
    let (a, b, c) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    // About a millisecond of copying that stream A does first.
    let big = home.alloc_zeros::<u8>(2 << 30).unwrap();
    let mut big_out = home.alloc_zeros::<u8>(2 << 30).unwrap();
    let mut ra = a.alloc_zeros::<f32>(len).unwrap();
    let mut rb = b.alloc_zeros::<f32>(len).unwrap();
    home.synchronize().unwrap();
    a.memcpy_dtod(&big, &mut big_out).unwrap();

    let both_taken = Barrier::new(2);
    let read = |stream: &Arc<CudaStream>, out: &mut cudarc::driver::CudaSlice<f32>| {
        ctx.bind_to_thread().unwrap();
        let (src, src_guard) = x.device_ptr(stream);
        let (dst, dst_guard) = out.device_ptr_mut(stream);
        // SAFETY: both hold `len` f32 on this device, borrowed (guards alive) until the copy is
        // enqueued.
        unsafe { result::memcpy_dtod_async(dst, src, len * 4, stream.cu_stream()) }.unwrap();
        // Both threads hold their guards here at once, as two threads reading concurrently do.
        both_taken.wait();
        drop((src_guard, dst_guard));
    };
    std::thread::scope(|s| {
        s.spawn(|| read(&a, &mut ra));
        s.spawn(|| read(&b, &mut rb));
    });
    c.memset_zeros(&mut x).unwrap();
    for s in [&a, &b, &c] {
        s.synchronize().unwrap();
    }
    all_equal("the read held back on stream A", &a.clone_dtoh(&ra).unwrap(), 1.0);
    all_equal("the read on stream B", &b.clone_dtoh(&rb).unwrap(), 1.0);
    all_equal("the zeroed buffer", &home.clone_dtoh(&x).unwrap(), 0.0);
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_write_waits_for_both_readers_of_a_cudarc_buffer_read_on_two_streams() {
    // A cudarc buffer is read by two all-reduces on two streams (the first held back behind
    // 300 ms of work), then zeroed by cudarc on a third. cudarc keeps one read event per buffer,
    // and the second read re-recorded it, so before the fix the zeroing waited for the second
    // read only, ran before the first, and the first all-reduce summed zeros.
    let test = "a_write_waits_for_both_readers_of_a_cudarc_buffer_read_on_two_streams";
    let Some((first, ctx)) = one_rank(test) else { return };
    let second = warmed_rank(&ctx);
    let home = ctx.new_stream().unwrap();
    let len = 16 << 20; // 64 MiB of f32
    let mut x = home.clone_htod(&vec![1.0f32; len]).unwrap();
    let mut from_first = first.stream().alloc_zeros::<f32>(len).unwrap();
    let mut from_second = second.stream().alloc_zeros::<f32>(len).unwrap();
    let zeroing = ctx.new_stream().unwrap();
    home.synchronize().unwrap();
    first.stream().synchronize().unwrap();
    second.stream().synchronize().unwrap();
    occupy(first.stream(), std::time::Duration::from_millis(300));
    first.all_reduce(&x, &mut from_first, ReduceOp::SUM).unwrap();
    second.all_reduce(&x, &mut from_second, ReduceOp::SUM).unwrap();
    zeroing.memset_zeros(&mut x).unwrap();
    for s in [first.stream(), second.stream(), &zeroing] {
        s.synchronize().unwrap();
    }
    all_equal("the read held back on the first stream", &home.clone_dtoh(&from_first).unwrap(), 1.0);
    all_equal("the read on the second stream", &home.clone_dtoh(&from_second).unwrap(), 1.0);
    all_equal("the zeroed buffer", &home.clone_dtoh(&x).unwrap(), 0.0);
    drop((from_first, from_second));
    second.finalize().map_err(|(_, e)| e).unwrap();
    first.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn an_eager_read_of_a_buffer_read_inside_an_open_capture_leaves_the_capture_intact() {
    // Inside a capture, cudarc copies `x` on the captured stream (so its read event is recorded
    // into the capture), and an all-reduce on the communicator's own stream reads `x` at once.
    // An eager read waits for the reader that `x`'s read event stands for, if it still runs; but
    // CUDA answers the question (`cuEventQuery`) about an event recorded in an open capture by
    // invalidating the capture, in any capture mode (call 35 on the GPU machine). While a capture
    // scope is open the reads are not chained; on the first version of the chaining this capture
    // failed with `CaptureBroken(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)`.
    let test = "an_eager_read_of_a_buffer_read_inside_an_open_capture_leaves_the_capture_intact";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let home = comm.stream().clone();
    let side = ctx.new_stream().unwrap();
    let values: Vec<i32> = (0..N as i32).collect();
    // `x` with no event recorded yet (a recorded write would make the captured copy wait for
    // work outside the capture, which breaks it): allocated uninitialised and filled through
    // the driver.
    // SAFETY: filled just below, before anything reads it.
    let mut x = unsafe { home.alloc::<i32>(N) }.unwrap();
    {
        let (ptr, unrecorded) = x.device_ptr_mut(&home);
        std::mem::forget(unrecorded);
        // SAFETY: `x` holds N i32 on this device, `values` N i32 on the host, alive until the
        // synchronize below.
        unsafe { result::memcpy_htod_async(ptr, &values, home.cu_stream()) }.unwrap();
        home.synchronize().unwrap();
    }
    let copy = MemBuffer::<i32>::zeroed(&home, N).unwrap();
    let mut eager = home.alloc_zeros::<i32>(N).unwrap();
    home.synchronize().unwrap();
    let mut graph = nccl::capture(&side, (x, copy), |(x, copy)| {
        side.memcpy_dtod(x, copy)?;
        comm.all_reduce(x, &mut eager, ReduceOp::SUM)?;
        Ok(())
    })
    .map_err(|(_, e)| e)
    .expect("the capture survives the eager read");
    assert_eq!(home.clone_dtoh(&eager).unwrap(), values, "the eager all-reduce");
    assert_eq!(home.clone_dtoh(&graph.kept().1).unwrap(), vec![0; N], "the copy before any launch");
    graph.launch().unwrap();
    assert_eq!(home.clone_dtoh(&graph.kept().1).unwrap(), values, "the copy after a launch");
    drop(graph);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_tracker_that_cannot_order_a_buffer_fails_the_call_with_its_reason() {
    // A MemBuffer last written on the side stream is used on the home stream while the side
    // stream is being captured: its tracker cannot make the home stream wait for work that has
    // not run yet, and refuses. Before, the refusal was recorded in the CUDA context as a driver
    // code, and the call returned `Error::Cuda(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)` only because
    // every call then checked the context (a locked swap on every call); now `Access` returns
    // the tracker's own error, and checks the context only after buffers that follow cudarc's
    // protocol.
    let test = "a_tracker_that_cannot_order_a_buffer_fails_the_call_with_its_reason";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let side = ctx.new_stream().unwrap();
    let mut buf = MemBuffer::from_host(comm.stream(), &[1.0f32; N]).unwrap();
    comm.on(&side).all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
    let mut refused = None;
    let graph = nccl::capture(&side, (), |_| {
        refused = Some(comm.all_reduce_in_place(&mut buf, ReduceOp::SUM));
        Ok(())
    })
    .map_err(|(_, e)| e)
    .unwrap();
    drop(graph);
    let refused = refused.expect("the closure ran");
    assert!(matches!(refused, Err(Error::Ordering(gpucomm_ordering::OrderError::CaptureOpen))), "{refused:?}");
    assert_eq!(ctx.check_err(), Ok(()), "nothing is left recorded in the context");
    // The refused call changed nothing, and the buffer is usable again once the capture ended.
    comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
    all_equal("the buffer after the refusal", &comm.stream().clone_dtoh(&buf).unwrap(), 1.0);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_forgotten_nonblocking_put_is_still_quieted() {
    // A put_nbi's handle is forgotten, then its source is zeroed on another stream. Before the fix
    // nothing enqueued the quiet: the zeroing waited only for the enqueue of the put, while
    // NVSHMEM's copy (off the stream until a quiet) still read the source, so zeros arrived.
    let test = "a_forgotten_nonblocking_put_is_still_quieted";
    multi_process(test, 1, |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let len = 64 << 20; // 256 MiB of i32
        let mut src = rt.alloc::<i32>(len).unwrap();
        let mut dst = rt.alloc_zeroed::<i32>(len).unwrap();
        stream.memcpy_htod(&vec![1i32; len], &mut src).unwrap();
        stream.synchronize().unwrap();
        let (s, other) = (stream.context().new_stream().unwrap(), stream.context().new_stream().unwrap());

        let pending = rt.put_nbi_on_stream(&dst, &src, 0, &s).unwrap();
        std::mem::forget(pending);
        let state = format!("{:?}", SymmetricMemory::tracker(&src));
        assert!(state.contains("pending: true"), "the tracker remembers the put: {state}");
        other.memset_zeros(&mut src).unwrap();
        let state = format!("{:?}", SymmetricMemory::tracker(&src));
        assert!(state.contains("pending: false"), "the zeroing enqueued the quiet first: {state}");
        for st in [&s, &other] {
            st.synchronize().unwrap();
        }
        let got = stream.clone_dtoh(&dst).unwrap();
        if let Some(i) = got.iter().position(|&v| v != 1) {
            panic!("element {i} of the put is {}: the source was zeroed before the put read it", got[i]);
        }
        assert!(stream.clone_dtoh(&src).unwrap().iter().all(|&v| v == 0));

        // `f` failing after a forgotten put inside a capture: the capture is discarded with `f`'s
        // error, after the quiet was captured (without it CUDA refuses the capture as unjoined),
        // and the stream leaves capture mode (the captures below use it again).
        let (_, err) = nvshmem::capture(&s, (&rt, &mut dst, &src), |(rt, dst, src)| {
            std::mem::forget(rt.put_nbi_on_stream(&**dst, *src, 0, &s)?);
            rt.put_on_stream(&**dst, &src.slice(0..1)?, 0, &s)
        })
        .unwrap_err();
        assert!(
            matches!(err, nvshmem::Error::LengthMismatch { what: "local buffer", expected, got: 1 } if expected == len),
            "{err}"
        );
        assert_eq!(s.capture_status().unwrap(), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);

        // Inside a capture, the quiet of a forgotten handle is captured before the next captured
        // use of the put's source (here, zeroing it in the same graph), as an eager use enqueues it
        // first, or else at the end of the capture: every launch completes the put before the
        // source is reused, and NVSHMEM's internal stream, onto which the put's copy forked, is
        // joined back. Before: the capture ended with that stream unjoined, and CUDA refused it
        // (CUDA_ERROR_STREAM_CAPTURE_UNJOINED); with a quiet only at the end, the zeroing would
        // run while the copy still read the source, and zeros would arrive.
        let mut graph = nvshmem::capture(&s, (&rt, dst, src), |(rt, dst, src)| {
            std::mem::forget(rt.put_nbi_on_stream(dst, src, 0, &s)?);
            Ok(s.memset_zeros(src)?)
        })
        .unwrap();
        assert_eq!(s.capture_status().unwrap(), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
        for k in 2..=3 {
            // Written on the home stream, read there after the launch: the launch is ordered
            // after the write, the reads after the launch.
            stream.memcpy_htod(&vec![k; len], &mut graph.kept_mut().2).unwrap();
            graph.launch().unwrap();
            let got = stream.clone_dtoh(&graph.kept().1).unwrap();
            if let Some(i) = got.iter().position(|&v| v != k) {
                panic!(
                    "launch {k}: element {i} of the captured put is {}: the source was zeroed before the put read it",
                    got[i]
                );
            }
            assert!(
                stream.clone_dtoh(&graph.kept().2).unwrap().iter().all(|&v| v == 0),
                "launch {k}: the source is zeroed"
            );
        }
        let (_, dst, src) = graph.into_kept();
        dst.free().map_err(|(_, e)| e).unwrap();
        src.free().map_err(|(_, e)| e).unwrap();
        rt.finalize().map_err(|(_, e)| e).unwrap();
    });
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn an_nvshmem_graph_orders_its_launches() {
    // A put to this PE's own heap and a quiet, captured on a side stream, launched, read on the
    // home stream without synchronising (before the fix: cudarc's capture, a read that did not
    // wait for the graph).
    let test = "an_nvshmem_graph_orders_its_launches";
    multi_process(test, 1, |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let side = stream.context().new_stream().unwrap();
        let src = rt.alloc_zeroed::<i32>(N).unwrap();
        let dst = rt.alloc_zeroed::<i32>(N).unwrap();
        let mut graph = nvshmem::capture(&side, (&rt, src, dst), |(rt, src, dst)| {
            rt.put_on_stream(dst, src, 0, &side)?;
            rt.quiet_on_stream(&side)
        })
        .unwrap();
        for k in 1..=3 {
            stream.memcpy_htod(&vec![k; N], &mut graph.kept_mut().1).unwrap();
            graph.launch().unwrap();
            let got = stream.clone_dtoh(&graph.kept().2).unwrap();
            assert!(got.iter().all(|&v| v == k), "launch {k}: {:?}", &got[..4]);
        }
        let (_, src, dst) = graph.into_kept();
        dst.free().map_err(|(_, e)| e).unwrap();
        src.free().map_err(|(_, e)| e).unwrap();
        rt.finalize().map_err(|(_, e)| e).unwrap();
    });
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn zero_element_calls_are_no_ops_also_in_groups() {
    // Before: every call below was refused with ZeroSize, and the group with GroupRefused, so the
    // doubling in the group never ran.
    let test = "zero_element_calls_are_no_ops_also_in_groups";
    let Some((comm, _ctx)) = one_rank(test) else { return };
    let s = comm.stream().clone();
    let empty = s.null::<f32>().unwrap();
    let mut empty_out = s.null::<f32>().unwrap();
    comm.all_reduce(&empty, &mut empty_out, ReduceOp::SUM).unwrap();
    comm.all_gather(&empty, &mut empty_out).unwrap();
    let mut x = MemBuffer::from_host(&s, &[1.0f32; N]).unwrap();
    comm.all_reduce_in_place(&mut x.slice_mut(5..5).unwrap(), ReduceOp::SUM).unwrap();
    let double = PreMulSum::host(&comm, 2.0f32).unwrap();
    let mut received = s.null::<f32>().unwrap();
    group(|g| {
        g.with(&comm).send(&empty, 0)?;
        g.with(&comm).recv(&mut received, 0)?;
        g.with(&comm).all_reduce_in_place(&mut x, &double)
    })
    .unwrap();
    all_equal("the group's all-reduce", &s.clone_dtoh(&x).unwrap(), 2.0);
    drop(double);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_timed_communicator_is_captured_unwatched_and_watches_its_eager_calls() {
    // A communicator with a timeout records an event after each eager call and checks the older
    // ones at the next call; captured calls record none, since querying an event recorded during
    // a capture invalidates it. Whether the stream is captured comes from the call's own access
    // (one driver query per call, for direct and grouped calls alike): had a captured call
    // recorded an event, the next call of the same capture would have broken it, and `capture`
    // would return the driver's error instead of a graph.
    let test = "a_timed_communicator_is_captured_unwatched_and_watches_its_eager_calls";
    let Some((comm, ctx)) = one_rank(test) else { return };
    comm.set_timeout(Some(std::time::Duration::from_secs(60)));
    let home = comm.stream().clone();
    let side = ctx.new_stream().unwrap();
    let double = PreMulSum::host(&comm, 2.0f32).unwrap();
    let mem = MemBuffer::from_host(&home, &[1.0f32; N]).unwrap();
    let mut graph = nccl::capture(&side, (&comm, &double, mem), |(comm, double, mem)| {
        let comm: &Comm = comm;
        comm.on(&side).all_reduce_in_place(mem, *double)?;
        group(|g| g.with(comm).on(&side).all_reduce_in_place(mem, *double))?;
        comm.on(&side).all_reduce_in_place(mem, *double)
    })
    .unwrap();
    for _ in 0..3 {
        graph.launch().unwrap();
    }
    let (_, _, mut mem) = graph.into_kept();
    // Eager calls after the graph are watched again: the wait covers them, within the timeout.
    comm.all_reduce_in_place(&mut mem, &double).unwrap();
    group(|g| g.with(&comm).all_reduce_in_place(&mut mem, &double)).unwrap();
    comm.wait(None).unwrap();
    all_equal("three launches of three doublings, then two eager ones", &home.clone_dtoh(&mem).unwrap(), 2048.0);
    drop(double);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_graph_keeps_an_nccl_registration_and_deregistering_waits_for_it() {
    // A registration owns its buffer and hands out no `&mut` to it; a graph whose calls write the
    // buffer keeps `&mut registration`, so the registration cannot be deregistered while the graph
    // lives (the compile-time half: nvshmem/tests/ui/graph_outlives_registration.rs). The launches
    // are recorded in the buffer's ordering: a read on another stream, and the deregistration,
    // wait for them.
    let test = "a_graph_keeps_an_nccl_registration_and_deregistering_waits_for_it";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let home = comm.stream().clone();
    let side = ctx.new_stream().unwrap();
    let double = PreMulSum::host(&comm, 2.0f32).unwrap();
    let mut registration = comm.register(home.clone_htod(&[1.0f32; N]).unwrap()).map_err(|(_, e)| e).unwrap();
    let mut graph = nccl::capture(&side, (&comm, &double, &mut registration), |(comm, double, registration)| {
        comm.on(&side).all_reduce_in_place(&mut registration.buffer_mut(), *double)
    })
    .unwrap();
    for _ in 0..20 {
        graph.launch().unwrap();
    }
    all_equal("after 20 launches", &home.clone_dtoh(&**graph.kept().2).unwrap(), (1u64 << 20) as f32);
    for _ in 0..10 {
        graph.launch().unwrap();
    }
    drop(graph);
    let buf = registration.deregister().map_err(|(_, e)| e).unwrap();
    all_equal("after deregistering", &home.clone_dtoh(&buf).unwrap(), (1u64 << 30) as f32);
    drop(double);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn deregistering_does_not_wait_for_what_captured_calls_used() {
    // A cudarc buffer last written behind 10 s of stuck work (stream A) is used by a captured
    // call, whose pointer is taken on the ordering crate's idle helper stream: cudarc makes that
    // stream wait for the stuck work. Then an unrelated buffer is deregistered, which waits for
    // that buffer's uses only, bounded by the communicator's timeout (3 s). Before the fix the
    // deregistration's private stream was forked from the idle helper stream, so it waited for
    // the stuck work too: `Error::StillInUse` after 3 s, and the buffer kept registered.
    let test = "deregistering_does_not_wait_for_what_captured_calls_used";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let (a, side) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let mut stuck = a.alloc_zeros::<f32>(N).unwrap();
    occupy(&a, std::time::Duration::from_secs(10));
    a.memset_zeros(&mut stuck).unwrap();
    let graph = nccl::capture(&side, (&comm, &mut stuck), |(comm, stuck)| {
        comm.on(&side).all_reduce_in_place(*stuck, ReduceOp::SUM)
    })
    .map_err(|(_, e)| e)
    .unwrap();
    comm.set_timeout(Some(std::time::Duration::from_secs(3)));
    let registration = comm.register(comm.stream().clone_htod(&[2.0f32; N]).unwrap()).map_err(|(_, e)| e).unwrap();
    let started = std::time::Instant::now();
    let buf = registration.deregister().map_err(|(_, e)| e).unwrap();
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(2), "deregistering took {took:?}");
    all_equal("the deregistered buffer", &comm.stream().clone_dtoh(&buf).unwrap(), 2.0);
    // SAFETY: the stream is alive; the query only reads its state.
    let a_state = unsafe { cudarc::driver::sys::cuStreamQuery(a.cu_stream()) };
    assert_eq!(a_state, CUresult::CUDA_ERROR_NOT_READY, "premise: stream A is still busy");
    drop(graph);
    comm.set_timeout(None);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_graph_keeps_an_nvshmem_registration() {
    // A put from a registered local buffer, captured with the registration in the keep set
    // (before the merge, a registration was no keep-set member and could be ended while a graph
    // used its buffer). Inputs are written through `buffer_mut()` between launches.
    let test = "a_graph_keeps_an_nvshmem_registration";
    multi_process(test, 1, |info, stream| {
        let (_rdzv, rt) = start(&info, &stream);
        let side = stream.context().new_stream().unwrap();
        let dst = rt.alloc_zeroed::<i32>(N).unwrap();
        let mut registration = rt.register(stream.clone_htod(&vec![0i32; N]).unwrap()).map_err(|(_, e)| e).unwrap();
        let mut graph = nvshmem::capture(&side, (&rt, dst, &mut registration), |(rt, dst, registration)| {
            rt.put_on_stream(dst, &***registration, 0, &side)?;
            rt.quiet_on_stream(&side)
        })
        .unwrap();
        for k in 1..=3 {
            stream.memcpy_htod(&vec![k; N], &mut graph.kept_mut().2.buffer_mut()).unwrap();
            graph.launch().unwrap();
            let got = stream.clone_dtoh(&graph.kept().1).unwrap();
            assert!(got.iter().all(|&v| v == k), "launch {k}: {:?}", &got[..4]);
        }
        let (_, dst, _) = graph.into_kept();
        let local = registration.unregister().map_err(|(_, e)| e).unwrap();
        assert!(stream.clone_dtoh(&local).unwrap().iter().all(|&v| v == 3));
        dst.free().map_err(|(_, e)| e).unwrap();
        rt.finalize().map_err(|(_, e)| e).unwrap();
    });
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn the_per_thread_default_stream_is_refused() {
    // cudarc's `per_thread_stream` is one handle (CU_STREAM_PER_THREAD) that names another stream
    // on each thread. Before the fix, the buffers' ordering took it for one stream: a use on one
    // thread's and then on another thread's waited for nothing, and a capture on it took cudarc's
    // work on a slice (which cudarc orders by no event there) without keeping the slice.
    let test = "the_per_thread_default_stream_is_refused";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let per_thread = ctx.per_thread_stream();
    let refused = |e: &Error| matches!(e, Error::Ordering(gpucomm_ordering::OrderError::PerThreadStream));
    let mut buf = MemBuffer::from_host(comm.stream(), &[3.0f32; N]).unwrap();

    let e = comm.on(&per_thread).all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap_err();
    assert!(refused(&e), "a call on the per-thread stream: {e}");
    let e = MemBuffer::<f32>::zeroed(&per_thread, N).unwrap_err();
    assert!(refused(&e), "a buffer made on the per-thread stream: {e}");
    let (_, e) = nccl::capture(&per_thread, (), |_| Ok(())).unwrap_err();
    assert!(refused(&e), "a capture on the per-thread stream: {e}");

    // Nothing was lost: the buffer and the communicator still work.
    comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
    all_equal("the buffer after the refusals", &comm.stream().clone_dtoh(&buf).unwrap(), 3.0);
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn cudarc_work_on_the_per_thread_stream_is_ordered_on_the_host() {
    // cudarc's own copies cannot be refused: they take a buffer's pointer through cudarc's
    // protocol, which cannot fail, and enqueue whatever it says. Before the fix a `MemBuffer`'s
    // answer for a use on the per-thread default stream (no event can order it: one handle names
    // another stream on each thread) recorded an error and ordered nothing, so cudarc's memset ran
    // at once, beside a copy still queued on the buffer's stream, and the free did not wait for it
    // either. Now the host waits for the earlier uses and the guard synchronises the per-thread
    // stream after the memset.
    let test = "cudarc_work_on_the_per_thread_stream_is_ordered_on_the_host";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let stream = comm.stream();
    let per_thread = ctx.per_thread_stream();
    let mut buf = MemBuffer::<f32>::zeroed(stream, N).unwrap();
    stream.synchronize().unwrap();
    occupy(stream, std::time::Duration::from_millis(300));
    // Queued behind the busy kernel.
    stream.memcpy_htod(&[1.0f32; N], &mut buf).unwrap();
    per_thread.memset_zeros(&mut buf).unwrap();
    ctx.check_err().expect("ordered on the host: no error recorded");
    all_equal("the buffer after the per-thread memset", &stream.clone_dtoh(&buf).unwrap(), 0.0);
}

/// How many times [`reenter_the_scope`] ran.
static REENTERED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A non-blocking operation's completion that asks the capture scope about its stream, as a
/// completion that enqueues through the crates does.
fn reenter_the_scope(stream: &CudaStream) -> Result<(), String> {
    REENTERED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    gpucomm_ordering::admit(stream, &[]).map(drop).map_err(|e| e.to_string())
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_completion_may_ask_the_capture_scope_again() {
    // A non-blocking operation is captured on a buffer, then a captured call uses that buffer, so
    // the scope enqueues the operation's completion first. Before the fix the scope called the
    // completion while it held its own state mutably borrowed: a completion that asked the scope
    // anything (here: admitting a call on the stream) panicked with "already mutably borrowed".
    let test = "a_completion_may_ask_the_capture_scope_again";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let side = ctx.new_stream().unwrap();
    let mem = MemBuffer::from_host(comm.stream(), &[2.0f32; N]).unwrap();
    REENTERED.store(0, std::sync::atomic::Ordering::SeqCst);

    let mut graph = nccl::capture(&side, (&comm, mem), |(comm, mem)| {
        let tracker = gpucomm_ordering::DeviceMemory::tracked(&*mem).expect("a MemBuffer is tracked").tracker();
        // SAFETY: no real non-blocking operation is captured (this one is pretended), so the
        // completion has nothing to complete.
        assert!(unsafe { gpucomm_ordering::captured_nonblocking(&side, tracker, reenter_the_scope) });
        comm.on(&side).all_reduce_in_place(mem, ReduceOp::SUM)
    })
    .unwrap();
    assert_eq!(REENTERED.load(std::sync::atomic::Ordering::SeqCst), 1, "the completion ran once, before the use");
    graph.launch().unwrap();
    let (_, mem) = graph.kept();
    all_equal("after the launch", &comm.stream().clone_dtoh(mem).unwrap(), 2.0);
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn nccl_calls_on_an_invalidated_capture_are_refused() {
    // CUDA invalidates a capture when something inside it is refused (here a query of the
    // capturing stream); the stream stays in capture mode until the capture ends, and CUDA refuses
    // every enqueue into it. Before the change the call's one driver query took such a capture
    // for the scope's own (or, opened by cudarc, for a foreign one) and called NCCL on it. Now the
    // call is refused with `CaptureBroken` before NCCL is called, in the scope's capture, in a
    // group inside it, and in a capture cudarc opened; a cudarc memset of a `MemBuffer` in the
    // latter records nothing in the context, so cudarc's `end_capture` still ends the capture.
    use gpucomm_ordering::OrderError;
    let test = "nccl_calls_on_an_invalidated_capture_are_refused";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let side = ctx.new_stream().unwrap();
    let mut buf = MemBuffer::from_host(comm.stream(), &[3.0f32; N]).unwrap();
    let broken = |r: &Result<(), Error>| matches!(r, Err(Error::Ordering(OrderError::CaptureBroken(e))) if e.0 == CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    // SAFETY: the stream is alive; CUDA answers a query of a stream being captured by
    // invalidating the capture, which is the point here.
    let invalidate = |s: &CudaStream| unsafe { cudarc::driver::sys::cuStreamQuery(s.cu_stream()) };

    let mut seen = Vec::new();
    let (_, err) = nccl::capture(&side, (&comm, &mut buf), |(comm, buf)| {
        let _ = invalidate(&side);
        seen.push((
            "status",
            side.capture_status()
                .map(|s| assert_eq!(s, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED))
                .map_err(Error::from),
        ));
        seen.push(("direct", comm.on(&side).all_reduce_in_place(*buf, ReduceOp::SUM)));
        seen.push(("grouped", group(|g| g.with(comm).on(&side).all_reduce_in_place(*buf, ReduceOp::SUM))));
        Ok(())
    })
    .map(drop)
    .unwrap_err();
    seen[0].1.as_ref().expect("the query invalidated the capture");
    for (what, r) in &seen[1..] {
        assert!(broken(r), "{what} call on an invalidated capture: {r:?}");
    }
    assert!(matches!(err, Error::Ordering(OrderError::CaptureBroken(_))), "the capture fails: {err}");
    assert_eq!(side.capture_status().unwrap(), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);

    side.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let _ = invalidate(&side);
    let refused = comm.on(&side).all_reduce_in_place(&mut buf, ReduceOp::SUM);
    let memset = side.memset_zeros(&mut buf);
    let ended = side.end_capture(CUgraphInstantiate_flags(0)).map(|graph| graph.is_some());
    assert!(broken(&refused), "a call on an invalidated cudarc capture: {refused:?}");
    assert!(memset.is_err(), "CUDA refuses the memset");
    assert_eq!(ended, Err(DriverError(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)));
    assert_eq!(ctx.check_err(), Ok(()), "the tracker recorded nothing in the context");
    assert_eq!(side.capture_status().unwrap(), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);

    // Nothing ran and nothing was lost: the buffer holds what it held, and the stream works.
    comm.on(&side).all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
    all_equal("the buffer after the refusals", &side.clone_dtoh(&buf).unwrap(), 3.0);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_capture_that_begins_after_a_call_is_admitted_is_refused() {
    // A call asks the driver once whether its stream is captured, when it is admitted; two things
    // can change the answer before the call is issued. Before the change both put the call into a
    // graph that kept nothing alive (its launch after the buffer's free would use freed memory):
    //
    // * a group's closure runs after its calls were admitted, and may begin a capture (cudarc's
    //   safe `begin_capture`) of their stream: the group now asks again at launch, once per stream;
    // * cudarc's own ordering of a `CudaSlice` makes the stream wait for the slice's last write;
    //   when that write was captured, the wait joins the stream into the capture. The access now
    //   asks again after a buffer that follows cudarc's protocol, and invalidates such a capture
    //   (so that the guards of the refused call cannot record their uses into it).
    use gpucomm_ordering::OrderError;
    let test = "a_capture_that_begins_after_a_call_is_admitted_is_refused";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let side = ctx.new_stream().unwrap();
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let mut buf = MemBuffer::from_host(comm.stream(), &[3.0f32; N]).unwrap();

    let err = group(|g| {
        g.with(&comm).on(&side).all_reduce_in_place(&mut buf, ReduceOp::SUM)?;
        side.begin_capture(mode)?;
        Ok(())
    })
    .unwrap_err();
    drop(side.end_capture(CUgraphInstantiate_flags(0)));
    assert!(matches!(err, Error::Ordering(OrderError::ForeignCapture)), "a group launched into a capture: {err}");
    assert_eq!(side.capture_status().unwrap(), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
    all_equal("the buffer of the refused group", &side.clone_dtoh(&buf).unwrap(), 3.0);

    // The same capture begun by a closure that then fails: the group launches nothing, and
    // before the change dropped its calls' guards without asking again, so a cudarc slice's
    // guard recorded its use into that capture (and a later free would wait for the record, not
    // for the work before it). Now every stream is asked again on every way out of the group,
    // and such a capture is invalidated first. (Session 19 audit.)
    let mut slice = comm.stream().clone_htod(&[3.0f32; N]).unwrap();
    let failed = DriverError(CUresult::CUDA_ERROR_UNKNOWN);
    let err = group(|g| {
        g.with(&comm).on(&side).all_reduce_in_place(&mut slice, ReduceOp::SUM)?;
        side.begin_capture(mode)?;
        Err::<(), _>(Error::Cuda(failed))
    })
    .unwrap_err();
    assert!(matches!(err, Error::Cuda(e) if e == failed), "{err}");
    // The guard's record into the invalidated capture failed, and cudarc kept that failure in the
    // context, where its next call (the status query below) would return it.
    let recorded = ctx.check_err();
    let status = side.capture_status().unwrap();
    drop(side.end_capture(CUgraphInstantiate_flags(0)));
    assert_eq!(status, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED, "the capture was left usable");
    let invalidated = DriverError(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert!(matches!(recorded, Err(e) if e == invalidated), "the guard's record: {recorded:?}");
    let _ = ctx.check_err();
    all_equal("the slice of the failed group", &side.clone_dtoh(&slice).unwrap(), 3.0);

    // A slice whose events have never been recorded, so that the captured memset below waits for
    // nothing outside the capture (which would invalidate it).
    assert!(ctx.is_managing_stream_synchronization(), "cudarc orders slices with events here");
    let origin = ctx.new_stream().unwrap();
    // SAFETY: f32 has no invalid bit patterns; the contents are only written (by the captured
    // memset, which never runs) and never read.
    let mut slice = unsafe { comm.stream().alloc::<f32>(N) }.unwrap();
    origin.begin_capture(mode).unwrap();
    origin.memset_zeros(&mut slice).unwrap();
    let refused = comm.on(&side).all_reduce_in_place(&mut slice, ReduceOp::SUM);
    // The refusal invalidated the capture `side` had joined through cudarc's wait, so that the
    // guard of the slice could not record into it (the record failed, and cudarc kept that
    // failure in the context).
    end_joined_capture(&ctx, &origin, &side);
    assert!(
        matches!(refused, Err(Error::Ordering(OrderError::ForeignCapture))),
        "a call joined into a capture: {refused:?}"
    );

    // The communicator and the stream still work.
    comm.on(&side).all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
    all_equal("the buffer after the refusals", &side.clone_dtoh(&buf).unwrap(), 3.0);
    // cudarc's free of the slice first waits for its events, last recorded inside the capture,
    // which CUDA refuses (CUDA_ERROR_INVALID_VALUE on the GPU machine); cudarc records that in the
    // context, where its next call would return it. The memory is freed either way: its only
    // uses were captured, and that graph was never launched.
    drop(slice);
    let _ = ctx.check_err();
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_group_mixing_a_captured_stream_with_an_uncaptured_one_is_refused() {
    // Inside a capture, a group whose calls go to the scope's stream and to an uncaptured one
    // cannot be launched by NCCL, and ordering its streams after each other (as a group on two
    // streams of a device does) would have pulled the uncaptured stream into the capture: its
    // buffers' guards would then record their uses there, and a later free would wait for those
    // records instead of the work queued before them. Now the second call is refused.
    use gpucomm_ordering::OrderError;
    let test = "a_group_mixing_a_captured_stream_with_an_uncaptured_one_is_refused";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let (side, other) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let mut kept = MemBuffer::from_host(comm.stream(), &[3.0f32; N]).unwrap();
    let mut outside = MemBuffer::from_host(comm.stream(), &[5.0f32; N]).unwrap();
    let (_, err) = nccl::capture(&side, (&comm, &mut kept), |(comm, kept)| {
        let comm: &Comm = comm;
        group(|g| {
            g.with(comm).on(&side).all_reduce_in_place(*kept, ReduceOp::SUM)?;
            g.with(comm).on(&other).all_reduce_in_place(&mut outside, ReduceOp::SUM)
        })
    })
    .map(drop)
    .unwrap_err();
    assert!(matches!(err, Error::Ordering(OrderError::MixedCapture)), "{err}");
    for s in [&side, &other] {
        assert_eq!(s.capture_status().unwrap(), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
    }
    all_equal("the kept buffer", &other.clone_dtoh(&kept).unwrap(), 3.0);
    all_equal("the buffer outside", &other.clone_dtoh(&outside).unwrap(), 5.0);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_graph_refuses_a_window_registered_again_on_the_same_memory() {
    // NCCL's captured work refers to a window by its handle, not by its memory. A graph owning a
    // window checked only the memory: taking the window out, deregistering it and registering
    // its buffer again put the same memory back, and the launch went ahead with a window NCCL had
    // released. Now the graph keeps the window itself (by its number) and refuses the launch.
    use gpucomm_ordering::OrderError;
    use nccl::WindowFlags;
    let test = "a_graph_refuses_a_window_registered_again_on_the_same_memory";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let side = ctx.new_stream().unwrap();
    let buf = MemBuffer::from_host(comm.stream(), &[2.0f32; N]).unwrap();
    let win = comm.register_window(buf, WindowFlags::COLL_SYMMETRIC).map_err(|(_, e)| e).unwrap();
    let mut graph = nccl::capture(&side, (&comm, Some(win)), |(comm, win)| {
        let comm: &Comm = comm;
        let win = win.as_mut().expect("the window is kept");
        comm.on(&side).all_reduce_in_place(&mut win.as_view_mut(), ReduceOp::SUM)
    })
    .unwrap();
    graph.launch().unwrap();

    let win = graph.kept_mut().1.take().unwrap();
    let buf = win.deregister().map_err(|(_, e)| e).unwrap();
    let again = comm.register_window(buf, WindowFlags::COLL_SYMMETRIC).map_err(|(_, e)| e).unwrap();
    graph.kept_mut().1 = Some(again);
    let err = graph.launch().unwrap_err();
    assert!(matches!(err, OrderError::ResourceNotKept { kind: "window" }), "{err}");

    let (_, win) = graph.into_kept();
    let win = win.unwrap();
    all_equal("the window after one launch (a one-rank sum)", &side.clone_dtoh(&*win).unwrap(), 2.0);
    win.deregister().map_err(|(_, e)| e).unwrap();
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_forgotten_guard_of_a_membuffer_still_orders_the_write_it_replaced() {
    // A MemBuffer's tracker forgets the uses that a write replaces as soon as the write's pointer
    // is taken (later uses wait for the write, which waits for them); the write's event stood for
    // them only once its guard, dropped, recorded it. A guard can be forgotten (`mem::forget` is
    // safe), and an event never recorded counts as complete: before the fix, a read on a third
    // stream read the buffer while the zeroing queued on its home stream had not run yet (and
    // dropping the buffer would have freed it under that zeroing). The event is now recorded when
    // the pointer is taken too, after the waits.
    let test = "a_forgotten_guard_of_a_membuffer_still_orders_the_write_it_replaced";
    let Some(ctx) = one_gpu(test) else { return };
    let home = ctx.new_stream().unwrap();
    let (other, reader) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let mut x = MemBuffer::from_host(&home, &[1.0f32; N]).unwrap();
    home.synchronize().unwrap();
    // The zeroing waits behind 300 ms of work on the home stream.
    occupy(&home, std::time::Duration::from_millis(300));
    home.memset_zeros(&mut x).unwrap();
    let (_, forgotten) = x.device_ptr_mut(&other);
    std::mem::forget(forgotten);
    all_equal("a read after the zeroing", &reader.clone_dtoh(&x).unwrap(), 0.0);
    drop(x);
    home.synchronize().unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_call_whose_tracked_wait_joins_a_capture_is_refused() {
    // A MemBuffer's guard for a use on `origin` records the use's event when dropped; dropped
    // after cudarc's safe `begin_capture` of `origin`, it records it inside that capture. An
    // eager all-reduce of the buffer on `side` then waits for that event, which joins `side` into
    // the capture. Before the fix the call went on into that graph, which keeps nothing alive
    // (the access asked the driver again only after buffers that follow cudarc's protocol). It is
    // refused now, and the capture `side` joined is invalidated, so that no graph holds the call.
    use gpucomm_ordering::OrderError;
    let test = "a_call_whose_tracked_wait_joins_a_capture_is_refused";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let (origin, side) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let mut buf = MemBuffer::from_host(comm.stream(), &[3.0f32; N]).unwrap();
    comm.stream().synchronize().unwrap();
    let (_, guard) = buf.device_ptr_mut(&origin);
    origin.begin_capture(mode).unwrap();
    drop(guard);
    let refused = comm.on(&side).all_reduce_in_place(&mut buf, ReduceOp::SUM);
    end_joined_capture(&ctx, &origin, &side);
    assert!(
        matches!(refused, Err(Error::Ordering(OrderError::ForeignCapture))),
        "a call joined into a capture: {refused:?}"
    );
    // The communicator, the stream and the buffer still work.
    comm.on(&side).all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
    all_equal("the buffer after the refusal", &side.clone_dtoh(&buf).unwrap(), 3.0);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_cudarc_copy_whose_tracked_wait_joins_a_capture_is_refused() {
    // As above with cudarc's own memset on `side` instead of a call of the crates: the buffer's
    // guard waited for the event recorded inside `origin`'s capture, which joined `side` into it,
    // and was never asked again, so the memset went into a graph that keeps nothing and is
    // ordered with nothing. The guard now asks after its waits and breaks the capture, so CUDA
    // refuses the memset and no graph is made.
    let test = "a_cudarc_copy_whose_tracked_wait_joins_a_capture_is_refused";
    let Some(ctx) = one_gpu(test) else { return };
    let (home, origin, side) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    let mut buf = MemBuffer::from_host(&home, &[3.0f32; N]).unwrap();
    home.synchronize().unwrap();
    let (_, guard) = buf.device_ptr_mut(&origin);
    origin.begin_capture(mode).unwrap();
    drop(guard);
    let refused = side.memset_zeros(&mut buf);
    let _ = ctx.check_err();
    end_joined_capture(&ctx, &origin, &side);
    assert!(refused.is_err(), "a memset joined into a capture went into it");
    // The buffer was not zeroed, and still works on every stream.
    all_equal("the buffer after the refusal", &side.clone_dtoh(&buf).unwrap(), 3.0);
    side.memset_zeros(&mut buf).unwrap();
    all_equal("a memset after the refusal", &home.clone_dtoh(&buf).unwrap(), 0.0);
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_stream_of_another_context_never_becomes_a_buffers_last_use() {
    // `wait_for_uses` (or an `Access`) with a stream of another context than the buffer's left
    // that stream as the buffer's last use: every later wait recorded the tracker's scratch event
    // there, which CUDA refuses, so the buffer's calls failed and its free leaked it. The stream
    // is refused now, and the buffer is untouched.
    use gpucomm_ordering::OrderError;
    let test = "a_stream_of_another_context_never_becomes_a_buffers_last_use";
    let Some(ctx) = one_gpu(test) else { return };
    let home = ctx.new_stream().unwrap();
    let mut buf = MemBuffer::from_host(&home, &[3.0f32; N]).unwrap();
    let other = CudaContext::new_non_primary(ctx.ordinal(), 0).expect("a non-primary context");
    // A second stream puts the context in cudarc's multi-stream mode, where the wait uses a
    // stream of its own (of `other`, here).
    let _second = other.new_stream().unwrap();
    let refused = gpucomm_ordering::wait_for_uses(&mut buf, &other, None);
    assert!(matches!(refused, Err(OrderError::StreamOfOtherContext)), "{refused:?}");
    let _ = other.check_err();
    drop((_second, other));
    // The buffer still orders its uses, and frees.
    let side = ctx.new_stream().unwrap();
    side.memset_zeros(&mut buf).unwrap();
    all_equal("a memset after the refusal", &home.clone_dtoh(&buf).unwrap(), 0.0);
    assert!(gpucomm_ordering::wait_for_uses(&mut buf, &ctx, None).unwrap());
    buf.free().map_err(|(_, e)| e).unwrap();
}

/// Session 26 (a known gap of the session 21 audit): cudarc allocates on a stream being captured
/// without refusing, so a `CudaSlice` made inside a capture's closure is a node of the graph,
/// backed only while a launch of the graph holds it. Before: a slice kept past the closure came
/// out beside a working graph, naming memory that nothing backed before the graph's first launch
/// (and that other graphs could share). Now the capture is refused with
/// `OrderError::AllocationLeft`, naming the allocation, and its buffers are handed back; a
/// slice made and dropped inside the closure is freed by the graph itself, which works.
#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_capture_that_keeps_memory_it_allocated_is_refused() {
    use gpucomm_ordering::OrderError;
    let Some((comm, ctx)) = one_rank("a_capture_that_keeps_memory_it_allocated_is_refused") else { return };
    let side = ctx.new_stream().unwrap();
    let mem = MemBuffer::from_host(&side, &[1.0f32; N]).unwrap();
    let mut graph = nccl::capture(&side, (&comm, mem), |(comm, mem)| {
        let scratch = side.alloc_zeros::<f32>(N)?;
        drop(scratch);
        comm.on(&side).all_reduce_in_place(mem, ReduceOp::SUM)
    })
    .expect("a slice allocated and dropped inside the capture is the graph's own business");
    graph.launch().unwrap();
    graph.launch().unwrap();
    all_equal("a graph that allocates and frees, launched twice", &side.clone_dtoh(&graph.kept().1).unwrap(), 1.0);
    let mem = graph.into_kept().1;

    let mut kept = None;
    let captured = nccl::capture(&side, (&comm, mem), |(comm, mem)| {
        kept = Some(side.alloc_zeros::<f32>(N)?);
        comm.on(&side).all_reduce_in_place(mem, ReduceOp::SUM)
    });
    match captured {
        Err(((_, mem), Error::Ordering(OrderError::AllocationLeft { bytes, .. }))) => {
            assert!(bytes >= N * size_of::<f32>(), "the allocation's size: {bytes}");
            all_equal("the buffer handed back", &side.clone_dtoh(&mem).unwrap(), 1.0);
        }
        Err((_, e)) => panic!("a capture that keeps a slice it allocated: {e}"),
        Ok(_) => panic!("a capture that keeps a slice it allocated gave a graph"),
    }
    // Its memory is the refused graph's, never backed: freeing it would fail.
    std::mem::forget(kept);
    assert_eq!(side.capture_status().unwrap(), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
}

/// Session 29 audit: a cudarc copy on another stream that reads a `MemBuffer` whose last use is on
/// the stream being captured cannot be ordered after that use (the error is recorded in the
/// context, as cudarc does). The tracker then ordered the copy's end on the host through the
/// copy stream's own handle, where that very error made cudarc skip the synchronisation, and
/// recorded nothing of the copy. Before: the buffer was freed at once while the copy still
/// waited behind 2 s of work on its stream (then read freed memory). Now the copy's end is an
/// event among the buffer's readers, which the free waits for.
#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_copy_that_could_not_be_ordered_is_still_waited_for_by_the_free() {
    let Some(ctx) = one_gpu("a_copy_that_could_not_be_ordered_is_still_waited_for_by_the_free") else { return };
    let side = ctx.new_stream().unwrap();
    let busy = ctx.new_stream().unwrap();
    let buf = MemBuffer::from_host(&side, &[2.0f32; N]).unwrap();
    side.synchronize().unwrap();
    let mut out = busy.alloc_zeros::<f32>(N).unwrap();
    busy.synchronize().unwrap();
    occupy(&busy, Duration::from_secs(2));
    let captured = nccl::capture(&side, (), |_| Ok(busy.memcpy_dtod(&buf, &mut out)?));
    // The copy is not ordered after the buffer's use on `side`: the error says so, in the context
    // (or returned by cudarc's copy, and with it by the capture).
    let reported = ctx.check_err().is_err() | captured.is_err();
    assert!(reported, "the copy that could not be ordered was not reported");
    drop(captured);
    let freeing = Instant::now();
    buf.free().map_err(|(_, e)| e).unwrap();
    let waited = freeing.elapsed();
    assert!(
        waited >= Duration::from_secs(1),
        "the free returned after {waited:?}, before the copy queued behind 2 s of work"
    );
    assert_eq!(busy.clone_dtoh(&out).unwrap(), vec![2.0f32; N], "the copy read the buffer before its free");
    println!("the free waited {waited:?} for the copy it could not order");
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn cudarc_end_capture_inside_a_capture_gets_no_graph() {
    // cudarc's safe `end_capture`, called on the scope's stream inside the closure. Before the fix
    // (the scope began the capture on that stream itself) it ended the scope's capture and
    // returned a cudarc graph of the first all-reduce, which kept nothing alive: the buffer could
    // be freed and the graph launched on freed memory. The scope now begins the capture on a
    // private stream that `side` joins, and CUDA lets only that stream end it: cudarc's call
    // fails (`CUDA_ERROR_STREAM_CAPTURE_UNMATCHED` is CUDA's documented answer).
    use gpucomm_ordering::OrderError;
    let test = "cudarc_end_capture_inside_a_capture_gets_no_graph";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let side = ctx.new_stream().unwrap();
    let double = PreMulSum::host(&comm, 2.0f32).unwrap();
    let mem = MemBuffer::from_host(comm.stream(), &[1.0f32; N]).unwrap();
    let mut stolen = None;
    let captured = nccl::capture(&side, (&comm, &double, mem), |(comm, double, mem)| {
        comm.on(&side).all_reduce_in_place(mem, *double)?;
        stolen = Some(side.end_capture(CUgraphInstantiate_flags(0)).map(|graph| graph.is_some()));
        comm.on(&side).all_reduce_in_place(mem, *double)
    });
    let _ = ctx.check_err();
    assert!(matches!(stolen, Some(Err(_))), "cudarc's end_capture inside the scope must fail: {stolen:?}");
    assert_eq!(side.capture_status().unwrap(), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
    // Whether CUDA went on with the capture after the refused end or invalidated it, the scope's
    // outcome is whole: a graph of both all-reduces, or a refusal that ran nothing.
    match captured {
        Ok(mut graph) => {
            graph.launch().unwrap();
            all_equal("both captured all-reduces", &side.clone_dtoh(&graph.kept().2).unwrap(), 4.0);
        }
        Err(((_, _, mem), err)) => {
            assert!(matches!(err, Error::Ordering(OrderError::CaptureBroken(_))), "{err}");
            all_equal("a buffer handed back by the broken capture", &side.clone_dtoh(&mem).unwrap(), 1.0);
        }
    }
    // The stream captures again as usual.
    let mem = MemBuffer::from_host(&side, &[1.0f32; N]).unwrap();
    let mut graph = nccl::capture(&side, (&comm, &double, mem), |(comm, double, mem)| {
        comm.on(&side).all_reduce_in_place(mem, *double)
    })
    .unwrap();
    graph.launch().unwrap();
    all_equal("a capture after the refused end", &side.clone_dtoh(&graph.kept().2).unwrap(), 2.0);
    drop(graph);
    drop(double);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_communicator_whose_graph_was_forgotten_is_abandoned_not_waited_for() {
    // NCCL (2.26 and later) destroys or aborts a communicator only once every CUDA graph holding
    // its work is destroyed. Before the fix, finalizing, aborting or dropping a communicator after
    // `mem::forget` of a graph that captured it waited for ever, and so did a finalize inside the
    // capture. Each now abandons it at once (its work stopped, itself leaked with what NCCL may
    // still use); a graph dropped before the teardown, as usual, leaves nothing behind.
    let test = "a_communicator_whose_graph_was_forgotten_is_abandoned_not_waited_for";
    let Some(ctx) = one_gpu(test) else { return };
    let side = ctx.new_stream().unwrap();
    let forget_a_graph = |comm: &Comm| {
        let mem = MemBuffer::from_host(&side, &[1.0f32; N]).unwrap();
        let graph =
            nccl::capture(&side, (comm, mem), |(comm, mem)| comm.on(&side).all_reduce_in_place(mem, ReduceOp::SUM))
                .unwrap();
        std::mem::forget(graph);
    };

    let comm = warmed_rank(&ctx);
    forget_a_graph(&comm);
    let (comm, err) = comm.finalize().unwrap_err();
    assert!(matches!(err, Error::GraphForgotten), "finalize: {err}");
    let mut buf = MemBuffer::from_host(&side, &[1.0f32; N]).unwrap();
    let refused = comm.all_reduce_in_place(&mut buf, ReduceOp::SUM);
    assert!(matches!(refused, Err(Error::Aborted)), "a call on the abandoned communicator: {refused:?}");
    drop(comm);

    let comm = warmed_rank(&ctx);
    forget_a_graph(&comm);
    let err = comm.abort().unwrap_err();
    assert!(matches!(err, Error::GraphForgotten), "abort: {err}");

    let comm = warmed_rank(&ctx);
    forget_a_graph(&comm);
    drop(comm);

    // Finalized inside the capture, after a captured call: the open capture holds its work, and
    // NCCL's destroy would wait for the capture's graph, which is made only after the closure
    // returns. The communicator is abandoned instead (before the fix: a wait for ever); the
    // capture, whose keep set cannot hold it, is refused.
    let mut owned = Some(warmed_rank(&ctx));
    let mut inside = None;
    let mem = MemBuffer::from_host(&side, &[1.0f32; N]).unwrap();
    let refused = nccl::capture(&side, (mem,), |(mem,)| {
        owned.as_ref().expect("the communicator").on(&side).all_reduce_in_place(mem, ReduceOp::SUM)?;
        inside = owned.take().map(|comm| comm.finalize().map_err(|(_, e)| e));
        Ok(())
    });
    assert!(matches!(inside, Some(Err(Error::GraphForgotten))), "finalize inside the capture: {inside:?}");
    assert!(refused.is_err(), "a capture whose communicator was torn down inside it");
    assert_eq!(side.capture_status().unwrap(), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);

    // A graph dropped first: the communicator finalizes as usual.
    let comm = warmed_rank(&ctx);
    let mem = MemBuffer::from_host(&side, &[1.0f32; N]).unwrap();
    let mut graph =
        nccl::capture(&side, (&comm, mem), |(comm, mem)| comm.on(&side).all_reduce_in_place(mem, ReduceOp::SUM))
            .unwrap();
    graph.launch().unwrap();
    all_equal("a one-rank sum", &side.clone_dtoh(&graph.kept().1).unwrap(), 1.0);
    drop(graph);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_new_buffer_is_not_filled_on_a_captured_stream() {
    // Before: `MemBuffer::zeroed` (and `from_host`) inside a capture recorded the fill into the
    // graph and handed the buffer out unwritten; a buffer kept by the graph was zeroed again at
    // every launch, wiping what was written into it between launches.
    let test = "a_new_buffer_is_not_filled_on_a_captured_stream";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let side = ctx.new_stream().unwrap();
    let mut refused = Vec::new();
    let graph = nccl::capture(&side, (), |()| {
        refused.push(MemBuffer::<f32>::zeroed(&side, N).map(drop));
        refused.push(MemBuffer::from_host(&side, &[1.0f32; N]).map(drop));
        Ok(())
    });
    assert!(graph.is_ok(), "{:?}", graph.err().map(|(_, e)| e));
    for result in refused {
        assert!(matches!(result, Err(Error::Ordering(gpucomm_ordering::OrderError::InitInCapture))), "{result:?}");
    }
    // Outside the capture the same calls fill the buffer.
    let zeroed = MemBuffer::<f32>::zeroed(&side, N).unwrap();
    all_equal("zeroed after the capture", &side.clone_dtoh(&zeroed).unwrap(), 0.0);
    drop(zeroed);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

/// Zeroes `buf` on `on` behind 300 ms of work, with the pointer of its `device_ptr_mut`, and
/// records `error` in the context before the use's guard drops — held in the calls' `Guard` when
/// `calls_guard`, else dropped as cudarc's own.
fn zero_behind_work_then_an_error<B: DevicePtrMut<f32>>(
    buf: &mut B,
    on: &Arc<CudaStream>,
    error: DriverError,
    calls_guard: bool,
) {
    let bytes = buf.num_bytes();
    let (ptr, guard) = buf.device_ptr_mut(on);
    let (cudarcs, ours) = if calls_guard { (None, Some(Guard::from(guard))) } else { (Some(guard), None) };
    occupy(on, std::time::Duration::from_millis(300));
    // SAFETY: `ptr` is the buffer's address for `on`, valid for `bytes` bytes, and its guard is
    // still alive (so the use is recorded after this write).
    unsafe { result::memset_d8_async(ptr, 0, bytes, on.cu_stream()) }.unwrap();
    on.context().record_err(Err::<(), _>(error));
    drop((cudarcs, ours));
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_use_is_recorded_although_the_context_holds_an_error() {
    // cudarc's guards record a buffer's event through a handle of the context whose first step
    // takes any error recorded there since (by any use of the context, on any thread) and then
    // skips the record. Before the fix, a zeroing enqueued behind 300 ms of work, whose guard
    // dropped after another use recorded an error, was left out of the buffer's events: a read on
    // a third stream read the buffer before the zeroing ran. Two guards: a `MemBuffer`'s, whose
    // tracker event cudarc's own guard records, and a cudarc slice's held in the calls' `Guard`.
    let test = "a_use_is_recorded_although_the_context_holds_an_error";
    let Some(ctx) = one_gpu(test) else { return };
    let (home, other, reader) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let unrelated = DriverError(CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);

    let mut tracked = MemBuffer::from_host(&home, &[1.0f32; N]).unwrap();
    home.synchronize().unwrap();
    zero_behind_work_then_an_error(&mut tracked, &other, unrelated, false);
    // The error stays for cudarc's next check, which reports it (and clears it).
    assert_eq!(ctx.check_err(), Err(unrelated));
    all_equal("a MemBuffer read after the zeroing", &reader.clone_dtoh(&tracked).unwrap(), 0.0);

    let mut slice = home.clone_htod(&[1.0f32; N]).unwrap();
    home.synchronize().unwrap();
    zero_behind_work_then_an_error(&mut slice, &other, unrelated, true);
    assert_eq!(ctx.check_err(), Err(unrelated));
    all_equal("a cudarc slice read after the zeroing", &reader.clone_dtoh(&slice).unwrap(), 0.0);
    other.synchronize().unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_use_on_the_per_thread_stream_is_synchronised_although_the_context_holds_an_error() {
    // A tracked buffer's use on the per-thread default stream is ordered on the host: its guard
    // synchronises the stream once cudarc has enqueued the use. Before, that synchronisation went
    // through the user's handle of the context, which first took an error recorded there
    // meanwhile and skipped the wait: the zeroing below was left running unrecorded, and a read
    // on another stream read the buffer before it. The guard now synchronises through the
    // tracker's own handle, and the error stays for cudarc's next check.
    let test = "a_use_on_the_per_thread_stream_is_synchronised_although_the_context_holds_an_error";
    let Some(ctx) = one_gpu(test) else { return };
    let (home, reader) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let unrelated = DriverError(CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    let mut tracked = MemBuffer::from_host(&home, &[1.0f32; N]).unwrap();
    home.synchronize().unwrap();
    zero_behind_work_then_an_error(&mut tracked, &ctx.per_thread_stream(), unrelated, false);
    assert_eq!(ctx.check_err(), Err(unrelated));
    all_equal("a read after the per-thread zeroing", &reader.clone_dtoh(&tracked).unwrap(), 0.0);
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_window_or_registration_released_inside_a_capture_is_kept() {
    // Session 19 audit: a window or registration let go inside a capture's closure was
    // deregistered (and a window's memory freed), while calls captured before may use it: the
    // graph finds what it keeps only when the closure returns, so it would not keep that one, and
    // a new buffer of the keep set could even take the freed address, pinning no window at all.
    // Now releasing either inside a capture is refused (`Error::ReleaseInCapture`: nothing is
    // released) and a dropped one is kept, its memory leaked, until the communicator goes.
    use nccl::WindowFlags;
    let test = "a_window_or_registration_released_inside_a_capture_is_kept";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let side = ctx.new_stream().unwrap();
    let zeroed = || MemBuffer::<f32>::zeroed(comm.stream(), N).unwrap();
    let window = comm.register_window(zeroed(), WindowFlags::COLL_SYMMETRIC).map_err(|(_, e)| e).unwrap();
    let mut registration = Some(comm.register(zeroed()).map_err(|(_, e)| e).unwrap());
    let mut graph = nccl::capture(&side, (&comm, Some(window)), |(comm, w)| {
        let comm: &Comm = comm;
        comm.on(&side).all_reduce_in_place(&mut w.as_mut().unwrap().as_view_mut(), ReduceOp::SUM)?;
        match w.take().unwrap().deregister() {
            Err((back, Error::ReleaseInCapture { .. })) => *w = Some(back),
            Err((_, e)) => panic!("a window deregistered inside a capture failed otherwise: {e}"),
            Ok(_) => panic!("a window was deregistered inside a capture"),
        }
        match registration.take().unwrap().deregister() {
            Err((back, Error::ReleaseInCapture { .. })) => registration = Some(back),
            Err((_, e)) => panic!("a registration deregistered inside a capture failed otherwise: {e}"),
            Ok(_) => panic!("a registration was deregistered inside a capture"),
        }
        Ok(())
    })
    .map_err(|(_, e)| e)
    .unwrap();
    // The graph kept the window, and runs; after the capture both are released as usual.
    graph.launch().unwrap();
    graph.into_kept().1.unwrap().deregister().map_err(|(_, e)| e).unwrap();
    registration.unwrap().deregister().map_err(|(_, e)| e).unwrap();
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn eager_calls_on_many_streams_inside_a_capture_leave_it_whole() {
    // Session 19 audit: a communicator remembers the streams its calls went to, and past eight
    // forgets the idle ones, asking each whether it is idle (`cuStreamQuery`). A captured call's
    // stream was among them, and CUDA answers that query by invalidating the capture: a capture
    // with a captured call and eager calls on eight more streams broke. A stream being captured is
    // not asked now. `Comm::wait` inside the capture is refused (`Error::WaitInCapture`): on the
    // GPU machine its host-side queries failed with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.
    let test = "eager_calls_on_many_streams_inside_a_capture_leave_it_whole";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let side = ctx.new_stream().unwrap();
    let others: Vec<_> = (0..9).map(|_| ctx.new_stream().unwrap()).collect();
    let mut eager = MemBuffer::from_host(comm.stream(), &[1.0f32; N]).unwrap();
    let buf = MemBuffer::from_host(comm.stream(), &[2.0f32; N]).unwrap();
    let mut graph = nccl::capture(&side, (&comm, buf), |(comm, buf)| {
        let comm: &Comm = comm;
        comm.on(&side).all_reduce_in_place(buf, ReduceOp::SUM)?;
        for other in &others {
            comm.on(other).all_reduce_in_place(&mut eager, ReduceOp::SUM)?;
        }
        match comm.wait(None) {
            Err(Error::WaitInCapture) => Ok(()),
            other => panic!("Comm::wait inside a capture: {other:?}"),
        }
    })
    .map_err(|(_, e)| e)
    .unwrap();
    graph.launch().unwrap();
    let (_, buf) = graph.into_kept();
    all_equal("the captured buffer after one launch (a one-rank sum)", &side.clone_dtoh(&buf).unwrap(), 2.0);
    all_equal("the eager buffer", &others[8].clone_dtoh(&eager).unwrap(), 1.0);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_buffer_swapped_for_another_element_type_at_the_same_address_is_refused() {
    // Session 19 audit: a graph knew a kept buffer by device, context, address and size. A kept
    // f32 buffer swapped (through `kept_mut`) for a u8 buffer of the same bytes that the allocator
    // placed at the same address passed for it, and the launch wrote f32 bytes into it (into
    // `bool`s, invalid values). Now the graph compares element types too, and the use it captured
    // finds no buffer of its type.
    use gpucomm_ordering::OrderError;
    let test = "a_buffer_swapped_for_another_element_type_at_the_same_address_is_refused";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let side = ctx.new_stream().unwrap();
    let buf = side.clone_htod(&[2.0f32; N]).unwrap();
    let mut graph = nccl::capture(&side, (&comm, Some(buf), None::<cudarc::driver::CudaSlice<u8>>), |(comm, b, _)| {
        let comm: &Comm = comm;
        comm.on(&side).all_reduce_in_place(b.as_mut().unwrap(), ReduceOp::SUM)
    })
    .map_err(|(_, e)| e)
    .unwrap();
    graph.launch().unwrap();
    let old = graph.kept().1.as_ref().unwrap().device_ptr(&side).0;
    drop(graph.kept_mut().1.take());
    let bytes = side.alloc_zeros::<u8>(N * 4).unwrap();
    let reused = bytes.device_ptr(&side).0 == old;
    graph.kept_mut().2 = Some(bytes);
    let refused = graph.launch().unwrap_err();
    assert!(matches!(refused, OrderError::NotKept { .. }), "{refused}");
    println!("a f32 buffer swapped for u8s: launch refused ({refused}); the memory was reused: {reused}");
    drop(graph);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_release_waits_for_its_buffer_despite_an_unrelated_recorded_error() {
    // Session 19 audit: the wait for a buffer's uses before it is deregistered went through
    // cudarc's checks, which fail on (and take) any error recorded in the context: the release
    // failed, the buffer was leaked, and the error's owner never saw it. The error is now set
    // aside for the wait and recorded again after it.
    let test = "a_release_waits_for_its_buffer_despite_an_unrelated_recorded_error";
    let Some((comm, ctx)) = one_rank(test) else { return };
    let registration = comm.register(MemBuffer::<f32>::zeroed(comm.stream(), N).unwrap()).map_err(|(_, e)| e).unwrap();
    let unknown = DriverError(CUresult::CUDA_ERROR_UNKNOWN);
    ctx.record_err::<()>(Err(unknown));
    // The buffer is kept until the error is looked at: its drop's own cudarc calls would take it.
    let buf = registration.deregister().map_err(|(_, e)| e).unwrap();
    let left = ctx.check_err();
    assert!(matches!(left, Err(e) if e == unknown), "the release took the unrelated error: {left:?}");
    drop(buf);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}
