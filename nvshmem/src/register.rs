//! Registering local device memory with NVSHMEM's remote transports.

use std::cell::RefCell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::ptr::NonNull;

use cudarc::driver::sys::CUdeviceptr;
use gpucomm_ordering::{DeviceBufferMut, Keep, PinnedMut, Visitor};

use crate::error::{Error, Result};
use crate::ffi::call;
use crate::overlap::Span;
use crate::quiesce;
use crate::Runtime;

/// Local device memory registered with NVSHMEM (`nvshmemx_buffer_register`), so that remote
/// transports (InfiniBand, …) can use it as the local side of puts and gets: a put or get to a PE
/// reached over one refuses local memory that is neither symmetric nor inside one registration
/// ([`Error::LocalNotRegistered`]). Registration is local to this PE, not collective. Over NVLink
/// and PCIe peer-to-peer it is not needed.
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
    /// [`Error::HostCallInCapture`] while this thread has a capture scope open ([`crate::capture`])
    /// and [`Error::CopyStreamsCaptured`] while a capture holds NVSHMEM's copy streams (NVSHMEM
    /// updates its device state with a synchronous copy, which CUDA refuses inside a capture),
    /// a CUDA error, or NVSHMEM's error when `nvshmemx_buffer_register` fails (nothing stays
    /// registered: what some of NVSHMEM's transports took before another failed is unregistered).
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

    /// Checks `buf` and registers its memory (`nvshmemx_buffer_register`), giving its address,
    /// and adds its range to the runtime's [`Registered`]; nothing stays registered when it fails.
    fn register_ptr<T>(&self, buf: &mut impl DeviceBufferMut<T>) -> Result<NonNull<c_void>> {
        let bytes = buf.num_bytes();
        let empty = Error::ZeroSize { len: buf.len(), elem_size: size_of::<T>() };
        if bytes == 0 {
            return Err(empty);
        }
        self.check_device("buffer", buf.stream())?;
        // NVSHMEM 3.4.5's `buffer_register` puts the new handles in its transport's cache, then
        // updates the device state (with IBGDA, a synchronous `cudaMemcpy`, which CUDA refuses
        // during this thread's capture); on that failure it frees the handles but leaves them in
        // the cache, and the undoing below would free them again. Refused before NVSHMEM is
        // called, as the unregistration is.
        quiesce::host_call("registering a buffer (nvshmemx_buffer_register)")?;
        // Registration uses no stream: the guard is released at once.
        let addr = buf.device_ptr_mut(self.stream()).0;
        let ptr = NonNull::new(addr as *mut c_void).ok_or(empty)?;
        self.context().bind_to_thread()?;
        // SAFETY: `ptr` is `bytes` bytes of live device memory of this PE's device, owned by the
        // registration (the caller builds it at once, from a `'static` buffer that borrows no
        // other owner's memory), which unregisters it before the memory can be freed — or, when
        // the registration is leaked, leaks the buffer with it.
        if let Err(e) = unsafe { call!(nvshmemx_buffer_register(ptr.as_ptr(), bytes)) } {
            // NVSHMEM registers the buffer with each of its transports in turn and reports the
            // last failure, keeping what the others took: undo that. The undoing's status is
            // ignored: it fails where no transport took the buffer, and the registration's error
            // is the one that says what went wrong.
            // SAFETY: `ptr` is the address just passed to nvshmemx_buffer_register, of memory the
            // caller still owns; no other registration of this crate holds any of it (each owns
            // its own buffer), so this undoes only what the failed call registered.
            let _ = unsafe { call!(nvshmemx_buffer_unregister(ptr.as_ptr())) };
            return Err(e);
        }
        self.registered.add(addr, bytes);
        Ok(ptr)
    }
}

/// The address ranges of this PE's live registrations, which the runtime keeps: added once
/// NVSHMEM has registered a buffer, removed once it has unregistered it.
#[derive(Debug, Default)]
pub(crate) struct Registered(RefCell<Vec<(CUdeviceptr, usize)>>);

impl Registered {
    fn add(&self, addr: CUdeviceptr, bytes: usize) {
        self.0.borrow_mut().push((addr, bytes));
    }

    fn remove(&self, addr: CUdeviceptr, bytes: usize) {
        let mut ranges = self.0.borrow_mut();
        if let Some(i) = ranges.iter().position(|&r| r == (addr, bytes)) {
            ranges.swap_remove(i);
        }
    }

    /// True when one registration holds every byte of `span`.
    fn holds(&self, span: Span) -> bool {
        self.0.borrow().iter().any(|&(addr, bytes)| span.lies_in(&Span { addr, bytes, ..span }))
    }
}

/// `Ok` when NVSHMEM can use `local`, the local buffer of a transfer to PE `pe` (a put's source,
/// a get's destination). Always when this PE maps `pe`'s memory (`mapped`: NVSHMEM copies by
/// loads and stores), and for an empty range. Otherwise `pe` is reached over a network transport,
/// which needs the range inside one of this PE's registrations (`registered`) or on its symmetric
/// heap (`on_heap`, asked only then): else [`Error::LocalNotRegistered`].
#[inline]
pub(crate) fn check_local(
    local: Span,
    pe: usize,
    mapped: bool,
    registered: &Registered,
    on_heap: impl FnOnce() -> Result<bool>,
) -> Result<()> {
    if mapped || local.bytes == 0 || registered.holds(local) || on_heap()? {
        Ok(())
    } else {
        Err(Error::LocalNotRegistered { what: local.what, pe })
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
        // The wait below is a host wait, and the graph of an open capture would not keep a
        // registration let go inside it.
        if gpucomm_ordering::scope_open() {
            return Err(Error::HostCallInCapture { what: "unregistering a buffer (nvshmemx_buffer_unregister)" });
        }
        let _relaxed = crate::quiesce::relaxed_host();
        let timeout = self.rt.timeout();
        if !gpucomm_ordering::wait_for_uses(&mut *self.buf, self.rt.context(), timeout)? {
            return Err(Error::StillInUse { what: "a registered buffer", after: timeout.unwrap_or_default() });
        }
        // Not `bind_to_thread`: an error something else recorded in the context would leak the
        // buffer and be taken from its owner.
        gpucomm_ordering::make_current(self.rt.context())?;
        // SAFETY: the memory was registered by this handle and is unregistered at most once
        // (`unregister` marks the registration released, which `Drop` skips; a drop ends the
        // handle); no queued work uses it any more.
        unsafe { call!(nvshmemx_buffer_unregister(self.ptr.as_ptr())) }?;
        self.rt.registered.remove(self.ptr.as_ptr() as CUdeviceptr, self.bytes);
        Ok(())
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
        if std::thread::panicking() {
            // Its queued uses may be stuck behind a dead peer, the likely cause of the panic, and
            // waiting for them could last for ever: the registration and its buffer are leaked.
            return log::warn!(
                "nvshmem: a registration of {} bytes at {:p} dropped while panicking is leaked",
                self.bytes,
                self.ptr
            );
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One registration of 4 KiB at 0x10000.
    fn one() -> Registered {
        let registered = Registered::default();
        registered.add(0x10000, 4096);
        registered
    }

    fn source(addr: CUdeviceptr, bytes: usize) -> Span {
        Span::new("source", addr, bytes)
    }

    fn unasked() -> Result<bool> {
        panic!("the heap was asked about")
    }

    #[test]
    fn a_mapped_target_or_an_empty_range_needs_nothing() {
        let none = Registered::default();
        assert!(check_local(source(0x10000, 64), 1, true, &none, unasked).is_ok(), "mapped");
        assert!(check_local(source(0x10000, 0), 1, false, &none, unasked).is_ok(), "empty");
    }

    #[test]
    fn an_unmapped_target_needs_the_heap_or_one_registration() {
        let registered = one();
        assert!(check_local(source(0x90000, 64), 1, false, &registered, || Ok(true)).is_ok(), "on the heap");
        assert!(check_local(source(0x10000, 4096), 1, false, &registered, unasked).is_ok(), "the whole registration");
        assert!(check_local(source(0x10800, 64), 1, false, &registered, unasked).is_ok(), "inside it");
        let e = check_local(source(0x10fc0, 128), 3, false, &registered, || Ok(false)).unwrap_err();
        assert!(matches!(e, Error::LocalNotRegistered { what: "source", pe: 3 }), "past its end: {e:?}");
        let e = check_local(source(0xffc0, 128), 3, false, &registered, || Ok(false)).unwrap_err();
        assert!(matches!(e, Error::LocalNotRegistered { .. }), "before its start: {e:?}");
        assert_eq!(
            e.to_string(),
            "the source is neither on the symmetric heap nor inside one registered buffer, which NVSHMEM needs to reach PE 3 over its network transport: allocate it with Runtime::alloc or register it with Runtime::register (nothing was called)"
        );
        // Two adjacent registrations are two: a range across both is in neither.
        registered.add(0x11000, 4096);
        let e = check_local(source(0x10fc0, 128), 3, false, &registered, || Ok(false)).unwrap_err();
        assert!(matches!(e, Error::LocalNotRegistered { .. }), "across two: {e:?}");
        let failed = check_local(source(0x90000, 64), 1, false, &registered, || Err(Error::Finalized));
        assert!(matches!(failed, Err(Error::Finalized)), "the heap query's error comes back: {failed:?}");
    }

    #[test]
    fn an_unregistered_range_is_forgotten() {
        let registered = one();
        registered.add(0x20000, 64);
        registered.remove(0x10000, 4096);
        let e = check_local(source(0x10000, 64), 0, false, &registered, || Ok(false)).unwrap_err();
        assert!(matches!(e, Error::LocalNotRegistered { what: "source", pe: 0 }), "{e:?}");
        assert!(check_local(source(0x20000, 64), 0, false, &registered, unasked).is_ok(), "the other stays");
    }
}
