//! The memory bound under pending `WAIT`s (audit, session 14): 1000 connections each wait for
//! 600 keys of their own, which never appear. A waited key costs the server more than its bytes
//! (its copy in the wait, its entry in the table of waiters, the list of connections waiting for
//! it); the server once counted only the bytes, so every one of these waits fitted in its
//! connection's 8 KiB allowance while it held about 150 KiB, and the process grew by about
//! 150 MB against a stated bound of 24 MiB. A file of its own, so that the measurement sees only
//! this test.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use common::*;
use gpucomm_launch::store::codec::{Request, VALIDATION_MAGIC};
use gpucomm_launch::store::{Limits, StoreServer};

/// Raises this process's file-descriptor limit to `wanted` (or as far as the hard limit allows),
/// and returns it.
fn raise_descriptor_limit(wanted: libc::rlim_t) -> libc::rlim_t {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write one rlimit struct, a live local.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_cur.max(wanted.min(limit.rlim_max));
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    limit.rlim_cur
}

#[test]
fn memory_stays_bounded_under_1000_waits_for_600_keys_each() {
    // Two descriptors per connection (both ends live in this process), and room to spare.
    let room = raise_descriptor_limit(2400);
    let connections = 1000.min((room as usize).saturating_sub(200) / 2);
    assert!(connections >= 400, "too few file descriptors for the test: {room}");
    // All from 127.0.0.1: more than the default cap on connections from one address (256).
    let limits = Limits { max_buffered: 16 << 20, max_pending: 2000, max_per_peer: 2000, ..Limits::default() };
    let bound = limits.buffered_bound();
    let server = StoreServer::bind("127.0.0.1:0".parse().unwrap(), limits).unwrap();
    let addr = server.local_addr();
    // Each request fits in a connection's allowance, so the server reads it at once.
    let messages: Vec<Vec<u8>> = (0..connections as u32)
        .map(|c| {
            let keys: Vec<[u8; 6]> = (0..600u16)
                .map(|k| {
                    let (c, k) = (c.to_le_bytes(), k.to_le_bytes());
                    [c[0], c[1], c[2], c[3], k[0], k[1]]
                })
                .collect();
            let mut message = Vec::new();
            Request::Validate { magic: VALIDATION_MAGIC }.encode(&mut message);
            Request::Wait { keys: keys.iter().map(|k| k.as_slice()).collect() }.encode(&mut message);
            message
        })
        .collect();
    let before = resident();
    let conns: Vec<TcpStream> = messages
        .iter()
        .map(|message| {
            let mut stream = TcpStream::connect(addr).unwrap();
            // The server closes the connections whose wait it refuses; a write may then fail.
            let _ = stream.write_all(message);
            stream
        })
        .collect();
    thread::sleep(Duration::from_secs(2));
    let stats = server.stats();
    let grown = resident().saturating_sub(before);
    println!(
        "{connections} waits for 600 keys: server holds {} (peak {}, bound {bound}), {} connections dropped, \
         resident memory grew by {grown}",
        stats.buffered_bytes, stats.peak_buffered_bytes, stats.dropped
    );
    assert!(stats.peak_buffered_bytes <= bound, "{stats:?}");
    assert!(grown < 64 << 20, "resident memory grew by {grown} bytes");
    // A real client is served meanwhile.
    let mut client = store_client(addr.port());
    client.set("/real", b"served").unwrap();
    assert_eq!(client.get("/real").unwrap(), b"served");
    drop(conns);
}
