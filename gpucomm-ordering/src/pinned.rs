//! Writable use of a buffer that its owner must keep in place.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{sys::CUdeviceptr, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};

use crate::{DeviceMemory, Keep, Visitor};

/// Writable access to a buffer that an owner must keep in place — a buffer registered with NCCL or
/// NVSHMEM, which the library uses until it is deregistered: a cudarc buffer
/// ([`DevicePtrMut`]), and a [`DeviceMemory`] with the buffer's own promise, for every call that
/// writes it, and nothing more.
///
/// Handing out `&mut B` instead would let safe code replace the buffer (`std::mem::replace`,
/// `std::mem::swap`) and free the registered memory while the library still holds it. A
/// `PinnedMut` only forwards the buffer protocol, so the buffer behind it cannot be taken out;
/// swapping two `PinnedMut`s swaps the borrows, not the buffers.
pub struct PinnedMut<'a, T, B: ?Sized> {
    buf: &'a mut B,
    _elements: PhantomData<T>,
}

impl<'a, T, B: DevicePtrMut<T> + ?Sized> PinnedMut<'a, T, B> {
    /// Writable access to `buf` that cannot replace it.
    pub fn new(buf: &'a mut B) -> Self {
        PinnedMut { buf, _elements: PhantomData }
    }
}

impl<T, B: ?Sized> std::fmt::Debug for PinnedMut<'_, T, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedMut").finish_non_exhaustive()
    }
}

impl<T, B: DevicePtrMut<T> + ?Sized> DeviceSlice<T> for PinnedMut<'_, T, B> {
    fn len(&self) -> usize {
        self.buf.len()
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.buf.stream()
    }
}

impl<T, B: DevicePtrMut<T> + DevicePtr<T> + ?Sized> DevicePtr<T> for PinnedMut<'_, T, B> {
    fn device_ptr<'s>(&'s self, stream: &'s CudaStream) -> (CUdeviceptr, SyncOnDrop<'s>) {
        self.buf.device_ptr(stream)
    }
}

impl<T, B: DevicePtrMut<T> + ?Sized> DevicePtrMut<T> for PinnedMut<'_, T, B> {
    fn device_ptr_mut<'s>(&'s mut self, stream: &'s CudaStream) -> (CUdeviceptr, SyncOnDrop<'s>) {
        self.buf.device_ptr_mut(stream)
    }
}

// SAFETY: every cudarc method forwards to `buf`, which is borrowed exclusively for the whole life
// of the `PinnedMut` and cannot be replaced through it; so the length, addresses and ordering are
// `buf`'s own, which its `DeviceMemory` implementation promises to be truthful.
unsafe impl<T, B: DeviceMemory<Elem = T> + DevicePtrMut<T> + ?Sized> DeviceMemory for PinnedMut<'_, T, B> {
    type Elem = T;
    #[inline]
    fn tracked(&self) -> Option<crate::Tracked<'_>> {
        self.buf.tracked()
    }
}

// SAFETY: the exclusive borrow keeps the buffer alive, and in place, for the `PinnedMut`'s life;
// it is reported writable, as it is. (A registration's `buffer_mut()` can so be kept by a graph.)
unsafe impl<T, B: DeviceMemory<Elem = T> + DevicePtr<T> + DevicePtrMut<T> + ?Sized> Keep for PinnedMut<'_, T, B> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.write(self);
    }
}
