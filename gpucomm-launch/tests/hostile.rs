//! The rendezvous against hostile or mistaken peers (issue 14): one test per scenario, each
//! bounded in time. The memory and file-descriptor scenarios have test files of their own
//! (`memory_bound.rs`, `descriptor_exhaustion.rs`), since they measure the whole process.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use gpucomm_launch::store::{Limits, StoreServer};
use gpucomm_launch::{JobKey, Options, RankInfo, Rendezvous, RendezvousError, StoreMode};

const KEY: &str = "k3y-7f1e0c9a5b2d4e6f8a0b1c2d3e4f5a6b";

#[test]
fn hijack_with_a_key_gets_nothing_and_fails_every_rank_naming_both() {
    let port = free_port();
    let token = "hijack-keyed";
    let rank0 = spawn(info(0, 3, port, token), keyed(10.0, KEY), |mut rv| rv.broadcast(make_id));
    // The impostor knows the identity (it is no secret), hence the keys, but not the job key.
    let mut impostor = store_client(port);
    let p = prefix(token, 0);
    let forged = forged_claim(1, 3, "impostor", "6.6.6.6:666");
    assert_eq!(impostor.compare_set(&format!("{p}/rank/1"), b"", &forged).unwrap(), forged);
    let watcher = watch(port, format!("{p}/op0/value"));
    // The real rank 1 finds its rank taken; rank 2 joins as usual.
    let rank1 = spawn(info(1, 3, port, token), keyed(10.0, KEY), |mut rv| rv.broadcast(|| Err("unused".into())));
    thread::sleep(Duration::from_millis(200));
    let rank2 = spawn(info(2, 3, port, token), keyed(10.0, KEY), |mut rv| rv.broadcast(|| Err("unused".into())));
    let errors = [rank0.join().unwrap().unwrap_err(), rank2.join().unwrap().unwrap_err()];
    let rank1 = rank1.join().unwrap().unwrap_err();
    assert!(matches!(rank1, RendezvousError::Duplicate { rank: 1, .. }), "{rank1}");
    let rank1 = rank1.to_string();
    assert!(rank1.starts_with("rank 1 was claimed twice: first by pid 999 on impostor (6.6.6.6:666) (without a valid MAC of this job's key), then by this process, pid "), "{rank1}");
    assert!(rank1.contains("(127.0.0.1:"), "{rank1}");
    for error in &errors {
        let message = error.to_string();
        assert!(message.contains("pid 999 on impostor (6.6.6.6:666)"), "{message}");
        assert!(
            message.contains("not signed with this job's key")
                || message.contains("without a valid MAC of this job's key"),
            "{message}"
        );
    }
    // Nothing to read: rank 0 never broadcast (and would have sealed it).
    assert_eq!(watcher.join().unwrap(), None);
}

/// The impostor's second connection: what it can read of broadcast #0 while the store is up.
fn watch(port: u16, key: String) -> thread::JoinHandle<Option<Vec<u8>>> {
    let mut spy = store_client(port);
    thread::spawn(move || match spy.wait(&[&key], Duration::from_secs(5)) {
        Ok(true) => spy.get(&key).ok(),
        _ => None,
    })
}

#[test]
fn hijack_without_a_key_fails_every_rank_naming_both_addresses() {
    let port = free_port();
    let token = "hijack-plain";
    let rank0 = spawn(info(0, 3, port, token), options(10.0), |mut rv| rv.broadcast(make_id));
    let mut impostor = store_client(port);
    let p = prefix(token, 0);
    impostor.compare_set(&format!("{p}/rank/1"), b"", &forged_claim(1, 3, "impostor", "6.6.6.6:666")).unwrap();
    let watcher = watch(port, format!("{p}/op0/value"));
    let started = Instant::now();
    let rank1 = Rendezvous::connect(&info(1, 3, port, token), &options(10.0)).unwrap_err().to_string();
    assert!(
        rank1.starts_with(
            "rank 1 was claimed twice: first by pid 999 on impostor (6.6.6.6:666), then by this process, pid "
        ),
        "{rank1}"
    );
    // Rank 2 arrives after the duplicate: it and rank 0 fail too, naming both.
    let rank2 = Rendezvous::connect(&info(2, 3, port, token), &options(10.0)).unwrap_err().to_string();
    let rank0 = rank0.join().unwrap().unwrap_err().to_string();
    for message in [&rank0, &rank2] {
        assert!(message.starts_with("rendezvous aborted by rank 1 (pid "), "{message}");
        assert!(
            message.contains("rank 1 was claimed twice: first by pid 999 on impostor (6.6.6.6:666), then by pid "),
            "{message}"
        );
        assert!(message.contains("(127.0.0.1:"), "{message}");
    }
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(watcher.join().unwrap(), None, "the unique id never reached the impostor");
}

#[test]
fn key_and_token_are_never_sent_by_the_store_or_shown_in_errors() {
    const TOKEN: &str = "TOKEN-identity-that-must-stay-home";
    let server = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let proxy = Proxy::start(server.local_addr().port());
    let opts = |key: &str| external(5.0).with_job_key(JobKey::new(key.as_bytes().to_vec()).unwrap());
    let mut shown = Vec::new();
    // A job that works: join, broadcast, barriers.
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            spawn(info(rank, 3, proxy.port, TOKEN), opts(KEY), |mut rv| {
                let id = rv.broadcast(make_id)?;
                rv.barrier()?;
                rv.barrier()?;
                Ok(id)
            })
        })
        .collect();
    let ids: Vec<Vec<u8>> = ranks.into_iter().map(|r| r.join().unwrap().unwrap()).collect();
    assert!(ids.iter().all(|id| id == &ids[0]));
    // A late joiner, a rank with another key, and the rank 0 that checks it.
    let late = Rendezvous::connect(&info(1, 3, proxy.port, TOKEN), &opts(KEY).clone_instance(0)).unwrap_err();
    shown.push(format!("{late} {late:?}"));
    let token2 = format!("{TOKEN}-second");
    let wrong = spawn(info(1, 2, proxy.port, &token2), opts("another-key-of-enough-length"), Ok);
    let rank0 = Rendezvous::connect(&info(0, 2, proxy.port, &token2), &opts(KEY)).unwrap_err();
    let wrong = wrong.join().unwrap().unwrap_err();
    for error in [&rank0, &wrong] {
        shown.push(format!("{error} {error:?}"));
    }
    assert!(shown[1].contains("not signed with this job's key"), "{}", shown[1]);
    assert!(format!("{:?}", opts(KEY)).contains("JobKey(..)"));
    let sent = proxy.from_store.lock().unwrap().clone();
    assert!(sent.len() > 1000, "the proxy saw the store's replies ({} bytes)", sent.len());
    for secret in [KEY.as_bytes(), TOKEN.as_bytes(), b"another-key-of-enough-length"] {
        assert!(!sent.windows(secret.len()).any(|w| w == secret), "the store sent a secret");
        for text in &shown {
            assert!(!text.contains(std::str::from_utf8(secret).unwrap()), "an error shows a secret: {text}");
        }
    }
    // The broadcast value went through sealed: its plaintext never crossed the wire.
    assert!(!sent.windows(ids[0].len()).any(|w| w == ids[0].as_slice()));
}

/// `Options` pinned to one rendezvous of the job, as a second process would count it.
trait Instance {
    fn clone_instance(self, instance: u64) -> Options;
}

impl Instance for Options {
    fn clone_instance(mut self, instance: u64) -> Options {
        self.instance = Some(instance);
        self
    }
}

#[test]
fn pending_cap_closes_the_oldest_silent_connections_and_the_rendezvous_still_completes() {
    let port = free_port();
    let mut opts = options(15.0);
    // The idle connections have 10 s to send VALIDATE: only the cap closes them during the test.
    opts.store_limits = Limits { max_pending: 4, validate_within: 10 * SECOND, ..Limits::default() };
    let rank0 = spawn(info(0, 3, port, "pending-cap"), opts.clone(), |mut rv| {
        let id = rv.broadcast(make_id)?;
        rv.barrier()?;
        Ok((id, rv.store_stats().unwrap()))
    });
    // Idle connections that never validate (the first once rank 0 listens): each one past the
    // fourth closes the oldest, and so does each rank's connection.
    let first = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => break stream,
            Err(_) => thread::sleep(Duration::from_millis(10)),
        }
    };
    let mut idle = vec![first];
    idle.extend((1..12).map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap()));
    let started = Instant::now();
    let others: Vec<_> = (1..3)
        .map(|rank| {
            spawn(info(rank, 3, port, "pending-cap"), opts.clone(), |mut rv| {
                let id = rv.broadcast(|| Err("unused".into()))?;
                rv.barrier()?;
                Ok(id)
            })
        })
        .collect();
    let (id, stats) = rank0.join().unwrap().unwrap();
    for other in others {
        assert_eq!(other.join().unwrap().unwrap(), id);
    }
    // Long before the idle connections' 10 s were over.
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
    assert!(stats.displaced >= 8, "{stats:?}");
    assert_eq!(stats.turned_away, 0, "{stats:?}");
    let events = stats.events.join("\n");
    assert!(events.contains("the limit of connections without VALIDATE (4) was reached"), "{events}");
    drop(idle);
}

#[test]
fn trickle_fails_a_join_within_its_2s_deadline() {
    // A "store" that answers the connection's PING one byte every 1.5 s: a timeout of each read
    // (2 s) never fires, and the whole reply takes 6 s.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut hello = [0u8; 10];
        s.read_exact(&mut hello).unwrap();
        for byte in &hello[6..10] {
            thread::sleep(Duration::from_millis(1500));
            if s.write_all(&[*byte]).is_err() {
                return;
            }
        }
        thread::sleep(Duration::from_secs(5));
    });
    let started = Instant::now();
    let err = Rendezvous::connect(&info(1, 2, port, "trickle-join"), &options(2.0)).unwrap_err();
    let elapsed = started.elapsed();
    // Gave up at its deadline, not after the whole trickle (6 s).
    assert!(elapsed >= Duration::from_millis(1900) && elapsed < Duration::from_secs(4), "{elapsed:?}");
    let message = err.to_string();
    assert!(message.contains("within 2s"), "{message}");
    assert!(message.contains("PING"), "{message}");
}

#[test]
fn trickle_fails_a_barrier_within_its_2s_deadline() {
    let server = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let direct = server.local_addr().port();
    let proxy = Proxy::start(direct);
    let token = "trickle-barrier";
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    // Rank 0 talks to the store directly; rank 1 through the proxy, which starts to trickle.
    let rank0 = spawn(info(0, 2, direct, token), external(10.0), move |mut rv| {
        rv.barrier()?;
        rx.recv().unwrap();
        rv.barrier()
    });
    let mut rv = Rendezvous::connect(&info(1, 2, proxy.port, token), &external(2.0)).unwrap();
    rv.barrier().unwrap();
    proxy.trickle.store(true, Ordering::SeqCst);
    tx.send(()).unwrap();
    let started = Instant::now();
    let err = rv.barrier().unwrap_err();
    let elapsed = started.elapsed();
    // Gave up at its deadline, not after the whole trickle (1.5 s a byte).
    assert!(elapsed >= Duration::from_millis(1500) && elapsed < Duration::from_secs(4), "{elapsed:?}");
    let message = err.to_string();
    assert!(message.starts_with("during barrier #1 (store at 127.0.0.1:"), "{message}");
    assert!(message.contains("did not finish within 2s"), "{message}");
    // Rank 0 was not held up: rank 1's arrival reached the store.
    rank0.join().unwrap().unwrap();
}

#[test]
fn two_jobs_on_one_port_fail_clearly_and_do_not_mix() {
    let port = free_port();
    let job_a = spawn(info(0, 2, port, "job-A"), options(10.0), |mut rv| rv.broadcast(|| Ok(b"A's id".to_vec())));
    until(|| TcpStream::connect(("127.0.0.1", port)).is_ok());
    // Job B's rank 1 reaches job A's rank 0: refused at once, with what to do.
    let started = Instant::now();
    let err = Rendezvous::connect(&info(1, 2, port, "job-B"), &options(10.0)).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    let message = err.to_string();
    assert!(message.starts_with(&format!("the store at 127.0.0.1:{port} belongs to another job")), "{message}");
    assert!(message.contains("give each job its own port"), "{message}");
    assert!(!message.contains("job-A") && !message.contains("job-B"), "identities stay out of messages: {message}");
    // Job B's rank 0 cannot take the port; a rank of job A with another world size or a key is refused.
    let bind = Rendezvous::connect(&info(0, 2, port, "job-B"), &options(10.0)).unwrap_err();
    assert!(matches!(bind, RendezvousError::Bind { .. }), "{bind}");
    let world = Rendezvous::connect(&info(1, 3, port, "job-A"), &options(10.0)).unwrap_err().to_string();
    assert!(world.contains("serves a job of world size 2, and this process was started with world size 3"), "{world}");
    let key = Rendezvous::connect(&info(1, 2, port, "job-A"), &keyed(10.0, KEY)).unwrap_err().to_string();
    assert!(key.contains("serves a job without GPUCOMM_JOB_KEY, and this process has one"), "{key}");
    // Job A is unharmed.
    let mut rv = Rendezvous::connect(&info(1, 2, port, "job-A"), &options(10.0)).unwrap();
    assert_eq!(rv.broadcast(|| Err("unused".into())).unwrap(), b"A's id");
    assert_eq!(job_a.join().unwrap().unwrap(), b"A's id");
    // On a shared external store, jobs with different identities keep to their own keys.
    let shared = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port = shared.local_addr().port();
    let ranks: Vec<_> = ["job-C", "job-D"]
        .into_iter()
        .flat_map(|job| (0..2).map(move |rank| (job, rank)))
        .map(|(job, rank)| {
            spawn(info(rank, 2, port, job), external(10.0), move |mut rv| rv.broadcast(|| Ok(job.into())))
        })
        .collect();
    let got: Vec<Vec<u8>> = ranks.into_iter().map(|r| r.join().unwrap().unwrap()).collect();
    assert_eq!(got, [b"job-C", b"job-C", b"job-D", b"job-D"].map(|v| v.to_vec()));
}

#[test]
fn a_late_joiner_fails_at_once() {
    let port = free_port();
    let token = "late-joiner";
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rank0 = spawn(info(0, 2, port, token), options(10.0), move |mut rv| {
        rx.recv().unwrap();
        rv.barrier()
    });
    let mut rank1 = Rendezvous::connect(&info(1, 2, port, token), &options(10.0)).unwrap();
    // A second copy of rank 1 (its process's first rendezvous, as the first copy's was).
    let started = Instant::now();
    let opts = options(10.0).clone_instance(0);
    let err = Rendezvous::connect(&info(1, 2, port, token), &opts).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(matches!(err, RendezvousError::LateJoiner { rank: 1, .. }), "{err}");
    let message = err.to_string();
    let (held, rest) = message.split_once(". The keys").unwrap();
    let by = format!(
        "rendezvous already complete: every rank joined before this process, and rank 1 is held by pid {} on ",
        std::process::id()
    );
    assert!(held.starts_with(&by), "{message}");
    assert_eq!(
        rest,
        format!(
            " may be an earlier run's with the same job identity (from GPUCOMM_JOB_TOKEN) in the store at \
             127.0.0.1:{port}, which an earlier run's rank 0 serves until that run's slowest rank is done (another \
             MASTER_PORT for each run helps too). Give each run its own GPUCOMM_JOB_TOKEN, the same on all its \
             ranks (e.g. `export GPUCOMM_JOB_TOKEN=$(uuidgen)` before each launch, or one per program: \
             `GPUCOMM_JOB_TOKEN=a ./a && GPUCOMM_JOB_TOKEN=b ./b`). Otherwise this process is a second copy of rank \
             1: start each rank of a job once, and if the holder is not of this job, protect the job with \
             GPUCOMM_JOB_KEY"
        )
    );
    // The job goes on.
    tx.send(()).unwrap();
    rank1.barrier().unwrap();
    rank0.join().unwrap().unwrap();
}

#[test]
fn a_second_program_in_a_torchrun_worker_meets_in_a_generation_of_its_own() {
    // `torchrun ... bash -c './a && ./b'`: both programs read the same torchrun variables, so
    // they have the same job identity, and the agent's store keeps program a's keys while b runs.
    // Before: b failed with "rendezvous already complete" unless each program had its own
    // GPUCOMM_JOB_TOKEN. Each start of rank 0 now opens a generation of its own, and b's rank 1,
    // which comes first here, waits for it rather than taking a's for b's.
    let agent = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port = agent.local_addr().port();
    let run_id = format!("two-programs-{}", std::process::id());
    let worker = |rank: usize| torchrun_worker(rank, 2, port, &run_id, 0, None);
    // Each program is a process of its own in life: its first rendezvous is #0.
    let program = |name: &'static str| -> Vec<Vec<u8>> {
        let rank1 =
            spawn(worker(1), options(10.0).clone_instance(0), move |mut rv| rv.broadcast(|| Err("unused".into())));
        thread::sleep(Duration::from_millis(300));
        let rank0 = spawn(worker(0), options(10.0).clone_instance(0), move |mut rv| rv.broadcast(|| Ok(name.into())));
        [rank0, rank1].into_iter().map(|r| r.join().unwrap().unwrap()).collect()
    };
    assert_eq!(program("a"), [b"a", b"a"]);
    let started = Instant::now();
    assert_eq!(program("b"), [b"b", b"b"]);
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
    let mut c = store_client(port);
    let base = prefix(&format!("torchrun-{run_id}"), 0);
    for g in [1, 2] {
        assert!(c.check(&[&format!("{base}/g{g}/op0/value")]).unwrap(), "generation {g}'s value");
    }
}

#[test]
fn an_unresolvable_master_fails_at_once() {
    let mut client = info(1, 2, 1, "unresolvable");
    client.master.as_mut().unwrap().addr = "no-such-host.invalid".into();
    let started = Instant::now();
    let err = Rendezvous::connect(&client, &options(30.0)).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(matches!(err, RendezvousError::Resolve { .. }), "{err}");
    let message = err.to_string();
    assert!(message.starts_with("MASTER_ADDR \"no-such-host.invalid\" does not resolve"), "{message}");
}

#[test]
fn bad_timeouts_are_refused_naming_the_variable() {
    for bad in ["1e-12", "NaN", "-1", "0.0005", "1e300", "inf", "abc", "0", "604801"] {
        let message = Options::from_vars(|name| (name == "GPUCOMM_RENDEZVOUS_TIMEOUT").then(|| bad.into()))
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            format!(
                "invalid rendezvous options: GPUCOMM_RENDEZVOUS_TIMEOUT={bad} is not valid: expected a number of \
                 seconds from 0.001s to 604800s"
            )
        );
    }
    let opts = Options::from_vars(|name| (name == "GPUCOMM_RENDEZVOUS_TIMEOUT").then(|| "2.5".into())).unwrap();
    assert_eq!(opts.timeout, Duration::from_millis(2500));
    assert_eq!(Options::from_vars(|_| None).unwrap().timeout, Duration::from_secs(60));
    for bad in [Duration::from_nanos(1), Duration::ZERO, Duration::from_secs(30 * 24 * 3600)] {
        let message =
            Rendezvous::connect(&RankInfo::single(), &options(1.0).with_timeout(bad)).unwrap_err().to_string();
        assert!(message.starts_with("invalid rendezvous options: Options::timeout of"), "{message}");
        assert!(message.ends_with("is out of range: it must be from 0.001s to 604800s"), "{message}");
    }
    // The other variables are named too, and a short key is refused without being shown.
    let message =
        Options::from_vars(|name| (name == "GPUCOMM_JOB_KEY").then(|| "s3cr3t".into())).unwrap_err().to_string();
    assert_eq!(message, "invalid rendezvous options: GPUCOMM_JOB_KEY is 6 bytes long; use at least 16 random bytes, e.g. the output of `openssl rand -hex 32`");
    let message =
        Options::from_vars(|name| (name == "GPUCOMM_STORE").then(|| "nowhere".into())).unwrap_err().to_string();
    assert_eq!(
        message,
        "invalid rendezvous options: GPUCOMM_STORE=nowhere is not valid: expected auto, rank0 or external"
    );
}

#[test]
fn torchrun_agent_store_restart_never_reads_the_previous_attempts_id() {
    agent_store_restart(None, [1, 1]);
}

#[test]
fn torchrun_agent_store_restart_with_a_job_token_never_reads_the_previous_attempts_id() {
    // Before, the restart count told attempts apart (with or without a token): every restarted
    // attempt failed while attempt 0's completion and claims were still in the store.
    agent_store_restart(Some("token-of-the-job"), [1, 1]);
}

#[test]
fn torchrun_agent_store_restart_with_restart_counts_that_differ_between_nodes_joins() {
    // torchrun counts the restarts that a node's own workers caused (pytorch/pytorch#108158):
    // after a failure on rank 0's node only, its agent restarts its worker with count 1 while
    // the other node's agent restarts rank 1 with count 0. Before, the count was part of the job
    // identity, so the two ranks waited under different keys until their timeout.
    agent_store_restart(None, [1, 0]);
}

/// Attempt 0 and then attempt 1 of a two-rank torchrun job under its agent's store (with
/// `GPUCOMM_JOB_TOKEN=token` when given; attempt 1's ranks with the restart counts `counts`):
/// attempt 1 joins and reads its own id, never attempt 0's.
fn agent_store_restart(token: Option<&str>, counts: [u32; 2]) {
    // A StoreServer plays the agent's store; the ranks read the variables torchrun sets.
    let agent = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port = agent.local_addr().port();
    let run_id = format!("agent-test-{}-{}{}", std::process::id(), counts[0], counts[1]);
    let worker = |rank: usize, restart: u32| torchrun_worker(rank, 2, port, &run_id, restart, token);
    // Each attempt is a process of its own in life: its first rendezvous is #0.
    let opts = || options(10.0).clone_instance(0);
    // Attempt 0 completes.
    let attempt0: Vec<_> = (0..2)
        .map(|rank| {
            spawn(worker(rank, 0), opts(), move |mut rv| {
                assert!(rv.store_stats().is_none(), "under the agent store, rank 0 is a client too");
                rv.broadcast(|| Ok(b"id of attempt 0".to_vec()))
            })
        })
        .collect();
    for rank in attempt0 {
        assert_eq!(rank.join().unwrap().unwrap(), b"id of attempt 0");
    }
    // Attempt 1: rank 1 comes first and must wait for attempt 1's id, though attempt 0's is there.
    let rank1 = spawn(worker(1, counts[1]), opts(), |mut rv| rv.broadcast(|| Err("unused".into())));
    thread::sleep(Duration::from_millis(300));
    let mut rank0 = Rendezvous::connect(&worker(0, counts[0]), &opts()).unwrap();
    rank0.broadcast(|| Ok(b"id of attempt 1".to_vec())).unwrap();
    assert_eq!(rank1.join().unwrap().unwrap(), b"id of attempt 1");
    let mut c = store_client(agent.local_addr().port());
    let name = token.map_or(format!("torchrun-{run_id}"), str::to_string);
    let old = format!("{}/g1/op0/value", prefix(&name, 0));
    assert!(c.check(&[&old]).unwrap(), "attempt 0's id is still in the store; it was not read");
}

#[test]
fn a_restarted_rank_does_not_join_a_generation_that_holds_its_killed_processs_claim() {
    // Attempt 0 of a three-rank torchrun job with a job key: ranks 0 and 1 claimed in generation
    // 1, rank 2 never came, and torchrun killed them (no abort notice). Before: attempt 1's rank
    // 1, first to come, joined generation 1 (neither complete nor given up), met its killed
    // process's claim there and failed as a duplicate, and ranks 0 and 2 waited in generation 2
    // until their timeout. A rank now waits for the next generation when the newest holds its
    // rank's claim with the key's MAC by another process that runs no more, and replaces one of
    // an earlier attempt of its own process (here the killed ranks are threads of this process
    // whose sessions ended), then moves on with the others when rank 0 opens the next
    // generation. Without a job key such a claim cannot be told from a stranger's, and is met as
    // a duplicate, as before.
    let token = "killed-mid-join";
    let run_id = format!("{token}-{}", std::process::id());
    let opts = |seconds: f64| keyed(seconds, KEY).clone_instance(0);
    let base = prefix(token, 0);
    let left: Vec<String> = ["opened", "start", "rank/0", "rank/1"].iter().map(|k| format!("{base}/g1/{k}")).collect();
    let attempt_0 = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port = attempt_0.local_addr().port();
    let killed: Vec<_> = (0..2)
        .map(|rank| {
            spawn(torchrun_worker(rank, 3, port, &run_id, 0, Some(token)), opts(1.0), |mut rv| {
                rv.broadcast(|| Ok(b"attempt 0".to_vec()))
            })
        })
        .collect();
    let mut old = store_client(port);
    until(|| store_client(port).check(&[&left[2], &left[3]]).unwrap());
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port = store.local_addr().port();
    let mut new = store_client(port);
    assert_eq!(new.add(&format!("{base}/generations"), 1).unwrap(), 1);
    for key in &left {
        if old.check(&[key]).unwrap() {
            new.set(key, &old.get(key).unwrap()).unwrap();
        }
    }
    for process in killed {
        assert!(process.join().unwrap().is_err());
    }
    let started = Instant::now();
    let worker = |rank: usize| torchrun_worker(rank, 3, port, &run_id, 1, Some(token));
    let rank1 = spawn(worker(1), opts(10.0), |mut rv| rv.broadcast(|| Err("unused".into())));
    thread::sleep(Duration::from_millis(300));
    let rank2 = spawn(worker(2), opts(10.0), |mut rv| rv.broadcast(|| Err("unused".into())));
    let rank0 = spawn(worker(0), opts(10.0), |mut rv| rv.broadcast(|| Ok(b"attempt 1".to_vec())));
    for (rank, result) in [rank0, rank1, rank2].into_iter().enumerate() {
        let result = result.join().unwrap().map_err(|e| e.to_string());
        assert_eq!(result.as_deref(), Ok(&b"attempt 1"[..]), "rank {rank}");
    }
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(new.check(&[&format!("{base}/g2/complete")]).unwrap(), "the join completed in generation 2");
}

#[test]
fn a_rank_replaces_its_killed_processs_claim_in_a_store_that_outlives_runs() {
    // The same in a store of the user's (`GPUCOMM_STORE=external`) with a job key: the killed
    // run left its start's value and the claims of ranks 0 and 1. Before: the next run's rank 1,
    // first to come, read that value, met its killed process's claim of the same start and
    // failed as a duplicate, and ranks 0 and 2 waited until their timeout. A claim with the key's
    // MAC by a process that runs no more, or by an earlier attempt of this process (here threads
    // whose sessions ended), is now replaced; rank 1 then follows rank 0's claim to the new start.
    let token = "killed-mid-join-external";
    let opts = |seconds: f64| Options { instance: Some(0), ..keyed(seconds, KEY).with_store(StoreMode::External) };
    let p = prefix(token, 0);
    let left: Vec<String> = ["start", "rank/0", "rank/1"].iter().map(|k| format!("{p}/{k}")).collect();
    let killed_run = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port = killed_run.local_addr().port();
    let killed: Vec<_> = (0..2)
        .map(|rank| spawn(info(rank, 3, port, token), opts(1.0), |mut rv| rv.broadcast(|| Ok(b"killed".to_vec()))))
        .collect();
    until(|| store_client(port).check(&[&left[1], &left[2]]).unwrap());
    let mut old = store_client(port);
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port = store.local_addr().port();
    let mut new = store_client(port);
    for key in &left {
        new.set(key, &old.get(key).unwrap()).unwrap();
    }
    for process in killed {
        assert!(process.join().unwrap().is_err());
    }
    let started = Instant::now();
    let rank1 = spawn(info(1, 3, port, token), opts(10.0), |mut rv| rv.broadcast(|| Err("unused".into())));
    thread::sleep(Duration::from_millis(300));
    let rank2 = spawn(info(2, 3, port, token), opts(10.0), |mut rv| rv.broadcast(|| Err("unused".into())));
    let rank0 = spawn(info(0, 3, port, token), opts(10.0), |mut rv| rv.broadcast(|| Ok(b"next run".to_vec())));
    for (rank, result) in [rank0, rank1, rank2].into_iter().enumerate() {
        let result = result.join().unwrap().map_err(|e| e.to_string());
        assert_eq!(result.as_deref(), Ok(&b"next run"[..]), "rank {rank}");
    }
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn a_strangers_claim_in_an_open_generation_is_a_duplicate_under_torchrun() {
    // Without a job key, a claim of a rank written by a stranger into the generation rank 0
    // opened fails every rank as a duplicate when the real rank comes, and the stranger gets
    // nothing. A review of session 24's first version of the generation skip found that the real
    // rank then waited for the next generation instead, and rank 0 completed the join with the
    // stranger as rank 1.
    let agent = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port = agent.local_addr().port();
    let run_id = format!("stranger-in-generation-{}", std::process::id());
    let worker = |rank: usize| torchrun_worker(rank, 3, port, &run_id, 0, None);
    let opts = || options(10.0).clone_instance(0);
    let g1 = format!("{}/g1", prefix(&format!("torchrun-{run_id}"), 0));
    let started = Instant::now();
    let rank0 = spawn(worker(0), opts(), |mut rv| rv.broadcast(|| Ok(b"the id".to_vec())));
    let mut stranger = store_client(port);
    until(|| store_client(port).check(&[&format!("{g1}/rank/0")]).unwrap());
    stranger.set(&format!("{g1}/rank/1"), &forged_claim(1, 3, "impostor", "6.6.6.6:666")).unwrap();
    let rank1 = Rendezvous::connect(&worker(1), &opts()).unwrap_err();
    assert!(matches!(rank1, RendezvousError::Duplicate { rank: 1, .. }), "{rank1}");
    assert!(rank1.to_string().contains("first by pid 999 on impostor (6.6.6.6:666)"), "{rank1}");
    let rank0 = rank0.join().unwrap().unwrap_err().to_string();
    assert!(rank0.contains("rank 1 was claimed twice"), "{rank0}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(!stranger.check(&[&format!("{g1}/op0/value")]).unwrap(), "rank 0 broadcast the id");
}

#[test]
fn a_restart_moves_on_from_a_generation_that_died_before_it_completed() {
    // Attempt 0's rank 0 opened generation 1 and claimed its rank, then was killed (no abort
    // notice) before rank 1 came. Attempt 1's rank 1 comes first, finds generation 1 neither
    // complete nor given up, and joins it; attempt 1's rank 0 then opens generation 2, and rank 1
    // moves there. A generation given up with an abort notice is skipped at once.
    let agent = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port = agent.local_addr().port();
    let run_id = format!("died-{}", std::process::id());
    let worker = |rank: usize| torchrun_worker(rank, 2, port, &run_id, 0, None);
    let opts = || options(10.0).clone_instance(0);
    let base = prefix(&format!("torchrun-{run_id}"), 0);
    let mut c = store_client(port);
    // What attempt 0's rank 0 left: generation 1 opened, its claim in.
    assert_eq!(c.add(&format!("{base}/generations"), 1).unwrap(), 1);
    c.set(&format!("{base}/g1/opened"), b"gpucomm generation opened").unwrap();
    c.set(&format!("{base}/g1/rank/0"), &forged_claim(0, 2, "dead-host", "127.0.0.1:1")).unwrap();
    let rank1 = spawn(worker(1), opts(), |mut rv| rv.broadcast(|| Err("unused".into())));
    until(|| store_client(port).check(&[&format!("{base}/g1/rank/1")]).unwrap());
    let started = Instant::now();
    let mut rank0 = Rendezvous::connect(&worker(0), &opts()).unwrap();
    rank0.broadcast(|| Ok(b"id of attempt 1".to_vec())).unwrap();
    assert_eq!(rank1.join().unwrap().unwrap(), b"id of attempt 1");
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
    assert!(c.check(&[&format!("{base}/g2/complete")]).unwrap(), "the join completed in generation 2");
    drop(rank0);
    // A generation given up with an abort notice: rank 1 of the next start does not join it.
    assert_eq!(c.add(&format!("{base}/generations"), 1).unwrap(), 3);
    c.set(&format!("{base}/g3/opened"), b"gpucomm generation opened").unwrap();
    c.set(&format!("{base}/g3/abort"), b"rank 0 (dead-host): timed out").unwrap();
    let rank1 = spawn(worker(1), opts(), |mut rv| rv.broadcast(|| Err("unused".into())));
    thread::sleep(Duration::from_millis(300));
    let mut rank0 = Rendezvous::connect(&worker(0), &opts()).unwrap();
    rank0.broadcast(|| Ok(b"id of attempt 2".to_vec())).unwrap();
    assert_eq!(rank1.join().unwrap().unwrap(), b"id of attempt 2");
}

#[test]
fn values_replayed_from_an_earlier_run_with_the_same_key_and_identity_are_refused() {
    // Two runs with the same job key and identity (a key kept in a file, a fixed
    // GPUCOMM_JOB_TOKEN, torchrun's default run id): whoever reads run A's store keeps rank 0's
    // start value and claim, the join's release (and rank 0's welcome of rank 1) and broadcast
    // #0's value, and writes them into run B's store once run B's rank 1 has claimed its rank,
    // before run B's rank 0 comes. Before, rank 1 took them for run B's and returned run A's id. Rank 0's
    // release now names the run, and welcomes each rank's claim by its random nonce in that run;
    // the values after it are bound to the run.
    let token = "replayed-run";
    // Each run is a new process in life; here both are threads of one, so the instance (which
    // counts a process's rendezvous of one job) is set: 0 for both runs.
    let keyed_external = || Options { instance: Some(0), ..keyed(10.0, KEY).with_store(StoreMode::External) };
    let run_a = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port_a = run_a.local_addr().port();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            spawn(info(rank, 2, port_a, token), keyed_external(), |mut rv| rv.broadcast(|| Ok(b"id of run A".to_vec())))
        })
        .collect();
    for rank in ranks {
        assert_eq!(rank.join().unwrap().unwrap(), b"id of run A");
    }
    let p = prefix(token, 0);
    let mut spy = store_client(port_a);
    let kept: Vec<(String, Vec<u8>)> = ["start", "rank/0", "welcome/1", "complete", "op0/value"]
        .iter()
        .map(|name| {
            let key = format!("{p}/{name}");
            let value = spy.get(&key).unwrap();
            (key, value)
        })
        .collect();

    let run_b = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port_b = run_b.local_addr().port();
    // Rank 1 claims its rank once it has read the start's random value: run A's, written first.
    let attacker = Mutex::new(store_client(port_b));
    let (start, rest) = kept.split_first().unwrap();
    attacker.lock().unwrap().set(&start.0, &start.1).unwrap();
    let rank1 = spawn(info(1, 2, port_b, token), keyed_external(), |mut rv| rv.broadcast(|| Err("unused".into())));
    let claimed = format!("{p}/rank/1");
    until(|| attacker.lock().unwrap().check(&[&claimed]).unwrap());
    for (key, value) in rest {
        attacker.lock().unwrap().set(key, value).unwrap();
    }
    let error = rank1.join().unwrap().unwrap_err();
    assert!(matches!(error, RendezvousError::Forged { .. }), "{error}");
    assert!(error.to_string().contains("does not list this rank's claim"), "{error}");
}

#[test]
fn acknowledgements_written_without_the_key_do_not_end_rank_0s_linger() {
    // Rank 0 keeps its store up after its last operation until every rank has acknowledged
    // that operation. The acknowledgements were one counter that anyone reaching the port could
    // raise: rank 0 then closed its store while rank 1 still had to read the broadcast value.
    // Each rank now acknowledges under a key of its own, with a MAC.
    let port = free_port();
    let token = "forged-acknowledgements";
    let p = prefix(token, 0);
    let (broadcast_done, broadcast_seen) = std::sync::mpsc::channel();
    let (forged_done, forged_seen) = std::sync::mpsc::channel();
    let rank0 = spawn(info(0, 2, port, token), keyed(10.0, KEY), move |mut rv| {
        let id = rv.broadcast(|| Ok(b"the id".to_vec()))?;
        broadcast_done.send(()).unwrap();
        forged_seen.recv().unwrap();
        Ok(id)
    });
    let rank1 = spawn(info(1, 2, port, token), keyed(10.0, KEY), |mut rv| {
        thread::sleep(Duration::from_millis(1500));
        rv.broadcast(|| Err("unused".into()))
    });
    broadcast_seen.recv().unwrap();
    let mut attacker = store_client(port);
    attacker.add(&format!("{p}/done"), 1000).unwrap();
    let count = 1000u64.to_le_bytes();
    for forged in [count.to_vec(), [count.as_slice(), &[0; 32]].concat()] {
        attacker.set(&format!("{p}/done/1"), &forged).unwrap();
    }
    drop(attacker);
    let started = Instant::now();
    forged_done.send(()).unwrap();
    assert_eq!(rank0.join().unwrap().unwrap(), b"the id");
    assert_eq!(rank1.join().unwrap().unwrap(), b"the id");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn a_claim_replayed_from_an_earlier_run_is_ignored_and_the_real_rank_joins() {
    // Before: a claim's MAC covered its key and contents only. Whoever read rank 1's claim in run
    // A's store (the same job key and identity) wrote it into run B's store, and run B's rank 0
    // completed the join with a rank 1 that did not exist; the real rank 1 then came too late.
    // Each start of rank 0 now publishes a random value that every claim's MAC covers: a claim
    // of another start counts as not there yet, and the rank it names replaces it.
    replayed_claim(StoreMode::Rank0);
    replayed_claim(StoreMode::Auto);
}

/// Two runs of a two-rank job with the same key and identity, each with a store of its own
/// (`Rank0`: rank 0 hosts each run's; `Auto`: torchrun's agent's, a fresh one for each run, where
/// the generations count from 1 again).
struct TwoRuns {
    agent: bool,
    token: String,
    run_id: String,
}

impl TwoRuns {
    fn new(mode: StoreMode, name: &str) -> TwoRuns {
        let agent = mode == StoreMode::Auto;
        let token = format!("{name}-{}", if agent { "agent" } else { "hosted" });
        TwoRuns { agent, run_id: format!("{token}-{}", std::process::id()), token }
    }

    /// A run's store (torchrun's agent's, or none: rank 0's own on a free port) and its port.
    fn serve(&self) -> (Option<StoreServer>, u16) {
        let store = self.agent.then(|| StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap());
        let port = store.as_ref().map_or_else(free_port, |s| s.local_addr().port());
        (store, port)
    }

    fn rank(&self, rank: usize, port: u16) -> RankInfo {
        match self.agent {
            true => torchrun_worker(rank, 2, port, &self.run_id, 0, Some(&self.token)),
            false => info(rank, 2, port, &self.token),
        }
    }

    /// Each run is a process of its own in life: its first rendezvous is #0.
    fn opts() -> Options {
        keyed(10.0, KEY).clone_instance(0)
    }

    /// The prefix of the join's keys (generation 1's under the agent's store).
    fn prefix(&self) -> String {
        let p = prefix(&self.token, 0);
        if self.agent {
            format!("{p}/g1")
        } else {
            p
        }
    }
}

/// Run A, then run B of a two-rank job with the same key and identity (`Rank0`: rank 0 hosts
/// each run's store; `Auto`: under a torchrun agent's store, a fresh one for run B, where the
/// generations count from 1 again), with run A's claim of rank 1 written into run B's store
/// while run B's rank 0 waits for rank 1.
fn replayed_claim(mode: StoreMode) {
    let runs = TwoRuns::new(mode, "replayed-claim");
    let (rank, opts, p) = (|rank, port| runs.rank(rank, port), TwoRuns::opts, runs.prefix());
    let claim = format!("{p}/rank/1");

    let (store_a, port_a) = runs.serve();
    let (read, kept) = std::sync::mpsc::channel::<()>();
    let rank0 = spawn(rank(0, port_a), opts(), move |mut rv| {
        let id = rv.broadcast(|| Ok(b"id of run A".to_vec()))?;
        kept.recv().unwrap();
        Ok(id)
    });
    let rank1 = spawn(rank(1, port_a), opts(), |mut rv| rv.broadcast(|| Err("unused".into())));
    assert_eq!(rank1.join().unwrap().unwrap(), b"id of run A");
    let replayed = store_client(port_a).get(&claim).unwrap();
    assert!(replayed.starts_with(b"gpcm2C"), "rank 1's claim in run A");
    read.send(()).unwrap();
    assert_eq!(rank0.join().unwrap().unwrap(), b"id of run A");
    drop(store_a);

    let (_store_b, port_b) = runs.serve();
    let rank0 = spawn(rank(0, port_b), opts(), |mut rv| rv.broadcast(|| Ok(b"id of run B".to_vec())));
    let attacker = Mutex::new(store_client(port_b));
    let first = format!("{p}/rank/0");
    until(|| attacker.lock().unwrap().check(&[&first]).unwrap());
    let mut attacker = attacker.into_inner().unwrap();
    attacker.set(&claim, &replayed).unwrap();
    // Rank 0 does not take the replayed claim for rank 1's.
    assert!(!attacker.wait(&[&format!("{p}/complete")], 2 * SECOND).unwrap(), "rank 0 completed the join");
    let rank1 = spawn(rank(1, port_b), opts(), |mut rv| rv.broadcast(|| Err("unused".into())));
    assert_eq!(rank1.join().unwrap().unwrap(), b"id of run B");
    assert_eq!(rank0.join().unwrap().unwrap(), b"id of run B");
}

#[test]
fn an_abort_notice_without_the_key_does_not_end_a_keyed_job() {
    // Before: with a job key, a rank gave up on any notice under the abort key, signed or not, and
    // the owner record of rank 0's store gives the key's path (the scope hash) to anyone who
    // connects: one SET by a stranger failed every rank. Under torchrun's agent store it also
    // made the ranks skip the generation rank 0 had opened. Such notices are now ignored; a
    // rank's own notice takes their place and still stops every rank.
    let port = free_port();
    let token = "unsigned-abort";
    let abort = format!("{}/abort", prefix(token, 0));
    let rank0 = spawn(info(0, 2, port, token), keyed(10.0, KEY), |mut rv| {
        let id = rv.broadcast(|| Ok(b"the id".to_vec()))?;
        rv.barrier()?;
        Ok((id, rv.broadcast(|| Err("ncclGetUniqueId failed".into())).unwrap_err()))
    });
    let mut stranger = store_client(port);
    stranger.set(&abort, b"rank 0 (pid 1 on nowhere): stop").unwrap();
    assert!(stranger.check(&[&abort]).unwrap());
    let rank1 = spawn(info(1, 2, port, token), keyed(10.0, KEY), |mut rv| {
        let id = rv.broadcast(|| Err("unused".into()))?;
        // Rank 0's notice may come while this rank leaves the barrier (which never goes on past
        // one), or in the broadcast after it.
        let failed = rv.barrier().and_then(|()| rv.broadcast(|| Err("unused".into()))).unwrap_err();
        Ok((id, failed))
    });
    let (id0, failed0) = rank0.join().unwrap().unwrap();
    let (id1, failed1) = rank1.join().unwrap().unwrap();
    assert_eq!((id0.as_slice(), id1.as_slice()), (&b"the id"[..], &b"the id"[..]));
    assert!(matches!(failed0, RendezvousError::Make { .. }), "{failed0}");
    assert!(matches!(failed1, RendezvousError::Aborted { .. }), "{failed1}");
    let message = failed1.to_string();
    let by = format!("rendezvous aborted by rank 0 (pid {} on ", std::process::id());
    assert!(message.starts_with(&by), "{message}");
    assert!(
        message.ends_with(": rank 0 could not produce the bytes to broadcast: ncclGetUniqueId failed"),
        "{message}"
    );

    // Under torchrun's agent store: a notice written once rank 0 opened generation 1.
    let agent = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port = agent.local_addr().port();
    let run_id = format!("unsigned-abort-{}", std::process::id());
    let token = "unsigned-abort-agent";
    let worker = |rank: usize| torchrun_worker(rank, 2, port, &run_id, 0, Some(token));
    let opts = || keyed(10.0, KEY).clone_instance(0);
    let g1 = format!("{}/g1", prefix(token, 0));
    let rank0 = spawn(worker(0), opts(), |mut rv| rv.broadcast(|| Ok(b"the agent's id".to_vec())));
    let stranger = Mutex::new(store_client(port));
    until(|| stranger.lock().unwrap().check(&[&format!("{g1}/opened")]).unwrap());
    stranger.lock().unwrap().set(&format!("{g1}/abort"), b"rank 0 (pid 1 on nowhere): stop").unwrap();
    let rank1 = spawn(worker(1), opts(), |mut rv| rv.broadcast(|| Err("unused".into())));
    assert_eq!(rank1.join().unwrap().unwrap(), b"the agent's id");
    assert_eq!(rank0.join().unwrap().unwrap(), b"the agent's id");
}

#[test]
fn a_large_abort_notice_without_the_key_is_emptied_not_read_at_every_wait() {
    // Before: the ranks ignored a stranger's unsigned notice but left it in the store, and read it
    // whole again at every slice of every wait (up to the store's 1 MiB value limit each time,
    // on every rank, for the whole job). The first rank to read it now empties it, unless a
    // rank's own notice took its place meanwhile.
    let port = free_port();
    let token = "large-unsigned-abort";
    let abort = format!("{}/abort", prefix(token, 0));
    let rank0 = spawn(info(0, 2, port, token), keyed(10.0, KEY), |mut rv| {
        rv.barrier()?;
        rv.broadcast(|| Ok(b"the id".to_vec()))
    });
    let stranger = Mutex::new(store_client(port));
    stranger.lock().unwrap().set(&abort, &vec![b'x'; 512 << 10]).unwrap();
    // Rank 0 waits for rank 1's claim meanwhile: one of its wait slices finds the notice.
    until(|| stranger.lock().unwrap().get(&abort).unwrap().is_empty());
    let rank1 = spawn(info(1, 2, port, token), keyed(10.0, KEY), |mut rv| {
        rv.barrier()?;
        rv.broadcast(|| Err("unused".into()))
    });
    assert_eq!(rank1.join().unwrap().unwrap(), b"the id");
    assert_eq!(rank0.join().unwrap().unwrap(), b"the id");
}

#[test]
fn a_signed_abort_notice_copied_from_an_earlier_run_does_not_end_a_later_one() {
    // Before: a notice's MAC covered its key and text only. Whoever read run A's notice (rank 0's
    // store, or torchrun's agent store, is readable by anyone who reaches it) wrote it into run
    // B's store (the same job key and identity), and every rank of run B gave up with run A's
    // reason; under torchrun the ranks also skipped the generation rank 0 had opened. The MAC now
    // covers the start's random value too, which the notice carries: one of another start is
    // ignored (and left in place: a rank's own notice takes its place).
    replayed_abort(StoreMode::Rank0);
    replayed_abort(StoreMode::Auto);
}

/// Run A fails (rank 0 cannot produce its broadcast), then run B of the same two-rank job (the
/// same key and identity; `Rank0`: rank 0 hosts each run's store; `Auto`: a fresh torchrun agent
/// store for each run, where the generations count from 1 again) gets run A's abort notice
/// written into its store before rank 1 comes, and must work.
fn replayed_abort(mode: StoreMode) {
    let runs = TwoRuns::new(mode, "replayed-abort");
    let (rank, opts, p) = (|rank, port| runs.rank(rank, port), TwoRuns::opts, runs.prefix());
    let abort = format!("{p}/abort");

    let (store_a, port_a) = runs.serve();
    let rank0 = spawn(rank(0, port_a), opts(), |mut rv| rv.broadcast(|| Err("run A's rank 0 failed".into())));
    // Connected before rank 1 comes, so that rank 0's store stays up while this reads the notice.
    let spy = Mutex::new(store_client(port_a));
    let rank1 = spawn(rank(1, port_a), opts(), |mut rv| rv.broadcast(|| Err("unused".into())));
    let failed = rank1.join().unwrap().unwrap_err().to_string();
    assert!(failed.ends_with("run A's rank 0 failed"), "{failed}");
    let notice = spy.lock().unwrap().get(&abort).unwrap();
    assert!(notice.starts_with(b"rank 0 ("), "run A's notice: {}", String::from_utf8_lossy(&notice));
    drop(spy);
    assert!(matches!(rank0.join().unwrap(), Err(RendezvousError::Make { .. })));
    drop(store_a);

    let (_store_b, port_b) = runs.serve();
    let started = Instant::now();
    let rank0 = spawn(rank(0, port_b), opts(), |mut rv| {
        let id = rv.broadcast(|| Ok(b"id of run B".to_vec()))?;
        rv.barrier()?;
        Ok(id)
    });
    let attacker = Mutex::new(store_client(port_b));
    until(|| attacker.lock().unwrap().check(&[&format!("{p}/rank/0")]).unwrap());
    attacker.lock().unwrap().set(&abort, &notice).unwrap();
    // Rank 0 waits for rank 1 meanwhile, reading the abort key at each slice of its wait.
    thread::sleep(Duration::from_millis(300));
    let rank1 = spawn(rank(1, port_b), opts(), |mut rv| {
        let id = rv.broadcast(|| Err("unused".into()))?;
        rv.barrier()?;
        Ok(id)
    });
    assert_eq!(rank1.join().unwrap().unwrap(), b"id of run B");
    assert_eq!(rank0.join().unwrap().unwrap(), b"id of run B");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn a_rank_that_read_an_earlier_starts_value_follows_rank_0s_claim_and_joins() {
    // Before: a rank other than 0 read the start's random value once. In a store that outlives
    // runs, a start of rank 0 that was killed leaves its value; a rank 1 that came before the new
    // rank 0 claimed with it, rank 0 ignored that claim as one of another start, and both waited
    // for the timeout. Rank 1 now takes the start from rank 0's claim while it waits, and claims
    // again with it.
    let token = "earlier-start-value";
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port = store.local_addr().port();
    let keyed_external = || Options { instance: Some(0), ..keyed(10.0, KEY).with_store(StoreMode::External) };
    store_client(port).set(&format!("{}/start", prefix(token, 0)), &[0x55; 16]).unwrap();
    let started = Instant::now();
    let rank1 = spawn(info(1, 2, port, token), keyed_external(), |mut rv| rv.broadcast(|| Err("unused".into())));
    thread::sleep(Duration::from_millis(500));
    let rank0 = spawn(info(0, 2, port, token), keyed_external(), |mut rv| rv.broadcast(|| Ok(b"the id".to_vec())));
    assert_eq!(rank0.join().unwrap().unwrap(), b"the id");
    assert_eq!(rank1.join().unwrap().unwrap(), b"the id");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn a_start_value_rewritten_by_a_stranger_does_not_keep_a_rank_out() {
    // Anyone who reaches rank 0's store can write its start key: a rank that read a stranger's
    // value claimed with it, and rank 0 ignored that claim until the timeout. The rank now takes
    // the start from rank 0's claim, which carries the key's MAC.
    let port = free_port();
    let token = "stranger-start-value";
    let p = prefix(token, 0);
    let rank0 = spawn(info(0, 2, port, token), keyed(10.0, KEY), |mut rv| rv.broadcast(|| Ok(b"the id".to_vec())));
    let stranger = Mutex::new(store_client(port));
    let first = format!("{p}/rank/0");
    until(|| stranger.lock().unwrap().check(&[&first]).unwrap());
    let mut stranger = stranger.into_inner().unwrap();
    stranger.set(&format!("{p}/start"), &[0xaa; 16]).unwrap();
    let started = Instant::now();
    let rank1 = spawn(info(1, 2, port, token), keyed(10.0, KEY), |mut rv| rv.broadcast(|| Err("unused".into())));
    assert_eq!(rank1.join().unwrap().unwrap(), b"the id");
    assert_eq!(rank0.join().unwrap().unwrap(), b"the id");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn two_rank_0s_on_a_store_that_outlives_runs_fail_at_once_as_a_duplicate() {
    // Before: each rank 0 made a start of its own and replaced the other's claim as a leftover;
    // one pair completed, the other rank 0 timed out saying the claims were kept from an earlier
    // run, and its abort then failed the pair that had completed. A rank 0 now replaces a claim
    // of another start only when it is a leftover of a killed start, and one whose own claim is
    // replaced takes the other for a duplicate.
    let token = "two-rank-0s";
    let store = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Limits::default()).unwrap();
    let port = store.local_addr().port();
    let keyed_external = || Options { instance: Some(0), ..keyed(10.0, KEY).with_store(StoreMode::External) };
    let started = Instant::now();
    let a = spawn(info(0, 2, port, token), keyed_external(), |mut rv| rv.broadcast(|| Ok(b"A".to_vec())));
    thread::sleep(Duration::from_millis(200));
    let b = spawn(info(0, 2, port, token), keyed_external(), |mut rv| rv.broadcast(|| Ok(b"B".to_vec())));
    // The second rank 0 took the first's claim for a leftover and replaced it; the first, which
    // watches its claim, finds it replaced.
    let a = a.join().unwrap();
    assert!(matches!(a, Err(RendezvousError::Duplicate { rank: 0, .. })), "{a:?}");
    // Its notice counts for the second's start too (session 24: before, a notice counted for its
    // writer's start only, and the second rank 0 and rank 1 completed the join).
    let rank1 = spawn(info(1, 2, port, token), keyed_external(), |mut rv| rv.broadcast(|| Err("unused".into())));
    let results = [a, b.join().unwrap(), rank1.join().unwrap()];
    let errors: Vec<String> = results.iter().map(|r| r.as_ref().unwrap_err().to_string()).collect();
    for error in &errors {
        assert!(error.contains("rank 0 was claimed twice"), "{errors:#?}");
        assert!(!error.contains("kept from an earlier run"), "{errors:#?}");
    }
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn a_claim_of_another_builds_format_is_named_as_such() {
    // A rank of another build of this crate (its claims in the format before session 24, magic
    // `gpcm1`) holds rank 1: this build cannot read its claim, and says that the builds differ
    // rather than that something other than gpucomm wrote it.
    let port = free_port();
    let token = "another-build";
    let rank0 = spawn(info(0, 2, port, token), options(10.0), |mut rv| rv.broadcast(make_id));
    let mut older = store_client(port);
    let mut claim = forged_claim(1, 2, "older-build", "10.0.0.9:4000");
    claim[..5].copy_from_slice(b"gpcm1");
    older.set(&format!("{}/rank/1", prefix(token, 0)), &claim).unwrap();
    let rank1 = Rendezvous::connect(&info(1, 2, port, token), &options(10.0)).unwrap_err().to_string();
    let named = "a claim in another version's format (gpcm1, where this build writes gpcm2): every rank of a job must \
                 run the same build of gpucomm-launch";
    assert!(rank1.contains(named), "{rank1}");
    let rank0 = rank0.join().unwrap().unwrap_err().to_string();
    assert!(rank0.contains("rank 1"), "{rank0}");
}
