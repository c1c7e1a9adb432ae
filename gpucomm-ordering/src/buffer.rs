//! The buffer trait every call of the safe crates requires: device memory whose length, device and
//! stream ordering the calls can trust before they hand its address to C.
//!
//! cudarc's [`DeviceSlice`](cudarc::driver::DeviceSlice), [`DevicePtr`] and [`DevicePtrMut`] are
//! safe traits: any type can implement them and claim any length. NCCL and NVSHMEM then read and
//! write that many bytes at whatever address the type hands out, so the communication calls cannot
//! rely on them alone. [`DeviceMemory`] is the `unsafe` promise they rely on instead; the calls
//! take [`DeviceBuffer<T>`] (read) and [`DeviceBufferMut<T>`] (written), which every type with
//! that promise and cudarc's traits has automatically.
//!
//! Implemented here for cudarc's [`CudaSlice`], [`CudaView`] and [`CudaViewMut`]; the `nccl` and
//! `nvshmem` crates implement it for their own buffers and views (`MemBuffer`, `Symmetric`, …).
//!
//! # A framework's own tensor type
//!
//! A framework whose tensors are views into cudarc memory (a slice, an offset, a length)
//! implements cudarc's traits by forwarding to the slice, and promises the rest with `unsafe impl`.
//! The ordering is only as good as the events cudarc holds for the slice: a framework that hands
//! a kernel's *output* to cudarc as a shared reference (candle 0.11 does) leaves a read event and
//! no write event, so a call on that tensor does not wait for the kernel that wrote it; record an
//! event on the framework's stream after the producing kernels and make the call's stream wait
//! for it.
//!
//! ```
//! use std::sync::Arc;
//! use cudarc::driver::{sys::CUdeviceptr, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
//! use gpucomm_ordering::DeviceMemory;
//!
//! /// `len` elements of `storage`, from element `offset`.
//! pub struct Tensor {
//!     storage: CudaSlice<f32>,
//!     offset: usize,
//!     len: usize,
//! }
//!
//! impl Tensor {
//!     /// The only way to build one: the range is checked here, once.
//!     pub fn new(storage: CudaSlice<f32>, offset: usize, len: usize) -> Option<Self> {
//!         (offset.checked_add(len)? <= storage.len()).then_some(Tensor { storage, offset, len })
//!     }
//! }
//!
//! impl DeviceSlice<f32> for Tensor {
//!     fn len(&self) -> usize {
//!         self.len
//!     }
//!     fn stream(&self) -> &Arc<CudaStream> {
//!         self.storage.stream()
//!     }
//! }
//!
//! impl DevicePtr<f32> for Tensor {
//!     fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
//!         // cudarc's protocol for the whole slice: waits for earlier writes, records this read.
//!         let (base, guard) = self.storage.device_ptr(stream);
//!         (base + (self.offset * size_of::<f32>()) as CUdeviceptr, guard)
//!     }
//! }
//!
//! impl DevicePtrMut<f32> for Tensor {
//!     fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
//!         let offset = (self.offset * size_of::<f32>()) as CUdeviceptr;
//!         let (base, guard) = self.storage.device_ptr_mut(stream);
//!         (base + offset, guard)
//!     }
//! }
//!
//! // SAFETY: `offset + len <= storage.len()` holds from `Tensor::new` on (the fields are private and
//! // never change), so the address is valid for `len` elements of the slice's device; the memory
//! // is the slice's, freed only by its drop, and every use goes through the slice's own ordering.
//! unsafe impl DeviceMemory for Tensor {
//!     type Elem = f32;
//! }
//! ```
//!
//! A type that is not a view into cudarc memory (a pool allocation, memory from another library)
//! orders its uses with a [`StreamTracker`](crate::StreamTracker), see
//! [`tracked_device_ptr!`](crate::tracked_device_ptr).

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

use crate::{Resource, Tracked};

/// The promise a type makes so that the communication calls may pass its memory to C: its
/// cudarc traits for [`DeviceMemory::Elem`] tell the truth. `nccl` and `nvshmem` accept a buffer
/// only through [`DeviceBuffer<T>`] / [`DeviceBufferMut<T>`], which need this trait.
///
/// # Safety
///
/// For `Elem = T`, an implementation promises, about the type's implementations of cudarc's
/// [`DeviceSlice<T>`](cudarc::driver::DeviceSlice), [`DevicePtr<T>`] and (where it has one)
/// [`DevicePtrMut<T>`]:
///
/// 1. **The memory exists.** The address `device_ptr` / `device_ptr_mut` return is valid device
///    memory for `len() × size_of::<T>()` bytes (reads; writes too for `device_ptr_mut`), aligned
///    for `T`, in the context of `stream()` (the device the calls check against). Zero-length
///    values may return any address.
/// 2. **It stays valid while borrowed.** Address and length do not change while the value is
///    borrowed, and the memory is not freed, nor handed to another owner, while the value (or
///    whatever it borrows) lives — and, after that, not before the work ordered through it (item
///    3) has finished.
/// 3. **Uses are ordered.** `device_ptr(stream)` makes `stream` wait for earlier writes of the
///    memory on other streams, and its guard, dropped after the use is enqueued, records the use so
///    that later writes and the free wait for it; `device_ptr_mut(stream)` makes `stream` wait for
///    every earlier use, and its guard records the write so that every later use waits for it.
///    This is cudarc's protocol (its events) or a [`StreamTracker`](crate::StreamTracker)'s.
/// 4. **`tracked` tells the truth.** Where [`DeviceMemory::tracked`] returns parts, they describe
///    the memory `device_ptr` and `device_ptr_mut` hand out (address and length), and those order
///    every use through that tracker exactly as [`tracked_device_ptr!`](crate::tracked_device_ptr)
///    does (which implements this trait, `tracked` included).
///
/// cudarc's own slices keep one event for all readers, so a write after reads on two other
/// streams waits for the later reader only; trackers remember every reading stream.
pub unsafe trait DeviceMemory {
    /// The element type the promise is about.
    type Elem;

    /// The buffer's address, length and [`StreamTracker`](crate::StreamTracker) when a tracker
    /// orders its uses; `None` (the default) for cudarc's protocol. An
    /// [`Access`](crate::Access) uses them to order the common case — a use on the stream the
    /// memory was last used on, or one captured by this crate's scope — without going through
    /// `device_ptr`.
    #[inline]
    fn tracked(&self) -> Option<Tracked<'_>> {
        None
    }

    /// The registration this memory belongs to when captured work reaches the memory through
    /// that registration's handle (an NCCL window), named as the registration's own keep-set
    /// entries name it ([`Resource::numbered`]); `None` (the default) otherwise. A graph that
    /// keeps the buffer (`&`, `&mut`) keeps that registration too, so a launch after the member
    /// was swapped for a buffer of another registration at the same address is refused.
    #[inline]
    fn registration(&self) -> Option<Resource> {
        None
    }
}

/// Device memory a call may read: cudarc's [`DevicePtr`] for `T`, backed by the promise of
/// [`DeviceMemory`]. Implemented automatically; entry points take `&impl DeviceBuffer<T>`.
pub trait DeviceBuffer<T>: DeviceMemory<Elem = T> + DevicePtr<T> {}

impl<T, B: DeviceMemory<Elem = T> + DevicePtr<T> + ?Sized> DeviceBuffer<T> for B {}

/// Device memory a call may write: cudarc's [`DevicePtrMut`] for `T` besides [`DeviceBuffer`].
/// Implemented automatically; entry points take `&mut impl DeviceBufferMut<T>`.
pub trait DeviceBufferMut<T>: DeviceBuffer<T> + DevicePtrMut<T> {}

impl<T, B: DeviceBuffer<T> + DevicePtrMut<T> + ?Sized> DeviceBufferMut<T> for B {}

// SAFETY: cudarc allocates `len` elements of `T` on its stream's device and frees them only in the
// slice's `Drop`, which first makes the freeing stream wait for the slice's read and write events;
// `device_ptr`/`device_ptr_mut` wait for and record those events (while the context tracks
// events; a program that turns tracking off takes the ordering on itself through cudarc's unsafe
// `disable_event_tracking`). Views borrow the slice and cover a checked sub-range of it.
// Item 3 holds for one reading stream at a time only: cudarc keeps one read event, which each read
// records again, so a write or the free after reads on two streams waits for the later reader
// only — as cudarc's own copies and kernels do. This gap is open (a second audit, 2026-12-03);
// `MemBuffer` and the symmetric buffers, whose trackers remember every reading stream, do not
// have it.
unsafe impl<T> DeviceMemory for CudaSlice<T> {
    type Elem = T;
}

// SAFETY: as for `CudaSlice`: a view borrows its slice (and its events) for its whole life.
unsafe impl<T> DeviceMemory for CudaView<'_, T> {
    type Elem = T;
}

// SAFETY: as for `CudaSlice`: a view borrows its slice (and its events) for its whole life.
unsafe impl<T> DeviceMemory for CudaViewMut<'_, T> {
    type Elem = T;
}
