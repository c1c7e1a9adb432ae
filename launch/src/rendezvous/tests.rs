//! The rendezvous against stores that behave as PyTorch's do, where a test needs the store to
//! do what this crate's server does not (see [`StoreServer::bind_like_libuv`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::*;
use crate::env::{JobIdentity, Master};
use crate::store::{StoreClient, StoreServer};

const SECOND: Duration = Duration::from_secs(1);

/// Rank `rank` of 2, meeting at the store on `port` under the identity `token`.
fn rank_of_two(rank: usize, port: u16, token: &str) -> RankInfo {
    let mut info = RankInfo::single();
    (info.rank, info.world_size, info.local_rank, info.local_world_size) = (rank, 2, rank, 2);
    info.master = Some(Master { addr: "127.0.0.1".into(), port });
    info.job_identity = Some(JobIdentity { value: token.into(), source: "GPUCOMM_JOB_TOKEN" });
    info
}

/// Waits (at most 10 s) until `cond` holds.
fn until(cond: impl Fn() -> bool) {
    let deadline = Instant::now() + 10 * SECOND;
    while !cond() {
        assert!(Instant::now() < deadline, "condition not met within 10 s");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_wait_ended_by_a_compare_set_of_a_missing_key_waits_again() {
    // PyTorch's libuv store (torchrun's agent store) ends the WAITs for a key when a COMPARE_SET
    // with a non-empty expected value names it, though the key does not exist. Before: rank 1,
    // waiting for rank 0's claim, read the missing key as an empty value, took it for a forged
    // claim and aborted the job. A stranger sends such COMPARE_SETs for every key rank 1 waits
    // for, all along; the job completes.
    for key in [None, Some(JobKey::new(b"0123456789abcdef0123".to_vec()).unwrap())] {
        let server = StoreServer::bind_like_libuv("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = server.local_addr().port();
        let token = format!("libuv-wakes-{}", key.is_some());
        let options = Options {
            store: StoreMode::External,
            job_key: key,
            instance: Some(0),
            ..Options::default().with_timeout(10 * SECOND)
        };
        let scope = plan::Scope::new(Some((&token, "GPUCOMM_JOB_TOKEN")));
        let keys = plan::Keys::new(&scope.hash, 0);
        let targets = [keys.start(), keys.claim(0), keys.complete(), keys.value(0)];
        let stop = Arc::new(AtomicBool::new(false));
        let stranger = {
            let stop = stop.clone();
            let mut c = StoreClient::connect("127.0.0.1", port, 5 * SECOND).unwrap();
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    for target in &targets {
                        // Stores nothing: the key is missing, or holds something else than `x`.
                        assert_ne!(c.compare_set(target, b"x", b"y").unwrap(), b"y");
                    }
                    thread::sleep(Duration::from_millis(1));
                }
            })
        };
        let (info, opts) = (rank_of_two(1, port, &token), options.clone());
        let rank1 = thread::spawn(move || Rendezvous::connect(&info, &opts)?.broadcast(|| Err("unused".into())));
        // Rank 0 comes once rank 1's waits were ended early a few times (or rank 1 gave up).
        until(|| server.false_wakes() >= 3 || rank1.is_finished());
        let mut rank0 = Rendezvous::connect(&rank_of_two(0, port, &token), &options).unwrap();
        assert_eq!(rank0.broadcast(|| Ok(b"the id".to_vec())).unwrap(), b"the id");
        assert_eq!(rank1.join().unwrap().unwrap(), b"the id");
        stop.store(true, Ordering::SeqCst);
        stranger.join().unwrap();
        assert!(server.false_wakes() >= 3);
    }
}
