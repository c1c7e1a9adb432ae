//! Groups: several NCCL calls issued as one (`ncclGroupStart` … `ncclGroupEnd`), all or nothing.
//!
//! Between the start and the end of a group NCCL only records calls; the kernels are enqueued when
//! the group ends. This crate goes one step further: the closure given to [`group`] only *checks
//! and records* calls (with their buffers' pointers and stream guards), and NCCL sees none of them
//! until the closure has returned `Ok` with every call accepted. Then the whole group is issued
//! between `ncclGroupStart` and `ncclGroupEnd`, each communicator's calls are settled, and only
//! then are the stream guards released. A closure that fails, or a call refused inside it, launches
//! nothing — in single-process multi-GPU use, a half-launched group would leave the other GPUs
//! waiting forever for a peer that never joins.
//!
//! Every buffer given to a [`Member`] stays borrowed until [`group`] returns, so no buffer can be
//! moved, freed or written before the kernels that use it are enqueued. The calls of a group run
//! together: a group in which one call writes bytes another reads or writes (views of one buffer
//! taken through `&self` can name the same memory) launches nothing, [`Error::GroupOverlap`]. An
//! in-place call's buffer counts as written whole, and a gather's receive buffer (a scatter's
//! send buffer) on its root only. Direct calls on a thread that has a group open are refused
//! ([`Error::InsideGroup`]) and count as refused calls of the group, and groups do not nest. A finalize refused inside a group hands its communicator back
//! and does not count: the group's value, which carries the communicator out, is not dropped.
//!
//! A call records its communicator's handle; the closure can still abort that communicator after
//! recording (an [`AbortHandle`](crate::AbortHandle) request carried out by a later call, a
//! timeout in [`Comm::wait`]), which frees it. So the launch first checks that every communicator
//! in the group is still live, and launches nothing otherwise.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;
#[cfg(nccl_2_22)]
use std::time::Duration;

use cudarc::driver::CudaStream;
use gpucomm_ordering::{Access, Guard};
use nccl_sys::ncclResult_t;

pub(crate) mod open;
mod overlap;

use crate::call::{Buffers, Call};
use crate::error::{Error, Result};
use crate::ffi::{call, check, resolve};
use crate::graph::admit_call;
use crate::Comm;
use open::{refuse_inside, Open};

/// The calls of one group, recorded while its closure runs. Not `Send` (nor `Sync`): NCCL
/// requires one thread to issue all operations of a group.
pub struct Group<'a> {
    _one_thread: PhantomData<*const ()>,
    recorded: RefCell<Recorded<'a>>,
}

/// What a group has recorded so far. Its vectors come from, and go back to, this thread's
/// [`Spare`] storage, so that a group allocates nothing once the thread has run one of its size.
struct Recorded<'a> {
    calls: Vec<Call>,
    /// Each (communicator, stream) pair with calls, to settle after the end.
    settle: Vec<(&'a Comm, &'a Arc<CudaStream>)>,
    /// One access per stream: a stream's capture state is asked at most once per group.
    accesses: Vec<Access<'a>>,
    /// The recorded calls' stream guards, released after the group is settled.
    guards: Vec<Guard<'a>>,
    /// The bytes each recorded call reads and writes, compared before the launch.
    spans: Vec<overlap::Span>,
    /// Calls refused inside the group.
    refused: usize,
    /// Every access was rechecked after the closure, and nothing but this crate ran since (a
    /// launch that got past its rechecks).
    rechecked: bool,
}

/// The emptied vectors of this thread's last group, kept for the next one. Their element types
/// differ from `Recorded`'s only in lifetimes.
#[derive(Default)]
struct Spare {
    calls: Vec<Call>,
    settle: Vec<(&'static Comm, &'static Arc<CudaStream>)>,
    accesses: Vec<Access<'static>>,
    guards: Vec<Guard<'static>>,
    spans: Vec<overlap::Span>,
}

thread_local! {
    static SPARE: Cell<Option<Spare>> = const { Cell::new(None) };
}

/// The allocation of an emptied vector, for elements of the same layout (here: the same type
/// with other lifetimes).
fn recycle<A, B>(mut v: Vec<A>) -> Vec<B> {
    v.clear();
    if size_of::<A>() != size_of::<B>() || align_of::<A>() != align_of::<B>() {
        return Vec::new();
    }
    let mut v = ManuallyDrop::new(v);
    // SAFETY: the vector is empty, and `A` and `B` have the same size and alignment, so its
    // allocation (if any) has the layout of `capacity` elements of `B`; the original is not
    // dropped (`ManuallyDrop`), so the allocation has one owner.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<B>(), 0, v.capacity()) }
}

impl Recorded<'_> {
    /// Empty, with this thread's spare vectors.
    fn new() -> Self {
        let spare = SPARE.with(Cell::take).unwrap_or_default();
        Recorded {
            calls: spare.calls,
            settle: recycle(spare.settle),
            accesses: recycle(spare.accesses),
            guards: recycle(spare.guards),
            spans: recycle(spare.spans),
            refused: 0,
            rechecked: false,
        }
    }
}

impl Drop for Recorded<'_> {
    /// Releases the guards (recording "in use until here"), then keeps the vectors for the
    /// thread's next group.
    ///
    /// On every way out that did not recheck the streams after the closure (its error, a refused
    /// call, a panic, a launch refused before or at its rechecks), each stream is rechecked first,
    /// errors ignored: a capture the closure began on a stream admitted as not captured is
    /// invalidated, so that the guards dropped here cannot record their buffers' uses into it
    /// (a later use, or the free, would then wait for that record instead of the work before).
    fn drop(&mut self) {
        if !self.rechecked {
            for access in self.accesses.iter() {
                let _ = access.recheck();
            }
        }
        self.guards.clear();
        let spare = Spare {
            calls: recycle(std::mem::take(&mut self.calls)),
            settle: recycle(std::mem::take(&mut self.settle)),
            accesses: recycle(std::mem::take(&mut self.accesses)),
            guards: recycle(std::mem::take(&mut self.guards)),
            spans: recycle(std::mem::take(&mut self.spans)),
        };
        // During the thread's teardown the thread-local may be gone: the vectors are then freed.
        let _ = SPARE.try_with(|s| s.set(Some(spare)));
    }
}

impl std::fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let recorded = self.recorded.borrow();
        f.debug_struct("Group").field("calls", &recorded.calls.len()).field("refused", &recorded.refused).finish()
    }
}

/// A communicator taking part in a group, on its own stream or another one ([`Member::on`]):
/// every method of [`crate::Collectives`] records a call in the group (see `target.rs`, where
/// every target of a call implements the trait). Get one with [`Group::with`].
#[derive(Clone, Copy)]
pub struct Member<'g, 'a> {
    pub(crate) group: &'g Group<'a>,
    pub(crate) comm: &'a Comm,
    pub(crate) stream: &'a Arc<CudaStream>,
}

impl std::fmt::Debug for Member<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").field("comm", self.comm).field("stream", &self.stream.cu_stream()).finish()
    }
}

impl<'a> Group<'a> {
    fn new() -> Self {
        Group { _one_thread: PhantomData, recorded: RefCell::new(Recorded::new()) }
    }

    /// `comm` as a member of this group, on its own stream: `g.with(&comm).all_reduce(..)`.
    pub fn with(&self, comm: &'a Comm) -> Member<'_, 'a> {
        Member { group: self, comm, stream: comm.stream() }
    }

    /// Counts one call of the group as refused: the group then launches nothing.
    pub(crate) fn refuse(&self) {
        self.recorded.borrow_mut().refused += 1;
    }

    /// Records `call`: takes its pointers through this group's access for `stream`, and keeps the
    /// call and its guards until the group is launched.
    pub(crate) fn record<const N: usize>(
        &self,
        comm: &'a Comm,
        stream: &'a Arc<CudaStream>,
        mut call: Call,
        take: impl FnOnce(&Access<'a>, &mut [Guard<'a>; N]) -> Result<Buffers>,
    ) -> Result<()> {
        let mut recorded = self.recorded.borrow_mut();
        // NCCL gives a group the mode of its last call's communicator and, when that is
        // nonblocking, leaves blocking members "in progress" for good (2.28.9 `group.cc`): their
        // settling would wait for ever, or their timeout would abort a healthy communicator.
        if let Some((first, _)) = recorded.settle.first() {
            if first.is_nonblocking() != comm.is_nonblocking() {
                return Err(Error::MixedBlocking);
            }
        }
        let accesses = &mut recorded.accesses;
        let i = match accesses.iter().position(|a| same_stream(a.stream(), stream)) {
            Some(i) => i,
            None => {
                accesses.push(Access::new(stream));
                accesses.len() - 1
            }
        };
        admit_call(&accesses[i], comm)?;
        // Every access of the group has been admitted (each recorded a call): asked once each.
        if accesses[0].capturing()? != accesses[i].capturing()? {
            return Err(gpucomm_ordering::OrderError::MixedCapture.into());
        }
        let mut guards = [const { Guard::NONE }; N];
        let buffers = take(&accesses[i], &mut guards)?;
        call.set_buffers(buffers);
        let [read, write] = call.spans(comm.rank(), comm.size());
        let index = recorded.calls.len();
        overlap::add(&mut recorded.spans, index, read, write);
        recorded.calls.push(call);
        for guard in guards {
            guard.keep_in(&mut recorded.guards);
        }
        if !recorded.settle.iter().any(|(c, s)| std::ptr::eq(*c, comm) && same_stream(s, stream)) {
            recorded.settle.push((comm, stream));
        }
        Ok(())
    }

    /// Issues every recorded call between `ncclGroupStart` and `end` (which calls `ncclGroupEnd`
    /// or `ncclGroupSimulateEnd` and is named `name`), then settles each communicator's work; the
    /// guards are released afterwards, when the group is dropped.
    ///
    /// Nothing is issued unless every communicator in the group is still live: a call records its
    /// communicator's handle, and a communicator aborted since (later in the closure) is freed.
    fn launch(&mut self, name: &'static str, end: impl FnOnce() -> ncclResult_t) -> Result<()> {
        let recorded = self.recorded.get_mut();
        if recorded.calls.is_empty() {
            return Ok(());
        }
        // One call's own ranges never clash (see `overlap::add`).
        let clash = if recorded.calls.len() > 1 { overlap::clash(&mut recorded.spans) } else { None };
        if let Some((first, second)) = clash {
            let name = |i: usize| recorded.calls[i].name();
            return Err(Error::GroupOverlap { first, first_call: name(first), second, second_call: name(second) });
        }
        // Every recorded call's communicator is in `settle`. None can be aborted between this check
        // and the issue below: only this thread carries out aborts, and it does not wait in between.
        for (comm, _) in recorded.settle.iter() {
            comm.live_raw()?;
        }
        // The closure ran after the calls were admitted, and may have begun (or invalidated) a
        // capture of their streams: one driver query per stream, so that nothing is issued into a
        // graph that keeps nothing alive.
        for access in recorded.accesses.iter() {
            access.recheck()?;
        }
        recorded.rechecked = true;
        // SAFETY: no NCCL group is open on this thread: this crate opens NCCL groups only in its own
        // functions, which end them before returning.
        unsafe { call!(ncclGroupStart()) }?;
        let mut issued = Ok(());
        for c in recorded.calls.iter() {
            // SAFETY: each call was built by a `Collectives` method, whose checks make its pointers
            // valid for its count, type and ranks on its communicator's device (lengths and
            // devices are the buffers' `DeviceMemory` promise); the buffers are borrowed for 'a and
            // their guards are held by `self` until after the settling below; every communicator
            // was checked live just above; a captured call is kept alive by its capture scope's
            // graph (the accesses refused other captures).
            let rc = unsafe { c.issue() };
            if rc != ncclResult_t::ncclSuccess {
                // NCCL remembers the error and ends the group without launching it.
                issued = check(c.name(), rc, Some(c.comm()));
                break;
            }
        }
        let rc = end();
        let mut settled = Ok(());
        for (comm, stream) in recorded.settle.iter() {
            let s = comm.settle(name, rc, stream, recorded.captured(stream));
            if settled.is_ok() {
                settled = s;
            }
        }
        if issued.is_ok() && settled.is_ok() && crate::watchdog::active() {
            recorded.note_calls();
        }
        // Joined whatever happened: a group that failed after `ncclGroupEnd` may have launched
        // some of its work, which later uses of its buffers must still be ordered after.
        let joined = recorded.join_streams();
        issued.and(settled).and(joined)
    }
}

impl Recorded<'_> {
    /// Hands every issued call to the watchdog's flight recorders (with its communicator and
    /// stream).
    fn note_calls(&self) {
        for call in &self.calls {
            let stream = call.describe().3;
            let target = self.settle.iter().find(|(c, s)| {
                c.as_raw() == call.comm() && std::ptr::eq(s.cu_stream().cast::<()>(), stream.cast::<()>())
            });
            if let Some((comm, stream)) = target {
                crate::watchdog::note(comm, call, stream, self.captured(stream));
            }
        }
    }

    /// Whether `stream` is being captured, as its access found when it admitted the first call
    /// (`None` if no access asked, so that the caller asks the driver).
    fn captured(&self, stream: &CudaStream) -> Option<bool> {
        let access = self.accesses.iter().find(|a| same_stream(a.stream(), stream))?;
        access.capturing().ok()
    }

    /// A buffer read by calls on two streams of one device in the same group is used by both
    /// streams at once once the group launches, but its ordering state (a cudarc event, a
    /// [`StreamTracker`](gpucomm_ordering::StreamTracker)) can name only one of them as the last
    /// user. So when a group's calls went to several streams of a device, each of those streams
    /// waits for the others' work: whichever one a buffer names, later uses wait for the whole
    /// group. Groups on one stream per device (the usual case) skip this. Done after a failed
    /// launch too.
    fn join_streams(&self) -> Result<()> {
        for (i, (_, a)) in self.settle.iter().enumerate() {
            for (j, (_, b)) in self.settle.iter().enumerate() {
                let same_device = a.context().cu_ctx() == b.context().cu_ctx();
                if i != j && same_device && !same_stream(a, b) {
                    a.join(b)?;
                }
            }
        }
        Ok(())
    }
}

impl<'g, 'a> Member<'g, 'a> {
    /// This member with its calls enqueued on `stream` (of the communicator's device, checked by
    /// each call) instead of the communicator's own stream.
    pub fn on(self, stream: &'a Arc<CudaStream>) -> Self {
        Member { stream, ..self }
    }
}

fn same_stream(a: &CudaStream, b: &CudaStream) -> bool {
    a.cu_stream() == b.cu_stream() && a.context().cu_ctx() == b.context().cu_ctx()
}

/// Runs `f`, then, if it returned `Ok` and every call in it was accepted, launches its calls as one
/// NCCL group ended by `end` (see [`Group::launch`]), and returns `f`'s value.
fn run<'a, R>(
    f: impl FnOnce(&mut Group<'a>) -> Result<R>,
    name: &'static str,
    end: impl FnOnce() -> ncclResult_t,
    simulated: bool,
) -> Result<R> {
    refuse_inside()?;
    let mut group = Group::new();
    let (value, refused_inside) = {
        let open = Open::enter();
        let value = f(&mut group);
        (value, open.refused())
    };
    let value = value?;
    let recorded = group.recorded.get_mut();
    recorded.refused += refused_inside;
    if recorded.refused > 0 {
        return Err(Error::GroupRefused { refused: recorded.refused });
    }
    if simulated {
        if let Some(c) = recorded.calls.iter().find(|c| c.is_point_to_point()) {
            return Err(Error::NotSimulable { call: c.name() });
        }
    }
    group.launch(name, end)?;
    // `group` is dropped here: the stream guards record "in use until here" after the settling.
    Ok(value)
}

/// Runs `f` as one NCCL group (`ncclGroupStart` / `ncclGroupEnd`) and returns its value.
///
/// Use it to drive several communicators from one thread (single-process multi-GPU, as created by
/// [`Comm::init_all`]), to pair sends with receives, and to fuse several collectives into one
/// launch. Calls join the group through [`Group::with`]: `g.with(&comm).all_reduce(..)`.
///
/// **All or nothing**: the calls are checked and recorded while `f` runs and launched together
/// after it returns. If `f` returns an error, or any call inside it was refused (even if `f`
/// ignored that error: [`Error::GroupRefused`]) — a direct call on a communicator counts as a
/// refused call; a refused [`Comm::finalize`] does not, since it hands its communicator back
/// through the closure's value — nothing is launched; nor if a communicator of the group was aborted after its
/// calls were recorded ([`Error::Aborted`]). An error from `ncclGroupEnd` applies to every
/// communicator in the group.
///
/// Every buffer passed to the group stays borrowed until `group` returns, and its stream guards
/// are released only after NCCL has enqueued the work. Inside `f`, direct calls on a communicator
/// are refused ([`Error::InsideGroup`]), as is a nested group.
///
/// ```no_run
/// use nccl::{Collectives, ReduceOp};
/// # fn demo(comms: &[nccl::Comm], bufs: &mut [cudarc::driver::CudaSlice<f32>]) -> nccl::Result<()> {
/// nccl::group(|g| {
///     for (comm, buf) in comms.iter().zip(bufs.iter_mut()) {
///         g.with(comm).all_reduce_in_place(buf, ReduceOp::SUM)?;
///     }
///     Ok(())
/// })
/// # }
/// ```
#[doc(alias = "ncclGroupStart")]
#[doc(alias = "ncclGroupEnd")]
pub fn group<'a, R>(f: impl FnOnce(&mut Group<'a>) -> Result<R>) -> Result<R> {
    let end = resolve!(ncclGroupEnd)?;
    // SAFETY: `Group::launch` calls this once, on this thread, after its ncclGroupStart.
    run(f, "ncclGroupEnd", || unsafe { end() }, false)
}

#[cfg(nccl_2_22)]
#[cfg_attr(docsrs, doc(cfg(nccl_2_22)))]
/// What [`simulate`] returns: the closure's value and NCCL's estimate of the group's time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Simulated<R> {
    /// The closure's value.
    pub value: R,
    /// NCCL's estimate of how long the group would take on the GPU, or `None` when NCCL gave none
    /// (a group of only sends and receives; a nonblocking communicator, with which NCCL runs the
    /// group instead of simulating it).
    pub estimated_time: Option<Duration>,
}

/// Like [`group`], but ends the group with `ncclGroupSimulateEnd` (NCCL ≥ 2.22.3): NCCL picks the
/// algorithms and estimates the group's time without launching anything (with blocking
/// communicators). Checks, borrows and ordering are the same as for [`group`].
///
/// Only collectives can be simulated (all-reduce, broadcast, reduce, all-gather, reduce-scatter):
/// a group with a point-to-point call is refused with [`Error::NotSimulable`] and launches
/// nothing, because NCCL leaves simulated sends and receives queued for the next group.
#[cfg(nccl_2_22)]
#[cfg_attr(docsrs, doc(cfg(nccl_2_22)))]
#[doc(alias = "ncclGroupSimulateEnd")]
pub fn simulate<'a, R>(f: impl FnOnce(&mut Group<'a>) -> Result<R>) -> Result<Simulated<R>> {
    let end = resolve!(ncclGroupSimulateEnd)?;
    let mut info = sim_info();
    // SAFETY: `Group::launch` calls this once, on this thread, after its ncclGroupStart; `info`
    // is initialised as NCCL_SIM_INFO_INITIALIZER prescribes and outlives the call.
    let value = run(f, "ncclGroupSimulateEnd", || unsafe { end(&mut info) }, true)?;
    let micros = f64::from(info.estimatedTime);
    Ok(Simulated { value, estimated_time: (micros >= 0.0).then(|| Duration::from_secs_f64(micros * 1e-6)) })
}

/// NCCL_SIM_INFO_INITIALIZER.
#[cfg(nccl_2_22)]
fn sim_info() -> nccl_sys::ncclSimInfo_t {
    nccl_sys::ncclSimInfo_t {
        size: size_of::<nccl_sys::ncclSimInfo_t>(),
        magic: 0x7468_5283,
        version: nccl_sys::NCCL_VERSION_CODE,
        estimatedTime: nccl_sys::NCCL_UNDEF_FLOAT as f32,
    }
}

#[cfg(test)]
mod tests {
    //! Group bookkeeping needs neither a GPU nor the NCCL library: an empty group calls no NCCL.
    use super::open::is_open;
    use super::*;

    #[test]
    fn groups_return_values_refuse_nesting_and_always_close() {
        assert_eq!(group(|_| Ok(7)).unwrap(), 7);
        assert!(!is_open());
        assert!(matches!(group(|_| group(|_| Ok(()))), Err(Error::InsideGroup)));
        assert!(!is_open(), "the outer group closed although its closure failed");
        let err = group(|_| -> Result<()> { Err(Error::ForeignOp) }).unwrap_err();
        assert!(matches!(err, Error::ForeignOp), "{err}");
        let panicked = std::panic::catch_unwind(|| group(|_| -> Result<()> { panic!("inside the group") }));
        assert!(panicked.is_err());
        assert!(!is_open(), "a panic inside the closure still closes the group");
        group(|_| Ok(())).unwrap();
    }

    #[test]
    fn a_refused_call_that_the_closure_ignores_still_stops_the_group() {
        let err = group(|g| {
            g.recorded.borrow_mut().refused = 1;
            Ok(())
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "1 call(s) in the group were refused, so nothing in it was launched");
    }

    #[test]
    fn a_direct_call_refused_inside_the_closure_stops_the_group() {
        // What a direct collective, a split or a window registration does inside a group closure
        // (they all refuse through `refuse_inside`); the closure ignores the error. Before, the
        // refusal was not counted and the group launched the calls recorded around it.
        let err = group(|_| {
            assert!(matches!(refuse_inside(), Err(Error::InsideGroup)));
            Ok(())
        })
        .unwrap_err();
        assert!(matches!(err, Error::GroupRefused { refused: 1 }), "{err}");
        assert!(refuse_inside().is_ok(), "outside a group nothing is refused");
        group(|_| Ok(())).expect("the count starts again with every group");
    }

    #[test]
    fn a_refused_finalize_does_not_stop_the_group_so_its_value_comes_back() {
        // What `Comm::finalize` does inside a group closure: refused, the communicator handed back
        // in the closure's value. Before, the refusal counted against the group, which then
        // failed with `GroupRefused` and dropped that value, communicator included.
        let value = group(|_| {
            let refused = open::refuse_teardown_inside();
            assert!(matches!(refused, Err(Error::InsideGroup)), "{refused:?}");
            Ok(("the communicator", refused))
        })
        .unwrap();
        assert_eq!(value.0, "the communicator");
        assert!(open::refuse_teardown_inside().is_ok(), "outside a group nothing is refused");
    }

    #[test]
    #[cfg(nccl_2_22)]
    fn the_simulation_info_is_initialised_as_nccl_requires() {
        let info = sim_info();
        assert_eq!(info.size, 24);
        assert_eq!(info.magic, 0x74685283);
        assert_eq!(info.version, nccl_sys::NCCL_VERSION_CODE);
        assert_eq!(info.estimatedTime, -1.0);
    }
}
