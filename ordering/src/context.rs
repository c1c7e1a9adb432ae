//! Making a CUDA context current without cudarc's recorded-error check.

use cudarc::driver::{result, CudaContext, DriverError};

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
