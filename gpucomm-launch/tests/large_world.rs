//! A rendezvous of more ranks than the store's default connection limit (1024): rank 0 hosts its
//! store with limits that fit the world size. In a test binary of its own, because rank 0 may
//! raise this process's file descriptor limit.

mod common;

use std::time::Instant;

use common::*;
use gpucomm_launch::store::Limits;
use gpucomm_launch::Options;

const WORLD: usize = 1025;

/// Raises this process's soft file descriptor limit to `n` where it is lower: the test holds both
/// ends of every rank's connection, and rank 0 makes room only for the store's ends.
fn allow_descriptors(n: libc::rlim_t) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) writes one `rlimit`, and `limit` is a live local of that type.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    assert!(limit.rlim_max >= n, "this test needs {n} file descriptors; the hard limit is {}", limit.rlim_max);
    if limit.rlim_cur < n {
        limit.rlim_cur = n;
        // SAFETY: setrlimit(2) reads one `rlimit`, and `limit` is a live local of that type.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    }
}

#[test]
fn a_job_of_1025_ranks_joins_broadcasts_and_meets_at_a_barrier() {
    // Before: rank 0's store took at most 1024 connections (the default `max_connections`), the
    // 1025th rank was turned away until the join timed out.
    allow_descriptors(2 * WORLD as libc::rlim_t + 256);
    let port = free_port();
    // Every loopback client comes from 127.0.0.1: one address for the whole job. (9 to 18 s in a
    // debug build on 2 cores, 3.5 s optimized; the rendezvous's timeout bounds it.)
    let opts = Options { store_limits: Limits { max_per_peer: WORLD + 16, ..Limits::default() }, ..options(60.0) };
    let started = Instant::now();
    let ranks: Vec<_> = (0..WORLD)
        .map(|rank| {
            spawn(info(rank, WORLD, port, "large-world"), opts.clone(), move |mut rv| {
                let id = rv.broadcast(make_id)?;
                rv.barrier()?;
                Ok((rv.rank(), rv.world_size(), id, rv.store_stats()))
            })
        })
        .collect();
    let results: Vec<_> = ranks.into_iter().map(|r| r.join().unwrap().unwrap()).collect();
    let elapsed = started.elapsed();
    println!("{WORLD} ranks joined, broadcast and met at a barrier in {elapsed:?}");
    let id = &results[0].2;
    assert_eq!(id.len(), 128);
    for (rank, result) in results.iter().enumerate() {
        assert_eq!((result.0, result.1, &result.2), (rank, WORLD, id));
    }
    let stats = results[0].3.as_ref().expect("rank 0 hosts the store");
    // (Some connections were turned away at first, over the limit of connections without
    // VALIDATE, and came again.)
    assert_eq!((stats.evicted, stats.dropped, stats.accept_errors.len()), (0, 0, 0), "{stats:?}");
    assert!(results[1..].iter().all(|r| r.3.is_none()));
}
