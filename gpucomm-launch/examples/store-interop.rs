//! This crate's TCPStore against PyTorch's, both ways (driven by `gpucomm-launch/gpu/store_interop.py`
//! on a machine with PyTorch; needs no GPU).
//!
//! * `store-interop serve PORT [SECONDS]`: hosts a [`StoreServer`] on 127.0.0.1:PORT until a
//!   client sets the key `/interop/stop` (Python: `store.set("interop/stop", …)`) or SECONDS
//!   (default 60) pass; prints `serving on 127.0.0.1:PORT`, then what it saw.
//! * `store-interop client HOST PORT`: every operation against a TCPStore that someone else
//!   hosts (Python: `TCPStore(host, port, is_master=True)`), each result checked; it reads
//!   `/py/greeting` (Python: `store.set("py/greeting", b"hello from python")`) and leaves
//!   `/rust/greeting` and `/rust/counter` for the Python side to check. Prints one line per
//!   operation and `ok: N operations checked against HOST:PORT`.

use std::error::Error;
use std::time::{Duration, Instant};

use gpucomm_launch::store::{Limits, StoreClient, StoreServer};

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["serve", port] => serve(port.parse()?, 60),
        ["serve", port, seconds] => serve(port.parse()?, seconds.parse()?),
        ["client", host, port] => client(host, port.parse()?),
        _ => Err("usage: store-interop serve PORT [SECONDS] | store-interop client HOST PORT".into()),
    }
}

fn serve(port: u16, seconds: u64) -> Result<(), Box<dyn Error>> {
    let server = StoreServer::bind(format!("127.0.0.1:{port}").parse()?, Limits::default())?;
    println!("serving on {}", server.local_addr());
    let mut watcher = StoreClient::connect("127.0.0.1", port, Duration::from_secs(10))?;
    let stopped = watcher.wait(&["/interop/stop"], Duration::from_secs(seconds))?;
    let stats = server.stats();
    println!(
        "{}: {} connections accepted, {} keys, {} dropped by the server, events {:?}",
        if stopped { "stopped by the client" } else { "timed out" },
        stats.accepted,
        stats.keys,
        stats.dropped,
        stats.events
    );
    if stopped {
        Ok(())
    } else {
        Err("no client set /interop/stop in time".into())
    }
}

/// Counts and prints checked operations.
struct Checks(usize);

impl Checks {
    fn check<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, got: T, expected: T) -> Result<(), Box<dyn Error>> {
        if got != expected {
            return Err(format!("{what}: got {got:?}, expected {expected:?}").into());
        }
        self.0 += 1;
        println!("ok {what}: {got:?}");
        Ok(())
    }
}

fn client(host: &str, port: u16) -> Result<(), Box<dyn Error>> {
    let mut c = StoreClient::connect(host, port, Duration::from_secs(10))?;
    let mut ok = Checks(0);
    ok.check("connect (VALIDATE, PING) and PING again", c.ping()?, ())?;
    let before = c.num_keys()?;
    ok.check("GET of Python's key", c.get("/py/greeting")?, b"hello from python".to_vec())?;
    c.set("/rust/greeting", b"hello from rust")?;
    ok.check("SET then GET", c.get("/rust/greeting")?, b"hello from rust".to_vec())?;
    ok.check("ADD", c.add("/rust/counter", 40)?, 40)?;
    ok.check("ADD again", c.add("/rust/counter", 2)?, 42)?;
    ok.check("COMPARE_SET on a missing key, empty expected", c.compare_set("/rust/cas", b"", b"v1")?, b"v1".to_vec())?;
    ok.check("COMPARE_SET with the wrong expected", c.compare_set("/rust/cas", b"nope", b"v2")?, b"v1".to_vec())?;
    ok.check("COMPARE_SET with the right expected", c.compare_set("/rust/cas", b"v1", b"v3")?, b"v3".to_vec())?;
    ok.check("CHECK of existing keys", c.check(&["/rust/greeting", "/py/greeting"])?, true)?;
    ok.check("CHECK with a missing key", c.check(&["/rust/greeting", "/rust/missing"])?, false)?;
    ok.check("WAIT for an existing key", c.wait(&["/rust/cas"], Duration::from_secs(5))?, true)?;
    let started = Instant::now();
    let waited = c.wait(&["/rust/missing"], Duration::from_millis(300))?;
    ok.check(
        "WAIT for a missing key times out, CANCEL_WAIT",
        (waited, started.elapsed() < Duration::from_secs(3)),
        (false, true),
    )?;
    ok.check("the connection is still in step after the cancel", c.get("/rust/cas")?, b"v3".to_vec())?;
    c.append("/rust/log", b"ab")?;
    c.append("/rust/log", b"cd")?;
    ok.check("APPEND twice", c.get("/rust/log")?, b"abcd".to_vec())?;
    c.multi_set(&[("/rust/m1", b"one"), ("/rust/m2", b"")])?;
    ok.check(
        "MULTI_SET then MULTI_GET",
        c.multi_get(&["/rust/m1", "/rust/m2", "/rust/log"])?,
        vec![b"one".to_vec(), vec![], b"abcd".to_vec()],
    )?;
    ok.check("GETNUMKEYS counts the 6 new keys", c.num_keys()? - before, 6)?;
    ok.check("DELETE_KEY of an existing key", c.delete_key("/rust/m1")?, true)?;
    ok.check("DELETE_KEY of a missing key", c.delete_key("/rust/m1")?, false)?;
    ok.check("GETNUMKEYS after the delete", c.num_keys()? - before, 5)?;
    println!("ok: {} operations checked against {host}:{port}", ok.0);
    Ok(())
}
