//! The watchdog, its flight recorder, and borrowed communicators (issue 15).
//!
//! * A hung collective (2 processes): rank 1 never makes the all-reduce rank 0 makes. Rank 0's
//!   watchdog must abort the communicator and report the call — name, count, type, sequence
//!   number, stream — with the recorder's history, (a) at once while rank 0 waits parked
//!   (`Comm::parked` around a stream synchronize), and (b) as a request while rank 0 is busy
//!   elsewhere, carried out at its next call. Works with one GPU: both ranks use GPU 0, each with
//!   its own `NCCL_HOSTID` (`gpucomm_tests::multi_node_on_one_gpu`), so NCCL takes the two
//!   processes for two machines (sockets) and lets them share the GPU.
//! * A timeout, or an `AbortHandle`, while a CUDA graph that captured the communicator is alive
//!   (2 processes, as above): the wait returns, the communicator's work is stopped, and NCCL's
//!   abort, which waits for every such graph, runs when the owner drops or aborts the
//!   communicator. When a launch of such a graph is held back behind other work, NCCL's revoke
//!   waits for it: the abort gives up after 10 s and abandons the communicator.
//! * One GPU, one rank: the recorder numbers and completes the calls of a watched communicator,
//!   groups included; a borrowed communicator is used (directly, in a group, captured into a graph
//!   that must keep it) and left to its owner, alive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream};
use gpucomm_launch::{Options, RankInfo, Rendezvous};
use gpucomm_ordering::OrderError;
use gpucomm_tests::{multi_node_on_one_gpu, require_gpus};
use nccl::watchdog::{CallRecord, CallState, Cause};
use nccl::{AbortStatus, BorrowedComm, Collectives, Comm, Config, Error, Graph, ReduceOp, UniqueId, Watchdog};

const TIMEOUT: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(50);
const COUNT: usize = 1 << 16;
const WARM_UP: usize = 3;

#[test]
#[ignore = "needs 1 GPU (2 processes share it): run by the GPU bundle"]
fn watchdog_aborts_a_hung_all_reduce_at_once_while_parked() {
    multi_node_on_one_gpu("watchdog_aborts_a_hung_all_reduce_at_once_while_parked", 2, |info, stream| {
        rank(info, &stream, Wait::Parked)
    });
}

#[test]
#[ignore = "needs 1 GPU (2 processes share it): run by the GPU bundle"]
fn watchdog_requests_the_abort_of_a_busy_owner() {
    multi_node_on_one_gpu("watchdog_requests_the_abort_of_a_busy_owner", 2, |info, stream| {
        rank(info, &stream, Wait::Busy)
    });
}

/// How rank 0 waits for the hung all-reduce.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Wait {
    /// Blocked on the GPU inside `Comm::parked`.
    Parked,
    /// Busy elsewhere, outside this crate.
    Busy,
}

/// A rank's stream of its own (the default stream is the legacy one, handle 0 in the records),
/// its rendezvous, and a nonblocking communicator of both ranks without a timeout of its own
/// (creation may take a while on a fresh process: bounded by 60 s).
fn join(info: &RankInfo, device: &Arc<CudaStream>) -> (Arc<CudaStream>, Rendezvous, Comm) {
    let stream = device.context().new_stream().expect("a stream");
    let mut rendezvous = Rendezvous::connect(info, &Options::from_env().expect("options")).expect("rendezvous");
    let config = Config::new().blocking(false).timeout(Duration::from_secs(60));
    let comm = Comm::from_rendezvous_config(stream.clone(), &mut rendezvous, &config).expect("join");
    comm.set_timeout(None);
    (stream, rendezvous, comm)
}

/// One rank (both share GPU 0, each with its own `NCCL_HOSTID`): a nonblocking communicator
/// watched with a 2 s timeout, three all-reduces on both ranks, then a fourth on rank 0 only.
fn rank(info: RankInfo, device: &Arc<CudaStream>, mode: Wait) {
    let (stream, mut rendezvous, mut comm) = join(&info, device);
    let watchdog = Watchdog::start(POLL).expect("the watchdog thread");
    watchdog.watch(&comm, TIMEOUT).expect("watch a nonblocking communicator");

    let mut buf = stream.clone_htod(&vec![(info.rank + 1) as f32; COUNT]).unwrap();
    for _ in 0..WARM_UP {
        comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
        comm.wait(None).unwrap();
    }
    rendezvous.barrier().expect("both ranks warmed up");
    if info.rank == 1 {
        // Never makes the fourth all-reduce; waits for rank 0 to finish, then leaves. Its peer
        // aborted, so it aborts too (finalizing would wait for the peer).
        rendezvous.barrier().expect("rank 0 done");
        assert!(watchdog.reports().is_empty(), "rank 1 has nothing in flight: {:?}", watchdog.reports());
        return comm.abort().expect("abort");
    }

    let start = Instant::now();
    comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).expect("the all-reduce is enqueued");
    let outcome = match mode {
        // Blocked on the GPU, parked: the watchdog aborts at once, which frees the stream.
        Wait::Parked => comm.parked(|| stream.synchronize()).map(drop),
        // Busy elsewhere (not inside this crate): the watchdog can only request the abort.
        Wait::Busy => {
            while watchdog.reports().is_empty() && start.elapsed() < 4 * TIMEOUT {
                std::thread::sleep(POLL);
            }
            comm.all_reduce_in_place(&mut buf, ReduceOp::SUM)
        }
    };
    let took = start.elapsed();
    assert!(matches!(outcome, Err(Error::Aborted)), "{mode:?}: {outcome:?}");
    assert!(took >= TIMEOUT && took < TIMEOUT + Duration::from_secs(3), "{mode:?}: aborted after {took:?}");
    assert!(comm.is_aborted());

    let reports = watchdog.reports();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let report = &reports[0];
    print!("{report}");
    assert!(matches!(report.cause, Cause::Timeout { timeout: TIMEOUT, .. }), "{:?}", report.cause);
    let expected_abort = if mode == Wait::Parked { AbortStatus::Aborted } else { AbortStatus::Requested };
    assert_eq!(report.abort, Ok(expected_abort));
    assert_eq!((report.rank, report.size), (0, 2));
    let hung = report.hung.as_ref().expect("the hung call is in the recorder");
    assert_eq!((hung.seq, hung.call, hung.count, hung.dtype), (WARM_UP as u64, "ncclAllReduce", COUNT, "f32"));
    assert_eq!(hung.stream, stream.cu_stream() as usize);
    assert_eq!(hung.state, CallState::Enqueued);
    let states: Vec<(u64, CallState)> = report.recent.iter().map(|c| (c.seq, c.state)).collect();
    let mut expected: Vec<(u64, CallState)> = (0..WARM_UP as u64).map(|s| (s, CallState::Completed)).collect();
    expected.push((WARM_UP as u64, CallState::Enqueued));
    assert_eq!(states, expected);
    rendezvous.barrier().expect("tell rank 1");
}

#[test]
#[ignore = "needs 1 GPU (2 processes share it): run by the GPU bundle"]
fn a_timeout_while_a_graph_holds_the_communicator_stops_it_without_waiting_for_the_graph() {
    // Before the fix the timeout's `ncclCommAbort` waited, inside `Comm::wait`, until every graph
    // holding the communicator's work was destroyed — the graph rank 0 still holds — so the wait
    // never returned (call 36 on the GPU machine: killed after 30 s).
    let test = "a_timeout_while_a_graph_holds_the_communicator_stops_it_without_waiting_for_the_graph";
    multi_node_on_one_gpu(test, 2, |info, device| graph_rank(info, &device, Stop::Timeout));
}

#[test]
#[ignore = "needs 1 GPU (2 processes share it): run by the GPU bundle"]
fn an_abort_handle_while_a_graph_holds_the_communicator_stops_it_without_waiting_for_the_graph() {
    // The same through an `AbortHandle` on another thread, while the owner waits parked: before
    // the fix that thread's `ncclCommAbort` waited for the graph, and the owner for the abort.
    let test = "an_abort_handle_while_a_graph_holds_the_communicator_stops_it_without_waiting_for_the_graph";
    multi_node_on_one_gpu(test, 2, |info, device| graph_rank(info, &device, Stop::Handle));
}

/// What stops rank 0's hung graph launch.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stop {
    /// `Comm::wait` with a 2 s bound.
    Timeout,
    /// An `AbortHandle` on another thread after 2 s, while `Comm::wait` (unbounded) is parked.
    Handle,
}

/// One rank: both capture an all-reduce into a graph; rank 0 launches it, rank 1 never does, and
/// rank 0's communicator is aborted after 2 s (`stop`). The abort stops the work
/// (`ncclCommRevoke`), the wait returns, the graph refuses to launch again, a registration stays
/// with NCCL, and the communicator is freed by `Comm::abort` once the graph is gone.
fn graph_rank(info: RankInfo, device: &Arc<CudaStream>, stop: Stop) {
    let abort = "the abort, completed once the graph is gone";
    with_a_captured_all_reduce(info, device, abort, |stream, comm, graph| graph_rank_0(stream, comm, graph, stop));
}

/// The all-reduce graph both ranks capture in [`with_a_captured_all_reduce`].
type AllReduceGraph<'c> = Graph<(&'c Comm, CudaSlice<f32>)>;

/// Both ranks join, make one all-reduce and capture another into a graph. Rank 1 then waits until
/// rank 0 is done and aborts, never taking part in the graph's work; rank 0 runs `rank_0` with
/// its stream, communicator and graph (which `rank_0` drops), aborts (`abort` says what that must
/// do), drops what `rank_0` returned, and tells rank 1.
fn with_a_captured_all_reduce<R>(
    info: RankInfo,
    device: &Arc<CudaStream>,
    abort: &str,
    rank_0: impl FnOnce(&Arc<CudaStream>, &Comm, AllReduceGraph<'_>) -> R,
) {
    let (stream, mut rendezvous, comm) = join(&info, device);
    let mut buf = stream.clone_htod(&vec![(info.rank + 1) as f32; COUNT]).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
    comm.wait(None).unwrap();
    let graph = nccl::capture(&stream, (&comm, buf), |(comm, buf)| comm.all_reduce_in_place(buf, ReduceOp::SUM))
        .map_err(|(_, e)| e)
        .expect("capture");
    rendezvous.barrier().expect("both ranks captured");
    if info.rank == 1 {
        rendezvous.barrier().expect("rank 0 done");
        drop(graph);
        return comm.abort().expect("abort");
    }
    let kept = rank_0(&stream, &comm, graph);
    comm.abort().expect(abort);
    drop(kept);
    rendezvous.barrier().expect("tell rank 1");
}

/// Rank 0 of [`graph_rank`]: launches the graph, which waits for rank 1 for ever, and stops it
/// with `stop`.
fn graph_rank_0(stream: &Arc<CudaStream>, comm: &Comm, mut graph: AllReduceGraph<'_>, stop: Stop) {
    let registration = comm.register(stream.clone_htod(&[7.0f32; 256]).unwrap()).map_err(|(_, e)| e).unwrap();
    graph.launch().expect("the launch is enqueued");
    let start = Instant::now();
    let outcome = match stop {
        Stop::Timeout => comm.wait(Some(TIMEOUT)),
        Stop::Handle => {
            let handle = comm.abort_handle().expect("a nonblocking communicator");
            std::thread::scope(|s| {
                let aborter = s.spawn(move || {
                    std::thread::sleep(TIMEOUT);
                    handle.abort()
                });
                let outcome = comm.wait(None);
                let status = aborter.join().expect("the aborting thread");
                assert_eq!(status.expect("the abort"), AbortStatus::Aborted, "the owner was parked");
                outcome
            })
        }
    };
    let took = start.elapsed();
    match stop {
        Stop::Timeout => assert!(matches!(outcome, Err(Error::Timeout { .. })), "{outcome:?}"),
        Stop::Handle => assert!(matches!(outcome, Err(Error::Aborted)), "{outcome:?}"),
    }
    assert!(took < TIMEOUT + Duration::from_secs(3), "{stop:?}: the wait returned after {took:?}");
    assert!(comm.is_aborted());
    // The graph's kernel was stopped: the stream drains although the peer never joined.
    drains(stream, "the graph's work still runs after the abort");
    let refused = graph.launch().expect_err("a graph of an aborted communicator launched");
    assert!(matches!(refused, OrderError::ResourceClosed { kind: "communicator" }), "{refused:?}");
    // NCCL keeps the registration until the communicator is freed: the buffer is not given back.
    let (registration, kept) = registration.deregister().expect_err("deregistered a stopped communicator's buffer");
    assert!(matches!(kept, Error::AbortPending), "{kept:?}");
    drop(registration);
    drop(graph);
}

#[test]
#[ignore = "needs 1 GPU (2 processes share it): run by the GPU bundle"]
fn a_timeout_while_a_graph_launch_is_held_behind_other_work_abandons_the_communicator_in_bounded_time() {
    // Session 27. An abort deferred while a graph holds the communicator revokes it, and NCCL's
    // revoke first waits for the work enqueued before it, graph launches included (the graphs
    // record NCCL's stream event, which it synchronises). A launch held back behind work that
    // never ends (here a stream wait that the test releases only afterwards) held the revoke, and
    // with it the timed-out wait, for ever (one H100: the first form of this test hung on rank 0).
    // The crate now waits 10 s for the revoke and then abandons the communicator: never passed
    // to NCCL again (its revoke runs on in NCCL's background job), leaked at teardown.
    let test = "a_timeout_while_a_graph_launch_is_held_behind_other_work_abandons_the_communicator_in_bounded_time";
    multi_node_on_one_gpu(test, 2, |info, device| {
        let abort = "an abandoned communicator's teardown calls nothing";
        with_a_captured_all_reduce(info, &device, abort, |stream, comm, mut graph| {
            let release = HostFlag::new();
            release.hold(stream);
            graph.launch().expect("the launch is enqueued behind the held stream");
            let start = Instant::now();
            let outcome = comm.wait(Some(TIMEOUT));
            let took = start.elapsed();
            assert!(matches!(outcome, Err(Error::Timeout { .. })), "{outcome:?}");
            let revoke_wait = Duration::from_secs(10);
            assert!(
                took >= TIMEOUT + revoke_wait && took < TIMEOUT + revoke_wait + Duration::from_secs(5),
                "the wait returned after {took:?}"
            );
            assert!(comm.is_aborted());
            let refused = graph.launch().expect_err("a graph of an aborted communicator launched");
            assert!(matches!(refused, OrderError::ResourceClosed { kind: "communicator" }), "{refused:?}");
            // The held launch runs now: its kernel finds the abort flag the revoke set, and ends.
            release.set();
            drains(stream, "the held launch still runs");
            drop(graph);
            println!("a graph launch held behind other work held the revoke: abandoned after {took:?}");
        });
    });
}

/// Asserts that the work enqueued on `stream` so far completes within 10 s (`still_runs` says
/// what it means when it does not).
fn drains(stream: &CudaStream, still_runs: &str) {
    let drained = stream.record_event(None).unwrap();
    let start = Instant::now();
    while !drained.try_is_complete().unwrap() {
        assert!(start.elapsed() < Duration::from_secs(10), "{still_runs}");
        std::thread::sleep(POLL);
    }
}

/// A word of pinned host memory that a stream can wait for (`cuStreamWaitValue32`): holds a
/// stream's later work back until the host sets it.
struct HostFlag(*mut u32);

impl HostFlag {
    fn new() -> Self {
        let mut word = std::ptr::null_mut();
        let flags = cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: CUDA writes the address of 4 new bytes of pinned memory into `word`.
        unsafe { cudarc::driver::sys::cuMemHostAlloc(&mut word, 4, flags) }.result().expect("pinned memory");
        let word = word as *mut u32;
        // SAFETY: `word` is 4 bytes of pinned memory, just allocated and aligned.
        unsafe { word.write_volatile(0) };
        HostFlag(word)
    }

    /// Makes `stream` wait until the word is set.
    fn hold(&self, stream: &CudaStream) {
        let wait = cudarc::driver::sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32;
        // SAFETY: the stream is alive; with unified addressing the pinned word's host address is
        // its device address, and the word outlives the wait (the test drains the stream first).
        unsafe { cudarc::driver::sys::cuStreamWaitValue32_v2(stream.cu_stream(), self.0 as u64, 1, wait) }
            .result()
            .expect("a stream wait");
    }

    /// Sets the word: the held streams go on.
    fn set(&self) {
        // SAFETY: the word is alive (freed in `drop`); the GPU only reads it.
        unsafe { self.0.write_volatile(1) };
    }
}

impl Drop for HostFlag {
    fn drop(&mut self) {
        self.set();
        // SAFETY: allocated by `cuMemHostAlloc` in `new`, freed once, after the streams that
        // waited for it went on.
        let _ = unsafe { cudarc::driver::sys::cuMemFreeHost(self.0 as *mut std::ffi::c_void) };
    }
}

#[test]
#[ignore = "needs 1 GPU (2 processes share it): run by the GPU bundle"]
fn a_timeout_of_a_call_in_progress_while_a_graph_holds_the_communicator_abandons_it() {
    // Session 21 audit. A deferred abort revokes the communicator (ncclCommRevoke), which aborts
    // the background job of a nonblocking call still in progress and frees it, but leaves NCCL's
    // pointer to it (`comm->groupJob`, 2.28.9): the crate's polling of the revoke
    // (`ncclCommGetAsyncError`, once the revoke succeeds) and the teardown's `ncclCommAbort` then
    // used the freed job. Now NCCL is asked first: with a call in progress the revoke still stops
    // it, and the communicator is abandoned — never passed to NCCL again, its registrations kept.
    let test = "a_timeout_of_a_call_in_progress_while_a_graph_holds_the_communicator_abandons_it";
    // Rank 1 never receives: rank 0's send stays in NCCL's background job, connecting.
    multi_node_on_one_gpu(test, 2, |info, device| {
        let abort = "an abandoned communicator's teardown calls nothing";
        with_a_captured_all_reduce(info, &device, abort, |stream, comm, graph| {
            let registration = comm.register(stream.clone_htod(&[7.0f32; 256]).unwrap()).map_err(|(_, e)| e).unwrap();
            let data = stream.clone_htod(&[1.0f32; 1024]).unwrap();
            comm.set_timeout(Some(TIMEOUT));
            let start = Instant::now();
            let sent = comm.send(&data, 1);
            let took = start.elapsed();
            assert!(matches!(sent, Err(Error::Timeout { .. })), "{sent:?}");
            assert!(took < TIMEOUT + Duration::from_secs(5), "the send returned after {took:?}");
            assert!(comm.is_aborted());
            // Abandoned: NCCL is not called on it again, so what it holds stays with it.
            let (registration, kept) =
                registration.deregister().expect_err("deregistered an abandoned communicator's buffer");
            assert!(matches!(kept, Error::Abandoned { .. }), "{kept:?}");
            drop(registration);
            drop(graph);
            println!("a send in progress timed out while a graph held the communicator: revoked and abandoned");
            // Kept until after the abort.
            data
        });
    });
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn the_flight_recorder_numbers_and_completes_calls_groups_included() {
    let Some(streams) = require_gpus("the_flight_recorder_numbers_and_completes_calls_groups_included", 1) else {
        return;
    };
    let stream = streams[0].context().new_stream().unwrap();
    let config = Config::new().blocking(false);
    let comm = Comm::init_rank_config(stream.clone(), &UniqueId::new().unwrap(), 0, 1, &config).unwrap();
    let watchdog = Watchdog::start(POLL).unwrap();
    assert!(watchdog.flight_record(&comm).is_none(), "not watched yet");
    watchdog.watch(&comm, TIMEOUT).unwrap();
    let mut a = stream.clone_htod(&[1.0f32; 100]).unwrap();
    let mut b = stream.alloc_zeros::<i32>(7).unwrap();
    comm.all_reduce_in_place(&mut a, ReduceOp::SUM).unwrap();
    comm.broadcast_in_place(&mut b, 0).unwrap();
    nccl::group(|g| {
        g.with(&comm).all_reduce_in_place(&mut a, ReduceOp::MAX)?;
        g.with(&comm).broadcast_in_place(&mut b, 0)
    })
    .unwrap();
    comm.wait(None).unwrap();
    std::thread::sleep(3 * POLL);
    let record = watchdog.flight_record(&comm).expect("watched");
    let on_stream = |seq, call, count, dtype, rank| CallRecord {
        seq,
        call,
        count,
        dtype,
        rank,
        stream: stream.cu_stream() as usize,
        state: CallState::Completed,
    };
    assert_eq!(
        record,
        [
            on_stream(0, "ncclAllReduce", 100, "f32", None),
            on_stream(1, "ncclBroadcast", 7, "i32", Some(("root", 0))),
            on_stream(2, "ncclAllReduce", 100, "f32", None),
            on_stream(3, "ncclBroadcast", 7, "i32", Some(("root", 0))),
        ]
    );
    assert!(watchdog.reports().is_empty());
    watchdog.unwatch(&comm);
    assert!(watchdog.flight_record(&comm).is_none());
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn a_borrowed_communicator_is_used_and_left_alive_to_its_owner() {
    let Some(streams) = require_gpus("a_borrowed_communicator_is_used_and_left_alive_to_its_owner", 1) else {
        return;
    };
    let stream = streams[0].clone();
    // The "framework": owns the communicator.
    let owner = Comm::init_rank(stream.clone(), &UniqueId::new().unwrap(), 0, 1).unwrap();
    let mut buf = stream.clone_htod(&[2.0f32, 3.0]).unwrap();
    {
        // SAFETY: `owner` keeps the communicator alive while it is borrowed, and this thread is
        // the only one using it.
        let borrowed = unsafe { BorrowedComm::from_raw_borrowed(owner.as_raw(), stream.clone(), &owner) }.unwrap();
        assert_eq!((borrowed.rank(), borrowed.size(), borrowed.device()), (0, 1, owner.device()));
        borrowed.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
        nccl::group(|g| g.with_borrowed(&borrowed).all_reduce_in_place(&mut buf, ReduceOp::MAX)).unwrap();
        borrowed.wait().unwrap();
        // Captured calls on it: the graph must keep `&borrowed`, as it keeps a `&Comm`.
        let side = stream.context().new_stream().unwrap();
        let (_, err) =
            nccl::capture(&side, &mut buf, |buf| borrowed.on(&side).all_reduce_in_place(*buf, ReduceOp::SUM))
                .unwrap_err();
        assert!(matches!(err, Error::Ordering(OrderError::ResourceNotKept { kind: "communicator" })), "{err}");
        let mut graph = nccl::capture(&side, (&borrowed, &mut buf), |(borrowed, buf)| {
            borrowed.on(&side).all_reduce_in_place(*buf, ReduceOp::SUM)
        })
        .unwrap();
        graph.launch().unwrap();
        graph.launch().unwrap();
        drop(graph);
        // A null handle is refused and nothing is owned.
        // SAFETY: null is refused before it is used.
        let err = unsafe { BorrowedComm::from_raw_borrowed(std::ptr::null_mut(), stream.clone(), &owner) }.unwrap_err();
        assert!(matches!(err, Error::NullCommunicator), "{err}");
    } // dropped: given back, not destroyed
    assert_eq!(stream.clone_dtoh(&buf).unwrap(), [2.0, 3.0]);
    assert!(!owner.is_aborted());
    owner.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
    owner.finalize().map_err(|(_, e)| e).expect("the owner's communicator is still healthy");
}
