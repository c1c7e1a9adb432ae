//! The communicator lifecycle of the safe `nccl` crate on real GPUs: configs, nonblocking
//! creation, several unique ids, split, shrink, revoke, waiting, timeouts and abort handles, and
//! the exact error for each kind of bad input (after which things still work).
//!
//! Most tests run one rank per GPU on every GPU of the machine (N ≥ 2), each rank on its own
//! thread, as one process per GPU would.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;
use gpucomm_tests::{device_count, require_gpus, skip};
use nccl::{AbortStatus, Collectives, Comm, Config, Error, PendingComm, ReduceOp, ResultCode, UniqueId, Version};

/// Long enough never to fire on a healthy machine; short enough to end a broken test.
const GENEROUS: Duration = Duration::from_secs(60);

/// One stream per GPU, all GPUs (at least 2), or `None` after skipping.
fn all_gpus(test: &str) -> Option<Vec<Arc<CudaStream>>> {
    require_gpus(test, device_count().max(2))
}

/// Runs `body(rank, stream)` on one thread per stream and returns the results in rank order.
fn per_rank<T: Send>(streams: &[Arc<CudaStream>], body: impl Fn(usize, Arc<CudaStream>) -> T + Sync) -> Vec<T> {
    thread::scope(|s| {
        let body = &body;
        let handles: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(rank, stream)| {
                let stream = stream.clone();
                s.spawn(move || {
                    stream.context().bind_to_thread().expect("bind the rank's device");
                    body(rank, stream)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    })
}

/// A communicator of every stream's rank, created with `config` on each rank's thread.
fn world(streams: &[Arc<CudaStream>], config: &Config) -> Vec<Comm> {
    let id = UniqueId::new().unwrap();
    per_rank(streams, |rank, stream| Comm::init_rank_config(stream, &id, rank, streams.len(), config).unwrap())
}

/// True when the loaded NCCL is at least `needed`; otherwise skips `test`. (The suites cannot
/// use the crate's header cfgs: they build against the pinned headers, and what can run depends
/// on the library loaded on the GPU machine.)
fn loaded_at_least(test: &str, needed: Version) -> bool {
    let loaded = nccl::version().unwrap();
    if loaded < needed {
        skip(test, &format!("needs NCCL ≥ {needed}, loaded {loaded}"));
    }
    loaded >= needed
}

/// Sum over `ranks` of (rank + 1).
fn sum_of(ranks: impl Iterator<Item = usize>) -> i64 {
    ranks.map(|r| r as i64 + 1).sum()
}

/// An all-reduce of `value` (4096 elements) on `comm`'s stream, waited for through the
/// communicator; returns what every element became.
fn all_reduce_value(comm: &Comm, value: i64) -> i64 {
    let stream = comm.stream();
    let mut buf = stream.clone_htod(&vec![value; 4096]).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
    comm.wait(Some(GENEROUS)).unwrap();
    let host = stream.clone_dtoh(&buf).unwrap();
    assert!(host.iter().all(|&v| v == host[0]), "rank {}: elements differ", comm.rank());
    host[0]
}

/// Runs `body` on one thread per communicator (its device bound) and returns the results in
/// the same order.
fn each<T: Send>(comms: Vec<Comm>, body: impl Fn(Comm) -> T + Sync) -> Vec<T> {
    thread::scope(|s| {
        let body = &body;
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    comm.context().bind_to_thread().expect("bind the rank's device");
                    body(comm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    })
}

/// Finalizes communicators on one thread per communicator (finalize is collective).
fn finalize_all(comms: Vec<Comm>) {
    each(comms, |comm| comm.finalize().map_err(|(_, e)| e).unwrap());
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn nonblocking_creation_is_in_progress_until_every_rank_joined() {
    let Some(streams) = all_gpus("nonblocking_creation_is_in_progress_until_every_rank_joined") else { return };
    let n = streams.len();
    let config = Config::new().blocking(false).timeout(GENEROUS);
    let id = UniqueId::new().unwrap();
    // One thread starts every rank: possible only because nonblocking creation returns at once.
    let mut pending = Vec::new();
    for (rank, stream) in streams.iter().enumerate() {
        let p = PendingComm::init_rank(stream.clone(), &id, rank, n, &config).unwrap();
        if rank + 1 < n {
            assert!(!p.is_ready().unwrap(), "rank {rank} is ready although rank {} has not joined", n - 1);
        }
        pending.push(p);
    }
    let comms: Vec<Comm> = pending.into_iter().map(|p| p.wait(None).unwrap()).collect();
    for (rank, comm) in comms.iter().enumerate() {
        assert_eq!((comm.rank(), comm.size(), comm.device()), (rank, n, rank));
        assert!(comm.is_nonblocking() && comm.timeout() == Some(GENEROUS));
    }
    // Collectives on nonblocking communicators: NCCL answers "in progress" while it connects the
    // ranks (first call); every rank must see the full sum.
    let (sums, comms): (Vec<_>, Vec<_>) =
        each(comms, |comm| ([all_reduce_value(&comm, comm.rank() as i64 + 1), all_reduce_value(&comm, 10)], comm))
            .into_iter()
            .unzip();
    assert!(sums.iter().all(|s| *s == [sum_of(0..n), 10 * n as i64]), "{sums:?}");
    // Finalizing is collective too: one thread starts every rank's, then waits for all.
    let finalizing: Vec<_> = comms.into_iter().map(|c| c.start_finalize().map_err(|(_, e)| e).unwrap()).collect();
    for f in finalizing {
        f.wait(Some(GENEROUS)).map_err(|(_, e)| e).unwrap();
    }
}

#[test]
#[ignore = "needs 1 GPU: run by the GPU bundle"]
fn the_net_name_field_is_honoured() {
    let Some(streams) = require_gpus("the_net_name_field_is_honoured", 1) else { return };
    for blocking in [true, false] {
        // A network NCCL does not have: creation fails, blocking or not.
        let bogus = Config::new().blocking(blocking).net_name("no-such-network").timeout(GENEROUS);
        let id = UniqueId::new().unwrap();
        match Comm::init_rank_config(streams[0].clone(), &id, 0, 1, &bogus) {
            Err(Error::Nccl { call: "ncclCommInitRankConfig", code, .. }) if code != ResultCode::SUCCESS => {}
            other => panic!("blocking={blocking}: expected NCCL to refuse the network, got {other:?}"),
        }
        // The same config with a network NCCL always has works.
        let socket = Config::new().blocking(blocking).net_name("Socket").timeout(GENEROUS);
        let comm = Comm::init_rank_config(streams[0].clone(), &UniqueId::new().unwrap(), 0, 1, &socket).unwrap();
        assert_eq!(all_reduce_value(&comm, 5), 5);
        comm.finalize().map_err(|(_, e)| e).unwrap();
    }
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn init_rank_scalable_with_two_ids() {
    let test = "init_rank_scalable_with_two_ids";
    let Some(streams) = all_gpus(test).filter(|_| loaded_at_least(test, Version::new(2, 23, 4))) else { return };
    let n = streams.len();
    let ids = [UniqueId::new().unwrap(), UniqueId::new().unwrap()];
    let comms = per_rank(&streams, |rank, stream| {
        let comm = Comm::init_rank_scalable(stream, &ids, rank, n, &Config::new()).unwrap();
        assert_eq!((comm.rank(), comm.size()), (rank, n));
        assert_eq!(all_reduce_value(&comm, rank as i64 + 1), sum_of(0..n));
        comm
    });
    finalize_all(comms);
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn split_into_uneven_colours_and_no_colour() {
    let Some(streams) = all_gpus("split_into_uneven_colours_and_no_colour") else { return };
    let n = streams.len();
    for blocking in [true, false] {
        let comms = world(&streams, &Config::new().blocking(blocking).timeout(GENEROUS));
        let comms = each(comms, |world| {
            let r = world.rank();
            // Uneven: rank 0 alone, every other rank together, on a stream of its own.
            let side = world.context().new_stream().unwrap();
            let color = if r == 0 { 0 } else { 1 };
            let lone = world.split(Some(color), r as i32, None, Some(side.clone())).unwrap().unwrap();
            assert!(Arc::ptr_eq(lone.stream(), &side), "the child uses the stream it was given");
            assert_eq!(lone.is_nonblocking(), !blocking, "the child inherits the blocking mode");
            let (size, rank, sum) = if r == 0 { (1, 0, 1) } else { (n - 1, r - 1, sum_of(1..n)) };
            assert_eq!((lone.size(), lone.rank()), (size, rank), "world rank {r}");
            assert_eq!(all_reduce_value(&lone, r as i64 + 1), sum, "world rank {r}");
            // No colour for the last rank; the others in reverse order (by key).
            let color = (r != n - 1).then_some(7);
            let config = Config::new().blocking(blocking);
            let rest = world.split(color, -(r as i32), Some(&config), None).unwrap();
            match rest {
                None => assert_eq!(r, n - 1, "only the rank without colour gets no communicator"),
                Some(rest) => {
                    assert_eq!((rest.size(), rest.rank()), (n - 1, n - 2 - r), "world rank {r}");
                    assert_eq!(all_reduce_value(&rest, r as i64 + 1), sum_of(0..n - 1));
                    rest.finalize().map_err(|(_, e)| e).unwrap();
                }
            }
            lone.finalize().map_err(|(_, e)| e).unwrap();
            // The parent still works after its splits.
            assert_eq!(all_reduce_value(&world, 1), n as i64);
            world
        });
        finalize_all(comms);
    }
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn shrink_excluding_the_last_rank() {
    use nccl::ShrinkFlags;
    let test = "shrink_excluding_the_last_rank";
    let Some(streams) = all_gpus(test).filter(|_| loaded_at_least(test, Version::new(2, 27, 3))) else { return };
    let n = streams.len();
    for flags in [ShrinkFlags::DEFAULT, ShrinkFlags::ABORT] {
        let comms = world(&streams, &Config::new());
        let parents = each(comms, |parent| {
            let r = parent.rank();
            assert_eq!(all_reduce_value(&parent, 1), n as i64);
            if r == n - 1 {
                return parent; // excluded: does not call shrink
            }
            // Refused before NCCL sees them; the real shrink below still works.
            let refused = [
                parent.shrink(&[r], flags, None, None).unwrap_err(),
                parent.shrink(&[n], flags, None, None).unwrap_err(),
                parent.shrink(&[n - 1, n - 1], flags, None, None).unwrap_err(),
                parent.shrink(&[], flags, None, None).unwrap_err(),
            ];
            assert!(matches!(refused[0], Error::ShrinkExcludesSelf { rank } if rank == r), "{refused:?}");
            assert!(matches!(refused[1], Error::InvalidRank { what: "excluded rank", .. }), "{refused:?}");
            assert!(matches!(refused[2], Error::DuplicateRank { rank } if rank == n - 1), "{refused:?}");
            assert!(matches!(refused[3], Error::InvalidCount { got: 0, .. }), "{refused:?}");
            let child = parent.shrink(&[n - 1], flags, None, None).unwrap();
            assert_eq!((child.size(), child.rank()), (n - 1, r));
            assert_eq!(all_reduce_value(&child, r as i64 + 1), sum_of(0..n - 1));
            child.finalize().map_err(|(_, e)| e).unwrap();
            parent
        });
        if flags == ShrinkFlags::ABORT {
            // The parent's work was aborted by the shrink: abort the parents, as after a failure.
            each(parents, |p| p.abort().unwrap());
        } else {
            finalize_all(parents);
        }
    }
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn revoke_stops_collectives_but_not_split() {
    let test = "revoke_stops_collectives_but_not_split";
    let Some(streams) = all_gpus(test).filter(|_| loaded_at_least(test, Version::new(2, 28, 7))) else { return };
    let n = streams.len();
    let comms = world(&streams, &Config::new());
    let children = each(comms, |comm| {
        assert_eq!(all_reduce_value(&comm, 1), n as i64);
        comm.revoke().unwrap();
        let mut buf = comm.stream().clone_htod(&[1i64; 16]).unwrap();
        match comm.all_reduce_in_place(&mut buf, ReduceOp::SUM) {
            Err(Error::Nccl { call: "ncclAllReduce", code: ResultCode::INVALID_USAGE, .. }) => {}
            other => panic!("a collective on a revoked communicator: {other:?}"),
        }
        // Split still works on a revoked communicator, and teardown only destroys.
        let child = comm.split(Some(0), comm.rank() as i32, None, None).unwrap().unwrap();
        comm.finalize().map_err(|(_, e)| e).unwrap();
        assert_eq!(all_reduce_value(&child, child.rank() as i64 + 1), sum_of(0..n));
        child
    });
    finalize_all(children);
}

/// Two ranks in one process; rank 0 runs `hang` after a warm-up, while rank 1 never joins the
/// collective that `hang` starts, then aborts its own communicator once rank 0 is done.
fn lonely_collective(test: &str, config: Config, hang: impl Fn(Comm) + Sync) {
    let Some(streams) = require_gpus(test, 2) else { return };
    let comms = world(&streams, &config);
    let done = Barrier::new(2);
    each(comms, |comm| {
        assert_eq!(all_reduce_value(&comm, 1), 2, "warm-up");
        if comm.rank() == 0 {
            hang(comm);
            done.wait();
        } else {
            done.wait();
            comm.abort().unwrap();
        }
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn a_timeout_turns_a_missing_peer_into_an_error() {
    let timeout = Duration::from_secs(2);
    let config = Config::new().blocking(false);
    lonely_collective("a_timeout_turns_a_missing_peer_into_an_error", config, |comm| {
        comm.set_timeout(Some(timeout));
        let mut buf = comm.stream().clone_htod(&[1.0f32; 1024]).unwrap();
        let start = Instant::now();
        comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
        let err = comm.wait(None).unwrap_err();
        let took = start.elapsed();
        assert!(matches!(err, Error::Timeout { what: "ncclAllReduce", after } if after == timeout), "{err:?}");
        assert!(took >= timeout && took < 2 * timeout, "took {took:?}");
        assert!(comm.is_aborted() && comm.as_raw().is_null());
        // Every later call says so, finalize too; the stream is free again.
        assert!(matches!(comm.all_reduce_in_place(&mut buf, ReduceOp::SUM), Err(Error::Aborted)));
        assert!(matches!(comm.async_error(), Err(Error::Aborted)));
        assert!(matches!(comm.wait(None), Err(Error::Aborted)));
        comm.stream().synchronize().unwrap();
        match comm.finalize() {
            Err((comm, Error::Aborted)) => comm.abort().unwrap(),
            other => panic!("finalize after an abort: {:?}", other.err().map(|(_, e)| e)),
        }
        println!("a missing peer became {err} after {took:?}");
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn an_abort_handle_ends_a_hung_wait_from_another_thread() {
    let config = Config::new().blocking(false);
    lonely_collective("an_abort_handle_ends_a_hung_wait_from_another_thread", config, |comm| {
        let handle = comm.abort_handle().unwrap();
        let mut buf = comm.stream().clone_htod(&[1.0f32; 1024]).unwrap();
        comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
        let start = Instant::now();
        let watchdog = thread::spawn(move || {
            thread::sleep(Duration::from_secs(1));
            handle.abort().unwrap()
        });
        // No timeout: only the handle can end this wait.
        let err = comm.wait(None).unwrap_err();
        let took = start.elapsed();
        let status = watchdog.join().unwrap();
        assert!(matches!(err, Error::Aborted), "{err:?}");
        assert!(matches!(status, AbortStatus::Aborted | AbortStatus::Requested), "{status:?}");
        assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(20), "took {took:?}");
        assert!(comm.is_aborted());
        comm.stream().synchronize().unwrap();
        println!("the abort handle ended the wait after {took:?} ({status:?})");
    });
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn bad_input_is_refused_and_things_still_work() {
    let Some(streams) = require_gpus("bad_input_is_refused_and_things_still_work", 2) else { return };
    let s0 = streams[0].clone();
    // After each refusal, a one-rank communicator on the same GPU still works.
    let still_works = || {
        let comm = Comm::init_rank(s0.clone(), &UniqueId::new().unwrap(), 0, 1).unwrap();
        assert_eq!(all_reduce_value(&comm, 5), 5);
        comm.finalize().map_err(|(_, e)| e).unwrap();
    };
    let id = UniqueId::new().unwrap();

    let err = Comm::init_rank(s0.clone(), &id, 2, 2).unwrap_err();
    assert!(matches!(err, Error::InvalidRank { what: "rank", rank: 2, size: 2 }), "{err:?}");
    still_works();
    let err = Comm::init_rank_config(s0.clone(), &id, 0, 0, &Config::new()).unwrap_err();
    assert!(matches!(err, Error::InvalidCount { what: "nranks", got: 0, .. }), "{err:?}");
    still_works();
    let err = Comm::init_all(&[s0.clone(), s0.clone()]).unwrap_err();
    assert!(matches!(err, Error::DuplicateDevice { device: 0 }), "{err:?}");
    still_works();
    let err = Comm::init_rank_scalable(s0.clone(), &[], 0, 1, &Config::new()).unwrap_err();
    assert!(matches!(err, Error::InvalidCount { what: "the number of unique ids", got: 0, .. }), "{err:?}");
    let three = [id, UniqueId::new().unwrap(), UniqueId::new().unwrap()];
    let err = Comm::init_rank_scalable(s0.clone(), &three, 0, 2, &Config::new()).unwrap_err();
    assert!(matches!(err, Error::InvalidCount { max: 2, got: 3, .. }), "{err:?}");
    still_works();
    let err = UniqueId::from_bytes(&[7u8; 100]).unwrap_err();
    assert!(matches!(err, Error::UniqueIdLength { expected: 128, got: 100 }), "{err:?}");

    // Config values: refused here (too large for C, a NUL inside), or by NCCL (min > max).
    let err = Comm::init_rank_config(s0.clone(), &id, 0, 1, &Config::new().max_ctas(u32::MAX)).unwrap_err();
    assert!(matches!(err, Error::TooLarge { what: "maxCTAs", .. }), "{err:?}");
    let err = Comm::init_rank_config(s0.clone(), &id, 0, 1, &Config::new().net_name("a\0b")).unwrap_err();
    assert!(matches!(err, Error::NulInString { field: "netName" }), "{err:?}");
    let crossed = Config::new().min_ctas(8).max_ctas(4);
    match Comm::init_rank_config(s0.clone(), &UniqueId::new().unwrap(), 0, 1, &crossed) {
        Err(Error::Nccl { call: "ncclCommInitRankConfig", code: ResultCode::INVALID_ARGUMENT, .. }) => {}
        other => panic!("expected NCCL to refuse minCTAs > maxCTAs, got {other:?}"),
    }
    still_works();

    // Split arguments, on a one-rank communicator that keeps working.
    let comm = Comm::init_rank(s0.clone(), &UniqueId::new().unwrap(), 0, 1).unwrap();
    let err = comm.split(Some(u32::MAX), 0, None, None).unwrap_err();
    assert!(matches!(err, Error::TooLarge { what: "color", .. }), "{err:?}");
    let err = comm.split(Some(0), 0, None, Some(streams[1].clone())).unwrap_err();
    assert!(matches!(err, Error::WrongDevice { what: "the child's stream", expected: 0, got: 1 }), "{err:?}");
    assert!(matches!(comm.abort_handle(), Err(Error::NeedsNonblocking)));
    let child = comm.split(Some(0), 0, None, None).unwrap().unwrap();
    assert_eq!(all_reduce_value(&child, 3), 3);
    assert_eq!(all_reduce_value(&comm, 4), 4);
    child.finalize().map_err(|(_, e)| e).unwrap();
    comm.finalize().map_err(|(_, e)| e).unwrap();
}
