//! Waiting on a communicator: [`Comm::wait`], and polling NCCL's state with a deadline, parked
//! between polls so that an [`AbortHandle`](super::AbortHandle) can abort (see `health`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;
use nccl_sys::ncclResult_t;

use super::Comm;
use crate::error::{Error, Result};
use crate::ffi::check;

/// Pauses between polls: yields at first (a nonblocking enqueue usually finishes within
/// microseconds), then sleeps, up to a millisecond.
#[derive(Default)]
struct Backoff(u32);

impl Backoff {
    fn pause(&mut self) {
        self.0 = self.0.saturating_add(1);
        match self.0.checked_sub(64) {
            None | Some(0) => std::thread::yield_now(),
            Some(n) => std::thread::sleep(Duration::from_micros(u64::from(n).clamp(20, 1000))),
        }
    }
}

/// A deadline: when it expires, and the timeout it came from (for the message).
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadline {
    at: Instant,
    after: Duration,
}

impl Deadline {
    /// `timeout` from now (`None`: none, or too far away for an `Instant`).
    pub(super) fn after(timeout: Option<Duration>) -> Option<Self> {
        let after = timeout?;
        Some(Deadline { at: Instant::now().checked_add(after)?, after })
    }

    /// This deadline, moved to a grace from now if it would come sooner: for a teardown's
    /// finalize, whose earlier wait may have used up the timeout on work that did finish. The
    /// grace is a second, or the timeout if shorter, so that a teardown ends within the timeout
    /// plus at most that.
    pub(super) fn finalize_grace(self) -> Self {
        match Instant::now().checked_add(self.after.min(Duration::from_secs(1))) {
            Some(at) if at > self.at => Deadline { at, ..self },
            _ => self,
        }
    }
}

impl Comm {
    /// Waits until everything this communicator enqueued has finished: NCCL no longer reports an
    /// operation in progress, the work on [`Comm::stream`] enqueued so far is done, and so is the
    /// work enqueued so far on every other stream this communicator's calls went to
    /// ([`Comm::on`], group members on other streams) since the last wait. Polls
    /// `ncclCommGetAsyncError`, so an asynchronous NCCL error comes back as [`Error::Nccl`]
    /// instead of a hang. Work captured into a CUDA graph is not waited for: it runs when the
    /// graph is launched. Inside a capture scope ([`crate::capture`]) it is refused
    /// ([`Error::WaitInCapture`]): CUDA refuses its host-side queries there. A stream that another
    /// thread's capture holds is not waited for at all, its earlier work included: a marker
    /// recorded on it would only join that graph.
    ///
    /// Bounded by `timeout` and by the communicator's own timeout, measured per call from its
    /// enqueue: when either expires, the communicator is **aborted** and the result is
    /// [`Error::Timeout`] (NCCL offers no way to cancel one collective). While a CUDA graph that
    /// captured the communicator ([`crate::capture`]) may be alive, the abort stops its work
    /// (`ncclCommRevoke`, NCCL ≥ 2.28.7) and leaves freeing it to [`Comm::abort`] or the drop:
    /// NCCL's `ncclCommAbort` would wait until every such graph is destroyed. With neither, it waits
    /// as long as it takes, but an [`AbortHandle`](crate::AbortHandle) can still end the wait ([`Error::Aborted`]).
    /// Polling costs up to a millisecond of latency compared with a stream synchronize.
    #[doc(alias = "ncclCommGetAsyncError")]
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        self.health.check()?;
        if gpucomm_ordering::scope_open() {
            return Err(Error::WaitInCapture);
        }
        let sides = self.watch.borrow_mut().take_sides();
        let waited = self.wait_with_sides(&sides, timeout);
        if waited.is_err() {
            // Not waited for: a later wait must still wait for the work on these streams.
            let mut watch = self.watch.borrow_mut();
            for side in &sides {
                watch.side_stream(side);
            }
        }
        waited
    }

    /// [`Comm::wait`] for the communicator's stream and `sides`.
    fn wait_with_sides(&self, sides: &[Arc<CudaStream>], timeout: Option<Duration>) -> Result<()> {
        // A stream being captured gets no marker: its event would be recorded into the capture,
        // and asking whether it completed would invalidate the capture.
        let mut markers = Vec::with_capacity(sides.len() + 1);
        for stream in std::iter::once(&self.stream).chain(sides) {
            if !gpucomm_ordering::is_capturing(stream)? {
                markers.push(stream.record_event(None)?);
            }
        }
        let bound = Deadline::after(timeout);
        self.poll("Comm::wait", bound, |comm| {
            if !comm.nccl_ready("ncclCommGetAsyncError")? {
                return Ok(false);
            }
            let mut watch = comm.watch.borrow_mut();
            if let Some(late) = watch.overdue()? {
                drop(watch);
                return Err(comm.time_out(late.call, late.after));
            }
            for marker in &markers {
                if !marker.try_is_complete()? {
                    return Ok(false);
                }
            }
            watch.all_done()
        })
    }

    /// What to do with the result code of a call that acts on this communicator: `Ok` for
    /// success, polling for `ncclInProgress` (bounded by the communicator's timeout), the error
    /// otherwise.
    ///
    /// On a nonblocking communicator success is polled too: NCCL 2.28 returns `ncclSuccess` from
    /// `ncclCommWindowRegister` and `ncclDevCommCreate` while the background task it started still
    /// runs (their group's `ncclInProgress` is dropped on the way out) and will still write the
    /// window handle or the device communicator through the caller's out-pointer. Only
    /// `ncclCommGetAsyncError` says when it is done; one query when it already is.
    ///
    /// `nonblocking` can be wrong, though (an adopted communicator's mode is its adopter's word,
    /// [`Comm::from_raw`]; NCCL reads `NCCL_COMM_BLOCKING` once per process, through its
    /// environment plugin, so a value changed before this crate first read it, or a plugin that
    /// answers from elsewhere, is seen differently by the two), so
    /// callers whose out-parameter NCCL's background job writes do not rely on this: after it
    /// they call [`Comm::await_ready`] whatever `nonblocking` says.
    pub(crate) fn complete(&self, call: &'static str, rc: ncclResult_t) -> Result<()> {
        match rc {
            ncclResult_t::ncclSuccess if !self.is_nonblocking() => Ok(()),
            ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => {
                self.poll(call, Deadline::after(self.timeout()), |c| c.nccl_ready(call))
            }
            _ => check(call, rc, Some(self.as_raw())),
        }
    }

    /// Polls until the communicator is out of `ncclInProgress`, for `call`: bounded by the
    /// communicator's timeout unless `timeout` says otherwise. On a ready communicator (every
    /// blocking one) this is one `ncclCommGetAsyncError`: the wait that calls whose out-parameter
    /// NCCL may still write from a background job (`ncclCommWindowRegister`, `ncclDevCommCreate`)
    /// make before they read, move or free it, whether or not the communicator is known to be
    /// nonblocking.
    pub(crate) fn await_ready(&self, call: &'static str, timeout: Option<Duration>) -> Result<()> {
        self.await_ready_until(call, Deadline::after(timeout.or(self.timeout())))
    }

    /// [`Comm::await_ready`] bounded by `deadline` (`None`: unbounded), taken earlier: a
    /// teardown's steps share one.
    pub(super) fn await_ready_until(&self, call: &'static str, deadline: Option<Deadline>) -> Result<()> {
        self.poll(call, deadline, |c| c.nccl_ready(call))
    }

    /// One poll of NCCL's state: `Ok(true)` ready, `Ok(false)` still in progress, or the failure
    /// (named after `call`, the operation that was in progress).
    pub(super) fn nccl_ready(&self, call: &'static str) -> Result<bool> {
        match self.async_state()? {
            ncclResult_t::ncclSuccess => Ok(true),
            ncclResult_t::ncclInProgress => Ok(false),
            failed => {
                // `check` turns the failure code into its error, with NCCL's detail.
                check(call, failed, Some(self.as_raw()))?;
                Ok(true)
            }
        }
    }

    /// Polls `ready` until it says so, parked between polls so that an [`AbortHandle`] can abort;
    /// at `deadline` the communicator is aborted and the result is [`Error::Timeout`].
    fn poll(
        &self,
        what: &'static str,
        deadline: Option<Deadline>,
        mut ready: impl FnMut(&Self) -> Result<bool>,
    ) -> Result<()> {
        let mut backoff = Backoff::default();
        loop {
            self.health.check()?;
            if ready(self)? {
                return Ok(());
            }
            if let Some(d) = deadline {
                if Instant::now() >= d.at {
                    return Err(self.time_out(what, d.after));
                }
            }
            self.health.park()?;
            backoff.pause();
            self.health.unpark()?;
        }
    }

    /// Aborts after a timeout and says so.
    pub(super) fn time_out(&self, what: &'static str, after: Duration) -> Error {
        self.health.abort_quietly();
        Error::Timeout { what, after }
    }
}
