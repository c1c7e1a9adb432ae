//! Where a call goes: a communicator and a stream, issued at once or recorded in a group.
//!
//! The communicator's own stream is the default ([`Comm`] itself is a target); [`Comm::on`] picks
//! another stream of the same device for direct calls, [`crate::Member::on`] inside a group. All
//! of them implement [`crate::Collectives`] through the crate-private [`Target`] trait, here, so
//! that each collective is written once, in `coll.rs`, for every target.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DeviceSlice};
use gpucomm_ordering::{Access, Guard};

use crate::call::{Buffers, Call};
use crate::error::{Error, Result};
use crate::graph::admit_call;
use crate::group::open::refuse_inside;
use crate::group::{Group, Member};
use crate::Comm;

/// A call being made: its communicator and stream, and the group recording it (none for a direct
/// call). Public only inside a private module, so that [`crate::Collectives`] stays sealed.
#[derive(Clone, Copy)]
pub struct Plan<'g, 'b> {
    pub(crate) comm: &'b Comm,
    pub(crate) stream: &'b Arc<CudaStream>,
    group: Option<&'g Group<'b>>,
}

/// Implemented by every handle that [`crate::Collectives`]' methods can be called on. Sealed: it
/// lives in a private module.
pub trait Target<'b>: Copy {
    /// Admits the call (no direct call inside a group; a stream of the communicator's device) and
    /// runs `body` with the call's plan. In a group, a refused call is counted, so that the group
    /// launches nothing.
    fn dispatch(self, body: impl FnOnce(Plan<'_, 'b>) -> Result<()>) -> Result<()>;
}

/// A communicator is a target on its own stream. Direct calls are refused while a group is open
/// on this thread: they would not be part of it (the refusal counts as a refused call of the
/// group, which then launches nothing).
impl<'b> Target<'b> for &'b Comm {
    #[inline]
    fn dispatch(self, body: impl FnOnce(Plan<'_, 'b>) -> Result<()>) -> Result<()> {
        refuse_inside()?;
        body(Plan { comm: self, stream: self.stream(), group: None })
    }
}

/// A communicator on another stream of its device, for direct calls: see [`Comm::on`].
#[derive(Clone, Copy, Debug)]
pub struct OnStream<'b> {
    comm: &'b Comm,
    stream: &'b Arc<CudaStream>,
}

impl<'b> Target<'b> for OnStream<'b> {
    #[inline]
    fn dispatch(self, body: impl FnOnce(Plan<'_, 'b>) -> Result<()>) -> Result<()> {
        refuse_inside()?;
        check_stream(self.comm, self.stream)?;
        body(Plan { comm: self.comm, stream: self.stream, group: None })
    }
}

impl Comm {
    /// This communicator with its calls enqueued on `stream` instead of [`Comm::stream`]: every
    /// method of [`crate::Collectives`] is available on the returned handle, e.g.
    /// `comm.on(&side).all_reduce(&send, &mut recv, ReduceOp::SUM)`. Frameworks use it to overlap
    /// communication with computation on a stream of their own, and to capture calls into a CUDA
    /// graph with [`crate::capture`] (the legacy default stream cannot be captured).
    ///
    /// `stream` must belong to the communicator's device; each call checks it and returns
    /// [`Error::WrongDevice`] otherwise. Buffers are ordered on that stream through cudarc's
    /// protocol (or their [`gpucomm_ordering::StreamTracker`]), like on the default stream.
    pub fn on<'b>(&'b self, stream: &'b Arc<CudaStream>) -> OnStream<'b> {
        OnStream { comm: self, stream }
    }
}

/// A communicator in a group records its calls there. A refused call (here: a stream of another
/// device; in `body`: any check) counts as a refused call of the group, which then launches
/// nothing.
impl<'a> Target<'a> for Member<'_, 'a> {
    #[inline]
    fn dispatch(self, body: impl FnOnce(Plan<'_, 'a>) -> Result<()>) -> Result<()> {
        let plan = Plan { comm: self.comm, stream: self.stream, group: Some(self.group) };
        let result = check_stream(self.comm, self.stream).and_then(|()| body(plan));
        if result.is_err() {
            self.group.refuse();
        }
        result
    }
}

/// A stream other than the communicator's own must be on its device.
#[inline]
fn check_stream(comm: &Comm, stream: &Arc<CudaStream>) -> Result<()> {
    if Arc::ptr_eq(stream, comm.stream()) {
        return Ok(());
    }
    comm.check_device("stream", stream)
}

impl<'b> Plan<'_, 'b> {
    /// `Ok` when `buf` lives on the communicator's device.
    #[inline]
    pub(crate) fn check_device<T>(&self, what: &'static str, buf: &(impl DeviceSlice<T> + ?Sized)) -> Result<()> {
        self.comm.check_device(what, buf.stream())
    }

    /// `Ok(rank as i32)` when `rank` is one of the communicator's ranks.
    #[inline]
    pub(crate) fn check_rank(&self, what: &'static str, rank: usize) -> Result<i32> {
        if rank < self.comm.size() {
            // Communicator sizes are C ints, so every rank below one fits.
            Ok(rank as i32)
        } else {
            Err(Error::InvalidRank { what, rank, size: self.comm.size() })
        }
    }

    /// Takes the buffers' pointers for `call` with `take` (through an [`Access`] on the call's
    /// stream, which refuses a capture this crate did not open and, inside [`crate::capture`],
    /// records the communicator and buffers for the graph; `take` leaves the buffers' guards in
    /// the array it is given), then issues the call: a direct call at once —
    /// NCCL, then [`Comm::settle`], then the stream guards are released — and a grouped one by
    /// recording it (with its guards) until the group ends. A CUDA error while ordering the
    /// buffers is returned here and nothing is issued.
    #[inline]
    pub(crate) fn submit<const N: usize>(
        self,
        mut call: Call,
        take: impl FnOnce(&Access<'b>, &mut [Guard<'b>; N]) -> Result<Buffers>,
    ) -> Result<()> {
        if let Some(group) = self.group {
            return group.record(self.comm, self.stream, call, take);
        }
        let access = Access::new(self.stream);
        admit_call(&access, self.comm)?;
        // Dropped when this function returns, after `settle` (not moved into `drop`, which
        // would copy every empty guard).
        let mut guards = [const { Guard::NONE }; N];
        let buffers = take(&access, &mut guards)?;
        call.set_buffers(buffers);
        // `take` ran the buffers' own code (their pointers and stream tracking), which can reach
        // this communicator (a `Comm::wait` that times out aborts it) after `Call::new` checked
        // it: check again, with nothing in between but the issue.
        self.comm.live_raw()?;
        // SAFETY: `call` was built by a `Collectives` method, whose checks make its pointers valid
        // for its count, type and ranks on this communicator's device (lengths and devices are
        // the buffers' `DeviceMemory` promise); the buffers are borrowed for 'b and their guards
        // are held until after `settle`; the communicator is live (checked just above, after the
        // last code that could abort it); the stream is not captured by anything but this
        // crate's scope, whose graph keeps the buffers and the communicator (the access refused
        // others).
        let rc = unsafe { call.issue() };
        // The access asked the driver once (it admitted the call above); nothing after asks again.
        let captured = access.capturing().ok();
        self.comm.settle(call.name(), rc, self.stream, captured)?;
        // Watchdogs watch nonblocking communicators only: a blocking one skips the global flag.
        if self.comm.is_nonblocking() && crate::watchdog::active() {
            crate::watchdog::note(self.comm, &call, self.stream, captured);
        }
        Ok(())
    }
}
