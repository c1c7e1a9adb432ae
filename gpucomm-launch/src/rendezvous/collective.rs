//! Broadcasts and barriers over store keys, numbered by a sequence that every rank counts.

use super::plan::Mode;
use super::seal::{self, SEAL_OVERHEAD};
use super::session::{Session, Waited};
use super::{RendezvousError, MAX_BROADCAST};
use crate::deadline::Deadline;

/// The first byte of a broadcast value: plain bytes follow.
const PLAIN: u8 = 0;
/// The first byte of a broadcast value: a sealed value follows.
const SEALED: u8 = 1;

/// Rank 0 stores `make()`'s bytes (sealed with a job key); the others wait for them.
pub(super) fn broadcast(
    s: &mut Session,
    seq: u64,
    make: impl FnOnce() -> Result<Vec<u8>, String>,
    deadline: Deadline,
) -> Result<Vec<u8>, RendezvousError> {
    let during = format!("broadcast #{seq}");
    let label = s.keys.value(seq);
    if s.rank == 0 {
        let bytes = make().map_err(|reason| s.fail(RendezvousError::Make { reason }))?;
        if bytes.len() > MAX_BROADCAST {
            return Err(s.fail(RendezvousError::TooLarge { len: bytes.len(), max: MAX_BROADCAST }));
        }
        let value = encode(s, &label, &bytes)?;
        // Not to a job that some rank gave up on (a late duplicate claim, say).
        s.check_abort(deadline, &during)?;
        s.client.set_by(&label, &value, deadline).map_err(|e| s.store_error(&during, e))?;
        s.stale.push(label);
        return Ok(bytes);
    }
    let value = wait(s, &label, deadline, &during, format!("rank 0's value for {during}"))?;
    let bytes = decode(s, &label, &value).map_err(|error| s.fail(error))?;
    s.acknowledge(deadline, &during)?;
    Ok(bytes)
}

fn encode(s: &Session, label: &str, bytes: &[u8]) -> Result<Vec<u8>, RendezvousError> {
    let Some(seal) = &s.seal else { return Ok([&[PLAIN], bytes].concat()) };
    let nonce = seal::nonce()
        .map_err(|error| RendezvousError::Io { context: "getting random bytes for a nonce".into(), error })?;
    let sealed = seal
        .seal(&s.bound(label), bytes, nonce)
        .ok_or(RendezvousError::TooLarge { len: bytes.len(), max: MAX_BROADCAST })?;
    Ok([&[SEALED], sealed.as_slice()].concat())
}

fn decode(s: &Session, label: &str, value: &[u8]) -> Result<Vec<u8>, RendezvousError> {
    let forged = |detail: String| RendezvousError::Forged { detail };
    match (value.split_first(), &s.seal) {
        (Some((&PLAIN, bytes)), None) => Ok(bytes.to_vec()),
        (Some((&SEALED, sealed)), Some(seal)) => seal.open(&s.bound(label), sealed).ok_or_else(|| {
            forged(format!(
                "{label} does not open with this job's key and run: written by a process without the key, or in \
                 another run of this job (the same key and identity), or rank 0 has another GPUCOMM_JOB_KEY"
            ))
        }),
        (Some((&PLAIN, _)), Some(_)) => Err(forged(format!(
            "{label} is not sealed: rank 0 runs without GPUCOMM_JOB_KEY, or a process without the key wrote it"
        ))),
        (Some((&SEALED, _)), None) if value.len() > SEAL_OVERHEAD => Err(forged(format!(
            "{label} is sealed with a job key: rank 0 has GPUCOMM_JOB_KEY and this process does not"
        ))),
        _ => Err(forged(format!("{label} holds {} bytes that are not a broadcast value", value.len()))),
    }
}

/// Every rank but 0 marks its arrival (with a MAC) and waits for rank 0's release; rank 0
/// waits for every arrival, checks them and releases everyone. Rank 0 then deletes the keys
/// every rank is past.
pub(super) fn barrier(s: &mut Session, seq: u64, deadline: Deadline) -> Result<(), RendezvousError> {
    let during = format!("barrier #{seq}");
    let release = s.keys.release(seq);
    if s.rank != 0 {
        let arrive = s.keys.arrive(seq, s.rank);
        let mark = s.release_value(&arrive);
        s.client.set_by(&arrive, &mark, deadline).map_err(|e| s.store_error(&during, e))?;
        let waiting_for = format!("rank 0's release of {during} (rank 0 releases once every rank has arrived)");
        let value = wait(s, &release, deadline, &during, waiting_for)?;
        s.check_release(&release, &value).map_err(|error| s.fail(error))?;
        return s.acknowledge(deadline, &during);
    }
    let arrivals: Vec<String> = (1..s.world_size).map(|rank| s.keys.arrive(seq, rank)).collect();
    let marks = match s.wait_values(&arrivals, deadline, &during) {
        Ok(marks) => marks,
        Err(Waited::Failed(error)) => return Err(error),
        Err(Waited::TimedOut) => {
            let missing: Vec<usize> = s.missing(&arrivals).into_iter().map(|index| index + 1).collect();
            let waiting_for = format!("ranks {missing:?} have not reached {during}");
            let store_notes = s.store_notes();
            let error =
                RendezvousError::TimedOut { during, waited: deadline.limit(), missing, waiting_for, store_notes };
            return Err(s.fail(error));
        }
    };
    for (key, mark) in arrivals.iter().zip(&marks) {
        s.check_release(key, mark).map_err(|error| s.fail(error))?;
    }
    let value = s.release_value(&release);
    s.client.set_by(&release, &value, deadline).map_err(|e| s.store_error(&during, e))?;
    // Every rank has finished the operations before this barrier: their keys can go.
    let mut gone: Vec<String> = std::mem::replace(&mut s.stale, vec![release.clone()]);
    gone.extend(arrivals);
    let refs: Vec<&str> = gone.iter().map(String::as_str).collect();
    s.client.delete_keys_by(&refs, deadline).map_err(|e| s.store_error(&during, e))?;
    // The others make their round trips to the store after the release reaches them (the abort
    // check, reading the release, and with a hosted store the acknowledgement); rank 0 makes as
    // many after writing it (the deletion above, then reads that change nothing), so that every
    // rank leaves at about the same moment: the release's notice to the others and the reply to
    // rank 0 leave the store together. What follows a barrier (a benchmark's timed block) then
    // starts together on every rank, as after MPI_Barrier; before, rank 0 left two round trips
    // earlier (about 55 µs on loopback).
    let mirrored = if s.mode == Mode::Hosted { 2 } else { 1 };
    for _ in 0..mirrored {
        s.client.check_by(&[&release], deadline).map_err(|e| s.store_error(&during, e))?;
    }
    Ok(())
}

/// Waits for `key` ([`Session::wait_values`]) and returns its value.
fn wait(
    s: &mut Session,
    key: &str,
    deadline: Deadline,
    during: &str,
    waiting_for: String,
) -> Result<Vec<u8>, RendezvousError> {
    match s.wait_values(&[key.to_string()], deadline, during) {
        Ok(mut values) => Ok(values.pop().unwrap_or_default()),
        Err(Waited::Failed(error)) => Err(error),
        // Rank 0 knows who is missing and says so; this rank only stops.
        Err(Waited::TimedOut) => {
            s.failed = true;
            Err(RendezvousError::TimedOut {
                during: during.to_string(),
                waited: deadline.limit(),
                missing: Vec::new(),
                waiting_for,
                store_notes: Vec::new(),
            })
        }
    }
}
