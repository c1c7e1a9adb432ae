//! The last-use tracker for device memory that has no cudarc events.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// The fast path: the raw handle of the last stream, tagged (`handle | 1`, see [`tag`]), when
    /// that stream belongs to the home context; 0 otherwise. Written under the lock; while it
    /// names a stream, `last` holds that stream's `Arc`, so no other stream can have its handle.
    fast: AtomicUsize,
    /// Bumped before and after every change of `fast` (odd while changing): a reader that sees
    /// the same even value before and after its comparison knows the stream it matched was held
    /// alive throughout (a seqlock).
    version: AtomicUsize,
    /// The context of the stream the tracker was created on.
    home: Arc<cudarc::driver::CudaContext>,
    event: CudaEvent,
}

/// A stream's handle as [`StreamTracker::fast`] stores it: never 0 (the legacy default stream's
/// handle is 0), and stream handles are even, so tagging keeps them distinct.
fn tag(stream: &CudaStream) -> usize {
    stream.cu_stream() as usize | 1
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
        Ok(StreamTracker {
            last: Mutex::new(Last::Stream(home.clone())),
            fast: AtomicUsize::new(tag(home)),
            version: AtomicUsize::new(0),
            home: home.context().clone(),
            event: home.context().new_event(None)?,
        })
    }

    /// True when `stream` is certainly the stream of the last use: no lock, no driver call.
    /// (Concurrent uses through `&self` are reads, which may overlap on two streams anyway.)
    #[inline]
    fn same_as_last(&self, stream: &CudaStream) -> bool {
        let before = self.version.load(Ordering::SeqCst);
        let hit = self.fast.load(Ordering::SeqCst) == tag(stream) && Arc::ptr_eq(stream.context(), &self.home);
        hit && before % 2 == 0 && self.version.load(Ordering::SeqCst) == before
    }

    /// Sets the last use, keeping the fast path in step (call with the lock held).
    fn set_last(&self, last: &mut Last, to: Last) {
        let fast = match &to {
            Last::Stream(s) if Arc::ptr_eq(s.context(), &self.home) => tag(s),
            _ => 0,
        };
        self.version.fetch_add(1, Ordering::SeqCst);
        self.fast.store(fast, Ordering::SeqCst);
        // The previous stream may be destroyed from here on; readers that matched it see the
        // version change and take the slow path.
        *last = to;
        self.version.fetch_add(1, Ordering::SeqCst);
    }

    fn lock(&self) -> MutexGuard<'_, Last> {
        // The state is always consistent between statements, so a poisoned lock is still usable.
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Orders a use on `stream` after every earlier use. Call it before enqueuing the work; the
    /// tracker then remembers `stream` as the last user. `capturing` is whether `stream` is being
    /// captured, when the caller already knows it (else it is asked only if the stream changed).
    pub fn use_on(&self, stream: &Arc<CudaStream>, capturing: Option<bool>) -> Result<(), OrderError> {
        if self.same_as_last(stream) {
            return Ok(());
        }
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
            self.set_last(&mut last, Last::Event);
        } else {
            stream.wait(&self.event)?;
            self.set_last(&mut last, Last::Stream(stream.clone()));
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
        if self.same_as_last(stream) {
            return SyncOnDrop::Record(None);
        }
        let in_call = access::with_current(stream, |arc, capturing| self.use_on(arc, Some(capturing)));
        if let Some(ordered) = in_call {
            stream.context().record_err(ordered.map_err(to_driver));
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
        self.set_last(&mut last, Last::Event);
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
