//! The rendezvous over a TCPStore: [`Rendezvous`], its [`Options`] and errors.

mod abort;
mod collective;
mod error;
mod generation;
mod host;
mod join;
mod options;
mod plan;
mod process;
mod record;
mod seal;
mod session;

pub use error::RendezvousError;
pub use options::{
    JobKey, Options, StoreMode, DEFAULT_TIMEOUT, JOB_KEY_VAR, MAX_TIMEOUT, MIN_KEY_LEN, MIN_TIMEOUT, STORE_VAR,
    TIMEOUT_VAR,
};

use crate::deadline::Deadline;
use crate::env::{EnvError, RankInfo};
use crate::store::ServerStats;
use plan::{Mode, Plan, Scope};
use session::Session;

/// The most bytes one [`Rendezvous::broadcast`] may carry (1 MiB less room for the framing).
pub const MAX_BROADCAST: usize = (1 << 20) - 64;

/// The ranks of a job meeting at a TCPStore, so that rank 0 can hand byte strings (an NCCL or
/// NVSHMEM unique id) to every rank.
///
/// **Where the store is** ([`StoreMode`]): under torchrun (`TORCHELASTIC_USE_AGENT_STORE=True`)
/// the agent's store at `MASTER_ADDR:MASTER_PORT`, of which every rank, rank 0 included, is a
/// client; otherwise rank 0 hosts one there (a [`StoreServer`](crate::store::StoreServer), which
/// PyTorch's `TCPStore(host, port, is_master=False)` can also use), or, with
/// `GPUCOMM_STORE=external`, one that someone else hosts. Rank 0 listens on `MASTER_ADDR` itself
/// when it is an IP address of this machine (so `127.0.0.1` keeps the store local), on every
/// interface when it is an address this machine does not have, and on every interface of both
/// IPv6 and IPv4 when it is a host name (which the other ranks may resolve to either).
///
/// **Keys.** Everything lives under `/gpucomm/v1/<scope>/<n>/`, where the scope is a hash of the
/// job identity ([`RankInfo::job_identity`]) and `n` counts this process's rendezvous (the n-th
/// successful `Rendezvous::connect` of every rank meets the n-th of the others;
/// [`Options::instance`] sets it). Under torchrun's agent store, which outlives the workers,
/// each start of rank 0 opens a new generation below that (`g<k>/`), and the other ranks join
/// the newest one not yet complete: a restarted job, and each program a worker runs
/// (`./a && ./b`), never reads an earlier start's values, whatever restart count each node's
/// agent gives its workers (torchrun counts a node's own restarts only).
///
/// **Joining.** Each rank claims its rank with `COMPARE_SET` (a record naming its host, pid and
/// address, with a MAC when the job has a key). A rank claimed twice fails the rendezvous on
/// every rank, naming both claimants; a process that comes after every rank joined fails at
/// once ("rendezvous already complete"). With a key, each start of rank 0 publishes a random
/// value that the other ranks read before they claim, and every claim's MAC covers it: a claim
/// made with the key in another start (kept from an earlier run and written again) is ignored
/// until its rank replaces it, so rank 0 never completes the join with a rank of another run.
/// Rank 0 checks every claim (world size, key, start) and then
/// releases the others; with a key, the release names the run (a random number under a MAC)
/// after rank 0 has welcomed each claim by its random nonce in that run (a MAC of both), each
/// rank checks its welcome, and every later value is bound to the run, so values kept from
/// another run of the same job (the same key and identity) are refused. When rank 0 hosts the
/// store, the others first check its owner record, so that a rank of another job (another
/// identity, world size or key) fails at once.
///
/// **Operations.** After joining, [`broadcast`](Rendezvous::broadcast) and
/// [`barrier`](Rendezvous::barrier) can be called any number of times, by every rank in the same
/// order; each is bounded by [`Options::timeout`] as a whole, however slowly bytes arrive. A
/// broadcast's value stays in the store until the next barrier (only then has every rank read
/// it): between two barriers the values must fit the store (rank 0's: 64 MiB by default,
/// [`Limits::max_store_bytes`](crate::store::Limits::max_store_bytes), so about 60 broadcasts of
/// [`MAX_BROADCAST`] bytes); call `barrier` between long runs of broadcasts. A
/// rank that gives up (a timeout, a failed check, rank 0's closure failing) writes an abort
/// notice that every waiting rank sees within about 200 ms (with a key, a notice without its MAC
/// is ignored, with a warning on stderr: anyone who reaches the store can write one). A failure poisons the
/// [`Rendezvous`]: every later call returns [`RendezvousError::Poisoned`].
///
/// **Rank 0's store outlives its last use**: dropping rank 0's `Rendezvous` waits (within the
/// timeout) until every other rank has finished its last operation or closed its connection.
/// Each rank acknowledges the operations it finished under a key of its own, with a MAC when
/// the job has a key, so that a process without the key cannot make rank 0 close its store
/// early.
///
/// **Security**: see the crate's documentation. In short: with a job key (`GPUCOMM_JOB_KEY`) no
/// process without it can read a broadcast value or take a rank unnoticed; without one, anyone
/// who can reach the store can.
#[derive(Debug)]
pub struct Rendezvous {
    rank: usize,
    world_size: usize,
    timeout: std::time::Duration,
    seq: u64,
    poisoned: bool,
    /// `None` for a single process (no network).
    session: Option<Box<Session>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("mode", &self.mode).field("store", &self.client.addr()).finish_non_exhaustive()
    }
}

impl Rendezvous {
    /// Meets the other ranks: returns once every rank has joined. With a world size of 1
    /// nothing touches the network.
    pub fn connect(info: &RankInfo, options: &Options) -> Result<Rendezvous, RendezvousError> {
        options.check()?;
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
        if u32::try_from(info.world_size).is_err() {
            return Err(RendezvousError::BadOptions { detail: format!("world size {} is too large", info.world_size) });
        }
        let mut rendezvous = Rendezvous {
            rank: info.rank,
            world_size: info.world_size,
            timeout: options.timeout,
            seq: 0,
            poisoned: false,
            session: None,
        };
        if info.world_size == 1 {
            return Ok(rendezvous);
        }
        let master = info.master_or_err()?.clone();
        let token = &options.token;
        let identity = match (token, &info.job_identity) {
            (token, _) if !token.is_empty() => Some((token.as_str(), "Options::token")),
            (_, Some(identity)) => Some((identity.value.as_str(), identity.source)),
            (_, None) => None,
        };
        let scope = Scope::new(identity);
        let instance = options.instance.unwrap_or_else(|| plan::next_instance(&scope.hash, info.rank));
        let deadline = Deadline::after(options.timeout);
        let mut s = Session::open(Plan {
            info,
            options,
            master,
            mode: Mode::resolve(options.store, info),
            seal: options.job_key.as_ref().map(|key| seal::Seal::new(key, &scope.hash)),
            scope,
            instance,
            deadline,
        })?;
        loop {
            match generation::enter(&mut s, deadline).and_then(|()| join::join(&mut s, deadline)) {
                Ok(()) => break,
                // A later start of rank 0 opened the generation after this rank's: join that one.
                Err(RendezvousError::Superseded { .. }) if s.rank != 0 => s.failed = false,
                Err(error) => {
                    s.failed = true;
                    return Err(error);
                }
            }
        }
        generation::joined(&mut s);
        plan::count_instance(&s.scope.hash, info.rank, instance);
        rendezvous.session = Some(Box::new(s));
        Ok(rendezvous)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// What rank 0's store has seen (connections, buffered bytes, accept errors, dropped
    /// connections), when this process hosts it.
    pub fn store_stats(&self) -> Option<ServerStats> {
        self.session.as_ref().and_then(|s| s.stats())
    }

    /// Rank 0 calls `make` and sends its bytes (at most [`MAX_BROADCAST`]) to every rank; the
    /// other ranks ignore `make` and return the bytes they receive. Every rank returns the same
    /// bytes. With a job key the bytes travel encrypted.
    pub fn broadcast(&mut self, make: impl FnOnce() -> Result<Vec<u8>, String>) -> Result<Vec<u8>, RendezvousError> {
        let seq = self.start()?;
        let deadline = Deadline::after(self.timeout);
        let result = match self.session.as_deref_mut() {
            None => make().map_err(|reason| RendezvousError::Make { reason }).and_then(|bytes| {
                if bytes.len() > MAX_BROADCAST {
                    Err(RendezvousError::TooLarge { len: bytes.len(), max: MAX_BROADCAST })
                } else {
                    Ok(bytes)
                }
            }),
            Some(s) => collective::broadcast(s, seq, make, deadline),
        };
        self.finish(result)
    }

    /// Returns once every rank has called `barrier` (as many times as this rank has).
    pub fn barrier(&mut self) -> Result<(), RendezvousError> {
        let seq = self.start()?;
        let deadline = Deadline::after(self.timeout);
        let result = match self.session.as_deref_mut() {
            None => Ok(()),
            Some(s) => collective::barrier(s, seq, deadline),
        };
        self.finish(result)
    }

    fn start(&mut self) -> Result<u64, RendezvousError> {
        if self.poisoned {
            return Err(RendezvousError::Poisoned);
        }
        // Poisoned until `finish` sees success, so an early return leaves it poisoned.
        self.poisoned = true;
        let seq = self.seq;
        self.seq += 1;
        Ok(seq)
    }

    fn finish<T>(&mut self, result: Result<T, RendezvousError>) -> Result<T, RendezvousError> {
        self.poisoned = result.is_err();
        if let Some(s) = self.session.as_deref_mut() {
            match &result {
                Ok(_) => s.acknowledged += 1,
                Err(_) => s.failed = true,
            }
        }
        result
    }
}

#[cfg(test)]
mod tests;
