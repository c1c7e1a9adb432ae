//! Asking whether a stream is being captured, and running host-side waits during a capture.

use cudarc::driver::{result, sys, CudaStream, DriverError};

/// True while `stream` is being captured into a CUDA graph (`cuStreamIsCapturing`).
pub fn is_capturing(stream: &CudaStream) -> Result<bool, DriverError> {
    if stream.cu_stream().is_null() {
        // The legacy default stream is resolved through the current context.
        stream.context().bind_to_thread()?;
    }
    // SAFETY: the stream is borrowed, so it and its context are alive.
    let status = unsafe { result::stream::is_capturing(stream.cu_stream()) }?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Runs `f` with this thread's capture interaction mode set to relaxed
/// (`cuThreadExchangeStreamCaptureMode`), then restores the previous mode. Host-side waits for
/// streams that are *not* being captured are harmless to a capture, but the default (global) mode
/// would refuse them while any capture is open.
pub fn relaxed<R>(f: impl FnOnce() -> Result<R, DriverError>) -> Result<R, DriverError> {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: the call swaps a plain enum through a valid pointer.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result()?;
    let out = f();
    // SAFETY: as above; this restores the mode read by the first call.
    let restored = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result();
    let out = out?;
    restored.map(|()| out)
}
