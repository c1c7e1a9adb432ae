//! Ending a communicator: finalize + destroy, abort, and what `Drop` does.

use super::{outside_group, Comm};
use crate::error::{call, call_rc, Error, Result};

impl Comm {
    /// Flushes outstanding operations and releases the communicator (`ncclCommFinalize` then
    /// `ncclCommDestroy`). Collective within the node: every rank must finalize. A nonblocking
    /// finalize is polled to completion, bounded by the communicator's timeout (which aborts it).
    /// On failure the communicator is handed back with the error, so the caller can
    /// [`abort`](Self::abort) it; after an abort (or once destroyed) that is [`Error::Aborted`]
    /// with a communicator that needs nothing more.
    #[doc(alias = "ncclCommFinalize")]
    #[doc(alias = "ncclCommDestroy")]
    // The project's teardown convention hands the object back on failure; the size of the error
    // variant does not matter for a call made once per communicator.
    #[allow(clippy::result_large_err)]
    pub fn finalize(self) -> std::result::Result<(), (Self, Error)> {
        match self.close() {
            // Closed: the drop that follows does nothing.
            Ok(()) => Ok(()),
            Err(e) => Err((self, e)),
        }
    }

    /// Stops outstanding operations and frees the communicator (`ncclCommAbort`); use after an
    /// error or to unblock a hung job. Every other rank must abort its communicator too (NCCL's
    /// rule). `Ok` also when it was already aborted; an `Err` is NCCL's report, after which the
    /// communicator is freed anyway.
    #[doc(alias = "ncclCommAbort")]
    pub fn abort(self) -> Result<()> {
        self.health.abort().map(drop)
    }

    /// Finalize (skipped after a revoke, which NCCL forbids it after) then destroy. Marks the
    /// communicator closed once `ncclCommDestroy` ran, whatever it returned: the handle may be
    /// freed, so nothing may touch it again.
    fn close(&self) -> Result<()> {
        self.health.check()?;
        outside_group()?;
        self.context().bind_to_thread()?;
        let raw = self.as_raw();
        if !self.revoked.get() {
            // SAFETY: `raw` is live and owned, and no NCCL call on it is in flight.
            let rc = unsafe { call_rc!(ncclCommFinalize(raw)) }?;
            self.complete("ncclCommFinalize", rc)?;
        }
        // SAFETY: as above; after this call the handle is never used again (closed below).
        let destroyed = unsafe { call!(ncclCommDestroy(raw)) };
        self.health.detach();
        destroyed
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if self.health.is_closed() {
            return;
        }
        if crate::group::is_open() {
            // NCCL would only record the teardown until the group ends; leaking is the safe choice.
            log::warn!("nccl: a Comm dropped inside nccl::group is leaked; drop communicators outside groups");
            return;
        }
        if std::thread::panicking() || self.async_error().is_err() {
            return self.health.abort_quietly();
        }
        if let Err(e) = self.close() {
            if !matches!(e, Error::Aborted) {
                log::warn!("nccl: finalizing a dropped communicator failed ({e}); aborting it");
            }
            self.health.abort_quietly();
        }
    }
}
