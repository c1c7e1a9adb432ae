//! Groups: several NCCL calls issued as one (`ncclGroupStart` … `ncclGroupEnd`).
//!
//! Between the start and the outermost end NCCL only *records* calls; the kernels are enqueued
//! when the group ends. So buffers given to calls inside a group must stay alive, and the stream
//! events that mark "this buffer is in use until here" may only be recorded, after the end. The
//! closure-scoped [`group`] enforces both: calls are issued through a [`Group`] handle that
//! borrows every buffer for the whole `group` call and keeps cudarc's stream guards until after
//! `ncclGroupEnd` returns. Direct [`Comm`] calls on a thread that has a group open are refused
//! ([`Error::InsideGroup`]), and groups cannot nest.

use std::cell::Cell;
use std::marker::PhantomData;

use cudarc::driver::{DevicePtr, DevicePtrMut, SyncOnDrop};
use nccl_sys::function;

use crate::coll::{Immediate, Sink};
use crate::error::{check, lib, Error, Result};
use crate::{Comm, NcclType, ReduceOp};

thread_local! {
    static OPEN: Cell<bool> = const { Cell::new(false) };
}

/// True while this thread is inside [`group`].
pub(crate) fn is_open() -> bool {
    OPEN.with(Cell::get)
}

/// The handle through which calls join an open group. Not `Send`: NCCL requires one thread to
/// issue all operations of a group.
pub struct Group<'a> {
    guards: Vec<SyncOnDrop<'a>>,
    _one_thread: PhantomData<*const ()>,
}

impl<'a> Sink<'a> for Group<'a> {
    fn keep(&mut self, guard: SyncOnDrop<'a>) {
        self.guards.push(guard);
    }
}

/// Ends the group on every path out of [`group`], panics included.
struct EndOnDrop {
    end: Option<unsafe extern "C" fn() -> nccl_sys::ncclResult_t>,
}

impl EndOnDrop {
    fn end(&mut self) -> Result<()> {
        OPEN.with(|o| o.set(false));
        match self.end.take() {
            // SAFETY: this thread called ncclGroupStart successfully and has not ended the group.
            Some(f) => check("ncclGroupEnd", unsafe { f() }, None),
            None => Ok(()),
        }
    }
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        // Only reached without an explicit end when unwinding; the error cannot be reported.
        let _ = self.end();
    }
}

/// Runs `f` inside one NCCL group (`ncclGroupStart` / `ncclGroupEnd`) and returns its value.
///
/// Use it to drive several communicators from one thread (single-process multi-GPU, as created by
/// [`Comm::init_all`]) and to pair sends with receives. Every buffer passed to the [`Group`] stays
/// borrowed until `group` returns, and its stream guards are released only after NCCL enqueued
/// the work, so no buffer can be freed or reused before the kernels that use it exist.
///
/// If `f` fails, the group is still ended (NCCL has no way to cancel recorded calls) and `f`'s
/// error is returned. An error from `ncclGroupEnd` applies to every communicator in the group.
///
/// ```no_run
/// # fn demo(comms: &[nccl::Comm], bufs: &mut [cudarc::driver::CudaSlice<f32>]) -> nccl::Result<()> {
/// nccl::group(|g| {
///     for (comm, buf) in comms.iter().zip(bufs.iter_mut()) {
///         g.all_reduce_in_place(comm, buf, nccl::ReduceOp::SUM)?;
///     }
///     Ok(())
/// })
/// # }
/// ```
#[doc(alias = "ncclGroupStart")]
#[doc(alias = "ncclGroupEnd")]
pub fn group<'a, R>(f: impl FnOnce(&mut Group<'a>) -> Result<R>) -> Result<R> {
    if is_open() {
        return Err(Error::InsideGroup);
    }
    let lib = lib()?;
    let start = function!(lib, ncclGroupStart)?;
    let end = *function!(lib, ncclGroupEnd)?;
    // Declared before the end guard so that it is dropped after it: the stream guards inside are
    // released only once the group has ended.
    let mut handle = Group { guards: Vec::new(), _one_thread: PhantomData };
    // SAFETY: no group is open on this thread (checked above), so this starts the outermost one.
    check("ncclGroupStart", unsafe { start() }, None)?;
    OPEN.with(|o| o.set(true));
    let mut ender = EndOnDrop { end: Some(end) };
    let value = f(&mut handle);
    let ended = ender.end();
    drop(handle);
    let value = value?;
    ended.map(|()| value)
}

impl<'a> Group<'a> {
    /// [`Comm::all_reduce`] inside the group.
    #[doc(alias = "ncclAllReduce")]
    pub fn all_reduce<T: NcclType>(
        &mut self,
        comm: &'a Comm,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        comm.enqueue_all_reduce(self, send, recv, op)
    }

    /// [`Comm::all_reduce_in_place`] inside the group.
    #[doc(alias = "ncclAllReduce")]
    pub fn all_reduce_in_place<T: NcclType>(
        &mut self,
        comm: &'a Comm,
        buf: &'a mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        comm.enqueue_all_reduce_in_place(self, buf, op)
    }

    /// [`Comm::broadcast_in_place`] inside the group.
    #[doc(alias = "ncclBroadcast")]
    pub fn broadcast_in_place<T: NcclType>(
        &mut self,
        comm: &'a Comm,
        buf: &'a mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<()> {
        comm.enqueue_broadcast_in_place(self, buf, root)
    }

    /// [`Comm::all_gather`] inside the group.
    #[doc(alias = "ncclAllGather")]
    pub fn all_gather<T: NcclType>(
        &mut self,
        comm: &'a Comm,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        comm.enqueue_all_gather(self, send, recv)
    }

    /// [`Comm::reduce_scatter`] inside the group.
    #[doc(alias = "ncclReduceScatter")]
    pub fn reduce_scatter<T: NcclType>(
        &mut self,
        comm: &'a Comm,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<()> {
        comm.enqueue_reduce_scatter(self, send, recv, op)
    }

    /// Sends `send` to `peer` (`ncclSend`); the peer must post a matching [`Group::recv`].
    #[doc(alias = "ncclSend")]
    pub fn send<T: NcclType>(&mut self, comm: &'a Comm, send: &'a impl DevicePtr<T>, peer: usize) -> Result<()> {
        comm.enqueue_send(self, send, peer)
    }

    /// Receives into `recv` from `peer` (`ncclRecv`); the peer must post a matching [`Group::send`]
    /// of the same length.
    #[doc(alias = "ncclRecv")]
    pub fn recv<T: NcclType>(&mut self, comm: &'a Comm, recv: &'a mut impl DevicePtrMut<T>, peer: usize) -> Result<()> {
        comm.enqueue_recv(self, recv, peer)
    }
}

impl Comm {
    /// Runs one call outside any group: NCCL enqueues the kernel before the call returns, so the
    /// stream guards are released at once.
    pub(crate) fn direct(&self, call: impl FnOnce(&mut Immediate) -> Result<()>) -> Result<()> {
        if is_open() {
            return Err(Error::InsideGroup);
        }
        call(&mut Immediate)
    }
}

#[cfg(test)]
mod tests {
    //! Group bookkeeping needs the NCCL library but no GPU: an empty group is a no-op for NCCL.
    use super::*;

    #[test]
    fn groups_return_values_refuse_nesting_and_always_end() {
        assert_eq!(group(|_| Ok(7)).unwrap(), 7);
        assert!(!is_open());
        assert!(matches!(group(|_| group(|_| Ok(()))), Err(Error::InsideGroup)));
        assert!(!is_open(), "the outer group ended although its closure failed");
        let err = group(|_| -> Result<()> { Err(Error::DuplicateRank { rank: 3 }) }).unwrap_err();
        assert_eq!(err.to_string(), "rank 3 is listed twice");
        let panicked = std::panic::catch_unwind(|| group(|_| -> Result<()> { panic!("inside the group") }));
        assert!(panicked.is_err());
        assert!(!is_open(), "a panic inside the closure still ends the group");
        // NCCL agrees that no group is open: a new one starts and ends cleanly.
        group(|_| Ok(())).unwrap();
    }
}
