//! The rendezvous against stores that behave as PyTorch's do, where a test needs the store to
//! do what this crate's server does not (see [`StoreServer::bind_like_libuv`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::*;
use crate::env::{JobIdentity, Master};
use crate::store::{Limits, StoreClient, StoreServer};

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
fn until(mut cond: impl FnMut() -> bool) {
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

/// A store (the port it listens on and a client of it) for the job `token` with [`KEY`], whose
/// keys and seal it gives too.
fn job_store(token: &str) -> (StoreServer, u16, StoreClient, plan::Keys, seal::Seal) {
    let server = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port = server.local_addr().port();
    let client = StoreClient::connect("127.0.0.1", port, 5 * SECOND).unwrap();
    let (keys, seal) = job(token);
    (server, port, client, keys, seal)
}

/// Rank 0's mark that it opened a generation, with the values `own` and `previous`, as a rank 0
/// with [`KEY`] writes it under `label`.
fn opened_mark(seal: &seal::Seal, label: &str, own: [u8; 16], previous: [u8; 16]) -> Vec<u8> {
    let mut mark = [b"gpucomm generation opened".as_slice(), &own, &previous].concat();
    mark.extend_from_slice(&seal.tag(label, &mark.clone()));
    mark
}

/// Rank `rank` of 2 of the torchrun job `token`, whose agent store listens on `port`.
fn torchrun_worker(rank: usize, port: u16, token: &str) -> RankInfo {
    let mut info = rank_of_two(rank, port, token);
    info.torchelastic = Some(crate::env::Torchelastic {
        run_id: "ended".into(),
        restart_count: 1,
        use_agent_store: true,
        group_rank: Some(0),
        role_rank: Some(rank),
    });
    info
}

fn torchrun_options() -> Options {
    Options { job_key: Some(JobKey::new(KEY.to_vec()).unwrap()), instance: Some(0), ..Options::default() }
        .with_timeout(5 * SECOND)
}

/// A process of this host that runs (`sleep`, killed when dropped), or one that ran and ended.
struct Other {
    child: Option<std::process::Child>,
    pid: u32,
    started: u64,
}

impl Other {
    fn running() -> Other {
        let child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let pid = child.id();
        let process::Found::Started(started) = process::look_up(pid) else { panic!("no start time for {pid}") };
        Other { pid, started, child: Some(child) }
    }

    fn ended() -> Other {
        let mut other = Other::running();
        if let Some(mut child) = other.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        assert_eq!(process::look_up(other.pid), process::Found::Nothing);
        other
    }

    /// A claim of `rank` of 2 that this process made with `seal` under `label` for `start`.
    fn claim(&self, rank: u32, start: [u8; 16], seal: &seal::Seal, label: &str) -> Vec<u8> {
        let me = process::Claimant::this_process(None);
        let id = process::Identity { started: self.started, ..me.id.clone() };
        let who = process::Claimant { pid: self.pid, addr: "127.0.0.1:1".into(), id, ..me };
        let mut claim = record::Claim { rank, world_size: 2, who, nonce: [rank as u8; 16], start, tag: None };
        claim.encode(Some(seal), label)
    }
}

impl Drop for Other {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

const KEY: &[u8] = b"a job key for the claims of other processes";

/// The keys and seal of the job `token` with [`KEY`], as its ranks make them.
fn job(token: &str) -> (plan::Keys, seal::Seal) {
    let scope = plan::Scope::new(Some((token, "GPUCOMM_JOB_TOKEN")));
    (plan::Keys::new(&scope.hash, 0), seal::Seal::new(&JobKey::new(KEY.to_vec()).unwrap(), &scope.hash))
}

fn keyed_external() -> Options {
    Options {
        store: StoreMode::External,
        job_key: Some(JobKey::new(KEY.to_vec()).unwrap()),
        instance: Some(0),
        ..Options::default().with_timeout(5 * SECOND)
    }
}

#[test]
fn a_claim_of_a_process_that_runs_is_a_duplicate_and_one_of_an_ended_process_is_replaced() {
    // With a job key, in a store that outlives runs: rank 1's key holds a claim of the start in
    // place by another process of this host. While that process runs it is a second rank 1 (a
    // duplicate, told at once); once it ended (a run killed while it joined), the claim is
    // replaced and the job joins. A review of session 24's first version found a live process of
    // another PID namespace taken for gone: the claim's identity now names the namespace, the boot
    // and the start time.
    for running in [true, false] {
        let token = format!("other-process-{running}");
        let (_server, port, mut c, keys, seal) = job_store(&token);
        let other = if running { Other::running() } else { Other::ended() };
        c.set(&keys.start(), &[5; 16]).unwrap();
        c.set(&keys.claim(1), &other.claim(1, [5; 16], &seal, &keys.claim(1))).unwrap();
        let started = Instant::now();
        let (info, opts) = (rank_of_two(1, port, &token), keyed_external());
        let rank1 = thread::spawn(move || Rendezvous::connect(&info, &opts)?.broadcast(|| Err("unused".into())));
        if running {
            let error = rank1.join().unwrap().unwrap_err();
            assert!(matches!(error, RendezvousError::Duplicate { rank: 1, .. }), "{error}");
            assert!(error.to_string().contains(&format!("first by pid {} on ", other.pid)), "{error}");
            assert!(started.elapsed() < 2 * SECOND, "{:?}", started.elapsed());
            continue;
        }
        thread::sleep(Duration::from_millis(300));
        let mut rank0 = Rendezvous::connect(&rank_of_two(0, port, &token), &keyed_external()).unwrap();
        assert_eq!(rank0.broadcast(|| Ok(b"the id".to_vec())).unwrap(), b"the id");
        assert_eq!(rank1.join().unwrap().unwrap(), b"the id");
    }
}

#[test]
fn under_torchrun_a_rank_skips_a_generation_that_holds_an_ended_processs_claim() {
    // Generation 1 of a torchrun job with a job key holds rank 0's and rank 1's claims of its
    // start, by processes that ended (killed while they joined). Attempt 1's rank 1 comes first:
    // it waits for generation 2, which its rank 0 opens, leaving generation 1 as it was.
    let token = "ended-processes-generation";
    let (_server, port, mut c, base, seal) = job_store(token);
    let g1 = base.generation(1);
    let (rank0, rank1) = (Other::ended(), Other::ended());
    assert_eq!(c.add(&base.generations(), 1).unwrap(), 1);
    c.set(&g1.opened(), &opened_mark(&seal, &g1.opened(), [1; 16], [0; 16])).unwrap();
    c.set(&g1.start(), &[5; 16]).unwrap();
    c.set(&g1.claim(0), &rank0.claim(0, [5; 16], &seal, &g1.claim(0))).unwrap();
    let left = rank1.claim(1, [5; 16], &seal, &g1.claim(1));
    c.set(&g1.claim(1), &left).unwrap();
    let (worker, opts) = (|rank| torchrun_worker(rank, port, token), torchrun_options());
    let (info, o) = (worker(1), opts.clone());
    let started = Instant::now();
    let joiner = thread::spawn(move || Rendezvous::connect(&info, &o)?.broadcast(|| Err("unused".into())));
    thread::sleep(Duration::from_millis(300));
    let mut first = Rendezvous::connect(&worker(0), &opts).unwrap();
    assert_eq!(first.broadcast(|| Ok(b"the id".to_vec())).unwrap(), b"the id");
    assert_eq!(joiner.join().unwrap().unwrap(), b"the id");
    assert!(started.elapsed() < 3 * SECOND, "{:?}", started.elapsed());
    assert!(c.check(&[&base.generation(2).complete()]).unwrap());
    assert_eq!(c.get(&g1.claim(1)).unwrap(), left, "generation 1 was joined");
}

#[test]
fn under_torchrun_a_mark_copied_from_an_earlier_store_moves_no_rank_on() {
    // A torchrun job with a job key: rank 0 opens generation 1 and waits for rank 1. Someone who
    // read the agent store of an earlier run with the same job key and run id writes that run's
    // mark of generation 2 (which names that run's generation 1). Before, it verified (its MAC
    // covered only its key's name): rank 0 took its generation for left by a later start and
    // failed with `Superseded`, and rank 1 went round from generation 1 to itself until its
    // timeout. Now both ignore it and the job completes in generation 1.
    let token = "copied-mark";
    let (_server, port, mut c, base, seal) = job_store(token);
    let (g1, g2) = (base.generation(1), base.generation(2));
    let (info, opts) = (torchrun_worker(0, port, token), torchrun_options());
    let first = thread::spawn(move || Rendezvous::connect(&info, &opts)?.broadcast(|| Ok(b"the id".to_vec())));
    until(|| c.check(&[&g1.claim(0)]).unwrap());
    let mark = c.get(&g1.opened()).unwrap();
    let copied = opened_mark(&seal, &g2.opened(), [7; 16], [6; 16]);
    assert_ne!(&mark[25..41], &[6; 16]);
    c.set(&g2.opened(), &copied).unwrap();
    thread::sleep(Duration::from_millis(600));
    assert!(!first.is_finished(), "{:?}", first.join().unwrap());
    let mut second = Rendezvous::connect(&torchrun_worker(1, port, token), &torchrun_options()).unwrap();
    assert_eq!(second.broadcast(|| Err("unused".into())).unwrap(), b"the id");
    assert_eq!(first.join().unwrap().unwrap(), b"the id");
    assert!(c.check(&[&g1.complete()]).unwrap());
    assert_eq!(c.add(&base.generations(), 0).unwrap(), 1);
}

#[test]
fn under_torchrun_the_next_generations_mark_names_the_previous_ones_value() {
    // The mark that makes the ranks of generation 1 move on: rank 0 of the next start names
    // generation 1's value in generation 2's mark, and rank 1, waiting in generation 1, follows.
    let token = "next-mark";
    let (_server, port, mut c, base, seal) = job_store(token);
    let (g1, g2) = (base.generation(1), base.generation(2));
    assert_eq!(c.add(&base.generations(), 1).unwrap(), 1);
    c.set(&g1.opened(), &opened_mark(&seal, &g1.opened(), [1; 16], [0; 16])).unwrap();
    let (info, opts) = (torchrun_worker(1, port, token), torchrun_options());
    let joiner = thread::spawn(move || Rendezvous::connect(&info, &opts)?.broadcast(|| Err("unused".into())));
    thread::sleep(Duration::from_millis(300));
    let mut rank0 = Rendezvous::connect(&torchrun_worker(0, port, token), &torchrun_options()).unwrap();
    assert_eq!(rank0.broadcast(|| Ok(b"the id".to_vec())).unwrap(), b"the id");
    assert_eq!(joiner.join().unwrap().unwrap(), b"the id");
    assert!(c.check(&[&g2.complete()]).unwrap());
    assert_eq!(&c.get(&g2.opened()).unwrap()[25 + 16..25 + 32], &[1; 16]);
}

#[test]
fn under_torchrun_rank_0_waits_briefly_for_the_previous_generations_mark() {
    // Generation 1 is counted, and its rank 0 writes its mark 200 ms after this start's rank 0
    // counted generation 2 (two rank 0 processes alive at once). Before (session 30's review),
    // rank 0 of generation 2 found no mark and named zeros, so that generation 1's ranks would
    // never have moved on; now it waits up to a second for the mark and names its value.
    let token = "late-previous-mark";
    let (_server, port, mut c, base, seal) = job_store(token);
    let (g1, g2) = (base.generation(1), base.generation(2));
    assert_eq!(c.add(&base.generations(), 1).unwrap(), 1);
    let (info, opts) = (torchrun_worker(0, port, token), torchrun_options());
    let rank0 = thread::spawn(move || Rendezvous::connect(&info, &opts)?.broadcast(|| Ok(b"the id".to_vec())));
    until(|| c.add(&base.generations(), 0).unwrap() == 2);
    thread::sleep(Duration::from_millis(200));
    c.set(&g1.opened(), &opened_mark(&seal, &g1.opened(), [3; 16], [0; 16])).unwrap();
    let mut rank1 = Rendezvous::connect(&torchrun_worker(1, port, token), &torchrun_options()).unwrap();
    assert_eq!(rank1.broadcast(|| Err("unused".into())).unwrap(), b"the id");
    assert_eq!(rank0.join().unwrap().unwrap(), b"the id");
    assert_eq!(
        &c.get(&g2.opened()).unwrap()[25 + 16..25 + 32],
        &[3; 16],
        "generation 2's mark names generation 1's value"
    );
}
