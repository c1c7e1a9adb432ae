//! Joining: every rank claims its rank with `COMPARE_SET`; rank 0 checks every claim and
//! releases the others.

use super::plan::Mode;
use super::record::{verified, Claim};
use super::seal::TAG_LEN;
use super::session::{Session, Waited};
use super::RendezvousError;
use crate::deadline::Deadline;

/// Bytes of a claim's nonce.
const NONCE_LEN: usize = 16;

const DURING: &str = "the rendezvous (joining)";

/// Claims this rank and waits until every rank has (rank 0 checks the claims and says so).
pub(super) fn join(s: &mut Session, deadline: Deadline) -> Result<(), RendezvousError> {
    let result = claim(s, deadline).and_then(|()| if s.rank == 0 { release(s, deadline) } else { wait(s, deadline) });
    if result.is_ok() {
        s.acknowledged += 1;
    }
    result
}

fn claim(s: &mut Session, deadline: Deadline) -> Result<(), RendezvousError> {
    let complete = s.keys.complete();
    if s.client.check_by(&[&complete], deadline).map_err(|e| s.store_error(DURING, e))? {
        return Err(late(s, deadline));
    }
    let label = s.keys.claim(s.rank);
    let mut nonce = [0u8; NONCE_LEN];
    crate::random::fill(&mut nonce)
        .map_err(|error| RendezvousError::Io { context: "getting random bytes for a claim".into(), error })?;
    s.nonce = nonce;
    let mut claim = Claim { rank: s.rank as u32, world_size: s.world_size as u32, who: s.me.clone(), nonce, tag: None };
    let mine = claim.encode(s.seal.as_ref(), &label);
    let current = s.client.compare_set_by(&label, b"", &mine, deadline).map_err(|e| s.store_error(DURING, e))?;
    if current == mine {
        return Ok(());
    }
    // Taken: by a process of a rendezvous already complete, or by a duplicate.
    if s.client.check_by(&[&complete], deadline).map_err(|e| s.store_error(DURING, e))? {
        return Err(late(s, deadline));
    }
    let first = describe(s, &label, &current);
    let error = RendezvousError::Duplicate { rank: s.rank, first: first.clone(), me: s.me.to_string() };
    s.give_up(&format!("rank {} was claimed twice: first by {first}, then by {}{}", s.rank, s.me, s.scope.hint()));
    Err(error)
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
        None => format!("an unreadable claim of {} bytes (not a gpucomm process)", value.len()),
    }
}

/// Checks a claim read from rank `rank`'s key: the rank, the world size and the key. Returns the
/// claim's nonce.
fn check_claim(s: &Session, rank: usize, value: &[u8]) -> Result<[u8; NONCE_LEN], RendezvousError> {
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
    if claim.world_size as usize != s.world_size {
        return Err(RendezvousError::Forged {
            detail: format!(
                "rank {rank} ({}) was started with world size {}, rank {} with {}",
                claim.who, claim.world_size, s.rank, s.world_size
            ),
        });
    }
    Ok(claim.nonce)
}

/// Rank 0: waits for every claim, checks them all, then marks the rendezvous complete.
fn release(s: &mut Session, deadline: Deadline) -> Result<(), RendezvousError> {
    let keys: Vec<String> = (0..s.world_size).map(|rank| s.keys.claim(rank)).collect();
    match s.wait_all(&keys, deadline, DURING) {
        Ok(()) => {}
        Err(Waited::Failed(error)) => return Err(error),
        Err(Waited::TimedOut) => {
            let missing = s.missing(&keys);
            let joined = s.world_size - missing.len();
            let waiting_for =
                format!("ranks {missing:?} have not joined ({joined} of {} joined){}", s.world_size, s.scope.hint());
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
    }
    let claims = s.get_all(&keys, deadline, DURING)?;
    let mut nonces = Vec::with_capacity(claims.len());
    for (rank, value) in claims.iter().enumerate() {
        nonces.push(check_claim(s, rank, value).map_err(|error| s.fail(error))?);
    }
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
fn wait(s: &mut Session, deadline: Deadline) -> Result<(), RendezvousError> {
    let first = s.keys.claim(0);
    wait_for(s, &first, deadline, "rank 0 has not joined")?;
    let value = s.client.get_by(&first, deadline).map_err(|e| s.store_error(DURING, e))?;
    check_claim(s, 0, &value).map_err(|error| s.fail(error))?;
    let complete = s.keys.complete();
    wait_for(s, &complete, deadline, "rank 0 has not confirmed that every rank joined")?;
    let value = s.client.get_by(&complete, deadline).map_err(|e| s.store_error(DURING, e))?;
    let mark = if s.seal.is_some() { read_welcome(s, deadline)? } else { Vec::new() };
    check_join_release(s, &complete, &value, &mark).map_err(|error| s.fail(error))?;
    s.acknowledge(deadline, DURING)
}

fn wait_for(s: &mut Session, key: &str, deadline: Deadline, waiting_for: &str) -> Result<(), RendezvousError> {
    match s.wait_all(&[key.to_string()], deadline, DURING) {
        Ok(()) => Ok(()),
        Err(Waited::Failed(error)) => Err(error),
        Err(Waited::TimedOut) => {
            s.failed = true;
            Err(RendezvousError::TimedOut {
                during: DURING.into(),
                waited: deadline.limit(),
                missing: Vec::new(),
                waiting_for: format!("{waiting_for}{}", s.scope.hint()),
                store_notes: Vec::new(),
            })
        }
    }
}
