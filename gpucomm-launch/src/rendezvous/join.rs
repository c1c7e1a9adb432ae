//! Joining: every rank claims its rank with `COMPARE_SET`; rank 0 checks every claim and
//! releases the others.
//!
//! With a job key, each start of rank 0 makes a random value and publishes it under `start`
//! (rank 0's store holds it from the first), every other rank reads it before it claims, and
//! each claim carries it under its MAC. Rank 0 takes only claims of its own start: a claim made
//! with the key in another start (kept from an earlier run with the same key and identity and
//! written again, or left in a store that outlives a start) counts as not there yet, and the
//! rank it names replaces it when it claims. Without that, a claim copied from an earlier run's
//! store let rank 0 complete the join with a rank that did not exist.
//!
//! The other ranks do not trust the value they read once: in a store that outlives runs it may be
//! an earlier start's (killed before it could clean up, and read before the new rank 0 wrote its
//! own), rank 0 may start again while they wait, and anyone who reaches the store can write
//! `start`. Until the join is released, each of them reads rank 0's claim again after every slice
//! of its wait and takes the start from there (a claim with this key's MAC: a stranger cannot
//! make one), replacing its own claim (`COMPARE_SET` against it) with one of that start.
//!
//! Rank 0 replaces a claim of another start under its own key only when it is a leftover: in a
//! store that outlives starts, the claim must be of the start that `start` held when this rank 0
//! began, and `start` must still hold this rank 0's own value. Otherwise, or when its own claim
//! is later replaced by one of another start, another rank 0 is live, and it fails with the
//! duplicate error naming both. The trade-off: a rank 0 killed after it wrote `start` and before
//! it claimed, with an older start's claim still under rank 0's key, looks like a live second
//! rank 0, and the next start of rank 0 fails once as a duplicate (the one after it sees a
//! consistent leftover, or a fresh store, and goes on); a second rank 0 started at the very moment
//! a first one's claim is read may also be seen only by the first one, which then fails and
//! aborts the job.

use std::time::Duration;

use super::generation;
use super::plan::Mode;
use super::process::{self, Claimant};
use super::record::{other_version, verified, Claim};
use super::seal::TAG_LEN;
use super::session::{fresh_start, Session, Waited, NONCE_LEN};
use super::RendezvousError;
use crate::deadline::Deadline;

/// How many times a rank may find its key holding a claim of another start (or emptied) and
/// try again, before it takes the key's holder for a duplicate: only someone rewriting such
/// claims as fast as the rank replaces them gets that far.
const MAX_CLAIM_TRIES: usize = 16;

/// The first pause while a key holds a claim of another start, or a start value that is not
/// one; pauses double up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(200);

const DURING: &str = "the rendezvous (joining)";

/// Which claims of another start under its own key a rank replaces (see the module's
/// documentation).
enum Replaces {
    /// Any: the other ranks, and rank 0 of a store it hosts or of a later join of its process.
    Any,
    /// Rank 0 of a store that outlives starts: only a claim of the start that `start` held when
    /// this rank 0 began (empty: none), left by a start that was killed.
    Leftover(Vec<u8>),
}

/// With a job key, before claiming: rank 0 makes this start's random value and publishes it
/// (rank 0 of [`Mode::Hosted`] made it with its store, which holds it already); the others wait
/// for it and read it. A value that is not one (of another length: anyone who reaches the store
/// can write there) is not taken; rank 0 writes its own over it.
fn enter_start(s: &mut Session, deadline: Deadline) -> Result<Replaces, RendezvousError> {
    let key = s.keys.start();
    if s.rank == 0 {
        let mut replaces = Replaces::Any;
        if s.start.is_none() {
            // A missing key reads as empty.
            let previous = s.client.get_by(&key, deadline).map_err(|e| s.store_error(DURING, e))?;
            let start = fresh_start()?;
            s.client.set_by(&key, &start, deadline).map_err(|e| s.store_error(DURING, e))?;
            s.start = Some(start);
            replaces = Replaces::Leftover(previous);
        }
        // Every rank has read it once the join is complete: it goes at the first barrier.
        s.stale.push(key);
        return Ok(replaces);
    }
    s.start = None;
    let mut pause = FIRST_PAUSE;
    loop {
        let value = wait_for(s, &key, deadline, "rank 0 has not started the rendezvous")?;
        if let Ok(start) = <[u8; NONCE_LEN]>::try_from(value.as_slice()) {
            s.start = Some(start);
            return Ok(Replaces::Any);
        }
        if deadline.remaining().is_none_or(|left| left <= pause) {
            let waiting_for = format!(
                "rank 0 has not started the rendezvous ({key} holds {} bytes, not rank 0's value){}",
                value.len(),
                s.scope.hint()
            );
            return Err(timed_out(s, deadline, waiting_for));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// Claims this rank and waits until every rank has (rank 0 checks the claims and says so).
pub(super) fn join(s: &mut Session, deadline: Deadline) -> Result<(), RendezvousError> {
    let result =
        claim(s, deadline)
            .and_then(|mut mine| if s.rank == 0 { release(s, deadline) } else { wait(s, &mut mine, deadline) });
    if result.is_ok() {
        s.acknowledged += 1;
    }
    result
}

/// Claims this rank; returns the claim as written.
fn claim(s: &mut Session, deadline: Deadline) -> Result<Vec<u8>, RendezvousError> {
    let complete = s.keys.complete();
    if s.client.check_by(&[&complete], deadline).map_err(|e| s.store_error(DURING, e))? {
        return Err(late(s, deadline));
    }
    let replaces = if s.seal.is_some() { enter_start(s, deadline)? } else { Replaces::Any };
    let label = s.keys.claim(s.rank);
    let mut nonce = [0u8; NONCE_LEN];
    crate::random::fill(&mut nonce)
        .map_err(|error| RendezvousError::Io { context: "getting random bytes for a claim".into(), error })?;
    s.nonce = nonce;
    s.live = Some(process::Live::hold(nonce));
    let mut claim = Claim {
        rank: s.rank as u32,
        world_size: s.world_size as u32,
        who: s.me.clone(),
        nonce,
        start: s.start.unwrap_or_default(),
        tag: None,
    };
    let mine = claim.encode(s.seal.as_ref(), &label);
    let mut expected = Vec::new();
    let mut current = Vec::new();
    for _ in 0..MAX_CLAIM_TRIES {
        current = s.client.compare_set_by(&label, &expected, &mine, deadline).map_err(|e| s.store_error(DURING, e))?;
        if current == mine {
            return Ok(mine);
        }
        if !expected.is_empty() && current == expected {
            // Gone since it was read (a store answers `expected` for a missing key): claim afresh.
            expected.clear();
        } else if of_another_start(s, s.rank, &current) && leftover(s, &replaces, &current, deadline)? {
            // Made with the key in another start: not a rival in this one. Replace it.
            expected.clone_from(&current);
        } else if held_by_a_gone_process(s, &label, &current) {
            // Made with the key by a process that runs no more (killed while it joined, in a
            // store that outlives runs) or an earlier attempt of this one: not a rival either.
            expected.clone_from(&current);
        } else {
            break;
        }
    }
    Err(taken(s, &label, &current, deadline))
}

/// Whether `current`, a claim of another start under this rank's key, is one that `replaces`
/// lets this rank replace: for rank 0 of a store that outlives starts, one of the start that
/// `start` held when this rank 0 began, while `start` still holds this rank 0's value (else
/// another rank 0 is live).
fn leftover(s: &mut Session, replaces: &Replaces, current: &[u8], deadline: Deadline) -> Result<bool, RendezvousError> {
    let Replaces::Leftover(previous) = replaces else { return Ok(true) };
    let Some((claim, _)) = Claim::decode(current) else { return Ok(false) };
    if claim.start.as_slice() != previous.as_slice() {
        return Ok(false);
    }
    let now = s.client.get_by(&s.keys.start(), deadline).map_err(|e| s.store_error(DURING, e))?;
    Ok(s.start.is_some_and(|start| now == start))
}

/// The error for a rank whose key another process holds (`current`, read from `label`): a
/// process of a rendezvous already complete, or a duplicate (then every rank is told: those of
/// this rank's start, and with a job key those of the holder's start, when its claim is of
/// another).
fn taken(s: &mut Session, label: &str, current: &[u8], deadline: Deadline) -> RendezvousError {
    let complete = s.keys.complete();
    match s.client.check_by(&[&complete], deadline) {
        Err(e) => return s.store_error(DURING, e),
        Ok(true) => return late(s, deadline),
        Ok(false) => {}
    }
    let first = describe(s, label, current);
    let error = RendezvousError::Duplicate { rank: s.rank, first: first.clone(), me: s.me.to_string() };
    let reason = format!("rank {} was claimed twice: first by {first}, then by {}{}", s.rank, s.me, s.scope.hint());
    let holders = start_of(s, label, current);
    s.give_up_naming(&reason, holders);
    error
}

/// The error for a process that came after every rank had joined: a second copy of its rank, or
/// a process of a later run with the same identity that meets an earlier run's keys (the store
/// outlives runs, or an earlier run's rank 0 still serves it).
fn late(s: &mut Session, deadline: Deadline) -> RendezvousError {
    let label = s.keys.claim(s.rank);
    let holder = match s.client.get_by(&label, deadline) {
        Ok(value) if !value.is_empty() => describe(s, &label, &value),
        _ => "no process (the rank's claim is gone)".to_string(),
    };
    let store = match s.mode {
        Mode::Agent => format!(
            "torchrun's agent store at {}, which serves every program that a worker runs, one after another \
             (`./a && ./b`)",
            s.master
        ),
        Mode::External => {
            format!(
                "the store at {}, which keeps its keys from run to run (a fresh store for each run helps too)",
                s.master
            )
        }
        Mode::Hosted => format!(
            "the store at {}, which an earlier run's rank 0 serves until that run's slowest rank is done (another \
             MASTER_PORT for each run helps too)",
            s.master
        ),
    };
    let identity = (!s.scope.anonymous).then(|| s.scope.source.clone());
    RendezvousError::LateJoiner { rank: s.rank, holder, identity, store }
}

/// A claim's holder, for messages.
fn describe(s: &Session, label: &str, value: &[u8]) -> String {
    match Claim::decode(value) {
        Some((claim, body)) => match verified(s.seal.as_ref(), label, body, claim.tag.as_ref()) {
            Some(false) => format!("{} (without a valid MAC of this job's key)", claim.who),
            _ => claim.who.to_string(),
        },
        None => match other_version(value) {
            Some((theirs, ours)) => format!(
                "a claim in another version's format ({theirs}, where this build writes {ours}): every rank of a job \
                 must run the same build of gpucomm-launch"
            ),
            None => format!("an unreadable claim of {} bytes (not a gpucomm process)", value.len()),
        },
    }
}

/// With a job key: whether `value`, read from this rank's key `label`, is a claim of this rank
/// with this key's MAC made by a process that runs no more, or by an earlier attempt of this
/// process (see `process`). Without a key a claim of a gone process cannot be told from a
/// stranger's, who would take the rank unseen: it is a duplicate.
fn held_by_a_gone_process(s: &Session, label: &str, value: &[u8]) -> bool {
    Claim::signed(value, s.seal.as_ref(), label)
        .is_some_and(|claim| claim.rank as usize == s.rank && process::gone(&claim.who, &claim.nonce, &s.me, true))
}

/// With a job key: the start of `value`, read from `label`, when it is a claim with this key's
/// MAC.
fn start_of(s: &Session, label: &str, value: &[u8]) -> Option<[u8; NONCE_LEN]> {
    Claim::signed(value, s.seal.as_ref(), label).map(|claim| claim.start)
}

/// With a job key: whether `value`, read from rank `rank`'s key, is a claim of that rank made
/// with this key in another start of the rendezvous than this rank's.
fn of_another_start(s: &Session, rank: usize, value: &[u8]) -> bool {
    let Some(start) = s.start else { return false };
    Claim::signed(value, s.seal.as_ref(), &s.keys.claim(rank))
        .is_some_and(|claim| claim.rank as usize == rank && claim.start != start)
}

/// A claim that [`check_claim`] let through.
enum Checked {
    /// A claim of this start, with its nonce.
    Current([u8; NONCE_LEN]),
    /// A claim made with this job's key in another start: not there yet.
    Stale(Claimant),
}

/// Checks a claim read from rank `rank`'s key: the rank, the key, the start (with a key) and the
/// world size.
fn check_claim(s: &Session, rank: usize, value: &[u8]) -> Result<Checked, RendezvousError> {
    let label = s.keys.claim(rank);
    let Some((claim, body)) = Claim::decode(value) else {
        return Err(RendezvousError::Forged {
            detail: format!("rank {rank}'s claim is unreadable: {}", describe(s, &label, value)),
        });
    };
    if claim.rank as usize != rank {
        return Err(RendezvousError::Forged {
            detail: format!("the claim under rank {rank}'s key is for rank {} ({})", claim.rank, claim.who),
        });
    }
    match verified(s.seal.as_ref(), &label, body, claim.tag.as_ref()) {
        Some(false) => {
            return Err(RendezvousError::Forged {
                detail: format!(
                    "rank {rank} was claimed by {}, whose claim is not signed with this job's key: a process without \
                     GPUCOMM_JOB_KEY took the rank, or the ranks were started with different keys",
                    claim.who
                ),
            })
        }
        None if claim.tag.is_some() => {
            return Err(RendezvousError::Forged {
                detail: format!(
                    "rank {rank} ({}) has GPUCOMM_JOB_KEY and rank {} does not: give every rank the same key",
                    claim.who, s.rank
                ),
            })
        }
        _ => {}
    }
    if s.seal.is_some() && Some(claim.start) != s.start {
        return Ok(Checked::Stale(claim.who));
    }
    if claim.world_size as usize != s.world_size {
        return Err(RendezvousError::Forged {
            detail: format!(
                "rank {rank} ({}) was started with world size {}, rank {} with {}",
                claim.who, claim.world_size, s.rank, s.world_size
            ),
        });
    }
    Ok(Checked::Current(claim.nonce))
}

/// What [`gather`] found.
enum Gathered {
    /// Every claim is of this start: their nonces.
    Claims(Vec<[u8; NONCE_LEN]>),
    /// The deadline came first; these ranks' keys held claims of another start at the last look.
    TimedOut { stale: Vec<(usize, Claimant)> },
}

/// Waits until the keys of `ranks` hold claims of this start and checks them ([`check_claim`]:
/// a claim that fails aborts the rendezvous). A claim of another start counts as not there yet:
/// its rank replaces it when it claims, so its key is read again (pausing between looks, since a
/// store cannot wait for a key to change) until then.
fn gather(s: &mut Session, ranks: &[usize], deadline: Deadline) -> Result<Gathered, RendezvousError> {
    let mut nonces = vec![[0u8; NONCE_LEN]; ranks.len()];
    let mut pending: Vec<usize> = (0..ranks.len()).collect();
    let mut stale = Vec::new();
    let mut pause = FIRST_PAUSE;
    loop {
        let keys: Vec<String> = pending.iter().map(|&i| s.keys.claim(ranks[i])).collect();
        // Rank 0 watches its own claim while it waits: replaced by one of another start, by a
        // second rank 0 that took it for a leftover, it is a duplicate (see the module's
        // documentation), told at once rather than when the last rank comes.
        let mut between = |s: &mut Session| {
            generation::check_superseded(s, deadline, DURING)?;
            if s.seal.is_none() || !ranks.contains(&s.rank) {
                return Ok(());
            }
            let label = s.keys.claim(s.rank);
            let value = s.client.get_by(&label, deadline).map_err(|e| s.store_error(DURING, e))?;
            match of_another_start(s, s.rank, &value) {
                true => Err(taken(s, &label, &value, deadline)),
                false => Ok(()),
            }
        };
        let values = match s.wait_values_between(&keys, deadline, DURING, &mut between) {
            Ok(values) => values,
            Err(Waited::Failed(error)) => return Err(error),
            Err(Waited::TimedOut) => return Ok(Gathered::TimedOut { stale }),
        };
        stale.clear();
        let mut left = Vec::new();
        for (&i, value) in pending.iter().zip(&values) {
            match check_claim(s, ranks[i], value).map_err(|error| s.fail(error))? {
                Checked::Current(nonce) => nonces[i] = nonce,
                // This rank's own claim, replaced by one of another start: another copy of this
                // rank is live (a leftover's replacement never replaces a live claim back).
                Checked::Stale(_) if ranks[i] == s.rank => {
                    let label = s.keys.claim(s.rank);
                    return Err(taken(s, &label, value, deadline));
                }
                Checked::Stale(who) => {
                    left.push(i);
                    stale.push((ranks[i], who));
                }
            }
        }
        pending = left;
        if pending.is_empty() {
            return Ok(Gathered::Claims(nonces));
        }
        if deadline.remaining().is_none_or(|left| left <= pause) {
            return Ok(Gathered::TimedOut { stale });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// For timeout messages: the claims of another start that were ignored.
fn stale_note(stale: &[(usize, Claimant)]) -> String {
    if stale.is_empty() {
        return String::new();
    }
    let ranks: Vec<usize> = stale.iter().map(|(rank, _)| *rank).collect();
    let who: Vec<String> = stale.iter().take(4).map(|(_, who)| who.to_string()).collect();
    format!(
        "; the keys of ranks {ranks:?} hold claims made with this job's key in another start of the rendezvous \
         ({}{}), kept from an earlier run with the same key and identity and written again: they were ignored",
        who.join(", "),
        if stale.len() > who.len() { ", …" } else { "" }
    )
}

/// Rank 0: waits for every claim, checks them all, then marks the rendezvous complete.
fn release(s: &mut Session, deadline: Deadline) -> Result<(), RendezvousError> {
    let ranks: Vec<usize> = (0..s.world_size).collect();
    let nonces = match gather(s, &ranks, deadline)? {
        Gathered::Claims(nonces) => nonces,
        Gathered::TimedOut { stale } => {
            let keys: Vec<String> = ranks.iter().map(|&rank| s.keys.claim(rank)).collect();
            let mut missing = s.missing(&keys);
            missing.extend(stale.iter().map(|(rank, _)| *rank));
            missing.sort_unstable();
            missing.dedup();
            let joined = s.world_size - missing.len();
            let waiting_for = format!(
                "ranks {missing:?} have not joined ({joined} of {} joined){}{}",
                s.world_size,
                stale_note(&stale),
                s.scope.hint()
            );
            let store_notes = s.store_notes();
            let error = RendezvousError::TimedOut {
                during: DURING.into(),
                waited: deadline.limit(),
                missing,
                waiting_for,
                store_notes,
            };
            return Err(s.fail(error));
        }
    };
    let complete = s.keys.complete();
    let value = match &s.seal {
        // With a key, the release names this run: a random number under a MAC, and for each rank
        // a welcome, the MAC of its claim's nonce with that number, written first. A rank finds
        // its own claim welcomed, so a release kept from another run of the job (the same key and
        // identity) is refused, and every later value is bound to the number.
        Some(seal) => {
            let mut run = [0u8; NONCE_LEN];
            crate::random::fill(&mut run)
                .map_err(|error| RendezvousError::Io { context: "getting random bytes for the run".into(), error })?;
            let welcomes: Vec<(String, [u8; TAG_LEN])> = nonces
                .iter()
                .enumerate()
                .map(|(rank, nonce)| {
                    let key = s.keys.welcome(rank);
                    let tag = seal.tag(&key, &[nonce.as_slice(), &run].concat());
                    (key, tag)
                })
                .collect();
            // One `SET` each (it has no reply, so they go out back to back): every store this
            // crate meets has it, PyTorch's older agent stores included.
            for (key, tag) in &welcomes {
                s.client.set_by(key, tag, deadline).map_err(|e| s.store_error(DURING, e))?;
            }
            s.stale.extend(welcomes.into_iter().map(|(key, _)| key));
            s.binding = run.to_vec();
            let tag = seal.tag(&complete, &[b"release".as_slice(), &run].concat());
            [run.as_slice(), &tag].concat()
        }
        None => s.release_value(&complete),
    };
    s.client.set_by(&complete, &value, deadline).map_err(|e| s.store_error(DURING, e))
}

/// The other ranks, with a job key: rank 0's welcome of this rank's claim (empty when there is
/// none), read before it is checked.
fn read_welcome(s: &mut Session, deadline: Deadline) -> Result<Vec<u8>, RendezvousError> {
    let welcome = s.keys.welcome(s.rank);
    if s.client.check_by(&[&welcome], deadline).map_err(|e| s.store_error(DURING, e))? {
        s.client.get_by(&welcome, deadline).map_err(|e| s.store_error(DURING, e))
    } else {
        Ok(Vec::new())
    }
}

/// The other ranks: checks rank 0's release of the join (`value`, read from `complete`). With a
/// job key: its MAC, and `mark`, rank 0's welcome of this rank's own claim in the run it names.
fn check_join_release(s: &mut Session, complete: &str, value: &[u8], mark: &[u8]) -> Result<(), RendezvousError> {
    let run = match &s.seal {
        None => return s.check_release(complete, value),
        Some(seal) => {
            let signed = value.len() == NONCE_LEN + TAG_LEN && {
                let (run, tag) = value.split_at(NONCE_LEN);
                seal.verify(complete, &[b"release".as_slice(), run].concat(), tag)
            };
            if !signed {
                return Err(RendezvousError::Forged {
                    detail: format!(
                        "{complete} is not rank 0's release signed with this job's key: written by a process \
                         without the key, or rank 0 has another GPUCOMM_JOB_KEY or gpucomm version"
                    ),
                });
            }
            let run = &value[..NONCE_LEN];
            let welcome = s.keys.welcome(s.rank);
            if !seal.verify(&welcome, &[s.nonce.as_slice(), run].concat(), mark) {
                return Err(RendezvousError::Forged {
                    detail: format!(
                        "{complete} does not list this rank's claim: rank 0's release was kept from another run of \
                         this job (the same key and identity) and written again, or rank 0 read another claim for \
                         rank {}",
                        s.rank
                    ),
                });
            }
            run.to_vec()
        }
    };
    s.binding = run;
    Ok(())
}

/// The other ranks: check rank 0's claim (same world size and key), then wait for the release.
/// With a job key, rank 0's claim gives the start: while it names another start than `mine`,
/// this rank's claim, this rank claims again with that one (see the module's documentation).
fn wait(s: &mut Session, mine: &mut Vec<u8>, deadline: Deadline) -> Result<(), RendezvousError> {
    let first = s.keys.claim(0);
    loop {
        let value = wait_for(s, &first, deadline, "rank 0 has not joined")?;
        match check_claim(s, 0, &value).map_err(|error| s.fail(error))? {
            Checked::Current(_) => break,
            Checked::Stale(_) if deadline.remaining().is_none() => {
                let waiting_for = format!("rank 0 has not joined{}", s.scope.hint());
                return Err(timed_out(s, deadline, waiting_for));
            }
            Checked::Stale(_) => follow(s, &value, mine, deadline)?,
        }
    }
    let complete = s.keys.complete();
    let keys = [complete.clone()];
    let mut between = |s: &mut Session| {
        generation::check_superseded(s, deadline, DURING)?;
        if s.seal.is_none() {
            return Ok(());
        }
        let value = s.client.get_by(&first, deadline).map_err(|e| s.store_error(DURING, e))?;
        if of_another_start(s, 0, &value) {
            follow(s, &value, mine, deadline)?;
        }
        Ok(())
    };
    let value = match s.wait_values_between(&keys, deadline, DURING, &mut between) {
        Ok(mut values) => values.pop().unwrap_or_default(),
        Err(Waited::Failed(error)) => return Err(error),
        Err(Waited::TimedOut) => {
            let waiting_for = format!("rank 0 has not confirmed that every rank joined{}", s.scope.hint());
            return Err(timed_out(s, deadline, waiting_for));
        }
    };
    let mark = if s.seal.is_some() { read_welcome(s, deadline)? } else { Vec::new() };
    check_join_release(s, &complete, &value, &mark).map_err(|error| s.fail(error))?;
    s.acknowledge(deadline, DURING)
}

/// The other ranks, with a job key: rank 0's claim (`first`, verified) names another start than
/// this rank's claim (`mine`): claims again with rank 0's start, in place of `mine`.
fn follow(s: &mut Session, first: &[u8], mine: &mut Vec<u8>, deadline: Deadline) -> Result<(), RendezvousError> {
    let Some((rank0, _)) = Claim::decode(first) else { return Ok(()) };
    let label = s.keys.claim(s.rank);
    let mut claim = Claim {
        rank: s.rank as u32,
        world_size: s.world_size as u32,
        who: s.me.clone(),
        nonce: s.nonce,
        start: rank0.start,
        tag: None,
    };
    let new = claim.encode(s.seal.as_ref(), &label);
    let mut expected = mine.clone();
    for _ in 0..2 {
        let current =
            s.client.compare_set_by(&label, &expected, &new, deadline).map_err(|e| s.store_error(DURING, e))?;
        if current == new {
            s.start = Some(rank0.start);
            *mine = new;
            return Ok(());
        }
        if current != expected || expected.is_empty() {
            return Err(taken(s, &label, &current, deadline));
        }
        // Gone (a store answers `expected` for a missing key): claim afresh.
        expected.clear();
    }
    Err(taken(s, &label, mine, deadline))
}

/// Waits for `key` ([`Session::wait_values`]), watching for a later generation, and returns its
/// value.
fn wait_for(s: &mut Session, key: &str, deadline: Deadline, waiting_for: &str) -> Result<Vec<u8>, RendezvousError> {
    let mut between = |s: &mut Session| generation::check_superseded(s, deadline, DURING);
    match s.wait_values_between(&[key.to_string()], deadline, DURING, &mut between) {
        Ok(mut values) => Ok(values.pop().unwrap_or_default()),
        Err(Waited::Failed(error)) => Err(error),
        Err(Waited::TimedOut) => {
            let waiting_for = format!("{waiting_for}{}", s.scope.hint());
            Err(timed_out(s, deadline, waiting_for))
        }
    }
}

/// The error of a rank other than 0 that waited for rank 0 until `deadline` (rank 0 knows who is
/// missing and says so; this rank only stops).
fn timed_out(s: &mut Session, deadline: Deadline, waiting_for: String) -> RendezvousError {
    s.failed = true;
    RendezvousError::TimedOut {
        during: DURING.into(),
        waited: deadline.limit(),
        missing: Vec::new(),
        waiting_for,
        store_notes: Vec::new(),
    }
}
