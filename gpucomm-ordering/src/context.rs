//! Making a CUDA context current without cudarc's recorded-error check, and telling whether an
//! argument lives in the context a call runs in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
///
/// Like `bind_to_thread`, it asks which context is current first (`cuCtxGetCurrent`, a read of
/// the thread's state) and sets only another one (`cuCtxSetCurrent`, which the driver validates):
/// every NVSHMEM call makes its PE's context current, and the thread almost always has it already.
/// Setting the current context again would change nothing.
pub fn make_current(ctx: &CudaContext) -> Result<(), DriverError> {
    if result::ctx::get_current()? == Some(ctx.cu_ctx()) {
        return Ok(());
    }
    // SAFETY: `cu_ctx` is the context `ctx` owns, alive as long as `ctx` (borrowed here); making a
    // live context current has no other precondition.
    unsafe { result::ctx::set_current(ctx.cu_ctx()) }
}

/// A handle on `ctx`'s context in whose recorded-error state only failures that leave the context
/// unusable anyway are recorded (a failed synchronisation or event destruction): the trackers make
/// their events from it, and synchronise uses on the per-thread default stream through it. cudarc's
/// guards record an event through the event's handle of the context, which first takes and returns
/// any error recorded there (by any use of that handle, on any thread) and then skips the record;
/// an event of the user's handle could thus stand for a point before the work its guard was handed
/// for, and a later write or the free would not wait for that work. For a primary context it is a
/// second handle, made once per context and kept for the life of the process (as the helper
/// streams keep theirs). Another context gets its own handle back: cudarc makes a second handle of
/// one only as a handle that owns it, and hands the events' handle out (`CudaEvent::context`), so
/// such a handle could outlive the context it names.
pub(crate) fn unchecked(ctx: &Arc<CudaContext>) -> Result<Arc<CudaContext>, DriverError> {
    static SECOND: Mutex<Option<HashMap<usize, Arc<CudaContext>>>> = Mutex::new(None);
    if !ctx.is_primary() {
        return Ok(ctx.clone());
    }
    let key = ctx.cu_ctx() as usize;
    let mut all = SECOND.lock().unwrap_or_else(|e| e.into_inner());
    let map = all.get_or_insert_with(HashMap::new);
    if let Some(second) = map.get(&key) {
        return Ok(second.clone());
    }
    // Retains the device's primary context again: the same context while `ctx` holds it.
    let second = CudaContext::new(ctx.ordinal())?;
    if second.cu_ctx() != ctx.cu_ctx() {
        return Ok(ctx.clone());
    }
    map.insert(key, second.clone());
    Ok(second)
}
