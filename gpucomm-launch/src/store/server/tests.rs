//! The server and the client over loopback: every query, the deadlines, the limits.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use super::*;
use crate::store::codec::tests::Rng;
use crate::store::{StoreClient, StoreError};

const SECOND: Duration = Duration::from_secs(1);

fn serve(limits: Limits) -> StoreServer {
    StoreServer::bind("127.0.0.1:0".parse().unwrap(), limits).unwrap()
}

fn client(server: &StoreServer) -> StoreClient {
    StoreClient::connect("127.0.0.1", server.local_addr().port(), 5 * SECOND).unwrap()
}

/// A raw connection, validated when `validate` is set.
fn raw(server: &StoreServer, validate: bool) -> TcpStream {
    raw_to(server.local_addr(), validate)
}

/// A raw connection to `addr`, validated when `validate` is set.
fn raw_to(addr: SocketAddr, validate: bool) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(5 * SECOND)).unwrap();
    if validate {
        let mut bytes = Vec::new();
        Request::Validate { magic: codec::VALIDATION_MAGIC }.encode(&mut bytes);
        stream.write_all(&bytes).unwrap();
    }
    stream
}

/// `n` raw validated connections, once the server has read their `VALIDATE`.
fn validated(server: &StoreServer, n: usize) -> Vec<TcpStream> {
    let before = server.stats().validated;
    let streams = (0..n).map(|_| raw(server, true)).collect();
    assert_eq!(stats_until(server, |s| s.validated == before + n).validated, before + n);
    streams
}

/// Sends a `PING` on a validated connection and reads its reply.
fn ping(stream: &mut TcpStream) {
    let mut bytes = Vec::new();
    Request::Ping { nonce: 7 }.encode(&mut bytes);
    stream.write_all(&bytes).unwrap();
    let mut reply = [0u8; 4];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(u32::from_le_bytes(reply), 7);
}

/// True while the server keeps `stream` open: a read of it still waits after 0.1 s.
fn still_open(stream: &mut TcpStream) -> bool {
    stream.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let result = stream.read(&mut [0u8; 1]);
    matches!(result, Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
}

/// True once the server has closed `stream` (reads give EOF or a reset).
fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return true,
            Ok(_) => {}
        }
    }
}

/// Waits (at most 5 s) until the server's stats satisfy `ok`.
fn stats_until(server: &StoreServer, ok: impl Fn(&ServerStats) -> bool) -> ServerStats {
    let deadline = Instant::now() + 5 * SECOND;
    loop {
        let stats = server.stats();
        if ok(&stats) || Instant::now() > deadline {
            return stats;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn every_query_is_served_as_pytorch_serves_it() {
    let server = serve(Limits::default());
    let mut c = client(&server);
    assert_eq!(c.addr(), format!("127.0.0.1:{}", server.local_addr().port()));
    c.ping().unwrap();
    c.set("/a", b"1").unwrap();
    assert_eq!(c.get("/a").unwrap(), b"1");
    assert_eq!(c.get("/missing").unwrap(), b"");
    assert_eq!(c.add("/n", 5).unwrap(), 5);
    assert_eq!(c.add("/n", -2).unwrap(), 3);
    assert_eq!(c.get("/n").unwrap(), b"3");
    assert_eq!(c.compare_set("/c", b"", b"first").unwrap(), b"first");
    assert_eq!(c.compare_set("/c", b"", b"second").unwrap(), b"first");
    assert_eq!(c.compare_set("/c", b"first", b"third").unwrap(), b"third");
    assert_eq!(c.compare_set("/absent", b"x", b"y").unwrap(), b"x");
    assert!(c.check(&["/a", "/n"]).unwrap());
    assert!(!c.check(&["/a", "/absent"]).unwrap());
    assert!(c.wait(&["/a"], SECOND).unwrap());
    c.append("/p", b"ab").unwrap();
    c.append("/p", b"cd").unwrap();
    c.multi_set(&[("/m1", b"x"), ("/m2", b"")]).unwrap();
    assert_eq!(c.multi_get(&["/p", "/m1", "/m2"]).unwrap(), vec![b"abcd".to_vec(), b"x".to_vec(), vec![]]);
    assert_eq!(c.num_keys().unwrap(), 6);
    assert!(c.delete_key("/a").unwrap());
    assert!(!c.delete_key("/a").unwrap());
    assert_eq!(c.delete_keys(&["/m1", "/m2", "/nope"]).unwrap(), 2);
    assert_eq!(c.num_keys().unwrap(), 3);
    let stats = server.stats();
    assert_eq!((stats.keys, stats.dropped), (3, 0));
}

#[test]
fn deleting_more_keys_than_the_store_keeps_replies_for_takes_several_round_trips() {
    // Rank 0's barrier deletes about one key per rank. All requests sent before any reply was
    // read, a world of ~600,000 ranks or more left more unread replies than a client may (4 MiB), and
    // the store dropped rank 0. About 3,000 round trips: a debug build on a slow machine takes
    // longer than the other tests' five-second deadline, so this client has a minute.
    let server = serve(Limits::default());
    let mut c = StoreClient::connect("127.0.0.1", server.local_addr().port(), 60 * SECOND).unwrap();
    c.set("/k300000", b"v").unwrap();
    let keys: Vec<String> = (0..1_500_000).map(|i| format!("/k{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(c.delete_keys(&refs).unwrap(), 1);
    assert_eq!(server.stats().dropped, 0);
}

#[test]
fn limits_too_long_for_an_instant_mean_for_ever() {
    // Duration::MAX as a server limit panicked the store's thread at a connection's first bytes;
    // as a client's wait it timed out at once.
    let server = serve(Limits { validate_within: Duration::MAX, request_within: Duration::MAX, ..Limits::default() });
    let mut waiter = client(&server);
    waiter.set("/k", b"v").unwrap();
    assert_eq!(waiter.get("/k").unwrap(), b"v");
    let port = server.local_addr().port();
    let setter = thread::spawn(move || {
        let mut c = StoreClient::connect("127.0.0.1", port, 5 * SECOND).unwrap();
        thread::sleep(Duration::from_millis(100));
        c.set("/later", b"v").unwrap();
    });
    assert!(waiter.wait(&["/later"], Duration::MAX).unwrap());
    setter.join().unwrap();
    assert_eq!(server.stats().dropped, 0);
}

#[test]
fn a_wait_ends_when_another_client_sets_the_key_or_is_canceled() {
    let server = serve(Limits::default());
    let mut waiter = client(&server);
    let port = server.local_addr().port();
    let setter = thread::spawn(move || {
        let mut c = StoreClient::connect("127.0.0.1", port, 5 * SECOND).unwrap();
        thread::sleep(Duration::from_millis(100));
        c.set("/later", b"v").unwrap();
    });
    let started = Instant::now();
    assert!(waiter.wait(&["/later", "/later"], 5 * SECOND).unwrap());
    assert!(started.elapsed() >= Duration::from_millis(90));
    setter.join().unwrap();
    // A wait that times out is canceled; the connection stays in step.
    let started = Instant::now();
    assert!(!waiter.wait(&["/never"], Duration::from_millis(100)).unwrap());
    assert!(started.elapsed() < 5 * SECOND, "{:?}", started.elapsed());
    assert_eq!(waiter.get("/later").unwrap(), b"v");
    assert_eq!(stats_until(&server, |s| s.buffered_bytes == 0).buffered_bytes, 0);
}

#[test]
fn a_timed_out_wait_whose_cancel_cannot_be_sent_leaves_the_client_broken() {
    // A client timeout of zero leaves no time to send CANCEL_WAIT once the wait's own 2 s have
    // passed, so the WAIT stays pending in the store. Before: the client stayed in step, and the
    // WAIT_STOP the store sent once the key was set was read as the start of the next reply.
    let server = serve(Limits::default());
    let mut waiter = client(&server);
    let mut setter = client(&server);
    waiter.set_timeout(Duration::ZERO);
    let error = waiter.wait(&["/k"], 2 * SECOND).unwrap_err();
    assert!(error.is_timeout(), "{error}");
    // The WAIT is pending: the store holds its key.
    assert!(stats_until(&server, |s| s.buffered_bytes > 0).buffered_bytes > 0);
    setter.set("/k", b"value").unwrap();
    // Served in order: once the PING is answered, the SET has ended the wait.
    setter.ping().unwrap();
    assert_eq!(stats_until(&server, |s| s.buffered_bytes == 0).buffered_bytes, 0);
    waiter.set_timeout(5 * SECOND);
    assert!(matches!(waiter.get("/k"), Err(StoreError::Broken { .. })));
    assert!(matches!(waiter.ping(), Err(StoreError::Broken { .. })));
    assert_eq!(setter.get("/k").unwrap(), b"value");
}

#[test]
fn connections_must_send_validate_first_and_in_time() {
    let limits = Limits { validate_within: Duration::from_millis(200), ..Limits::default() };
    let server = serve(limits);
    let mut idle = raw(&server, false);
    let mut set_first = raw(&server, false);
    let mut set = Vec::new();
    Request::Set { key: b"/k", value: b"v" }.encode(&mut set);
    set_first.write_all(&set).unwrap();
    let mut wrong_magic = raw(&server, false);
    wrong_magic.write_all(&[0, 1, 2, 3, 4]).unwrap();
    let started = Instant::now();
    assert!(closed_by_server(&mut set_first));
    assert!(closed_by_server(&mut wrong_magic));
    assert!(closed_by_server(&mut idle));
    assert!(started.elapsed() < 3 * SECOND);
    let stats = stats_until(&server, |s| s.dropped == 3);
    let events = stats.events.join("\n");
    assert!(events.contains("its first request was query byte 1, not VALIDATE"), "{events}");
    assert!(events.contains("VALIDATE with a wrong magic number 0x4030201"), "{events}");
    assert!(events.contains("no VALIDATE within 0.2s"), "{events}");
    assert_eq!(stats.keys, 0);
}

#[test]
fn a_request_that_trickles_past_its_deadline_is_dropped() {
    let limits = Limits { request_within: Duration::from_millis(300), ..Limits::default() };
    let server = serve(limits);
    let mut slow = raw(&server, true);
    let mut set = Vec::new();
    Request::Set { key: b"/k", value: b"0123456789" }.encode(&mut set);
    let started = Instant::now();
    let mut closed = false;
    for byte in &set {
        if slow.write_all(&[*byte]).is_err() {
            closed = true;
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    assert!(closed || closed_by_server(&mut slow));
    assert!(started.elapsed() < 3 * SECOND);
    let stats = stats_until(&server, |s| s.dropped == 1);
    assert!(stats.events[0].contains("a request did not arrive within 0.3s"), "{:?}", stats.events);
    assert_eq!(stats.keys, 0);
}

#[test]
fn a_client_that_does_not_read_its_replies_is_dropped() {
    let limits = Limits { max_reply_len: 64 << 10, ..Limits::default() };
    let server = serve(limits);
    client(&server).set("/big", &[7; 16 << 10]).unwrap();
    let mut greedy = raw(&server, true);
    let mut get = Vec::new();
    Request::Get { key: b"/big" }.encode(&mut get);
    // Many GETs, no reads: the replies pile up past the bound (the socket buffers hold some).
    for _ in 0..2000 {
        if greedy.write_all(&get).is_err() {
            break;
        }
    }
    let stats = stats_until(&server, |s| s.dropped == 1);
    assert!(stats.events.iter().any(|e| e.contains("it does not read its replies")), "{:?}", stats.events);
    assert!(stats.peak_buffered_bytes <= Limits::default().buffered_bound());
    // Others are still served.
    assert_eq!(client(&server).get("/big").unwrap().len(), 16 << 10);
}

#[test]
fn requests_over_the_limits_close_only_their_connection() {
    let limits = Limits { max_store_keys: 2, max_key_len: 32, ..Limits::default() };
    let server = serve(limits.clone());
    let mut good = client(&server);
    good.set("/one", b"1").unwrap();
    // A key length of 2^40, announced and never sent.
    let mut huge = raw(&server, true);
    huge.write_all(&[3]).unwrap();
    huge.write_all(&(1u64 << 40).to_le_bytes()).unwrap();
    assert!(closed_by_server(&mut huge));
    // PyTorch's queue queries are not served.
    let mut queue = raw(&server, true);
    queue.write_all(&[14, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
    assert!(closed_by_server(&mut queue));
    // The store's key cap: the second new key is refused.
    let mut filler = client(&server);
    filler.set("/two", b"2").unwrap();
    filler.set("/three", b"3").unwrap();
    assert!(matches!(filler.ping(), Err(StoreError::Closed { .. })), "the store closes the connection");
    assert!(matches!(filler.ping(), Err(StoreError::Broken { .. })));
    let stats = stats_until(&server, |s| s.dropped == 3);
    let events = stats.events.join("\n");
    assert!(events.contains("key length 1099511627776 is over the limit of 32"), "{events}");
    assert!(events.contains("query 14 (a PyTorch queue, list or barrier query) is not served"), "{events}");
    assert!(events.contains("the store holds its limit of 2 keys"), "{events}");
    // The client refuses what its limits forbid, without sending.
    let long = "k".repeat(33);
    let mut limited = StoreClient::connect_with("127.0.0.1", server.local_addr().port(), SECOND, limits).unwrap();
    let error = limited.set(&long, b"").unwrap_err();
    assert_eq!(error.to_string(), "SET not sent: key length 33 is over the limit of 32");
    assert_eq!(good.get("/one").unwrap(), b"1");
    assert_eq!(good.multi_get(&["/one", "/two"]).unwrap(), vec![b"1".to_vec(), b"2".to_vec()]);
}

#[test]
fn the_pending_cap_closes_the_oldest_connection_without_validate() {
    // Before: once `max_pending` connections had not sent VALIDATE, newcomers were turned away
    // until those timed out, and whoever reopened each as soon as it was closed kept every
    // client out. Now a newcomer takes the place of the oldest. The idle ones have 10 s to send
    // VALIDATE: none of them is closed for that during the test.
    let limits = Limits { max_pending: 4, validate_within: 10 * SECOND, ..Limits::default() };
    let server = serve(limits);
    let mut idle: Vec<TcpStream> = Vec::new();
    for n in 1..=10 {
        idle.push(raw(&server, false));
        // One at a time, so that "the oldest" is the order they were opened in.
        stats_until(&server, |s| s.accepted == n);
    }
    let stats = stats_until(&server, |s| s.displaced == 6);
    assert_eq!((stats.displaced, stats.turned_away, stats.dropped, stats.connections), (6, 0, 0, 4));
    let events = stats.events.join("\n");
    assert!(
        events.contains(
            "closed 1 connection(s) without VALIDATE so far to make room for newer ones: the limit of connections \
             without VALIDATE (4) was reached; this one: 127.0.0.1:"
        ),
        "{events}"
    );
    let (oldest, newest) = idle.split_at_mut(6);
    assert!(oldest.iter_mut().all(closed_by_server));
    assert!(newest.iter_mut().all(still_open));
    // A real client gets in at once, long before the idle ones' 10 s are over.
    let mut c = StoreClient::connect("127.0.0.1", server.local_addr().port(), 2 * SECOND).unwrap();
    c.set("/in", b"yes").unwrap();
    assert_eq!(c.get("/in").unwrap(), b"yes");
    assert_eq!(server.stats().displaced, 7);
}

/// Whether this machine's loopback takes the addresses 127.0.0.2 and up (Linux's takes all of
/// 127.0.0.0/8), for tests with clients of several addresses.
#[cfg(target_os = "linux")]
fn more_loopback_addresses() -> bool {
    let ok = TcpListener::bind("127.0.0.2:0").is_ok();
    if !ok {
        eprintln!("skipped: the loopback does not take 127.0.0.2 here");
    }
    ok
}

/// `n` connections to `server` from `from` that never send anything, once the server has
/// accepted them (or turned them away).
#[cfg(target_os = "linux")]
fn silent_from(server: &StoreServer, from: Ipv4Addr, n: usize) -> Vec<TcpStream> {
    let before = server.stats().accepted;
    let streams: Vec<TcpStream> = (0..n).map(|_| connect_from(from, server.local_addr())).collect();
    stats_until(server, |s| s.accepted == before + n as u64);
    streams
}

#[test]
#[cfg(target_os = "linux")]
fn one_address_holds_at_most_8_connections_without_validate_and_its_newest_keep_their_places() {
    // Before: one address held all 64 places of connections without VALIDATE, and every other
    // client was turned away until they timed out (here 10 s: the client below gives up after 2).
    // Then the address's ninth was turned away; now it takes the place of the address's oldest.
    if !more_loopback_addresses() {
        return;
    }
    let limits = Limits { validate_within: 10 * SECOND, ..Limits::default() };
    let server = serve(limits);
    let stranger = Ipv4Addr::new(127, 0, 0, 2);
    let mut silent = silent_from(&server, stranger, 64);
    let stats = stats_until(&server, |s| s.displaced == 56);
    assert_eq!((stats.displaced, stats.turned_away, stats.connections), (56, 0, 8));
    let events = stats.events.join("\n");
    assert!(
        events.contains(
            "closed 1 connection(s) without VALIDATE so far to make room for newer ones: the limit of 8 \
             connections without VALIDATE from one address (127.0.0.2) was reached; this one: 127.0.0.2:"
        ),
        "{events}"
    );
    let mut c = StoreClient::connect("127.0.0.1", server.local_addr().port(), 2 * SECOND).unwrap();
    c.set("/in", b"yes").unwrap();
    assert_eq!(c.get("/in").unwrap(), b"yes");
    let open: Vec<bool> = silent.iter_mut().map(still_open).collect();
    assert_eq!(open, [vec![false; 56], vec![true; 8]].concat());
}

#[test]
fn silent_connections_from_the_clients_own_address_do_not_keep_it_out() {
    // Before: a process sharing the ranks' address (127.0.0.1 here) that held 8 connections
    // without VALIDATE had every further connection from that address turned away.
    let limits = Limits { validate_within: 10 * SECOND, ..Limits::default() };
    let server = serve(limits);
    let port = server.local_addr().port();
    let mut silent: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
    stats_until(&server, |s| s.accepted == 8);
    let started = Instant::now();
    let mut c = StoreClient::connect("127.0.0.1", port, 2 * SECOND).unwrap();
    c.set("/in", b"yes").unwrap();
    assert_eq!(c.get("/in").unwrap(), b"yes");
    assert!(started.elapsed() < SECOND, "{:?}", started.elapsed());
    let stats = server.stats();
    assert_eq!((stats.displaced, stats.turned_away), (1, 0));
    // The first opened was the one closed.
    assert!(closed_by_server(&mut silent[0]));
    assert!(still_open(&mut silent[1]));
}

#[test]
#[cfg(target_os = "linux")]
fn a_newcomer_takes_the_place_of_the_oldest_connection_without_validate() {
    // Eight addresses hold eight silent connections each: all 64 places. Before: every other
    // client was turned away until they timed out (10 s here). Now the oldest gives its place.
    if !more_loopback_addresses() {
        return;
    }
    let limits = Limits { validate_within: 10 * SECOND, ..Limits::default() };
    let server = serve(limits);
    let mut silent: Vec<TcpStream> =
        (2..10).flat_map(|host| silent_from(&server, Ipv4Addr::new(127, 0, 0, host), 8)).collect();
    let stats = server.stats();
    assert_eq!((stats.connections, stats.validated, stats.turned_away), (64, 0, 0));
    let started = Instant::now();
    let mut c = StoreClient::connect("127.0.0.1", server.local_addr().port(), 2 * SECOND).unwrap();
    c.set("/in", b"yes").unwrap();
    assert!(started.elapsed() < 2 * SECOND, "{:?}", started.elapsed());
    let stats = server.stats();
    assert_eq!((stats.displaced, stats.turned_away, stats.connections, stats.validated), (1, 0, 64, 1));
    // The first opened, from 127.0.0.2, was the one closed.
    assert!(closed_by_server(&mut silent[0]));
    assert!(still_open(&mut silent[1]));
}

#[test]
fn a_client_gives_up_on_an_unreachable_store_and_fails_at_once_on_an_unknown_host() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let started = Instant::now();
    let error = StoreClient::connect("127.0.0.1", port, Duration::from_millis(300)).unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(290) && elapsed < 5 * SECOND, "{elapsed:?}");
    assert!(error.to_string().starts_with(&format!("no store answered at 127.0.0.1:{port} within 0.3s")), "{error}");
    let started = Instant::now();
    let error = StoreClient::connect("no-such-host.invalid", port, 30 * SECOND).unwrap_err();
    assert!(started.elapsed() < 5 * SECOND, "{:?}", started.elapsed());
    assert!(matches!(error, StoreError::Resolve { .. }), "{error}");
    assert!(error.to_string().starts_with("cannot resolve the store's host \"no-such-host.invalid\""), "{error}");
}

/// A fake store that handshakes properly, then answers every request with `reply` and closes.
fn fake_store(replies: Vec<Vec<u8>>) -> (u16, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = thread::spawn(move || {
        for reply in replies {
            let (mut s, _) = listener.accept().unwrap();
            let mut hello = [0u8; 10];
            if s.read_exact(&mut hello).is_err() {
                continue;
            }
            let _ = s.write_all(&hello[6..10]);
            let mut request = [0u8; 1];
            if s.read(&mut request).is_ok() {
                let _ = s.write_all(&reply);
            }
            let _ = s.shutdown(Shutdown::Write);
            // Drain until the client closes, so that it sees the EOF rather than a reset.
            let _ = s.set_read_timeout(Some(SECOND));
            let _ = s.read_to_end(&mut Vec::new());
        }
    });
    (port, handle)
}

#[test]
fn fuzzed_replies_never_panic_or_allocate_beyond_the_limits() {
    const CASES: usize = 300;
    let mut rng = Rng(0xfeed_beef_0123_4567);
    let replies: Vec<Vec<u8>> = (0..CASES)
        .map(|_| match rng.below(3) {
            0 => {
                let n = rng.below(24);
                rng.bytes(n)
            }
            // A plausible value length, often over the client's limit.
            1 => {
                let mut r = (rng.next() % 4096).to_le_bytes().to_vec();
                let n = rng.below(64);
                r.extend(rng.bytes(n));
                r
            }
            _ => vec![rng.below(3) as u8],
        })
        .collect();
    let (port, fake) = fake_store(replies);
    let limits = Limits { max_value_len: 1024, max_reply_len: 2048, ..Limits::default() };
    for case in 0..CASES {
        // A reply that left the client waiting for bytes that never come would take its 10 s.
        let mut c = StoreClient::connect_with("127.0.0.1", port, 10 * SECOND, limits.clone()).unwrap();
        let started = Instant::now();
        let result = match case % 7 {
            0 => c.get("/k").map(|v| assert!(v.len() <= 1024)),
            1 => c.add("/k", 1).map(drop),
            2 => c.check(&["/k"]).map(drop),
            3 => c.wait(&["/k"], Duration::from_millis(50)).map(drop),
            4 => c.multi_get(&["/a", "/b", "/c"]).map(|v| assert!(v.iter().map(Vec::len).sum::<usize>() <= 2048)),
            5 => c.compare_set("/k", b"", b"v").map(drop),
            _ => c.delete_key("/k").map(drop),
        };
        assert!(started.elapsed() < 5 * SECOND, "case {case} took {:?}", started.elapsed());
        if let Err(error) = result {
            assert!(!error.to_string().is_empty());
        }
    }
    fake.join().unwrap();
}

#[test]
fn an_idle_connection_makes_room_for_a_new_one_when_all_are_open() {
    // Eight connections validated and left idle hold every place: one of them gives its place to
    // a real client, which gets in at its first try.
    let limits = Limits { max_connections: 8, evict_idle_after: Duration::from_millis(200), ..Limits::default() };
    let server = serve(limits);
    let mut idle = validated(&server, 8);
    thread::sleep(Duration::from_millis(250));
    let mut c = client(&server);
    c.set("/in", b"yes").unwrap();
    assert_eq!(c.get("/in").unwrap(), b"yes");
    let stats = stats_until(&server, |s| s.evicted == 1);
    assert_eq!((stats.evicted, stats.turned_away, stats.dropped, stats.connections), (1, 0, 0, 8));
    let events = stats.events.join("\n");
    assert!(
        events.contains("evicted 1 idle connection(s) so far to make room: the connection limit (8) was reached"),
        "{events}"
    );
    assert_eq!(idle.iter_mut().map(still_open).filter(|&open| !open).count(), 1);
}

#[test]
fn connections_in_use_keep_their_places_and_the_new_one_is_turned_away() {
    // All eight were idle long enough, then each was served a request or started one: none is
    // idle now (the limit leaves three seconds for the newcomer to come: one left a slow
    // machine's stall time to make the served ones idle again).
    let limits = Limits { max_connections: 8, evict_idle_after: 3 * SECOND, ..Limits::default() };
    let server = serve(limits);
    let mut busy = validated(&server, 8);
    thread::sleep(Duration::from_millis(3200));
    let (unfinished, served) = busy.split_last_mut().unwrap();
    for stream in served {
        ping(stream);
    }
    let mut set = Vec::new();
    Request::Set { key: b"/k", value: b"v" }.encode(&mut set);
    unfinished.write_all(&set[..3]).unwrap();
    assert_eq!(stats_until(&server, |s| s.buffered_bytes == 3).buffered_bytes, 3);
    let mut newcomer = raw(&server, false);
    let stats = stats_until(&server, |s| s.turned_away == 1);
    assert_eq!((stats.turned_away, stats.evicted, stats.connections), (1, 0, 8));
    let events = stats.events.join("\n");
    assert!(events.contains("turned away 1 connection(s) so far: the connection limit (8) was reached"), "{events}");
    assert!(!still_open(&mut newcomer));
    assert!(busy.iter_mut().all(still_open));
}

#[test]
fn a_connection_waiting_for_a_key_is_never_evicted() {
    // The waiter is the longest idle, yet the other connection makes room, and the wait ends
    // when the newcomer sets the key.
    let limits = Limits { max_connections: 2, evict_idle_after: Duration::from_millis(200), ..Limits::default() };
    let server = serve(limits);
    let mut waiter = raw(&server, true);
    let mut wait = Vec::new();
    Request::Wait { keys: vec![b"/k"] }.encode(&mut wait);
    waiter.write_all(&wait).unwrap();
    assert!(stats_until(&server, |s| s.buffered_bytes > 0).buffered_bytes > 0, "the wait is held");
    let mut idle = validated(&server, 1);
    thread::sleep(Duration::from_millis(250));
    let mut c = client(&server);
    c.set("/k", b"v").unwrap();
    let mut reply = [0u8; 1];
    waiter.read_exact(&mut reply).unwrap();
    assert_eq!(reply[0], WAIT_STOP);
    assert!(!still_open(&mut idle[0]));
    let stats = stats_until(&server, |s| s.evicted == 1);
    assert_eq!((stats.evicted, stats.turned_away), (1, 0));
}

#[test]
fn a_connection_that_used_the_store_keeps_its_place_however_long_it_is_quiet() {
    // A rank wrote its claim and went quiet (between barriers); a stranger holds the other three
    // places with connections that only ping. Before: the rank, the longest idle, gave its place
    // to the newcomer and its next request failed. Now a pinging one does, and once every place
    // is held by a connection that used the store, a newcomer is turned away.
    let limits = Limits { max_connections: 4, evict_idle_after: Duration::from_millis(300), ..Limits::default() };
    let server = serve(limits);
    let mut rank = client(&server);
    rank.set("/claim", b"rank 1").unwrap();
    let mut pinging = validated(&server, 3);
    for stream in &mut pinging {
        ping(stream);
    }
    thread::sleep(Duration::from_millis(400));
    let mut newcomer = client(&server);
    newcomer.set("/in", b"yes").unwrap();
    assert_eq!(stats_until(&server, |s| s.evicted == 1).evicted, 1);
    assert_eq!(rank.get("/claim").unwrap(), b"rank 1");
    let mut left: Vec<TcpStream> = pinging.into_iter().filter_map(|mut s| still_open(&mut s).then_some(s)).collect();
    assert_eq!(left.len(), 2);
    // The two left use the store too (a GET): no place is free for another newcomer, however
    // long they all stay quiet.
    let mut get = Vec::new();
    Request::Get { key: b"/in" }.encode(&mut get);
    for stream in &mut left {
        stream.write_all(&get).unwrap();
        let mut reply = [0u8; 11];
        stream.read_exact(&mut reply).unwrap();
        assert_eq!(&reply[8..], b"yes");
    }
    thread::sleep(Duration::from_millis(400));
    let mut refused = raw(&server, false);
    let stats = stats_until(&server, |s| s.turned_away == 1);
    assert_eq!((stats.turned_away, stats.evicted, stats.connections), (1, 1, 4));
    assert!(!still_open(&mut refused));
    assert!(left.iter_mut().all(still_open));
    assert_eq!(rank.get("/claim").unwrap(), b"rank 1");
    assert_eq!(newcomer.get("/in").unwrap(), b"yes");
}

/// Whether this host's loopback takes IPv6 and IPv4 connections on one `[::]` socket.
fn dual_stack() -> bool {
    let Ok(listener) = TcpListener::bind("[::]:0") else { return false };
    let port = listener.local_addr().unwrap().port();
    TcpStream::connect((Ipv6Addr::LOCALHOST, port)).is_ok() && TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok()
}

#[test]
fn the_address_with_the_most_connections_gives_up_one_first() {
    // A connection that only validated (over IPv6) is the longest idle, but a host holding three
    // (over IPv4, another address) loses one of its own to the newcomer.
    if !dual_stack() {
        eprintln!("skipped: the loopback does not take IPv6 and IPv4 on one socket here");
        return;
    }
    let limits = Limits { max_connections: 4, evict_idle_after: Duration::from_millis(200), ..Limits::default() };
    let server = StoreServer::bind("[::]:0".parse().unwrap(), limits).unwrap();
    let port = server.local_addr().port();
    let mut rank = raw_to((Ipv6Addr::LOCALHOST, port).into(), true);
    stats_until(&server, |s| s.validated == 1);
    let mut host: Vec<TcpStream> = (0..3).map(|_| raw_to((Ipv4Addr::LOCALHOST, port).into(), true)).collect();
    stats_until(&server, |s| s.validated == 4);
    thread::sleep(Duration::from_millis(250));
    let mut c = client(&server);
    c.set("/in", b"yes").unwrap();
    ping(&mut rank);
    assert_eq!(host.iter_mut().map(still_open).filter(|&open| !open).count(), 1);
    assert_eq!(stats_until(&server, |s| s.evicted == 1).evicted, 1);
}

#[test]
fn one_address_holds_at_most_max_per_peer_connections() {
    // The fourth from 127.0.0.1 is turned away; a place is given back however a connection
    // ends (its client closes it, or the server drops it), and only then.
    let limits = Limits { max_per_peer: 3, ..Limits::default() };
    let server = serve(limits);
    let mut three = validated(&server, 3);
    let mut fourth = raw(&server, false);
    let stats = stats_until(&server, |s| s.turned_away == 1);
    assert_eq!((stats.turned_away, stats.connections), (1, 3));
    let events = stats.events.join("\n");
    assert!(events.contains("the limit of 3 connections from one address (127.0.0.1) was reached"), "{events}");
    assert!(!still_open(&mut fourth));
    drop(three.pop());
    // A PyTorch queue query: not served, so the server closes the connection.
    three[0].write_all(&[14, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
    let stats = stats_until(&server, |s| s.connections == 1);
    assert_eq!((stats.connections, stats.dropped), (1, 1));
    let mut a = client(&server);
    let mut b = client(&server);
    a.set("/a", b"1").unwrap();
    assert_eq!(a.get("/a").unwrap(), b"1");
    b.ping().unwrap();
    let _fifth = raw(&server, false);
    let stats = stats_until(&server, |s| s.turned_away == 2);
    assert_eq!((stats.turned_away, stats.connections), (2, 3));
}

/// A server whose replies must be sent within 2 s of being queued, holding 32 values of 1 MiB
/// (one `MULTI_GET` of them all: a 32 MiB reply, far more than loopback's socket buffers take),
/// with a budget that holds one such reply but not two; a client with the same limits; the keys
/// and their values.
fn large_values() -> (StoreServer, StoreClient, Vec<String>, Vec<Vec<u8>>) {
    let limits =
        Limits { request_within: 2 * SECOND, max_reply_len: 40 << 20, max_buffered: 48 << 20, ..Limits::default() };
    let server = serve(limits.clone());
    let mut client = StoreClient::connect_with("127.0.0.1", server.local_addr().port(), 5 * SECOND, limits).unwrap();
    let keys: Vec<String> = (0..32).map(|i| format!("/v{i}")).collect();
    let values: Vec<Vec<u8>> = (0..32u8).map(|i| vec![i; 1 << 20]).collect();
    for (key, value) in keys.iter().zip(&values) {
        client.set(key, value).unwrap();
    }
    (server, client, keys, values)
}

#[test]
fn a_large_reply_read_promptly_arrives_whole() {
    let (server, mut client, keys, values) = large_values();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    for _ in 0..2 {
        assert_eq!(client.multi_get(&refs).unwrap(), values);
    }
    let stats = stats_until(&server, |s| s.buffered_bytes == 0);
    assert_eq!((stats.dropped, stats.buffered_bytes), (0, 0), "{:?}", stats.events);
}

#[test]
fn a_client_that_reads_its_replies_too_slowly_is_dropped_and_its_budget_released() {
    let (server, mut honest, keys, values) = large_values();
    let mut get = Vec::new();
    Request::MultiGet { keys: keys.iter().map(|k| k.as_bytes()).collect() }.encode(&mut get);
    let mut trickle = raw(&server, true);
    trickle.write_all(&get).unwrap();
    assert!(stats_until(&server, |s| s.buffered_bytes > 16 << 20).buffered_bytes > 16 << 20, "the reply is held");
    // It reads steadily (64 KiB every 20 ms), fast enough that the server's writes keep making
    // progress, far too slowly to take 32 MiB within the 2 s allowed.
    let mut chunk = vec![0u8; 64 << 10];
    let started = Instant::now();
    let mut received = 0;
    while server.stats().dropped == 0 && started.elapsed() < 8 * SECOND {
        match trickle.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => received += n,
        }
        thread::sleep(Duration::from_millis(20));
    }
    let elapsed = started.elapsed();
    assert!(elapsed < 5 * SECOND, "the connection was still open after {elapsed:?} ({received} bytes read)");
    assert!(received > 0 && received < 32 << 20, "{received} bytes read");
    assert!(closed_by_server(&mut trickle));
    let stats = stats_until(&server, |s| s.dropped == 1 && s.buffered_bytes == 0);
    assert_eq!((stats.dropped, stats.buffered_bytes), (1, 0), "{:?}", stats.events);
    let events = stats.events.join("\n");
    assert!(events.contains("its replies were not all read within 2s of being queued"), "{events}");
    // The budget it held is back: an honest client's MULTI_GET of the same 32 MiB fits.
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(honest.multi_get(&refs).unwrap(), values);
    assert_eq!(server.stats().dropped, 1);
}

#[test]
fn a_reply_waits_for_budget_that_another_connection_holds() {
    // Before: a reply that did not fit the shared budget closed its connection at once, however
    // promptly its client read: a rank's GET of a large value failed while other ranks' replies
    // were still on their way (a 1 MiB broadcast to tens of ranks on other nodes), or while a few
    // clients that do not read held the budget. Now the request waits, and its connection reads
    // nothing more, until budget comes back: here when the client that does not read is dropped.
    let (server, mut honest, keys, values) = large_values();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut get = Vec::new();
    Request::MultiGet { keys: refs.iter().map(|k| k.as_bytes()).collect() }.encode(&mut get);
    let mut hog = raw(&server, true);
    hog.write_all(&get).unwrap();
    assert!(stats_until(&server, |s| s.buffered_bytes > 16 << 20).buffered_bytes > 16 << 20, "the reply is held");
    // Half a second between the hog's deadline and the honest request's: the server closes the
    // hog and serves the waiting request before it checks waiting requests against their
    // deadlines, however late it wakes up, but the test does not rest on that alone.
    thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    assert_eq!(honest.multi_get(&refs).unwrap(), values);
    let stats = server.stats();
    assert_eq!(stats.dropped, 1, "only the client that does not read: {:?}", stats.events);
    let events = stats.events.join("\n");
    assert!(events.contains("its replies were not all read within 2s of being queued"), "{events}");
    // Served when the hog is dropped (about 1.5 s), long before the client's own 5 s timeout.
    assert!(started.elapsed() < 4 * SECOND, "{:?}", started.elapsed());
    assert!(closed_by_server(&mut hog));
}

/// Length fields the server's thread has read so far (published before it waits for events
/// again: a reply received means that the fields of the requests before it are counted).
fn lengths_read(server: &StoreServer) -> u64 {
    lock(&server.shared).lengths_read
}

#[test]
fn a_request_that_arrives_in_many_pieces_is_read_a_bounded_number_of_times() {
    // Before: every piece that completed a field made the server decode the whole request again
    // from its start, so a CHECK of 4096 keys sent a key at a time cost about 8 million key
    // reads on the store's only thread (and one sent at once beyond the connection's allowance
    // was read a key at a time too); a few such connections stalled every other client. Now a
    // request is checked from where the last look stopped and decoded once whole.
    let server = serve(Limits::default());
    let keys: Vec<Vec<u8>> = (0..4096).map(|i| format!("/k{i:04}").into_bytes()).collect();
    let mut check = Vec::new();
    Request::Check { keys: keys.iter().map(Vec::as_slice).collect() }.encode(&mut check);
    let mut ping = Vec::new();
    Request::Ping { nonce: 7 }.encode(&mut ping);
    let mut stream = validated(&server, 1).remove(0);
    stream.set_read_timeout(Some(10 * SECOND)).unwrap();
    let fields = 1 + keys.len() as u64;
    for trickle in [false, true] {
        let before = lengths_read(&server);
        if trickle {
            // The count, then one key per write, pausing now and then so that the server reads
            // the request in many pieces however loaded the machine is.
            stream.write_all(&check[..9]).unwrap();
            for (index, piece) in check[9..].chunks(8 + 6).enumerate() {
                stream.write_all(piece).unwrap();
                if index % 64 == 63 {
                    thread::sleep(Duration::from_millis(1));
                }
            }
        } else {
            stream.write_all(&check).unwrap();
        }
        stream.write_all(&ping).unwrap();
        let mut reply = [0u8; 5];
        stream.read_exact(&mut reply).unwrap();
        assert_eq!(reply, [CHECK_NOT_READY, 7, 0, 0, 0]);
        let read = lengths_read(&server) - before;
        // Checked once and decoded once, and a field read again where a piece ended.
        assert!(read <= 3 * fields, "{read} length fields read for a request of {fields} (trickled: {trickle})");
    }
    assert_eq!(server.stats().dropped, 0);
}

/// A connection to `to` from `from`, one of the loopback addresses (Linux's loopback takes every
/// address of 127.0.0.0/8), so that one machine's test has clients of two addresses.
#[cfg(target_os = "linux")]
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let sockaddr = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    let SocketAddr::V4(to) = to else { panic!("{to} is not an IPv4 address") };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: socket(2) takes no pointers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", io::Error::last_os_error());
    // SAFETY: `fd` is a socket just opened here and owned by nothing else; the stream takes it
    // over and closes it.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let (local, remote) = (sockaddr(from, 0), sockaddr(*to.ip(), to.port()));
    // SAFETY: `local` is an initialized sockaddr_in of `len` bytes, read only during the call.
    let bound = unsafe { libc::bind(fd, (&raw const local).cast(), len) };
    assert_eq!(bound, 0, "bind {from}: {}", io::Error::last_os_error());
    // SAFETY: as above, for `remote`.
    let connected = unsafe { libc::connect(fd, (&raw const remote).cast(), len) };
    assert_eq!(connected, 0, "connect {to} from {from}: {}", io::Error::last_os_error());
    stream
}

#[test]
#[cfg(target_os = "linux")]
fn one_address_s_waits_cannot_hold_the_budget_that_other_clients_need() {
    if TcpListener::bind("127.0.0.2:0").is_err() {
        eprintln!("skipped: the loopback does not take 127.0.0.2 here");
        return;
    }
    // Before: a stranger's connections (from 127.0.0.2) waiting for keys that never come held
    // the whole shared budget for ever (a pending WAIT has no deadline, and a connection that
    // used the store is never evicted); an honest client's WAIT for 100 keys, and rank 0's for
    // 512 claims, were then refused and their connections closed. Now one address's pending
    // WAITs hold at most `max_wait_bytes_per_peer`: the stranger's excess connections are closed.
    let limits = Limits::default();
    let server = serve(limits.clone());
    let stranger = Ipv4Addr::new(127, 0, 0, 2);
    let keys: Vec<Vec<u8>> = (0..4096).map(|i| format!("/never/{i:06}").into_bytes()).collect();
    // 40 connections, each waiting for `n` of the keys: how many of them the server kept.
    let attack = |n: usize| {
        let mut bytes = Vec::new();
        Request::Validate { magic: codec::VALIDATION_MAGIC }.encode(&mut bytes);
        Request::Wait { keys: keys[..n].iter().map(Vec::as_slice).collect() }.encode(&mut bytes);
        Request::Ping { nonce: 7 }.encode(&mut bytes);
        let mut streams: Vec<TcpStream> = (0..40)
            .map(|_| {
                let mut stream = connect_from(stranger, server.local_addr());
                stream.write_all(&bytes).unwrap();
                stream
            })
            .collect();
        // Each is either served (its PING answered: its wait is pending) or closed.
        let deadline = Instant::now() + 5 * SECOND;
        streams.retain_mut(|stream| {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            stream.set_read_timeout(Some(left)).unwrap();
            let mut reply = [0u8; 4];
            stream.read_exact(&mut reply).is_ok_and(|()| u32::from_le_bytes(reply) == 7)
        });
        streams
    };
    // Waits of about 1.1 MiB (4096 keys of 13 bytes, each counting 2 × 13 + 256 bytes), then
    // of 36 KB, to fill what is left.
    let (large, small) = (4096 * (2 * 13 + 256), 128 * (2 * 13 + 256));
    let mut kept = attack(4096);
    kept.extend(attack(128));
    // An honest client's wait for 100 keys of 41 bytes, and rank 0's for 512 claims, are served.
    let port = server.local_addr().port();
    let honest: Vec<String> = (0..100).map(|i| format!("/honest/{i:033}")).collect();
    let claims: Vec<String> = (0..512).map(|i| format!("/gpucomm/v1/0123456789abcdef/0/g1/rank/{i}")).collect();
    let mut waits = Vec::new();
    for keys in [honest.clone(), claims.clone()] {
        let mut c = StoreClient::connect("127.0.0.1", port, 5 * SECOND).unwrap();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        assert!(!c.wait(&refs, Duration::from_millis(100)).unwrap(), "not yet set");
        waits.push(thread::spawn(move || {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            c.wait(&refs, 5 * SECOND).unwrap()
        }));
    }
    let mut setter = client(&server);
    for key in honest.iter().chain(&claims) {
        setter.set(key, key.as_bytes()).unwrap();
    }
    for wait in waits {
        assert!(wait.join().unwrap());
    }
    let mut rank_0 = client(&server);
    let refs: Vec<&str> = claims.iter().map(String::as_str).collect();
    assert_eq!(rank_0.multi_get(&refs).unwrap().len(), 512);
    // Only the stranger's excess connections were closed: those whose waits passed its
    // address's share.
    let cap = limits.max_wait_bytes_per_peer;
    let expected = cap / large + cap % large / small;
    assert_eq!(kept.len(), expected);
    let stats = server.stats();
    assert_eq!(stats.dropped, 80 - expected as u64, "{:?}", stats.events);
    let events = stats.events.join("\n");
    assert!(events.contains("the pending WAITs of 127.0.0.2 would hold"), "{events}");
    for stream in &mut kept {
        stream.set_read_timeout(Some(5 * SECOND)).unwrap();
        ping(stream);
    }
}

/// Bytes the server moved to drop served requests from the connections' input, and the most
/// requests of one connection it served at one wake-up.
fn drain_counts(server: &StoreServer) -> (u64, usize) {
    let shared = lock(&server.shared);
    (shared.counts.bytes_moved, shared.counts.most_served_at_once)
}

#[test]
fn many_small_requests_at_once_are_served_a_share_at_a_time_each_byte_moved_at_most_once() {
    // Before: the server served every request a read brought (1,600 PINGs fit in the 8 KiB a
    // connection holds) before any other connection's, and each one served moved the rest of the
    // buffer (about 7 MB moved for each 8 KiB read: the square of its requests). Now a
    // connection is served 64 requests at a wake-up, the rest after the others, and what was
    // served is dropped at once when none is left.
    let server = serve(Limits::default());
    let mut flood = validated(&server, 1).remove(0);
    let mut other = validated(&server, 1).remove(0);
    const N: u32 = 20_000;
    let mut pings = Vec::new();
    for nonce in 0..N {
        Request::Ping { nonce }.encode(&mut pings);
    }
    let mut replies = flood.try_clone().unwrap();
    replies.set_read_timeout(Some(30 * SECOND)).unwrap();
    let reader = thread::spawn(move || {
        let mut bytes = vec![0u8; 4 * N as usize];
        replies.read_exact(&mut bytes).unwrap();
        bytes.chunks(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect::<Vec<u32>>()
    });
    flood.write_all(&pings).unwrap();
    // Served meanwhile, and the last requests without any new byte after them.
    ping(&mut other);
    assert_eq!(reader.join().unwrap(), (0..N).collect::<Vec<u32>>());
    let (moved, most) = drain_counts(&server);
    assert!(most <= 64, "{most} requests of one connection served at one wake-up");
    assert!(moved <= pings.len() as u64, "{moved} bytes moved for {} bytes of requests", pings.len());
    assert_eq!(server.stats().dropped, 0);
}

#[test]
#[cfg(target_os = "linux")]
fn announced_lengths_hold_no_budget_and_one_address_holds_at_most_its_share() {
    // Before: the server set the whole announced length of a request aside as soon as its
    // header arrived. A stranger's 18-byte requests announcing 1 MiB each held the whole budget,
    // and an honest client's large WAIT (rank 0's for the claims) closed its connection. Now
    // budget is set aside as bytes arrive, a read at a time, and one address's connections hold
    // at most `max_reserved_per_peer` of it.
    if !more_loopback_addresses() {
        return;
    }
    let limits = Limits {
        max_buffered: 8 << 20,
        max_reserved_per_peer: 2 << 20,
        max_pending_per_peer: 256,
        request_within: 30 * SECOND,
        ..Limits::default()
    };
    let server = serve(limits.clone());
    let stranger = Ipv4Addr::new(127, 0, 0, 2);
    let value = vec![7u8; 1 << 20];
    let mut set = Vec::new();
    Request::Set { key: b"/k", value: &value }.encode(&mut set);
    let header = 1 + 8 + 2 + 8;
    assert_eq!(u64::from_le_bytes(set[header - 8..header].try_into().unwrap()), 1 << 20);
    let attack = |n: usize, sent: usize| -> Vec<TcpStream> {
        let mut bytes = Vec::new();
        Request::Validate { magic: codec::VALIDATION_MAGIC }.encode(&mut bytes);
        bytes.extend_from_slice(&set[..sent]);
        (0..n)
            .map(|_| {
                let mut stream = connect_from(stranger, server.local_addr());
                stream.write_all(&bytes).unwrap();
                stream
            })
            .collect()
    };
    // 32 connections send a header announcing 1 MiB, and nothing more: no budget is set aside.
    let headers = attack(32, header);
    let stats = stats_until(&server, |s| s.validated == 32 && s.buffered_bytes == 32 * header);
    assert_eq!((stats.validated, stats.buffered_bytes, stats.reserved_bytes), (32, 32 * header, 0));
    // 64 more send 16 KiB of the value: once its allowance is full, each would set a read
    // (64 KiB) aside, but only while what the connections ahead of it still need (about 1 MiB
    // each) fits in its address's share beside it: two do, the others wait behind them.
    let partial = attack(64, header + (16 << 10));
    let share = limits.max_reserved_per_peer;
    let stats = stats_until(&server, |s| s.reserved_bytes == 2 * (64 << 10));
    assert_eq!(stats.reserved_bytes, 2 * (64 << 10), "{stats:?}");
    thread::sleep(Duration::from_millis(200));
    assert_eq!(server.stats().reserved_bytes, 2 * (64 << 10));
    // An honest client's WAIT for 4096 keys holds about 1.1 MiB beyond its allowance: it fits.
    let port = server.local_addr().port();
    let keys: Vec<String> = (0..4096).map(|i| format!("/claim/{i:06}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut honest = StoreClient::connect("127.0.0.1", port, 5 * SECOND).unwrap();
    assert!(!honest.wait(&refs, Duration::from_millis(100)).unwrap(), "not yet set");
    let waiter = thread::spawn(move || {
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        honest.wait(&refs, 10 * SECOND).unwrap()
    });
    let mut setter = client(&server);
    setter.set("/big", &value).unwrap();
    for i in 0..4096 {
        setter.set(&format!("/claim/{i:06}"), b"c").unwrap();
    }
    assert!(waiter.join().unwrap());
    assert_eq!(setter.get("/big").unwrap(), value);
    let stats = server.stats();
    assert_eq!(stats.dropped, 0, "{:?}", stats.events);
    assert!(stats.reserved_bytes <= share, "{stats:?}");
    drop((headers, partial));
}

/// Sets `key` to `value` through a raw validated connection from `from` (with one `SET`, or with a
/// `MULTI_SET` of its eight parts under `key/0` to `key/7` when `multi`), then pings it, so that
/// the request has been served when it returns; `Err` when the server closed the connection.
#[cfg(target_os = "linux")]
fn set_from(from: Ipv4Addr, to: SocketAddr, key: &str, value: &[u8], multi: bool) -> io::Result<()> {
    let mut stream = connect_from(from, to);
    stream.set_read_timeout(Some(20 * SECOND))?;
    let mut bytes = Vec::new();
    Request::Validate { magic: codec::VALIDATION_MAGIC }.encode(&mut bytes);
    if multi {
        let keys: Vec<String> = (0..8).map(|i| format!("{key}/{i}")).collect();
        let pairs = keys.iter().zip(value.chunks(value.len() / 8)).map(|(k, v)| (k.as_bytes(), v)).collect();
        Request::MultiSet { pairs }.encode(&mut bytes);
    } else {
        Request::Set { key: key.as_bytes(), value }.encode(&mut bytes);
    }
    Request::Ping { nonce: 9 }.encode(&mut bytes);
    stream.write_all(&bytes)?;
    let mut reply = [0u8; 4];
    stream.read_exact(&mut reply)?;
    assert_eq!(u32::from_le_bytes(reply), 9);
    Ok(())
}

#[test]
#[cfg(target_os = "linux")]
fn large_requests_of_one_address_arriving_together_all_finish() {
    // Before: each large request read beyond its allowance set a read at a time aside, all at
    // once, so six 1 MiB `SET`s from one address split its 2 MiB share between them, none could
    // finish, and all were closed when their `request_within` passed (the ranks of one node
    // writing large values together). Now an address's connections reading beyond their
    // allowance form a line: a later one sets the share aside only while what the earlier ones
    // may still need fits beside it, so the first always finishes. A `MULTI_SET`, a list whose
    // lengths come all through it, counts as the longest request allowed: six of them finish
    // too, one after another.
    let limits = Limits {
        max_buffered: 8 << 20,
        max_reserved_per_peer: 2 << 20,
        max_request_len: 2 << 20,
        request_within: 4 * SECOND,
        ..Limits::default()
    };
    let server = serve(limits);
    let to = server.local_addr();
    let value = |i: usize| vec![i as u8; 1 << 20];
    let from = Ipv4Addr::LOCALHOST;
    for multi in [false, true] {
        let threads: Vec<_> = (0..6)
            .map(|i| {
                let key = format!("/{i}/{multi}");
                thread::spawn(move || set_from(from, to, &key, &value(i), multi).map(|()| key))
            })
            .collect();
        for (i, thread) in threads.into_iter().enumerate() {
            let key = thread.join().unwrap().unwrap_or_else(|e| panic!("set {i}: {e}: {:?}", server.stats().events));
            let mut c = client(&server);
            let got = if multi {
                (0..8).map(|part| c.get(&format!("{key}/{part}")).unwrap()).collect::<Vec<_>>().concat()
            } else {
                c.get(&key).unwrap()
            };
            assert_eq!(got, value(i));
        }
    }
    let stats = stats_until(&server, |s| s.reserved_bytes == 0);
    assert_eq!((stats.dropped, stats.reserved_bytes), (0, 0), "{:?}", stats.events);
}

#[test]
#[cfg(target_os = "linux")]
fn a_wait_that_does_not_fit_the_shared_budget_waits_for_room() {
    // Before: a WAIT whose keys fitted its address's share but not the shared budget closed its
    // connection at once: a stranger's wait and another's half-sent `SET` (from two addresses,
    // each within its share) held the budget, and rank 0's wait for the claims failed the
    // rendezvous. Now it waits for room as a large reply does, within `request_within`: here
    // until the stranger sending the `SET` leaves.
    if TcpListener::bind("127.0.0.3:0").is_err() {
        eprintln!("skipped: the loopback does not take 127.0.0.3 here");
        return;
    }
    let limits = Limits {
        max_buffered: 4 << 20,
        max_wait_bytes_per_peer: 2 << 20,
        max_value_len: 2 << 20,
        request_within: 10 * SECOND,
        ..Limits::default()
    };
    let server = serve(limits);
    let validate = |bytes: &mut Vec<u8>| Request::Validate { magic: codec::VALIDATION_MAGIC }.encode(bytes);
    // A wait for 4096 keys of 121 bytes (each counts 2 × 121 + 256 bytes: 1.95 MiB in all), and
    // 1.9 MiB of a 2 MiB value: less than 112 KiB of the budget is left.
    let keys: Vec<Vec<u8>> = (0..4096).map(|i| format!("/never/{i:0115}").into_bytes()).collect();
    let mut wait = Vec::new();
    validate(&mut wait);
    Request::Wait { keys: keys.iter().map(Vec::as_slice).collect() }.encode(&mut wait);
    let mut waiting = connect_from(Ipv4Addr::new(127, 0, 0, 2), server.local_addr());
    waiting.write_all(&wait).unwrap();
    let wait_bytes = 4096 * (2 * 121 + 256);
    assert!(
        stats_until(&server, |s| s.reserved_bytes >= wait_bytes - (8 << 10)).reserved_bytes >= wait_bytes - (8 << 10)
    );
    let value = vec![1u8; 2 << 20];
    let mut set = Vec::new();
    validate(&mut set);
    Request::Set { key: b"/half", value: &value }.encode(&mut set);
    let sent = set.len() - (100 << 10);
    let mut half = connect_from(Ipv4Addr::new(127, 0, 0, 3), server.local_addr());
    half.write_all(&set[..sent]).unwrap();
    let held = wait_bytes + sent - (16 << 10) - 64;
    let reserved = stats_until(&server, |s| s.reserved_bytes >= held).reserved_bytes;
    // Rank 0's wait for 512 claims (about 170 KB) does not fit beside them.
    let claims: Vec<String> = (0..512).map(|i| format!("/gpucomm/v1/0123456789abcdef/0/g1/rank/{i}")).collect();
    let claim_bytes: usize = claims.iter().map(|claim| 2 * claim.len() + 256).sum();
    assert!(reserved >= held && reserved + claim_bytes > 4 << 20, "{reserved} bytes set aside");
    let mut rank_0 = client(&server);
    let waiter = thread::spawn(move || {
        let refs: Vec<&str> = claims.iter().map(String::as_str).collect();
        rank_0.wait(&refs, 8 * SECOND)
    });
    thread::sleep(Duration::from_millis(500));
    assert_eq!(server.stats().dropped, 0, "{:?}", server.stats().events);
    // The stranger sending the `SET` leaves: the wait is registered, and the claims end it.
    drop(half);
    assert_eq!(stats_until(&server, |s| s.connections == 2).connections, 2);
    let mut setter = client(&server);
    for i in 0..512 {
        setter.set(&format!("/gpucomm/v1/0123456789abcdef/0/g1/rank/{i}"), b"c").unwrap();
    }
    assert!(waiter.join().unwrap().unwrap());
    assert_eq!(server.stats().dropped, 0, "{:?}", server.stats().events);
    drop(waiting);
}

/// The stalled requests served again so far ([`Server::unstall`]).
fn stalled_tries(server: &StoreServer) -> u64 {
    lock(&server.shared).counts.stalled_tries
}

/// A stranger's `WAIT` from 127.0.0.2 for 4096 missing keys of 80 bytes (each counts
/// 2 × 80 + 256 bytes: 1.7 MB of the shared budget), once the server holds it.
fn strangers_wait(server: &StoreServer) -> TcpStream {
    let keys: Vec<Vec<u8>> = (0..4096).map(|i| format!("/never/{i:073}").into_bytes()).collect();
    let mut bytes = Vec::new();
    Request::Validate { magic: codec::VALIDATION_MAGIC }.encode(&mut bytes);
    Request::Wait { keys: keys.iter().map(Vec::as_slice).collect() }.encode(&mut bytes);
    let mut stranger = connect_from(Ipv4Addr::new(127, 0, 0, 2), server.local_addr());
    stranger.write_all(&bytes).unwrap();
    let held = 4096 * (2 * 80 + 256) - (8 << 10);
    assert!(stats_until(server, |s| s.reserved_bytes >= held).reserved_bytes >= held);
    stranger
}

#[test]
#[cfg(target_os = "linux")]
fn a_compare_set_whose_reply_must_wait_for_room_changes_nothing_until_it_fits() {
    // Before: COMPARE_SET swapped the value and then closed its connection when the reply did
    // not fit the shared budget (a GET of the same value waited for room): the client could not
    // tell whether its swap had happened. Its reply's room is now asked for first.
    if !more_loopback_addresses() {
        return;
    }
    let limits = Limits { max_buffered: 5 << 19, ..Limits::default() };
    let server = serve(limits);
    let mut c = client(&server);
    c.set("/big", &[5u8; 1 << 20]).unwrap();
    let stranger = strangers_wait(&server);
    // Of 2.5 MiB, the stranger holds 1.7 MB: a swap that creates a key of 800 KiB (its reply is
    // the new value) can be read but not answered, nor can one that fails and answers with the
    // 1 MiB value in place.
    let create = thread::spawn({
        let mut c = client(&server);
        move || c.compare_set("/new", b"", &[9u8; 800 << 10]).map(|v| v.len())
    });
    let fail = thread::spawn({
        let mut c = client(&server);
        move || c.compare_set("/big", b"x", b"y").map(|v| v.len())
    });
    thread::sleep(Duration::from_millis(300));
    assert!(!c.check(&["/new"]).unwrap(), "the swap happened before its reply had room");
    drop(stranger);
    assert_eq!(create.join().unwrap().unwrap(), 800 << 10);
    assert_eq!(fail.join().unwrap().unwrap(), 1 << 20);
    assert_eq!(c.get("/new").unwrap().len(), 800 << 10);
    assert_eq!(server.stats().dropped, 0, "{:?}", server.stats().events);
}

#[test]
#[cfg(target_os = "linux")]
fn a_stalled_request_is_not_served_again_at_every_wake_up() {
    // Before: every stalled request was decoded and served again at each wake-up of the server
    // (any byte from anyone): many connections' stalled WAITs of many keys made each request of
    // an honest client cost milliseconds. One is now served again when the room it lacked is
    // there, or the store changed.
    if !more_loopback_addresses() {
        return;
    }
    let server = serve(Limits { max_buffered: 5 << 19, ..Limits::default() });
    let mut c = client(&server);
    c.set("/big", &[5u8; 1 << 20]).unwrap();
    let stranger = strangers_wait(&server);
    let getter = thread::spawn({
        let mut c = client(&server);
        move || c.get("/big").map(|v| v.len())
    });
    thread::sleep(Duration::from_millis(300));
    let before = stalled_tries(&server);
    let mut honest = raw(&server, true);
    for _ in 0..50 {
        ping(&mut honest);
    }
    assert_eq!(stalled_tries(&server), before, "the stalled GET was served again for others' pings");
    // A change of the store serves it again (it may need less now), and room serves it.
    c.set("/other", b"x").unwrap();
    let deadline = Instant::now() + 5 * SECOND;
    while stalled_tries(&server) == before {
        assert!(Instant::now() < deadline, "a change of the store did not serve the stalled GET again");
        thread::sleep(Duration::from_millis(10));
    }
    drop(stranger);
    assert_eq!(getter.join().unwrap().unwrap(), 1 << 20);
}

#[test]
#[cfg(target_os = "linux")]
fn a_stalled_list_counts_its_length_in_its_addresss_line() {
    // Before: a MULTI_GET (or WAIT) that waited for room for its reply counted in its address's
    // line as the longest request allowed (a list's length is not known before it is whole),
    // although it had arrived whole: another connection of the address could read no more than
    // its allowance until the stall ended, or `request_within` closed it.
    if !more_loopback_addresses() {
        return;
    }
    let limits = Limits { max_buffered: 2 << 20, max_reserved_per_peer: 4 << 20, ..Limits::default() };
    let server = serve(limits);
    let mut c = client(&server);
    c.set("/v", &[1u8; 100]).unwrap();
    let stranger = strangers_wait(&server);
    // 41 KB asking for a 442 KB reply, which does not fit beside the stranger's 1.7 MB.
    let mut bytes = Vec::new();
    Request::Validate { magic: codec::VALIDATION_MAGIC }.encode(&mut bytes);
    Request::MultiGet { keys: vec![&b"/v"[..]; 4096] }.encode(&mut bytes);
    let mut stalled = raw(&server, false);
    stalled.write_all(&bytes).unwrap();
    thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    set_from(Ipv4Addr::LOCALHOST, server.local_addr(), "/w", &[2u8; 100_000], false).unwrap();
    assert!(started.elapsed() < 2 * SECOND, "the SET waited {:?} behind the stalled list", started.elapsed());
    drop(stranger);
    let mut reply = vec![0u8; 4096 * 108];
    stalled.read_exact(&mut reply).unwrap();
}

#[test]
fn a_reply_the_protocol_does_not_allow_leaves_the_client_out_of_step() {
    // Before: a wrong reply in a batch of DELETE_KEYs failed the call but left the connection
    // usable, and the batch's other replies were read as the next call's.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let fake = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        // VALIDATE (5 bytes) and PING (5 bytes): the nonce echoed.
        let mut hello = [0u8; 10];
        stream.read_exact(&mut hello).unwrap();
        stream.write_all(&hello[6..]).unwrap();
        // Two DELETE_KEYs: a reply no store gives, then one that looks like the next call's.
        let mut deletes = vec![0u8; 2 * (1 + 8 + 2)];
        stream.read_exact(&mut deletes).unwrap();
        stream.write_all(&7i64.to_le_bytes()).unwrap();
        stream.write_all(&7u32.to_le_bytes()).unwrap();
        stream.write_all(&[0; 4]).unwrap();
        thread::sleep(Duration::from_millis(500));
    });
    let mut c = StoreClient::connect("127.0.0.1", port, 5 * SECOND).unwrap();
    let error = c.delete_keys(&["/a", "/b"]).unwrap_err();
    assert!(matches!(error, StoreError::Protocol { op: "DELETE_KEY", .. }), "{error}");
    assert!(matches!(c.ping(), Err(StoreError::Broken { .. })));
    fake.join().unwrap();
}
