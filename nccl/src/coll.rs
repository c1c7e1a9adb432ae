//! Collectives and point-to-point calls, with every argument NCCL does not check verified first:
//! buffer lengths (× the number of ranks where the call needs it), ranks, and devices.
//!
//! Each call follows cudarc's stream protocol: the buffers' pointers are taken with
//! `device_ptr(&stream)` / `device_ptr_mut(&stream)` (the stream first waits for earlier writers
//! of the buffer), and the returned guards, which record "in use until here" on drop, go to a
//! [`Sink`] only after NCCL returned. Outside a group the sink drops them at once (the kernel is
//! enqueued); inside a [`crate::Group`] it keeps them until after `ncclGroupEnd`.

use std::ffi::c_void;

use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use nccl_sys::{cudaStream_t, function, ncclResult_t, Library, MissingFunction, Nccl};

use crate::error::{lib, Error, Result};
use crate::types::check_type;
use crate::{Comm, NcclType, ReduceOp};

/// Where stream guards go once NCCL has accepted a call.
pub(crate) trait Sink<'a> {
    fn keep(&mut self, guard: SyncOnDrop<'a>);
}

/// Outside groups: the work is already enqueued, so the guards can record right away.
pub(crate) struct Immediate;

impl<'a> Sink<'a> for Immediate {
    fn keep(&mut self, guard: SyncOnDrop<'a>) {
        drop(guard);
    }
}

fn expect_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::LengthMismatch { what, expected, got })
    }
}

fn times(len: usize, ranks: usize) -> Result<usize> {
    len.checked_mul(ranks).ok_or(Error::CountOverflow { len, ranks })
}

impl Comm {
    /// Resolves an NCCL function for a call on elements of type `T`, checking that the loaded
    /// library knows `T`'s data type.
    fn resolve<T: NcclType, F: Copy + 'static>(
        &self,
        get: impl FnOnce(&'static Library<Nccl>) -> std::result::Result<&'static F, MissingFunction>,
    ) -> Result<F> {
        let lib = lib()?;
        check_type::<T>(lib.version())?;
        Ok(*get(lib)?)
    }

    /// After NCCL returned: hands the stream guards to the sink, then turns `rc` into a result.
    fn finish<'a, const N: usize>(
        &'a self,
        sink: &mut impl Sink<'a>,
        call: &'static str,
        rc: ncclResult_t,
        guards: [SyncOnDrop<'a>; N],
    ) -> Result<()> {
        for guard in guards {
            sink.keep(guard);
        }
        self.settle(call, rc, self.stream())
    }

    fn raw_stream(&self) -> cudaStream_t {
        self.stream().cu_stream() as cudaStream_t
    }

    fn check_device<T>(&self, what: &'static str, buf: &impl DeviceSlice<T>) -> Result<()> {
        let got = buf.stream().context().ordinal();
        if got == self.device() {
            Ok(())
        } else {
            Err(Error::WrongDevice { what, expected: self.device(), got })
        }
    }

    fn check_rank(&self, what: &'static str, rank: usize) -> Result<i32> {
        if rank < self.size() {
            Ok(rank as i32)
        } else {
            Err(Error::InvalidRank { what, rank, size: self.size() })
        }
    }

    /// Reduces `send` across all ranks with `op` and writes the result to `recv` on every rank
    /// (`ncclAllReduce`). Both buffers must have the same length and live on this communicator's
    /// device. Enqueued on [`Comm::stream`].
    #[doc(alias = "ncclAllReduce")]
    pub fn all_reduce<T: NcclType>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.direct(|s| self.enqueue_all_reduce(s, send, recv, op))
    }

    /// [`Comm::all_reduce`] with one buffer as both input and output.
    #[doc(alias = "ncclAllReduce")]
    pub fn all_reduce_in_place<T: NcclType>(&self, buf: &mut impl DevicePtrMut<T>, op: ReduceOp) -> Result<()> {
        self.direct(|s| self.enqueue_all_reduce_in_place(s, buf, op))
    }

    /// Copies `root`'s `buf` into `buf` on every other rank (`ncclBroadcast`, in place). Every
    /// rank passes a buffer of the same length.
    #[doc(alias = "ncclBroadcast")]
    #[doc(alias = "ncclBcast")]
    pub fn broadcast_in_place<T: NcclType>(&self, buf: &mut impl DevicePtrMut<T>, root: usize) -> Result<()> {
        self.direct(|s| self.enqueue_broadcast_in_place(s, buf, root))
    }

    /// Gathers every rank's `send` into `recv`, ordered by rank (`ncclAllGather`):
    /// `recv.len()` must be `send.len() × size()`.
    #[doc(alias = "ncclAllGather")]
    pub fn all_gather<T: NcclType>(&self, send: &impl DevicePtr<T>, recv: &mut impl DevicePtrMut<T>) -> Result<()> {
        self.direct(|s| self.enqueue_all_gather(s, send, recv))
    }

    /// Reduces `send` across ranks and leaves block `rank()` of the result in `recv`
    /// (`ncclReduceScatter`): `send.len()` must be `recv.len() × size()`.
    #[doc(alias = "ncclReduceScatter")]
    pub fn reduce_scatter<T: NcclType>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.direct(|s| self.enqueue_reduce_scatter(s, send, recv, op))
    }

    pub(crate) fn enqueue_all_reduce<'a, T: NcclType>(
        &'a self,
        sink: &mut impl Sink<'a>,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        expect_len("recv buffer", send.len(), recv.len())?;
        self.check_device("send buffer", send)?;
        self.check_device("recv buffer", recv)?;
        let f = self.resolve::<T, _>(|lib| function!(lib, ncclAllReduce))?;
        let (src, src_guard) = send.device_ptr(self.stream());
        let (dst, dst_guard) = recv.device_ptr_mut(self.stream());
        // SAFETY: both buffers hold `send.len()` elements of `T` (checked), live on this
        // communicator's device (checked), and stay borrowed until the guards are released by the
        // sink after NCCL enqueued the work; `T::DATA_TYPE` matches `T`'s size (sealed trait).
        let rc = unsafe {
            f(
                src as *const c_void,
                dst as *mut c_void,
                send.len(),
                T::DATA_TYPE.0,
                op.0,
                self.as_raw(),
                self.raw_stream(),
            )
        };
        self.finish(sink, "ncclAllReduce", rc, [src_guard, dst_guard])
    }

    pub(crate) fn enqueue_all_reduce_in_place<'a, T: NcclType>(
        &'a self,
        sink: &mut impl Sink<'a>,
        buf: &'a mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_device("buffer", buf)?;
        let f = self.resolve::<T, _>(|lib| function!(lib, ncclAllReduce))?;
        let len = buf.len();
        let (ptr, guard) = buf.device_ptr_mut(self.stream());
        // SAFETY: one buffer of `len` elements on this device serves as input and output, which
        // NCCL supports; it stays borrowed until the sink releases the guard after enqueue.
        let rc = unsafe {
            f(ptr as *const c_void, ptr as *mut c_void, len, T::DATA_TYPE.0, op.0, self.as_raw(), self.raw_stream())
        };
        self.finish(sink, "ncclAllReduce", rc, [guard])
    }

    pub(crate) fn enqueue_broadcast_in_place<'a, T: NcclType>(
        &'a self,
        sink: &mut impl Sink<'a>,
        buf: &'a mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<()> {
        let root = self.check_rank("root", root)?;
        self.check_device("buffer", buf)?;
        let f = self.resolve::<T, _>(|lib| function!(lib, ncclBroadcast))?;
        let len = buf.len();
        let (ptr, guard) = buf.device_ptr_mut(self.stream());
        // SAFETY: in-place broadcast of `len` elements on this device; `root` is in range; the
        // buffer stays borrowed until the guard is released after enqueue.
        let rc = unsafe {
            f(ptr as *const c_void, ptr as *mut c_void, len, T::DATA_TYPE.0, root, self.as_raw(), self.raw_stream())
        };
        self.finish(sink, "ncclBroadcast", rc, [guard])
    }

    pub(crate) fn enqueue_all_gather<'a, T: NcclType>(
        &'a self,
        sink: &mut impl Sink<'a>,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        expect_len("recv buffer", times(send.len(), self.size())?, recv.len())?;
        self.check_device("send buffer", send)?;
        self.check_device("recv buffer", recv)?;
        let f = self.resolve::<T, _>(|lib| function!(lib, ncclAllGather))?;
        let (src, src_guard) = send.device_ptr(self.stream());
        let (dst, dst_guard) = recv.device_ptr_mut(self.stream());
        // SAFETY: `send` holds `send.len()` elements and `recv` exactly `size()` times as many
        // (checked), both on this device and borrowed until the sink releases the guards.
        let rc = unsafe {
            f(src as *const c_void, dst as *mut c_void, send.len(), T::DATA_TYPE.0, self.as_raw(), self.raw_stream())
        };
        self.finish(sink, "ncclAllGather", rc, [src_guard, dst_guard])
    }

    pub(crate) fn enqueue_reduce_scatter<'a, T: NcclType>(
        &'a self,
        sink: &mut impl Sink<'a>,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        expect_len("send buffer", times(recv.len(), self.size())?, send.len())?;
        self.check_device("send buffer", send)?;
        self.check_device("recv buffer", recv)?;
        let f = self.resolve::<T, _>(|lib| function!(lib, ncclReduceScatter))?;
        let count = recv.len();
        let (src, src_guard) = send.device_ptr(self.stream());
        let (dst, dst_guard) = recv.device_ptr_mut(self.stream());
        // SAFETY: `send` holds exactly `size()` × `recv.len()` elements (checked), both buffers are
        // on this device and borrowed until the sink releases the guards.
        let rc = unsafe {
            f(src as *const c_void, dst as *mut c_void, count, T::DATA_TYPE.0, op.0, self.as_raw(), self.raw_stream())
        };
        self.finish(sink, "ncclReduceScatter", rc, [src_guard, dst_guard])
    }

    pub(crate) fn enqueue_send<'a, T: NcclType>(
        &'a self,
        sink: &mut impl Sink<'a>,
        send: &'a impl DevicePtr<T>,
        peer: usize,
    ) -> Result<()> {
        let peer = self.check_rank("peer", peer)?;
        self.check_device("send buffer", send)?;
        let f = self.resolve::<T, _>(|lib| function!(lib, ncclSend))?;
        let (src, guard) = send.device_ptr(self.stream());
        // SAFETY: `send` holds `send.len()` elements on this device, `peer` is in range, and the
        // buffer stays borrowed until the sink releases the guard after enqueue.
        let rc = unsafe { f(src as *const c_void, send.len(), T::DATA_TYPE.0, peer, self.as_raw(), self.raw_stream()) };
        self.finish(sink, "ncclSend", rc, [guard])
    }

    pub(crate) fn enqueue_recv<'a, T: NcclType>(
        &'a self,
        sink: &mut impl Sink<'a>,
        recv: &'a mut impl DevicePtrMut<T>,
        peer: usize,
    ) -> Result<()> {
        let peer = self.check_rank("peer", peer)?;
        self.check_device("recv buffer", recv)?;
        let f = self.resolve::<T, _>(|lib| function!(lib, ncclRecv))?;
        let len = recv.len();
        let (dst, guard) = recv.device_ptr_mut(self.stream());
        // SAFETY: NCCL writes at most `len` elements (the count passed) into a buffer of `len`
        // elements on this device, borrowed until the sink releases the guard.
        let rc = unsafe { f(dst as *mut c_void, len, T::DATA_TYPE.0, peer, self.as_raw(), self.raw_stream()) };
        self.finish(sink, "ncclRecv", rc, [guard])
    }
}
