//! The watchdog, its flight recorder, and borrowed communicators (issue 15).
//!
//! * A hung collective (2 processes): rank 1 never makes the all-reduce rank 0 makes. Rank 0's
//!   watchdog must abort the communicator and report the call — name, count, type, sequence
//!   number, stream — with the recorder's history, (a) at once while rank 0 waits parked
//!   (`Comm::parked` around a stream synchronize), and (b) as a request while rank 0 is busy
//!   elsewhere, carried out at its next call. Works with one GPU: every rank sets its own
//!   `NCCL_HOSTID`, so NCCL takes the two processes for two machines (sockets) and lets them share
//!   the GPU; with two GPUs each rank has its own.
//! * One GPU, one rank: the recorder numbers and completes the calls of a watched communicator,
//!   groups included; a borrowed communicator is used and left to its owner, alive.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use gpucomm_launch::{spawn_local, Options, RankInfo, Rendezvous};
use gpucomm_tests::{device_count, require_gpus, skip};
use nccl::watchdog::{CallRecord, CallState, Cause};
use nccl::{AbortStatus, BorrowedComm, Collectives, Comm, Config, Error, ReduceOp, UniqueId, Watchdog};

const TIMEOUT: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(50);
const COUNT: usize = 1 << 16;
const WARM_UP: usize = 3;
/// Set in the ranks: how rank 0 waits for the hung all-reduce (`parked` or `busy`).
const MODE_VAR: &str = "GPUCOMM_WATCHDOG_MODE";

#[test]
#[ignore = "needs 1 GPU (2 processes share it): run by the GPU bundle"]
fn watchdog_aborts_a_hung_all_reduce_at_once_while_parked() {
    two_ranks("watchdog_aborts_a_hung_all_reduce_at_once_while_parked", "parked");
}

#[test]
#[ignore = "needs 1 GPU (2 processes share it): run by the GPU bundle"]
fn watchdog_requests_the_abort_of_a_busy_owner() {
    two_ranks("watchdog_requests_the_abort_of_a_busy_owner", "busy");
}

/// The parent: one job of two ranks; both must exit cleanly.
fn two_ranks(test: &str, mode: &str) {
    if let Ok(mode) = std::env::var(MODE_VAR) {
        return rank(&mode);
    }
    if device_count() < 1 {
        return skip(test, "needs a GPU, found none");
    }
    let exe = std::env::current_exe().expect("the test binary");
    let args: Vec<OsString> =
        ["--exact", test, "--include-ignored", "--nocapture", "--test-threads=1"].map(Into::into).into();
    let env = [(MODE_VAR.to_string(), mode.to_string())];
    let outcome = spawn_local(2, &exe, &args, &env, Duration::from_secs(30)).expect("spawn the two ranks");
    assert!(outcome.success(), "{test}: {outcome:?}");
}

/// One rank: a nonblocking communicator watched with a 2 s timeout, three all-reduces on both
/// ranks, then a fourth on rank 0 only.
fn rank(mode: &str) {
    let info = RankInfo::from_env().expect("launcher variables");
    // Two "hosts" for NCCL, so that both ranks may share one GPU.
    std::env::set_var("NCCL_HOSTID", format!("gpucomm-watchdog-test-{}", info.rank));
    let ctx = CudaContext::new(info.device_ordinal(device_count()).expect("a GPU")).expect("open the GPU");
    let stream = ctx.new_stream().expect("a stream");
    let mut rendezvous = Rendezvous::connect(&info, &Options::from_env().expect("options")).expect("rendezvous");
    let config = Config::new().blocking(false).timeout(Duration::from_secs(60));
    let mut comm = Comm::from_rendezvous_config(stream.clone(), &mut rendezvous, &config).expect("join");
    comm.set_timeout(None);
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
        "parked" => comm.parked(|| stream.synchronize()).map(drop),
        // Busy elsewhere (not inside this crate): the watchdog can only request the abort.
        _ => {
            while watchdog.reports().is_empty() && start.elapsed() < 4 * TIMEOUT {
                std::thread::sleep(POLL);
            }
            comm.all_reduce_in_place(&mut buf, ReduceOp::SUM)
        }
    };
    let took = start.elapsed();
    assert!(matches!(outcome, Err(Error::Aborted)), "{mode}: {outcome:?}");
    assert!(took >= TIMEOUT && took < TIMEOUT + Duration::from_secs(3), "{mode}: aborted after {took:?}");
    assert!(comm.is_aborted());

    let reports = watchdog.reports();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let report = &reports[0];
    print!("{report}");
    assert!(matches!(report.cause, Cause::Timeout { timeout: TIMEOUT, .. }), "{:?}", report.cause);
    let expected_abort = if mode == "parked" { AbortStatus::Aborted } else { AbortStatus::Requested };
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
