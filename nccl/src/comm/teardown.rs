//! Ending a communicator: finalize (blocking, or started and polled) + destroy, abort, and what
//! `Drop` does.

use std::time::Duration;

use nccl_sys::ncclResult_t;

use super::wait::Deadline;
use super::Comm;
use crate::error::{Error, Result};
use crate::ffi::{call, call_unchecked, check};
use crate::group::open::{is_open, refuse_teardown_inside};

/// A communicator whose finalize NCCL is carrying out ([`Comm::start_finalize`]): what lets one
/// thread finalize several nonblocking communicators (one per GPU) at once, as finalizing is
/// collective. [`wait`](Finalizing::wait) completes it and destroys the communicator. Dropped
/// unfinished, the communicator is destroyed if NCCL has finished, aborted otherwise.
#[must_use = "call `wait` to finish the finalize and destroy the communicator"]
#[derive(Debug)]
pub struct Finalizing {
    comm: Option<Comm>,
    /// The communicator's timeout from when the finalize started: the wait for outstanding work
    /// before `ncclCommFinalize` and the finalize itself share it (the finalize gets at least
    /// [`Deadline::finalize_grace`]), so that a teardown ends within one timeout and that grace.
    deadline: Option<Deadline>,
}

impl Finalizing {
    /// True once NCCL has flushed everything (one `ncclCommGetAsyncError` poll); an `Err` if the
    /// finalize failed.
    #[doc(alias = "ncclCommGetAsyncError")]
    pub fn is_done(&self) -> Result<bool> {
        let comm = self.comm.as_ref().ok_or(Error::Aborted)?;
        comm.health.check()?;
        comm.nccl_ready("ncclCommFinalize")
    }

    /// Waits for the finalize, then destroys the communicator (`ncclCommDestroy`). Bounded by
    /// `timeout` from now, or else by the communicator's own from when the finalize started
    /// ([`Comm::start_finalize`], whose wait for outstanding work counts); when that expires the
    /// communicator is aborted.
    /// On failure the communicator comes back with the error, as from [`Comm::finalize`].
    #[doc(alias = "ncclCommDestroy")]
    // The project's teardown convention hands the object back on failure; the size of the error
    // variant does not matter for a call made once per communicator.
    #[allow(clippy::result_large_err)]
    pub fn wait(mut self, timeout: Option<Duration>) -> std::result::Result<(), (Comm, Error)> {
        let Some(comm) = self.comm.take() else { return Ok(()) };
        let deadline =
            if timeout.is_some() { Deadline::after(timeout) } else { self.deadline.map(Deadline::finalize_grace) };
        match comm.await_ready_until("ncclCommFinalize", deadline).and_then(|()| comm.destroy()) {
            Ok(()) => Ok(()),
            Err(e) => Err((comm, e)),
        }
    }
}

impl Drop for Finalizing {
    fn drop(&mut self) {
        let Some(comm) = self.comm.take() else { return };
        // Never block in drop: destroy only what NCCL has finished with.
        match comm.nccl_ready("ncclCommFinalize") {
            Ok(true) => {
                if let Err(e) = comm.destroy() {
                    log::warn!("nccl: destroying a finalized communicator failed: {e}");
                }
            }
            _ => comm.health.abort_quietly(),
        }
    }
}

impl Comm {
    /// Flushes outstanding operations and releases the communicator (`ncclCommFinalize` then
    /// `ncclCommDestroy`). Collective within the node: every rank must finalize. A nonblocking
    /// finalize is polled to completion, bounded by the communicator's timeout (which aborts it;
    /// one timeout for the whole teardown, the wait for outstanding work below included, with up
    /// to a second's grace for the finalize itself);
    /// [`Comm::start_finalize`] lets one thread finalize several communicators. On failure the
    /// communicator is handed back with the error, so the caller can [`abort`](Self::abort) it;
    /// after an abort that is [`Error::Aborted`] with a communicator that needs nothing more.
    ///
    /// Inside a [`group`](crate::group) closure it is refused with [`Error::InsideGroup`] and the
    /// communicator comes back; unlike a refused call, this refusal does not stop the group (the
    /// group's value would be dropped, and the communicator with it): the group still launches
    /// its calls and returns the closure's value, which can carry the communicator out.
    ///
    /// [`Error::GraphForgotten`] when a CUDA graph that captured the communicator was forgotten
    /// without being destroyed (`mem::forget`): NCCL's destroy would wait for it for ever, so the
    /// communicator is abandoned, and leaked when dropped.
    ///
    /// With a [timeout](Comm::timeout) set, the communicator's outstanding work is waited for
    /// first, as [`Comm::wait`]`(Some(timeout))` does: work that does not finish in time — a
    /// collective whose kernel waits for a dead peer, which NCCL keeps reporting as a success —
    /// aborts the communicator, and the result is [`Error::Timeout`] (or NCCL's error, or
    /// [`Error::Aborted`] after a watchdog's abort) instead of a finalize. Without a timeout,
    /// finalizing a *blocking* communicator whose work is stuck blocks inside NCCL for as long as
    /// that work runs — for ever behind a dead peer — out of every timeout's and watchdog's reach;
    /// a nonblocking one waits parked, where an [`AbortHandle`](crate::AbortHandle) or a
    /// [`Watchdog`](crate::Watchdog) can abort it.
    #[doc(alias = "ncclCommFinalize")]
    #[doc(alias = "ncclCommDestroy")]
    #[allow(clippy::result_large_err)] // see `Finalizing::wait`
    pub fn finalize(self) -> std::result::Result<(), (Self, Error)> {
        self.start_finalize()?.wait(None)
    }

    /// Starts finalizing (`ncclCommFinalize`) and returns without waiting for a nonblocking
    /// communicator to finish (a blocking one has finished when this returns); complete it with
    /// [`Finalizing::wait`]. With a timeout set, the communicator's outstanding work is waited for
    /// first, bounded by it (see [`Comm::finalize`]). After [`Comm::revoke`], which NCCL forbids
    /// finalizing after, only the destroy remains to be done.
    #[doc(alias = "ncclCommFinalize")]
    #[allow(clippy::result_large_err)] // see `Finalizing::wait`
    pub fn start_finalize(self) -> std::result::Result<Finalizing, (Self, Error)> {
        let deadline = Deadline::after(self.timeout());
        match self.health.no_graph_left().and_then(|()| self.begin_finalize()) {
            Ok(()) => Ok(Finalizing { comm: Some(self), deadline }),
            Err(e) => Err((self, e)),
        }
    }

    /// Stops outstanding operations and frees the communicator (`ncclCommAbort`); use after an
    /// error or to unblock a hung job. Every other rank must abort its communicator too (NCCL's
    /// rule). `Ok` also when it was already aborted; an `Err` is NCCL's report, after which the
    /// communicator is freed anyway, or [`Error::Abandoned`] when NCCL could not be called (what
    /// NCCL may still use is then leaked). A communicator aborted earlier while CUDA graphs that
    /// captured it were alive (by a timeout or an [`AbortHandle`](crate::AbortHandle)) was only
    /// stopped then (`ncclCommRevoke`); it is freed here. That stop waits at most 10 s for NCCL,
    /// whose revoke first waits for the work enqueued before it: past that (a graph launch held
    /// behind work that never ends) the communicator was abandoned, and is leaked here, as is
    /// one whose call was still in progress. [`Error::GraphForgotten`] when a CUDA graph that captured it
    /// was forgotten: NCCL's abort would wait for it for ever, so the communicator is leaked.
    #[doc(alias = "ncclCommAbort")]
    pub fn abort(self) -> Result<()> {
        self.health.no_graph_left()?;
        let aborted = self.health.abort().map(drop);
        aborted.and(self.health.finish())
    }

    /// The `ncclCommFinalize` call, leaving `ncclInProgress` to the caller's polling. With a
    /// timeout set, the communicator's outstanding work is waited for first ([`Comm::wait`],
    /// bounded by the timeout, whose expiry aborts it): NCCL keeps reporting success while a
    /// collective's kernel waits for a dead peer, and a blocking `ncclCommFinalize` would wait
    /// for that kernel inside NCCL, where no timeout or watchdog reaches.
    fn begin_finalize(&self) -> Result<()> {
        self.live_raw()?;
        refuse_teardown_inside()?;
        if self.health.is_revoked() {
            return Ok(());
        }
        if let Some(timeout) = self.timeout() {
            self.wait(Some(timeout))?;
        }
        // Taken after the wait, which may have aborted it.
        let raw = self.live_raw()?;
        self.context().bind_to_thread()?;
        // SAFETY: `raw` is live and owned, and no NCCL call on it is in flight.
        let rc = unsafe { call_unchecked!(ncclCommFinalize(raw)) }?;
        match rc {
            ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => Ok(()),
            failed => check("ncclCommFinalize", failed, Some(raw)),
        }
    }

    /// `ncclCommDestroy`, after which the communicator counts as closed whatever NCCL returned:
    /// the handle may be freed, so nothing may touch it again.
    fn destroy(&self) -> Result<()> {
        let raw = self.live_raw()?;
        self.context().bind_to_thread()?;
        // SAFETY: `raw` is live and owned, NCCL has finished with it (finalized or revoked), and
        // it is never used again (closed below).
        let destroyed = unsafe { call!(ncclCommDestroy(raw)) };
        self.health.detach();
        destroyed
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let left_alive = self.end();
        if crate::watchdog::active() {
            crate::watchdog::forget_comm(self.identity());
        }
        if left_alive || self.health.is_abandoned() {
            // Leaked, or its abort could not call NCCL: NCCL's background jobs may still write the
            // child slots and read the config strings, so both are kept for good.
            std::mem::forget(self.child_slots.take());
            std::mem::forget(self._strings.take());
        }
    }
}

impl Comm {
    /// What dropping does to a communicator that is not closed yet: finalize and destroy it, or
    /// abort it (see [`Comm`]). True when it is left alive instead (dropped inside a group).
    fn end(&self) -> bool {
        let deferred = self.health.is_deferred();
        if self.health.is_closed() && !deferred {
            return false;
        }
        if self.health.no_graph_left().is_err() {
            // Abandoned, and logged: the caller leaks what NCCL may still use.
            return false;
        }
        if is_open() {
            // NCCL would only record the teardown until the group ends; leaking is the safe choice.
            log::warn!("nccl: a Comm dropped inside nccl::group is leaked; drop communicators outside groups");
            return true;
        }
        if !deferred {
            self.finalize_or_abort();
        }
        // Dropped, the communicator is borrowed by no graph any more: an abort deferred because
        // graphs did (earlier, or just now) is carried out.
        if let Err(e) = self.health.finish() {
            log::warn!("nccl: aborting a dropped communicator failed: {e}");
        }
        false
    }

    /// Finalizes and destroys a live communicator, or aborts it after a failure (or a panic), as
    /// [`Comm::finalize`] would: with a timeout set, outstanding work that does not finish within
    /// it aborts the communicator instead.
    fn finalize_or_abort(&self) {
        if std::thread::panicking() || self.async_error().is_err() {
            self.health.abort_quietly();
            return;
        }
        // One timeout for the wait before the finalize and the finalize itself.
        let deadline = Deadline::after(self.timeout());
        let closed = self
            .begin_finalize()
            .and_then(|()| self.await_ready_until("ncclCommFinalize", deadline.map(Deadline::finalize_grace)))
            .and_then(|()| self.destroy());
        if let Err(e) = closed {
            if !matches!(e, Error::Aborted) {
                log::warn!("nccl: finalizing a dropped communicator failed ({e}); aborting it");
            }
            self.health.abort_quietly();
        }
    }
}
