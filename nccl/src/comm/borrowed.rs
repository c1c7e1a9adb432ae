//! Communicators that belong to someone else: [`BorrowedComm`].

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use gpucomm_ordering::{Keep, Visitor};
use nccl_sys::ncclComm_t;

use super::Comm;
use crate::error::Result;
use crate::group::{Group, Member};
use crate::target::{OnStream, Plan, Target};

/// A communicator that a framework (or C code, or another binding) created and still owns, used
/// through this crate's checked calls: every collective of [`crate::Collectives`], on its own
/// stream or [another](BorrowedComm::on), and in [groups](Group::with_borrowed).
///
/// Calls on it can be captured into a CUDA graph ([`crate::capture`]): the graph keeps
/// `&BorrowedComm` (it then cannot outlive the borrowed communicator, nor so the owner's borrow),
/// and a capture whose keep set lacks it fails like one that lacks a `&Comm`. Destroy such a
/// graph before the owner destroys or aborts the communicator: NCCL waits until every graph
/// holding a communicator's work is destroyed, so after `mem::forget` of one the owner's
/// `ncclCommDestroy` never returns (dropping the `BorrowedComm` logs a warning then).
///
/// It is never finalized, destroyed or aborted by this crate — not when dropped, not on an error,
/// not by a timeout (it has none, and hands out no [`crate::AbortHandle`]) — and it cannot outlive
/// the borrow it was made from ([`BorrowedComm::from_raw_borrowed`]). This is the counterpart of
/// [`Comm::from_raw`], which takes ownership. PyTorch hands out its process group's communicator
/// this way (`ProcessGroupNCCL._comm_ptr()`).
///
/// ```no_run
/// # fn demo(raw: nccl::sys::ncclComm_t, stream: std::sync::Arc<cudarc::driver::CudaStream>,
/// #         mut grads: cudarc::driver::CudaSlice<f32>) -> nccl::Result<()> {
/// use nccl::{BorrowedComm, Collectives, ReduceOp};
/// struct ProcessGroup { comm: nccl::sys::ncclComm_t } // the framework's object
/// let group = ProcessGroup { comm: raw };
/// // SAFETY: `group` owns a live, ready communicator on `stream`'s device, keeps it alive while
/// // it is borrowed, and nothing else operates it meanwhile.
/// let comm = unsafe { BorrowedComm::from_raw_borrowed(group.comm, stream, &group) }?;
/// comm.all_reduce_in_place(&mut grads, ReduceOp::AVG)?;
/// drop(comm); // `group` still owns a healthy communicator
/// # Ok(()) }
/// ```
pub struct BorrowedComm<'a> {
    /// Given back (detached, never torn down) when dropped; `None` only during `drop`.
    comm: Option<Comm>,
    _owner: PhantomData<&'a ()>,
}

impl std::fmt::Debug for BorrowedComm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BorrowedComm").field(&self.comm).finish()
    }
}

impl<'a> BorrowedComm<'a> {
    /// Uses the communicator `raw` that `owner` owns, for as long as `owner` is borrowed. Rank,
    /// size and device are queried from NCCL; the communicator must live on `stream`'s device,
    /// which becomes its default stream. On error the communicator is left untouched.
    ///
    /// # Safety
    ///
    /// `raw` must be a live, ready communicator that stays alive — not destroyed, finalized or
    /// aborted — for all of `'a`, and that no other thread operates while this value uses it
    /// (NCCL allows one thread at a time; a framework's own watchdog that only polls
    /// `ncclCommGetAsyncError` is fine). `owner` is whatever guarantees that, e.g. the framework's
    /// process-group object.
    ///
    /// No NCCL group opened outside this crate (`ncclGroupStart` called by the caller or by the
    /// framework — PyTorch's coalescing manager, `torch.distributed._coalescing_manager`, opens
    /// one around the calls it coalesces) may be open on a thread while it calls through this
    /// value. NCCL only records the calls made inside a group and enqueues them at that group's
    /// `ncclGroupEnd`, while this crate ends its buffers' stream bookkeeping when the call
    /// returns: the buffers could then be freed or reused before NCCL's kernels run on them (a
    /// use after free). This crate knows its own [groups](crate::group()) only, and cannot tell
    /// that another is open.
    ///
    /// `raw` must be blocking, as for [`Comm::from_raw`]: borrow a nonblocking one (PyTorch's,
    /// with `TORCH_NCCL_USE_COMM_NONBLOCKING=1`) with [`BorrowedComm::from_raw_borrowed_nonblocking`].
    /// Its graph mixing must be NCCL's default, as for [`Comm::from_raw`].
    pub unsafe fn from_raw_borrowed<O: ?Sized>(raw: ncclComm_t, stream: Arc<CudaStream>, owner: &'a O) -> Result<Self> {
        let _ = owner;
        // SAFETY: forwarded (the caller's contract, `raw` blocking included).
        unsafe { Self::borrow(raw, stream, false) }
    }

    /// [`BorrowedComm::from_raw_borrowed`] for a nonblocking communicator: calls that NCCL answers
    /// with "in progress" are polled to completion.
    ///
    /// # Safety
    ///
    /// As for [`BorrowedComm::from_raw_borrowed`], except that `raw` must be nonblocking.
    pub unsafe fn from_raw_borrowed_nonblocking<O: ?Sized>(
        raw: ncclComm_t,
        stream: Arc<CudaStream>,
        owner: &'a O,
    ) -> Result<Self> {
        let _ = owner;
        // SAFETY: forwarded (the caller's contract, `raw` nonblocking included).
        unsafe { Self::borrow(raw, stream, true) }
    }

    /// Wraps `raw`, of the stated mode, for the caller's borrow. `Comm`'s ownership is never
    /// exercised: the communicator is given back with `into_raw` in `drop`, and nothing reachable
    /// from a `BorrowedComm` can finalize, abort or time it out (no `&Comm` is handed out).
    ///
    /// # Safety
    ///
    /// As for [`BorrowedComm::from_raw_borrowed`], with `raw` nonblocking exactly when
    /// `nonblocking` is true.
    unsafe fn borrow(raw: ncclComm_t, stream: Arc<CudaStream>, nonblocking: bool) -> Result<Self> {
        // SAFETY: the caller's contract covers `Comm::from_raw`'s for as long as the value lives,
        // and the ownership it gives is never exercised (see above).
        let comm = unsafe { Comm::adopt(raw, stream, nonblocking) }?;
        Ok(BorrowedComm { comm: Some(comm), _owner: PhantomData })
    }

    /// The communicator as this crate's calls see it (never handed out: see the type's docs).
    pub(crate) fn comm(&self) -> &Comm {
        // Always `Some` outside `drop`.
        self.comm.as_ref().expect("BorrowedComm used during drop")
    }

    /// This rank (`ncclCommUserRank`).
    #[doc(alias = "ncclCommUserRank")]
    pub fn rank(&self) -> usize {
        self.comm().rank()
    }

    /// Number of ranks (`ncclCommCount`).
    #[doc(alias = "ncclCommCount")]
    pub fn size(&self) -> usize {
        self.comm().size()
    }

    /// The CUDA device ordinal (`ncclCommCuDevice`).
    #[doc(alias = "ncclCommCuDevice")]
    pub fn device(&self) -> usize {
        self.comm().device()
    }

    /// The default stream collectives are enqueued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.comm().stream()
    }

    /// The CUDA context of the communicator's device.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.comm().context()
    }

    /// The raw handle, still owned by its owner.
    pub fn as_raw(&self) -> ncclComm_t {
        self.comm().as_raw()
    }

    /// The error state of asynchronous operations (`ncclCommGetAsyncError`): see
    /// [`Comm::async_error`]. Reporting an error aborts nothing: that is the owner's decision.
    #[doc(alias = "ncclCommGetAsyncError")]
    pub fn async_error(&self) -> Result<()> {
        self.comm().async_error()
    }

    /// Waits until the work enqueued through this value has finished, polling NCCL's error state
    /// ([`Comm::wait`] without a timeout: nothing here aborts the communicator).
    pub fn wait(&self) -> Result<()> {
        self.comm().wait(None)
    }

    /// Calls on another stream of the communicator's device: see [`Comm::on`].
    pub fn on<'b>(&'b self, stream: &'b Arc<CudaStream>) -> OnStream<'b> {
        self.comm().on(stream)
    }
}

impl Drop for BorrowedComm<'_> {
    fn drop(&mut self) {
        // Give the handle back: `Comm`'s own drop then sees a detached communicator and does
        // nothing (no finalize, no destroy, no abort).
        if let Some(comm) = self.comm.take() {
            comm.into_raw();
        }
    }
}

/// A borrowed communicator is a target on its own stream, like [`Comm`].
impl<'b> Target<'b> for &'b BorrowedComm<'_> {
    #[inline]
    fn dispatch(self, body: impl FnOnce(Plan<'_, 'b>) -> Result<()>) -> Result<()> {
        self.comm().dispatch(body)
    }
}

impl<'a> Group<'a> {
    /// [`Group::with`] for a [`BorrowedComm`]: its calls are recorded in this group.
    pub fn with_borrowed(&self, comm: &'a BorrowedComm<'_>) -> Member<'_, 'a> {
        self.with(comm.comm())
    }
}

// SAFETY: the borrow keeps the borrowed communicator's `Comm` alive and in place (its calls record
// that very value, see `BorrowedComm::comm`), and the `BorrowedComm` itself borrows its owner, whose
// communicator `BorrowedComm::from_raw_borrowed`'s contract keeps alive for as long as that borrow.
// This crate never aborts it; it is reported closed if it ever is, so that no launch reaches it.
unsafe impl Keep for &BorrowedComm<'_> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        self.comm().report_kept(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn borrowed_communicators_are_send() {
        fn send<T: Send>() {}
        send::<BorrowedComm<'static>>();
    }
}
