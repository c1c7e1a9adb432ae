//! One client connection of the server: its buffers, its pending wait, its deadlines.

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use super::line::Place;
use crate::store::codec::{self, Scan};
use crate::store::Limits;

/// The length of the only request an unvalidated connection may send (`VALIDATE` + magic).
pub(super) const VALIDATE_LEN: usize = 5;

/// The most bytes one read takes (the size of the server's scratch buffer).
pub(super) const READ_CHUNK: usize = 64 << 10;

/// A `WAIT` that has not been answered yet.
pub(super) struct Wait {
    /// The distinct keys still missing.
    pub(super) keys: Vec<Vec<u8>>,
    /// How many of them have not appeared yet.
    pub(super) missing: usize,
    /// The bytes it holds, counted as [`Wait::new`] says.
    pub(super) bytes: usize,
}

/// What one waited key costs the server beyond its bytes, which it holds twice (in the wait and
/// in the table of waiters): the two vectors and their allocations, the table's entry and its
/// list of waiting connections. About 250 bytes measured for 6-byte keys (1000 connections, each
/// waiting for 600 keys of its own, grew the process by 152 MB), rounded up. Counting only the
/// keys' bytes let waits hold forty times what the server counted.
const WAIT_KEY_COST: usize = 256;

impl Wait {
    /// A wait for `keys` (distinct and missing), which holds each key's bytes twice and
    /// [`WAIT_KEY_COST`] more.
    pub(super) fn new(keys: Vec<Vec<u8>>) -> Wait {
        let bytes = Wait::bytes(keys.iter().map(Vec::as_slice));
        Wait { missing: keys.len(), keys, bytes }
    }

    /// What a wait for `keys` holds, counted as [`Wait::new`] counts it.
    pub(super) fn bytes<'k>(keys: impl Iterator<Item = &'k [u8]>) -> usize {
        keys.map(|key| 2 * key.len() + WAIT_KEY_COST).sum()
    }
}

pub(super) struct Conn {
    pub(super) stream: TcpStream,
    pub(super) peer: SocketAddr,
    pub(super) validated: bool,
    pub(super) accepted_at: Instant,
    /// Received bytes: `input[pos..]` is not served yet. What was served is dropped once every
    /// whole request is ([`Conn::compact`]), not once per request (which moved the rest of the
    /// buffer for every request: the square of a buffer of small requests).
    pub(super) input: Vec<u8>,
    /// Where the request being served starts in `input`.
    pub(super) pos: usize,
    /// The length of `input` while it is out being served (still counted as held).
    pub(super) borrowed: usize,
    /// How long `input[pos..]` must be before decoding again is worth it.
    pub(super) needed: usize,
    /// How long the request at `input[pos..]` is at least (so that a request of many keys is
    /// read in reads of up to [`READ_CHUNK`], not a field at a time).
    pub(super) least: usize,
    /// How far the request at `input[pos..]` has been checked.
    pub(super) scan: Scan,
    /// When the first byte of the request at `input[pos..]` arrived.
    pub(super) request_started: Option<Instant>,
    /// Replies queued: `output[sent..]` is not sent yet.
    output: Vec<u8>,
    sent: usize,
    /// When the replies not sent yet began to be queued: when the last reply was queued while
    /// every earlier one had been sent.
    pub(super) queued_at: Instant,
    pub(super) wait: Option<Wait>,
    /// Bytes of the shared budget this connection may hold beyond its allowance.
    pub(super) reserved: usize,
    /// The part of `reserved` set aside for reading the request it is receiving, which counts
    /// toward its address's share ([`Limits::max_reserved_per_peer`](crate::store::Limits)).
    pub(super) reading: usize,
    /// When it was accepted, a request of it was last received whole, or its replies were last
    /// all sent.
    pub(super) last_active: Instant,
    /// The request at the front of `input` waits for budget for its reply (or a `WAIT` for its
    /// keys; a request that changes the store waits before it changes anything): nothing more is
    /// read or served until that fits.
    pub(super) stalled: Option<Stall>,
    /// It has been served a request other than `VALIDATE` and `PING` (it used the store): it is
    /// never evicted.
    pub(super) used: bool,
    /// It was served its share of requests for one wake-up while more were buffered: the rest
    /// are served at the next one, after the other connections' (nothing more is read before).
    pub(super) backlogged: bool,
    /// Its place in the line of connections reading beyond their allowance, for the request it
    /// is receiving, while [`Conn::reading`] is not 0.
    pub(super) place: Option<Place>,
    /// How many of its requests were served.
    pub(super) served: u64,
    /// The length [`Conn::owed`] last found for the request it is receiving (or its bound), and
    /// how much of that request had arrived then.
    pub(super) whole: Cell<Option<(usize, usize)>>,
}

/// What a stalled request ([`Conn::stalled`]) needed room for, and the store's count of changes
/// then ([`Server::changes`](super::Server)): until the store changes, it needs the same.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stall {
    /// The bytes of its reply, or of its `WAIT`'s keys.
    pub(super) bytes: usize,
    pub(super) changes: u64,
}

impl Conn {
    pub(super) fn new(stream: TcpStream, peer: SocketAddr, now: Instant) -> Conn {
        Conn {
            stream,
            peer,
            validated: false,
            accepted_at: now,
            input: Vec::new(),
            pos: 0,
            borrowed: 0,
            needed: 1,
            least: 1,
            scan: Scan::default(),
            request_started: None,
            output: Vec::new(),
            sent: 0,
            queued_at: now,
            wait: None,
            reserved: 0,
            reading: 0,
            last_active: now,
            stalled: None,
            used: false,
            backlogged: false,
            place: None,
            served: 0,
            whole: Cell::new(None),
        }
    }

    /// Bytes held for this connection: unparsed input, unsent output, a pending wait's keys.
    pub(super) fn held(&self) -> usize {
        self.input.len() + self.borrowed + self.unsent() + self.wait.as_ref().map_or(0, |wait| wait.bytes)
    }

    /// How long the request it is receiving is, as far as is known (one byte of the next when
    /// none is under way).
    pub(super) fn request_len(&self) -> usize {
        self.needed.max(self.least).max(self.input.len() + 1)
    }

    /// The most budget, beyond what it set aside, that it may need to hold the rest of that
    /// request: for the request's whole length once every length field of it has arrived, for
    /// the longest request `limits` allow before. The length is decoded again only when more of
    /// the request has arrived since it was last asked ([`Conn::whole`]).
    pub(super) fn owed(&self, limits: &Limits) -> usize {
        let input = self.input.get(self.pos..).unwrap_or_default();
        let whole = match self.whole.get() {
            Some((arrived, whole)) if arrived == input.len() => whole,
            _ => {
                let whole = codec::whole_len(input, limits).unwrap_or(limits.max_request_len);
                self.whole.set(Some((input.len(), whole)));
                whole
            }
        };
        let whole = whole.max(self.request_len() - self.pos);
        self.held()
            .saturating_sub(input.len())
            .saturating_add(whole)
            .saturating_sub(limits.connection_allowance + self.reserved)
    }

    /// Bytes of replies not sent yet.
    pub(super) fn unsent(&self) -> usize {
        self.output.len() - self.sent
    }

    /// When it became idle, if it may be closed to make room for a new connection: validated, it
    /// has sent nothing but `VALIDATE` and `PING`, and has no request under way, no pending wait
    /// and no unsent reply. A connection that used the store (a rank's, which writes its claim
    /// first; a PyTorch client's at work) keeps its place however long it stays quiet.
    pub(super) fn evictable_since(&self) -> Option<Instant> {
        let quiet = self.validated && !self.used && self.wait.is_none() && self.held() == 0;
        quiet.then_some(self.last_active)
    }

    /// Reads at most `chunk.len()` bytes through `chunk`. `Ok(false)`: the peer closed the
    /// connection.
    pub(super) fn read(&mut self, chunk: &mut [u8], now: Instant) -> io::Result<bool> {
        loop {
            match self.stream.read(chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    if self.input.is_empty() {
                        self.request_started = Some(now);
                    }
                    self.input.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes what the socket takes (without moving what is left: a client that takes a few
    /// bytes at a time must not make the server copy the rest each time).
    pub(super) fn flush(&mut self, now: Instant) -> io::Result<()> {
        while self.unsent() > 0 {
            match self.stream.write(&self.output[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.sent += n;
                    if self.unsent() == 0 {
                        self.output.clear();
                        self.sent = 0;
                        self.last_active = now;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        if self.output.is_empty() && self.output.capacity() > READ_CHUNK {
            self.output = Vec::new();
        }
        Ok(())
    }

    /// Queues a reply.
    pub(super) fn reply(&mut self, bytes: &[u8], now: Instant) {
        if self.unsent() == 0 {
            self.queued_at = now;
        }
        // What was sent goes once it is as long as what was not (each byte moves at most once
        // on average), so that a client that reads promptly but never all makes it hold little.
        if self.sent > 0 && self.sent >= self.unsent() {
            self.output.drain(..self.sent);
            self.sent = 0;
        }
        self.output.extend_from_slice(bytes);
    }

    /// Moves past a served request of `len` bytes ([`Conn::compact`] drops it).
    pub(super) fn consume(&mut self, len: usize, now: Instant) {
        self.pos += len;
        self.served += 1;
        self.whole.set(None);
        self.needed = 1;
        self.least = 1;
        self.scan = Scan::default();
        self.last_active = now;
        self.request_started = (self.pos < self.input.len()).then_some(now);
    }

    /// Drops the served requests from the input; returns how many bytes that moved (those not
    /// served yet).
    pub(super) fn compact(&mut self) -> usize {
        if self.pos == 0 {
            return 0;
        }
        let moved = self.input.len() - self.pos;
        self.input.drain(..self.pos);
        self.pos = 0;
        if self.input.is_empty() && self.input.capacity() > READ_CHUNK {
            self.input = Vec::new();
        }
        moved
    }
}
