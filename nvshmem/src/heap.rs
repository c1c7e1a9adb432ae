//! Symmetric-heap buffers: collective allocation, explicit collective free, sub-ranges, peer
//! views, and their part in cudarc's stream ordering.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{sys::CUdeviceptr, CudaStream, DeviceRepr};
use gpucomm_ordering::{tracked_device_ptr, DeviceBufferMut, Keep, StreamTracker, Tracked, Visitor};

mod limit;

pub use limit::HeapLimit;
pub(crate) use limit::{reduce_segment_bytes, HeapUse};

use crate::agree::{Ask, Op};
use crate::error::{Error, Result};
use crate::ffi::call;
use crate::quiesce;
use crate::Runtime;

mod sealed {
    pub trait Sealed {}
}

/// An element type for which every bit pattern is a valid value: plain integers and floats. Only
/// these can be allocated on the symmetric heap ([`Runtime::alloc`] and its variants): an
/// uninitialised buffer holds whatever the heap held, and every PE's copy can be written by the
/// other PEs, whose collective allocation at the same step is only checked to have the same size
/// in bytes (another PE may hold `u8` where this one holds `bool`, and put any byte). Sealed.
pub trait Element: DeviceRepr + sealed::Sealed {}

macro_rules! element {
    ($($t:ty),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {}
    )*};
}

element!(i8, i16, i32, i64, isize, u8, u16, u32, u64, usize, f32, f64);
#[cfg(feature = "f16")]
element!(half::f16, half::bf16);

/// A buffer of `len` elements of `T` at the same symmetric address on every PE
/// (`nvshmem_malloc`). Borrowing the [`Runtime`] ties it to NVSHMEM's lifetime.
///
/// # Collective allocation and free
///
/// [`Runtime::alloc`] (and the `_zeroed` / `_aligned` variants) and [`Symmetric::free`] are
/// collective and blocking: every PE must call them in the same order with the same sizes.
/// Allocation checks the sizes: before NVSHMEM allocates, the PEs compare what they ask for, and
/// when one asked for another size or alignment ([`Error::AsymmetricAlloc`]), or refused its part
/// (then [`Error::PeerRefusedAlloc`] on the others), no PE allocates — a mismatched allocation
/// would leave every later buffer at another offset on some PE. The check costs one small put with
/// a signal to each PE and a wait on the host for every PE's words (no collective: it pairs with
/// nothing but the same check on the other PEs, and works where NVSHMEM supports no reductions,
/// several PEs on one GPU without MPS included). [`Symmetric::free`] is checked the
/// same way: the PEs compare the freed buffer's offset on the heap and its size, and none frees
/// when they differ ([`Error::AsymmetricFree`]), when some allocate while others free
/// ([`Error::MixedHeapCollectives`]), or when one cannot take its part.
/// Because the order of `Drop`s differs between PEs on error paths, dropping a buffer does **not**
/// free it: it stays allocated until NVSHMEM is finalised, and a warning goes to the `log` crate.
/// Free buffers explicitly with [`Symmetric::free`].
///
/// # Stream ordering
///
/// A `Symmetric` takes part in cudarc's stream protocol through a
/// [`StreamTracker`](gpucomm_ordering::StreamTracker): it implements cudarc's
/// [`DevicePtr`](cudarc::driver::DevicePtr) / [`DevicePtrMut`](cudarc::driver::DevicePtrMut), so
/// cudarc copies and kernels, NCCL collectives and this crate's operations that touch it on
/// different streams are ordered after each other without any synchronisation by you. Staying on
/// one stream costs two atomic loads per use; changing streams records an event and makes the new
/// stream wait for it. Operations that write the buffer on some PE (a put's destination, a
/// signal) count as writes, reads of this PE's copy as reads. The tracker orders this process's
/// streams only: what other PEs do to their copies is ordered by NVSHMEM's own means (signals,
/// quiet, barriers).
///
/// Sub-ranges ([`Symmetric::slice`]) and peer views ([`Symmetric::peer`]) share the buffer's
/// tracker.
// What a call on one stream reads (address, length, and the tracker's first fields) lies in the
// first 56 bytes, in this order, and the buffer starts a cache line: one line per buffer.
#[repr(C, align(64))]
pub struct Symmetric<'rt, T> {
    ptr: NonNull<c_void>,
    len: usize,
    rt: &'rt Runtime,
    tracker: StreamTracker,
    /// What the buffer holds of the heap ([`Request::held`]): counted in the runtime's bytes in
    /// use from its allocation to its free.
    held: usize,
    /// Set by the consuming teardown once the C resource is gone: `Drop` then has nothing to do.
    released: bool,
    _elem: PhantomData<T>,
}

impl<T> std::fmt::Debug for Symmetric<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symmetric").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

/// The three kinds of allocation.
enum Alloc {
    /// `nvshmem_malloc`.
    Malloc,
    /// `nvshmem_malloc`, then zeroed by this crate (not `nvshmem_calloc`: see
    /// [`Runtime::alloc_zeroed`]).
    Zeroed,
    /// `nvshmem_align` with this alignment.
    Align(usize),
}

impl Runtime {
    /// Allocates `len` elements on the symmetric heap of every PE (`nvshmem_malloc`).
    /// Collective: all PEs call it in the same order with the same `len`. The contents are
    /// whatever the heap held (hence [`Element`]: types valid for any bits).
    ///
    /// Refused before NVSHMEM is called, on every PE: zero bytes ([`Error::ZeroSize`]), sizes that
    /// do not fit the heap's limit ([`Error::HeapExhausted`], see [`HeapLimit`]), on the dynamic
    /// heap a growth the GPU's free memory cannot back ([`Error::DeviceMemoryShort`]), PEs asking
    /// for different sizes ([`Error::AsymmetricAlloc`]), and another PE's refusal
    /// ([`Error::PeerRefusedAlloc`]).
    #[doc(alias = "nvshmem_malloc")]
    pub fn alloc<T: Element>(&self, len: usize) -> Result<Symmetric<'_, T>> {
        self.allocate(len, Alloc::Malloc)
    }

    /// Allocates `len` zeroed elements on the symmetric heap of every PE. Collective, like
    /// [`Runtime::alloc`]. Zeroed contents alone would not make a type such as `bool` sound here:
    /// other PEs write this PE's copy with their own element type, which the allocation checks by
    /// size only, so elements are [`Element`]s (valid for any bits) as well.
    ///
    /// The buffer is allocated like [`Runtime::alloc`]'s, then zeroed on a private stream of this
    /// crate, and the call returns once every PE has zeroed its copy (a barrier over all PEs on
    /// that stream, waited for): writes made afterwards, on any stream and by any PE, land on
    /// zeros. (`nvshmem_calloc` zeroes with a `cudaMemset` on the legacy default stream, which
    /// nothing orders with other streams or with the other PEs: the zeros could land after them.
    /// On the static heap a failing `nvshmem_calloc` also exits the process.)
    #[doc(alias = "nvshmem_calloc")]
    pub fn alloc_zeroed<T: Element>(&self, len: usize) -> Result<Symmetric<'_, T>> {
        self.allocate(len, Alloc::Zeroed)
    }

    /// Allocates `len` elements aligned to `align` bytes on the symmetric heap of every PE
    /// (`nvshmem_align`). `align` must be a power of two of at least `align_of::<T>()`.
    /// Collective, like [`Runtime::alloc`]. The heap-limit check counts the size plus `align`
    /// bytes, which `nvshmem_align` may need ([`Error::HeapExhausted`]).
    #[doc(alias = "nvshmem_align")]
    pub fn alloc_aligned<T: Element>(&self, len: usize, align: usize) -> Result<Symmetric<'_, T>> {
        self.allocate(len, Alloc::Align(align))
    }

    fn allocate<T>(&self, len: usize, how: Alloc) -> Result<Symmetric<'_, T>> {
        let _relaxed = quiesce::relaxed_host();
        let align = match how {
            Alloc::Align(align) => align as u64,
            Alloc::Malloc | Alloc::Zeroed => 0,
        };
        // Every PE asks, whether or not it refuses, so that every PE reaches the same verdict.
        let local = self.local_check::<T>(len, &how);
        let bytes = local.as_ref().map_or(0, |(request, _)| request.bytes as u64);
        let op = if let Alloc::Zeroed = how { Op::AllocZeroed } else { Op::Alloc };
        let ask = Ask { op, bytes, align, offset: 0, refused: local.is_err() };
        let agreement = self.agreement()?;
        // Not `bind_to_thread`, which would first fail with an unrelated error recorded in the
        // context (by any thread): this PE would leave, and the others wait in the agreement.
        gpucomm_ordering::make_current(self.context())?;
        let agreed = agreement.agree(ask)?;
        // This PE's refusal, decided before the agreement and told to the others through it:
        // nothing after the agreement may fail on one PE alone, which would leave the others
        // waiting inside `nvshmem_malloc`.
        let (Request { bytes, held }, tracker) = local?;
        agreed.check(op, None)?;
        // SAFETY: NVSHMEM is initialised (the runtime exists) and its context is current (made so
        // before the agreement, which makes no other current); the sizes are non-zero and, with the
        // alignment, within the heap's limit (checked above), and every PE asks for the same size
        // and alignment (agreed above).
        let ptr = unsafe {
            match how {
                Alloc::Malloc | Alloc::Zeroed => call!(nvshmem_malloc(bytes)),
                Alloc::Align(align) => call!(nvshmem_align(align, bytes)),
            }
        }?;
        let ptr = NonNull::new(ptr).ok_or(Error::OutOfMemory { bytes })?;
        self.heap_use.add(held);
        let buffer = Symmetric { ptr, len, rt: self, tracker, held, released: false, _elem: PhantomData };
        if let Alloc::Zeroed = how {
            // Zeroed, on every PE, before this returns: the tracker, which knows no use of the
            // buffer, needs nothing recorded. On failure the buffer is dropped, and so leaked (with
            // a warning) while the other PEs keep theirs: the heaps stay in step.
            agreement.zero(buffer.device_address(), bytes)?;
        }
        Ok(buffer)
    }
}

impl Runtime {
    /// This PE's own verdict on an allocation of `len` elements of `T`: its size and the buffer's
    /// tracker, or why it is refused. Every refusal is decided here, so that a PE that refuses
    /// still takes part in the agreement (the others would wait for it otherwise).
    fn local_check<T>(&self, len: usize, how: &Alloc) -> Result<(Request, StreamTracker)> {
        let limit = self.info().heap;
        let request = check_size::<T>(len, how, self.heap_use.in_use(), limit)?;
        if limit.dynamic && self.heap_use.grows(request.held) {
            let step = limit.charge(request.held);
            gpucomm_ordering::make_current(self.context())?;
            let (free, _) = cudarc::driver::result::mem_get_info()?;
            if free < step {
                return Err(Error::DeviceMemoryShort { bytes: step, free });
            }
        }
        Ok((request, StreamTracker::new(self.stream())?))
    }
}

/// The granule of NVSHMEM's heap allocator (3.4.5 `NVSHMEMI_MALLOC_ALIGNMENT`): every request is
/// rounded up to it.
const CHUNK: usize = 512;

/// An allocation that passed [`check_size`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Request {
    /// Its size in bytes, as NVSHMEM is asked for it.
    bytes: usize,
    /// What it holds of the heap while it lives, at most: NVSHMEM's allocator (3.4.5
    /// `mspace::allocate_aligned`) serves an aligned request by taking size + alignment bytes
    /// and giving back only the part before the aligned address, and rounds every request up to
    /// [`CHUNK`] bytes. So a 1-byte buffer aligned to 256 MiB holds up to 256 MiB of the heap.
    held: usize,
}

/// An allocation of `len` elements of `T` made `how`, checked: alignment, overflow, zero bytes,
/// and the heap's `limit` with `in_use` bytes held by live buffers (see [`HeapLimit`]). An aligned
/// allocation counts its alignment too: `nvshmem_align` may hold up to size + alignment bytes of
/// the heap (and grows the dynamic heap by as much, rounded up, when they are not there).
/// [`HeapLimit::malloc_alignment`] counts the same way for `nvshmem_malloc`.
fn check_size<T>(len: usize, how: &Alloc, in_use: usize, limit: HeapLimit) -> Result<Request> {
    let align = match *how {
        Alloc::Align(align) => {
            let min = align_of::<T>();
            if !align.is_power_of_two() || align < min {
                return Err(Error::InvalidAlignment { align, min });
            }
            align
        }
        Alloc::Malloc | Alloc::Zeroed => limit.malloc_alignment,
    };
    let elem_size = size_of::<T>();
    let bytes = len.checked_mul(elem_size).ok_or(Error::SizeOverflow { len, elem_size })?;
    if bytes == 0 {
        return Err(Error::ZeroSize { len, elem_size });
    }
    let needed = bytes.checked_add(align).ok_or(Error::AlignedSizeOverflow { bytes, align })?;
    let held = needed.checked_next_multiple_of(CHUNK).unwrap_or(usize::MAX);
    let charged = limit.charge(held);
    if !limit.fits(in_use, charged) {
        return Err(Error::HeapExhausted {
            bytes: charged,
            in_use,
            reserved: limit.reserved,
            limit: limit.limit,
            limit_from: limit.limit_from,
        });
    }
    Ok(Request { bytes, held })
}

/// The resolved bounds of `range` within `len` elements, or [`Error::OutOfBounds`].
fn bounds(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    gpucomm_ordering::range::resolve(range, len).map_err(|(start, end)| Error::OutOfBounds { start, end, len })
}

impl<'rt, T> Symmetric<'rt, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: allocations have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The runtime the buffer belongs to.
    pub fn runtime(&self) -> &'rt Runtime {
        self.rt
    }

    /// The local address of the buffer (the same symmetric offset on every PE). Prefer the cudarc
    /// protocol ([`DevicePtr`](cudarc::driver::DevicePtr)), which orders the use on a stream.
    pub fn device_address(&self) -> CUdeviceptr {
        self.ptr.as_ptr() as CUdeviceptr
    }

    /// The whole buffer as a slice.
    pub fn as_slice(&self) -> SymmetricSlice<'_, T> {
        SymmetricSlice {
            ptr: self.device_address(),
            len: self.len,
            tracker: &self.tracker,
            rt: self.rt,
            _elem: PhantomData,
        }
    }

    /// Elements `range` of the buffer, on every PE: a symmetric sub-range that operations accept
    /// wherever they accept the whole buffer. [`Error::OutOfBounds`] when the range does not lie
    /// inside the buffer.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<SymmetricSlice<'_, T>> {
        self.as_slice().slice(range)
    }

    /// A view of `pe`'s copy of the buffer that this PE's kernels can load from and store to
    /// directly (`nvshmem_ptr`), or `None` when `pe` is not reachable by loads and stores (no
    /// peer-to-peer path). [`Error::InvalidPe`] when `pe` is out of range.
    #[doc(alias = "nvshmem_ptr")]
    pub fn peer(&self, pe: usize) -> Result<Option<PeerView<'_, T>>> {
        self.as_slice().peer(pe)
    }

    /// Frees the buffer on every PE (`nvshmem_free`). Collective and blocking: every PE frees the
    /// same buffer at the same step. It first waits for the streams that used the buffer (its
    /// tracker), because NVSHMEM's free does not wait for work still queued on your streams; the
    /// rest of the device is not waited for.
    ///
    /// Before NVSHMEM frees, the PEs compare what they free, as they do for allocations: when one
    /// frees another buffer (another offset on the heap, or another size;
    /// [`Error::AsymmetricFree`]), allocates instead ([`Error::MixedHeapCollectives`]) or cannot
    /// wait for its buffer's streams (its own error, and [`Error::PeerRefusedFree`] on the
    /// others), no PE frees — different frees would leave the heaps out of step, and the next
    /// allocation at different offsets on different PEs.
    ///
    /// If waiting or the check fails, nothing is freed and the buffer comes back with the error,
    /// so that the caller can retry (every PE must still free it, at the same step).
    #[doc(alias = "nvshmem_free")]
    // The buffer comes back on failure, as fallible teardown does throughout the family.
    #[allow(clippy::result_large_err)]
    pub fn free(mut self) -> std::result::Result<(), (Self, Error)> {
        let _relaxed = quiesce::relaxed_host();
        let freed = (|| -> Result<()> {
            // Every PE takes part in the check, whether or not it could wait for its streams, so
            // that every PE reaches the same verdict.
            let refusal = self.tracker.synchronize().err().map(Error::from);
            let agreement = self.rt.agreement()?;
            let ask = Ask {
                op: Op::Free,
                bytes: self.num_bytes() as u64,
                align: 0,
                offset: agreement.offset(self.device_address()),
                refused: refusal.is_some(),
            };
            // Not `bind_to_thread`, here or after the agreement: it would first fail with an
            // unrelated error recorded in the context (by any thread), and this PE would leave
            // the others waiting in the agreement, or keep the buffer while they free it.
            gpucomm_ordering::make_current(self.rt.context())?;
            agreement.agree(ask)?.check(Op::Free, refusal)?;
            // SAFETY: the pointer came from nvshmem_malloc/align of this runtime; no queued
            // work uses it (its streams were waited for); every PE frees the buffer at the same
            // offset and of the same size (agreed above); `self` is consumed on success, so
            // nothing refers to it afterwards; the PE's context is current (made so before the
            // agreement, which makes no other current). If the function does not resolve,
            // nothing is called and the buffer is handed back intact.
            unsafe { call!(nvshmem_free(self.ptr.as_ptr())) }
        })();
        match freed {
            Ok(()) => {
                self.rt.heap_use.remove(self.held);
                self.released = true;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }
}

impl<T> Drop for Symmetric<'_, T> {
    fn drop(&mut self) {
        if !self.released {
            log::warn!(
                "nvshmem: a symmetric buffer of {} bytes was dropped without Symmetric::free; it stays allocated \
                 until NVSHMEM is finalised (freeing in Drop could break the collective free order)",
                self.num_bytes()
            );
        }
    }
}

tracked_device_ptr!(['rt, T] Symmetric<'rt, T>, |b| {
    // SAFETY: `len` elements from nvshmem_malloc on the runtime's device, freed only by `free`
    // after `tracker.synchronize()`; every use goes through `tracker`; the buffer and its views
    // borrow the runtime, which is not `Sync`, so they all stay on one thread.
    unsafe { Tracked::new(b.device_address(), b.len, &b.tracker, b.rt.stream()) }
});

/// A sub-range of a [`Symmetric`] buffer ([`Symmetric::slice`]): symmetric too, so operations
/// accept it wherever they accept the whole buffer, and ordered by the buffer's tracker.
pub struct SymmetricSlice<'a, T> {
    ptr: CUdeviceptr,
    len: usize,
    tracker: &'a StreamTracker,
    rt: &'a Runtime,
    _elem: PhantomData<T>,
}

impl<T> std::fmt::Debug for SymmetricSlice<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricSlice").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

impl<'a, T> SymmetricSlice<'a, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The local address of the range ([`Symmetric::device_address`]).
    pub fn device_address(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Elements `range` of this slice ([`Symmetric::slice`]).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<SymmetricSlice<'a, T>> {
        let (start, end) = bounds(range, self.len)?;
        let ptr = self.ptr + (start * size_of::<T>()) as CUdeviceptr;
        Ok(SymmetricSlice { ptr, len: end - start, tracker: self.tracker, rt: self.rt, _elem: PhantomData })
    }

    /// A load/store view of `pe`'s copy of this range ([`Symmetric::peer`]).
    #[doc(alias = "nvshmem_ptr")]
    pub fn peer(&self, pe: usize) -> Result<Option<PeerView<'a, T>>> {
        let pe = self.rt.check_pe("pe", pe)?;
        // SAFETY: `self.ptr` lies inside a live symmetric allocation and `pe` is in range;
        // nvshmem_ptr only computes an address.
        let peer = unsafe { call!(nvshmem_ptr(self.ptr as *const c_void, pe)) }?;
        Ok((!peer.is_null()).then(|| PeerView {
            ptr: peer as CUdeviceptr,
            len: self.len,
            tracker: self.tracker,
            home: self.rt.stream(),
            _thread: PhantomData,
            _elem: PhantomData,
        }))
    }
}

tracked_device_ptr!(['v, T] SymmetricSlice<'v, T>, |b| {
    // SAFETY: a checked range of a symmetric buffer that the slice borrows; its tracker orders it;
    // like the buffer, the slice stays on the runtime's thread (it borrows the runtime).
    unsafe { Tracked::new(b.ptr, b.len, b.tracker, b.rt.stream()) }
});

/// Another PE's copy of a symmetric buffer (or range), mapped into this PE's address space by
/// NVLink or PCIe peer-to-peer ([`Symmetric::peer`]). cudarc kernels and copies accept it
/// ([`DevicePtr`](cudarc::driver::DevicePtr) / [`DevicePtrMut`](cudarc::driver::DevicePtrMut)); their
/// uses are ordered with this process's other uses of the buffer. Nothing orders them with what
/// the peer does to its copy: synchronise with the peer first (a barrier, a signal).
///
/// Like the buffer it views, a `PeerView` stays on the runtime's thread (it is neither `Send` nor
/// `Sync`): its tracker's waits can run NVSHMEM's quiet, and NVSHMEM is initialised
/// `NVSHMEM_THREAD_SERIALIZED`.
pub struct PeerView<'a, T> {
    ptr: CUdeviceptr,
    len: usize,
    tracker: &'a StreamTracker,
    home: &'a Arc<CudaStream>,
    /// Neither `Send` nor `Sync`, like the buffer (which borrows the runtime, not `Sync`).
    _thread: PhantomData<*const ()>,
    _elem: PhantomData<T>,
}

impl<T> std::fmt::Debug for PeerView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerView").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

impl<T> PeerView<'_, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

tracked_device_ptr!(['v, T] PeerView<'v, T>, |b| {
    // SAFETY: `nvshmem_ptr`'s mapping of a peer's copy of a range the view borrows (so the
    // allocation lives), valid on this device for `len` elements; this process's uses are ordered
    // by the buffer's tracker; the view stays on the runtime's thread (neither `Send` nor `Sync`).
    unsafe { Tracked::new(b.ptr, b.len, b.tracker, b.home) }
});

/// Memory on the symmetric heap — a [`Symmetric`] buffer or a [`SymmetricSlice`] of one — which
/// NVSHMEM can address on every PE. Sealed: only this crate's symmetric types implement it.
pub trait SymmetricMemory<T>: DeviceBufferMut<T> + sealed::Sealed {
    /// The tracker of the buffer's allocation. Not for use outside this crate.
    #[doc(hidden)]
    fn tracker(&self) -> &StreamTracker;

    /// The whole range as a slice, through which an operation that writes the symmetric memory
    /// on some PE (a put's destination, a signal) records a write. Not for use outside this crate.
    #[doc(hidden)]
    fn symmetric(&self) -> SymmetricSlice<'_, T>;
}

impl<T> sealed::Sealed for Symmetric<'_, T> {}
impl<T> SymmetricMemory<T> for Symmetric<'_, T> {
    fn tracker(&self) -> &StreamTracker {
        &self.tracker
    }

    fn symmetric(&self) -> SymmetricSlice<'_, T> {
        self.as_slice()
    }
}
impl<T> sealed::Sealed for SymmetricSlice<'_, T> {}
impl<T> SymmetricMemory<T> for SymmetricSlice<'_, T> {
    fn tracker(&self) -> &StreamTracker {
        self.tracker
    }

    fn symmetric(&self) -> SymmetricSlice<'_, T> {
        SymmetricSlice { ptr: self.ptr, len: self.len, tracker: self.tracker, rt: self.rt, _elem: PhantomData }
    }
}

// SAFETY: an owned buffer keeps its allocation (which is never freed by a drop, only by `free`,
// which consumes it).
unsafe impl<T> Keep for Symmetric<'_, T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.write(self);
    }
}

// SAFETY: a slice borrows its buffer for its whole life.
unsafe impl<T> Keep for SymmetricSlice<'_, T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.write(self);
    }
}

// SAFETY: a peer view borrows its buffer for its whole life.
unsafe impl<T> Keep for PeerView<'_, T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.write(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;
    const STATIC: HeapLimit = HeapLimit::static_of(GIB);
    const GRANULE: usize = 512 << 20;
    /// An 8 GiB dynamic heap with 1 GiB reserved for NVSHMEM.
    const DYNAMIC: HeapLimit = HeapLimit {
        dynamic: true,
        limit: 8 * GIB,
        limit_from: "NVSHMEM_MAX_MEMORY_PER_GPU",
        reserved: 2 * GRANULE,
        granularity: GRANULE,
        malloc_alignment: 0,
    };

    /// Session 21 audit: with `NVSHMEM_ENABLE_ALIGNED_MALLOC` NVSHMEM 3.4.5 aligns every
    /// `nvshmem_malloc` to its granularity (`heap_malloc`), which the check did not count: a
    /// request it passed could grow the dynamic heap past its size, which tears the heap down
    /// (and on the static heap, 512 MiB of alignment by default, get no buffer).
    #[test]
    fn aligned_malloc_counts_the_granularity() {
        let aligned = HeapLimit { malloc_alignment: GRANULE, ..DYNAMIC };
        // 6.5 GiB of the 7 after the reserve: fits plainly, not with a granule of alignment more.
        let bytes = 13 * GRANULE;
        assert_eq!(check_size::<u8>(bytes, &Alloc::Malloc, 0, DYNAMIC).unwrap().bytes, bytes);
        for how in [Alloc::Malloc, Alloc::Zeroed] {
            let e = check_size::<u8>(bytes, &how, 0, aligned).unwrap_err();
            assert!(matches!(e, Error::HeapExhausted { bytes: b, .. } if b == 14 * GRANULE), "{e}");
        }
        assert_eq!(check_size::<u8>(12 * GRANULE, &Alloc::Malloc, 0, aligned).unwrap().bytes, 12 * GRANULE);
        // The static heap of 1 GiB with NVSHMEM's default 512 MiB granularity: half of it and one
        // byte no longer fits.
        let aligned = HeapLimit { malloc_alignment: GRANULE, ..STATIC };
        assert_eq!(check_size::<u8>(GIB / 2, &Alloc::Malloc, 0, aligned).unwrap().bytes, GIB / 2);
        assert!(matches!(check_size::<u8>(GIB / 2 + 1, &Alloc::Malloc, 0, aligned), Err(Error::HeapExhausted { .. })));
    }

    #[test]
    fn an_alignment_counts_against_the_heap_limit() {
        // One byte aligned to 1 TiB: NVSHMEM may need 1 TiB + 1 of the heap (a 512-byte chunk
        // more), which exits the process on a static heap of 1 GiB.
        let e = check_size::<u8>(1, &Alloc::Align(1 << 40), 0, STATIC).unwrap_err();
        assert!(
            matches!(e, Error::HeapExhausted { bytes, in_use: 0, limit: GIB, .. } if bytes == (1 << 40) + 512),
            "{e}"
        );
        // Size plus alignment must fit what is left: exactly fits, one byte more does not.
        assert_eq!(check_size::<u32>(1024, &Alloc::Align(4096), GIB - 8192, STATIC).unwrap().bytes, 4096);
        let e = check_size::<u32>(1025, &Alloc::Align(4096), GIB - 8192, STATIC).unwrap_err();
        assert!(matches!(e, Error::HeapExhausted { bytes: 8704, .. }), "{e}");
        // Without an alignment only the size counts.
        assert_eq!(check_size::<u8>(GIB, &Alloc::Malloc, 0, STATIC).unwrap().bytes, GIB);
        assert!(matches!(check_size::<u8>(GIB + 1, &Alloc::Zeroed, 0, STATIC), Err(Error::HeapExhausted { .. })));
    }

    /// Audit: the dynamic heap's check accepted a request that filled the limit exactly, and counted
    /// neither NVSHMEM's own buffers nor the granules NVSHMEM maps (it fails, tearing the heap down,
    /// at `mapped + step >= size`). Now the reserve and whole granules count, and the sum must stay
    /// below the limit.
    #[test]
    fn the_dynamic_heap_check_counts_the_reserve_and_granules() {
        // 7 GiB after the reserve: a request that fills them is refused, one granule less passes.
        let e = check_size::<u8>(7 * GIB, &Alloc::Malloc, 0, DYNAMIC).unwrap_err();
        assert!(
            matches!(e, Error::HeapExhausted { bytes, in_use: 0, reserved, limit, .. }
                if (bytes, reserved, limit) == (7 * GIB, GIB, 8 * GIB)),
            "{e}"
        );
        assert_eq!(check_size::<u8>(7 * GIB - GRANULE, &Alloc::Malloc, 0, DYNAMIC).unwrap().bytes, 7 * GIB - GRANULE);
        // One byte takes a granule: it does not fit next to 6.5 GiB of buffers.
        assert_eq!(check_size::<u8>(1, &Alloc::Zeroed, 13 * GRANULE - 1, DYNAMIC).unwrap().bytes, 1);
        let e = check_size::<u8>(1, &Alloc::Zeroed, 13 * GRANULE, DYNAMIC).unwrap_err();
        assert!(matches!(e, Error::HeapExhausted { bytes: GRANULE, .. }), "{e}");
        // Size plus alignment, rounded up: 4 KiB aligned to 512 MiB takes two granules.
        let e = check_size::<u32>(1024, &Alloc::Align(GRANULE), 12 * GRANULE, DYNAMIC).unwrap_err();
        assert!(matches!(e, Error::HeapExhausted { bytes, .. } if bytes == 2 * GRANULE), "{e}");
        assert_eq!(check_size::<u32>(1024, &Alloc::Align(GRANULE), 12 * GRANULE - 1, DYNAMIC).unwrap().bytes, 4096);
    }

    /// Session 29 audit: the bytes in use counted each live buffer by its size, while NVSHMEM's
    /// allocator holds size + alignment of an aligned one (it gives back only the part before
    /// the aligned address) and rounds every request up to 512 bytes. Live buffers of one byte
    /// aligned to 256 MiB each grew the dynamic heap by up to 256 MiB and counted 1 byte: every
    /// request passed until NVSHMEM's `mapped + step >= size` tore the heap down, every live
    /// buffer with it. Now a buffer counts what it holds, and the 27th such request is refused.
    #[test]
    fn live_buffers_count_what_they_hold_of_the_heap() {
        let align = 256 << 20;
        let mut in_use = 0;
        let mut granted = 0;
        let refused = loop {
            match check_size::<u8>(1, &Alloc::Align(align), in_use, DYNAMIC) {
                Ok(Request { bytes, held }) => {
                    assert_eq!((bytes, held), (1, align + CHUNK));
                    in_use += held;
                    granted += 1;
                    assert!(granted <= 64, "never refused: {in_use} bytes counted in use");
                }
                Err(e) => break e,
            }
        };
        // 7 GiB after the reserve; each request takes a granule (512 MiB) beyond what is held.
        assert_eq!(granted, 26);
        assert!(matches!(refused, Error::HeapExhausted { bytes: GRANULE, in_use: u, .. } if u == 26 * (align + CHUNK)));
        // Plain buffers hold whole chunks: 1 byte holds 512, 513 bytes hold 1024.
        let plain = |len| check_size::<u8>(len, &Alloc::Malloc, 0, DYNAMIC).unwrap();
        assert_eq!(plain(1), Request { bytes: 1, held: CHUNK });
        assert_eq!(plain(513), Request { bytes: 513, held: 2 * CHUNK });
        assert_eq!(plain(GRANULE), Request { bytes: GRANULE, held: GRANULE });
    }

    #[test]
    fn alignments_and_sizes_are_checked() {
        let e = check_size::<u8>(8, &Alloc::Align(48), 0, STATIC).unwrap_err();
        assert!(matches!(e, Error::InvalidAlignment { align: 48, min: 1 }), "{e}");
        let e = check_size::<u64>(8, &Alloc::Align(4), 0, STATIC).unwrap_err();
        assert!(matches!(e, Error::InvalidAlignment { align: 4, min: 8 }), "{e}");
        let e = check_size::<u8>(usize::MAX - 1, &Alloc::Align(4), 0, STATIC).unwrap_err();
        assert!(matches!(e, Error::AlignedSizeOverflow { bytes, align: 4 } if bytes == usize::MAX - 1), "{e}");
        let e = check_size::<u32>(usize::MAX, &Alloc::Malloc, 0, STATIC).unwrap_err();
        assert!(matches!(e, Error::SizeOverflow { len: usize::MAX, elem_size: 4 }), "{e}");
        let e = check_size::<u32>(0, &Alloc::Align(4), 0, STATIC).unwrap_err();
        assert!(matches!(e, Error::ZeroSize { len: 0, elem_size: 4 }), "{e}");
    }

    #[test]
    fn ranges_are_checked() {
        assert_eq!(bounds(.., 8).unwrap(), (0, 8));
        assert_eq!(bounds(2..5, 8).unwrap(), (2, 5));
        assert_eq!(bounds(2..=7, 8).unwrap(), (2, 8));
        assert_eq!(bounds(8.., 8).unwrap(), (8, 8));
        assert!(matches!(bounds(5..20, 16), Err(Error::OutOfBounds { start: 5, end: 20, len: 16 })));
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 6..4;
        assert!(matches!(bounds(reversed, 16), Err(Error::OutOfBounds { start: 6, end: 4, len: 16 })));
        assert!(matches!(bounds(..=usize::MAX, 16), Err(Error::OutOfBounds { end: usize::MAX, .. })));
    }
}
