//! [`Limits`]: how much one request, one connection and the whole store may hold.

use std::time::Duration;

/// The bounds a [`StoreServer`](super::StoreServer) enforces and a [`StoreClient`](super::StoreClient)
/// checks before sending. Every announced length is checked against them before anything is
/// allocated for it.
///
/// PyTorch's own server (libuv backend) allows keys of 8 KiB and values of 8 MiB; these defaults
/// are smaller because a rendezvous needs little (a unique id is 128 bytes) and an exposed port
/// must not let strangers use much memory.
///
/// **Memory bound.** Bytes a server holds for its connections (unparsed request bytes, unsent
/// replies, the keys of a pending `WAIT`, counted with what the server keeps for each key)
/// stay at or below
/// `max_buffered + max_connections × connection_allowance` (with the defaults 32 MiB + 1024 ×
/// 8 KiB = 40 MiB), and the store's keys and values at or below `max_store_bytes` (a value that
/// `APPEND`s grow may keep up to an eighth of its length more allocated, unused). Beyond a
/// pending `WAIT`'s keys, a connection cannot hold its share for long: a request must arrive,
/// and queued replies must be read, within `request_within`; the pending `WAIT`s of one
/// address hold at most `max_wait_bytes_per_peer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The longest key, in bytes. Default 4 KiB.
    pub max_key_len: usize,
    /// The longest value, in bytes. Default 1 MiB.
    pub max_value_len: usize,
    /// The most keys one `CHECK`, `WAIT`, `MULTI_GET` or `MULTI_SET` may name. Default 4096.
    pub max_keys_per_request: usize,
    /// The longest request, in bytes, fields and length prefixes included. Default 4 MiB.
    pub max_request_len: usize,
    /// The longest reply, in bytes (a `MULTI_GET` of large values); also the most unsent reply
    /// bytes a connection may have before it is dropped as a client that does not read its
    /// replies. Default 4 MiB.
    pub max_reply_len: usize,
    /// The most bytes of keys and values the store holds. Default 64 MiB.
    pub max_store_bytes: usize,
    /// The most keys the store holds. Default 65 536.
    pub max_store_keys: usize,
    /// The most open connections, validated or not. Default 1024. When they are all open, a new
    /// connection takes the place of one that never used the store and has been idle for
    /// `evict_idle_after`, or is turned away if none has (see `evict_idle_after`). A rendezvous's rank 0 raises it (and `max_store_keys`,
    /// `max_store_bytes`) for its store to what the world size needs: see
    /// [`Options::store_limits`](crate::Options::store_limits).
    pub max_connections: usize,
    /// The most open connections from one IP address, validated or not; more are turned away.
    /// Default 256: the ranks of a node all connect from its one address (one connection each
    /// for the rendezvous), so the cap leaves room for large nodes, while one host (an attacker)
    /// can take at most a quarter of the default `max_connections` (a host with many addresses,
    /// such as an IPv6 prefix, is not bounded by it). Raise it when many clients reach the store
    /// through one address (a NAT, a proxy), and on a rendezvous's rank 0 when a node starts more
    /// ranks than this: rank 0 does not raise it for the world size.
    pub max_per_peer: usize,
    /// How long a validated connection that never used the store (it sent nothing but
    /// `VALIDATE` and `PING`) must have been idle (no request received and no reply sent since,
    /// nothing buffered, no pending `WAIT`) before the server may close it to make room for a new
    /// connection once `max_connections` are open: of those idle that long, one from the address
    /// with the most connections goes first, the longest idle of them. Default 30 s. A connection
    /// that sent any other request (a rank's writes its claim first, a PyTorch client at work
    /// writes keys) is never evicted, however long it stays quiet: otherwise a stranger filling
    /// the connections and keeping its own busy got the ranks that were quiet between barriers
    /// evicted, failing their next barrier. Idle connections are closed for nothing else: ranks
    /// may stay quiet for long between barriers, and PyTorch's client does not reconnect.
    pub evict_idle_after: Duration,
    /// The most bytes the pending `WAIT`s of one IP address's connections may hold, counted as
    /// the memory bound counts them (each missing key's bytes twice and 256 more). Default
    /// 4 MiB (an eighth of the default `max_buffered`): a rank waits for at most 512 keys at a
    /// time (rank 0's 512 claims hold about 180 KB), a PyTorch client's wait for 100 keys of
    /// 40 bytes about 34 KB. A `WAIT` that would pass it closes its connection (the ones before
    /// it from that address keep waiting). A pending `WAIT` has no deadline, and a connection
    /// that used the store is never evicted, so without this bound one stranger's connections
    /// waiting for keys that never come held the whole `max_buffered` for good, and the ranks'
    /// own waits were refused; holding it all now takes the waits of at least `max_buffered /
    /// max_wait_bytes_per_peer` addresses, 8 with the defaults (a host with many addresses, such
    /// as an IPv6 prefix, is not bounded by it).
    /// Raise it, with `max_per_peer`, when many clients that wait for many keys reach the store
    /// through one address.
    pub max_wait_bytes_per_peer: usize,
    /// The most bytes of `max_buffered` that the connections of one IP address may have set
    /// aside for reading the requests they are receiving (their replies and pending `WAIT`s do
    /// not count): a connection of an address at its share reads nothing more (within
    /// `request_within`) until the address's others give some back. Default 4 MiB (an eighth of
    /// the default `max_buffered`). Budget is set aside in step with what arrives (at most one
    /// read of 64 KiB ahead of it), never for the length a request announces; but what a request
    /// announces holds up the address's later ones: an address's connections that read beyond
    /// their allowance form a line, and one sets the share aside only while what those ahead of
    /// it may still need (a request's whole length once the fields before its last key or value
    /// have arrived; `max_request_len` before that, and for lists) fits beside it, so that
    /// several large requests of one address arriving together finish one after another instead
    /// of each holding part of the share until `request_within` closes them all. So one
    /// connection of an address whose request announces much (or has not told its length yet)
    /// holds up the address's other large requests, for up to `request_within`. Keep it at least
    /// `max_request_len`, or the largest requests cannot be read.
    pub max_reserved_per_peer: usize,
    /// The most connections that have not yet sent `VALIDATE`. Default 64. When they are all
    /// open, a new connection takes the place of the oldest of them (once those whose `VALIDATE`
    /// has arrived are counted as validated), rather than being turned away: a client sends
    /// `VALIDATE` as soon as it connects, so connections opened and left silent cannot keep
    /// clients out.
    pub max_pending: usize,
    /// The most connections from one IP address that have not yet sent `VALIDATE`; a new one
    /// takes the place of that address's oldest (which has not sent `VALIDATE` yet after what it
    /// sent was read), rather than being turned away, so that a process sharing an address with
    /// clients cannot keep them out with silent connections. Default 8: before it, one address
    /// holding `max_pending` silent connections (and reopening each as soon as it was closed) kept
    /// every other client out.
    pub max_pending_per_peer: usize,
    /// How long a new connection has to send `VALIDATE` before it is closed. Default 2 s (a
    /// client sends it as soon as it connects; what arrived is read before a connection is
    /// closed, however late the server looks).
    pub validate_within: Duration,
    /// How long a request may take to arrive, from its first byte to its last; and how long a
    /// connection's replies may take to be read: once a reply is queued for a connection that had
    /// no unsent reply, all its unsent replies must be sent within this time, however much it
    /// read meanwhile, or it is dropped. So a client must read at least `max_reply_len /
    /// request_within` bytes per second for its largest replies (with the defaults 4 MiB / 10 s,
    /// about 410 KiB/s), and one that sends requests before reading earlier replies must let
    /// its unsent replies run out within this time; a client reading a byte at a time holds its
    /// share of the `max_buffered` budget for at most this long. Default 10 s.
    pub request_within: Duration,
    /// Bytes every connection may hold without drawing on `max_buffered`. Default 8 KiB (a key,
    /// its length prefixes and a small value).
    pub connection_allowance: usize,
    /// Bytes shared by all connections beyond their allowance: the rest of a request larger than
    /// the allowance is read as budget can be set aside here for it, a read at a time (one
    /// address's connections at most `max_reserved_per_peer`), and a request whose reply does not
    /// fit (a `GET`, a `MULTI_GET`, a `COMPARE_SET`, which changes nothing before it fits), or a
    /// `WAIT` whose keys do not, waits (its connection reading nothing more) until it does, or
    /// until its request deadline passes (then its connection is dropped). One address's pending `WAIT`s hold at most
    /// `max_wait_bytes_per_peer` of it. Default 32 MiB.
    pub max_buffered: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_len: 4 << 10,
            max_value_len: 1 << 20,
            max_keys_per_request: 4096,
            max_request_len: 4 << 20,
            max_reply_len: 4 << 20,
            max_store_bytes: 64 << 20,
            max_store_keys: 65_536,
            max_connections: 1024,
            max_per_peer: 256,
            max_wait_bytes_per_peer: 4 << 20,
            max_reserved_per_peer: 4 << 20,
            evict_idle_after: Duration::from_secs(30),
            max_pending: 64,
            max_pending_per_peer: 8,
            validate_within: Duration::from_secs(2),
            request_within: Duration::from_secs(10),
            connection_allowance: 8 << 10,
            max_buffered: 32 << 20,
        }
    }
}

impl Limits {
    /// The bound on the bytes a server holds for its connections:
    /// `max_buffered + max_connections × connection_allowance`.
    pub fn buffered_bound(&self) -> usize {
        self.max_buffered.saturating_add(self.max_connections.saturating_mul(self.connection_allowance))
    }
}
