//! Device memory from NCCL's own allocator (`ncclMemAlloc`): the buffer type this crate
//! recommends.

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::sync::Arc;

use cudarc::driver::{sys::CUdeviceptr, CudaStream, DeviceRepr, ValidAsZeroBits};
use gpucomm_ordering::{Keep, Resource, StreamTracker, Tracked, Visitor};

use crate::error::{Error, Result};
use crate::ffi::call;

/// `len` elements of `T` on one GPU, allocated by NCCL (`ncclMemAlloc`, NCCL ≥ 2.19.1). The
/// buffer type this crate recommends for communication:
///
/// * **Fast and NCCL-friendly memory.** `ncclMemAlloc` returns CUDA VMM (cuMem) memory with the
///   granularity and handle types NCCL needs for zero-copy transfers, buffer registration
///   ([`Comm::register`](crate::Comm::register)) and symmetric windows
///   ([`Comm::register_window`](crate::Comm::register_window), which accept only such memory).
///   cudarc's [`CudaSlice`](cudarc::driver::CudaSlice) comes from a stream-ordered pool and
///   qualifies for none of the windows.
/// * **Ordering at no cost on one stream.** Instead of cudarc's two events per buffer, which every
///   use waits for and records (three stream waits and two event records per all-reduce, about
///   1–1.6 µs of host time), a `MemBuffer` remembers the streams of its outstanding uses
///   ([`StreamTracker`]): a call on the stream that is its only user costs two atomic loads, and
///   only a change of stream records an event and waits for it. Inside [`crate::capture`] its
///   uses are recorded for the graph instead, and each launch of the graph is ordered like a call.
/// * **A normal cudarc buffer otherwise.** It implements cudarc's [`DeviceSlice`](cudarc::driver::DeviceSlice),
///   [`DevicePtr`](cudarc::driver::DevicePtr) and [`DevicePtrMut`](cudarc::driver::DevicePtrMut),
///   so cudarc copies (`memcpy_htod`, `clone_dtoh`, …) and kernel launches accept it and order
///   themselves against it, and [`DeviceMemory`](crate::DeviceMemory), so every call of this crate
///   and of `nvshmem` accepts it. Reads on several streams at once (two threads sharing a
///   `&MemBuffer`) are all waited for by the next write and by the free.
///
/// Freeing it ([`MemBuffer::free`] or drop) first waits for its outstanding uses to finish, on
/// their streams only, then calls `ncclMemFree`.
#[doc(alias = "ncclMemAlloc")]
#[cfg_attr(docsrs, doc(cfg(nccl_2_19)))]
// What a call on one stream reads (address, length, stream, and the tracker's first fields) lies
// in the first 56 bytes, in this order, and the buffer starts a cache line: one line per buffer.
#[repr(C, align(64))]
pub struct MemBuffer<T> {
    ptr: CUdeviceptr,
    len: usize,
    home: Arc<CudaStream>,
    tracker: StreamTracker,
    /// Set by the consuming teardown once the C resource is gone: `Drop` then has nothing to do.
    released: bool,
    /// Names this allocation in the graphs that keep it ([`MemBuffer::KIND`]).
    serial: usize,
    _elements: PhantomData<T>,
}

gpucomm_ordering::tracked_device_ptr!([T] MemBuffer<T>, |b| {
    // SAFETY: `ptr` is an ncclMemAlloc allocation of `len` elements on `home`'s device, owned by
    // the buffer and freed only after `tracker.synchronize()` (`release`); every use goes through
    // `tracker`.
    unsafe { Tracked::new(b.ptr, b.len, &b.tracker, &b.home) }
}, registration |b| b.allocation());

/// A read-only view of part of a [`MemBuffer`] ([`MemBuffer::slice`]): a cudarc
/// [`DevicePtr`](cudarc::driver::DevicePtr) ordered with the buffer's own stream tracking.
#[derive(Debug)]
pub struct MemView<'a, T> {
    buf: &'a MemBuffer<T>,
    ptr: CUdeviceptr,
    len: usize,
}

gpucomm_ordering::tracked_device_ptr!(read ['a, T] MemView<'a, T>, |v| {
    // SAFETY: `ptr..ptr + len` lies inside the borrowed buffer (checked by `MemBuffer::sub`), which
    // the view keeps alive; uses are ordered by the buffer's tracker.
    unsafe { Tracked::new(v.ptr, v.len, &v.buf.tracker, &v.buf.home) }
});

/// A writable view of part of a [`MemBuffer`] ([`MemBuffer::slice_mut`]): a cudarc
/// [`DevicePtrMut`](cudarc::driver::DevicePtrMut) ordered with the buffer's own stream tracking.
#[derive(Debug)]
pub struct MemViewMut<'a, T> {
    buf: &'a mut MemBuffer<T>,
    ptr: CUdeviceptr,
    len: usize,
}

gpucomm_ordering::tracked_device_ptr!(['a, T] MemViewMut<'a, T>, |v| {
    // SAFETY: as for `MemView`; the view borrows the buffer exclusively.
    unsafe { Tracked::new(v.ptr, v.len, &v.buf.tracker, &v.buf.home) }
});

impl<T> fmt::Debug for MemBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("device", &self.home.context().ordinal())
            .field("tracker", &self.tracker)
            .finish()
    }
}

impl MemBuffer<()> {
    /// What a graph that keeps a `MemBuffer` names its allocation ([`Resource::numbered`]): NCCL
    /// registers the `ncclMemAlloc` memory of the calls it captures (`NCCL_GRAPH_REGISTER`, on
    /// by default), and the other ranks' captured kernels then reach this memory through that
    /// registration, not by its address. A launch after the buffer was swapped out (through
    /// `Graph::kept_mut`) for another allocation, even one made at the freed address, is refused
    /// ([`OrderError::ResourceNotKept`](gpucomm_ordering::OrderError::ResourceNotKept)): the
    /// peers would still write into the freed allocation, which their imports keep alive.
    pub const KIND: &'static str = "ncclMemAlloc buffer";
}

impl<T> MemBuffer<T> {
    /// This allocation as the graphs that keep the buffer name it ([`MemBuffer::KIND`]).
    fn allocation(&self) -> Resource {
        Resource::numbered(MemBuffer::<()>::KIND, self.serial)
    }
}

impl<T: DeviceRepr> MemBuffer<T> {
    /// Allocates `len` elements on `stream`'s device with `ncclMemAlloc`, without initialising
    /// them. `stream` becomes the buffer's home ([`DeviceSlice::stream`](cudarc::driver::DeviceSlice::stream))
    /// and its first "last use". Zero elements, or an element type of size zero, are
    /// [`Error::ZeroSize`].
    ///
    /// # Safety
    ///
    /// The contents are whatever the memory held: the caller must write every element before it is
    /// read as a `T` (on the host or by a kernel that relies on valid values).
    #[doc(alias = "ncclMemAlloc")]
    pub unsafe fn uninit(stream: &Arc<CudaStream>, len: usize) -> Result<Self> {
        // A zero-sized `T` (a user's `DeviceRepr`) would make zero bytes too, which `ncclMemAlloc`
        // answers with a null pointer and success.
        if len == 0 || size_of::<T>() == 0 {
            return Err(Error::ZeroSize { call: "ncclMemAlloc" });
        }
        let bytes = len.checked_mul(size_of::<T>()).ok_or(Error::CountOverflow {
            what: "MemBuffer bytes",
            count: len,
            factor: size_of::<T>(),
        })?;
        // ncclMemAlloc allocates on the current device.
        stream.context().bind_to_thread()?;
        // The tracker comes first, so that a failure after the allocation has nothing to undo.
        let tracker = StreamTracker::new(stream)?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a live out-pointer; NCCL allocates `bytes` bytes on the current device,
        // which is `stream`'s (bound above).
        unsafe { call!(ncclMemAlloc(&mut ptr, bytes)) }?;
        Ok(MemBuffer {
            ptr: ptr as CUdeviceptr,
            len,
            tracker,
            home: stream.clone(),
            released: false,
            serial: Resource::next_serial(),
            _elements: PhantomData,
        })
    }

    /// `len` zeroed elements (allocated as [`MemBuffer::uninit`], then cleared on `stream`).
    /// Refused on a stream that is being captured
    /// ([`OrderError::InitInCapture`](gpucomm_ordering::OrderError::InitInCapture)): the clearing
    /// would only be recorded into the graph.
    #[doc(alias = "ncclMemAlloc")]
    pub fn zeroed(stream: &Arc<CudaStream>, len: usize) -> Result<Self>
    where
        T: ValidAsZeroBits,
    {
        refuse_fill_in_capture(stream)?;
        // SAFETY: every byte is written (zero, a valid `T`) before anything can read it: the
        // buffer is not handed out before the memset is enqueued, and it is ordered on `stream`,
        // which is not being captured (checked above), so the memset runs.
        let mut buf = unsafe { Self::uninit(stream, len) }?;
        stream.memset_zeros(&mut buf)?;
        Ok(buf)
    }

    /// A copy of `host` (allocated as [`MemBuffer::uninit`], then copied on `stream`). Refused on
    /// a stream that is being captured, as [`MemBuffer::zeroed`] is.
    #[doc(alias = "ncclMemAlloc")]
    pub fn from_host(stream: &Arc<CudaStream>, host: &[T]) -> Result<Self> {
        refuse_fill_in_capture(stream)?;
        // SAFETY: every element is written by the copy before anything can read it (the copy is
        // enqueued before the buffer is handed out, and ordered on `stream`, which is not being
        // captured: checked above).
        let mut buf = unsafe { Self::uninit(stream, host.len()) }?;
        stream.memcpy_htod(host, &mut buf)?;
        Ok(buf)
    }
}

/// Refuses to fill a new buffer on a stream being captured (by anything): the fill would only be
/// recorded into the graph, and the buffer handed out unwritten.
fn refuse_fill_in_capture(stream: &CudaStream) -> Result<()> {
    if gpucomm_ordering::is_capturing(stream)? {
        return Err(gpucomm_ordering::OrderError::InitInCapture.into());
    }
    Ok(())
}

impl<T> MemBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty buffer (never: allocations of zero elements are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address, for code outside cudarc and this crate. Take it through cudarc's
    /// [`DevicePtr`](cudarc::driver::DevicePtr) instead wherever the use is enqueued on a stream
    /// (`buf.device_ptr(&stream)`, then drop the guard after the launch): that orders the use.
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The stream-ordering state of the buffer.
    pub fn tracker(&self) -> &StreamTracker {
        &self.tracker
    }

    /// Elements `range` of the buffer, read-only (like cudarc's `CudaSlice::slice`). The view
    /// shares the buffer's stream ordering. A range past the end (or reversed) is
    /// [`Error::OutOfBounds`]; an empty range is a view of zero elements, which the calls
    /// accept as no-ops.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<MemView<'_, T>> {
        let (ptr, len) = self.sub(range)?;
        Ok(MemView { buf: self, ptr, len })
    }

    /// The whole buffer as a writable view (like cudarc's `CudaSlice::as_view_mut`).
    pub fn as_view_mut(&mut self) -> MemViewMut<'_, T> {
        let (ptr, len) = (self.ptr, self.len);
        MemViewMut { buf: self, ptr, len }
    }

    /// Elements `range` of the buffer, writable (like cudarc's `CudaSlice::slice_mut`).
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<MemViewMut<'_, T>> {
        let (ptr, len) = self.sub(range)?;
        Ok(MemViewMut { buf: self, ptr, len })
    }

    /// The address and length of `range`, checked.
    fn sub(&self, range: impl RangeBounds<usize>) -> Result<(CUdeviceptr, usize)> {
        let (start, end) = gpucomm_ordering::range::resolve(range, self.len)
            .map_err(|(start, end)| Error::OutOfBounds { start, end, len: self.len })?;
        // In bounds of an allocation of `len` elements, so the offset fits.
        Ok((self.ptr + (start * size_of::<T>()) as CUdeviceptr, end - start))
    }

    /// Waits for the buffer's outstanding uses to finish (on their streams only), then frees it
    /// (`ncclMemFree`). On failure the buffer is handed back with the error, still allocated.
    #[doc(alias = "ncclMemFree")]
    // The buffer comes back on failure, as fallible teardown does throughout the crate.
    #[allow(clippy::result_large_err)]
    pub fn free(mut self) -> std::result::Result<(), (Self, Error)> {
        match self.release() {
            Ok(()) => {
                self.released = true;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }

    fn release(&self) -> Result<()> {
        self.tracker.synchronize()?;
        self.home.context().bind_to_thread()?;
        // SAFETY: `ptr` came from ncclMemAlloc and is freed once: after a successful `release`
        // from `free` the buffer is marked released, which `Drop` skips. Every outstanding use (graph
        // launches included: they are recorded in the tracker) has finished.
        unsafe { call!(ncclMemFree(self.ptr as *mut c_void)) }
    }
}

impl<T> Drop for MemBuffer<T> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Err(e) = self.release() {
            log::warn!("nccl: a MemBuffer could not be freed and is leaked: {e}");
        }
    }
}

// SAFETY: an owned buffer keeps its memory alive; it is reported writable, as it is.
unsafe impl<T> Keep for MemBuffer<T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        let allocation = self.allocation();
        v.write(self);
        v.resource(allocation, true);
    }
}

// SAFETY: the view borrows its buffer for its whole life, and cannot write it.
unsafe impl<T> Keep for MemView<'_, T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.read(self);
    }
}

// SAFETY: the view borrows its buffer exclusively for its whole life.
unsafe impl<T> Keep for MemViewMut<'_, T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.write(self);
    }
}
