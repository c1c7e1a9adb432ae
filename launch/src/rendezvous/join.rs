//! A client's side of joining: reach rank 0 (retrying until the deadline), say hello, wait for
//! the welcome.

use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::{deadline_after, master_error, read_with_timeout, RendezvousError};
use crate::env::Master;
use crate::wire::{FrameError, Message};

const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The limit of one connection attempt (more attempts follow until the deadline).
const ATTEMPT: Duration = Duration::from_secs(2);

/// Joins rank 0 and returns the connection, with `timeout` as its read and write limits.
pub(super) fn join(
    master: &Master,
    rank: u32,
    world_size: u32,
    token: &str,
    timeout: Duration,
) -> Result<TcpStream, RendezvousError> {
    let deadline = deadline_after(timeout);
    let hello = Message::Hello { token: token.to_string(), rank, world_size }
        .encode_frame()
        .map_err(|e| RendezvousError::BadOptions { detail: e.to_string() })?;
    let mut backoff = FIRST_BACKOFF;
    let mut last_error = String::from("no attempt was made");
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(RendezvousError::Unreachable { master: master.clone(), waited: timeout, last_error });
        }
        match connect_once(master, deadline - now) {
            Ok(stream) => return handshake(stream, master, &hello, deadline, timeout),
            Err(error) => last_error = error,
        }
        std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One attempt at every address `master` resolves to.
fn connect_once(master: &Master, remaining: Duration) -> Result<TcpStream, String> {
    let host = master.addr.trim_start_matches('[').trim_end_matches(']');
    let addrs = (host, master.port).to_socket_addrs().map_err(|e| format!("cannot resolve {host}: {e}"))?;
    let limit = remaining.min(ATTEMPT).max(Duration::from_millis(1));
    let mut last = format!("{host} resolves to no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, limit) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

fn handshake(
    mut stream: TcpStream,
    master: &Master,
    hello: &[u8],
    deadline: Instant,
    timeout: Duration,
) -> Result<TcpStream, RendezvousError> {
    const DURING: &str = "the rendezvous (waiting for every rank to join)";
    let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let io = |context: &str, error| RendezvousError::Io { context: format!("{context} for rank 0 at {master}"), error };
    stream.set_nodelay(true).map_err(|e| io("setting up the connection", e))?;
    stream.set_write_timeout(Some(remaining)).map_err(|e| io("setting up the connection", e))?;
    stream.write_all(hello).map_err(|e| master_error(master, DURING, timeout, FrameError::from(e)))?;
    match read_with_timeout(&mut stream, remaining) {
        Ok(Message::Welcome) => {
            stream.set_read_timeout(Some(timeout)).map_err(|e| io("setting up the connection", e))?;
            stream.set_write_timeout(Some(timeout)).map_err(|e| io("setting up the connection", e))?;
            Ok(stream)
        }
        Ok(Message::Reject { reason }) => Err(RendezvousError::Rejected { master: master.clone(), reason }),
        Ok(Message::Abort { reason }) => Err(RendezvousError::Aborted { master: master.clone(), reason }),
        Ok(other) => Err(RendezvousError::Protocol {
            peer: format!("rank 0 at {master}"),
            during: DURING.to_string(),
            detail: format!("expected a welcome, got {}", super::describe(&other)),
        }),
        Err(error) => Err(master_error(master, DURING, timeout, error)),
    }
}
