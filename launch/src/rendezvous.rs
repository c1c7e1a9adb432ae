//! The TCP rendezvous: [`Rendezvous`], its [`Options`] and errors.

mod accept;
mod error;
mod join;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

pub use error::RendezvousError;

use crate::env::{EnvError, Master, RankInfo};
use crate::wire::{self, FrameError, Message, MAX_DATA};

/// The variable holding the rendezvous timeout in seconds (fractions allowed).
pub const TIMEOUT_VAR: &str = "GPUCOMM_RENDEZVOUS_TIMEOUT";

/// The timeout when [`TIMEOUT_VAR`] is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Timeouts above this (30 days) are shortened to it.
const MAX_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);

/// Tokens longer than this are refused (they must fit in one hello).
const MAX_TOKEN: usize = 4096;

/// How a [`Rendezvous`] behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The bound on every wait (joining, each broadcast, each barrier). Default 60 s.
    pub timeout: Duration,
    /// The job token every rank must present. Empty: use [`RankInfo::job_token`] (or no token).
    pub token: String,
}

impl Default for Options {
    fn default() -> Self {
        Options { timeout: DEFAULT_TIMEOUT, token: String::new() }
    }
}

impl Options {
    /// The defaults, with the timeout from `GPUCOMM_RENDEZVOUS_TIMEOUT` (seconds) when set.
    pub fn from_env() -> Result<Options, RendezvousError> {
        Options::from_vars(|name| std::env::var_os(name).map(|value| value.to_string_lossy().into_owned()))
    }

    /// Like [`Options::from_env`], with the variables given by `lookup`.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<Options, RendezvousError> {
        let mut options = Options::default();
        if let Some(value) = lookup(TIMEOUT_VAR).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()) {
            options.timeout = value
                .parse::<f64>()
                .ok()
                .filter(|secs| *secs > 0.0)
                .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
                .ok_or_else(|| RendezvousError::BadOptions {
                    detail: format!("{TIMEOUT_VAR}={value} is not a positive number of seconds"),
                })?;
        }
        Ok(options)
    }

    /// These options with another timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Options {
        self.timeout = timeout;
        self
    }

    /// These options with another job token.
    pub fn with_token(mut self, token: impl Into<String>) -> Options {
        self.token = token.into();
        self
    }
}

/// A TCP rendezvous where rank 0 hands byte strings (NCCL / NVSHMEM unique ids) to every rank.
///
/// Rank 0 listens on the master port (the c10d store convention: `MASTER_ADDR:MASTER_PORT`);
/// every other rank connects, says hello (job token, rank, world size) and waits until rank 0 has
/// heard from all of them. After that, [`Rendezvous::broadcast`] and [`Rendezvous::barrier`] can
/// be called any number of times, by every rank in the same order. The bytes on the wire are
/// described in [`wire`](crate::wire).
///
/// * **Where rank 0 listens:** on `MASTER_ADDR` itself when it is an IP address of this machine
///   (so `127.0.0.1` keeps the rendezvous local); on all interfaces (`0.0.0.0`, or `::` for an IPv6
///   address) when `MASTER_ADDR` is a host name, or an IP address this machine does not have (as
///   behind NAT). Host names are resolved by the clients only.
/// * **Time limits:** every wait is bounded by [`Options::timeout`] (60 s unless
///   `GPUCOMM_RENDEZVOUS_TIMEOUT` says otherwise): clients retry connecting with backoff until
///   then (rank 0 may start late), rank 0 accepts until then, and every later read or write gets
///   the same limit.
/// * **Stray connections:** rank 0 turns away connections with a bad hello (garbage, another
///   protocol version, another job's token, another world size, a rank out of range or already
///   taken), tells the client why, remembers the reason for its own timeout message, and keeps
///   waiting for the real ranks.
/// * **Failures** poison the [`Rendezvous`]: the ranks are out of step, and every later call
///   returns [`RendezvousError::Poisoned`]. When rank 0 fails after the rendezvous it tells the
///   clients (an `Abort` message) so they fail at once instead of at their timeout.
#[derive(Debug)]
pub struct Rendezvous {
    rank: usize,
    world_size: usize,
    timeout: Duration,
    seq: u32,
    poisoned: bool,
    role: Role,
}

#[derive(Debug)]
enum Role {
    /// World size 1: no networking.
    Alone,
    /// Rank 0: one connection per other rank, in rank order.
    Server(Vec<Peer>),
    /// Every other rank: the connection to rank 0.
    Client(TcpStream, Master),
}

/// Rank 0's connection to one client.
#[derive(Debug)]
struct Peer {
    rank: usize,
    addr: SocketAddr,
    stream: TcpStream,
}

impl Rendezvous {
    /// Meets the other ranks. Returns once all `world_size` ranks have joined: rank 0 has accepted
    /// everyone and every client has been welcomed. With a world size of 1 nothing touches the
    /// network.
    pub fn connect(info: &RankInfo, options: &Options) -> Result<Rendezvous, RendezvousError> {
        if info.world_size == 0 {
            return Err(EnvError::ZeroSize { name: "world_size".into() }.into());
        }
        if info.rank >= info.world_size {
            return Err(EnvError::RankOutOfRange {
                rank: format!("rank={}", info.rank),
                world_size: format!("world_size={}", info.world_size),
            }
            .into());
        }
        if options.timeout.is_zero() {
            return Err(RendezvousError::BadOptions { detail: "the timeout is zero".into() });
        }
        let timeout = options.timeout.min(MAX_TIMEOUT);
        let new =
            |role| Rendezvous { rank: info.rank, world_size: info.world_size, timeout, seq: 0, poisoned: false, role };
        if info.world_size == 1 {
            return Ok(new(Role::Alone));
        }
        let (Ok(rank), Ok(world)) = (u32::try_from(info.rank), u32::try_from(info.world_size)) else {
            return Err(RendezvousError::BadOptions { detail: format!("world size {} is too large", info.world_size) });
        };
        let master = info.master_or_err()?.clone();
        let token = match (&options.token, &info.job_token) {
            (token, _) if !token.is_empty() => token.clone(),
            (_, Some(token)) => token.clone(),
            (_, None) => String::new(),
        };
        if token.len() > MAX_TOKEN {
            return Err(RendezvousError::BadOptions {
                detail: format!("the job token is {} bytes long; the limit is {MAX_TOKEN}", token.len()),
            });
        }
        let role = if rank == 0 {
            Role::Server(accept::accept_all(&master, info.world_size, &token, timeout)?)
        } else {
            Role::Client(join::join(&master, rank, world, &token, timeout)?, master)
        };
        Ok(new(role))
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Rank 0 calls `make` and sends its bytes (at most [`MAX_DATA`]) to every rank; the other
    /// ranks ignore `make` and return the bytes they receive. Every rank returns the same bytes.
    pub fn broadcast(&mut self, make: impl FnOnce() -> Result<Vec<u8>, String>) -> Result<Vec<u8>, RendezvousError> {
        let seq = self.start()?;
        let during = format!("broadcast #{seq}");
        let timeout = self.timeout;
        let result = match &mut self.role {
            Role::Alone => make_bytes(make),
            Role::Server(peers) => serve_broadcast(peers, seq, make, &during),
            Role::Client(stream, master) => match receive(stream, master, timeout, &during)? {
                Message::Data { seq: got, bytes } if got == seq => Ok(bytes),
                other => Err(unexpected(master, &during, &format!("broadcast data #{seq}"), other)),
            },
        };
        self.finish(result)
    }

    /// Returns once every rank has called `barrier` (as many times as this rank has).
    pub fn barrier(&mut self) -> Result<(), RendezvousError> {
        let seq = self.start()?;
        let during = format!("barrier #{seq}");
        let timeout = self.timeout;
        let result = match &mut self.role {
            Role::Alone => Ok(()),
            Role::Server(peers) => serve_barrier(peers, seq, timeout, &during),
            Role::Client(stream, master) => {
                send_to_master(stream, master, &Message::BarrierArrive { seq }, &during)?;
                match receive(stream, master, timeout, &during)? {
                    Message::BarrierRelease { seq: got } if got == seq => Ok(()),
                    other => Err(unexpected(master, &during, &format!("barrier release #{seq}"), other)),
                }
            }
        };
        self.finish(result)
    }

    fn start(&mut self) -> Result<u32, RendezvousError> {
        if self.poisoned {
            return Err(RendezvousError::Poisoned);
        }
        // Poisoned until `finish` sees success, so an early `?` return leaves it poisoned.
        self.poisoned = true;
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        Ok(seq)
    }

    fn finish<T>(&mut self, result: Result<T, RendezvousError>) -> Result<T, RendezvousError> {
        self.poisoned = result.is_err();
        result
    }
}

fn make_bytes(make: impl FnOnce() -> Result<Vec<u8>, String>) -> Result<Vec<u8>, RendezvousError> {
    let bytes = make().map_err(|reason| RendezvousError::Make { reason })?;
    if bytes.len() > MAX_DATA {
        return Err(RendezvousError::TooLarge { len: bytes.len(), max: MAX_DATA });
    }
    Ok(bytes)
}

fn serve_broadcast(
    peers: &mut [Peer],
    seq: u32,
    make: impl FnOnce() -> Result<Vec<u8>, String>,
    during: &str,
) -> Result<Vec<u8>, RendezvousError> {
    let bytes = make_bytes(make).inspect_err(|e| abort_all(peers, &format!("{e} (during {during})")))?;
    let frame = Message::Data { seq, bytes: bytes.clone() }.encode_frame();
    let frame = frame.map_err(|e| RendezvousError::BadOptions { detail: e.to_string() })?;
    for index in 0..peers.len() {
        send_to_peer(&mut peers[index], &frame, during).inspect_err(|e| abort_all(peers, &e.to_string()))?;
    }
    Ok(bytes)
}

fn serve_barrier(peers: &mut [Peer], seq: u32, timeout: Duration, during: &str) -> Result<(), RendezvousError> {
    let deadline = deadline_after(timeout);
    for index in 0..peers.len() {
        let peer = &mut peers[index];
        let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let result = match read_with_timeout(&mut peer.stream, remaining) {
            Ok(Message::BarrierArrive { seq: got }) if got == seq => Ok(()),
            Ok(other) => Err(RendezvousError::Protocol {
                peer: format!("rank {} at {}", peer.rank, peer.addr),
                during: during.to_string(),
                detail: format!("expected barrier arrival #{seq}, got {}", describe(&other)),
            }),
            Err(error) => Err(peer_error(peer, during, timeout, error)),
        };
        result.inspect_err(|e| abort_all(peers, &e.to_string()))?;
    }
    let frame = Message::BarrierRelease { seq }.encode_frame();
    let frame = frame.map_err(|e| RendezvousError::BadOptions { detail: e.to_string() })?;
    for index in 0..peers.len() {
        send_to_peer(&mut peers[index], &frame, during).inspect_err(|e| abort_all(peers, &e.to_string()))?;
    }
    Ok(())
}

/// `now + timeout`, or `now` if that cannot be represented (timeouts are capped far below).
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).unwrap_or(now)
}

fn read_with_timeout(stream: &mut TcpStream, timeout: Duration) -> Result<Message, FrameError> {
    stream.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    wire::read_message(stream)
}

fn send_to_peer(peer: &mut Peer, frame: &[u8], during: &str) -> Result<(), RendezvousError> {
    let timeout = peer.stream.write_timeout().ok().flatten().unwrap_or(DEFAULT_TIMEOUT);
    peer.stream.write_all(frame).map_err(|e| peer_error(peer, during, timeout, FrameError::from(e)))
}

fn peer_error(peer: &Peer, during: &str, waited: Duration, error: FrameError) -> RendezvousError {
    let during = during.to_string();
    match error {
        FrameError::Closed(detail) => RendezvousError::PeerGone { rank: peer.rank, peer: peer.addr, during, detail },
        FrameError::TimedOut => RendezvousError::PeerTimeout { rank: peer.rank, peer: peer.addr, during, waited },
        FrameError::Malformed(e) => RendezvousError::Protocol {
            peer: format!("rank {} at {}", peer.rank, peer.addr),
            during,
            detail: e.to_string(),
        },
        FrameError::Io(error) => RendezvousError::Io {
            context: format!("talking to rank {} at {} during {during}", peer.rank, peer.addr),
            error,
        },
    }
}

/// Tells every client that rank 0 gives up; best effort, never blocks for long.
fn abort_all(peers: &mut [Peer], reason: &str) {
    let Ok(frame) = (Message::Abort { reason: clip(reason) }).encode_frame() else { return };
    for peer in peers.iter_mut() {
        let _ = peer.stream.set_write_timeout(Some(Duration::from_millis(500)));
        let _ = peer.stream.write_all(&frame);
    }
}

/// At most 8 KiB of `text`, cut at a character boundary (for reasons sent over the wire).
pub(crate) fn clip(text: &str) -> String {
    let mut end = text.len().min(8192);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

fn receive(
    stream: &mut TcpStream,
    master: &Master,
    timeout: Duration,
    during: &str,
) -> Result<Message, RendezvousError> {
    let message = read_with_timeout(stream, timeout).map_err(|e| master_error(master, during, timeout, e))?;
    match message {
        Message::Abort { reason } => Err(RendezvousError::Aborted { master: master.clone(), reason }),
        other => Ok(other),
    }
}

fn send_to_master(
    stream: &mut TcpStream,
    master: &Master,
    message: &Message,
    during: &str,
) -> Result<(), RendezvousError> {
    let frame = message.encode_frame().map_err(|e| RendezvousError::BadOptions { detail: e.to_string() })?;
    let timeout = stream.write_timeout().ok().flatten().unwrap_or(DEFAULT_TIMEOUT);
    stream.write_all(&frame).map_err(|e| master_error(master, during, timeout, FrameError::from(e)))
}

fn master_error(master: &Master, during: &str, waited: Duration, error: FrameError) -> RendezvousError {
    let (master, during) = (master.clone(), during.to_string());
    match error {
        FrameError::Closed(detail) => RendezvousError::MasterGone { master, during, detail },
        FrameError::TimedOut => RendezvousError::MasterTimeout { master, during, waited },
        FrameError::Malformed(e) => {
            RendezvousError::Protocol { peer: format!("rank 0 at {master}"), during, detail: e.to_string() }
        }
        FrameError::Io(error) => {
            RendezvousError::Io { context: format!("talking to rank 0 at {master} during {during}"), error }
        }
    }
}

fn unexpected(master: &Master, during: &str, expected: &str, got: Message) -> RendezvousError {
    RendezvousError::Protocol {
        peer: format!("rank 0 at {master}"),
        during: during.to_string(),
        detail: format!("expected {expected}, got {}", describe(&got)),
    }
}

/// A message kind with its sequence number, for error messages.
fn describe(message: &Message) -> String {
    match message {
        Message::Data { seq, .. } | Message::BarrierArrive { seq } | Message::BarrierRelease { seq } => {
            format!("{} #{seq}", message.name())
        }
        other => other.name().to_string(),
    }
}
