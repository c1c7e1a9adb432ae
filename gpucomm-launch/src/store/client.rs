//! [`StoreClient`]: a blocking TCPStore client with one deadline per operation.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::codec::{self, Request, CHECK_NOT_READY, CHECK_READY, VALIDATION_MAGIC, WAIT_CANCELED, WAIT_STOP};
use super::{Limits, StoreError};
use crate::deadline::Deadline;

const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The limit of one connection attempt; more follow until the deadline.
const ATTEMPT: Duration = Duration::from_secs(2);
/// Keys one round trip of [`StoreClient::delete_keys`] deletes at most: their replies (8 bytes
/// each, 4 KiB) stay far below the unread bytes a store lets one client have.
const DELETE_CHUNK: usize = 512;

/// A connection to a TCPStore: PyTorch's (`torch.distributed.TCPStore`, either server backend),
/// or this crate's [`StoreServer`](super::StoreServer).
///
/// Every operation has one deadline, [`timeout`](StoreClient::timeout) from its start, however
/// slowly the store's bytes arrive: the time left is recomputed before every read and write. A
/// request over the client's [`Limits`] is refused before anything is sent, and a reply longer
/// than `max_value_len` (`max_reply_len` for [`multi_get`](StoreClient::multi_get)) fails before
/// anything is allocated for it.
///
/// Keys are used exactly as given. PyTorch's Python `TCPStore` puts `/` in front of every key:
/// to read what Python stored with `store.set("weights", …)`, ask for `"/weights"`.
///
/// After an operation fails in the middle of a message (a timeout, a closed connection), the
/// connection is out of step and every later call fails with [`StoreError::Broken`]; a timed-out
/// [`wait`](StoreClient::wait) is canceled cleanly and leaves it usable, unless the cancellation
/// itself cannot be sent and confirmed in time (the store may still answer the wait).
#[derive(Debug)]
pub struct StoreClient {
    stream: TcpStream,
    addr: String,
    timeout: Duration,
    limits: Limits,
    broken: bool,
}

/// The addresses of `host` (a name or an address literal), asked of the system's resolver
/// (`getaddrinfo`) on a thread of its own, so that a slow resolver cannot stretch `deadline` by
/// its own timeouts: past the deadline that thread is left to finish alone and the connection
/// fails. An address literal needs no resolver.
fn resolve_by(host: &str, port: u16, deadline: Deadline) -> Result<Vec<SocketAddr>, String> {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = host.to_string();
    std::thread::Builder::new()
        .name("gpucomm-resolve".into())
        .spawn(move || {
            let _ = tx.send((name.as_str(), port).to_socket_addrs().map(Iterator::collect::<Vec<_>>));
        })
        .map_err(|e| format!("cannot start a thread to resolve it: {e}"))?;
    match rx.recv_timeout(deadline.remaining().unwrap_or(Duration::ZERO)) {
        Ok(resolved) => resolved.map_err(|e| e.to_string()),
        Err(_) => Err(format!("the resolver gave no answer within {:?}", deadline.limit())),
    }
}

impl StoreClient {
    /// Connects to the store at `host:port` and sends what PyTorch's client sends first
    /// (`VALIDATE`, then `PING`), retrying refused or failed attempts with a growing pause until
    /// `timeout` has passed (the store may start later). A host that does not resolve fails at
    /// once, and so does one the resolver has not answered for within `timeout`. `timeout` also
    /// becomes the limit of each later operation.
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<StoreClient, StoreError> {
        StoreClient::connect_with(host, port, timeout, Limits::default())
    }

    /// [`StoreClient::connect`] with other [`Limits`] for requests and replies.
    pub fn connect_with(host: &str, port: u16, timeout: Duration, limits: Limits) -> Result<StoreClient, StoreError> {
        StoreClient::connect_by(host, port, Deadline::after(timeout), timeout, limits)
    }

    /// Connects before `deadline`; `timeout` is the limit of later operations.
    pub(crate) fn connect_by(
        host: &str,
        port: u16,
        deadline: Deadline,
        timeout: Duration,
        limits: Limits,
    ) -> Result<StoreClient, StoreError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let shown = if bare.contains(':') { format!("[{bare}]:{port}") } else { format!("{bare}:{port}") };
        let addrs =
            resolve_by(bare, port, deadline).map_err(|error| StoreError::Resolve { host: host.to_string(), error })?;
        if addrs.is_empty() {
            return Err(StoreError::Resolve { host: host.to_string(), error: "it resolves to no address".into() });
        }
        let mut backoff = FIRST_BACKOFF;
        let mut last_error = String::from("no attempt was made");
        loop {
            for addr in &addrs {
                let Some(left) = deadline.remaining() else { break };
                let stream = match TcpStream::connect_timeout(addr, left.min(ATTEMPT)) {
                    Ok(stream) => stream,
                    Err(e) => {
                        last_error = format!("{addr}: {e}");
                        continue;
                    }
                };
                let mut client =
                    StoreClient { stream, addr: shown.clone(), timeout, limits: limits.clone(), broken: false };
                match client.handshake(deadline.min(Deadline::after(timeout))) {
                    Ok(()) => return Ok(client),
                    // Another service on the port: waiting will not change that.
                    Err(error @ StoreError::Protocol { .. }) => return Err(error),
                    Err(error) => last_error = error.to_string(),
                }
            }
            let Some(left) = deadline.remaining() else {
                return Err(StoreError::Unreachable { addr: shown, waited: deadline.limit(), last_error });
            };
            std::thread::sleep(backoff.min(left));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn handshake(&mut self, deadline: Deadline) -> Result<(), StoreError> {
        self.stream.set_nodelay(true).map_err(|error| self.io("connect", error))?;
        self.send("VALIDATE", &Request::Validate { magic: VALIDATION_MAGIC }, deadline)?;
        self.ping_by(deadline)
    }

    /// The store's address as given (`host:port`).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// This end's address (the one the store sees).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.stream.local_addr().ok()
    }

    /// The limit of each operation.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Changes the limit of each later operation.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn deadline(&self) -> Deadline {
        Deadline::after(self.timeout)
    }

    /// `SET`: stores `value` under `key`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.set_by(key, value, self.deadline())
    }

    pub(crate) fn set_by(&mut self, key: &str, value: &[u8], deadline: Deadline) -> Result<(), StoreError> {
        self.send("SET", &Request::Set { key: key.as_bytes(), value }, deadline)
    }

    /// `GET`: the value of `key`. A missing key gives an empty value from PyTorch's default
    /// server and from [`StoreServer`](super::StoreServer), while PyTorch's older server closes
    /// the connection: [`wait`](StoreClient::wait) for a key before reading it.
    pub fn get(&mut self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.get_by(key, self.deadline())
    }

    pub(crate) fn get_by(&mut self, key: &str, deadline: Deadline) -> Result<Vec<u8>, StoreError> {
        self.send("GET", &Request::Get { key: key.as_bytes() }, deadline)?;
        self.read_value("GET", self.limits.max_value_len, deadline)
    }

    /// `ADD`: adds `delta` to the number stored (as decimal text) under `key`, 0 if missing, and
    /// returns the sum.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.add_by(key, delta, self.deadline())
    }

    pub(crate) fn add_by(&mut self, key: &str, delta: i64, deadline: Deadline) -> Result<i64, StoreError> {
        self.send("ADD", &Request::Add { key: key.as_bytes(), delta }, deadline)?;
        Ok(i64::from_le_bytes(self.read_array("ADD", deadline)?))
    }

    /// `COMPARE_SET`: stores `desired` if `key` holds `expected` (or is missing and `expected`
    /// is empty); returns the value afterwards. With a missing key and a non-empty `expected`,
    /// PyTorch's servers answer `expected` and store nothing, and so does this crate's.
    pub fn compare_set(&mut self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.compare_set_by(key, expected, desired, self.deadline())
    }

    pub(crate) fn compare_set_by(
        &mut self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
        deadline: Deadline,
    ) -> Result<Vec<u8>, StoreError> {
        self.send("COMPARE_SET", &Request::CompareSet { key: key.as_bytes(), expected, desired }, deadline)?;
        self.read_value("COMPARE_SET", self.limits.max_value_len, deadline)
    }

    /// `CHECK`: true when every key exists.
    pub fn check(&mut self, keys: &[&str]) -> Result<bool, StoreError> {
        self.check_by(keys, self.deadline())
    }

    pub(crate) fn check_by(&mut self, keys: &[&str], deadline: Deadline) -> Result<bool, StoreError> {
        self.send("CHECK", &Request::Check { keys: bytes_of(keys) }, deadline)?;
        match self.read_array::<1>("CHECK", deadline)?[0] {
            CHECK_READY => Ok(true),
            CHECK_NOT_READY => Ok(false),
            other => Err(self.out_of_step("CHECK", format!("reply byte {other}, expected 0 or 1"))),
        }
    }

    /// `WAIT`: returns `true` once every key exists, or `false` when `timeout` passes first (the
    /// wait is then canceled with `CANCEL_WAIT`, as PyTorch's client does, and the connection
    /// stays usable). The whole operation, cancellation included, is bounded by `timeout` plus
    /// the client's [`timeout`](StoreClient::timeout): a cancellation that cannot be sent and
    /// confirmed within it (a client timeout of zero, a stalled store) fails the call and leaves
    /// the connection broken, since the store may still answer the wait.
    ///
    /// `true` may come early from PyTorch's libuv server (its default since 2.4): it ends the
    /// waits for a key when a `COMPARE_SET` with a non-empty expected value names the key, though
    /// the key does not exist (and it stores nothing). Check a key that reads empty before taking
    /// it for one that exists, as the rendezvous does.
    pub fn wait(&mut self, keys: &[&str], timeout: Duration) -> Result<bool, StoreError> {
        let io = Deadline::after(timeout.saturating_add(self.timeout));
        self.wait_by(keys, Deadline::after(timeout), io)
    }

    /// `WAIT` until `until`; the whole operation, cancellation included, ends by `io`.
    pub(crate) fn wait_by(&mut self, keys: &[&str], until: Deadline, io: Deadline) -> Result<bool, StoreError> {
        self.send("WAIT", &Request::Wait { keys: bytes_of(keys) }, io)?;
        match self.read_byte_by("WAIT", until.min(io)) {
            Ok(WAIT_STOP) => return Ok(true),
            Ok(other) => return Err(self.out_of_step("WAIT", format!("reply byte {other}, expected 0"))),
            Err(error) if error.is_timeout() => {}
            Err(error) => return Err(error),
        }
        // Not ready in time: cancel. The store may have ended the wait just before. Until the
        // cancellation is confirmed the store may still answer the WAIT, so a cancellation that
        // cannot be sent leaves the connection out of step, as one that is not confirmed does.
        if let Err(error) = self.send("CANCEL_WAIT", &Request::CancelWait, io) {
            return Err(self.fail(error));
        }
        match self.read_array::<1>("CANCEL_WAIT", io)?[0] {
            WAIT_CANCELED => Ok(false),
            WAIT_STOP => match self.read_array::<1>("CANCEL_WAIT", io)?[0] {
                WAIT_CANCELED => Ok(true),
                other => Err(self.out_of_step("CANCEL_WAIT", format!("reply byte {other}, expected 1"))),
            },
            other => Err(self.out_of_step("CANCEL_WAIT", format!("reply byte {other}, expected 0 or 1"))),
        }
    }

    /// `GETNUMKEYS`: how many keys the store holds (PyTorch's count includes its own keys).
    pub fn num_keys(&mut self) -> Result<i64, StoreError> {
        let deadline = self.deadline();
        self.send("GETNUMKEYS", &Request::GetNumKeys, deadline)?;
        Ok(i64::from_le_bytes(self.read_array("GETNUMKEYS", deadline)?))
    }

    /// `DELETE_KEY`: true if the key existed.
    pub fn delete_key(&mut self, key: &str) -> Result<bool, StoreError> {
        Ok(self.delete_keys_by(&[key], self.deadline())? == 1)
    }

    /// Several `DELETE_KEY`s in one round trip per 512 keys (the requests of a
    /// chunk are sent together, then their replies read, so that the replies waiting in the
    /// store stay far below what it lets one client leave unread); returns how many keys
    /// existed.
    pub fn delete_keys(&mut self, keys: &[&str]) -> Result<usize, StoreError> {
        self.delete_keys_by(keys, self.deadline())
    }

    pub(crate) fn delete_keys_by(&mut self, keys: &[&str], deadline: Deadline) -> Result<usize, StoreError> {
        let mut deleted = 0;
        for chunk in keys.chunks(DELETE_CHUNK) {
            let requests: Vec<Request> = chunk.iter().map(|key| Request::DeleteKey { key: key.as_bytes() }).collect();
            self.send_all("DELETE_KEY", &requests, deadline)?;
            for _ in chunk {
                match i64::from_le_bytes(self.read_array("DELETE_KEY", deadline)?) {
                    0 => {}
                    1 => deleted += 1,
                    other => return Err(self.out_of_step("DELETE_KEY", format!("reply {other}, expected 0 or 1"))),
                }
            }
        }
        Ok(deleted)
    }

    /// `APPEND`: appends `value` to the value of `key` (creating it).
    pub fn append(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let deadline = self.deadline();
        self.send("APPEND", &Request::Append { key: key.as_bytes(), value }, deadline)
    }

    /// `MULTI_GET`: the values of `keys`, in order (wait for them first: see
    /// [`get`](StoreClient::get)). The reply may total at most `max_reply_len` bytes.
    pub fn multi_get(&mut self, keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.multi_get_by(keys, self.deadline())
    }

    pub(crate) fn multi_get_by(&mut self, keys: &[&str], deadline: Deadline) -> Result<Vec<Vec<u8>>, StoreError> {
        self.send("MULTI_GET", &Request::MultiGet { keys: bytes_of(keys) }, deadline)?;
        let mut left = self.limits.max_reply_len;
        let mut values = Vec::with_capacity(keys.len());
        for _ in keys {
            let value = self.read_value("MULTI_GET", left.min(self.limits.max_value_len), deadline)?;
            left -= value.len();
            values.push(value);
        }
        Ok(values)
    }

    /// `MULTI_SET`: stores every pair.
    pub fn multi_set(&mut self, pairs: &[(&str, &[u8])]) -> Result<(), StoreError> {
        let deadline = self.deadline();
        let pairs = pairs.iter().map(|(key, value)| (key.as_bytes(), *value)).collect();
        self.send("MULTI_SET", &Request::MultiSet { pairs }, deadline)
    }

    /// `PING`: the store echoes a nonce (this process's id, as PyTorch's client sends).
    pub fn ping(&mut self) -> Result<(), StoreError> {
        self.ping_by(self.deadline())
    }

    pub(crate) fn ping_by(&mut self, deadline: Deadline) -> Result<(), StoreError> {
        let nonce = std::process::id();
        self.send("PING", &Request::Ping { nonce }, deadline)?;
        let got = u32::from_le_bytes(self.read_array("PING", deadline)?);
        if got != nonce {
            return Err(self.out_of_step("PING", format!("echoed {got:#x}, sent {nonce:#x}")));
        }
        Ok(())
    }

    fn send(&mut self, op: &'static str, request: &Request, deadline: Deadline) -> Result<(), StoreError> {
        self.send_all(op, std::slice::from_ref(request), deadline)
    }

    /// Checks and writes requests back to back.
    fn send_all(&mut self, op: &'static str, requests: &[Request], deadline: Deadline) -> Result<(), StoreError> {
        if self.broken {
            return Err(StoreError::Broken { addr: self.addr.clone() });
        }
        let mut bytes = Vec::new();
        for request in requests {
            request.check(&self.limits).map_err(|error| StoreError::Refused { op, error })?;
            request.encode(&mut bytes);
        }
        let mut written = 0;
        while written < bytes.len() {
            let result = self.timed(op, deadline, |stream, left| {
                stream.set_write_timeout(Some(left))?;
                stream.write(&bytes[written..])
            });
            match result {
                Ok(0) => {
                    let detail = "the connection accepts no more bytes".to_string();
                    return Err(self.fail(StoreError::Closed { addr: self.addr.clone(), op, detail }));
                }
                Ok(n) => written += n,
                // Nothing sent yet and out of time: still in step.
                Err(error) if written == 0 && error.is_timeout() => return Err(error),
                Err(error) => return Err(self.fail(error)),
            }
        }
        Ok(())
    }

    /// One read or write with the time left before `deadline`, its failure mapped to a
    /// [`StoreError`].
    fn timed<T>(
        &mut self,
        op: &'static str,
        deadline: Deadline,
        mut call: impl FnMut(&mut TcpStream, Duration) -> io::Result<T>,
    ) -> Result<T, StoreError> {
        loop {
            let Some(left) = deadline.remaining() else {
                return Err(StoreError::TimedOut { addr: self.addr.clone(), op, waited: deadline.limit() });
            };
            match call(&mut self.stream, left) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if deadline.passed() {
                        return Err(StoreError::TimedOut { addr: self.addr.clone(), op, waited: deadline.limit() });
                    }
                }
                Err(e) => return Err(self.io(op, e)),
                Ok(value) => return Ok(value),
            }
        }
    }

    /// Fills `buf`, failing at `deadline`. Does not mark the connection broken.
    fn fill(&mut self, op: &'static str, buf: &mut [u8], deadline: Deadline) -> Result<(), StoreError> {
        let mut filled = 0;
        while filled < buf.len() {
            let n = self.timed(op, deadline, |stream, left| {
                stream.set_read_timeout(Some(left))?;
                stream.read(&mut buf[filled..])
            })?;
            if n == 0 {
                return Err(StoreError::Closed {
                    addr: self.addr.clone(),
                    op,
                    detail: "connection closed (EOF)".into(),
                });
            }
            filled += n;
        }
        Ok(())
    }

    /// One reply byte; a timeout before it arrives leaves the connection in step.
    fn read_byte_by(&mut self, op: &'static str, deadline: Deadline) -> Result<u8, StoreError> {
        let mut byte = [0u8];
        match self.fill(op, &mut byte, deadline) {
            Ok(()) => Ok(byte[0]),
            Err(error) if error.is_timeout() => Err(error),
            Err(error) => Err(self.fail(error)),
        }
    }

    fn read_array<const N: usize>(&mut self, op: &'static str, deadline: Deadline) -> Result<[u8; N], StoreError> {
        let mut out = [0u8; N];
        self.fill(op, &mut out, deadline).map_err(|error| self.fail(error))?;
        Ok(out)
    }

    /// A length-prefixed value of at most `max` bytes, refused before allocation if longer.
    fn read_value(&mut self, op: &'static str, max: usize, deadline: Deadline) -> Result<Vec<u8>, StoreError> {
        let len = u64::from_le_bytes(self.read_array(op, deadline)?);
        let len = codec::check_reply_len(len, max).map_err(|e| self.fail(self.protocol(op, e.to_string())))?;
        let mut value = vec![0u8; len];
        self.fill(op, &mut value, deadline).map_err(|error| self.fail(error))?;
        Ok(value)
    }

    /// Marks the connection out of step and passes `error` on.
    fn fail(&mut self, error: StoreError) -> StoreError {
        self.broken = true;
        error
    }

    fn protocol(&self, op: &'static str, detail: String) -> StoreError {
        StoreError::Protocol { addr: self.addr.clone(), op, detail }
    }

    /// A reply that is not what the protocol allows: the replies after it cannot be trusted to
    /// line up with the requests (before, a wrong reply in a batch of `DELETE_KEY`s left the
    /// batch's other replies to be read by the next call), so the connection is out of step.
    fn out_of_step(&mut self, op: &'static str, detail: String) -> StoreError {
        let error = self.protocol(op, detail);
        self.fail(error)
    }

    fn io(&self, op: &'static str, error: io::Error) -> StoreError {
        match error.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected => {
                StoreError::Closed { addr: self.addr.clone(), op, detail: format!("connection lost: {error}") }
            }
            _ => StoreError::Io { addr: self.addr.clone(), op, error },
        }
    }
}

fn bytes_of<'a>(keys: &[&'a str]) -> Vec<&'a [u8]> {
    keys.iter().map(|key| key.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_literal_is_not_handed_to_the_resolver() {
        // No thread, no wait: even a deadline that has passed gets the address back.
        let passed = Deadline::after(Duration::ZERO);
        assert_eq!(resolve_by("127.0.0.1", 29500, passed).unwrap(), vec!["127.0.0.1:29500".parse().unwrap()]);
        assert_eq!(resolve_by("::1", 7, passed).unwrap(), vec!["[::1]:7".parse().unwrap()]);
    }

    #[test]
    fn a_name_the_resolver_refuses_is_an_error_naming_why() {
        let err = resolve_by("no-such-host.invalid", 1, Deadline::after(Duration::from_secs(60))).unwrap_err();
        assert!(!err.is_empty());
    }
}
