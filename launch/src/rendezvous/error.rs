//! [`RendezvousError`]: everything that can go wrong while the ranks meet.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::env::{EnvError, Master};

/// A rendezvous failure. Every message says which side saw what, and what to check.
#[derive(Debug)]
#[non_exhaustive]
pub enum RendezvousError {
    /// The [`RankInfo`](crate::RankInfo) cannot be used (no master address, rank out of range).
    Env(EnvError),
    /// The [`Options`](super::Options) are invalid (e.g. `GPUCOMM_RENDEZVOUS_TIMEOUT=abc`).
    BadOptions {
        /// What is wrong.
        detail: String,
    },
    /// Rank 0 could not listen on the master port.
    Bind {
        /// The address it tried to bind.
        addr: SocketAddr,
        /// The OS error.
        error: io::Error,
    },
    /// Rank 0: not every rank joined before the deadline.
    TimedOut {
        /// How long rank 0 waited (its timeout).
        waited: Duration,
        /// The job's world size.
        world_size: usize,
        /// The ranks that never joined.
        missing: Vec<usize>,
        /// The connections rank 0 turned away: reason and peer address.
        rejected: Vec<String>,
    },
    /// A client could not reach rank 0 before the deadline.
    Unreachable {
        /// Where rank 0 should be listening.
        master: Master,
        /// How long the client tried.
        waited: Duration,
        /// The last connection error.
        last_error: String,
    },
    /// Rank 0 turned this process away.
    Rejected {
        /// Rank 0's address.
        master: Master,
        /// Rank 0's reason.
        reason: String,
    },
    /// Rank 0 gave up after the rendezvous and told the clients why.
    Aborted {
        /// Rank 0's address.
        master: Master,
        /// Rank 0's reason.
        reason: String,
    },
    /// The connection to rank 0 closed: rank 0 exited, crashed or was killed.
    MasterGone {
        /// Rank 0's address.
        master: Master,
        /// The operation in progress.
        during: String,
        /// How the connection ended.
        detail: String,
    },
    /// Rank 0 did not answer in time.
    MasterTimeout {
        /// Rank 0's address.
        master: Master,
        /// The operation in progress.
        during: String,
        /// How long this rank waited.
        waited: Duration,
    },
    /// Rank 0: a client's connection closed.
    PeerGone {
        /// The client's rank.
        rank: usize,
        /// The client's address.
        peer: SocketAddr,
        /// The operation in progress.
        during: String,
        /// How the connection ended.
        detail: String,
    },
    /// Rank 0: a client did not answer in time.
    PeerTimeout {
        /// The client's rank.
        rank: usize,
        /// The client's address.
        peer: SocketAddr,
        /// The operation in progress.
        during: String,
        /// How long rank 0 waited.
        waited: Duration,
    },
    /// A peer sent something the protocol does not allow at this point.
    Protocol {
        /// Who sent it (`rank 0 at host:port`, `rank 3 at addr`).
        peer: String,
        /// The operation in progress.
        during: String,
        /// What was wrong.
        detail: String,
    },
    /// Rank 0's closure for [`broadcast`](super::Rendezvous::broadcast) failed.
    Make {
        /// The closure's error.
        reason: String,
    },
    /// A broadcast's bytes exceed the wire limit.
    TooLarge {
        /// The byte count.
        len: usize,
        /// The limit ([`MAX_DATA`](crate::wire::MAX_DATA)).
        max: usize,
    },
    /// An earlier operation on this [`Rendezvous`](super::Rendezvous) failed; the ranks are no
    /// longer in step, so it cannot be used again.
    Poisoned,
    /// Another I/O failure.
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        error: io::Error,
    },
}

/// `3s`, `2.5s`, `0.25s`.
pub(crate) fn secs(d: Duration) -> String {
    format!("{}s", (d.as_secs_f64() * 1000.0).round() / 1000.0)
}

const RAISE_TIMEOUT: &str = "or raise GPUCOMM_RENDEZVOUS_TIMEOUT";

impl fmt::Display for RendezvousError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RendezvousError::Env(e) => write!(f, "cannot rendezvous: {e}"),
            RendezvousError::BadOptions { detail } => write!(f, "invalid rendezvous options: {detail}"),
            RendezvousError::Bind { addr, error } => write!(
                f,
                "rank 0 cannot listen on {addr} (MASTER_PORT {}): {error}; choose another MASTER_PORT (is another \
                 job or an earlier run still using it?), and check that MASTER_ADDR names rank 0's host",
                addr.port()
            ),
            RendezvousError::TimedOut { waited, world_size, missing, rejected } => {
                let joined = world_size - missing.len();
                write!(
                    f,
                    "rendezvous timed out after {}: {joined} of {world_size} ranks joined; missing ranks {missing:?}; \
                     rejected connections: ",
                    secs(*waited)
                )?;
                if rejected.is_empty() {
                    f.write_str("none")?;
                } else {
                    write!(f, "[{}]", rejected.join("; "))?;
                }
                write!(
                    f,
                    ". Start the missing ranks with the same MASTER_ADDR, MASTER_PORT and world size, {RAISE_TIMEOUT}"
                )
            }
            RendezvousError::Unreachable { master, waited, last_error } => write!(
                f,
                "could not reach rank 0 at {master} within {} (last error: {last_error}); check that rank 0 is \
                 running and that every rank uses the same MASTER_ADDR and MASTER_PORT, {RAISE_TIMEOUT}",
                secs(*waited)
            ),
            RendezvousError::Rejected { master, reason } => {
                write!(f, "rank 0 at {master} rejected this process: {reason}")
            }
            RendezvousError::Aborted { master, reason } => write!(f, "rank 0 at {master} aborted: {reason}"),
            RendezvousError::MasterGone { master, during, detail } => write!(
                f,
                "rank 0 at {master} went away during {during} ({detail}): it exited, crashed or was killed; see \
                 its output"
            ),
            RendezvousError::MasterTimeout { master, during, waited } => write!(
                f,
                "rank 0 at {master} did not answer within {} during {during}: it may be stuck, or waiting for \
                 another rank; {RAISE_TIMEOUT} if it is just slow",
                secs(*waited)
            ),
            RendezvousError::PeerGone { rank, peer, during, detail } => write!(
                f,
                "rank {rank} ({peer}) went away during {during} ({detail}): it exited, crashed or was killed; see \
                 its output"
            ),
            RendezvousError::PeerTimeout { rank, peer, during, waited } => write!(
                f,
                "rank {rank} ({peer}) did not reach {during} within {}: it may be stuck, or the ranks call \
                 broadcast/barrier in different orders; {RAISE_TIMEOUT} if it is just slow",
                secs(*waited)
            ),
            RendezvousError::Protocol { peer, during, detail } => write!(
                f,
                "protocol error with {peer} during {during}: {detail} (do all ranks run the same program, and \
                 call broadcast/barrier in the same order?)"
            ),
            RendezvousError::Make { reason } => {
                write!(f, "rank 0 could not produce the bytes to broadcast: {reason}")
            }
            RendezvousError::TooLarge { len, max } => {
                write!(f, "cannot broadcast {len} bytes: the limit is {max} bytes per broadcast")
            }
            RendezvousError::Poisoned => f.write_str(
                "an earlier rendezvous operation failed, so the ranks are out of step; start a new rendezvous",
            ),
            RendezvousError::Io { context, error } => write!(f, "{context}: {error}"),
        }
    }
}

impl std::error::Error for RendezvousError {}

impl From<EnvError> for RendezvousError {
    fn from(error: EnvError) -> Self {
        RendezvousError::Env(error)
    }
}
