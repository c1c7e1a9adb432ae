//! An optional watchdog thread with a flight recorder, as PyTorch's ProcessGroupNCCL has.
//!
//! [`Watchdog::start`] starts one thread for the process; [`Watchdog::watch`] hands it a
//! nonblocking communicator and a timeout. From then on every call on that communicator is
//! recorded — sequence number, NCCL function, count, type, peer or root, stream — in a small ring
//! buffer (the flight recorder), with a CUDA event after its work. Every poll interval the thread:
//!
//! * marks the calls whose work finished (their events), oldest first;
//! * reads NCCL's asynchronous error state (`ncclCommGetAsyncError`) when it may;
//! * when the oldest unfinished call is older than the timeout, or NCCL reports an error, or NCCL
//!   has said "in progress" for longer than the timeout (a host-side operation that never
//!   completes: connecting to a hung peer at a first call, a group's end, a split, a finalize —
//!   work the recorder has no event for), aborts the communicator and reports why and which call
//!   hung, with the recorder's contents ([`HangReport`]: printed to stderr, logged, and kept for
//!   [`Watchdog::reports`]).
//!
//! It does not wait for the owner's next call — with one condition that NCCL sets: a communicator
//! may be aborted from another thread only while no thread is inside another NCCL call on it. The
//! watchdog therefore aborts (and reads the error state) at once when the owner is **parked**:
//! waiting inside this crate ([`Comm::wait`], a call NCCL answered with "in progress") or in code
//! run through [`Comm::parked`] — which is how a training loop should block on the GPU (a stream
//! synchronize, reading a loss) while a watchdog is on. An owner busy elsewhere gets an abort
//! *request*, carried out at its next call into the communicator; the report is made at once
//! either way and says which happened.
//!
//! Cost: with no communicator watched, one relaxed atomic load per call (a few nanoseconds;
//! `watchdog::tests::the_idle_check_costs_nanoseconds` measures it). A watched call additionally
//! takes two uncontended locks and records one CUDA event (about a microsecond).

mod flight;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;
use nccl_sys::ncclResult_t;

pub use flight::{CallRecord, CallState};

use crate::call::Call;
use crate::error::{Result, ResultCode};
use crate::{AbortHandle, AbortStatus, Comm};
use flight::Recorder;

/// Calls kept per communicator unless [`Watchdog::watch_with_history`] says otherwise.
const DEFAULT_HISTORY: usize = 64;

/// Watched communicators, all watchdogs together (few: a scan is fine).
static WATCHED: Mutex<Vec<Arc<Watched>>> = Mutex::new(Vec::new());
/// `WATCHED.len()`, read without the lock on every call.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data (plain pushes and pops).
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One watched communicator.
struct Watched {
    watchdog: u64,
    /// The communicator's identity ([`Comm::identity`]), to find the entry from a call: unique
    /// while this entry lives, since the entry's abort handle keeps what it is the address of.
    key: usize,
    handle: AbortHandle,
    rank: usize,
    size: usize,
    device: usize,
    timeout: Duration,
    recorder: Mutex<Recorder>,
    /// Since when NCCL has said `ncclInProgress` at every poll (`None`: it did not at the last).
    in_progress: Mutex<Option<Instant>>,
    /// Set once a report was made: one per communicator (an abort only requested of a busy owner
    /// leaves it open until the owner's next call).
    reported: AtomicBool,
}

/// Why the watchdog stepped in.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cause {
    /// The oldest unfinished call had been running for this long, past the timeout.
    Timeout {
        /// How long it had been enqueued.
        waited: Duration,
        /// The communicator's timeout.
        timeout: Duration,
    },
    /// NCCL reported an asynchronous error (`ncclCommGetAsyncError`).
    AsyncError(ResultCode),
    /// NCCL had said `ncclInProgress` at every poll for this long, past the timeout: a host-side
    /// operation of a nonblocking communicator (connecting at a first call, a group's end, a
    /// split, a finalize) that never completes, with no call of it for the recorder to time.
    InProgress {
        /// How long NCCL had been saying so.
        waited: Duration,
        /// The communicator's timeout.
        timeout: Duration,
    },
}

/// What the watchdog found and did about one communicator.
#[derive(Clone, Debug)]
pub struct HangReport {
    /// The communicator's rank, size and device.
    pub rank: usize,
    /// Ranks in the communicator.
    pub size: usize,
    /// CUDA device ordinal.
    pub device: usize,
    /// Why.
    pub cause: Cause,
    /// The call that hung (the oldest unfinished one), when the recorder still has it.
    pub hung: Option<CallRecord>,
    /// The abort: done at once (`Aborted`), or requested from the owner (`Requested`), or the
    /// communicator was closed meanwhile; `Err` is NCCL's report from `ncclCommAbort`.
    pub abort: std::result::Result<AbortStatus, String>,
    /// The flight recorder's contents, oldest first.
    pub recent: Vec<CallRecord>,
}

impl std::fmt::Display for HangReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nccl watchdog: rank {} of {} (GPU {}): ", self.rank, self.size, self.device)?;
        match &self.cause {
            Cause::Timeout { waited, timeout } => {
                let call = self.hung.as_ref().map_or_else(|| "a call".to_string(), |c| c.to_string());
                write!(f, "{call} has not finished after {waited:.1?} (timeout {timeout:.1?})")?
            }
            Cause::AsyncError(code) => {
                write!(f, "NCCL reports {} ({})", code.name().unwrap_or("an error"), code.message())?
            }
            Cause::InProgress { waited, timeout } => write!(
                f,
                "NCCL has said ncclInProgress for {waited:.1?} (timeout {timeout:.1?}): an operation of the \
                 communicator does not complete"
            )?,
        }
        match &self.abort {
            Ok(AbortStatus::Aborted) => writeln!(f, "; the communicator was aborted")?,
            Ok(AbortStatus::Requested) => {
                writeln!(f, "; abort requested (the owner is busy: it aborts at its next call)")?
            }
            Ok(_) => writeln!(f, "; the communicator was already closed")?,
            Err(e) => writeln!(f, "; aborting failed: {e}")?,
        }
        writeln!(f, "flight recorder, oldest first ({} calls):", self.recent.len())?;
        for call in &self.recent {
            let mark = if Some(call.seq) == self.hung.as_ref().map(|c| c.seq) { "  <- hung" } else { "" };
            writeln!(f, "  {call}{mark}")?;
        }
        Ok(())
    }
}

/// What the watchdog thread and its handle share.
struct Shared {
    id: u64,
    poll: Duration,
    stop: Mutex<bool>,
    wake: Condvar,
    reports: Mutex<Vec<HangReport>>,
    print: AtomicBool,
}

/// The watchdog thread (see the [module docs](self)). Dropping it stops the thread (within one
/// poll interval) and stops watching its communicators.
pub struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog").field("poll", &self.shared.poll).finish_non_exhaustive()
    }
}

impl Watchdog {
    /// Starts the thread, which checks its communicators every `poll` (at least 1 ms). An `Err`
    /// is the operating system's refusal to start a thread.
    pub fn start(poll: Duration) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            poll: poll.max(Duration::from_millis(1)),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            reports: Mutex::new(Vec::new()),
            print: AtomicBool::new(true),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new().name("nccl-watchdog".into()).spawn(move || worker.run())?;
        Ok(Watchdog { shared, thread: Some(thread) })
    }

    /// Watches `comm`: its calls are recorded from now on, and it is aborted when a call's work
    /// has not finished `timeout` after it was enqueued, or NCCL reports an error, or NCCL has said
    /// "in progress" for `timeout` at every poll of an owner parked in it (a host-side operation:
    /// a first call connecting to a peer, a group's end, a split, a window registration, a
    /// finalize — these are collective, so a peer later than `timeout` counts as hung). Nonblocking
    /// communicators only ([`Error::NeedsNonblocking`](crate::Error::NeedsNonblocking)): a blocking
    /// NCCL call cannot be interrupted.
    pub fn watch(&self, comm: &Comm, timeout: Duration) -> Result<()> {
        self.watch_with_history(comm, timeout, DEFAULT_HISTORY)
    }

    /// [`Watchdog::watch`] keeping the last `calls` calls in the flight recorder (64 by default).
    pub fn watch_with_history(&self, comm: &Comm, timeout: Duration, calls: usize) -> Result<()> {
        let handle = comm.abort_handle()?;
        comm.live_raw()?;
        let key = comm.identity();
        let mut watched = lock(&WATCHED);
        watched.retain(|w| w.key != key);
        watched.push(Arc::new(Watched {
            watchdog: self.shared.id,
            key,
            handle,
            rank: comm.rank(),
            size: comm.size(),
            device: comm.device(),
            timeout,
            recorder: Mutex::new(Recorder::new(calls)),
            in_progress: Mutex::new(None),
            reported: AtomicBool::new(false),
        }));
        ACTIVE.store(watched.len(), Ordering::Relaxed);
        Ok(())
    }

    /// Stops watching `comm` (its recorder is dropped).
    pub fn unwatch(&self, comm: &Comm) {
        let key = comm.identity();
        forget(|w| w.watchdog == self.shared.id && w.key == key);
    }

    /// The flight recorder of `comm` (its recent calls, oldest first), or `None` when this
    /// watchdog does not watch it. Kept after the communicator was aborted (by this watchdog, its
    /// own timeout or an abort handle), until it is unwatched or dropped.
    pub fn flight_record(&self, comm: &Comm) -> Option<Vec<CallRecord>> {
        let key = comm.identity();
        let watched = lock(&WATCHED).iter().find(|w| w.watchdog == self.shared.id && w.key == key).cloned()?;
        let record = lock(&watched.recorder).dump();
        Some(record)
    }

    /// The reports made so far, oldest first.
    pub fn reports(&self) -> Vec<HangReport> {
        lock(&self.shared.reports).clone()
    }

    /// Whether reports are printed to stderr as they are made (on by default; they are always
    /// logged through the `log` crate and kept for [`Watchdog::reports`]).
    pub fn print_reports(&self, on: bool) {
        self.shared.print.store(on, Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        *lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::warn!("nccl: the watchdog thread panicked");
            }
        }
        let id = self.shared.id;
        forget(|w| w.watchdog == id);
    }
}

/// Forgets the communicator whose identity is `key` ([`Comm::identity`]): it is being dropped.
/// Call only when [`active`].
#[cold]
pub(crate) fn forget_comm(key: usize) {
    forget(|w| w.key == key);
}

/// Removes the watched communicators `which` selects.
fn forget(which: impl Fn(&Watched) -> bool) {
    let mut watched = lock(&WATCHED);
    watched.retain(|w| !which(w));
    ACTIVE.store(watched.len(), Ordering::Relaxed);
}

impl Shared {
    fn run(&self) {
        loop {
            let mine: Vec<Arc<Watched>> = lock(&WATCHED).iter().filter(|w| w.watchdog == self.id).cloned().collect();
            for w in mine {
                // A closed or reported communicator is not watched any more; its entry (and flight
                // record) stays until it is unwatched or dropped (`forget_comm`).
                if w.handle.is_closed() || w.reported.load(Ordering::Acquire) {
                    continue;
                }
                // Held across the abort, so that an owner who sees its communicator aborted and
                // asks for the reports finds this one (not an empty list a moment too early).
                let mut reports = lock(&self.reports);
                if let Some(report) = check(&w) {
                    w.reported.store(true, Ordering::Release);
                    log::error!("{report}");
                    if self.print.load(Ordering::Relaxed) {
                        // Not `eprint!`, which panics when stderr is gone (a launcher that read
                        // the pipe died): the watchdog thread must outlive that.
                        let _ = write!(std::io::stderr(), "{report}");
                    }
                    reports.push(report);
                }
            }
            let stop = lock(&self.stop);
            if *stop {
                return;
            }
            let (stop, _) = self.wake.wait_timeout(stop, self.poll).unwrap_or_else(PoisonError::into_inner);
            if *stop {
                return;
            }
        }
    }
}

/// One poll of one communicator: a report (after aborting it) when it is overdue or failed.
fn check(w: &Watched) -> Option<HangReport> {
    let mut recorder = lock(&w.recorder);
    // An event that cannot be queried counts as unfinished: a broken context shows as a hang.
    let oldest = recorder.reap(Instant::now(), |e| e.try_is_complete().unwrap_or(false));
    let cause = match oldest {
        Some((_, waited)) if waited >= w.timeout => Cause::Timeout { waited, timeout: w.timeout },
        _ => {
            let rc = w.handle.peek_async_error();
            let since = &mut *lock(&w.in_progress);
            match rc {
                Some(rc) if rc != ncclResult_t::ncclSuccess && rc != ncclResult_t::ncclInProgress => {
                    Cause::AsyncError(ResultCode(rc.0))
                }
                rc => {
                    let waited = in_progress_for(since, rc, Instant::now())?;
                    if waited < w.timeout {
                        return None;
                    }
                    Cause::InProgress { waited, timeout: w.timeout }
                }
            }
        }
    };
    let abort = w.handle.abort().map_err(|e| e.to_string());
    Some(HangReport {
        rank: w.rank,
        size: w.size,
        device: w.device,
        cause,
        hung: oldest.and_then(|(seq, _)| recorder.get(seq).cloned()),
        abort,
        recent: recorder.dump(),
    })
}

/// How long NCCL has said `ncclInProgress` at every poll in a row, given this poll's answer `rc`
/// at `now`; `since` keeps when the run of such answers began. `None` when this answer ends the
/// run: another answer, or none (`rc` is `None`: the owner was not parked, so nothing is known of
/// that moment — it may have finished one operation and begun another, which must not inherit the
/// first one's start). An operation stuck "in progress" has its owner parked in its poll nearly
/// all the time, so a run rarely breaks for it; one broken run delays the abort by the run so far.
fn in_progress_for(since: &mut Option<Instant>, rc: Option<ncclResult_t>, now: Instant) -> Option<Duration> {
    if rc != Some(ncclResult_t::ncclInProgress) {
        *since = None;
        return None;
    }
    Some(now.saturating_duration_since(*since.get_or_insert(now)))
}

/// True while any communicator is watched: the one check on the call path when none is.
#[inline]
pub(crate) fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed) != 0
}

/// Records `call`, just enqueued by `comm` on `stream`, if `comm` is watched. `captured` is
/// whether `stream` is being captured, when the caller already knows (`None`: asked here). Call
/// only when [`active`].
#[cold]
pub(crate) fn note(comm: &Comm, call: &Call, stream: &CudaStream, captured: Option<bool>) {
    let key = comm.identity();
    let Some(w) = lock(&WATCHED).iter().find(|w| w.key == key && !w.handle.is_closed()).cloned() else {
        return;
    };
    let (count, dtype, rank, raw_stream) = call.describe();
    let record = CallRecord {
        seq: 0,
        call: call.name(),
        count,
        dtype: flight::dtype_name(dtype),
        rank: rank.map(|(what, r)| (what, r.max(0) as usize)),
        stream: raw_stream as usize,
        state: CallState::Enqueued,
    };
    let mut recorder = lock(&w.recorder);
    let captured = captured.map_or_else(|| gpucomm_ordering::is_capturing(stream), Ok);
    let event = match captured {
        Ok(false) => {
            let event = recorder.spare_event(|e| e.context() == stream.context());
            match event.map_or_else(|| stream.context().new_event(None), Ok) {
                Ok(event) => match event.record(stream) {
                    Ok(()) => Some(event),
                    Err(e) => return log::warn!("nccl watchdog: recording {}: {e}", call.name()),
                },
                Err(e) => return log::warn!("nccl watchdog: recording {}: {e}", call.name()),
            }
        }
        // Captured into a graph (or the query failed): recorded without an event.
        _ => None,
    };
    recorder.push(record, event, Instant::now());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_progress_is_timed_from_the_first_of_a_run_of_answers() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let busy = Some(ncclResult_t::ncclInProgress);
        let mut since = None;
        assert_eq!(in_progress_for(&mut since, busy, at(0)), Some(Duration::ZERO));
        assert_eq!(in_progress_for(&mut since, busy, at(40)), Some(Duration::from_millis(40)));
        // An owner that is not parked cannot be asked: no answer, and the run starts again (an
        // operation seen after it may be another one, which must not inherit this one's start).
        assert_eq!(in_progress_for(&mut since, None, at(50)), None);
        assert_eq!(in_progress_for(&mut since, busy, at(60)), Some(Duration::ZERO));
        assert_eq!(in_progress_for(&mut since, busy, at(61)), Some(Duration::from_millis(1)));
        assert_eq!(in_progress_for(&mut since, Some(ncclResult_t::ncclSuccess), at(70)), None);
        assert_eq!(since, None);
        assert_eq!(in_progress_for(&mut since, busy, at(90)), Some(Duration::ZERO));
        assert_eq!(in_progress_for(&mut since, busy, at(95)), Some(Duration::from_millis(5)));
    }

    #[test]
    fn the_idle_check_costs_nanoseconds() {
        // The only watchdog code on the call path while nothing is watched.
        assert!(!active(), "a unit test left a communicator watched");
        // The fastest of 10 batches: a batch that a loaded CI machine preempted counts for nothing.
        const BATCHES: u32 = 10;
        const N: u32 = 1_000_000;
        let mut seen = 0u32;
        let per_call = (0..BATCHES)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..N {
                    seen += u32::from(std::hint::black_box(active()));
                }
                start.elapsed() / N
            })
            .min()
            .unwrap();
        println!("idle watchdog check: {per_call:?} per call (the fastest of {BATCHES} batches of {N})");
        assert_eq!(seen, 0);
        // A relaxed load is ~1 ns; the bound leaves room for debug builds.
        assert!(per_call < Duration::from_nanos(50), "{per_call:?} per call");
    }

    #[test]
    fn reports_name_the_hung_call_and_dump_the_recorder() {
        let call = |seq, state| CallRecord {
            seq,
            call: "ncclAllReduce",
            count: 1024,
            dtype: "f32",
            rank: None,
            stream: 0x20,
            state,
        };
        let report = HangReport {
            rank: 0,
            size: 2,
            device: 0,
            cause: Cause::Timeout { waited: Duration::from_millis(2500), timeout: Duration::from_secs(2) },
            hung: Some(call(1, CallState::Enqueued)),
            abort: Ok(AbortStatus::Aborted),
            recent: vec![call(0, CallState::Completed), call(1, CallState::Enqueued)],
        };
        assert_eq!(
            report.to_string(),
            "nccl watchdog: rank 0 of 2 (GPU 0): #1 ncclAllReduce count 1024 f32 stream 0x20 Enqueued has not \
             finished after 2.5s (timeout 2.0s); the communicator was aborted\n\
             flight recorder, oldest first (2 calls):\n  \
             #0 ncclAllReduce count 1024 f32 stream 0x20 Completed\n  \
             #1 ncclAllReduce count 1024 f32 stream 0x20 Enqueued  <- hung\n"
        );
    }
}
