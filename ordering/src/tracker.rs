//! The last-use tracker for device memory that has no cudarc events.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{sys, CudaEvent, CudaStream, DriverError, SyncOnDrop};

use crate::access;
use crate::capture::{is_capturing, relaxed};

/// Why a use could not be ordered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderError {
    /// A CUDA call (event record, stream wait, synchronisation) failed.
    Cuda(DriverError),
    /// The buffer's last use is part of a capture that is still open on another stream; an eager
    /// use now could not be ordered after the work queued before that capture began.
    CaptureOpen,
}

impl fmt::Display for OrderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OrderError::Cuda(e) => write!(f, "ordering the buffer's streams failed: {e}"),
            OrderError::CaptureOpen => write!(
                f,
                "the buffer was last used on a stream that is still being captured into a graph; \
                 end that capture before using the buffer on another stream"
            ),
        }
    }
}

impl std::error::Error for OrderError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OrderError::Cuda(e) => Some(e),
            OrderError::CaptureOpen => None,
        }
    }
}

impl From<DriverError> for OrderError {
    fn from(e: DriverError) -> Self {
        OrderError::Cuda(e)
    }
}

/// Where the last use of the buffer is.
enum Last {
    /// On this stream, which the tracker keeps alive (so its handle cannot be reused by a new
    /// stream while it is remembered).
    Stream(Arc<CudaStream>),
    /// Before the tracker's event (recorded after the last use, or already complete).
    Event,
}

/// Orders the uses of one device allocation across streams, for memory that cudarc's events do
/// not cover (`ncclMemAlloc`, the NVSHMEM symmetric heap).
///
/// It remembers the stream of the last use. A use on the same stream costs a lock and a pointer
/// comparison; a use on another stream records an event on the old stream and makes the new one
/// wait for it (every use is treated as a write: two streams never use the buffer at once). Uses
/// on a stream that is being captured into a graph never wait on the device: earlier work on other
/// streams is waited for on the host instead, and the capture leaves the tracker's state alone.
pub struct StreamTracker {
    last: Mutex<Last>,
    event: CudaEvent,
}

impl fmt::Debug for StreamTracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let last = match &*self.lock() {
            Last::Stream(s) => format!("stream {:p}", s.cu_stream()),
            Last::Event => "event".to_string(),
        };
        f.debug_struct("StreamTracker").field("last", &last).finish()
    }
}

fn same(a: &CudaStream, b: &CudaStream) -> bool {
    a.cu_stream() == b.cu_stream() && Arc::ptr_eq(a.context(), b.context())
}

impl StreamTracker {
    /// A tracker for memory whose first use (its allocation, or its first write) is on `home`.
    pub fn new(home: &Arc<CudaStream>) -> Result<Self, DriverError> {
        Ok(StreamTracker { last: Mutex::new(Last::Stream(home.clone())), event: home.context().new_event(None)? })
    }

    fn lock(&self) -> MutexGuard<'_, Last> {
        // The state is always consistent between statements, so a poisoned lock is still usable.
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Orders a use on `stream` after every earlier use. Call it before enqueuing the work; the
    /// tracker then remembers `stream` as the last user. `capturing` is whether `stream` is being
    /// captured, when the caller already knows it (else it is asked only if the stream changed).
    pub fn use_on(&self, stream: &Arc<CudaStream>, capturing: Option<bool>) -> Result<(), OrderError> {
        let mut last = self.lock();
        if let Last::Stream(s) = &*last {
            if same(s, stream) {
                return Ok(());
            }
        }
        let capturing = match capturing {
            Some(c) => c,
            None => is_capturing(stream)?,
        };
        self.mark_end(&last)?;
        if capturing {
            relaxed(|| self.event.synchronize())?;
            *last = Last::Event;
        } else {
            stream.wait(&self.event)?;
            *last = Last::Stream(stream.clone());
        }
        Ok(())
    }

    /// Makes the event mark the end of the last use (records it on the last stream).
    fn mark_end(&self, last: &Last) -> Result<(), OrderError> {
        if let Last::Stream(s) = last {
            if is_capturing(s)? {
                return Err(OrderError::CaptureOpen);
            }
            self.event.record(s)?;
        }
        Ok(())
    }

    /// Blocks the host until the last use has finished, e.g. before the memory is freed.
    pub fn synchronize(&self) -> Result<(), OrderError> {
        let last = self.lock();
        self.mark_end(&last)?;
        Ok(self.event.synchronize()?)
    }

    /// The stream of the last use, when the tracker knows it (`None` after a use through a plain
    /// `&CudaStream`, whose ordering is then carried by an event).
    pub fn last_stream(&self) -> Option<Arc<CudaStream>> {
        match &*self.lock() {
            Last::Stream(s) => Some(s.clone()),
            Last::Event => None,
        }
    }

    /// The guard for a use through cudarc's [`DevicePtr`](cudarc::driver::DevicePtr) protocol on
    /// `stream`. Inside an [`Access`](crate::Access) it is the same as [`Self::use_on`] on the
    /// access's stream; from other cudarc code (copies, kernel launches) the tracker cannot keep the
    /// stream alive, so the use is ordered by the tracker's event, recorded after the use by the
    /// returned guard. CUDA errors are recorded in the context, as cudarc does in its own guards.
    pub fn device_ptr_guard<'a>(&'a self, stream: &'a CudaStream) -> SyncOnDrop<'a> {
        if let Some(call) = access::current(stream) {
            stream.context().record_err(self.use_on(&call.stream, Some(call.capturing)).map_err(to_driver));
            return SyncOnDrop::Record(None);
        }
        let mut last = self.lock();
        if let Last::Stream(s) = &*last {
            if same(s, stream) {
                return SyncOnDrop::Record(None);
            }
        }
        let ordered = (|| {
            let capturing = is_capturing(stream)?;
            self.mark_end(&last)?;
            if capturing {
                relaxed(|| self.event.synchronize())?;
                return Ok(false);
            }
            stream.wait(&self.event)?;
            Ok::<_, OrderError>(true)
        })();
        *last = Last::Event;
        match ordered {
            Ok(true) if stream.context().is_managing_stream_synchronization() => {
                SyncOnDrop::Record(Some((&self.event, stream)))
            }
            // cudarc records events only while it manages synchronisation: without that, the
            // stream is synchronised after the use instead, so the event stays truthful.
            Ok(true) => SyncOnDrop::Sync(Some(stream)),
            Ok(false) => SyncOnDrop::Record(None),
            Err(e) => {
                stream.context().record_err(Err::<(), _>(to_driver(e)));
                SyncOnDrop::Sync(Some(stream))
            }
        }
    }
}

/// cudarc's contexts store only driver error codes.
fn to_driver(e: OrderError) -> DriverError {
    match e {
        OrderError::Cuda(e) => e,
        OrderError::CaptureOpen => DriverError(sys::cudaError_enum::CUDA_ERROR_STREAM_CAPTURE_ISOLATION),
    }
}

/// Implements cudarc's [`DeviceSlice`](cudarc::driver::DeviceSlice),
/// [`DevicePtr`](cudarc::driver::DevicePtr) and [`DevicePtrMut`](cudarc::driver::DevicePtrMut) for a
/// buffer type that holds a [`StreamTracker`], so cudarc copies, cudarc kernels and the
/// communication calls all order themselves against it.
///
/// `tracked_device_ptr!([T] MemBuffer<T>, |b| (b.ptr, b.len, &b.tracker, &b.home))` where the
/// closure returns the device address, the length in elements, the tracker and the buffer's home
/// stream (reported by `DeviceSlice::stream`). With `read` in front
/// (`tracked_device_ptr!(read ['a, T] View<'a, T>, |v| …)`) only `DeviceSlice` and `DevicePtr` are
/// implemented: for shared views, which must not be written through.
#[macro_export]
macro_rules! tracked_device_ptr {
    (read [$($gen:tt)*] $ty:ty, |$b:ident| $parts:expr) => {
        $crate::tracked_device_ptr!(@slice [$($gen)*] $ty, |$b| $parts);
        $crate::tracked_device_ptr!(@read [$($gen)*] $ty, |$b| $parts);
    };
    ([$($gen:tt)*] $ty:ty, |$b:ident| $parts:expr) => {
        $crate::tracked_device_ptr!(@slice [$($gen)*] $ty, |$b| $parts);
        $crate::tracked_device_ptr!(@read [$($gen)*] $ty, |$b| $parts);
        impl<$($gen)*> ::cudarc::driver::DevicePtrMut<T> for $ty {
            fn device_ptr_mut<'__a>(
                &'__a mut self,
                stream: &'__a ::cudarc::driver::CudaStream,
            ) -> (::cudarc::driver::sys::CUdeviceptr, ::cudarc::driver::SyncOnDrop<'__a>) {
                let $b = &*self;
                let parts = $parts;
                (parts.0, parts.2.device_ptr_guard(stream))
            }
        }
    };
    (@slice [$($gen:tt)*] $ty:ty, |$b:ident| $parts:expr) => {
        impl<$($gen)*> ::cudarc::driver::DeviceSlice<T> for $ty {
            fn len(&self) -> usize {
                let $b = self;
                $parts.1
            }
            fn stream(&self) -> &::std::sync::Arc<::cudarc::driver::CudaStream> {
                let $b = self;
                $parts.3
            }
        }
    };
    (@read [$($gen:tt)*] $ty:ty, |$b:ident| $parts:expr) => {
        impl<$($gen)*> ::cudarc::driver::DevicePtr<T> for $ty {
            fn device_ptr<'__a>(
                &'__a self,
                stream: &'__a ::cudarc::driver::CudaStream,
            ) -> (::cudarc::driver::sys::CUdeviceptr, ::cudarc::driver::SyncOnDrop<'__a>) {
                let $b = self;
                let parts = $parts;
                (parts.0, parts.2.device_ptr_guard(stream))
            }
        }
    };
}
