//! Taking buffer pointers for one call on one stream, safely inside a graph capture too.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaContext, CudaStream, DevicePtr, DevicePtrMut, DriverError, SyncOnDrop};

use crate::capture::{is_capturing, relaxed};

/// The call being prepared on this thread, so that a tracked buffer reached through cudarc's
/// `DevicePtr` (which only sees `&CudaStream`) can still remember the call's `Arc<CudaStream>`.
/// It points at the `Arc` the [`Access`] borrows, which outlives the call: set by `Access::take`
/// around one `device_ptr` call, and put back before it returns.
#[derive(Clone, Copy)]
struct Call {
    stream: *const Arc<CudaStream>,
    capturing: bool,
    probe: Option<sys::CUstream>,
}

thread_local! {
    static CURRENT: Cell<Option<Call>> = const { Cell::new(None) };
}

/// Runs `f` with the stream of the call in progress on this thread whose stream (or capture
/// probe) is `stream`, and whether it is being captured; `None` when there is no such call.
pub(crate) fn with_current<R>(stream: &CudaStream, f: impl FnOnce(&Arc<CudaStream>, bool) -> R) -> Option<R> {
    let call = CURRENT.with(Cell::get)?;
    // SAFETY: `call.stream` points at the `Arc` borrowed by the `Access` whose `take` set it; the
    // value is reset before `take` returns, so the borrow is still alive while it is set.
    let arc = unsafe { &*call.stream };
    let ours = arc.cu_stream() == stream.cu_stream() || call.probe == Some(stream.cu_stream());
    ours.then(|| f(arc, call.capturing))
}

/// Takes the device pointers of the buffers of one call (a collective, a put) on one stream.
///
/// Outside a capture, [`Access::read`] and [`Access::write`] are cudarc's
/// `device_ptr`/`device_ptr_mut`: the stream waits for earlier uses on other streams, and the
/// returned guards record this use when dropped — drop them only after the work is enqueued.
/// Inside a capture, cudarc's waits would invalidate it, so ordinary cudarc buffers hand out their
/// pointer without waiting (through a private, idle helper stream) and record nothing; buffers with
/// a [`StreamTracker`](crate::StreamTracker) wait for earlier work on the host instead. Whether the
/// stream is capturing is asked at most once per `Access`, and only when a buffer needs to know.
pub struct Access<'s> {
    stream: &'s Arc<CudaStream>,
    capturing: Cell<Option<bool>>,
    probe: Cell<Option<&'static CudaStream>>,
}

impl<'s> Access<'s> {
    /// An access for a call on `stream`.
    pub fn new(stream: &'s Arc<CudaStream>) -> Self {
        Access { stream, capturing: Cell::new(None), probe: Cell::new(None) }
    }

    /// The call's stream.
    pub fn stream(&self) -> &'s Arc<CudaStream> {
        self.stream
    }

    /// Whether the stream is being captured (asked once, then remembered).
    pub fn capturing(&self) -> Result<bool, DriverError> {
        if let Some(c) = self.capturing.get() {
            return Ok(c);
        }
        let c = is_capturing(self.stream)?;
        self.capturing.set(Some(c));
        Ok(c)
    }

    /// The helper stream for taking pointers during a capture (looked up once per `Access`).
    fn probe(&self) -> Result<&'static CudaStream, DriverError> {
        if let Some(p) = self.probe.get() {
            return Ok(p);
        }
        let p = probe(self.stream.context())?;
        self.probe.set(Some(p));
        Ok(p)
    }

    /// cudarc only waits and records while it manages synchronisation; otherwise its buffers can
    /// be used directly and nothing needs to know about captures.
    fn needs_capture_check(&self) -> bool {
        self.stream.context().is_managing_stream_synchronization()
    }

    /// The pointer of `buf` for reading on the call's stream, and the guard to drop after enqueue.
    ///
    /// The guard borrows the buffer and the stream, not the `Access`, so guards of several calls
    /// can be kept together until their work is enqueued (a group).
    pub fn read<'a, T>(
        &self,
        buf: &'a (impl DevicePtr<T> + ?Sized),
    ) -> Result<(sys::CUdeviceptr, SyncOnDrop<'a>), DriverError>
    where
        's: 'a,
    {
        self.take(|stream| buf.device_ptr(stream))
    }

    /// The pointer of `buf` for writing on the call's stream, and the guard to drop after enqueue.
    pub fn write<'a, T>(
        &self,
        buf: &'a mut (impl DevicePtrMut<T> + ?Sized),
    ) -> Result<(sys::CUdeviceptr, SyncOnDrop<'a>), DriverError>
    where
        's: 'a,
    {
        self.take(|stream| buf.device_ptr_mut(stream))
    }

    fn take<'a>(
        &self,
        get: impl FnOnce(&'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>),
    ) -> Result<(sys::CUdeviceptr, SyncOnDrop<'a>), DriverError>
    where
        's: 'a,
    {
        let capturing = self.needs_capture_check() && self.capturing()?;
        let probe = if capturing { Some(self.probe()?) } else { None };
        let call = Call { stream: self.stream, capturing, probe: probe.map(|p| p.cu_stream()) };
        let _restore = Restore(CURRENT.with(|c| c.replace(Some(call))));
        let taken = match probe {
            // The helper stream is idle and never captured: cudarc's wait lands there, harmlessly,
            // and the guard is dropped unrecorded (captured work has not run yet).
            Some(probe) => {
                let (ptr, guard) = get(probe);
                std::mem::forget(guard);
                (ptr, SyncOnDrop::Record(None))
            }
            None => get(self.stream),
        };
        Ok(taken)
    }
}

/// Puts back the call that was in progress before (none, unless calls nest), on every path.
struct Restore(Option<Call>);

impl Drop for Restore {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

/// One idle, never-captured helper stream per context, for taking pointers during captures. It
/// lives as long as the process (a handful of bytes per GPU). The last one this thread used is
/// remembered, so that captured calls skip the shared map.
pub(crate) fn probe(ctx: &Arc<CudaContext>) -> Result<&'static CudaStream, DriverError> {
    thread_local! {
        static LAST: Cell<Option<(usize, &'static CudaStream)>> = const { Cell::new(None) };
    }
    static PROBES: Mutex<Option<HashMap<usize, &'static CudaStream>>> = Mutex::new(None);
    let key = ctx.cu_ctx() as usize;
    if let Some((k, p)) = LAST.with(Cell::get) {
        if k == key {
            return Ok(p);
        }
    }
    let mut probes = PROBES.lock().unwrap_or_else(|e| e.into_inner());
    let map = probes.get_or_insert_with(HashMap::new);
    if let Some(&p) = map.get(&key) {
        LAST.with(|l| l.set(Some((key, p))));
        return Ok(p);
    }
    let stream = relaxed(|| {
        ctx.bind_to_thread()?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)?;
        // SAFETY: `raw` is a stream of this context that nothing else owns; it is never destroyed
        // (leaked below), so the wrapper can never outlive it.
        Ok(unsafe { ctx.wrap_borrowed_stream(raw) })
    })?;
    let leaked: &'static Arc<CudaStream> = Box::leak(Box::new(stream));
    map.insert(key, leaked);
    LAST.with(|l| l.set(Some((key, leaked))));
    Ok(leaked)
}
