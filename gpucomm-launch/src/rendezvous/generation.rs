//! Generations of a rendezvous in torchrun's agent store ([`Mode::Agent`]).
//!
//! The agent's store outlives the workers: every program a worker runs (`./a && ./b`) and every
//! restart of the job meets it under the same job identity. torchrun's restart count cannot
//! tell those apart: it counts the restarts that this node's workers caused
//! (pytorch/pytorch#108158), so after one node's failure the nodes of one attempt disagree, and a
//! membership change restarts the workers with it unchanged. So each start of rank 0 opens a new
//! generation under the rendezvous's keys: it increments their counter (`ADD`), marks the
//! generation opened (with a MAC when the job has a key), and claims its rank there. With a job
//! key the mark also carries a random value of its own and names the previous generation's, so
//! that a mark copied from an earlier agent store of the same job key and run id (whose previous
//! generation had another value) does not take a generation for left: rank 0 stays, and the
//! other ranks stay unless the copied marks of both generations were written over this run's
//! (then they go round until rank 0's own mark comes). What no MAC prevents: someone who can
//! write the store can still steer a rank that is about to enter (by adding to the counter, with
//! or without copied marks) into a generation where no rank 0 comes, so that the job stops at
//! its timeout; and a rank 0 that finds the previous generation counted but its mark not written
//! after a second (its rank 0 died between the two) names zeros. Every other
//! rank joins the newest generation that is neither complete nor given up (an abort notice) nor,
//! with a job key, holds a claim of its rank by another process that runs no more (one of an
//! earlier start, which torchrun killed while it joined), or waits for rank 0 to open the next
//! one when the newest is over or none is open yet. While it joins, each rank watches for the generation after its own: a later start of
//! rank 0 opened it when this one was left by processes that stopped before it completed, and the
//! other ranks move on to it.
//!
//! A generation's keys (claims, abort notice, values) are its own, so a restart never meets an
//! earlier start's. One case is left: a rank that starts while an earlier start's processes are
//! still joining the newest generation (a node whose old workers torchrun has not stopped yet)
//! joins them; when the old rank 0 completes that join, the new ranks fail in the job that
//! follows, and torchrun restarts them again.

use std::time::Duration;

use super::plan::Mode;
use super::process;
use super::record::Claim;
use super::session::{Next, Session, Waited};
use super::RendezvousError;
use crate::deadline::Deadline;

const DURING: &str = "the rendezvous (waiting for rank 0 to open it)";

/// What rank 0 writes under a generation's `opened` key; with a job key, its random value, the
/// previous generation's and the MAC of the three follow (see [`Mark`]).
const OPENED: &[u8] = b"gpucomm generation opened";

/// Bytes of a mark's random value.
const VALUE_LEN: usize = 16;

/// How long rank 0 waits for the previous generation's mark when that generation's rank 0 has
/// counted it but not written its mark yet (two rank 0 processes alive at once, a restart that
/// overtakes a start): long enough for one store round trip, short enough not to hold up a
/// restart after a rank 0 that died between the two.
const PREVIOUS_MARK_WAIT: Duration = Duration::from_secs(1);

/// A generation's `opened` mark, checked: with a job key, rank 0's random value for the
/// generation and the one of the previous generation's mark when rank 0 opened it (zeros where
/// there was none it could read); zeros without a key.
#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
struct Mark {
    own: [u8; VALUE_LEN],
    previous: [u8; VALUE_LEN],
}

/// True when generation `g` is over: complete, or given up (a rank wrote its abort notice; with
/// a job key, one with its MAC, of the start whose value the generation's `start` key holds: a
/// stranger's notice, or one copied from a generation of an earlier agent store, no more ends a
/// generation than it aborts a job).
fn ended(s: &mut Session, g: i64, deadline: Deadline) -> Result<bool, RendezvousError> {
    let keys = s.base.generation(g);
    if s.client.check_by(&[&keys.complete()], deadline).map_err(|e| s.store_error(DURING, e))? {
        return Ok(true);
    }
    // A missing key reads as empty: no start.
    let start = s.client.get_by(&keys.start(), deadline).map_err(|e| s.store_error(DURING, e))?;
    Ok(s.abort_notice(&keys.abort(), start.try_into().ok(), deadline, DURING)?.is_some())
}

/// With a job key: true when this rank's key in generation `g` holds a claim with the key's MAC,
/// of the start of rank 0's claim there (also with the MAC), by another process that runs no
/// more (see `process`): one of an earlier start, killed while it joined (torchrun stops workers
/// without an abort notice, so the generation is neither complete nor given up). This rank
/// would meet that claim there, and waits for the next generation instead: a later start of
/// rank 0 opens it. Every other claim is met when this rank claims: a live second process of
/// this rank, or a stranger's (without the key's MAC; and without a job key, where a stranger
/// could write a claim of a gone process to take the rank unseen), fails every rank as a
/// duplicate; one of another start (copied from an earlier agent store) or of an earlier
/// attempt of this process is replaced.
fn claimed_by_a_gone_process(s: &mut Session, g: i64, deadline: Deadline) -> Result<bool, RendezvousError> {
    if s.seal.is_none() {
        return Ok(false);
    }
    let keys = s.base.generation(g);
    let Some(claim) = signed_claim(s, &keys.claim(s.rank), deadline)? else { return Ok(false) };
    if !process::gone(&claim.who, &claim.nonce, &s.me, false) {
        return Ok(false);
    }
    Ok(signed_claim(s, &keys.claim(0), deadline)?.is_some_and(|rank0| rank0.start == claim.start))
}

/// The claim under `label`, if it carries the job key's MAC.
fn signed_claim(s: &mut Session, label: &str, deadline: Deadline) -> Result<Option<Claim>, RendezvousError> {
    // A missing key reads as empty, which no claim is.
    let value = s.client.get_by(label, deadline).map_err(|e| s.store_error(DURING, e))?;
    Ok(Claim::signed(&value, s.seal.as_ref(), label))
}

/// Under [`Mode::Agent`], enters the generation this rank joins (see the module's
/// documentation): sets the session's keys to it and watches the next one. Nothing in the other
/// modes, whose stores do not outlive a start (rank 0's) or whose keys the job identity keeps
/// apart (an external store).
pub(super) fn enter(s: &mut Session, deadline: Deadline) -> Result<(), RendezvousError> {
    if s.mode != Mode::Agent {
        return Ok(());
    }
    let counter = s.base.generations();
    let add =
        |s: &mut Session, delta: i64| s.client.add_by(&counter, delta, deadline).map_err(|e| s.store_error(DURING, e));
    let (generation, own) = if s.rank == 0 {
        let g = add(s, 1)?;
        let (mut own, mut previous) = ([0; VALUE_LEN], [0; VALUE_LEN]);
        if s.seal.is_some() {
            crate::random::fill(&mut own).map_err(|error| RendezvousError::Io {
                context: "getting random bytes for the generation's mark".into(),
                error,
            })?;
            // The previous generation's value, for its ranks to see that this mark was made after
            // it (zeros when there is none, or it does not verify).
            if let Some(p) = g.checked_sub(1).filter(|&p| p >= 1) {
                let label = s.base.generation(p).opened();
                if previous_mark_written(s, &label, deadline)? {
                    let value = s.client.get_by(&label, deadline).map_err(|e| s.store_error(DURING, e))?;
                    previous = read_mark(s, &label, &value).map(|m| m.own).unwrap_or_default();
                }
            }
        }
        s.keys = s.base.generation(g);
        let opened = s.keys.opened();
        let value = write_mark(s, &opened, Mark { own, previous });
        s.client.set_by(&opened, &value, deadline).map_err(|e| s.store_error(DURING, e))?;
        (g, own)
    } else {
        let newest = add(s, 0)?;
        // Saturating: the counter is whatever the store holds, which anyone who reaches it can set.
        let over = newest < 1 || ended(s, newest, deadline)?;
        let held = !over && claimed_by_a_gone_process(s, newest, deadline)?;
        let g = if over || held { newest.saturating_add(1) } else { newest };
        // Waiting under the generation's keys: its abort notice is the one that counts.
        s.keys = s.base.generation(g);
        s.next = None;
        let opened = s.keys.opened();
        let value = match s.wait_values(std::slice::from_ref(&opened), deadline, DURING) {
            Ok(mut values) => values.pop().unwrap_or_default(),
            Err(Waited::Failed(error)) => return Err(error),
            Err(Waited::TimedOut) => {
                return Err(RendezvousError::TimedOut {
                    during: DURING.into(),
                    waited: deadline.limit(),
                    missing: vec![0],
                    waiting_for: format!(
                        "rank 0 has not opened generation {g} of the rendezvous in torchrun's agent store{}{}",
                        if held {
                            format!(
                                " (generation {newest}, which it had not completed, held a claim of rank {} by a process \
                                 that runs no more)",
                                s.rank
                            )
                        } else {
                            String::new()
                        },
                        s.scope.hint()
                    ),
                    store_notes: Vec::new(),
                })
            }
        };
        (g, verify_mark(s, &opened, &value)?.own)
    };
    s.generation = generation;
    s.next = Some(Next { label: s.base.generation(generation.saturating_add(1)).opened(), previous: own });
    Ok(())
}

/// True once the previous generation's mark `label` exists, waiting for it up to
/// [`PREVIOUS_MARK_WAIT`] (within `deadline`): its rank 0 counts the generation and then writes
/// the mark, and one that has done the first only would otherwise be named with zeros, and its
/// ranks would wait for their timeout instead of moving on. Asked with CHECK: PyTorch's older
/// server closes the connection on a GET of a missing key.
fn previous_mark_written(s: &mut Session, label: &str, deadline: Deadline) -> Result<bool, RendezvousError> {
    let until = deadline.slice(PREVIOUS_MARK_WAIT);
    loop {
        if s.client.check_by(&[label], deadline).map_err(|e| s.store_error(DURING, e))? {
            return Ok(true);
        }
        if until.passed() {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// While joining under [`Mode::Agent`]: `Err(Superseded)` once a later start of rank 0 opened
/// the generation after this one (the join's waits ask between their slices). A mark without this job's MAC is ignored (anyone who reaches
/// the store can write one), and so is one that names another previous value than this
/// generation's (copied from an earlier agent store: someone who could read that store would
/// send the ranks away from their generation until their timeout).
pub(super) fn check_superseded(s: &mut Session, deadline: Deadline, during: &str) -> Result<(), RendezvousError> {
    let Some(next) = s.next.clone() else { return Ok(()) };
    if !s.client.check_by(&[&next.label], deadline).map_err(|e| s.store_error(during, e))? {
        return Ok(());
    }
    let value = s.client.get_by(&next.label, deadline).map_err(|e| s.store_error(during, e))?;
    if read_mark(s, &next.label, &value).is_none_or(|mark| mark.previous != next.previous) {
        return Ok(());
    }
    Err(RendezvousError::Superseded { generation: s.generation })
}

/// Stops watching for a later generation: the join is complete.
pub(super) fn joined(s: &mut Session) {
    s.next = None;
}

/// Rank 0's mark `mark` for the `opened` key `label` (only [`OPENED`] without a job key).
fn write_mark(s: &Session, label: &str, mark: Mark) -> Vec<u8> {
    let mut value = OPENED.to_vec();
    if let Some(seal) = &s.seal {
        value.extend_from_slice(&mark.own);
        value.extend_from_slice(&mark.previous);
        let tag = seal.tag(label, &value);
        value.extend_from_slice(&tag);
    }
    value
}

/// The mark in `value` if it is rank 0's mark for `label` (with this job's MAC when the job has
/// a key).
fn read_mark(s: &Session, label: &str, value: &[u8]) -> Option<Mark> {
    let Some(seal) = &s.seal else { return (value == OPENED).then(Mark::default) };
    let (signed, tag) = value.split_at_checked(OPENED.len() + 2 * VALUE_LEN)?;
    let values = signed.strip_prefix(OPENED)?;
    if !seal.verify(label, signed, tag) {
        return None;
    }
    let (own, previous) = values.split_at(VALUE_LEN);
    Some(Mark { own: own.try_into().ok()?, previous: previous.try_into().ok()? })
}

/// Checks the mark `value` read from `label`: a generation opened by a process without this
/// job's key is refused.
fn verify_mark(s: &Session, label: &str, value: &[u8]) -> Result<Mark, RendezvousError> {
    if let Some(mark) = read_mark(s, label, value) {
        return Ok(mark);
    }
    Err(RendezvousError::Forged {
        detail: format!(
            "the generation of the rendezvous this rank was to join was not opened by a rank 0 with this job's key \
             ({} bytes under its mark): a process without GPUCOMM_JOB_KEY opened it, or the ranks were started with \
             different keys",
            value.len()
        ),
    })
}
