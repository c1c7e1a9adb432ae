//! A dead rank (issue 7, "Must show"): two processes, one killed with SIGKILL (a) after it joined
//! the communicator but before the first collective, and (b) after some collectives succeeded.
//! The survivor (nonblocking communicator, 3 s timeout) must get an `Err` within twice its
//! timeout, find its stream free again, and exit cleanly; 10 repetitions of each
//! (`GPUCOMM_DEAD_RANK_REPETITIONS` sets another number, for a GPU session short of time: each
//! repetition is a two-process job of 6–8 s).
//!
//! Each repetition starts this test binary twice through the launch crate's spawner: rank 1 is
//! the victim, which kills itself with SIGKILL at the chosen point; rank 0 is the survivor, which
//! ignores the SIGTERM the spawner sends the other ranks when one dies (it must show what a
//! survivor does, not be stopped by the launcher). The parent checks both exit statuses.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use gpucomm_launch::{spawn_local, Options, RankInfo, Rendezvous};
use gpucomm_tests::{device_count, skip};
use nccl::{Collectives, Comm, Config, Error, ReduceOp};

const TIMEOUT: Duration = Duration::from_secs(3);
/// Repetitions of each test, unless `GPUCOMM_DEAD_RANK_REPETITIONS` says otherwise.
const REPETITIONS: usize = 10;
/// Elements per all-reduce; rank r contributes r + 1.
const COUNT: usize = 1 << 16;
/// Set in the ranks a repetition starts: the number of collectives before the victim dies.
const WARM_UP_VAR: &str = "GPUCOMM_DEAD_RANK_WARM_UP";

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn peer_killed_before_the_first_collective() {
    repeat("peer_killed_before_the_first_collective", 0);
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn peer_killed_after_some_collectives() {
    repeat("peer_killed_after_some_collectives", 3);
}

/// The parent: `REPETITIONS` two-process jobs (or `GPUCOMM_DEAD_RANK_REPETITIONS`); the survivor
/// must exit 0, the victim by SIGKILL.
fn repeat(test: &str, warm_up: usize) {
    if let Ok(w) = std::env::var(WARM_UP_VAR) {
        return rank(w.parse().expect("a count"));
    }
    let have = device_count();
    if have < 2 {
        return skip(test, &format!("needs 2 GPUs, found {have}"));
    }
    let exe = std::env::current_exe().expect("the test binary");
    let args: Vec<OsString> =
        ["--exact", test, "--include-ignored", "--nocapture", "--test-threads=1"].map(Into::into).into();
    let env = [(WARM_UP_VAR.to_string(), warm_up.to_string())];
    let repetitions = match std::env::var("GPUCOMM_DEAD_RANK_REPETITIONS") {
        Ok(n) => n.parse().expect("GPUCOMM_DEAD_RANK_REPETITIONS: a number"),
        Err(_) => REPETITIONS,
    };
    for repetition in 0..repetitions {
        let outcome = spawn_local(2, &exe, &args, &env, Duration::from_secs(30)).expect("spawn the two ranks");
        let status =
            |r: usize| outcome.statuses.iter().find(|(rank, _)| *rank == r).map(|(_, s)| *s).expect("a status");
        assert!(status(0).success(), "repetition {repetition}: the survivor did not exit cleanly: {outcome:?}");
        assert_eq!(status(1).signal(), Some(libc::SIGKILL), "repetition {repetition}: the victim: {outcome:?}");
    }
}

/// One rank of a repetition.
fn rank(warm_up: usize) {
    let info = RankInfo::from_env().expect("launcher variables");
    let ctx = CudaContext::new(info.device_ordinal(device_count()).expect("a GPU")).expect("open the GPU");
    let stream = ctx.new_stream().expect("a stream");
    if info.rank == 0 {
        // SAFETY: ignoring a signal installs no handler code; the survivor must outlive the
        // SIGTERM the spawner sends when the victim dies, to show what it does about it.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    }
    let mut rendezvous = Rendezvous::connect(&info, &Options::from_env().expect("options")).expect("rendezvous");
    // Creation may take a while on a fresh process; the 3 s bound is for the collectives.
    let config = Config::new().blocking(false).timeout(Duration::from_secs(60));
    let comm = Comm::from_rendezvous_config(stream.clone(), &mut rendezvous, &config).expect("join");
    comm.set_timeout(Some(TIMEOUT));
    let mut buf = stream.clone_htod(&vec![(info.rank + 1) as f32; COUNT]).unwrap();
    for step in 0..warm_up {
        stream.memcpy_htod(&vec![(info.rank + 1) as f32; COUNT], &mut buf).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
        comm.wait(None).unwrap();
        let host = stream.clone_dtoh(&buf).unwrap();
        assert!(host.iter().all(|&v| v == 3.0), "rank {}, step {step}: wrong sum", info.rank);
    }
    rendezvous.barrier().expect("both ranks ready");
    if info.rank == 1 {
        // SAFETY: sends a signal to this process; nothing is done afterwards.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        unreachable!("SIGKILL ends the process");
    }
    let start = Instant::now();
    let outcome = comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).and_then(|()| comm.wait(None));
    let took = start.elapsed();
    let err = outcome.expect_err("an all-reduce with a dead peer succeeded");
    assert!(matches!(err, Error::Timeout { .. } | Error::Nccl { .. } | Error::Aborted), "{err:?}");
    assert!(took < 2 * TIMEOUT, "the error took {took:?}");
    // A timeout has aborted the communicator; after an NCCL error the survivor aborts it.
    comm.abort().expect("abort");
    let freed = Instant::now();
    stream.synchronize().expect("the stream is free again");
    println!("survivor: {err} after {took:?} (timeout {TIMEOUT:?}); stream free {:?} later", freed.elapsed());
}
