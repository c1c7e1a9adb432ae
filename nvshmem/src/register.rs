//! Registering local device memory with NVSHMEM's remote transports.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::ptr::NonNull;

use gpucomm_ordering::{DeviceBufferMut, Keep, PinnedMut, Visitor};

use crate::error::{Error, Result};
use crate::ffi::call;
use crate::Runtime;

/// Local device memory registered with NVSHMEM (`nvshmemx_buffer_register`), so that remote
/// transports (InfiniBand, …) can use it as the local side of puts and gets. Registration is local
/// to this PE, not collective. Over NVLink and PCIe peer-to-peer it is not needed.
///
/// The registration owns the buffer — so it cannot be freed while NVSHMEM holds it — and gives it
/// back with [`Registration::unregister`]; in between it is read through `&*reg` ([`Deref`]) and
/// written through [`reg.buffer_mut()`](Registration::buffer_mut), which cannot replace it.
/// Unregistering (and dropping) first waits for the buffer's queued uses — puts and gets still
/// waiting on their streams would otherwise run against a registration that is gone — and for
/// nothing else, bounded by [`Runtime::set_timeout`].
///
/// A [`crate::capture`] whose operations use the buffer keeps the registration (`&reg`,
/// `&mut reg`, or `reg.buffer_mut()` in its keep set), so the registration outlives the graph.
pub struct Registration<'rt, T, B: DeviceBufferMut<T>> {
    ptr: NonNull<c_void>,
    bytes: usize,
    rt: &'rt Runtime,
    /// Dropped only after a successful unregistration.
    buf: ManuallyDrop<B>,
    /// Set by the consuming teardown once the C resource is gone: `Drop` then has nothing to do.
    released: bool,
    _elements: PhantomData<T>,
}

impl<T, B: DeviceBufferMut<T>> std::fmt::Debug for Registration<'_, T, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("ptr", &self.ptr).field("bytes", &self.bytes).finish()
    }
}

impl Runtime {
    /// Registers `buf` (device memory of this PE's device, not on the symmetric heap) with
    /// NVSHMEM (`nvshmemx_buffer_register`).
    ///
    /// The buffer is owned (`B: 'static`: a `CudaSlice`, not a `CudaViewMut` borrowed from one):
    /// a registration can be leaked with `mem::forget`, which skips its unregistration, and the
    /// memory of a borrowed buffer could then be freed while NVSHMEM still holds it. A leaked
    /// registration of an owned buffer leaks the buffer with it.
    ///
    /// # Errors
    ///
    /// A refused registration hands the buffer back, untouched, with the error:
    /// [`Error::ZeroSize`] for an empty buffer, [`Error::WrongDevice`] for one on another device,
    /// a CUDA error, or NVSHMEM's error when `nvshmemx_buffer_register` fails (NVSHMEM then
    /// registered nothing).
    #[doc(alias = "nvshmemx_buffer_register")]
    pub fn register<T, B: DeviceBufferMut<T> + 'static>(
        &self,
        mut buf: B,
    ) -> std::result::Result<Registration<'_, T, B>, (B, Error)> {
        match self.register_ptr(&mut buf) {
            Ok(ptr) => Ok(Registration {
                ptr,
                bytes: buf.num_bytes(),
                rt: self,
                buf: ManuallyDrop::new(buf),
                released: false,
                _elements: PhantomData,
            }),
            Err(e) => Err((buf, e)),
        }
    }

    /// Checks `buf` and registers its memory (`nvshmemx_buffer_register`), giving its address;
    /// nothing is registered when it fails.
    fn register_ptr<T>(&self, buf: &mut impl DeviceBufferMut<T>) -> Result<NonNull<c_void>> {
        let bytes = buf.num_bytes();
        let empty = Error::ZeroSize { len: buf.len(), elem_size: size_of::<T>() };
        if bytes == 0 {
            return Err(empty);
        }
        self.check_device("buffer", buf.stream())?;
        // Registration uses no stream: the guard is released at once.
        let addr = buf.device_ptr_mut(self.stream()).0;
        let ptr = NonNull::new(addr as *mut c_void).ok_or(empty)?;
        self.context().bind_to_thread()?;
        // SAFETY: `ptr` is `bytes` bytes of live device memory of this PE's device, owned by the
        // registration (the caller builds it at once, from a `'static` buffer that borrows no
        // other owner's memory), which unregisters it before the memory can be freed — or, when
        // the registration is leaked, leaks the buffer with it.
        unsafe { call!(nvshmemx_buffer_register(ptr.as_ptr(), bytes)) }?;
        Ok(ptr)
    }
}

impl<T, B: DeviceBufferMut<T>> Registration<'_, T, B> {
    /// Bytes registered.
    pub fn num_bytes(&self) -> usize {
        self.bytes
    }

    /// Writable access to the buffer, for calls that write it (gets, copies, kernels). It
    /// forwards cudarc's buffer protocol only, so the registered buffer cannot be replaced
    /// through it.
    pub fn buffer_mut(&mut self) -> PinnedMut<'_, T, B> {
        PinnedMut::new(&mut *self.buf)
    }

    /// Unregisters the memory (`nvshmemx_buffer_unregister`) once the buffer's queued uses have
    /// finished, and gives the buffer back; on failure (including [`Error::StillInUse`] when the
    /// runtime's timeout expires first) the registration comes back with the error.
    #[doc(alias = "nvshmemx_buffer_unregister")]
    // The registration comes back on failure, as fallible teardown does throughout the family.
    #[allow(clippy::result_large_err)]
    pub fn unregister(mut self) -> std::result::Result<B, (Self, Error)> {
        match self.release() {
            Ok(()) => {
                self.released = true;
                // SAFETY: the buffer is taken once, and the registration is marked released just
                // above, so its `Drop` never touches the emptied `ManuallyDrop`.
                Ok(unsafe { ManuallyDrop::take(&mut self.buf) })
            }
            Err(e) => Err((self, e)),
        }
    }

    /// Waits for the buffer's queued uses, then unregisters it.
    fn release(&mut self) -> Result<()> {
        let timeout = self.rt.timeout();
        if !gpucomm_ordering::wait_for_uses(&mut *self.buf, self.rt.context(), timeout)? {
            return Err(Error::StillInUse { what: "a registered buffer", after: timeout.unwrap_or_default() });
        }
        self.rt.context().bind_to_thread()?;
        // SAFETY: the memory was registered by this handle and is unregistered at most once
        // (`unregister` marks the registration released, which `Drop` skips; a drop ends the
        // handle); no queued work uses it any more.
        unsafe { call!(nvshmemx_buffer_unregister(self.ptr.as_ptr())) }
    }
}

impl<T, B: DeviceBufferMut<T>> Deref for Registration<'_, T, B> {
    type Target = B;
    fn deref(&self) -> &B {
        &self.buf
    }
}

impl<T, B: DeviceBufferMut<T>> Drop for Registration<'_, T, B> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        match self.release() {
            // SAFETY: dropped once, here; the registration is gone afterwards.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.buf) },
            // NVSHMEM may still use the memory: leak it.
            Err(e) => log::warn!(
                "nvshmem: unregistering {} bytes at {:p} failed; the buffer is leaked: {e}",
                self.bytes,
                self.ptr
            ),
        }
    }
}

// SAFETY: the borrow keeps the registration, and so its buffer, alive and registered; the buffer
// is only read through it.
unsafe impl<T, B: DeviceBufferMut<T>> Keep for &Registration<'_, T, B> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.read(&*self.buf);
    }
}

// SAFETY: the exclusive borrow keeps the registration, and so its buffer, alive and registered; it
// is reported writable. Swapping the registration out through `Graph::kept_mut` moves its buffer
// with it, which the next launch notices (the memory is no longer kept) and refuses.
unsafe impl<T, B: DeviceBufferMut<T>> Keep for &mut Registration<'_, T, B> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.write(&mut *self.buf);
    }
}
