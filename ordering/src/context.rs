//! Making a CUDA context current without cudarc's recorded-error check, and telling whether an
//! argument lives in the context a call runs in.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::{result, CudaContext, DriverError};

/// Where the CUDA context of a call's argument (a buffer's home stream, a stream to enqueue on)
/// stands against the context the call runs in ([`placement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The same context (one handle, whichever `Arc` holds it).
    Same,
    /// A context of another device: `got` is its ordinal.
    OtherDevice {
        /// The argument's device.
        got: usize,
    },
    /// Another context of the same device, such as one made with cudarc's
    /// `CudaContext::new_non_primary`: each context has its own address space, so a kernel of
    /// the call's context cannot use the argument's memory.
    OtherContext,
}

/// Compares `arg`'s context with `own`, the context a call runs in (a communicator's, a PE's):
/// the check of a buffer's or stream's device that every call makes. No driver call.
#[inline]
pub fn placement(own: &Arc<CudaContext>, arg: &Arc<CudaContext>) -> Placement {
    if Arc::ptr_eq(own, arg) || own.cu_ctx() == arg.cu_ctx() {
        Placement::Same
    } else if own.ordinal() != arg.ordinal() {
        Placement::OtherDevice { got: arg.ordinal() }
    } else {
        Placement::OtherContext
    }
}

/// Makes `ctx` current on this thread, through the driver. Not cudarc's `bind_to_thread`, which
/// first fails with (and takes) an unrelated error that any use of the context, on any thread,
/// recorded in it: for the calls that must not fail for that — an abort, a collective step the
/// other ranks or PEs take too, a completion that must not be skipped, the end of a capture — and
/// that leave the error recorded for cudarc's next checked call.
pub fn make_current(ctx: &CudaContext) -> Result<(), DriverError> {
    // SAFETY: `cu_ctx` is the context `ctx` owns, alive as long as `ctx` (borrowed here); making a
    // live context current has no other precondition.
    unsafe { result::ctx::set_current(ctx.cu_ctx()) }
}

/// A handle on `ctx`'s context whose recorded-error state nothing but cudarc's own checks of it
/// touches: the trackers make their events from it. cudarc's guards record an event through the
/// event's handle of the context, which first takes and returns any error recorded there (by any
/// use of that handle, on any thread) and then skips the record; an event of the user's handle
/// could thus stand for a point before the work its guard was handed for, and a later write or the
/// free would not wait for that work. It is a second handle, made once per context: for a
/// primary context, one more retain of it, kept for the life of the process (as the helper
/// streams keep theirs); for another context (cudarc's `new_non_primary`), a handle that is never
/// dropped (dropping it would destroy the context, which `ctx`'s owner destroys), remade if a later
/// context gets the same address. One handle, a few words, stays behind per non-primary context.
pub(crate) fn unchecked(ctx: &Arc<CudaContext>) -> Result<Arc<CudaContext>, DriverError> {
    static SECOND: Mutex<Option<HashMap<usize, Second>>> = Mutex::new(None);
    let key = ctx.cu_ctx() as usize;
    let mut all = SECOND.lock().unwrap_or_else(|e| e.into_inner());
    let map = all.get_or_insert_with(HashMap::new);
    if let Some(second) = map.get(&key).filter(|s| s.made_for_live_context()) {
        return Ok(Arc::clone(&second.handle));
    }
    let second = if ctx.is_primary() {
        // Retains the device's primary context again: the same context while `ctx` holds it.
        let second = CudaContext::new(ctx.ordinal())?;
        if second.cu_ctx() != ctx.cu_ctx() {
            return Ok(ctx.clone());
        }
        Second { handle: ManuallyDrop::new(second), of: None }
    } else {
        // SAFETY: `ctx` holds the context `cu_ctx` of device `cu_device`, alive while `ctx` is
        // (borrowed here). The handle made here is never dropped (`Second::handle`), so it never
        // destroys or releases the context, which stays its owner's to destroy; it is used only
        // while that owner lives: trackers use it for their events, and each tracker holds the
        // owner's handle (its home stream's context) as long as it holds this one, and a later
        // context at the same address gets a handle of its own (`made_for_live_context`).
        let second = unsafe { CudaContext::from_raw_context(ctx.ordinal(), ctx.cu_device(), ctx.cu_ctx()) }?;
        Second { handle: ManuallyDrop::new(second), of: Some(Arc::downgrade(ctx)) }
    };
    let handle = Arc::clone(&second.handle);
    // A stale entry replaced here is not dropped: its handle is a `ManuallyDrop`.
    map.insert(key, second);
    Ok(handle)
}

/// A second handle of a context ([`unchecked`]).
struct Second {
    /// Never dropped: for a primary context, the retain that keeps it for the process's life; for
    /// another, dropping it would destroy a context this crate does not own.
    handle: ManuallyDrop<Arc<CudaContext>>,
    /// The handle of the non-primary context it was made for (`None` for a primary context, whose
    /// address the retain above keeps for ever): while that lives, the context at this address is
    /// the one the second handle names.
    of: Option<Weak<CudaContext>>,
}

impl Second {
    /// True while the context this handle was made for lives.
    fn made_for_live_context(&self) -> bool {
        self.of.as_ref().is_none_or(|of| of.strong_count() > 0)
    }
}
