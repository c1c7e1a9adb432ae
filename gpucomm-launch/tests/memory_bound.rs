//! Issue 14, scenario "memory": 200 connections each send an unfinished 1 MiB request. The
//! server's accounted bytes stay under its stated bound, the process's resident memory does
//! not grow by anything like 200 MiB, and a real client is still served. A file of its own, so
//! that the measurement sees only this test.

mod common;

use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use gpucomm_launch::store::codec::{Request, VALIDATION_MAGIC};
use gpucomm_launch::store::{Limits, StoreServer};

#[test]
fn memory_stays_bounded_under_200_unfinished_1mib_messages() {
    // All 200 connect at once: more than the default caps on connections that have not validated
    // yet (64, 8 from one address: most would be closed or turned away before they could
    // validate).
    let limits = Limits {
        max_buffered: 16 << 20,
        request_within: Duration::from_secs(3),
        max_pending: 256,
        max_pending_per_peer: 256,
        ..Limits::default()
    };
    let bound = limits.buffered_bound();
    assert_eq!(bound, (16 << 20) + 1024 * (8 << 10));
    let server = StoreServer::bind("127.0.0.1:0".parse().unwrap(), limits.clone()).unwrap();
    let addr = server.local_addr();
    let before = resident();
    // Each connection validates, then starts a SET of a 1 MiB value and stops 1 byte short.
    let value = vec![0x5a; 1 << 20];
    let mut head = Vec::new();
    Request::Validate { magic: VALIDATION_MAGIC }.encode(&mut head);
    Request::Set { key: b"/flood", value: &value }.encode(&mut head);
    let message = &head[..head.len() - 1];
    let mut conns: Vec<(TcpStream, usize)> = (0..200)
        .map(|_| {
            let s = TcpStream::connect(addr).unwrap();
            s.set_nonblocking(true).unwrap();
            (s, 0)
        })
        .collect();
    // Push as much of every message as the sockets take, for a while.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        for (stream, sent) in conns.iter_mut() {
            match stream.write(&message[*sent..]) {
                Ok(n) => *sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        thread::sleep(Duration::from_millis(5));
    }
    let pushed: usize = conns.iter().map(|(_, sent)| sent).sum();
    let stats = server.stats();
    let grown = resident().saturating_sub(before);
    println!(
        "200 unfinished 1 MiB SETs: {pushed} bytes sent, server holds {} (peak {}, bound {bound}), resident memory grew by {grown}",
        stats.buffered_bytes, stats.peak_buffered_bytes
    );
    assert!(pushed > 20 << 20, "the flood was real: {pushed} bytes");
    assert_eq!(stats.connections, 200);
    assert!(stats.peak_buffered_bytes <= bound, "{stats:?}");
    assert!(grown < 64 << 20, "resident memory grew by {grown} bytes");
    // A real client is served meanwhile (small requests fit in every connection's allowance).
    let mut client = store_client(addr.port());
    client.set("/real", b"served").unwrap();
    assert_eq!(client.get("/real").unwrap(), b"served");
    // Past their deadline, the unfinished requests are dropped and their memory released.
    until(|| server.stats().dropped == 200);
    let stats = server.stats();
    assert_eq!((stats.buffered_bytes, stats.keys), (0, 1));
    assert!(stats.events.iter().all(|e| e.contains("a request did not arrive within 3s")), "{:?}", stats.events);
}
