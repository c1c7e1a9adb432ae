//! Teardown behind a dead peer (audit findings 1 and 2): two processes, one GPU each. Both ranks
//! make one all-reduce; then rank 1 leaves at once, as a crashed peer does (no teardown; exit
//! status 0, so that the spawner leaves rank 0 running), and rank 0 enqueues a second all-reduce,
//! whose kernel waits for rank 1 for ever while NCCL keeps reporting success. What rank 0 tears
//! down next must end by its watchdog or its timeout:
//!
//! * a registration of the second all-reduce's buffer, dropped under a watchdog (nonblocking
//!   communicator, no timeout of its own). Before: the drop waited in `cuEventSynchronize`
//!   without parking the communicator, so the watchdog could only request an abort that nobody
//!   carried out, and the drop never returned. Now it waits parked: the watchdog aborts at once
//!   and the drop returns.
//! * the same with the communicator's own 5 s timeout (blocking communicator). Before: the drop
//!   gave up after the timeout with `StillInUse`, leaking the buffer and leaving the communicator
//!   alive with its kernel stuck. Now the overdue all-reduce aborts the communicator, which
//!   releases the registration.
//! * the communicator itself, with a 5 s timeout (blocking): dropped, or finalized. Before: the
//!   blocking `ncclCommFinalize` waited for the stuck kernel inside NCCL (`commDestroySync`) for
//!   ever. Now the outstanding work is waited for within the timeout first, which aborts it.
//!
//! The buffer is registered on both ranks before the first all-reduce (registration is a
//! contract of every rank, and NCCL may exchange what it needs of a registered buffer with the
//! peers at its first use), so the second all-reduce needs nothing from the dead peer on the
//! host. Two GPUs (NCCL's P2P transport), not two processes on one GPU: over sockets NCCL's proxy
//! would see the closed connection and report an error, which ends the waits another way.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream};
use gpucomm_launch::{Options, RankInfo, Rendezvous};
use gpucomm_tests::multi_process;
use nccl::watchdog::{CallState, Cause};
use nccl::{AbortStatus, Collectives, Comm, Config, Error, ReduceOp, Registration, Watchdog};

/// The communicators' timeout, and the watchdog's.
const TIMEOUT: Duration = Duration::from_secs(5);
/// What the teardown may take beyond [`TIMEOUT`]: the abort, and the watchdog's poll.
const MARGIN: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(50);
/// Elements per all-reduce; rank r contributes r + 1.
const COUNT: usize = 1 << 16;

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn a_registration_dropped_behind_a_dead_peer_returns_by_the_watchdog() {
    multi_process("a_registration_dropped_behind_a_dead_peer_returns_by_the_watchdog", 2, |info, device| {
        // Creation may take a while on a fresh process: bounded by 60 s; then no timeout of its own.
        let config = Config::new().blocking(false).timeout(Duration::from_secs(60));
        let (stream, mut rendezvous, comm) = join(&info, &device, &config);
        comm.set_timeout(None);
        let watchdog = Watchdog::start(POLL).expect("the watchdog thread");
        watchdog.watch(&comm, TIMEOUT).expect("watch a nonblocking communicator");
        let mut reg = registered_and_reduced(&info, &stream, &comm);
        rank_1_leaves(&info, &mut rendezvous);

        let start = Instant::now();
        comm.all_reduce_in_place(&mut reg.buffer_mut(), ReduceOp::SUM).expect("the all-reduce is enqueued");
        drop(reg);
        let took = start.elapsed();
        assert!(took >= TIMEOUT && took < TIMEOUT + MARGIN, "the drop returned after {took:?}");
        assert!(comm.is_aborted());
        assert!(matches!(comm.async_error(), Err(Error::Aborted)));

        let reports = watchdog.reports();
        assert_eq!(reports.len(), 1, "{reports:?}");
        let report = &reports[0];
        assert!(matches!(report.cause, Cause::Timeout { timeout: TIMEOUT, .. }), "{:?}", report.cause);
        // The drop waited parked: the watchdog aborted at once, not by request.
        assert_eq!(report.abort, Ok(AbortStatus::Aborted));
        let hung = report.hung.as_ref().expect("the hung call is in the recorder");
        assert_eq!((hung.seq, hung.call, hung.count, hung.dtype), (1, "ncclAllReduce", COUNT, "f32"));
        assert_eq!(hung.state, CallState::Enqueued);
        drains(&stream);
        println!("the registration's drop returned after {took:?}, the watchdog having aborted");
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn a_registration_dropped_behind_a_dead_peer_returns_by_the_timeout() {
    multi_process("a_registration_dropped_behind_a_dead_peer_returns_by_the_timeout", 2, |info, device| {
        let (stream, mut rendezvous, comm) = join(&info, &device, &Config::new().timeout(TIMEOUT));
        let mut reg = registered_and_reduced(&info, &stream, &comm);
        rank_1_leaves(&info, &mut rendezvous);

        let start = Instant::now();
        comm.all_reduce_in_place(&mut reg.buffer_mut(), ReduceOp::SUM).expect("the all-reduce is enqueued");
        drop(reg);
        let took = start.elapsed();
        assert!(took >= TIMEOUT && took < TIMEOUT + MARGIN, "the drop returned after {took:?}");
        assert!(comm.is_aborted(), "the overdue all-reduce aborted the communicator");
        assert!(matches!(comm.async_error(), Err(Error::Aborted)));
        drains(&stream);
        println!("the registration's drop returned after {took:?}, the timeout having aborted");
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn a_blocking_communicator_dropped_behind_a_dead_peer_returns_by_its_timeout() {
    multi_process("a_blocking_communicator_dropped_behind_a_dead_peer_returns_by_its_timeout", 2, |info, device| {
        let (stream, comm, _buf, start) = stuck_behind_a_dead_peer(&info, &device);
        drop(comm);
        let took = start.elapsed();
        assert!(took >= TIMEOUT && took < TIMEOUT + MARGIN, "the drop returned after {took:?}");
        drains(&stream);
        println!("the communicator's drop returned after {took:?}");
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn a_blocking_communicator_finalized_behind_a_dead_peer_times_out() {
    multi_process("a_blocking_communicator_finalized_behind_a_dead_peer_times_out", 2, |info, device| {
        let (stream, comm, _buf, start) = stuck_behind_a_dead_peer(&info, &device);
        let (comm, err) = comm.finalize().expect_err("finalized behind a dead peer");
        let took = start.elapsed();
        assert!(matches!(err, Error::Timeout { what: "ncclAllReduce", after: TIMEOUT }), "{err:?}");
        assert!(took >= TIMEOUT && took < TIMEOUT + MARGIN, "finalize returned after {took:?}");
        assert!(comm.is_aborted());
        drop(comm);
        drains(&stream);
        println!("finalize returned {err} after {took:?}");
    });
}

/// A rank's stream of its own, its rendezvous, and a communicator of both ranks with `config`.
fn join(info: &RankInfo, device: &Arc<CudaStream>, config: &Config) -> (Arc<CudaStream>, Rendezvous, Comm) {
    let stream = device.context().new_stream().expect("a stream");
    let mut rendezvous = Rendezvous::connect(info, &Options::from_env().expect("options")).expect("rendezvous");
    let comm = Comm::from_rendezvous_config(stream.clone(), &mut rendezvous, config).expect("join");
    (stream, rendezvous, comm)
}

/// Rank 0's side of the communicator tests: a blocking communicator with [`TIMEOUT`], one
/// all-reduce with the peer, the peer gone, and a second all-reduce of the buffer enqueued (its
/// kernel waits for rank 1 for ever); with the time it was enqueued at. Rank 1 does not return.
fn stuck_behind_a_dead_peer(
    info: &RankInfo,
    device: &Arc<CudaStream>,
) -> (Arc<CudaStream>, Comm, CudaSlice<f32>, Instant) {
    let (stream, mut rendezvous, comm) = join(info, device, &Config::new().timeout(TIMEOUT));
    let mut buf = reduced(info, &stream, &comm);
    rank_1_leaves(info, &mut rendezvous);
    let start = Instant::now();
    comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).expect("the all-reduce is enqueued");
    (stream, comm, buf, start)
}

/// This rank's contribution (rank + 1 in every element), all-reduced once with the peer: every
/// element is then 3.
fn reduced(info: &RankInfo, stream: &Arc<CudaStream>, comm: &Comm) -> CudaSlice<f32> {
    let mut buf = stream.clone_htod(&vec![(info.rank + 1) as f32; COUNT]).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).expect("the first all-reduce");
    comm.wait(None).expect("the first all-reduce finishes");
    assert_eq!(stream.clone_dtoh(&buf).unwrap(), vec![3.0f32; COUNT], "rank {}: the first sum", info.rank);
    buf
}

/// [`reduced`] through a registration of the buffer, made on both ranks before its first use.
fn registered_and_reduced<'c>(
    info: &RankInfo,
    stream: &Arc<CudaStream>,
    comm: &'c Comm,
) -> Registration<'c, f32, CudaSlice<f32>> {
    let buf = stream.clone_htod(&vec![(info.rank + 1) as f32; COUNT]).unwrap();
    let mut reg = comm.register(buf).map_err(|(_, e)| e).expect("register the buffer");
    comm.all_reduce_in_place(&mut reg.buffer_mut(), ReduceOp::SUM).expect("the first all-reduce");
    comm.wait(None).expect("the first all-reduce finishes");
    assert_eq!(stream.clone_dtoh(&*reg).unwrap(), vec![3.0f32; COUNT], "rank {}: the first sum", info.rank);
    reg
}

/// Once both ranks are past the first all-reduce, rank 1 ends its process at once; rank 0 goes on.
fn rank_1_leaves(info: &RankInfo, rendezvous: &mut Rendezvous) {
    rendezvous.barrier().expect("both ranks made the first all-reduce");
    if info.rank == 1 {
        // SAFETY: ends this process at once, running nothing more (no destructor, no exit
        // handler), as a crash would; the status is 0 so that the spawner leaves rank 0 running.
        unsafe { libc::_exit(0) };
    }
}

/// Checks that the stream drains (the abort stopped the hung kernel) within 10 s.
fn drains(stream: &Arc<CudaStream>) {
    let drained = stream.record_event(None).unwrap();
    let start = Instant::now();
    while !drained.try_is_complete().unwrap() {
        assert!(start.elapsed() < Duration::from_secs(10), "the all-reduce still runs after the abort");
        std::thread::sleep(POLL);
    }
}
