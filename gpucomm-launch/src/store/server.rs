//! [`StoreServer`]: a TCPStore server on one thread, written for clients that may be hostile.

mod conn;
mod line;
mod table;

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use conn::{Conn, Stall, Wait, READ_CHUNK, VALIDATE_LEN};
use line::{Line, Place};
use table::Table;

use super::codec::{
    self, decode_request, Decoded, Request, Scanned, CHECK_NOT_READY, CHECK_READY, WAIT_CANCELED, WAIT_STOP,
};
use super::Limits;
use crate::deadline::{later, secs};

/// How long accepting pauses after `accept` fails (out of file descriptors, …), so that a
/// listener that stays readable does not spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Distinct accept errors kept.
const MAX_ACCEPT_ERRORS: usize = 16;
/// Recent events kept.
const MAX_EVENTS: usize = 32;
/// The most requests of one connection served at one wake-up: a connection with more buffered
/// (thousands of small requests in one read) is served the rest after the others, instead of
/// making them all wait.
const REQUESTS_PER_WAKE: usize = 64;

/// What a [`StoreServer`] has seen; read it with [`StoreServer::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Open connections, validated or not.
    pub connections: usize,
    /// Connections that have sent `VALIDATE`.
    pub validated: usize,
    /// Bytes held for the connections now (unparsed requests, unsent replies, pending waits'
    /// keys); never above [`Limits::buffered_bound`].
    pub buffered_bytes: usize,
    /// The most `buffered_bytes` has been.
    pub peak_buffered_bytes: usize,
    /// Bytes of [`Limits::max_buffered`] set aside for the connections now (for the requests they
    /// are receiving, their replies and their waits beyond their allowance).
    pub reserved_bytes: usize,
    /// Keys in the store.
    pub keys: usize,
    /// Bytes of keys and values in the store.
    pub store_bytes: usize,
    /// Connections accepted.
    pub accepted: u64,
    /// Connections closed at once because `max_per_peer` was reached, or `max_connections` with
    /// no connection that may be evicted to make room.
    pub turned_away: u64,
    /// Connections without `VALIDATE` closed to make room for a newer one when `max_pending` was
    /// reached (the oldest of them), or `max_pending_per_peer` (the oldest of that address's);
    /// not counted in `dropped`.
    pub displaced: u64,
    /// Idle connections that never used the store, closed to make room for a new one when
    /// `max_connections` was reached (see [`Limits::evict_idle_after`]); not counted in
    /// `dropped`.
    pub evicted: u64,
    /// Connections the server closed for a reason (no `VALIDATE` in time, a request over the
    /// limits or too slow, replies not read in time, …): see `events`.
    pub dropped: u64,
    /// Distinct errors of `accept` (such as "Too many open files"), with how often each
    /// happened; the server pauses accepting briefly after each and keeps serving.
    pub accept_errors: Vec<String>,
    /// The most recent reasons for closing connections, oldest first (at most 32).
    pub events: Vec<String>,
}

/// A TCPStore server (PyTorch's protocol, see [`codec`](super::codec)) on a thread of its own,
/// for the rendezvous's rank 0 or for any program that wants to host a store that PyTorch's
/// `TCPStore(host, port, is_master=False)` clients and [`StoreClient`](super::StoreClient)s
/// can use.
///
/// Built to face clients that may be hostile (an exposed port): every announced length is
/// checked before anything is allocated, and a request is checked as it arrives, from where the
/// last look stopped, and decoded once whole (a request of many keys sent a key at a time costs
/// the server no more than one sent at once), and a connection is served at most 64 requests
/// at a time, so that thousands sent at once do not hold the others up; a connection must send `VALIDATE` within
/// [`Limits::validate_within`] and each request must arrive within [`Limits::request_within`];
/// unvalidated connections are capped ([`Limits::max_pending`]: a newcomer takes the place of the
/// oldest, so silent connections cannot keep clients out; [`Limits::max_pending_per_peer`] for
/// one address, where a newcomer takes the place of that address's oldest), and so are one address's
/// ([`Limits::max_per_peer`]) and all connections ([`Limits::max_connections`]), and the bytes
/// that one address's pending `WAIT`s hold ([`Limits::max_wait_bytes_per_peer`]: a wait has no
/// deadline, so one stranger's waits could otherwise hold the shared budget for good); when all are
/// open, a new connection takes the place of one that has sent nothing but `VALIDATE` and `PING`
/// and has been idle for [`Limits::evict_idle_after`], preferably one from the address with the
/// most connections, so that connections opened and left idle cannot keep a job's ranks out for
/// long, while a connection that used the store is never evicted (a stranger keeping its own
/// connections busy cannot get quiet ranks evicted) nor closed for idling otherwise (ranks may
/// wait long between barriers); the bytes held for
/// connections stay below [`Limits::buffered_bound`] (a read whose reply does not fit waits for
/// room, within its request deadline, rather than failing); the store's size is capped; a client that
/// does not read its replies, or reads them too slowly to take them all within
/// [`Limits::request_within`] of their being queued, is dropped (so that it cannot hold its
/// share of the buffer budget for long by reading a byte at a time). A request the server
/// refuses (over a limit, an unknown query) closes that connection and is recorded in
/// [`ServerStats::events`]; the server keeps serving the others. `accept` failures (out of file
/// descriptors) are recorded in [`ServerStats::accept_errors`], and the server keeps working.
///
/// One thread serves every connection with non-blocking sockets and `poll(2)`: it sleeps until
/// a socket is ready or the next deadline. Dropping the server (or
/// [`shutdown`](StoreServer::shutdown)) stops the thread and closes every connection.
///
/// The store has no access control: like PyTorch's, anyone who can reach the port can read and
/// write every key. Bind it to a trusted network, or protect what you store (the rendezvous
/// does, with a job key).
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    waker: UnixStream,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    stats: ServerStats,
    stop: bool,
    /// Length fields the server thread has read ([`codec::LENGTHS_READ`]).
    #[cfg(test)]
    lengths_read: u64,
    /// What the server thread counted for the tests, as of its last publication.
    #[cfg(test)]
    counts: TestCounts,
}

/// What the server thread counts for the tests.
#[cfg(test)]
#[derive(Clone, Copy, Default)]
struct TestCounts {
    /// `WAIT`s that a `COMPARE_SET` of a missing key woke ([`StoreServer::bind_like_libuv`]).
    false_wakes: u64,
    /// Bytes moved to drop served requests from the connections' input.
    bytes_moved: u64,
    /// The most requests of one connection served by one call of `process`.
    most_served_at_once: usize,
    /// Stalled requests served again ([`Server::unstall`]).
    stalled_tries: u64,
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreServer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl StoreServer {
    /// Listens on `addr` (port 0: any free port) and starts serving.
    pub fn bind(addr: SocketAddr, limits: Limits) -> io::Result<StoreServer> {
        StoreServer::start(TcpListener::bind(addr)?, limits, Vec::new())
    }

    /// Serves on `listener`, starting with the keys and values of `initial` in the store (so
    /// that they exist before any client can connect). Fails if `initial` breaks `limits`.
    pub fn start(listener: TcpListener, limits: Limits, initial: Vec<(Vec<u8>, Vec<u8>)>) -> io::Result<StoreServer> {
        StoreServer::launch(listener, limits, initial, false)
    }

    /// A server that ends the `WAIT`s for a key when a `COMPARE_SET` with a non-empty expected
    /// value names it while it does not exist, as PyTorch's libuv server does (and it still
    /// stores nothing, as that one does): for the tests of the clients that meet such a store.
    #[cfg(test)]
    pub(crate) fn bind_like_libuv(addr: SocketAddr) -> io::Result<StoreServer> {
        StoreServer::launch(TcpListener::bind(addr)?, Limits::default(), Vec::new(), true)
    }

    /// The `WAIT`s that a `COMPARE_SET` of a missing key woke ([`StoreServer::bind_like_libuv`]).
    #[cfg(test)]
    pub(crate) fn false_wakes(&self) -> u64 {
        lock(&self.shared).counts.false_wakes
    }

    fn launch(
        listener: TcpListener,
        limits: Limits,
        initial: Vec<(Vec<u8>, Vec<u8>)>,
        like_libuv: bool,
    ) -> io::Result<StoreServer> {
        #[cfg(not(test))]
        let _ = like_libuv;
        let mut table = Table::new(&limits);
        for (key, value) in initial {
            if key.len() > limits.max_key_len {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "an initial key is over the key limit"));
            }
            table.set(&key, value).map_err(|r| io::Error::new(io::ErrorKind::InvalidInput, r.describe()))?;
        }
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (waker, wake) = UnixStream::pair()?;
        waker.set_nonblocking(true)?;
        wake.set_nonblocking(true)?;
        let shared = Arc::new(Mutex::new(Shared {
            stats: ServerStats::default(),
            stop: false,
            #[cfg(test)]
            lengths_read: 0,
            #[cfg(test)]
            counts: TestCounts::default(),
        }));
        let server = Server {
            listener,
            wake,
            shared: shared.clone(),
            limits,
            table,
            conns: HashMap::new(),
            peers: HashMap::new(),
            next_id: 0,
            waiters: HashMap::new(),
            waiting: HashMap::new(),
            budget_used: 0,
            reading_by_peer: HashMap::new(),
            lines: HashMap::new(),
            stalled: Vec::new(),
            changes: 0,
            backlog: Vec::new(),
            accept_paused_until: None,
            scratch: vec![0; READ_CHUNK],
            accepted: 0,
            turned_away: 0,
            displaced: 0,
            evicted: 0,
            dropped: 0,
            peak: 0,
            accept_errors: Vec::new(),
            events: VecDeque::new(),
            #[cfg(test)]
            like_libuv,
            #[cfg(test)]
            counts: TestCounts::default(),
        };
        let thread = std::thread::Builder::new().name("gpucomm-store".into()).spawn(move || server.run())?;
        Ok(StoreServer { addr, shared, waker, thread: Some(thread) })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A snapshot of what the server has seen (updated every time it wakes up).
    pub fn stats(&self) -> ServerStats {
        lock(&self.shared).stats.clone()
    }

    /// Stops serving and closes every connection (what dropping the server does).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        lock(&self.shared).stop = true;
        let _ = (&self.waker).write(&[1]);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The lock, also after a panic elsewhere (the data stays consistent: plain counters).
fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The server thread's state.
struct Server {
    listener: TcpListener,
    wake: UnixStream,
    shared: Arc<Mutex<Shared>>,
    limits: Limits,
    table: Table,
    conns: HashMap<u64, Conn>,
    /// Peer address → its open connections.
    peers: HashMap<IpAddr, usize>,
    next_id: u64,
    /// Key → the connections waiting for it.
    waiters: HashMap<Vec<u8>, Vec<u64>>,
    /// Peer address → the bytes its connections' pending waits hold ([`Wait::bytes`]), at most
    /// [`Limits::max_wait_bytes_per_peer`].
    waiting: HashMap<IpAddr, usize>,
    /// Bytes of `max_buffered` reserved by connections.
    budget_used: usize,
    /// Peer address → the bytes of `budget_used` its connections set aside for reading their
    /// requests ([`Conn::reading`]), at most [`Limits::max_reserved_per_peer`].
    reading_by_peer: HashMap<IpAddr, usize>,
    /// Peer address → its connections with bytes set aside for reading a started request
    /// ([`Conn::reading`]), in the order they began to: what those ahead may still need is kept
    /// free for them in the address's share.
    lines: HashMap<IpAddr, Line>,
    /// Connections whose next request waits for budget for its reply ([`Conn::stalled`]), in the
    /// order they stalled.
    stalled: Vec<u64>,
    /// How many times the store's keys changed (written, deleted): a stalled request is served
    /// again once the store changed since it stalled, or the room it lacked is there.
    changes: u64,
    /// Connections with whole requests left after their share of a wake-up
    /// ([`Conn::backlogged`]), in the order they were served.
    backlog: Vec<u64>,
    accept_paused_until: Option<Instant>,
    scratch: Vec<u8>,
    accepted: u64,
    turned_away: u64,
    displaced: u64,
    evicted: u64,
    dropped: u64,
    peak: usize,
    /// Distinct accept errors and their counts.
    accept_errors: Vec<(String, u64)>,
    events: VecDeque<String>,
    /// Whether a `COMPARE_SET` of a missing key wakes its waiters ([`StoreServer::bind_like_libuv`]).
    #[cfg(test)]
    like_libuv: bool,
    #[cfg(test)]
    counts: TestCounts,
}

/// What [`Server::room`] finds for more bytes of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Room {
    Now,
    Never,
    Later,
}

impl Server {
    fn run(mut self) {
        loop {
            let now = Instant::now();
            // Also serves the stalled requests that the budget of the connections it closes
            // makes room for.
            self.expire(now);
            let listening = self.accept_paused_until.is_none_or(|until| now >= until);
            if listening {
                self.accept_paused_until = None;
            }
            let ids: Vec<u64> = self.conns.keys().copied().collect();
            let mut fds = Vec::with_capacity(2 + ids.len());
            fds.push(pollfd(self.wake.as_raw_fd(), libc::POLLIN));
            fds.push(pollfd(self.listener.as_raw_fd(), if listening { libc::POLLIN } else { 0 }));
            for &id in &ids {
                let events = self.interest(id);
                fds.push(pollfd(self.conns[&id].stream.as_raw_fd(), events));
            }
            if self.publish() {
                return;
            }
            let timeout = self.poll_timeout(now);
            if let Err(error) = poll(&mut fds, timeout) {
                if error.kind() != io::ErrorKind::Interrupted {
                    self.event(format!("poll failed: {error}"));
                    std::thread::sleep(ACCEPT_PAUSE);
                }
                continue;
            }
            if fds[0].revents != 0 {
                let _ = (&self.wake).read(&mut [0u8; 64]);
            }
            let now = Instant::now();
            if fds[1].revents != 0 {
                self.accept(now);
            }
            for (index, &id) in ids.iter().enumerate() {
                let revents = fds[index + 2].revents;
                if revents != 0 {
                    self.service(id, revents, now);
                }
            }
            self.unstall(now);
            self.serve_backlog(now);
        }
    }

    /// Serves again the stalled connections' waiting requests, first stalled first, as far as
    /// the budget that replies sent and connections closed gave back allows. A request is
    /// decoded and served again only when the room it lacked is there now, or the store changed
    /// since it stalled (which may change what it needs: a `WAIT`'s keys appeared, a value
    /// shrank); before, every stalled request was decoded again at every wake-up of the server,
    /// so that many connections' stalled `WAIT`s of many keys made each request of anyone cost
    /// milliseconds.
    fn unstall(&mut self, now: Instant) {
        if self.stalled.is_empty() {
            return;
        }
        for id in std::mem::take(&mut self.stalled) {
            let Some(stall) = self.conns.get(&id).and_then(|conn| conn.stalled) else { continue };
            if stall.changes == self.changes && self.room(id, stall.bytes) == Room::Later {
                self.stalled.push(id);
                continue;
            }
            if let Some(conn) = self.conns.get_mut(&id) {
                conn.stalled = None;
            }
            #[cfg(test)]
            {
                self.counts.stalled_tries += 1;
            }
            self.process(id, now);
            self.settle(id);
            self.flush(id, now);
        }
    }

    /// Whether `bytes` more fit the connection's allowance and the shared budget now, never can
    /// (they would not fit even if every other connection gave its budget back), or may later.
    fn room(&self, id: u64, bytes: usize) -> Room {
        let Some(conn) = self.conns.get(&id) else { return Room::Now };
        let over = (conn.held() + bytes).saturating_sub(self.limits.connection_allowance + conn.reserved);
        if over == 0 || self.budget_used + over <= self.limits.max_buffered {
            Room::Now
        } else if self.budget_used == conn.reserved || conn.reserved + over > self.limits.max_buffered {
            Room::Never
        } else {
            Room::Later
        }
    }

    /// Whether `bytes` more (`what`: a reply, a `WAIT`'s keys) fit the connection's allowance and
    /// the shared budget. When they do not, and other connections hold budget that their
    /// replies' sending or their closing gives back, the request waits ([`Conn::stalled`]:
    /// `Ok(false)`) and is served again, whole, once they fit; when only this connection holds
    /// any, or they would not fit even in the whole budget, it is refused as before (a client
    /// that sends reads without taking their replies is dropped once its unsent replies pass
    /// `max_reply_len`, in `reply`).
    fn room_for(&mut self, id: u64, bytes: usize, what: &str) -> Result<bool, String> {
        match self.room(id, bytes) {
            Room::Now => Ok(true),
            Room::Never => Err(format!(
                "{what} of {bytes} bytes would pass the server's buffer budget ({} bytes)",
                self.limits.max_buffered
            )),
            Room::Later => {
                if let Some(conn) = self.conns.get_mut(&id) {
                    conn.stalled = Some(Stall { bytes, changes: self.changes });
                    self.stalled.push(id);
                }
                Ok(false)
            }
        }
    }

    /// Publishes the stats; true when the owner asked the server to stop.
    fn publish(&mut self) -> bool {
        let buffered: usize = self.conns.values().map(Conn::held).sum();
        self.peak = self.peak.max(buffered);
        let validated = self.conns.values().filter(|c| c.validated).count();
        let stats = ServerStats {
            connections: self.conns.len(),
            validated,
            buffered_bytes: buffered,
            peak_buffered_bytes: self.peak,
            reserved_bytes: self.budget_used,
            keys: self.table.len(),
            store_bytes: self.table.bytes(),
            accepted: self.accepted,
            turned_away: self.turned_away,
            displaced: self.displaced,
            evicted: self.evicted,
            dropped: self.dropped,
            accept_errors: self.accept_errors.iter().map(|(e, n)| format!("{e} (×{n})")).collect(),
            events: self.events.iter().cloned().collect(),
        };
        let mut shared = lock(&self.shared);
        shared.stats = stats;
        #[cfg(test)]
        {
            shared.lengths_read = codec::LENGTHS_READ.with(std::cell::Cell::get);
            shared.counts = self.counts;
        }
        shared.stop
    }

    fn event(&mut self, text: String) {
        if self.events.len() == MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(text);
    }

    fn accept(&mut self, now: Instant) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    self.accepted += 1;
                    if let Err(limit) = self.make_room(peer.ip(), now) {
                        self.turned_away += 1;
                        if is_power_of_ten(self.turned_away) {
                            let n = self.turned_away;
                            self.event(format!("turned away {n} connection(s) so far: {limit} was reached"));
                        }
                        continue;
                    }
                    match stream.set_nonblocking(true) {
                        Ok(()) => {
                            let _ = stream.set_nodelay(true);
                            *self.peers.entry(peer.ip()).or_default() += 1;
                            self.conns.insert(self.next_id, Conn::new(stream, peer, now));
                            self.next_id += 1;
                        }
                        Err(error) => self.event(format!("{peer}: could not set up the connection: {error}")),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted) => {}
                Err(error) => {
                    let text = format!("accept failed: {error}");
                    match self.accept_errors.iter().position(|(e, _)| *e == text) {
                        Some(index) => self.accept_errors[index].1 += 1,
                        None if self.accept_errors.len() < MAX_ACCEPT_ERRORS => self.accept_errors.push((text, 1)),
                        None => {}
                    }
                    self.accept_paused_until = Some(now + ACCEPT_PAUSE);
                    return;
                }
            }
        }
    }

    /// Whether a new connection from `ip` may be accepted, closing the oldest connection without
    /// `VALIDATE` when `max_pending` are open, and an idle connection when all are open; `Err`:
    /// the limit that turns it away.
    fn make_room(&mut self, ip: IpAddr, now: Instant) -> Result<(), String> {
        if self.peers.get(&ip).is_some_and(|&n| n >= self.limits.max_per_peer) {
            return Err(format!("the limit of {} connections from one address ({ip})", self.limits.max_per_peer));
        }
        let (mut pending, mut from_peer) = self.pending(ip);
        if pending >= self.limits.max_pending || from_peer >= self.limits.max_pending_per_peer {
            // Accepted in a burst, they have not been read yet: their VALIDATE may be in.
            self.read_pending(now);
            (pending, from_peer) = self.pending(ip);
        }
        if from_peer >= self.limits.max_pending_per_peer {
            // The newcomer takes the place of the address's oldest, as for `max_pending`: turned
            // away, a process sharing the ranks' address kept them out with 8 silent connections.
            self.displace_oldest_pending(now, Some(ip));
        } else if pending >= self.limits.max_pending {
            self.displace_oldest_pending(now, None);
        }
        if self.conns.len() < self.limits.max_connections {
            return Ok(());
        }
        let full = format!("the connection limit ({})", self.limits.max_connections);
        let Some((id, idle)) = self.eviction_candidate(now) else { return Err(full) };
        if let Some(conn) = self.remove(id) {
            self.evicted += 1;
            if is_power_of_ten(self.evicted) {
                let n = self.evicted;
                self.event(format!(
                    "evicted {n} idle connection(s) so far to make room: {full} was reached; this one: {}, idle for {}",
                    conn.peer,
                    secs(idle)
                ));
            }
        }
        Ok(())
    }

    /// Connections without `VALIDATE`: all of them, and those from `ip`.
    fn pending(&self, ip: IpAddr) -> (usize, usize) {
        let unvalidated = self.conns.values().filter(|c| !c.validated);
        unvalidated.fold((0, 0), |(all, peer), c| (all + 1, peer + usize::from(c.peer.ip() == ip)))
    }

    /// Reads what the connections without `VALIDATE` have sent (their `VALIDATE`, at most), and
    /// serves it.
    fn read_pending(&mut self, now: Instant) {
        let ids: Vec<u64> = self.conns.iter().filter(|(_, c)| !c.validated).map(|(&id, _)| id).collect();
        for id in ids {
            self.service(id, libc::POLLIN, now);
        }
    }

    /// Closes the oldest connection without `VALIDATE` (of address `from`, if given), to make
    /// room for a new one.
    fn displace_oldest_pending(&mut self, now: Instant, from: Option<IpAddr>) {
        let oldest = self
            .conns
            .iter()
            .filter(|(_, c)| !c.validated && from.is_none_or(|ip| c.peer.ip() == ip))
            .min_by_key(|(&id, c)| (c.accepted_at, id));
        let Some(id) = oldest.map(|(&id, _)| id) else { return };
        let Some(conn) = self.remove(id) else { return };
        self.displaced += 1;
        if is_power_of_ten(self.displaced) {
            let n = self.displaced;
            let limit = match from {
                Some(ip) => format!(
                    "the limit of {} connections without VALIDATE from one address ({ip})",
                    self.limits.max_pending_per_peer
                ),
                None => format!("the limit of connections without VALIDATE ({})", self.limits.max_pending),
            };
            self.event(format!(
                "closed {n} connection(s) without VALIDATE so far to make room for newer ones: {limit} was reached; \
                 this one: {}, open for {}",
                conn.peer,
                secs(now.saturating_duration_since(conn.accepted_at))
            ));
        }
    }

    /// The connection to close for a new one when all are open, and how long it has been idle:
    /// of those that never used the store ([`Conn::evictable_since`]) and have been idle for at
    /// least `evict_idle_after`, one from the address with the most connections, the longest idle
    /// of them.
    fn eviction_candidate(&self, now: Instant) -> Option<(u64, Duration)> {
        self.conns
            .iter()
            .filter_map(|(&id, conn)| {
                let idle = now.saturating_duration_since(conn.evictable_since()?);
                let from_peer = self.peers.get(&conn.peer.ip()).copied().unwrap_or(0);
                (idle >= self.limits.evict_idle_after).then_some((from_peer, idle, id))
            })
            .max()
            .map(|(_, idle, id)| (id, idle))
    }

    /// The poll events a connection waits for.
    fn interest(&mut self, id: u64) -> libc::c_short {
        let mut events = 0;
        if !self.conns.get(&id).is_some_and(|c| c.stalled.is_some() || c.backlogged) && self.read_room(id) > 0 {
            events |= libc::POLLIN;
        }
        if self.conns.get(&id).is_some_and(|c| c.unsent() > 0) {
            events |= libc::POLLOUT;
        }
        events
    }

    /// How many bytes the connection may read now (0: it waits). Beyond its allowance, budget is
    /// set aside in step with what arrives: once what it holds fills what it may hold, one more
    /// read of the request it is receiving (at most [`READ_CHUNK`], and never past the request's
    /// length as far as it is known), if the shared budget allows, and its address's share
    /// ([`Limits::max_reserved_per_peer`]) with what the connections of that address ahead of it
    /// in their [`Line`] may still need ([`Conn::owed`]) kept free. Before, a request's whole
    /// announced length was set aside as soon as its header arrived: 18-byte requests announcing
    /// 1 MiB each held the whole budget, and the next large `WAIT` (rank 0's for the claims)
    /// closed its connection. Then, with budget set aside a read at a time for every connection
    /// at once, several large requests of one address arriving together (the ranks of a node
    /// writing large values) each held part of its share and none could finish before
    /// `request_within` closed them all.
    ///
    /// The first in its address's line can finish within the share: every connection of that
    /// address behind it did so only while what the first may still need fitted beside it, and
    /// what the first sets aside comes off that. Connections without a request under way set some
    /// aside without a place (what they will need is not known yet), counting the whole line;
    /// one that set a byte aside so before the first joined keeps it while it waits for its
    /// next request: a byte per connection, which the share leaves room for with the default
    /// limits (a request's first `connection_allowance` bytes need none of it). A
    /// request whose length is not known yet (a list, whose lengths come all through it, or the
    /// header of another) counts as the longest request allowed until it is, so what a request
    /// may need never grows; a place is given up with its request ([`Server::settle`]) and when
    /// what the connection set aside for reading runs out (it joins again at the back). The
    /// shared budget is not shared out this way: counting what requests announce against it
    /// would let a few addresses hold it with a few bytes sent each, so the first in a line can
    /// still wait there for budget that other addresses' requests, replies and waits hold.
    fn read_room(&mut self, id: u64) -> usize {
        let allowance = self.limits.connection_allowance;
        let Some(conn) = self.conns.get(&id) else { return 0 };
        if !conn.validated {
            return VALIDATE_LEN.saturating_sub(conn.input.len());
        }
        let room = (allowance + conn.reserved).saturating_sub(conn.held());
        if room > 0 {
            return room.min(READ_CHUNK);
        }
        let extra = (conn.request_len() - conn.input.len()).min(READ_CHUNK);
        // A connection that has not begun its next request takes no place: what it will need is
        // not known yet.
        let started = conn.input.len() > conn.pos;
        let (ip, place) = (conn.peer.ip(), conn.place);
        let ahead = self.owed_ahead(place, ip);
        let peer = self.reading_by_peer.get(&ip).copied().unwrap_or(0);
        if self.budget_used + extra > self.limits.max_buffered
            || peer + extra + ahead > self.limits.max_reserved_per_peer
        {
            return 0;
        }
        if place.is_none() && started {
            let joined = self.lines.entry(ip).or_default().join(id, conn.served);
            if let Some(conn) = self.conns.get_mut(&id) {
                conn.place = Some(joined);
            }
        }
        self.reserve(id, extra);
        self.set_reading(id, |reading| reading + extra);
        extra
    }

    /// What the connections of address `ip` ahead of `place` in its [`Line`] may still need
    /// ([`Conn::owed`]; every one in line for `None`).
    fn owed_ahead(&self, place: Option<Place>, ip: IpAddr) -> usize {
        let Some(line) = self.lines.get(&ip) else { return 0 };
        line.ahead(place).filter_map(|id| self.conns.get(&id)).map(|conn| conn.owed(&self.limits)).sum()
    }

    /// Takes a connection out of its address's line.
    fn leave_line(&mut self, id: u64) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        let Some(place) = conn.place.take() else { return };
        let ip = conn.peer.ip();
        if let Some(line) = self.lines.get_mut(&ip) {
            line.leave(place);
            if line.is_empty() {
                self.lines.remove(&ip);
            }
        }
    }

    /// Sets `extra` bytes of the shared budget aside for a connection.
    fn reserve(&mut self, id: u64, extra: usize) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        conn.reserved += extra;
        self.budget_used += extra;
    }

    /// Gives back `amount` bytes of what a connection set aside.
    fn unreserve(&mut self, id: u64, amount: usize) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        conn.reserved -= amount;
        self.budget_used -= amount;
        let reading = conn.reading.min(conn.reserved);
        self.set_reading(id, |_| reading);
    }

    /// Changes what a connection set aside for reading ([`Conn::reading`]), and its address's
    /// count.
    fn set_reading(&mut self, id: u64, change: impl FnOnce(usize) -> usize) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        let (before, ip) = (conn.reading, conn.peer.ip());
        conn.reading = change(before);
        let after = conn.reading;
        let held = self.reading_by_peer.entry(ip).or_default();
        *held = *held + after - before;
        if *held == 0 {
            self.reading_by_peer.remove(&ip);
        }
        if after == 0 {
            self.leave_line(id);
        }
    }

    /// Gives back the budget a connection no longer needs (keeping what the request it is
    /// receiving holds, and one read more); what it set aside for reading shrinks to what that
    /// request still holds beyond the allowance. A place in its address's line taken for a
    /// request served since is given up: the next request may need more than the connections
    /// behind it counted.
    fn settle(&mut self, id: u64) {
        let allowance = self.limits.connection_allowance;
        let Some(conn) = self.conns.get(&id) else { return };
        if conn.place.is_some_and(|place| place.request() != conn.served) {
            self.leave_line(id);
        }
        let Some(conn) = self.conns.get(&id) else { return };
        let input = conn.input.len();
        let pending = if input == 0 { 0 } else { conn.needed.max(conn.least).max(input).min(input + READ_CHUNK) };
        let keep = (conn.held() - input + pending).saturating_sub(allowance);
        if conn.reserved > keep {
            self.unreserve(id, conn.reserved - keep);
        }
        let reading = pending.saturating_sub(allowance);
        self.set_reading(id, |before| before.min(reading));
    }

    fn service(&mut self, id: u64, revents: libc::c_short, now: Instant) {
        if revents & libc::POLLOUT != 0 {
            self.flush(id, now);
        }
        if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) == 0 || !self.conns.contains_key(&id) {
            return;
        }
        // A connection with requests left to serve reads nothing more until they are served
        // (`serve_backlog`), nor its end: what it sent before closing is served.
        if self.conns.get(&id).is_some_and(|c| c.backlogged) {
            return;
        }
        // A stalled connection reads nothing until `unstall` has served its waiting request.
        if self.conns.get(&id).is_some_and(|c| c.stalled.is_some()) {
            if revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                self.close(id, None);
            }
            return;
        }
        let room = self.read_room(id);
        if room == 0 {
            if revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                self.close(id, None);
            }
            return;
        }
        let Some(conn) = self.conns.get_mut(&id) else { return };
        match conn.read(&mut self.scratch[..room], now) {
            Ok(true) => {}
            Ok(false) => return self.close(id, None),
            Err(error) => return self.close(id, Some(format!("read failed: {error}"))),
        }
        self.process(id, now);
        self.settle(id);
        self.flush(id, now);
    }

    fn flush(&mut self, id: u64, now: Instant) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        match conn.flush(now) {
            Ok(()) => self.settle(id),
            Err(error) => self.close(id, Some(format!("write failed: {error}"))),
        }
    }

    /// Decodes and serves the whole requests in the connection's input, at most
    /// [`REQUESTS_PER_WAKE`] (the rest wait for the next wake-up: [`Conn::backlogged`]); once
    /// none is left, drops the served ones from the input at once (so each byte moves at most
    /// once: only the start of a request still arriving is moved).
    fn process(&mut self, id: u64, now: Instant) {
        self.serve_input(id, now);
        if let Some(conn) = self.conns.get_mut(&id).filter(|conn| !conn.backlogged) {
            let moved = conn.compact();
            #[cfg(test)]
            {
                self.counts.bytes_moved += moved as u64;
            }
            #[cfg(not(test))]
            let _ = moved;
        }
    }

    fn serve_input(&mut self, id: u64, now: Instant) {
        let mut served = 0;
        loop {
            let Some(conn) = self.conns.get_mut(&id) else { return };
            let pos = conn.pos;
            if conn.input.len() - pos < conn.needed {
                return;
            }
            if served == REQUESTS_PER_WAKE {
                // Its share for now: the others are served before its next requests.
                if !conn.backlogged {
                    conn.backlogged = true;
                    self.backlog.push(id);
                }
                return;
            }
            if !conn.validated && conn.input[pos] != codec::Query::Validate.byte() {
                let reason = format!("its first request was query byte {}, not VALIDATE", conn.input[pos]);
                return self.close(id, Some(reason));
            }
            // Checked from where the last look stopped, and decoded only once whole: a request
            // of many keys arriving in many pieces is read twice, not once per piece.
            match conn.scan.advance(&conn.input[pos..], &self.limits) {
                Ok(Scanned::Whole(_)) => {}
                Ok(Scanned::Need { needed, least }) => {
                    (conn.needed, conn.least) = (needed, least);
                    return;
                }
                Err(error) => return self.close(id, Some(error.to_string())),
            }
            let validated = conn.validated;
            // Served from a buffer of its own (still counted as held), so that serving can
            // touch any connection.
            let input = std::mem::take(&mut conn.input);
            conn.borrowed = input.len();
            let step = match decode_request(&input[pos..], &self.limits) {
                Ok(Decoded::Complete { request, len }) => {
                    let served = if validated { self.handle(id, request, now) } else { validate(request) };
                    served.map(|()| Step::Served(len))
                }
                Ok(Decoded::Incomplete { needed }) => Ok(Step::Need(needed)),
                Err(error) => Err(error.to_string()),
            };
            let step = match step {
                Ok(step) => step,
                Err(reason) => return self.close(id, Some(reason)),
            };
            let Some(conn) = self.conns.get_mut(&id) else { return };
            conn.input = input;
            conn.borrowed = 0;
            if conn.stalled.is_some() {
                // Served again, whole, once its reply fits (`unstall`). Its length is known now:
                // what its address's line counts for it (`Conn::owed`), a list's too, which is
                // not known before it is whole (and it reads nothing more meanwhile).
                if let Step::Served(len) = step {
                    conn.whole.set(Some((conn.input.len() - pos, len)));
                }
                return;
            }
            match step {
                Step::Served(len) => {
                    conn.validated = true;
                    conn.consume(len, now);
                    served += 1;
                    #[cfg(test)]
                    {
                        self.counts.most_served_at_once = self.counts.most_served_at_once.max(served);
                    }
                }
                Step::Need(needed) => {
                    conn.needed = needed;
                    return;
                }
            }
        }
    }

    /// Serves the connections that had more requests buffered than their share at their last
    /// wake-up, another share each.
    fn serve_backlog(&mut self, now: Instant) {
        for id in std::mem::take(&mut self.backlog) {
            let Some(conn) = self.conns.get_mut(&id) else { continue };
            conn.backlogged = false;
            if conn.stalled.is_some() {
                continue;
            }
            self.process(id, now);
            self.settle(id);
            self.flush(id, now);
        }
    }

    /// Serves one request of a validated connection; `Err` closes the connection.
    fn handle(&mut self, id: u64, request: Request<'_>, now: Instant) -> Result<(), String> {
        let refused = |refusal: table::Refusal| refusal.describe();
        if !matches!(request, Request::Validate { .. } | Request::Ping { .. }) {
            if let Some(conn) = self.conns.get_mut(&id) {
                conn.used = true;
            }
        }
        match request {
            Request::Validate { .. } => Err("sent VALIDATE twice".into()),
            Request::Ping { nonce } => self.reply(id, &nonce.to_le_bytes(), now),
            Request::Set { key, value } => {
                self.table.set(key, value.to_vec()).map_err(refused)?;
                self.wake(key, now);
                Ok(())
            }
            Request::CompareSet { key, expected, desired } => {
                #[cfg(test)]
                if self.like_libuv && !expected.is_empty() && !self.table.contains(key) {
                    self.counts.false_wakes += self.waiters.get(key).map_or(0, Vec::len) as u64;
                    self.wake(key, now);
                }
                // Room for the reply first: one that does not fit waits before the store changes
                // (before, the swap was made, and the connection closed for its reply: the
                // client could not tell whether it had happened).
                let len = 8 + self.table.compare_set_reply_len(key, expected, desired);
                if !self.room_for(id, len, "a reply")? {
                    return Ok(());
                }
                let current = self.table.compare_set(key, expected, desired).map_err(refused)?;
                if self.table.contains(key) {
                    self.wake(key, now);
                }
                self.reply_value(id, &current, now)
            }
            Request::Get { key } => {
                let len = self.table.get(key).map_or(0, <[u8]>::len);
                if !self.room_for(id, 8 + len, "a reply")? {
                    return Ok(());
                }
                let value = self.table.get(key).unwrap_or_default().to_vec();
                self.reply_value(id, &value, now)
            }
            Request::Add { key, delta } => {
                if !self.room_for(id, 8, "a reply")? {
                    return Ok(());
                }
                let sum = self.table.add(key, delta).map_err(refused)?;
                self.wake(key, now);
                self.reply(id, &sum.to_le_bytes(), now)
            }
            Request::Check { keys } => {
                let ready = keys.iter().all(|key| self.table.contains(key));
                self.reply(id, &[if ready { CHECK_READY } else { CHECK_NOT_READY }], now)
            }
            Request::Wait { keys } => self.start_wait(id, &keys, now),
            Request::GetNumKeys => self.reply(id, &(self.table.len() as i64).to_le_bytes(), now),
            Request::DeleteKey { key } => {
                if !self.room_for(id, 8, "a reply")? {
                    return Ok(());
                }
                let deleted = i64::from(self.table.delete(key));
                self.changes += 1;
                self.reply(id, &deleted.to_le_bytes(), now)
            }
            Request::Append { key, value } => {
                self.table.append(key, value).map_err(refused)?;
                self.wake(key, now);
                Ok(())
            }
            Request::MultiGet { keys } => {
                let len: usize = keys.iter().map(|key| 8 + self.table.get(key).map_or(0, <[u8]>::len)).sum();
                if len > self.limits.max_reply_len {
                    return Err(format!(
                        "a MULTI_GET reply of {len} bytes would be over the limit of {} bytes",
                        self.limits.max_reply_len
                    ));
                }
                if !self.room_for(id, len, "a reply")? {
                    return Ok(());
                }
                let mut reply = Vec::with_capacity(len);
                for key in &keys {
                    codec::put_bytes(&mut reply, self.table.get(key).unwrap_or_default());
                }
                self.reply(id, &reply, now)
            }
            Request::MultiSet { pairs } => {
                for (key, value) in pairs {
                    self.table.set(key, value.to_vec()).map_err(refused)?;
                    self.wake(key, now);
                }
                Ok(())
            }
            Request::CancelWait => {
                self.clear_wait(id);
                self.reply(id, &[WAIT_CANCELED], now)
            }
        }
    }

    fn reply_value(&mut self, id: u64, value: &[u8], now: Instant) -> Result<(), String> {
        let mut bytes = Vec::with_capacity(8 + value.len());
        codec::put_bytes(&mut bytes, value);
        self.reply(id, &bytes, now)
    }

    /// Queues a reply, within the connection's bound and the shared budget; a reply queued when
    /// none was unsent starts the time its replies have to be sent in.
    fn reply(&mut self, id: u64, bytes: &[u8], now: Instant) -> Result<(), String> {
        let Some(conn) = self.conns.get_mut(&id) else { return Ok(()) };
        conn.reply(bytes, now);
        if conn.unsent() > self.limits.max_reply_len {
            return Err(format!(
                "it does not read its replies ({} unsent bytes, over the limit of {})",
                conn.unsent(),
                self.limits.max_reply_len
            ));
        }
        self.ensure_budget(id)
    }

    /// Reserves budget for what the connection holds beyond its allowance.
    fn ensure_budget(&mut self, id: u64) -> Result<(), String> {
        let allowance = self.limits.connection_allowance;
        let Some(conn) = self.conns.get_mut(&id) else { return Ok(()) };
        let over = conn.held().saturating_sub(allowance + conn.reserved);
        if over == 0 {
            return Ok(());
        }
        if self.budget_used + over > self.limits.max_buffered {
            return Err(format!(
                "holding {} more bytes for it would pass the server's buffer budget ({} bytes)",
                over, self.limits.max_buffered
            ));
        }
        self.reserve(id, over);
        Ok(())
    }

    /// Starts a wait for the keys still missing, within what one address's pending waits may
    /// hold ([`Limits::max_wait_bytes_per_peer`]): a wait has no deadline, so without that bound
    /// one stranger's waits could hold the whole shared budget for ever. A wait that fits its
    /// address's share but not the shared budget waits for room, as a large reply does
    /// ([`Server::room_for`]), within `request_within`: before, it closed its connection at once
    /// (rank 0's wait for the claims, while other addresses' waits held the budget).
    fn start_wait(&mut self, id: u64, keys: &[&[u8]], now: Instant) -> Result<(), String> {
        self.clear_wait(id);
        let Some(ip) = self.conns.get(&id).map(|c| c.peer.ip()) else { return Ok(()) };
        let mut seen = HashSet::new();
        let missing: Vec<&[u8]> =
            keys.iter().copied().filter(|key| !self.table.contains(key) && seen.insert(*key)).collect();
        if missing.is_empty() {
            return self.reply(id, &[WAIT_STOP], now);
        }
        // Counted before the keys are copied: a wait that waits for room is served again at
        // every wake-up until it fits.
        let bytes = Wait::bytes(missing.iter().copied());
        let held = self.waiting.get(&ip).copied().unwrap_or(0) + bytes;
        if held > self.limits.max_wait_bytes_per_peer {
            return Err(format!(
                "the pending WAITs of {ip} would hold {held} bytes, over the limit of {} for one address",
                self.limits.max_wait_bytes_per_peer
            ));
        }
        if !self.room_for(id, bytes, "a WAIT's keys")? {
            return Ok(());
        }
        let wait = Wait::new(missing.into_iter().map(<[u8]>::to_vec).collect());
        for key in &wait.keys {
            self.waiters.entry(key.clone()).or_default().push(id);
        }
        self.waiting.insert(ip, held);
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.wait = Some(wait);
        }
        self.ensure_budget(id)
    }

    /// Takes a wait that ended off its address's count.
    fn count_off(&mut self, ip: IpAddr, wait: &Wait) {
        if let Some(held) = self.waiting.get_mut(&ip) {
            *held -= wait.bytes;
            if *held == 0 {
                self.waiting.remove(&ip);
            }
        }
    }

    fn clear_wait(&mut self, id: u64) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        let Some(wait) = conn.wait.take() else { return };
        let ip = conn.peer.ip();
        self.count_off(ip, &wait);
        for key in wait.keys {
            if let Some(ids) = self.waiters.get_mut(&key) {
                ids.retain(|&w| w != id);
                if ids.is_empty() {
                    self.waiters.remove(&key);
                }
            }
        }
    }

    /// `key` now exists: answers the waits it completes.
    fn wake(&mut self, key: &[u8], now: Instant) {
        self.changes += 1;
        let Some(ids) = self.waiters.remove(key) else { return };
        for id in ids {
            let Some(conn) = self.conns.get_mut(&id) else { continue };
            let Some(wait) = conn.wait.as_mut() else { continue };
            wait.missing -= 1;
            if wait.missing > 0 {
                continue;
            }
            let ip = conn.peer.ip();
            if let Some(wait) = conn.wait.take() {
                self.count_off(ip, &wait);
            }
            match self.reply(id, &[WAIT_STOP], now) {
                Ok(()) => self.flush(id, now),
                Err(reason) => self.close(id, Some(reason)),
            }
        }
    }

    /// Closes a connection; a `reason` counts it as dropped and records it.
    fn close(&mut self, id: u64, reason: Option<String>) {
        let Some(conn) = self.remove(id) else { return };
        if let Some(reason) = reason {
            self.dropped += 1;
            self.event(format!("closed {}: {reason}", conn.peer));
        }
    }

    /// Takes a connection out of the server (its wait, its budget, its address's count); the
    /// only way one leaves. Dropping what it returns closes the socket.
    fn remove(&mut self, id: u64) -> Option<Conn> {
        self.clear_wait(id);
        let reserved = self.conns.get(&id)?.reserved;
        self.unreserve(id, reserved);
        let conn = self.conns.remove(&id)?;
        let ip = conn.peer.ip();
        if let Some(count) = self.peers.get_mut(&ip) {
            *count -= 1;
            if *count == 0 {
                self.peers.remove(&ip);
            }
        }
        Some(conn)
    }

    /// Closes connections past a deadline: first those past one that is not a stalled request's,
    /// then, once the budget they gave back has served what it can of the stalled requests
    /// ([`unstall`](Server::unstall)), the stalled requests still past theirs. Checked all
    /// against the same `now`, a late wake-up closed a request that had waited for budget
    /// together with the connection whose closing gave that budget back.
    fn expire(&mut self, now: Instant) {
        let past = |t: Instant, limit| later(t, limit).is_some_and(|at| now >= at);
        // What a connection past its time for VALIDATE sent is read first: a server that looks
        // late (a loaded machine) does not close a client whose VALIDATE came in time.
        let validate_within = self.limits.validate_within;
        let unread: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.validated && past(c.accepted_at, validate_within))
            .map(|(&id, _)| id)
            .collect();
        for id in unread {
            self.service(id, libc::POLLIN, now);
        }
        let limits = &self.limits;
        let late: Vec<(u64, String)> = self
            .conns
            .iter()
            .filter_map(|(&id, c)| {
                let reason = if !c.validated && past(c.accepted_at, limits.validate_within) {
                    format!("no VALIDATE within {}", secs(limits.validate_within))
                } else if c.stalled.is_none() && c.request_started.is_some_and(|t| past(t, limits.request_within)) {
                    format!(
                        "a request did not arrive within {} ({} bytes so far)",
                        secs(limits.request_within),
                        c.input.len()
                    )
                } else if c.unsent() > 0 && past(c.queued_at, limits.request_within) {
                    // However much it read meanwhile: a client taking its replies a byte at a
                    // time would otherwise hold their bytes of the budget for ever.
                    format!(
                        "its replies were not all read within {} of being queued ({} bytes unsent)",
                        secs(limits.request_within),
                        c.unsent()
                    )
                } else {
                    return None;
                };
                Some((id, reason))
            })
            .collect();
        for (id, reason) in late {
            self.close(id, Some(reason));
        }
        self.unstall(now);
        let limits = &self.limits;
        let late: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.stalled.is_some() && c.request_started.is_some_and(|t| past(t, limits.request_within)))
            .map(|(&id, _)| id)
            .collect();
        let closed_stalled = !late.is_empty();
        for id in late {
            let reason = format!(
                "its request waited longer than {} for room in the server's buffer budget (for its reply, or its \
                 WAIT's keys)",
                secs(self.limits.request_within)
            );
            self.close(id, Some(reason));
        }
        if closed_stalled {
            // What they held (their requests' bytes) may make room for the others.
            self.unstall(now);
        }
    }

    /// Milliseconds until the next deadline (-1: none; 0 while connections have requests left
    /// to serve).
    fn poll_timeout(&self, now: Instant) -> i32 {
        if !self.backlog.is_empty() {
            return 0;
        }
        let limits = &self.limits;
        let next = self
            .conns
            .values()
            .flat_map(|c| {
                [
                    (!c.validated).then(|| later(c.accepted_at, limits.validate_within)).flatten(),
                    c.request_started.and_then(|t| later(t, limits.request_within)),
                    (c.unsent() > 0).then(|| later(c.queued_at, limits.request_within)).flatten(),
                ]
            })
            .flatten()
            .chain(self.accept_paused_until)
            .min();
        match next {
            None => -1,
            Some(at) => {
                let left = at.saturating_duration_since(now);
                // Round up, so that the deadline has passed when poll returns.
                i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
            }
        }
    }
}

/// What serving the start of a connection's input did.
enum Step {
    /// A request of this many bytes was served.
    Served(usize),
    /// The input must grow to this many bytes.
    Need(usize),
}

/// The first request of a connection: must be `VALIDATE` with the magic number.
fn validate(request: Request<'_>) -> Result<(), String> {
    match request {
        Request::Validate { magic: codec::VALIDATION_MAGIC } => Ok(()),
        Request::Validate { magic } => Err(format!("VALIDATE with a wrong magic number {magic:#x}")),
        other => Err(format!("its first request was {}, not VALIDATE", other.query().name())),
    }
}

/// 1, 10, 100, …: when to note a repeated event again.
fn is_power_of_ten(mut n: u64) -> bool {
    while n >= 10 && n.is_multiple_of(10) {
        n /= 10;
    }
    n == 1
}

fn pollfd(fd: std::os::fd::RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd { fd, events, revents: 0 }
}

fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    let count = libc::nfds_t::try_from(fds.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `fds` is an exclusively borrowed slice of `count` initialized pollfd structs;
    // poll(2) reads their `fd` and `events` and writes their `revents`, and keeps no pointer
    // after it returns. Every fd belongs to a socket this thread owns for the whole call.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), count, timeout_ms) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

#[cfg(test)]
mod tests;
