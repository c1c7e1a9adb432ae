//! Rank 0's side of joining: listen, check every hello, welcome everyone at once.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::{clip, deadline_after, Peer, RendezvousError};
use crate::env::Master;
use crate::wire::{frame_len, Message};

/// How long rank 0 sleeps when nothing happened, between polls of its sockets.
const POLL: Duration = Duration::from_millis(2);

/// Listens on the master port and returns one connection per other rank, in rank order.
pub(super) fn accept_all(
    master: &Master,
    world_size: usize,
    token: &str,
    timeout: Duration,
) -> Result<Vec<Peer>, RendezvousError> {
    let deadline = deadline_after(timeout);
    let listener = listen(master)?;
    listener.set_nonblocking(true).map_err(|error| io_error("making the listener non-blocking", error))?;
    let mut lobby = Lobby {
        world_size,
        token,
        joined: (0..world_size).map(|_| None).collect(),
        pending: Vec::new(),
        rejected: Vec::new(),
    };
    loop {
        let accepted = lobby.accept_new(&listener);
        let heard = lobby.poll_pending();
        lobby.check_joined();
        if lobby.complete() {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(lobby.time_out(timeout));
        }
        if !accepted && !heard {
            std::thread::sleep(POLL.min(deadline.duration_since(now)));
        }
    }
    // Late connections are refused from here on.
    drop(listener);
    lobby.welcome(timeout)
}

/// Binds `MASTER_ADDR` when it is an IP address of this machine, else every interface.
fn listen(master: &Master) -> Result<TcpListener, RendezvousError> {
    let port = master.port;
    let ip = master.addr.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok();
    let any = match ip {
        Some(IpAddr::V6(_)) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
        _ => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
    };
    let addr = ip.map_or(any, |ip| SocketAddr::new(ip, port));
    match TcpListener::bind(addr) {
        Ok(listener) => Ok(listener),
        Err(error) if error.kind() == io::ErrorKind::AddrNotAvailable && addr != any => {
            TcpListener::bind(any).map_err(|error| RendezvousError::Bind { addr: any, error })
        }
        Err(error) => Err(RendezvousError::Bind { addr, error }),
    }
}

fn io_error(context: &str, error: io::Error) -> RendezvousError {
    RendezvousError::Io { context: format!("rank 0: {context}"), error }
}

/// A connection that has not yet sent a complete hello.
struct Pending {
    stream: TcpStream,
    addr: SocketAddr,
    buf: Vec<u8>,
}

impl Pending {
    /// Reads what has arrived. `None`: still waiting; `Some(Ok)`: a hello; `Some(Err)`: the reason
    /// to turn the connection away.
    fn poll(&mut self) -> Option<Result<Message, String>> {
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Some(Err("closed the connection before sending a complete hello".into())),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if let Some(done) = self.parse() {
                        return Some(done);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Some(Err(format!("connection failed before its hello: {e}"))),
            }
        }
    }

    fn parse(&self) -> Option<Result<Message, String>> {
        let prefix: [u8; 4] = self.buf.get(..4)?.try_into().ok()?;
        let len = match frame_len(prefix) {
            Ok(len) => len,
            Err(e) => return Some(Err(format!("malformed hello: {e}"))),
        };
        let payload = self.buf.get(4..4 + len)?;
        if self.buf.len() > 4 + len {
            return Some(Err("sent more than a hello before being welcomed".into()));
        }
        Some(Message::decode(payload).map_err(|e| format!("malformed hello: {e}")))
    }
}

/// Rank 0's state while the ranks join.
struct Lobby<'a> {
    world_size: usize,
    token: &'a str,
    /// Index = rank; index 0 (rank 0 itself) stays `None`.
    joined: Vec<Option<Peer>>,
    pending: Vec<Pending>,
    rejected: Vec<String>,
}

impl Lobby<'_> {
    /// Accepts every waiting connection; true if there was one.
    fn accept_new(&mut self, listener: &TcpListener) -> bool {
        let mut any = false;
        loop {
            match listener.accept() {
                Ok((stream, addr)) => {
                    any = true;
                    match stream.set_nonblocking(true) {
                        Ok(()) => self.pending.push(Pending { stream, addr, buf: Vec::new() }),
                        Err(e) => self.rejected.push(format!("could not set up the connection: {e} ({addr})")),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // WouldBlock: nobody waiting. Other errors (a connection reset while queued, out of
                // file descriptors) are transient here: try again at the next poll.
                Err(_) => return any,
            }
        }
    }

    /// Reads from connections still owing a hello; true if one was decided.
    fn poll_pending(&mut self) -> bool {
        let mut decided = false;
        let mut index = 0;
        while index < self.pending.len() {
            let Some(result) = self.pending[index].poll() else {
                index += 1;
                continue;
            };
            decided = true;
            let pending = self.pending.swap_remove(index);
            match result.and_then(|hello| self.validate(hello)) {
                Ok(rank) => {
                    let peer = Peer { rank, addr: pending.addr, stream: pending.stream };
                    if let Some(slot) = self.joined.get_mut(rank) {
                        *slot = Some(peer);
                    }
                }
                Err(reason) => self.reject(pending.stream, pending.addr, reason),
            }
        }
        decided
    }

    /// The rank a hello claims, if rank 0 accepts it.
    fn validate(&self, hello: Message) -> Result<usize, String> {
        let Message::Hello { token, rank, world_size } = hello else {
            return Err(format!("sent {} instead of a hello", hello.name()));
        };
        if token != self.token {
            return Err(format!(
                "job token mismatch: it has {token:?}, rank 0 has {:?} (a process of another job, or left over from \
                 an earlier run)",
                self.token
            ));
        }
        if usize::try_from(world_size).ok() != Some(self.world_size) {
            return Err(format!(
                "world size mismatch: it was started with world size {world_size}, rank 0 with {}",
                self.world_size
            ));
        }
        let rank = usize::try_from(rank).map_err(|_| format!("rank {rank} is out of range"))?;
        if rank == 0 {
            return Err("it claims rank 0, which is this process (two processes were given rank 0)".into());
        }
        match self.joined.get(rank) {
            None => Err(format!("rank {rank} is out of range for world size {}", self.world_size)),
            Some(Some(other)) => {
                Err(format!("rank {rank} already joined from {} (two processes were given rank {rank})", other.addr))
            }
            Some(None) => Ok(rank),
        }
    }

    /// Tells the client why (best effort), records the reason and closes the connection.
    fn reject(&mut self, mut stream: TcpStream, addr: SocketAddr, reason: String) {
        if let Ok(frame) = (Message::Reject { reason: clip(&reason) }).encode_frame() {
            let _ = stream.write_all(&frame);
        }
        let _ = stream.shutdown(Shutdown::Write);
        self.rejected.push(format!("{reason} ({addr})"));
    }

    /// Forgets joined ranks whose connection closed (they may come back) or that spoke too early.
    fn check_joined(&mut self) {
        for slot in self.joined.iter_mut() {
            let Some(peer) = slot else { continue };
            let reason = match peer.stream.peek(&mut [0u8; 1]) {
                Ok(0) => format!("rank {} disconnected before every rank had joined", peer.rank),
                Ok(_) => format!("rank {} sent data before being welcomed", peer.rank),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => continue,
                Err(e) => format!("rank {} lost its connection before every rank had joined: {e}", peer.rank),
            };
            self.rejected.push(format!("{reason} ({})", peer.addr));
            *slot = None;
        }
    }

    fn complete(&self) -> bool {
        self.joined.iter().skip(1).all(Option::is_some)
    }

    /// The timeout error; the joined clients are told (as a rejection) before it is returned.
    fn time_out(mut self, waited: Duration) -> RendezvousError {
        for pending in &self.pending {
            self.rejected.push(format!("sent no complete hello ({})", pending.addr));
        }
        let missing = self.joined.iter().enumerate().skip(1).filter(|(_, p)| p.is_none()).map(|(r, _)| r).collect();
        let error = RendezvousError::TimedOut { waited, world_size: self.world_size, missing, rejected: self.rejected };
        if let Ok(frame) = (Message::Reject { reason: clip(&error.to_string()) }).encode_frame() {
            for peer in self.joined.iter_mut().flatten() {
                let _ = peer.stream.write_all(&frame);
            }
        }
        error
    }

    /// Switches the connections to blocking mode with time limits and welcomes every client.
    fn welcome(self, timeout: Duration) -> Result<Vec<Peer>, RendezvousError> {
        let mut peers: Vec<Peer> = self.joined.into_iter().flatten().collect();
        let frame =
            Message::Welcome.encode_frame().map_err(|e| RendezvousError::BadOptions { detail: e.to_string() })?;
        for index in 0..peers.len() {
            let peer = &mut peers[index];
            let set_up = peer
                .stream
                .set_nonblocking(false)
                .and_then(|()| peer.stream.set_nodelay(true))
                .and_then(|()| peer.stream.set_read_timeout(Some(timeout)))
                .and_then(|()| peer.stream.set_write_timeout(Some(timeout)))
                .map_err(|error| io_error(&format!("setting up the connection of rank {}", peer.rank), error));
            let sent = set_up.and_then(|()| super::send_to_peer(peer, &frame, "the rendezvous (welcome)"));
            sent.inspect_err(|e| super::abort_all(&mut peers, &e.to_string()))?;
        }
        Ok(peers)
    }
}
