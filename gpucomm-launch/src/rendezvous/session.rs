//! A rank's session with the store: the connection, the keys of this rendezvous, the seal, and
//! the waits that every operation uses (bounded, watching the abort key).

use std::time::Duration;

use super::abort::{self, Start, Verdict};
use super::host;
use super::plan::{connect_error, Keys, Mode, Plan, Scope};
use super::process::{Claimant, Live};
use super::seal::{Seal, TAG_LEN};
use super::RendezvousError;
use crate::deadline::Deadline;
use crate::env::Master;
use crate::store::{ServerStats, StoreClient, StoreError, StoreServer};

/// The first slice of a wait; slices double up to [`MAX_SLICE`], and the abort key is checked
/// between them.
const FIRST_SLICE: Duration = Duration::from_millis(10);
const MAX_SLICE: Duration = Duration::from_millis(200);
/// Keys per `WAIT` or `MULTI_GET`.
const CHUNK: usize = 512;
/// How long writing the abort key may take.
const GIVE_UP_WITHIN: Duration = Duration::from_secs(1);
/// How long rank 0 keeps its store up after a failure, for the others to read why.
const LINGER_AFTER_FAILURE: Duration = Duration::from_secs(2);

/// Bytes of a claim's nonce, and of a start's random value.
pub(super) const NONCE_LEN: usize = 16;

/// A fresh random value for a start of the rendezvous (see `join`).
pub(super) fn fresh_start() -> Result<[u8; NONCE_LEN], RendezvousError> {
    let mut start = [0u8; NONCE_LEN];
    crate::random::fill(&mut start)
        .map_err(|error| RendezvousError::Io { context: "getting random bytes for the start".into(), error })?;
    Ok(start)
}

/// While joining under [`Mode::Agent`]: the generation after this one, whose mark, naming this
/// generation's value, means that a later start of rank 0 left this one (see `generation`).
#[derive(Clone, Debug)]
pub(super) struct Next {
    /// The next generation's `opened` key.
    pub(super) label: String,
    /// This generation's random value, which the next generation's mark names.
    pub(super) previous: [u8; 16],
}

/// Why a wait ended without its keys.
pub(super) enum Waited {
    TimedOut,
    Failed(RendezvousError),
}

impl From<RendezvousError> for Waited {
    fn from(error: RendezvousError) -> Self {
        Waited::Failed(error)
    }
}

pub(super) struct Session {
    pub(super) client: StoreClient,
    /// This rendezvous's keys: those of its generation under [`Mode::Agent`], once entered.
    pub(super) keys: Keys,
    /// The keys the generations are opened under ([`Mode::Agent`]).
    pub(super) base: Keys,
    /// While joining under [`Mode::Agent`]: the generation after this one, whose mark means
    /// that a later start of rank 0 left this one (see `generation`).
    pub(super) next: Option<Next>,
    /// The generation this session joins ([`Mode::Agent`]; 0 in the other modes).
    pub(super) generation: i64,
    pub(super) scope: Scope,
    pub(super) seal: Option<Seal>,
    pub(super) rank: usize,
    pub(super) world_size: usize,
    pub(super) master: Master,
    pub(super) mode: Mode,
    pub(super) me: Claimant,
    /// Rank 0's store ([`Mode::Hosted`]).
    pub(super) server: Option<StoreServer>,
    pub(super) timeout: Duration,
    /// Operations every client acknowledges ([`Mode::Hosted`]): the join, then each broadcast
    /// and barrier that succeeded.
    pub(super) acknowledged: u64,
    /// Rank 0: keys to delete at the next barrier, when every rank is past them.
    pub(super) stale: Vec<String>,
    pub(super) failed: bool,
    /// The random nonce of this rank's claim.
    pub(super) nonce: [u8; NONCE_LEN],
    /// The claim registered as this process's session in progress (see `process`), once made.
    pub(super) live: Option<Live>,
    /// With a job key: rank 0's random value for this start of the rendezvous, which the MAC of
    /// every claim covers (see `join`); `None` until rank 0 has made it or this rank has read it,
    /// and without a key.
    pub(super) start: Option<[u8; NONCE_LEN]>,
    /// Whether this rank has warned of an abort notice it ignored (once is enough).
    pub(super) warned_of_abort: bool,
    /// With a job key, once joined: the run's random number that rank 0's release of the join
    /// carries (see `join`), which binds the values of the operations after the join to this
    /// run; empty before, and without a key.
    pub(super) binding: Vec<u8>,
}

impl Session {
    /// Connects to the store of `plan.mode`; rank 0 of [`Mode::Hosted`] starts it first.
    pub(super) fn open(plan: Plan) -> Result<Session, RendezvousError> {
        let (info, options, master) = (plan.info, plan.options, &plan.master);
        let limits = &options.store_limits;
        let connect = |host: &str, port: u16| {
            StoreClient::connect_by(host, port, plan.deadline, options.timeout, limits.clone())
                .map_err(|e| connect_error(master, e))
        };
        let mut start = None;
        let (client, server) = match plan.mode {
            Mode::Hosted if info.rank == 0 => {
                if plan.seal.is_some() {
                    start = Some(fresh_start()?);
                }
                let (server, own) = host::serve(&plan, start)?;
                (connect(&own.ip().to_string(), own.port())?, Some(server))
            }
            Mode::Hosted => (host::join(&plan)?, None),
            Mode::Agent | Mode::External => (connect(&master.addr, master.port)?, None),
        };
        let me = Claimant::this_process(client.local_addr());
        let keys = Keys::new(&plan.scope.hash, plan.instance);
        Ok(Session {
            client,
            base: keys.clone(),
            keys,
            next: None,
            generation: 0,
            scope: plan.scope,
            seal: plan.seal,
            rank: info.rank,
            world_size: info.world_size,
            master: plan.master,
            mode: plan.mode,
            me,
            server,
            timeout: options.timeout,
            acknowledged: 0,
            stale: Vec::new(),
            failed: false,
            nonce: [0; 16],
            live: None,
            start,
            warned_of_abort: false,
            binding: Vec::new(),
        })
    }

    pub(super) fn store_error(&self, during: &str, error: StoreError) -> RendezvousError {
        RendezvousError::Store { master: self.master.clone(), during: during.to_string(), error: Box::new(error) }
    }

    /// Waits until every key exists, checking the abort key between slices and at the end. Each
    /// slice ends early enough for its cancellation to finish within `deadline`.
    /// After each slice that ended without the keys (past the abort check), it calls `between`.
    fn wait_all(
        &mut self,
        keys: &[String],
        deadline: Deadline,
        during: &str,
        between: &mut dyn FnMut(&mut Session) -> Result<(), RendezvousError>,
    ) -> Result<(), Waited> {
        let grace = (deadline.limit() / 4).min(MAX_SLICE);
        for chunk in keys.chunks(CHUNK) {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let mut slice = FIRST_SLICE;
            loop {
                let left = deadline.remaining().unwrap_or_default();
                if left <= grace {
                    return Err(Waited::TimedOut);
                }
                let until = Deadline::after(slice.min(left - grace));
                match self.client.wait_by(&refs, until, deadline) {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(error) => return Err(self.store_error(during, error).into()),
                }
                self.check_abort(deadline, during)?;
                between(self)?;
                slice = (slice * 2).min(MAX_SLICE);
            }
        }
        // A rank may have given up while the keys were being written (a duplicate claim that
        // came before every claim was in): never go on past an abort notice.
        Ok(self.check_abort(deadline, during)?)
    }

    /// Waits until every key exists ([`wait_all`](Session::wait_all)) and reads their values.
    /// A value that reads empty is checked: PyTorch's libuv store (its default since 2.4) ends a
    /// `WAIT` for a key when a `COMPARE_SET` names it with a non-empty expected value, though the
    /// key does not exist (and it stores nothing), so anyone who reaches the store can end a
    /// rank's wait early. Before, the rank read the missing key as an empty value, took it for a
    /// forged one and aborted the job; now a key that does not exist yet is waited for again,
    /// within the same deadline.
    pub(super) fn wait_values(
        &mut self,
        keys: &[String],
        deadline: Deadline,
        during: &str,
    ) -> Result<Vec<Vec<u8>>, Waited> {
        self.wait_values_between(keys, deadline, during, &mut |_| Ok(()))
    }

    /// [`wait_values`](Session::wait_values), calling `between` after each slice of the wait that
    /// ended without the keys ([`wait_all`](Session::wait_all)).
    pub(super) fn wait_values_between(
        &mut self,
        keys: &[String],
        deadline: Deadline,
        during: &str,
        between: &mut dyn FnMut(&mut Session) -> Result<(), RendezvousError>,
    ) -> Result<Vec<Vec<u8>>, Waited> {
        loop {
            self.wait_all(keys, deadline, during, between)?;
            let values = self.read_values(keys, deadline, during)?;
            let empty: Vec<&str> =
                keys.iter().zip(&values).filter(|(_, value)| value.is_empty()).map(|(key, _)| key.as_str()).collect();
            if empty.is_empty() {
                return Ok(values);
            }
            if self.all_exist(&empty, deadline, during)? {
                // They exist now, and may have been written since they were read.
                return Ok(self.read_values(keys, deadline, during)?);
            }
        }
    }

    /// The values of `keys` (a missing key reads as empty from the stores this crate meets).
    fn read_values(
        &mut self,
        keys: &[String],
        deadline: Deadline,
        during: &str,
    ) -> Result<Vec<Vec<u8>>, RendezvousError> {
        match keys {
            [key] => Ok(vec![self.client.get_by(key, deadline).map_err(|e| self.store_error(during, e))?]),
            _ => self.get_all(keys, deadline, during),
        }
    }

    /// Whether every one of `keys` exists (`CHECK`, in chunks).
    fn all_exist(&mut self, keys: &[&str], deadline: Deadline, during: &str) -> Result<bool, RendezvousError> {
        for chunk in keys.chunks(CHUNK) {
            if !self.client.check_by(chunk, deadline).map_err(|e| self.store_error(during, e))? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Fails with the abort reason once some rank has given up.
    pub(super) fn check_abort(&mut self, deadline: Deadline, during: &str) -> Result<(), RendezvousError> {
        let abort = self.keys.abort();
        match self.abort_notice(&abort, self.start, deadline, during)? {
            Some(reason) => Err(RendezvousError::Aborted { reason }),
            None => Ok(()),
        }
    }

    /// The reason of the abort notice under `label`, if there is one that counts for a rank of
    /// `start` (see `abort`): with a job key only a notice of that start with the key's MAC does
    /// (a rank's). Anyone who reaches the store can write the key (when rank 0 hosts the store,
    /// its owner record gives the path away), so without this one `SET` by a stranger failed
    /// every rank of a job that has a key, and one copied from an earlier run of the job failed
    /// a later one. Such a notice is ignored, with a warning. One without the MAC is also
    /// emptied (unless a rank's notice replaced it meanwhile), so that the ranks do not read a
    /// large one again at every slice of their waits; one of another start is left (a key holder
    /// wrote it, and a rank that gives up takes its place). An empty value is no notice.
    pub(super) fn abort_notice(
        &mut self,
        label: &str,
        start: Option<Start>,
        deadline: Deadline,
        during: &str,
    ) -> Result<Option<String>, RendezvousError> {
        if !self.client.check_by(&[label], deadline).map_err(|e| self.store_error(during, e))? {
            return Ok(None);
        }
        let notice = self.client.get_by(label, deadline).map_err(|e| self.store_error(during, e))?;
        if notice.is_empty() {
            return Ok(None);
        }
        let read = abort::read(self.seal.as_ref(), label, start, &notice);
        if read.verdict == Verdict::Counts {
            return Ok(Some(read.text));
        }
        if !self.warned_of_abort {
            self.warned_of_abort = true;
            eprintln!("warning: rank {}: ignoring {label}, {}", self.rank, read.text);
        }
        if read.verdict == Verdict::OtherStart {
            return Ok(None);
        }
        // Emptied only if it is still the notice just read: the store answers with the value it
        // holds after the swap (a rank's notice that came in between), or with `notice` itself
        // when the key is gone.
        let now = self.client.compare_set_by(label, &notice, b"", deadline).map_err(|e| self.store_error(during, e))?;
        if !now.is_empty() && now != notice {
            let read = abort::read(self.seal.as_ref(), label, start, &now);
            if read.verdict == Verdict::Counts {
                return Ok(Some(read.text));
            }
        }
        Ok(None)
    }

    /// Passes `error` on, first telling the other ranks about it when it arose here (a failed
    /// check, a timeout, rank 0's closure failing), so that they stop at once.
    pub(super) fn fail(&mut self, error: RendezvousError) -> RendezvousError {
        let reason = match &error {
            RendezvousError::Forged { detail } => Some(detail.clone()),
            RendezvousError::TimedOut { .. } | RendezvousError::Make { .. } | RendezvousError::TooLarge { .. } => {
                Some(error.to_string())
            }
            _ => None,
        };
        match reason {
            Some(reason) => self.give_up(&reason),
            None => self.failed = true,
        }
        error
    }

    /// Tells every rank why this one gives up (best effort, briefly): the first notice wins.
    pub(super) fn give_up(&mut self, reason: &str) {
        self.give_up_naming(reason, None);
    }

    /// [`give_up`](Session::give_up) with a notice that also counts for the ranks of `other`: the
    /// start of another process's claim that made this rank give up (a second rank 0's).
    pub(super) fn give_up_naming(&mut self, reason: &str, other: Option<Start>) {
        self.failed = true;
        let abort = self.keys.abort();
        let text = format!("rank {} ({}): {reason}", self.rank, self.me);
        let mut starts: Vec<Start> = self.start.into_iter().chain(other).collect();
        let notice = abort::encode(self.seal.as_ref(), &abort, &starts, &text);
        let deadline = Deadline::after(GIVE_UP_WITHIN);
        let Ok(current) = self.client.compare_set_by(&abort, b"", &notice, deadline) else { return };
        if current == notice || self.seal.is_none() {
            return;
        }
        // With a key, a notice that the ranks this one tells ignore must not keep its own out: it
        // takes the place of a stranger's, and of one that names other starts (or not `other`),
        // naming theirs too (a rank that read a stale start's value may be the one that is
        // wrong).
        let read = abort::read(self.seal.as_ref(), &abort, self.start, &current);
        let replacement = match read.verdict {
            Verdict::Unsigned => notice,
            // It counts for this rank's start: `other` is added after the starts it names, with its
            // text, unless that would push one of them out.
            Verdict::Counts => match other {
                Some(other) if !read.starts.contains(&other) && read.starts.len() < abort::MAX_STARTS => {
                    let starts: Vec<Start> = read.starts.into_iter().chain([other]).collect();
                    abort::encode(self.seal.as_ref(), &abort, &starts, &read.text)
                }
                _ => return,
            },
            Verdict::OtherStart => {
                starts.extend(read.starts);
                abort::encode(self.seal.as_ref(), &abort, &starts, &text)
            }
        };
        let _ = self.client.compare_set_by(&abort, &current, &replacement, deadline);
    }

    /// The values of `keys` (which must exist), in order.
    pub(super) fn get_all(
        &mut self,
        keys: &[String],
        deadline: Deadline,
        during: &str,
    ) -> Result<Vec<Vec<u8>>, RendezvousError> {
        let mut values = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(CHUNK) {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            values.extend(self.client.multi_get_by(&refs, deadline).map_err(|e| self.store_error(during, e))?);
        }
        Ok(values)
    }

    /// Which of `keys` are missing, by index (for timeout messages; briefly, after the
    /// operation's own deadline).
    pub(super) fn missing(&mut self, keys: &[String]) -> Vec<usize> {
        let deadline = Deadline::after(Duration::from_secs(2));
        let mut missing = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            match self.client.check_by(&[key], deadline) {
                Ok(true) => {}
                Ok(false) => missing.push(index),
                Err(_) => break,
            }
        }
        missing
    }

    /// What rank 0's store has seen, for timeout messages.
    pub(super) fn store_notes(&self) -> Vec<String> {
        self.server.as_ref().map_or_else(Vec::new, |server| {
            let stats = server.stats();
            stats.accept_errors.into_iter().chain(stats.events).collect()
        })
    }

    pub(super) fn stats(&self) -> Option<ServerStats> {
        self.server.as_ref().map(StoreServer::stats)
    }

    /// A client's acknowledgement that it finished an operation, so that rank 0 keeps its
    /// store up until every client is done with it ([`Mode::Hosted`]): the number of operations
    /// it finished, under a key of its own, with a MAC when the job has a key (so that a process
    /// without it cannot end rank 0's linger early).
    pub(super) fn acknowledge(&mut self, deadline: Deadline, during: &str) -> Result<(), RendezvousError> {
        if self.mode == Mode::Hosted && self.rank != 0 {
            let label = self.keys.done(self.rank);
            let value = self.acknowledgement(&label, self.acknowledged + 1);
            self.client.set_by(&label, &value, deadline).map_err(|e| self.store_error(during, e))?;
        }
        Ok(())
    }

    /// The value of an acknowledgement of `count` operations under `label`.
    fn acknowledgement(&self, label: &str, count: u64) -> Vec<u8> {
        let mut value = count.to_le_bytes().to_vec();
        if let Some(seal) = &self.seal {
            value.extend_from_slice(&seal.tag(&self.bound(label), &value));
        }
        value
    }

    /// The count an acknowledgement read from `label` carries, if it is one (with its MAC when
    /// the job has a key).
    fn acknowledged_count(&self, label: &str, value: &[u8]) -> Option<u64> {
        let (count, tag) = value.split_first_chunk::<8>()?;
        let ok = match &self.seal {
            Some(seal) => seal.verify(&self.bound(label), count, tag),
            None => tag.is_empty(),
        };
        ok.then_some(u64::from_le_bytes(*count))
    }

    /// What the MACs and seals of the key `label` are bound to: the key, and after the join this
    /// run's binding, so that a value of another run of the job (the same key and identity) does
    /// not pass for one of this run.
    pub(super) fn bound(&self, label: &str) -> String {
        if self.binding.is_empty() {
            return label.to_string();
        }
        let binding: String = self.binding.iter().map(|b| format!("{b:02x}")).collect();
        format!("{label}#{binding}")
    }

    /// The value marking a release (a barrier's, an arrival): a MAC of the key with a job key,
    /// else `ok`.
    pub(super) fn release_value(&self, label: &str) -> Vec<u8> {
        match &self.seal {
            Some(seal) => seal.tag(&self.bound(label), b"release").to_vec(),
            None => b"ok".to_vec(),
        }
    }

    /// Checks a release value read from `label`.
    pub(super) fn check_release(&self, label: &str, value: &[u8]) -> Result<(), RendezvousError> {
        let ok = match &self.seal {
            Some(seal) => seal.verify(&self.bound(label), b"release", value),
            None => value == b"ok",
        };
        if ok {
            return Ok(());
        }
        Err(RendezvousError::Forged {
            detail: match (&self.seal, value.len()) {
                (None, TAG_LEN) => format!(
                    "{label} was written with a job key: rank 0 has GPUCOMM_JOB_KEY and this process does not; \
                     give every rank the same key"
                ),
                (Some(_), _) => format!(
                    "{label} is not signed with this job's key and run: written by a process without the key, or in \
                     another run of this job (the same key and identity), or rank 0 has another GPUCOMM_JOB_KEY"
                ),
                (None, _) => format!("{label} holds an unexpected value ({} bytes)", value.len()),
            },
        })
    }

    /// Rank 0 of [`Mode::Hosted`]: keeps the store up until every client has acknowledged its
    /// last operation or closed its connection, within the timeout (2 s after a failure).
    fn linger(&mut self) {
        if self.server.is_none() {
            return;
        }
        let bound = if self.failed { LINGER_AFTER_FAILURE.min(self.timeout) } else { self.timeout };
        let deadline = Deadline::after(bound);
        let mut pending: Vec<usize> = (1..self.world_size).collect();
        let mut pause = Duration::from_millis(1);
        while !deadline.passed() {
            // Rank 0's own connection is the last one.
            if self.stats().is_none_or(|stats| stats.validated <= 1) {
                return;
            }
            if !self.failed && self.acknowledged > 0 {
                match self.unacknowledged(&pending, deadline.slice(Duration::from_secs(1))) {
                    Some(left) if left.is_empty() => return,
                    Some(left) => pending = left,
                    None if self.client_broken() => return,
                    None => {}
                }
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Those of `ranks` that have not acknowledged every operation rank 0 finished; `None` when
    /// the store could not be read.
    fn unacknowledged(&mut self, ranks: &[usize], deadline: Deadline) -> Option<Vec<usize>> {
        let mut left = Vec::new();
        for chunk in ranks.chunks(CHUNK) {
            let labels: Vec<String> = chunk.iter().map(|&rank| self.keys.done(rank)).collect();
            let refs: Vec<&str> = labels.iter().map(String::as_str).collect();
            // A key that does not exist reads as empty: not an acknowledgement.
            let values = self.client.multi_get_by(&refs, deadline).ok()?;
            for ((&rank, label), value) in chunk.iter().zip(&labels).zip(&values) {
                if self.acknowledged_count(label, value).is_none_or(|count| count < self.acknowledged) {
                    left.push(rank);
                }
            }
        }
        Some(left)
    }

    fn client_broken(&mut self) -> bool {
        self.client.ping_by(Deadline::after(Duration::from_millis(200))).is_err()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Dropped by a panic unwinding through this rank: the others would wait for its next step
        // until their timeout (and rank 0's store would stay up for as long). Tell them now.
        if std::thread::panicking() && !self.failed {
            self.give_up("it panicked");
        }
        self.linger();
    }
}
