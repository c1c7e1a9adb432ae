//! The TCPStore wire format, as PyTorch 2.x's client and both of its servers speak it.
//!
//! Read from PyTorch's sources (`torch/csrc/distributed/c10d/`): the query numbers and response
//! codes from `TCPStoreBackend.hpp` (`QueryType`, `CheckResponseType`, `WaitResponseType`,
//! `validationMagicNumber`), the requests from the client's `SendBuffer` in `TCPStore.cpp`, the
//! replies from `TCPStoreLibUvBackend.cpp` (the default server since PyTorch 2.4) and
//! `TCPStoreBackend.cpp` (the older one), the field encoding from `Utils.hpp` (`tcputil`).
//!
//! A connection carries requests one after the other, with no framing: a request is its query
//! byte and then its fields; the shape of the reply follows from the query. Integers are
//! little-endian (torch writes them in the machine's order, little-endian on every platform it
//! supports). A *key* or *bytes* field is a u64 length and then that many bytes; a *key list* is
//! a u64 count and then that many keys. torch's Python `TCPStore` puts `/` in front of every key
//! it is given: `store.set("a", …)` in Python is the key `/a` here.
//!
//! | Query | Byte | Request fields | Reply |
//! |---|---|---|---|
//! | `VALIDATE` | 0 | u32 magic `0x3C85F7CE` | none; must be a connection's first request |
//! | `SET` | 1 | key, bytes | none |
//! | `COMPARE_SET` | 2 | key, expected bytes, desired bytes | bytes: the value after the operation¹ |
//! | `GET` | 3 | key | bytes (empty when the key is missing²) |
//! | `ADD` | 4 | key, i64 | i64: the sum, which the store keeps as decimal text |
//! | `CHECK` | 5 | key list | u8: 0 every key exists, 1 not |
//! | `WAIT` | 6 | key list | u8 0 (stop waiting), sent once every key exists |
//! | `GETNUMKEYS` | 7 | none | i64: the number of keys |
//! | `DELETE_KEY` | 8 | key | i64: keys deleted (0 or 1) |
//! | `APPEND` | 9 | key, bytes | none |
//! | `MULTI_GET` | 10 | key list | one bytes field per key |
//! | `MULTI_SET` | 11 | u64 count, then count × (key, bytes) | none |
//! | `CANCEL_WAIT` | 12 | none | u8 1 (wait canceled), after a u8 0 if the wait had just ended |
//! | `PING` | 13 | u32 nonce | u32: the nonce |
//!
//! ¹ A missing key is set to `desired` when `expected` is empty; otherwise the reply is
//! `expected` and nothing is stored (PyTorch's behaviour, kept). ² PyTorch's older server closes
//! the connection instead: wait for a key before reading it.
//!
//! A PyTorch client sends `VALIDATE` then `PING` (its pid as the nonce) when it connects; with a
//! world size it then adds 1 to the key `init/`. PyTorch 2.x also defines `QUEUE_PUSH` (14),
//! `QUEUE_POP` (15), `QUEUE_LEN` (16), `LIST_KEYS` (17) and `BARRIER` (18); a
//! [`StoreServer`](super::StoreServer) does not serve them and closes a connection that sends
//! one.
//!
//! [`decode_request`] is total and incremental: any byte string gives a request, a "need more
//! bytes", or an error, and every length is checked against [`Limits`] before it is trusted.

use std::fmt;

use super::Limits;

/// The value a `VALIDATE` request carries (`validationMagicNumber`).
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// `CHECK` reply: every key exists (`CheckResponseType::READY`).
pub const CHECK_READY: u8 = 0;
/// `CHECK` reply: some key is missing (`CheckResponseType::NOT_READY`).
pub const CHECK_NOT_READY: u8 = 1;
/// `WAIT` reply: every key exists (`WaitResponseType::STOP_WAITING`).
pub const WAIT_STOP: u8 = 0;
/// `CANCEL_WAIT` reply (`WaitResponseType::WAIT_CANCELED`).
pub const WAIT_CANCELED: u8 = 1;

/// The bytes of a u64 length or count prefix.
const LEN: usize = 8;

/// A request's first byte (`QueryType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Query {
    /// `VALIDATE` (0).
    Validate,
    /// `SET` (1).
    Set,
    /// `COMPARE_SET` (2).
    CompareSet,
    /// `GET` (3).
    Get,
    /// `ADD` (4).
    Add,
    /// `CHECK` (5).
    Check,
    /// `WAIT` (6).
    Wait,
    /// `GETNUMKEYS` (7).
    GetNumKeys,
    /// `DELETE_KEY` (8).
    DeleteKey,
    /// `APPEND` (9).
    Append,
    /// `MULTI_GET` (10).
    MultiGet,
    /// `MULTI_SET` (11).
    MultiSet,
    /// `CANCEL_WAIT` (12).
    CancelWait,
    /// `PING` (13).
    Ping,
}

impl Query {
    const ALL: [Query; 14] = [
        Query::Validate,
        Query::Set,
        Query::CompareSet,
        Query::Get,
        Query::Add,
        Query::Check,
        Query::Wait,
        Query::GetNumKeys,
        Query::DeleteKey,
        Query::Append,
        Query::MultiGet,
        Query::MultiSet,
        Query::CancelWait,
        Query::Ping,
    ];

    /// The query of a first byte, if it is one this crate knows.
    pub fn from_byte(byte: u8) -> Option<Query> {
        Query::ALL.get(usize::from(byte)).copied()
    }

    /// The byte on the wire.
    pub fn byte(self) -> u8 {
        // The discriminants follow PyTorch's enum order, as `ALL` does.
        self as u8
    }

    /// PyTorch's name for the query (`SET`, `COMPARE_SET`, …).
    pub fn name(self) -> &'static str {
        match self {
            Query::Validate => "VALIDATE",
            Query::Set => "SET",
            Query::CompareSet => "COMPARE_SET",
            Query::Get => "GET",
            Query::Add => "ADD",
            Query::Check => "CHECK",
            Query::Wait => "WAIT",
            Query::GetNumKeys => "GETNUMKEYS",
            Query::DeleteKey => "DELETE_KEY",
            Query::Append => "APPEND",
            Query::MultiGet => "MULTI_GET",
            Query::MultiSet => "MULTI_SET",
            Query::CancelWait => "CANCEL_WAIT",
            Query::Ping => "PING",
        }
    }
}

/// A key and its value.
pub type Pair<'a> = (&'a [u8], &'a [u8]);

/// One request, borrowing its keys and values from the bytes it was decoded from (or from the
/// caller, for encoding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// `VALIDATE`.
    Validate {
        /// Must be [`VALIDATION_MAGIC`].
        magic: u32,
    },
    /// `SET`.
    Set {
        /// The key.
        key: &'a [u8],
        /// The value.
        value: &'a [u8],
    },
    /// `COMPARE_SET`.
    CompareSet {
        /// The key.
        key: &'a [u8],
        /// The value the key must have (empty: the key must be missing).
        expected: &'a [u8],
        /// The value to store.
        desired: &'a [u8],
    },
    /// `GET`.
    Get {
        /// The key.
        key: &'a [u8],
    },
    /// `ADD`.
    Add {
        /// The key.
        key: &'a [u8],
        /// The amount to add.
        delta: i64,
    },
    /// `CHECK`.
    Check {
        /// The keys.
        keys: Vec<&'a [u8]>,
    },
    /// `WAIT`.
    Wait {
        /// The keys.
        keys: Vec<&'a [u8]>,
    },
    /// `GETNUMKEYS`.
    GetNumKeys,
    /// `DELETE_KEY`.
    DeleteKey {
        /// The key.
        key: &'a [u8],
    },
    /// `APPEND`.
    Append {
        /// The key.
        key: &'a [u8],
        /// The bytes to append.
        value: &'a [u8],
    },
    /// `MULTI_GET`.
    MultiGet {
        /// The keys.
        keys: Vec<&'a [u8]>,
    },
    /// `MULTI_SET`.
    MultiSet {
        /// The keys and their values.
        pairs: Vec<Pair<'a>>,
    },
    /// `CANCEL_WAIT`.
    CancelWait,
    /// `PING`.
    Ping {
        /// Echoed by the server.
        nonce: u32,
    },
}

impl Request<'_> {
    /// The request's query.
    pub fn query(&self) -> Query {
        match self {
            Request::Validate { .. } => Query::Validate,
            Request::Set { .. } => Query::Set,
            Request::CompareSet { .. } => Query::CompareSet,
            Request::Get { .. } => Query::Get,
            Request::Add { .. } => Query::Add,
            Request::Check { .. } => Query::Check,
            Request::Wait { .. } => Query::Wait,
            Request::GetNumKeys => Query::GetNumKeys,
            Request::DeleteKey { .. } => Query::DeleteKey,
            Request::Append { .. } => Query::Append,
            Request::MultiGet { .. } => Query::MultiGet,
            Request::MultiSet { .. } => Query::MultiSet,
            Request::CancelWait => Query::CancelWait,
            Request::Ping { .. } => Query::Ping,
        }
    }

    /// Appends the request's bytes to `out`, as PyTorch's client writes them.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.query().byte());
        match self {
            Request::Validate { magic } => out.extend_from_slice(&magic.to_le_bytes()),
            Request::Ping { nonce } => out.extend_from_slice(&nonce.to_le_bytes()),
            Request::Set { key, value } | Request::Append { key, value } => {
                put_bytes(out, key);
                put_bytes(out, value);
            }
            Request::CompareSet { key, expected, desired } => {
                put_bytes(out, key);
                put_bytes(out, expected);
                put_bytes(out, desired);
            }
            Request::Get { key } | Request::DeleteKey { key } => put_bytes(out, key),
            Request::Add { key, delta } => {
                put_bytes(out, key);
                out.extend_from_slice(&delta.to_le_bytes());
            }
            Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
                put_u64(out, keys.len());
                for key in keys {
                    put_bytes(out, key);
                }
            }
            Request::MultiSet { pairs } => {
                put_u64(out, pairs.len());
                for (key, value) in pairs {
                    put_bytes(out, key);
                    put_bytes(out, value);
                }
            }
            Request::GetNumKeys | Request::CancelWait => {}
        }
    }

    /// Checks every length and count against `limits`, as [`decode_request`] would, so that a
    /// client refuses the request before sending it.
    pub fn check(&self, limits: &Limits) -> Result<(), CodecError> {
        let limit = |field, len: usize, max| {
            if len <= max {
                Ok(())
            } else {
                Err(CodecError::TooLong { field, len: len as u64, max })
            }
        };
        let key = |key: &[u8]| limit("key length", key.len(), limits.max_key_len);
        let value = |value: &[u8]| limit("value length", value.len(), limits.max_value_len);
        let count = |n| limit("key count", n, limits.max_keys_per_request);
        match self {
            Request::Set { key: k, value: v } | Request::Append { key: k, value: v } => key(k).and(value(v))?,
            Request::CompareSet { key: k, expected, desired } => key(k).and(value(expected)).and(value(desired))?,
            Request::Get { key: k } | Request::DeleteKey { key: k } | Request::Add { key: k, .. } => key(k)?,
            Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
                count(keys.len())?;
                keys.iter().try_for_each(|k| key(k))?;
            }
            Request::MultiSet { pairs } => {
                count(pairs.len())?;
                pairs.iter().try_for_each(|(k, v)| key(k).and(value(v)))?;
            }
            Request::Validate { .. } | Request::Ping { .. } | Request::GetNumKeys | Request::CancelWait => {}
        }
        let mut bytes = Vec::new();
        self.encode(&mut bytes);
        limit("request length", bytes.len(), limits.max_request_len)
    }
}

/// Appends a length-prefixed byte string (a key or a bytes field).
pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u64(out, bytes.len());
    out.extend_from_slice(bytes);
}

fn put_u64(out: &mut Vec<u8>, value: usize) {
    // usize is at most 64 bits on every supported target.
    out.extend_from_slice(&(value as u64).to_le_bytes());
}

/// What [`decode_request`] found at the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole request, `len` bytes long.
    Complete {
        /// The request.
        request: Request<'a>,
        /// Its length in bytes.
        len: usize,
    },
    /// The buffer holds the start of a request; nothing can be decided before it holds at least
    /// `needed` bytes (never more than [`Limits::max_request_len`]).
    Incomplete {
        /// The smallest buffer length worth decoding again.
        needed: usize,
    },
}

/// Bytes that are not a request this crate accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodecError {
    /// The first byte is not a query this crate serves.
    UnknownQuery {
        /// The byte.
        byte: u8,
    },
    /// A length, count or whole request exceeds its limit.
    TooLong {
        /// What (`key length`, `value length`, `key count`, `request length`, `reply value
        /// length`).
        field: &'static str,
        /// The announced length or count.
        len: u64,
        /// The limit.
        max: usize,
    },
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::UnknownQuery { byte } => match byte {
                14..=18 => {
                    write!(f, "query {byte} (a PyTorch queue, list or barrier query) is not served by this store")
                }
                _ => write!(f, "unknown query byte {byte}: not a TCPStore request"),
            },
            CodecError::TooLong { field, len, max } => write!(f, "{field} {len} is over the limit of {max}"),
        }
    }
}

impl std::error::Error for CodecError {}

/// Why decoding stopped before a whole request.
enum Stop {
    /// The buffer must hold at least this many bytes.
    Need(usize),
    Invalid(CodecError),
}

impl From<CodecError> for Stop {
    fn from(error: CodecError) -> Self {
        Stop::Invalid(error)
    }
}

/// Reads fields from the start of a buffer, checking each announced length first.
struct Fields<'a, 'l> {
    buf: &'a [u8],
    pos: usize,
    limits: &'l Limits,
    /// Keys and values that have not arrived yet are skipped (read as empty) rather than waited
    /// for: decoding then completes once every field but the last key or value has arrived
    /// ([`whole_len`]).
    skim: bool,
}

impl<'a> Fields<'a, '_> {
    /// The next `n` bytes; `n` must already be checked against a limit.
    fn take(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        let end =
            self.pos.checked_add(n).filter(|&end| end <= self.limits.max_request_len).ok_or(CodecError::TooLong {
                field: "request length",
                len: (self.pos as u64).saturating_add(n as u64),
                max: self.limits.max_request_len,
            })?;
        match self.buf.get(self.pos..end) {
            Some(bytes) => {
                self.pos = end;
                Ok(bytes)
            }
            None => Err(Stop::Need(end)),
        }
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Stop> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, Stop> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, Stop> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A u64 length or count, checked against `max` before anything else is read.
    fn len(&mut self, field: &'static str, max: usize) -> Result<usize, Stop> {
        let len = u64::from_le_bytes(self.array::<LEN>()?);
        #[cfg(test)]
        LENGTHS_READ.with(|n| n.set(n.get() + 1));
        match usize::try_from(len) {
            Ok(n) if n <= max => Ok(n),
            _ => Err(CodecError::TooLong { field, len, max }.into()),
        }
    }

    fn key(&mut self) -> Result<&'a [u8], Stop> {
        let n = self.len("key length", self.limits.max_key_len)?;
        self.body(n)
    }

    fn value(&mut self) -> Result<&'a [u8], Stop> {
        let n = self.len("value length", self.limits.max_value_len)?;
        self.body(n)
    }

    /// A key's or value's `n` bytes (checked against their limit); skipped when they have not
    /// arrived yet and `skim` is set.
    fn body(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        match self.take(n) {
            Err(Stop::Need(end)) if self.skim => {
                self.pos = end;
                Ok(&[])
            }
            taken => taken,
        }
    }

    fn keys(&mut self) -> Result<Vec<&'a [u8]>, Stop> {
        let count = self.len("key count", self.limits.max_keys_per_request)?;
        // At most one entry per key already in the buffer (each needs 8 length bytes), so an
        // announced count alone cannot make this allocate.
        let mut keys = Vec::with_capacity(count.min(self.buf.len() / LEN));
        for _ in 0..count {
            keys.push(self.key()?);
        }
        Ok(keys)
    }

    fn pairs(&mut self) -> Result<Vec<Pair<'a>>, Stop> {
        let count = self.len("key count", self.limits.max_keys_per_request)?;
        let mut pairs = Vec::with_capacity(count.min(self.buf.len() / (2 * LEN)));
        for _ in 0..count {
            let key = self.key()?;
            pairs.push((key, self.value()?));
        }
        Ok(pairs)
    }
}

#[cfg(test)]
thread_local! {
    /// Length and count fields read on this thread: how a test sees how often a server reads a
    /// request's fields (on its own thread).
    pub(crate) static LENGTHS_READ: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How far the request at the start of a buffer that grows has been checked, so that checking it
/// again starts where the last look stopped: a request of many keys that arrives a few bytes at a
/// time is read once, not once more for every piece (which cost a server the square of its
/// keys). Only the keys or pairs of a `CHECK`, `WAIT`, `MULTI_GET` or `MULTI_SET` are resumed;
/// the other requests have a few fields, read again each time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Scan {
    /// Where the next key (or pair) starts; 0 before the count has been read.
    pos: usize,
    /// How many keys (or pairs) are still to come.
    left: usize,
}

/// What [`Scan::advance`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scanned {
    /// The whole request is in the buffer, this many bytes long: decode it.
    Whole(usize),
    /// The start of a request.
    Need {
        /// Nothing more can be decided before the buffer holds this many bytes (the end of the
        /// field it stopped in, as [`Decoded::Incomplete`] says).
        needed: usize,
        /// The request is at least this long: `needed` and, for a list, a length prefix for
        /// each key (two for each pair) after the one it stopped in; never more than
        /// [`Limits::max_request_len`].
        least: usize,
    },
}

impl Scan {
    /// Checks the request at the start of `buf` as [`decode_request`] does (every length and
    /// count against `limits`, as soon as it arrives), from where the last call stopped, without
    /// building it. `buf` must be what the last call had, and maybe more; start with a new
    /// `Scan` for every request.
    pub(crate) fn advance(&mut self, buf: &[u8], limits: &Limits) -> Result<Scanned, CodecError> {
        let Some(&first) = buf.first() else { return Ok(Scanned::Need { needed: 1, least: 1 }) };
        let query = Query::from_byte(first).ok_or(CodecError::UnknownQuery { byte: first })?;
        let pairs = match query {
            Query::Check | Query::Wait | Query::MultiGet => false,
            Query::MultiSet => true,
            _ => {
                return Ok(match decode_request(buf, limits)? {
                    Decoded::Complete { len, .. } => Scanned::Whole(len),
                    Decoded::Incomplete { needed } => Scanned::Need { needed, least: needed },
                })
            }
        };
        let mut f = Fields { buf, pos: self.pos.max(1), limits, skim: false };
        let stopped = loop {
            if self.pos == 0 {
                match f.len("key count", limits.max_keys_per_request) {
                    Ok(count) => (self.pos, self.left) = (f.pos, count),
                    Err(stop) => break stop,
                }
            }
            if self.left == 0 {
                return Ok(Scanned::Whole(self.pos));
            }
            let read = f.key().and_then(|_| if pairs { f.value().map(|_| ()) } else { Ok(()) });
            match read {
                Ok(()) => (self.pos, self.left) = (f.pos, self.left - 1),
                Err(stop) => break stop,
            }
        };
        match stopped {
            Stop::Need(needed) => {
                // Each key or pair after the one it stopped in takes at least its length prefixes.
                let item = if pairs { 2 * LEN } else { LEN };
                let rest = self.left.saturating_sub(1).saturating_mul(item);
                Ok(Scanned::Need { needed, least: needed.saturating_add(rest).min(limits.max_request_len) })
            }
            Stop::Invalid(error) => Err(error),
        }
    }
}

/// Decodes the request at the start of `buf`. Total: never panics, and checks every length,
/// count and the request's total length against `limits` before relying on it.
pub fn decode_request<'a>(buf: &'a [u8], limits: &Limits) -> Result<Decoded<'a>, CodecError> {
    decode(buf, limits, false)
}

/// The whole length of the request at the start of `buf`, once every field before its last key
/// or value has arrived (that key or value may still be on its way); `None` before that, when it
/// is invalid, and always for a list (`CHECK`, `WAIT`, `MULTI_GET`, `MULTI_SET`): a list's
/// lengths arrive all through it, and decoding it from its start at every arrival would cost the
/// square of its keys (a list waits for nothing once whole: it is served).
pub(crate) fn whole_len(buf: &[u8], limits: &Limits) -> Option<usize> {
    let list = |q| matches!(q, Query::Check | Query::Wait | Query::MultiGet | Query::MultiSet);
    if buf.first().and_then(|&b| Query::from_byte(b)).is_none_or(list) {
        return None;
    }
    match decode(buf, limits, true) {
        Ok(Decoded::Complete { len, .. }) => Some(len),
        _ => None,
    }
}

fn decode<'a>(buf: &'a [u8], limits: &Limits, skim: bool) -> Result<Decoded<'a>, CodecError> {
    let Some(&first) = buf.first() else { return Ok(Decoded::Incomplete { needed: 1 }) };
    let query = Query::from_byte(first).ok_or(CodecError::UnknownQuery { byte: first })?;
    let mut f = Fields { buf, pos: 1, limits, skim };
    let parsed = (|| -> Result<Request<'a>, Stop> {
        Ok(match query {
            Query::Validate => Request::Validate { magic: f.u32()? },
            Query::Ping => Request::Ping { nonce: f.u32()? },
            Query::Set => Request::Set { key: f.key()?, value: f.value()? },
            Query::Append => Request::Append { key: f.key()?, value: f.value()? },
            Query::CompareSet => Request::CompareSet { key: f.key()?, expected: f.value()?, desired: f.value()? },
            Query::Get => Request::Get { key: f.key()? },
            Query::DeleteKey => Request::DeleteKey { key: f.key()? },
            Query::Add => Request::Add { key: f.key()?, delta: f.i64()? },
            Query::Check => Request::Check { keys: f.keys()? },
            Query::Wait => Request::Wait { keys: f.keys()? },
            Query::MultiGet => Request::MultiGet { keys: f.keys()? },
            Query::MultiSet => Request::MultiSet { pairs: f.pairs()? },
            Query::GetNumKeys => Request::GetNumKeys,
            Query::CancelWait => Request::CancelWait,
        })
    })();
    match parsed {
        Ok(request) => Ok(Decoded::Complete { request, len: f.pos }),
        Err(Stop::Need(needed)) => Ok(Decoded::Incomplete { needed }),
        Err(Stop::Invalid(error)) => Err(error),
    }
}

/// Checks a reply's announced byte length against `max` (a client never allocates more).
pub fn check_reply_len(len: u64, max: usize) -> Result<usize, CodecError> {
    usize::try_from(len).ok().filter(|&n| n <= max).ok_or(CodecError::TooLong { field: "reply value length", len, max })
}

#[cfg(test)]
pub(crate) mod tests;
