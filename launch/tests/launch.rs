//! Rendezvous tests over loopback: every rank is a thread, every port is found free at run time.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use gpucomm_launch::wire::Message;
use gpucomm_launch::{Launcher, Master, Options, RankInfo, Rendezvous, RendezvousError};

const TOKEN: &str = "test-job";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn info(rank: usize, world_size: usize, port: u16) -> RankInfo {
    RankInfo {
        rank,
        world_size,
        local_rank: rank,
        local_world_size: world_size,
        master: Some(Master { addr: "127.0.0.1".into(), port }),
        launcher: Launcher::Torchrun,
        job_token: Some(TOKEN.into()),
    }
}

fn options(seconds: f64) -> Options {
    Options::default().with_timeout(Duration::from_secs_f64(seconds))
}

fn connect(rank: usize, world_size: usize, port: u16, seconds: f64) -> Result<Rendezvous, RendezvousError> {
    Rendezvous::connect(&info(rank, world_size, port), &options(seconds))
}

fn spawn_rank<T: Send + 'static>(
    rank: usize,
    world_size: usize,
    port: u16,
    seconds: f64,
    then: impl FnOnce(Rendezvous) -> Result<T, RendezvousError> + Send + 'static,
) -> thread::JoinHandle<Result<T, RendezvousError>> {
    thread::spawn(move || connect(rank, world_size, port, seconds).and_then(then))
}

/// Rank 0's id: 128 bytes that differ from run to run.
fn make_id() -> Result<Vec<u8>, String> {
    let seed = Instant::now().elapsed().as_nanos() as u8 ^ std::process::id() as u8;
    Ok((0..128u32).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect())
}

#[test]
fn four_ranks_share_two_broadcasts_and_a_barrier() {
    let port = free_port();
    let ranks: Vec<_> = (0..4)
        .map(|rank| {
            spawn_rank(rank, 4, port, 10.0, move |mut rv| {
                assert_eq!((rv.rank(), rv.world_size()), (rank, 4));
                // Only rank 0 may call `make`: the others' closures would fail the broadcast.
                let id = rv.broadcast(|| if rank == 0 { make_id() } else { Err("called on a client".into()) })?;
                let second = rv.broadcast(|| Ok(format!("second from rank {rank}").into_bytes()))?;
                rv.barrier()?;
                Ok((id, second))
            })
        })
        .collect();
    let results: Vec<_> = ranks.into_iter().map(|r| r.join().unwrap().unwrap()).collect();
    assert_eq!(results[0].0.len(), 128);
    assert_eq!(results[0].1, b"second from rank 0");
    assert!(results.iter().all(|r| r == &results[0]));
}

#[test]
fn a_single_rank_needs_no_network() {
    let mut rv = Rendezvous::connect(&RankInfo::single(), &options(1.0)).unwrap();
    assert_eq!(rv.broadcast(make_id).unwrap().len(), 128);
    rv.barrier().unwrap();
    let err = rv.broadcast(|| Err("no id".into())).unwrap_err();
    assert_eq!(err.to_string(), "rank 0 could not produce the bytes to broadcast: no id");
}

#[test]
fn a_missing_rank_times_out_and_is_named() {
    let port = free_port();
    let started = Instant::now();
    let client = spawn_rank(1, 3, port, 1.5, Ok);
    let err = connect(0, 3, port, 1.5).unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
    match &err {
        RendezvousError::TimedOut { missing, world_size: 3, .. } => assert_eq!(missing, &[2]),
        other => panic!("{other}"),
    }
    let message = err.to_string();
    assert!(
        message.starts_with("rendezvous timed out after 1.5s: 2 of 3 ranks joined; missing ranks [2]"),
        "{message}"
    );
    // Rank 1 is told (or times out itself), within its own limit.
    match client.join().unwrap() {
        Err(RendezvousError::Rejected { reason, .. }) => assert!(reason.contains("missing ranks [2]"), "{reason}"),
        Err(RendezvousError::MasterTimeout { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_wrong_world_size_is_rejected_and_the_real_rank_still_joins() {
    let port = free_port();
    let server = spawn_rank(0, 2, port, 10.0, |mut rv| rv.broadcast(make_id));
    let err = connect(1, 3, port, 5.0).unwrap_err();
    assert!(matches!(err, RendezvousError::Rejected { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("world size mismatch: it was started with world size 3, rank 0 with 2"), "{message}");
    let mut good = connect(1, 2, port, 5.0).unwrap();
    let id = good.broadcast(|| Err("unused".into())).unwrap();
    assert_eq!(server.join().unwrap().unwrap(), id);
}

#[test]
fn a_bad_token_is_rejected_and_reported_at_the_timeout() {
    let port = free_port();
    let server = spawn_rank(0, 2, port, 1.5, Ok);
    let mut stray = info(1, 2, port);
    stray.job_token = Some("other-job".into());
    let err = Rendezvous::connect(&stray, &options(5.0)).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("rejected this process: job token mismatch"), "{message}");
    let message = server.join().unwrap().unwrap_err().to_string();
    assert!(message.contains("missing ranks [1]"), "{message}");
    assert!(message.contains("rejected connections: [job token mismatch"), "{message}");
    assert!(message.contains("(127.0.0.1:"), "{message}");
}

#[test]
fn explicit_options_token_wins() {
    let port = free_port();
    let server = thread::spawn(move || Rendezvous::connect(&info(0, 2, port), &options(5.0).with_token("shared")));
    let mut client_info = info(1, 2, port);
    client_info.job_token = Some("something else".into());
    Rendezvous::connect(&client_info, &options(5.0).with_token("shared")).unwrap();
    server.join().unwrap().unwrap();
}

#[test]
fn garbage_connections_do_not_stop_rank_0() {
    let port = free_port();
    let server = spawn_rank(0, 3, port, 10.0, |mut rv| {
        let id = rv.broadcast(make_id)?;
        rv.barrier()?;
        Ok(id)
    });
    let raw = |bytes: &[u8]| -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut stream = loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(stream) => break stream,
                Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("{e}"),
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.write_all(bytes).unwrap();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        let mut reply = Vec::new();
        let _ = stream.read_to_end(&mut reply);
        reply
    };
    // An HTTP request: its first bytes announce a 1 GiB frame.
    let reply = raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(reply.is_empty() || reply.windows(4).any(|w| w == b"GPCM"));
    // A frame of the right size full of garbage, a truncated frame, and nothing at all.
    raw(&[0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8]);
    raw(&[0, 0, 0]);
    raw(b"");
    // A hello from another protocol version gets a rejection that says so.
    let mut hello = Message::Hello { token: TOKEN.into(), rank: 1, world_size: 3 }.encode_frame().unwrap();
    hello[8..10].copy_from_slice(&2u16.to_be_bytes());
    let reply = raw(&hello);
    let reason = match Message::decode(&reply[4..]) {
        Ok(Message::Reject { reason }) => reason,
        other => panic!("{other:?}"),
    };
    assert!(reason.contains("protocol version 2"), "{reason}");
    // The real ranks still meet.
    let clients: Vec<_> = (1..3)
        .map(|rank| {
            spawn_rank(rank, 3, port, 10.0, |mut rv| {
                let id = rv.broadcast(|| Err("unused".into()))?;
                rv.barrier()?;
                Ok(id)
            })
        })
        .collect();
    let id = server.join().unwrap().unwrap();
    for client in clients {
        assert_eq!(client.join().unwrap().unwrap(), id);
    }
}

#[test]
fn a_duplicate_rank_is_rejected() {
    let port = free_port();
    let server = spawn_rank(0, 3, port, 10.0, Ok);
    let first = spawn_rank(1, 3, port, 10.0, Ok);
    thread::sleep(Duration::from_millis(200));
    let second = spawn_rank(1, 3, port, 10.0, Ok);
    thread::sleep(Duration::from_millis(200));
    let last = spawn_rank(2, 3, port, 10.0, Ok);
    server.join().unwrap().unwrap();
    last.join().unwrap().unwrap();
    let results = [first.join().unwrap(), second.join().unwrap()];
    let rejected: Vec<String> = results.iter().filter_map(|r| r.as_ref().err()).map(|e| e.to_string()).collect();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(rejected[0].contains("rank 1 already joined from 127.0.0.1:"), "{}", rejected[0]);
}

#[test]
fn clients_fail_fast_when_rank_0_goes_away() {
    let port = free_port();
    let clients: Vec<_> = (1..3)
        .map(|rank| {
            spawn_rank(rank, 3, port, 10.0, move |mut rv| {
                let started = Instant::now();
                let err = if rank == 1 { rv.broadcast(|| Err("unused".into())).map(drop) } else { rv.barrier() };
                let err = err.unwrap_err();
                assert!(started.elapsed() < Duration::from_secs(5));
                // The rendezvous cannot be used any more.
                assert!(matches!(rv.barrier(), Err(RendezvousError::Poisoned)));
                Ok(err)
            })
        })
        .collect();
    let server = connect(0, 3, port, 10.0).unwrap();
    thread::sleep(Duration::from_millis(100));
    drop(server);
    for client in clients {
        let err = client.join().unwrap().unwrap();
        assert!(matches!(err, RendezvousError::MasterGone { .. }), "{err}");
        let message = err.to_string();
        assert!(message.starts_with(&format!("rank 0 at 127.0.0.1:{port} went away during")), "{message}");
    }
}

#[test]
fn a_client_fails_when_rank_0_dies_during_the_join() {
    let port = free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let fake = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut prefix = [0u8; 4];
        stream.read_exact(&mut prefix).unwrap();
        // "Killed": the connection closes without an answer.
    });
    let err = connect(1, 2, port, 5.0).unwrap_err();
    fake.join().unwrap();
    let message = err.to_string();
    assert!(message.starts_with(&format!("rank 0 at 127.0.0.1:{port} went away during the rendezvous")), "{message}");
}

#[test]
fn a_taken_port_is_reported() {
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let started = Instant::now();
    let err = connect(0, 2, port, 5.0).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(matches!(err, RendezvousError::Bind { .. }), "{err}");
    let message = err.to_string();
    assert!(message.starts_with(&format!("rank 0 cannot listen on 127.0.0.1:{port}")), "{message}");
    assert!(message.contains("os error") && message.contains("choose another MASTER_PORT"), "{message}");
}

#[test]
fn a_late_peer_gets_a_connect_timeout() {
    let port = free_port();
    let server = spawn_rank(0, 2, port, 5.0, Ok);
    let client = connect(1, 2, port, 5.0).unwrap();
    drop(server.join().unwrap().unwrap());
    drop(client);
    let started = Instant::now();
    let err = connect(1, 2, port, 1.0).unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(3), "{elapsed:?}");
    let message = err.to_string();
    assert!(message.starts_with(&format!("could not reach rank 0 at 127.0.0.1:{port} within 1s")), "{message}");
}

#[test]
fn a_failing_make_aborts_the_clients() {
    let port = free_port();
    let client = spawn_rank(1, 2, port, 10.0, |mut rv| rv.broadcast(|| Err("unused".into())));
    let mut server = connect(0, 2, port, 10.0).unwrap();
    let err = server.broadcast(|| Err("ncclGetUniqueId failed".into())).unwrap_err();
    assert!(matches!(err, RendezvousError::Make { .. }));
    let message = client.join().unwrap().unwrap_err().to_string();
    assert!(message.starts_with(&format!("rank 0 at 127.0.0.1:{port} aborted:")), "{message}");
    assert!(message.contains("ncclGetUniqueId failed"), "{message}");
}

#[test]
fn out_of_order_calls_fail_within_the_timeout() {
    let port = free_port();
    // The client waits longer than rank 0, so rank 0 is the one that times out.
    let client = spawn_rank(1, 2, port, 5.0, |mut rv| rv.broadcast(|| Err("unused".into())));
    let mut server = connect(0, 2, port, 1.0).unwrap();
    let started = Instant::now();
    let err = server.barrier().unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3));
    let message = err.to_string();
    assert!(
        message.starts_with("rank 1 (127.0.0.1:") && message.contains("did not reach barrier #0 within 1s"),
        "{message}"
    );
    // The client hears about it from rank 0 at once.
    let message = client.join().unwrap().unwrap_err().to_string();
    assert!(message.contains("aborted: rank 1 (127.0.0.1:"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn options_and_rank_info_are_checked() {
    let opts = Options::from_vars(|_| Some("2.5".into())).unwrap();
    assert_eq!(opts.timeout, Duration::from_millis(2500));
    assert_eq!(Options::from_vars(|_| None).unwrap().timeout, Duration::from_secs(60));
    for bad in ["abc", "0", "-1", "inf", "NaN", "1e300"] {
        let message = Options::from_vars(|_| Some(bad.into())).unwrap_err().to_string();
        assert_eq!(
            message,
            format!("invalid rendezvous options: GPUCOMM_RENDEZVOUS_TIMEOUT={bad} is not a positive number of seconds")
        );
    }
    let mut no_master = info(1, 4, 1);
    no_master.master = None;
    no_master.local_world_size = 2;
    let message = Rendezvous::connect(&no_master, &options(1.0)).unwrap_err().to_string();
    assert!(message.starts_with("cannot rendezvous: no rendezvous address: MASTER_ADDR is not set"), "{message}");
    let message = Rendezvous::connect(&info(2, 2, 1), &options(1.0)).unwrap_err().to_string();
    assert!(message.contains("rank=2 is out of range for world_size=2"), "{message}");
}

/// The process side of [`a_killed_rank_0_process_fails_its_client`]: rank 0 of 2 on the port in
/// `GPUCOMM_TEST_RANK0_PORT`, which joins and then waits to be killed. Ignored when run directly.
#[test]
#[ignore = "helper process started by a_killed_rank_0_process_fails_its_client"]
fn rank_0_process_that_waits_to_be_killed() {
    let Some(port) = std::env::var("GPUCOMM_TEST_RANK0_PORT").ok().and_then(|p| p.parse().ok()) else { return };
    let _rv = connect(0, 2, port, 30.0).unwrap();
    println!("joined");
    thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_killed_rank_0_process_fails_its_client() {
    let port = free_port();
    let mut rank0 = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "rank_0_process_that_waits_to_be_killed", "--ignored", "--nocapture"])
        .env("GPUCOMM_TEST_RANK0_PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut rv = connect(1, 2, port, 20.0).unwrap();
    rank0.kill().unwrap(); // SIGKILL: the kernel closes rank 0's sockets, nothing is sent
    rank0.wait().unwrap();
    let started = Instant::now();
    let err = rv.broadcast(|| Err("only rank 0 makes".into())).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert!(matches!(err, RendezvousError::MasterGone { .. }), "{err}");
    assert!(err.to_string().starts_with(&format!("rank 0 at 127.0.0.1:{port} went away during")), "{err}");
}
