//! Symmetric-heap buffers: collective allocation, explicit collective free, stream-ordered
//! puts and gets to other PEs.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice, SyncOnDrop};
use nvshmem_sys::{cudaStream_t, function};

use crate::error::{lib, Error, Result};
use crate::Runtime;

/// Names of the two transfer directions, as they appear in errors.
const PUT: &str = "put";
const GET: &str = "get";

/// A buffer of `len` elements of `T` at the same symmetric address on every PE
/// (`nvshmem_malloc`). Borrowing the [`Runtime`] ties it to NVSHMEM's lifetime.
///
/// # Collective allocation and free
///
/// [`Runtime::alloc`] and [`Symmetric::free`] are collective and blocking: every PE must call
/// them in the same order with the same sizes. Because the order of `Drop`s differs between PEs on
/// error paths, dropping a buffer does **not** free it: it stays allocated until NVSHMEM is
/// finalised (and a warning is printed). Free buffers explicitly with [`Symmetric::free`].
///
/// # Stream ordering
///
/// The buffer implements cudarc's [`DevicePtr`]/[`DevicePtrMut`], so cudarc copies and NCCL
/// collectives accept it, but it carries no stream events: order the streams that use it yourself
/// (use one stream, or synchronise). NVSHMEM's own allocation and free are not ordered with your
/// streams either, which is why [`Symmetric::free`] synchronises the device first.
pub struct Symmetric<'rt, T> {
    ptr: cudarc::driver::sys::CUdeviceptr,
    len: usize,
    rt: &'rt Runtime,
    freed: bool,
    _elem: PhantomData<T>,
}

impl Runtime {
    /// Allocates `len` elements on the symmetric heap of every PE (`nvshmem_malloc`). Collective:
    /// all PEs call it in the same order with the same `len`. The contents are uninitialised
    /// device memory, so `T` must be valid for any bit pattern ([`DeviceRepr`] types are plain
    /// numbers); write it before reading.
    #[doc(alias = "nvshmem_malloc")]
    pub fn alloc<T: DeviceRepr>(&self, len: usize) -> Result<Symmetric<'_, T>> {
        let bytes = len.checked_mul(size_of::<T>()).filter(|&b| b > 0).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "symmetric allocations need 1 or more bytes, got {len} × {}",
                size_of::<T>()
            ))
        })?;
        let f = function!(lib()?, nvshmem_malloc)?;
        self.context().bind_to_thread()?;
        // SAFETY: NVSHMEM is initialised (the runtime exists) and its context is current.
        let ptr = unsafe { f(bytes) };
        if ptr.is_null() {
            return Err(Error::OutOfMemory { bytes });
        }
        Ok(Symmetric { ptr: ptr as u64, len, rt: self, freed: false, _elem: PhantomData })
    }
}

impl<'rt, T> Symmetric<'rt, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer (never: allocations have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The local address of the buffer (the same symmetric offset on every PE).
    pub fn device_address(&self) -> cudarc::driver::sys::CUdeviceptr {
        self.ptr
    }

    /// An address through which this PE's kernels can load and store `pe`'s copy directly
    /// (`nvshmem_ptr`), or `None` when `pe` is not reachable by loads and stores (no P2P path).
    #[doc(alias = "nvshmem_ptr")]
    pub fn peer_address(&self, pe: usize) -> Result<Option<cudarc::driver::sys::CUdeviceptr>> {
        let pe = self.rt.check_pe("pe", pe)?;
        let f = function!(lib()?, nvshmem_ptr)?;
        // SAFETY: `self.ptr` is a live symmetric address and `pe` is in range.
        let p = unsafe { f(self.ptr as *const c_void, pe) };
        Ok((!p.is_null()).then_some(p as u64))
    }

    /// Frees the buffer on every PE (`nvshmem_free`). Collective and blocking: every PE frees its
    /// buffers in the same order. The device is synchronised first, because NVSHMEM's free does
    /// not wait for work still queued on your streams.
    #[doc(alias = "nvshmem_free")]
    pub fn free(mut self) -> Result<()> {
        let f = function!(lib()?, nvshmem_free)?;
        self.rt.context().synchronize()?;
        self.freed = true;
        // SAFETY: the pointer came from nvshmem_malloc, no queued work can use it (device synced),
        // and `self` is consumed so nothing refers to it afterwards.
        unsafe { f(self.ptr as *mut c_void) };
        Ok(())
    }

    /// Checks one transfer of `count` elements at `offset` with `pe` on `stream`, and returns the
    /// PE as C wants it, the symmetric address of element `offset`, and the byte count.
    fn transfer(
        &self,
        what: &'static str,
        offset: usize,
        count: usize,
        pe: usize,
        stream: &CudaStream,
    ) -> Result<(i32, u64, usize)> {
        match offset.checked_add(count) {
            Some(end) if end <= self.len => {}
            _ => return Err(Error::OutOfBounds { what, got: offset.saturating_add(count), available: self.len }),
        }
        let pe = self.rt.check_pe(if what == PUT { "destination pe" } else { "source pe" }, pe)?;
        self.rt.check_stream(stream)?;
        Ok((pe, self.ptr + (offset * size_of::<T>()) as u64, count * size_of::<T>()))
    }
}

impl<T: DeviceRepr> Symmetric<'_, T> {
    /// Copies `src` (local device memory) into `pe`'s copy of this buffer, starting at element
    /// `offset`, in stream order (`nvshmemx_putmem_on_stream`). The data is visible at `pe` after
    /// a barrier or quiet on the stream.
    #[doc(alias = "nvshmemx_putmem_on_stream")]
    pub fn put_on_stream(&self, offset: usize, src: &impl DevicePtr<T>, pe: usize, stream: &CudaStream) -> Result<()> {
        let (pe, dst, bytes) = self.transfer(PUT, offset, src.len(), pe, stream)?;
        let f = function!(lib()?, nvshmemx_putmem_on_stream)?;
        let (src_ptr, _guard) = src.device_ptr(stream);
        // SAFETY: the destination range [offset, offset + src.len()) lies inside this symmetric
        // buffer (checked) on every PE; the source holds `bytes` bytes on this device and stays
        // borrowed until the guard records after the enqueue; `pe` is in range.
        unsafe { f(dst as *mut c_void, src_ptr as *const c_void, bytes, pe, stream.cu_stream() as cudaStream_t) };
        Ok(())
    }

    /// Copies `pe`'s copy of this buffer, from element `offset`, into `dst` (local device memory),
    /// in stream order (`nvshmemx_getmem_on_stream`).
    #[doc(alias = "nvshmemx_getmem_on_stream")]
    pub fn get_on_stream(
        &self,
        offset: usize,
        dst: &mut impl DevicePtrMut<T>,
        pe: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        let (pe, src, bytes) = self.transfer(GET, offset, dst.len(), pe, stream)?;
        let f = function!(lib()?, nvshmemx_getmem_on_stream)?;
        let (dst_ptr, _guard) = dst.device_ptr_mut(stream);
        // SAFETY: the source range lies inside this symmetric buffer (checked); the destination
        // holds `bytes` bytes on this device, borrowed until the guard records after the enqueue.
        unsafe { f(dst_ptr as *mut c_void, src as *const c_void, bytes, pe, stream.cu_stream() as cudaStream_t) };
        Ok(())
    }
}

impl<T> Drop for Symmetric<'_, T> {
    fn drop(&mut self) {
        if !self.freed {
            eprintln!(
                "nvshmem: a symmetric buffer of {} bytes was dropped without Symmetric::free; it stays allocated \
                 until NVSHMEM is finalised (freeing in Drop could break the collective free order)",
                self.len * size_of::<T>()
            );
        }
    }
}

impl<T> DeviceSlice<T> for Symmetric<'_, T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.rt.stream()
    }
}

impl<T> DevicePtr<T> for Symmetric<'_, T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (cudarc::driver::sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for Symmetric<'_, T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (cudarc::driver::sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}
