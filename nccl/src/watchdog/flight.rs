//! The flight recorder: each watched communicator's recent calls, with sequence numbers and
//! states, and the calls still in flight (each with a CUDA event recorded after it).

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use cudarc::driver::CudaEvent;
use nccl_sys::ncclDataType_t;

/// Where a recorded call stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallState {
    /// Enqueued on its stream; its work has not been seen to finish.
    Enqueued,
    /// Its work has finished on the GPU.
    Completed,
    /// Recorded into a CUDA graph being captured: it runs when the graph is launched, outside the
    /// watchdog's view.
    Captured,
}

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRecord {
    /// The communicator's sequence number of the call: 0 for its first recorded call, then one
    /// more for each (the same on every rank when every rank makes the same calls, which is what
    /// tells which rank is behind).
    pub seq: u64,
    /// The NCCL function (`ncclAllReduce`, `ncclSend`, …).
    pub call: &'static str,
    /// Element count NCCL was given.
    pub count: usize,
    /// Element type (`f32`, `bf16`, …).
    pub dtype: &'static str,
    /// `("peer", rank)` for sends and receives, `("root", rank)` for rooted calls.
    pub rank: Option<(&'static str, usize)>,
    /// The CUDA stream (its handle, as an address).
    pub stream: usize,
    /// Where it stands.
    pub state: CallState,
}

impl fmt::Display for CallRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} {} count {} {}", self.seq, self.call, self.count, self.dtype)?;
        if let Some((what, rank)) = self.rank {
            write!(f, " {what} {rank}")?;
        }
        write!(f, " stream {:#x} {:?}", self.stream, self.state)
    }
}

/// The name of an NCCL data type, for records.
pub(crate) fn dtype_name(t: ncclDataType_t) -> &'static str {
    const NAMES: [&str; 12] = ["i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16", "f8e4m3", "f8e5m2"];
    NAMES.get(t.0 as usize).copied().unwrap_or("unknown type")
}

/// A call in flight: its sequence number, when it was enqueued, the event after it.
struct InFlight {
    seq: u64,
    at: Instant,
    event: CudaEvent,
}

/// One communicator's recorder: the last `capacity` calls, and every call still in flight
/// (oldest first, so the oldest unfinished one is the first to be overdue).
pub(crate) struct Recorder {
    capacity: usize,
    next_seq: u64,
    history: VecDeque<CallRecord>,
    in_flight: VecDeque<InFlight>,
    /// Events of finished calls, reused.
    spare: Vec<CudaEvent>,
}

impl Recorder {
    pub(crate) fn new(capacity: usize) -> Self {
        Recorder {
            capacity: capacity.max(1),
            next_seq: 0,
            history: VecDeque::new(),
            in_flight: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    /// An event to record after the next call, from the spares when one fits `matches`.
    pub(crate) fn spare_event(&mut self, matches: impl Fn(&CudaEvent) -> bool) -> Option<CudaEvent> {
        let i = self.spare.iter().position(matches)?;
        Some(self.spare.swap_remove(i))
    }

    /// Records a call (`record.seq` is assigned here); `event` marks the end of its work, `None`
    /// for a captured call. Returns its sequence number.
    pub(crate) fn push(&mut self, mut record: CallRecord, event: Option<CudaEvent>, at: Instant) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        record.seq = seq;
        record.state = if event.is_some() { CallState::Enqueued } else { CallState::Captured };
        if let Some(event) = event {
            self.in_flight.push_back(InFlight { seq, at, event });
        }
        if self.history.len() == self.capacity {
            self.history.pop_front();
        }
        self.history.push_back(record);
        seq
    }

    /// Marks finished calls (`done` says whether an event has completed; an error counts as not
    /// yet), oldest first, stopping at the first unfinished one. Returns that one's sequence
    /// number and age, if any.
    pub(crate) fn reap(&mut self, now: Instant, done: impl Fn(&CudaEvent) -> bool) -> Option<(u64, Duration)> {
        while let Some(oldest) = self.in_flight.front() {
            if !done(&oldest.event) {
                return Some((oldest.seq, now.saturating_duration_since(oldest.at)));
            }
            let finished = self.in_flight.pop_front()?;
            self.set_state(finished.seq, CallState::Completed);
            self.spare.push(finished.event);
        }
        None
    }

    fn set_state(&mut self, seq: u64, state: CallState) {
        if let Some(r) = self.history.iter_mut().find(|r| r.seq == seq) {
            r.state = state;
        }
    }

    /// The recorded call `seq`, if still in the history.
    pub(crate) fn get(&self, seq: u64) -> Option<&CallRecord> {
        self.history.iter().find(|r| r.seq == seq)
    }

    /// The history, oldest first.
    pub(crate) fn dump(&self) -> Vec<CallRecord> {
        self.history.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(call: &'static str) -> CallRecord {
        CallRecord {
            seq: 99,
            call,
            count: 4,
            dtype: dtype_name(ncclDataType_t(7)),
            rank: None,
            stream: 0x10,
            state: CallState::Completed,
        }
    }

    #[test]
    fn records_are_numbered_and_the_history_is_bounded() {
        let mut r = Recorder::new(3);
        let t = Instant::now();
        for (i, name) in ["ncclAllReduce", "ncclBroadcast", "ncclSend", "ncclRecv"].into_iter().enumerate() {
            assert_eq!(r.push(record(name), None, t), i as u64);
        }
        let dump = r.dump();
        assert_eq!(dump.iter().map(|c| c.seq).collect::<Vec<_>>(), [1, 2, 3], "the oldest record left");
        assert!(dump.iter().all(|c| c.state == CallState::Captured), "no event: captured");
        assert_eq!(r.get(3).map(|c| c.call), Some("ncclRecv"));
        assert!(r.get(0).is_none());
        // Nothing in flight: nothing to reap, nothing overdue.
        assert_eq!(r.reap(t, |_| false), None);
    }

    #[test]
    fn records_print_like_a_flight_recorder_line() {
        let mut c = record("ncclSend");
        c.rank = Some(("peer", 1));
        c.seq = 7;
        c.state = CallState::Enqueued;
        assert_eq!(c.to_string(), "#7 ncclSend count 4 f32 peer 1 stream 0x10 Enqueued");
        assert_eq!(dtype_name(ncclDataType_t(9)), "bf16");
        assert_eq!(dtype_name(ncclDataType_t(42)), "unknown type");
    }
}
