//! Registering local device memory with NVSHMEM's remote transports.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::NonNull;

use gpucomm_ordering::DeviceBuffer;

use crate::error::{call, Error, Result};
use crate::Runtime;

/// Local device memory registered with NVSHMEM (`nvshmemx_buffer_register`), so that remote
/// transports (InfiniBand, …) can use it as the local side of puts and gets. It borrows the
/// memory, which therefore cannot be freed while registered, and unregisters it when dropped
/// (`nvshmemx_buffer_unregister`) or by [`Registration::unregister`]. Registration is local to
/// this PE, not collective. Over NVLink and PCIe peer-to-peer it is not needed.
pub struct Registration<'a, 'rt> {
    ptr: NonNull<c_void>,
    bytes: usize,
    rt: &'rt Runtime,
    _memory: PhantomData<&'a ()>,
}

impl std::fmt::Debug for Registration<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("ptr", &self.ptr).field("bytes", &self.bytes).finish()
    }
}

impl Runtime {
    /// Registers `buf` (device memory of this PE's device, not on the symmetric heap) with
    /// NVSHMEM (`nvshmemx_buffer_register`). Empty buffers are refused ([`Error::ZeroSize`]).
    #[doc(alias = "nvshmemx_buffer_register")]
    pub fn register<'a, T>(&self, buf: &'a impl DeviceBuffer<T>) -> Result<Registration<'a, '_>> {
        let bytes = buf.num_bytes();
        if bytes == 0 {
            return Err(Error::ZeroSize { len: buf.len(), elem_size: size_of::<T>() });
        }
        self.check_device("buffer", buf.stream().context().ordinal())?;
        // Registration uses no stream: the guard is released at once.
        let (addr, _guard) = buf.device_ptr(self.stream());
        let ptr =
            NonNull::new(addr as *mut c_void).ok_or(Error::ZeroSize { len: buf.len(), elem_size: size_of::<T>() })?;
        self.context().bind_to_thread()?;
        // SAFETY: `ptr` is `bytes` bytes of live device memory of this PE's device, borrowed for
        // the registration's lifetime, so it is unregistered before it can be freed.
        unsafe { call!(nvshmemx_buffer_register(ptr.as_ptr(), bytes) => status) }?;
        Ok(Registration { ptr, bytes, rt: self, _memory: PhantomData })
    }
}

impl Registration<'_, '_> {
    /// Bytes registered.
    pub fn num_bytes(&self) -> usize {
        self.bytes
    }

    /// Unregisters the memory (`nvshmemx_buffer_unregister`); on failure the registration comes
    /// back with the error.
    #[doc(alias = "nvshmemx_buffer_unregister")]
    pub fn unregister(self) -> std::result::Result<(), (Self, Error)> {
        match self.unregister_raw() {
            Ok(()) => {
                std::mem::forget(self);
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }

    fn unregister_raw(&self) -> Result<()> {
        self.rt.context().bind_to_thread()?;
        // SAFETY: the memory was registered by this handle and is unregistered at most once (the
        // handle is consumed or dropped right after success).
        unsafe { call!(nvshmemx_buffer_unregister(self.ptr.as_ptr()) => status) }
    }
}

impl Drop for Registration<'_, '_> {
    fn drop(&mut self) {
        if let Err(e) = self.unregister_raw() {
            log::warn!("nvshmem: unregistering {} bytes at {:p} failed: {e}", self.bytes, self.ptr);
        }
    }
}
