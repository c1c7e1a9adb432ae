//! [`RendezvousError`]: everything that can go wrong while the ranks meet.
//!
//! No message ever contains the job key, and none contains the job identity itself (only the
//! variables it came from and a hash).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::deadline::secs;
use crate::env::{EnvError, Master};
use crate::store::StoreError;

/// A rendezvous failure. Every message says which side saw what, and what to check.
#[derive(Debug)]
#[non_exhaustive]
pub enum RendezvousError {
    /// The [`RankInfo`](crate::RankInfo) cannot be used (no master address, rank out of range).
    Env(EnvError),
    /// The [`Options`](super::Options) are invalid; the message names the variable or field.
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
    /// Rank 0 cannot have a file descriptor for each rank's connection to the store it hosts:
    /// even its hard `RLIMIT_NOFILE` is too low (reported before it listens, instead of ranks
    /// being turned away until the join times out).
    TooFewDescriptors {
        /// The job's world size.
        world_size: usize,
        /// The descriptors rank 0 needs: those open, one per rank, and the store's own.
        needed: u64,
        /// This process's hard limit (`ulimit -Hn`).
        hard_limit: u64,
        /// The descriptors this process had open.
        open: usize,
    },
    /// `MASTER_ADDR` does not resolve (reported at once, not retried).
    Resolve {
        /// The store's address.
        master: Master,
        /// The resolver's error.
        error: String,
    },
    /// No store answered at the master address before the deadline.
    Unreachable {
        /// The store's address.
        master: Master,
        /// How long this rank tried.
        waited: Duration,
        /// The last connection error.
        last_error: String,
    },
    /// The store at the master address is not this job's: another job's rank 0, a store
    /// without a gpucomm owner record, another world size or key, or a rendezvous rank 0 has
    /// already left.
    WrongStore {
        /// The store's address.
        master: Master,
        /// What does not match, and what to do.
        detail: String,
    },
    /// This process's rank was already claimed by another process: the rendezvous is aborted
    /// on every rank.
    Duplicate {
        /// The rank.
        rank: usize,
        /// The process that claimed it first.
        first: String,
        /// This process.
        me: String,
    },
    /// Every rank had already joined when this process came: a second copy of a rank, or a
    /// process of a later run with the same job identity that finds an earlier run's keys (in a
    /// store that outlives runs, such as torchrun's agent store shared by `./a && ./b`, or an
    /// external one).
    LateJoiner {
        /// The rank.
        rank: usize,
        /// The process that holds it.
        holder: String,
        /// Where the job identity came from (variable names, or `Options::token`); `None` when
        /// the job has none.
        identity: Option<String>,
        /// The store, why an earlier run's keys may be in it, and what else keeps runs apart
        /// there.
        store: String,
    },
    /// Rank 0, under torchrun's agent store: a later start of rank 0 of this job opened a newer
    /// generation of the rendezvous while this one was joining (a second copy of rank 0, or a
    /// restart of the job while this process was still joining); the other ranks went on to
    /// the newer one.
    Superseded {
        /// The generation this process opened.
        generation: i64,
    },
    /// A record or value in the store is not what a process with this job's key wrote (an
    /// impostor, or ranks started with different keys); the rendezvous is aborted.
    Forged {
        /// What failed to verify.
        detail: String,
    },
    /// Another rank gave up and said why.
    Aborted {
        /// Its reason (which names it).
        reason: String,
    },
    /// A wait passed its deadline.
    TimedOut {
        /// The operation (`the rendezvous (joining)`, `broadcast #2`, `barrier #3`).
        during: String,
        /// The time limit.
        waited: Duration,
        /// Ranks known to be missing (empty when this rank cannot tell).
        missing: Vec<usize>,
        /// What this rank was waiting for.
        waiting_for: String,
        /// What rank 0's store saw (accept errors, dropped connections), when this process
        /// hosts it.
        store_notes: Vec<String>,
    },
    /// Talking to the store failed.
    Store {
        /// The store's address.
        master: Master,
        /// The operation in progress.
        during: String,
        /// The failure.
        error: Box<StoreError>,
    },
    /// Rank 0's closure for [`broadcast`](super::Rendezvous::broadcast) failed.
    Make {
        /// The closure's error.
        reason: String,
    },
    /// A broadcast's bytes exceed [`MAX_BROADCAST`](super::MAX_BROADCAST).
    TooLarge {
        /// The byte count.
        len: usize,
        /// The limit.
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

const RAISE_TIMEOUT: &str = "or raise GPUCOMM_RENDEZVOUS_TIMEOUT";

impl fmt::Display for RendezvousError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RendezvousError::Env(e) => write!(f, "cannot rendezvous: {e}"),
            RendezvousError::BadOptions { detail } => write!(f, "invalid rendezvous options: {detail}"),
            RendezvousError::Bind { addr, error } => write!(
                f,
                "rank 0 cannot listen on {addr} (MASTER_PORT {}): {error}; choose another MASTER_PORT (is another \
                 job or an earlier run still using it?), and check that MASTER_ADDR names rank 0's host. If a store \
                 already runs there for this job (torchrun's agent sets TORCHELASTIC_USE_AGENT_STORE=True; a \
                 Python TCPStore(is_master=True)), set GPUCOMM_STORE=external to join it",
                addr.port()
            ),
            RendezvousError::TooFewDescriptors { world_size, needed, hard_limit, open } => write!(
                f,
                "rank 0 cannot host the store of {world_size} ranks: it needs {needed} file descriptors (one for \
                 each rank's connection, {open} already open, and a few for the store), and its hard limit \
                 (RLIMIT_NOFILE, `ulimit -Hn`) is {hard_limit}. Start rank 0 with a hard limit of at least \
                 {needed} (which root raises: /etc/security/limits.conf, or LimitNOFILE= of the service that \
                 starts the job) and `ulimit -n {needed}` before it, or host the store elsewhere \
                 (GPUCOMM_STORE=external)"
            ),
            RendezvousError::Resolve { master, error } => write!(
                f,
                "MASTER_ADDR {:?} does not resolve ({error}); set MASTER_ADDR to rank 0's host name or IP address",
                master.addr
            ),
            RendezvousError::Unreachable { master, waited, last_error } => write!(
                f,
                "no store answered at {master} within {} (last error: {last_error}); check that rank 0 (or the \
                 store's host) is running and that every rank uses the same MASTER_ADDR and MASTER_PORT, \
                 {RAISE_TIMEOUT}",
                secs(*waited)
            ),
            RendezvousError::WrongStore { master, detail } => write!(f, "the store at {master} {detail}"),
            RendezvousError::Duplicate { rank, first, me } => write!(
                f,
                "rank {rank} was claimed twice: first by {first}, then by this process, {me}; the other ranks are \
                 told to stop. Start each rank once. In a store that outlives runs the first may be a process of an \
                 earlier run, killed while it joined; if it is no process of this job, someone else joined in its \
                 place (GPUCOMM_JOB_KEY keeps processes without the key out)"
            ),
            RendezvousError::LateJoiner { rank, holder, identity, store } => {
                write!(
                    f,
                    "rendezvous already complete: every rank joined before this process, and rank {rank} is held \
                     by {holder}. The keys may be an earlier run's with the same job identity "
                )?;
                match identity {
                    Some(source) => write!(f, "(from {source})")?,
                    None => f.write_str("(none: nothing names this job)")?,
                }
                write!(f, " in {store}. Give each run ")?;
                match identity.as_deref() {
                    Some("Options::token") => f.write_str("its own Options::token (this program sets it)")?,
                    _ => f.write_str(
                        "its own GPUCOMM_JOB_TOKEN, the same on all its ranks (e.g. `export \
                         GPUCOMM_JOB_TOKEN=$(uuidgen)` before each launch, or one per program: \
                         `GPUCOMM_JOB_TOKEN=a ./a && GPUCOMM_JOB_TOKEN=b ./b`)",
                    )?,
                }
                write!(
                    f,
                    ". Otherwise this process is a second copy of rank {rank}: start each rank of a job once, and if \
                     the holder is not of this job, protect the job with GPUCOMM_JOB_KEY"
                )
            }
            RendezvousError::Superseded { generation } => write!(
                f,
                "a later start of rank 0 of this job opened the rendezvous again (generation {} after this \
                 process's {generation}) in torchrun's agent store while this process was joining: a second copy of \
                 rank 0, or a restart of the job while this process was still running; the other ranks joined the \
                 later one",
                generation.saturating_add(1)
            ),
            RendezvousError::Forged { detail } => write!(f, "rendezvous aborted: {detail}"),
            RendezvousError::Aborted { reason } => write!(f, "rendezvous aborted by {reason}"),
            RendezvousError::TimedOut { during, waited, missing: _, waiting_for, store_notes } => {
                write!(f, "{during} timed out after {}: {waiting_for}", secs(*waited))?;
                if !store_notes.is_empty() {
                    write!(f, "; rank 0's store saw: [{}]", store_notes.join("; "))?;
                }
                write!(
                    f,
                    ". Check that every rank runs, with the same MASTER_ADDR, MASTER_PORT and world size, and calls \
                     broadcast/barrier in the same order, {RAISE_TIMEOUT}"
                )
            }
            RendezvousError::Store { master, during, error } => {
                write!(f, "during {during} (store at {master}): {error}")
            }
            RendezvousError::Make { reason } => write!(f, "rank 0 could not produce the bytes to broadcast: {reason}"),
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
