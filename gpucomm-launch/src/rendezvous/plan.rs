//! What a rank decides before it connects: where its store is ([`Mode`]), what keeps this job's
//! keys apart from other jobs' ([`Scope`], [`Keys`]), which rendezvous of this process it is, and
//! how a connection failure is reported. Shared by the session and the rank-0 host below it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::seal::Seal;
use super::{Options, RendezvousError, StoreMode};
use crate::deadline::Deadline;
use crate::env::{Master, RankInfo};
use crate::store::StoreError;

/// Where this rank's store is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// torchrun's agent hosts it.
    Agent,
    /// Rank 0 hosts it.
    Hosted,
    /// Someone else hosts it.
    External,
}

impl Mode {
    pub(super) fn resolve(store: StoreMode, info: &RankInfo) -> Mode {
        match store {
            StoreMode::Auto if info.torchelastic.as_ref().is_some_and(|t| t.use_agent_store) => Mode::Agent,
            StoreMode::Auto | StoreMode::Rank0 => Mode::Hosted,
            StoreMode::External => Mode::External,
        }
    }
}

/// What keeps this job's keys apart from other jobs': a hash of its identity (the identity
/// itself never goes to the store).
#[derive(Debug, Clone)]
pub(super) struct Scope {
    pub(super) hash: String,
    pub(super) source: String,
    pub(super) anonymous: bool,
}

impl Scope {
    pub(super) fn new(identity: Option<(&str, &str)>) -> Scope {
        let (value, source) = identity.unwrap_or(("", "nothing"));
        let digest = Sha256::new().chain_update(b"gpucomm job scope\0").chain_update(value.as_bytes()).finalize();
        let hash = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        Scope { hash, source: source.to_string(), anonymous: identity.is_none() }
    }

    /// Advice for messages when the job has no identity.
    pub(super) fn hint(&self) -> &'static str {
        if self.anonymous {
            " (this job has no identity: set GPUCOMM_JOB_TOKEN to one value on all its ranks, so that another \
             job on the same port cannot be taken for it)"
        } else {
            ""
        }
    }
}

/// The rendezvous counts of this process, per scope and rank: the n-th rendezvous that
/// succeeds in every rank's process is the same one. Threads that play different ranks count
/// separately; a failed attempt does not count (every rank fails it, and all retry the same).
static INSTANCES: Mutex<BTreeMap<(String, usize), u64>> = Mutex::new(BTreeMap::new());

fn instances() -> std::sync::MutexGuard<'static, BTreeMap<(String, usize), u64>> {
    INSTANCES.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The number of this process's next rendezvous for `scope` and `rank`.
pub(super) fn next_instance(scope: &str, rank: usize) -> u64 {
    instances().get(&(scope.to_string(), rank)).copied().unwrap_or(0)
}

/// Counts a rendezvous that succeeded.
pub(super) fn count_instance(scope: &str, rank: usize, instance: u64) {
    let mut map = instances();
    let next = map.entry((scope.to_string(), rank)).or_insert(0);
    *next = (*next).max(instance + 1);
}

/// The store keys of one rendezvous.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    prefix: String,
}

impl Keys {
    /// The owner record of a store that rank 0 hosts.
    pub(super) const OWNER: &'static str = "/gpucomm/v1/owner";

    pub(super) fn new(scope: &str, instance: u64) -> Keys {
        Keys { prefix: format!("/gpucomm/v1/{scope}/{instance}") }
    }

    /// The counter of the generations opened under these keys ([`Mode::Agent`]: see
    /// `generation`).
    pub(super) fn generations(&self) -> String {
        format!("{}/generations", self.prefix)
    }

    /// The keys of generation `g` under these keys.
    pub(super) fn generation(&self, g: i64) -> Keys {
        Keys { prefix: format!("{}/g{g}", self.prefix) }
    }

    /// Rank 0's mark that it opened this generation.
    pub(super) fn opened(&self) -> String {
        format!("{}/opened", self.prefix)
    }

    /// Rank 0's random value for this start of the rendezvous (with a job key), which every
    /// claim's MAC covers: see `join`.
    pub(super) fn start(&self) -> String {
        format!("{}/start", self.prefix)
    }

    pub(super) fn claim(&self, rank: usize) -> String {
        format!("{}/rank/{rank}", self.prefix)
    }

    pub(super) fn complete(&self) -> String {
        format!("{}/complete", self.prefix)
    }

    /// Rank 0's welcome of rank `rank`'s claim (with a job key): see `join`.
    pub(super) fn welcome(&self, rank: usize) -> String {
        format!("{}/welcome/{rank}", self.prefix)
    }

    pub(super) fn abort(&self) -> String {
        format!("{}/abort", self.prefix)
    }

    /// Rank `rank`'s acknowledgement of the operations it finished ([`Mode::Hosted`]).
    pub(super) fn done(&self, rank: usize) -> String {
        format!("{}/done/{rank}", self.prefix)
    }

    pub(super) fn value(&self, seq: u64) -> String {
        format!("{}/op{seq}/value", self.prefix)
    }

    pub(super) fn arrive(&self, seq: u64, rank: usize) -> String {
        format!("{}/op{seq}/arrive/{rank}", self.prefix)
    }

    pub(super) fn release(&self, seq: u64) -> String {
        format!("{}/op{seq}/release", self.prefix)
    }
}

/// Everything a rank decided before it connects.
pub(super) struct Plan<'a> {
    pub(super) info: &'a RankInfo,
    pub(super) options: &'a Options,
    pub(super) master: Master,
    pub(super) mode: Mode,
    pub(super) scope: Scope,
    pub(super) instance: u64,
    pub(super) seal: Option<Seal>,
    /// The end of the join.
    pub(super) deadline: Deadline,
}

/// A connection failure as the rendezvous reports it.
pub(super) fn connect_error(master: &Master, error: StoreError) -> RendezvousError {
    match error {
        StoreError::Resolve { error, .. } => RendezvousError::Resolve { master: master.clone(), error },
        StoreError::Unreachable { waited, last_error, .. } => {
            RendezvousError::Unreachable { master: master.clone(), waited, last_error }
        }
        error => RendezvousError::Store { master: master.clone(), during: "connecting".into(), error: Box::new(error) },
    }
}
