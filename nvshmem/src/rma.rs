//! One-sided operations on a stream: puts and gets (blocking and `_nbi`), puts with a signal,
//! signal updates and waits, quiet, and the world barrier and sync.
//!
//! Every call checks its arguments first (lengths, PE, the stream's and the buffers' device; for
//! a target PE reached over a network transport, that the local buffer is symmetric or
//! registered), binds the PE's CUDA context, takes the buffers' pointers through
//! [`gpucomm_ordering::Access`] (so that uses on other streams are waited for, a capture not
//! opened by [`crate::capture`] is refused, and inside one the runtime and buffers are recorded
//! for the graph), and only then enqueues the NVSHMEM operation.
//!
//! # Completion and ordering
//!
//! An operation enqueued on a stream starts when the stream reaches it. A blocking put or get
//! (`*_on_stream`) has finished with its local buffer when the stream moves past it. A `_nbi` one
//! hands its copy to one of NVSHMEM's internal streams and returns a [`Pending`] handle that
//! borrows the local buffer: the buffer is in use until the handle enqueues
//! `nvshmemx_quiet_on_stream` ([`Pending::quiet`], or its drop), which makes the stream wait for
//! the internal copy. The local side of a `_nbi` operation is symmetric memory, whose stream
//! tracker also remembers the operation: if the handle is forgotten (`mem::forget`), the next use
//! of the buffer on any stream, and its free, enqueue the quiet first, so the quiet cannot be
//! skipped. Inside [`crate::capture`], a forgotten handle's quiet is captured before the next
//! captured use of the buffer, or else at the end of the capture, so every launch of the graph
//! completes the operation before the buffer is reused.
//!
//! NVSHMEM forgets its non-blocking copies at any quiet or barrier, on whatever stream: the crate
//! chains these calls so that each one still waits for what was issued before it on every
//! stream, and refuses NVSHMEM calls outside a capture that holds captured `_nbi` copies until it
//! ends ([`Error::CopyStreamsCaptured`]; the rules are in `src/quiesce.rs`).
//!
//! Remote completion — the data visible at the other PE — needs a quiet (for the PE that issued
//! it) and a synchronisation with the other PE: a barrier ([`Runtime::barrier_all_on_stream`],
//! [`crate::Team::barrier_on_stream`]) or a signal the other PE waits for
//! ([`Runtime::signal_wait_until_on_stream`]). NVSHMEM has no on-stream fence
//! (`nvshmem_fence` orders host-initiated operations only): on a stream, a put with a signal is
//! the way to deliver data and a flag in order.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DeviceRepr, DeviceSlice};
use gpucomm_ordering::{Access, DeviceBuffer, DeviceBufferMut, Resource, StreamTracker};
use nvshmem_sys::{cudaStream_t, nvshmemi_cmp_type, nvshmemx_signal_op_t};

use crate::error::{Error, Result};
use crate::ffi::call;
use crate::overlap::{self, Span};
use crate::quiesce;
use crate::register;
use crate::runtime::Admitted;
use crate::{Runtime, SymmetricMemory};

/// How a signal word is updated (`NVSHMEM_SIGNAL_SET`, `NVSHMEM_SIGNAL_ADD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[doc(alias = "nvshmemx_signal_op_t")]
pub enum SignalOp {
    /// Store the value (`NVSHMEM_SIGNAL_SET`).
    #[doc(alias = "NVSHMEM_SIGNAL_SET")]
    Set,
    /// Add the value (`NVSHMEM_SIGNAL_ADD`).
    #[doc(alias = "NVSHMEM_SIGNAL_ADD")]
    Add,
}

impl SignalOp {
    /// The C constant.
    pub fn raw(self) -> i32 {
        let op = match self {
            SignalOp::Set => nvshmemx_signal_op_t::NVSHMEM_SIGNAL_SET,
            SignalOp::Add => nvshmemx_signal_op_t::NVSHMEM_SIGNAL_ADD,
        };
        op.0 as i32
    }
}

/// A comparison for waits (`NVSHMEM_CMP_*`): the wait ends when `signal <cmp> value` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[doc(alias = "nvshmemi_cmp_type")]
pub enum Cmp {
    /// `==` (`NVSHMEM_CMP_EQ`).
    #[doc(alias = "NVSHMEM_CMP_EQ")]
    Eq,
    /// `!=` (`NVSHMEM_CMP_NE`).
    #[doc(alias = "NVSHMEM_CMP_NE")]
    Ne,
    /// `>` (`NVSHMEM_CMP_GT`).
    #[doc(alias = "NVSHMEM_CMP_GT")]
    Gt,
    /// `>=` (`NVSHMEM_CMP_GE`).
    #[doc(alias = "NVSHMEM_CMP_GE")]
    Ge,
    /// `<` (`NVSHMEM_CMP_LT`).
    #[doc(alias = "NVSHMEM_CMP_LT")]
    Lt,
    /// `<=` (`NVSHMEM_CMP_LE`).
    #[doc(alias = "NVSHMEM_CMP_LE")]
    Le,
}

impl Cmp {
    /// The C constant.
    pub fn raw(self) -> i32 {
        let cmp = match self {
            Cmp::Eq => nvshmemi_cmp_type::NVSHMEM_CMP_EQ,
            Cmp::Ne => nvshmemi_cmp_type::NVSHMEM_CMP_NE,
            Cmp::Gt => nvshmemi_cmp_type::NVSHMEM_CMP_GT,
            Cmp::Ge => nvshmemi_cmp_type::NVSHMEM_CMP_GE,
            Cmp::Lt => nvshmemi_cmp_type::NVSHMEM_CMP_LT,
            Cmp::Le => nvshmemi_cmp_type::NVSHMEM_CMP_LE,
        };
        cmp.0 as i32
    }
}

/// `Ok` when a buffer has the length the call needs.
pub(crate) fn expect_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::LengthMismatch { what, expected, got })
    }
}

/// A signal is one `u64` of symmetric memory.
fn check_signal(signal: &impl SymmetricMemory<u64>) -> Result<()> {
    expect_len("signal", 1, signal.len())
}

impl Runtime {
    /// The checks every transfer shares: the local buffer's length and device, the PE, the
    /// stream's device; then binds the context. Returns the PE and the stream as C wants them.
    fn transfer<T>(
        &self,
        symmetric_len: usize,
        local: &impl DeviceSlice<T>,
        pe: usize,
        admitted: &Admitted<'_>,
    ) -> Result<(i32, nvshmem_sys::cudaStream_t)> {
        expect_len("local buffer", symmetric_len, local.len())?;
        self.check_device("local buffer", local.stream())?;
        let pe = self.check_pe("pe", pe)?;
        Ok((pe, self.enqueue_on(admitted)?))
    }

    /// Checks and enqueues `nvshmemx_putmem_on_stream` or its `_nbi` variant.
    fn putmem<T>(
        &self,
        nbi: bool,
        dst: &impl SymmetricMemory<T>,
        src: &impl DeviceBuffer<T>,
        pe: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let access = Access::new(stream);
        let admitted = Admitted::access(&access, self.resource())?;
        let (pe, raw) = self.transfer(dst.len(), src, pe, &admitted)?;
        // The destination is written on `pe`: recorded as a write of the symmetric memory.
        let bytes = dst.num_bytes();
        let target = dst.tracker();
        let mut dst = dst.symmetric();
        let (d, _d) = access.write(&mut dst)?;
        let (s, _s) = access.read(src)?;
        let source = Span::new("source", s, bytes);
        let mapped = overlap::on_pe(Span::new("destination (on the target PE)", d, bytes), pe)?;
        if let Some(target) = mapped {
            overlap::disjoint(target, source)?;
        }
        self.check_local(source, pe, mapped.is_some())?;
        let (d, s) = (d as *mut c_void, s as *const c_void);
        // SAFETY: `dst` is symmetric, so the same range exists on `pe`; both ranges hold
        // `src.len()` elements (checked), the source on this device (checked) and apart from the
        // destination (checked where this PE maps the target's memory; elsewhere the source, local
        // memory, cannot be part of it, and is symmetric or registered, as the network transports
        // need: checked); both stay borrowed until the guards record after the enqueue; `pe` is in
        // range; the context is current.
        // For `_nbi`, NVSHMEM reads the source on an internal stream until a quiet on this stream:
        // the caller marks `src` (symmetric) pending with `nonblocking`, so that its next use and
        // its free enqueue that quiet first, and hands out a `Pending` that enqueues it.
        let enqueue = || unsafe {
            if nbi {
                call!(nvshmemx_putmem_nbi_on_stream(d, s, bytes, pe, raw))
            } else {
                call!(nvshmemx_putmem_on_stream(d, s, bytes, pe, raw))
            }
        };
        issue(nbi, stream, admitted.captured, enqueue)?;
        self.mark_target(nbi, mapped.is_some(), &[target], stream);
        Ok(())
    }

    /// Checks and enqueues `nvshmemx_getmem_on_stream` or its `_nbi` variant.
    fn getmem<T>(
        &self,
        nbi: bool,
        dst: &mut impl DeviceBufferMut<T>,
        src: &impl SymmetricMemory<T>,
        pe: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let access = Access::new(stream);
        let admitted = Admitted::access(&access, self.resource())?;
        let (pe, raw) = self.transfer(src.len(), dst, pe, &admitted)?;
        let bytes = src.num_bytes();
        let (s, _s) = access.read(src)?;
        let (d, _d) = access.write(dst)?;
        let destination = Span::new("destination", d, bytes);
        let mapped = overlap::on_pe(Span::new("source (on the target PE)", s, bytes), pe)?;
        if let Some(source) = mapped {
            overlap::disjoint(source, destination)?;
        }
        self.check_local(destination, pe, mapped.is_some())?;
        let (d, s) = (d as *mut c_void, s as *const c_void);
        // SAFETY: `src` is symmetric, so the range exists on `pe`; `dst` holds as many elements
        // (checked) on this device (checked), apart from the source (checked where this PE maps
        // the target's memory; elsewhere symmetric or registered, as the network transports need:
        // checked); both stay borrowed until the guards record after the enqueue; `pe` is in
        // range; the context is current. For `_nbi`, NVSHMEM writes the destination on an internal
        // stream until a quiet on this stream: the caller marks `dst` (symmetric) pending with
        // `nonblocking`, so that its next use and its free enqueue that quiet first, and hands out
        // a `Pending` that enqueues it.
        let enqueue = || unsafe {
            if nbi {
                call!(nvshmemx_getmem_nbi_on_stream(d, s, bytes, pe, raw))
            } else {
                call!(nvshmemx_getmem_on_stream(d, s, bytes, pe, raw))
            }
        };
        issue(nbi, stream, admitted.captured, enqueue)?;
        self.mark_target(nbi, mapped.is_some(), &[src.tracker()], stream);
        Ok(())
    }

    /// Checks and enqueues `nvshmemx_putmem_signal_on_stream` or its `_nbi` variant.
    #[allow(clippy::too_many_arguments)]
    fn putmem_signal<T>(
        &self,
        nbi: bool,
        dst: &impl SymmetricMemory<T>,
        src: &impl DeviceBuffer<T>,
        signal: &impl SymmetricMemory<u64>,
        value: u64,
        op: SignalOp,
        pe: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        check_signal(signal)?;
        let access = Access::new(stream);
        let admitted = Admitted::access(&access, self.resource())?;
        let (pe, raw) = self.transfer(dst.len(), src, pe, &admitted)?;
        // Destination and signal are written on `pe`: recorded as writes of the symmetric memory.
        let bytes = dst.num_bytes();
        let targets = [dst.tracker(), signal.tracker()];
        let (mut dst, mut signal) = (dst.symmetric(), signal.symmetric());
        let (d, _d) = access.write(&mut dst)?;
        let (s, _s) = access.read(src)?;
        let (sig, _sig) = access.write(&mut signal)?;
        let (data, flag) = (Span::new("destination", d, bytes), Span::new("signal", sig, size_of::<u64>()));
        // The signal announces the data: the two must not share a byte, on any PE.
        overlap::disjoint(flag, data)?;
        let source = Span::new("source", s, bytes);
        if let Some(target) = overlap::on_pe(Span { what: "destination (on the target PE)", ..data }, pe)? {
            overlap::disjoint(target, source)?;
        }
        // The signal is never empty: whether it is mapped says whether `pe`'s memory is.
        let mapped = overlap::on_pe(Span { what: "signal (on the target PE)", ..flag }, pe)?;
        if let Some(target) = mapped {
            overlap::disjoint(target, source)?;
        }
        self.check_local(source, pe, mapped.is_some())?;
        let (d, s, sig) = (d as *mut c_void, s as *const c_void, sig as *mut u64);
        // SAFETY: as for `putmem`; `signal` is one symmetric u64 (checked), apart from the
        // destination and the source (checked), `op` one of NVSHMEM's signal operations.
        let enqueue = || unsafe {
            if nbi {
                call!(nvshmemx_putmem_signal_nbi_on_stream(d, s, bytes, sig, value, op.raw(), pe, raw))
            } else {
                call!(nvshmemx_putmem_signal_on_stream(d, s, bytes, sig, value, op.raw(), pe, raw))
            }
        };
        issue(nbi, stream, admitted.captured, enqueue)?;
        self.mark_target(nbi, mapped.is_some(), &targets, stream);
        Ok(())
    }

    /// Copies `src` (local device memory of the same length) into `pe`'s copy of `dst`, in stream
    /// order (`nvshmemx_putmem_on_stream`). `src` may be reused once the stream is past the put;
    /// the data is visible at `pe` after a barrier (or quiet + signal). When this PE does not map
    /// `pe`'s memory (`pe` is reached over a network transport), `src` must be symmetric or lie
    /// inside one [`Runtime::register`]ed buffer ([`Error::LocalNotRegistered`]).
    #[doc(alias = "nvshmemx_putmem_on_stream")]
    pub fn put_on_stream<T: DeviceRepr>(
        &self,
        dst: &impl SymmetricMemory<T>,
        src: &impl DeviceBuffer<T>,
        pe: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.putmem(false, dst, src, pe, stream)
    }

    /// [`Runtime::put_on_stream`] without waiting for local completion
    /// (`nvshmemx_putmem_nbi_on_stream`). The source is symmetric memory, borrowed by the returned
    /// [`Pending`] until it enqueues the quiet that completes the put (see the module docs).
    #[doc(alias = "nvshmemx_putmem_nbi_on_stream")]
    pub fn put_nbi_on_stream<'a, T: DeviceRepr>(
        &'a self,
        dst: &impl SymmetricMemory<T>,
        src: &'a impl SymmetricMemory<T>,
        pe: usize,
        stream: &'a Arc<CudaStream>,
    ) -> Result<Pending<'a>> {
        self.putmem(true, dst, src, pe, stream)?;
        Ok(self.nonblocking(src.tracker(), stream))
    }

    /// Copies `pe`'s copy of `src` into `dst` (local device memory of the same length), in stream
    /// order (`nvshmemx_getmem_on_stream`). `dst` holds the data once the stream is past the get.
    /// When this PE does not map `pe`'s memory, `dst` must be symmetric or registered, as for
    /// [`Runtime::put_on_stream`]'s source.
    #[doc(alias = "nvshmemx_getmem_on_stream")]
    pub fn get_on_stream<T: DeviceRepr>(
        &self,
        dst: &mut impl DeviceBufferMut<T>,
        src: &impl SymmetricMemory<T>,
        pe: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.getmem(false, dst, src, pe, stream)
    }

    /// [`Runtime::get_on_stream`] without waiting for completion (`nvshmemx_getmem_nbi_on_stream`).
    /// The destination is symmetric memory, borrowed by the returned [`Pending`]: it holds the
    /// data once the stream is past the quiet the handle enqueues.
    #[doc(alias = "nvshmemx_getmem_nbi_on_stream")]
    pub fn get_nbi_on_stream<'a, T: DeviceRepr>(
        &'a self,
        dst: &'a mut impl SymmetricMemory<T>,
        src: &impl SymmetricMemory<T>,
        pe: usize,
        stream: &'a Arc<CudaStream>,
    ) -> Result<Pending<'a>> {
        self.getmem(true, dst, src, pe, stream)?;
        let dst: &'a _ = dst;
        Ok(self.nonblocking(dst.tracker(), stream))
    }

    /// Puts `src` into `pe`'s copy of `dst`, then updates `pe`'s copy of `signal` with `op` and
    /// `value`, in that order: once `pe` sees the signal change, the data is there
    /// (`nvshmemx_putmem_signal_on_stream`). `signal` is one `u64` of symmetric memory (e.g.
    /// `signals.slice(i..i + 1)?`). `src` is local memory, as for [`Runtime::put_on_stream`].
    #[doc(alias = "nvshmemx_putmem_signal_on_stream")]
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal_on_stream<T: DeviceRepr>(
        &self,
        dst: &impl SymmetricMemory<T>,
        src: &impl DeviceBuffer<T>,
        signal: &impl SymmetricMemory<u64>,
        value: u64,
        op: SignalOp,
        pe: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.putmem_signal(false, dst, src, signal, value, op, pe, stream)
    }

    /// [`Runtime::put_signal_on_stream`] without waiting for local completion
    /// (`nvshmemx_putmem_signal_nbi_on_stream`). The source is symmetric memory, borrowed by the
    /// returned [`Pending`] until it enqueues the quiet that completes the put.
    #[doc(alias = "nvshmemx_putmem_signal_nbi_on_stream")]
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal_nbi_on_stream<'a, T: DeviceRepr>(
        &'a self,
        dst: &impl SymmetricMemory<T>,
        src: &'a impl SymmetricMemory<T>,
        signal: &impl SymmetricMemory<u64>,
        value: u64,
        op: SignalOp,
        pe: usize,
        stream: &'a Arc<CudaStream>,
    ) -> Result<Pending<'a>> {
        self.putmem_signal(true, dst, src, signal, value, op, pe, stream)?;
        Ok(self.nonblocking(src.tracker(), stream))
    }

    /// Updates `pe`'s copy of `signal` with `op` and `value`, in stream order
    /// (`nvshmemx_signal_op_on_stream`).
    #[doc(alias = "nvshmemx_signal_op_on_stream")]
    pub fn signal_op_on_stream(
        &self,
        signal: &impl SymmetricMemory<u64>,
        value: u64,
        op: SignalOp,
        pe: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        check_signal(signal)?;
        let pe = self.check_pe("pe", pe)?;
        let access = Access::new(stream);
        let admitted = Admitted::access(&access, self.resource())?;
        let raw = self.enqueue_on(&admitted)?;
        // The signal is written on `pe`: recorded as a write of the symmetric memory.
        let mut signal = signal.symmetric();
        let (sig, _sig) = access.write(&mut signal)?;
        // SAFETY: `signal` is one symmetric u64 (checked), `pe` is in range, the stream is on this
        // device (checked) and its context current.
        unsafe { call!(nvshmemx_signal_op_on_stream(sig as *mut u64, value, op.raw(), pe, raw)) }
    }

    /// Makes `stream` wait until this PE's `signal` satisfies `signal <cmp> value`
    /// (`nvshmemx_signal_wait_until_on_stream`). The host does not block; work enqueued after it
    /// on the stream runs once the condition holds, and sees the data of every put-with-signal
    /// that set it. Refused with [`Error::NotSupportedWithLimitedMpg`] when several PEs share the
    /// GPU without MPS (NVSHMEM exits the process there).
    #[doc(alias = "nvshmemx_signal_wait_until_on_stream")]
    pub fn signal_wait_until_on_stream(
        &self,
        signal: &impl SymmetricMemory<u64>,
        cmp: Cmp,
        value: u64,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.check_not_limited_mpg("nvshmemx_signal_wait_until_on_stream")?;
        check_signal(signal)?;
        let access = Access::new(stream);
        let admitted = Admitted::access(&access, self.resource())?;
        let raw = self.enqueue_on(&admitted)?;
        let (sig, _sig) = access.read(signal)?;
        // SAFETY: `signal` is one symmetric u64 of this PE (checked), `cmp` one of NVSHMEM's
        // comparisons; the stream is on this device (checked) and its context current.
        unsafe { call!(nvshmemx_signal_wait_until_on_stream(sig as *mut u64, cmp.raw(), value, raw)) }
    }

    /// Completes, in stream order, every NVSHMEM operation this PE issued on `stream` before it
    /// (`nvshmemx_quiet_on_stream`): local buffers of `_nbi` operations may be reused, and puts
    /// are delivered.
    #[doc(alias = "nvshmemx_quiet_on_stream")]
    #[doc(alias = "nvshmem_quiet")]
    #[doc(alias = "nvshmem_fence")]
    pub fn quiet_on_stream(&self, stream: &CudaStream) -> Result<()> {
        // SAFETY: NVSHMEM is initialised; the stream is on this device and its context current.
        self.quiesce_on(stream, self.resource(), false, |raw| unsafe { call!(nvshmemx_quiet_on_stream(raw)) }).map(drop)
    }

    /// Enqueues a barrier over all PEs on `stream` (`nvshmemx_barrier_all_on_stream`): when it
    /// completes, every PE's earlier operations on its stream, puts included, are complete and
    /// visible. Collective. Captured into a graph, it covers, when the graph runs, the operations
    /// captured before it: quiet an earlier non-blocking operation before launching the graph.
    /// Like every collective this crate enqueues, it runs after the collectives enqueued before it
    /// on other streams (see [`crate::Team`]). Captured in a limited-MPG run (several PEs on one
    /// GPU without MPS) it is refused with [`Error::NotSupportedWithLimitedMpg`]: NVSHMEM then
    /// waits for the other PEs' events, which a capture cannot.
    #[doc(alias = "nvshmemx_barrier_all_on_stream")]
    pub fn barrier_all_on_stream(&self, stream: &CudaStream) -> Result<()> {
        // SAFETY: NVSHMEM is initialised; the stream is on this device and its context current.
        self.quiesce_on(stream, self.resource(), true, |raw| unsafe { call!(nvshmemx_barrier_all_on_stream(raw)) })
            .map(drop)
    }

    /// Enqueues `call`, a quiescing call (a quiet, or a barrier: `collective`; given the stream's
    /// handle), on `stream` through the quiet chain ([`quiesce::quiescing`], or
    /// [`quiesce::collective`] for a barrier), inside this thread's capture scope if it captures
    /// `stream` (recording that the call uses `resource`), and then tells the scope that the
    /// non-blocking operations issued before it are complete. `Ok(true)` when the call was
    /// captured.
    pub(crate) fn quiesce_on(
        &self,
        stream: &CudaStream,
        resource: Resource,
        collective: bool,
        call: impl FnOnce(cudaStream_t) -> Result<()>,
    ) -> Result<bool> {
        let admitted = Admitted::stream(stream, resource)?;
        if collective && admitted.captured {
            // In a limited-MPG run NVSHMEM syncs the PEs sharing the GPU through a host barrier
            // and waits for their events recorded outside the capture: CUDA refuses that inside a
            // capture, and NVSHMEM exits the process on the refusal.
            self.check_not_limited_mpg("nvshmemx_barrier_all_on_stream, captured")?;
        }
        let raw = self.enqueue_on(&admitted)?;
        if collective {
            quiesce::collective(stream.cu_stream(), admitted.captured.then_some(stream), true, || call(raw))?;
        } else {
            quiesce::quiescing(stream.cu_stream(), admitted.captured, || call(raw))?;
        }
        // SAFETY: a quiet or a barrier, either of which completes every operation this PE issued
        // before it, was just enqueued on `stream`.
        unsafe { gpucomm_ordering::captured_completion(stream) };
        Ok(admitted.captured)
    }

    /// Enqueues a synchronisation of all PEs on `stream` (`nvshmemx_sync_all_on_stream`): a
    /// rendezvous only, which completes no outstanding operations (use a barrier for that).
    /// Collective, and ordered after the collectives enqueued before it on other streams (see
    /// [`crate::Team`]).
    #[doc(alias = "nvshmemx_sync_all_on_stream")]
    pub fn sync_all_on_stream(&self, stream: &CudaStream) -> Result<()> {
        let admitted = Admitted::stream(stream, self.resource())?;
        if admitted.captured {
            // As for a captured barrier over all PEs (`quiesce_on`).
            self.check_not_limited_mpg("nvshmemx_sync_all_on_stream, captured")?;
        }
        let raw = self.enqueue_on(&admitted)?;
        // SAFETY: NVSHMEM is initialised; the stream is on this device and its context current.
        quiesce::collective(stream.cu_stream(), admitted.captured.then_some(stream), false, || unsafe {
            call!(nvshmemx_sync_all_on_stream(raw))
        })
    }
}

impl Runtime {
    /// The handle of a `_nbi` operation just enqueued on `stream`, whose local buffer has the
    /// tracker `local`. Inside a capture the scope is told, and captures the quiet before the next
    /// captured use of the buffer, or at its end, if none is captured after the operation;
    /// otherwise the tracker remembers the operation, so
    /// that its quiet is enqueued before the buffer's next use or free even if the handle is
    /// forgotten.
    fn nonblocking<'a>(&'a self, local: &'a StreamTracker, stream: &'a Arc<CudaStream>) -> Pending<'a> {
        let local = (!mark_nonblocking(local, stream)).then_some(local);
        Pending { rt: self, stream, local, done: false }
    }

    /// After a `_nbi` operation (`nbi`) whose target PE's memory this PE maps (`mapped`: this PE
    /// itself, or a peer over NVLink or PCIe), marks the symmetric memory it reaches there
    /// (`targets`: a put's destination and signal, a get's source) as the operation's until its
    /// quiet, like its local buffer: NVSHMEM copies on an internal stream, behind the back of the
    /// stream order that these trackers recorded when the call took the pointers, and this
    /// process can use that memory through the same trackers ([`crate::Symmetric::peer`]).
    /// Memory reached over a network transport is only the target PE's to use, and to order (a
    /// barrier, a signal).
    #[inline]
    fn mark_target(&self, nbi: bool, mapped: bool, targets: &[&StreamTracker], stream: &Arc<CudaStream>) {
        if nbi && mapped {
            for t in targets {
                mark_nonblocking(t, stream);
            }
        }
    }

    /// `Ok` when NVSHMEM can use `local`, the local buffer of a transfer to `pe` (from
    /// [`Runtime::check_pe`]), whose memory this PE maps or not (`mapped`): see
    /// [`register::check_local`]. Only a target that is not mapped asks NVSHMEM anything.
    #[inline]
    fn check_local(&self, local: Span, pe: i32, mapped: bool) -> Result<()> {
        // Both numbers are PEs NVSHMEM counted (with an `int`): not negative, and below `i32::MAX`.
        let on_heap = || overlap::on_my_heap(local, self.my_pe() as i32);
        register::check_local(local, pe as usize, mapped, &self.registered, on_heap)
    }
}

/// Marks the memory of `tracker` as used by a `_nbi` operation just enqueued on `stream`, until
/// its quiet. Inside a capture the scope is told, and captures the quiet before the next captured
/// use of the memory, or at its end if none is captured after the operation (`true`); otherwise
/// the tracker remembers the operation, so that its quiet is enqueued before the memory's next
/// use or free, whatever becomes of the operation's handle.
fn mark_nonblocking(tracker: &StreamTracker, stream: &Arc<CudaStream>) -> bool {
    // SAFETY: `quiet` completes every non-blocking operation issued on `stream`, captured or not,
    // this one included, so it may replace the completion the scope held.
    if unsafe { gpucomm_ordering::captured_nonblocking(stream, tracker, quiet) } {
        return true;
    }
    // SAFETY: the operation took the memory's pointer through this tracker (its `Access`), which
    // enqueued the completion of the operation remembered before, if any; `quiet` completes every
    // non-blocking operation issued on `stream`, this one included.
    unsafe { tracker.pending(stream, quiet) };
    false
}

/// Runs `enqueue`, the checked call of a blocking operation or of its `_nbi` variant (`nbi`) on
/// `stream`: a `_nbi` one through the quiet chain ([`quiesce::nonblocking`]).
#[inline]
fn issue(nbi: bool, stream: &Arc<CudaStream>, captured: bool, enqueue: impl FnOnce() -> Result<()>) -> Result<()> {
    if nbi {
        quiesce::nonblocking(stream, captured, enqueue)
    } else {
        enqueue()
    }
}

/// `nvshmemx_quiet_on_stream` on `stream`, as a tracker (or a capture scope) enqueues it for a
/// forgotten [`Pending`].
fn quiet(stream: &CudaStream) -> std::result::Result<(), String> {
    let chained = || -> Result<()> {
        // Not cudarc's `bind_to_thread`, which would first fail with (and take) an unrelated error
        // recorded in the context, skipping the quiet.
        gpucomm_ordering::make_current(stream.context())?;
        let raw = stream.cu_stream();
        // No access admitted this stream: ask (refusing an invalidated capture, on which NVSHMEM
        // would exit).
        let captured = gpucomm_ordering::capturing(stream)?;
        // SAFETY: a tracker with a pending operation belongs to a symmetric buffer, and a capture
        // scope's operation was issued by a runtime the capture's closure borrows; either way
        // NVSHMEM is initialised. The stream is alive (held by the tracker, or borrowed by the
        // capture) and its context current.
        quiesce::quiescing(raw, captured, || unsafe { call!(nvshmemx_quiet_on_stream(raw as cudaStream_t)) })
    };
    chained().map_err(|e| e.to_string())
}

/// A `_nbi` operation in flight: it borrows the operation's local buffer until it enqueues
/// `nvshmemx_quiet_on_stream` on the operation's stream ([`Pending::quiet`], or when dropped, in
/// which case a failure is only logged). After that the stream, and everything ordered after it,
/// sees the operation complete. Forgetting it skips nothing: the local buffer's tracker remembers
/// the operation, and its next use or free enqueues the quiet first.
#[must_use = "the operation completes, and its local buffer is free again, only after the quiet this handle enqueues"]
pub struct Pending<'a> {
    rt: &'a Runtime,
    stream: &'a CudaStream,
    /// The tracker remembering the operation (none inside a capture).
    local: Option<&'a StreamTracker>,
    done: bool,
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("stream", &self.stream.cu_stream()).finish()
    }
}

impl Pending<'_> {
    /// Enqueues `nvshmemx_quiet_on_stream` on the operation's stream (which also completes every
    /// other operation this PE issued there).
    #[doc(alias = "nvshmemx_quiet_on_stream")]
    pub fn quiet(mut self) -> Result<()> {
        self.done = true;
        self.complete()
    }

    fn complete(&self) -> Result<()> {
        // SAFETY: NVSHMEM is initialised (the runtime is borrowed); the stream is on its device
        // (checked by `quiesce_on`) and its context current.
        let quiet = |raw| unsafe { call!(nvshmemx_quiet_on_stream(raw)) };
        let captured = self.rt.quiesce_on(self.stream, self.rt.resource(), false, quiet)?;
        match self.local {
            // An operation issued outside a capture whose quiet was captured into one: the quiet
            // runs only when the graph does, so the buffer's tracker keeps the operation, and its
            // next eager use or its free enqueues an eager quiet first.
            Some(_) if captured => {}
            // SAFETY: the quiet was just enqueued (eagerly) on this stream.
            Some(local) => unsafe { local.completed(self.stream) },
            None => {}
        }
        Ok(())
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.complete() {
                log::warn!("nvshmem: the quiet completing a non-blocking operation failed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_ops_and_comparisons_map_to_nvshmems_constants() {
        assert_eq!((SignalOp::Set.raw(), SignalOp::Add.raw()), (9, 10));
        let cmps = [Cmp::Eq, Cmp::Ne, Cmp::Gt, Cmp::Le, Cmp::Lt, Cmp::Ge].map(Cmp::raw);
        assert_eq!(cmps, [0, 1, 2, 3, 4, 5]);
    }
}
