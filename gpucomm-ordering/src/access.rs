//! Taking buffer pointers for one call on one stream: eagerly, or inside this crate's capture scope.

use std::cell::Cell;
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError, SyncOnDrop};

use crate::capture::{self, relaxed, Used};
use crate::usage::{ElemType, Mode, Resource, Use};
use crate::{DeviceBuffer, DeviceBufferMut, OrderError, Tracked};

/// The call being prepared on this thread, so that a tracked buffer reached through cudarc's
/// `DevicePtr` (which only sees `&CudaStream`) knows the call's `Arc<CudaStream>` and mode. It
/// points at the `Arc` the [`Access`] borrows, which outlives the call: set by `Access::take`
/// around one `device_ptr` call, and put back before it returns.
#[derive(Clone, Copy)]
struct Call {
    stream: *const Arc<CudaStream>,
    mode: Mode,
    idle: Option<sys::CUstream>,
}

/// How the pointer being taken was ordered, as its tracker reported it ([`report`]); `None` while
/// no tracker has reported: the buffer followed cudarc's protocol, which records its failures in
/// the context instead.
type Reported = Option<Result<(), OrderError>>;

thread_local! {
    static CURRENT: Cell<Option<Call>> = const { Cell::new(None) };
    static REPORTED: Cell<Reported> = const { Cell::new(None) };
}

/// Runs `f` with the stream and mode of the call in progress on this thread whose stream (or idle
/// helper stream) is `stream`; `None` when there is no such call.
#[inline]
pub(crate) fn with_current<R>(stream: &CudaStream, f: impl FnOnce(&Arc<CudaStream>, Mode) -> R) -> Option<R> {
    let call = CURRENT.with(Cell::get)?;
    // SAFETY: `call.stream` points at the `Arc` borrowed by the `Access` whose `take` set it; the
    // value is reset before `take` returns, so the borrow is still alive while it is set.
    let arc = unsafe { &*call.stream };
    let ours = (arc.cu_stream() == stream.cu_stream() && Arc::ptr_eq(arc.context(), stream.context()))
        || call.idle == Some(stream.cu_stream());
    ours.then(|| f(arc, call.mode))
}

/// Called by a tracker inside [`with_current`]'s call: how it ordered the pointer being taken.
/// The first failure is kept (a buffer whose pointer takes several trackers' pointers reports
/// each).
#[inline]
pub(crate) fn report(ordered: Result<(), OrderError>) {
    REPORTED.with(|r| {
        let kept = match r.take() {
            Some(Err(e)) => Err(e),
            _ => ordered,
        };
        r.set(Some(kept));
    });
}

/// Takes the device pointers of the buffers of one call (a collective, a put) on one stream.
///
/// Whether the stream is being captured is asked once per `Access` (one `cuStreamIsCapturing`),
/// at its first buffer or [`Access::admit`]:
///
/// * **not captured**: [`Access::read`] and [`Access::write`] follow cudarc's protocol: the stream
///   waits for earlier conflicting uses on other streams, and the returned guards record this use
///   when dropped — drop them only after the work is enqueued. cudarc keeps one read event per
///   buffer, so a read through its protocol on another stream than this thread's last read of
///   the buffer also waits for the reader that event stands for, if it still runs (not while a
///   capture scope is open: see `Guard::after_earlier_reader`), so that the event it records
///   stands for both. Buffers with a [`StreamTracker`](crate::StreamTracker) remember the
///   streams of their uses, so that a later use on the same stream costs nothing. A failure to
///   order a buffer is returned by `read`/`write`: a tracker's at once, and one that cudarc's
///   protocol recorded in the context (where cudarc keeps the failures of its waits) by checking
///   the context after each buffer that follows that protocol;
/// * **captured by this thread's [`capture`](crate::capture) scope**: the pointers are taken
///   without waiting (cudarc's waits would break the capture; they go to a private idle stream)
///   and the uses are recorded for the graph, whose launch orders them;
/// * **captured by anything else**: refused with [`OrderError::ForeignCapture`], because that
///   graph would not keep the buffers alive;
/// * **a capture that CUDA invalidated** (whoever opened it): refused with
///   [`OrderError::CaptureBroken`], before the library is called.
///
/// The answer holds for one call: make an `Access` per call, and never keep one across the start
/// or end of a capture (its later pointers would follow the earlier answer: an eager use not
/// recorded for a graph, or a captured one not ordered). A call issued after other code ran since
/// its admission asks again with [`Access::recheck`].
pub struct Access<'s> {
    stream: &'s Arc<CudaStream>,
    mode: Cell<Option<Mode>>,
    idle: Cell<Option<&'static CudaStream>>,
}

impl<'s> Access<'s> {
    /// An access for a call on `stream`.
    #[inline]
    pub fn new(stream: &'s Arc<CudaStream>) -> Self {
        Access { stream, mode: Cell::new(None), idle: Cell::new(None) }
    }

    /// An access whose mode is already known.
    pub(crate) fn with_mode(stream: &'s Arc<CudaStream>, mode: Mode) -> Self {
        Access { stream, mode: Cell::new(Some(mode)), idle: Cell::new(None) }
    }

    /// The call's stream.
    pub fn stream(&self) -> &'s Arc<CudaStream> {
        self.stream
    }

    /// The call's mode: asked once (out of line, so that the calls after the first stay small
    /// enough to inline), then remembered.
    #[inline]
    fn mode(&self) -> Result<Mode, OrderError> {
        match self.mode.get() {
            Some(m) => Ok(m),
            None => self.ask_mode(),
        }
    }

    #[inline(never)]
    fn ask_mode(&self) -> Result<Mode, OrderError> {
        let m = capture::mode(self.stream)?;
        self.mode.set(Some(m));
        Ok(m)
    }

    /// Whether the call is captured by this thread's capture scope (asked once, then remembered).
    /// A capture this crate did not open is [`OrderError::ForeignCapture`], one that CUDA
    /// invalidated [`OrderError::CaptureBroken`].
    #[inline]
    pub fn capturing(&self) -> Result<bool, OrderError> {
        Ok(self.mode()? == Mode::Captured)
    }

    /// Admits the call: `Ok` unless its stream is captured by something other than this thread's
    /// capture scope ([`OrderError::ForeignCapture`]) or by a capture CUDA invalidated
    /// ([`OrderError::CaptureBroken`]).
    #[inline]
    pub fn admit(&self) -> Result<(), OrderError> {
        self.mode().map(drop)
    }

    /// Admits the call and, inside a capture scope, records that it uses `resource` (a
    /// communicator, a team, a module): the graph must keep it.
    #[inline]
    pub fn resource(&self, resource: Resource) -> Result<(), OrderError> {
        if self.mode()? == Mode::Captured {
            capture::record_resource(self.stream, resource, None::<fn() -> capture::Held>);
        }
        Ok(())
    }

    /// [`Access::resource`], and inside a capture scope, the first time the scope records
    /// `resource`, keeps what `hold` makes until the capture's graph is destroyed (or, when the
    /// capture fails, until its partial graph is): how the resource's owner learns that captured
    /// work holds it, from the moment the work is captured and whatever becomes of the graph
    /// (`mem::forget` included). An NCCL communicator counts these: NCCL's destroy and abort wait
    /// until every graph holding its work is destroyed.
    #[inline]
    pub fn resource_held(
        &self,
        resource: Resource,
        hold: impl FnOnce() -> Box<dyn Send + Sync>,
    ) -> Result<(), OrderError> {
        if self.mode()? == Mode::Captured {
            capture::record_resource(self.stream, resource, Some(hold));
        }
        Ok(())
    }

    /// Asks the driver again whether the call's stream is being captured, and refuses the call
    /// unless the answer is still the one it was admitted with: for a call that is issued after
    /// other code ran since its admission (a group launches its calls after its closure). A
    /// capture that code began is refused as [`Access::admit`] would refuse it now
    /// ([`OrderError::ForeignCapture`], [`OrderError::CaptureBroken`]); any other change is
    /// [`OrderError::CaptureChanged`]. `Ok` for an access that admitted nothing yet.
    ///
    /// A stream admitted as not captured that is captured now has its capture invalidated before
    /// the refusal returns: the guards of the buffers already taken, dropped on the way out, would
    /// otherwise record their use into that capture, and a later use (or free) of such a buffer
    /// would wait for the captured record instead of the work queued before it. Invalidated, the
    /// capture refuses the records, the buffers keep their earlier events, and its graph cannot be
    /// made.
    pub fn recheck(&self) -> Result<(), OrderError> {
        let admitted = match self.mode.get() {
            None | Some(Mode::Survey) => return Ok(()),
            Some(admitted) => admitted,
        };
        let now = capture::mode(self.stream);
        if now.as_ref().is_ok_and(|&m| m == admitted) {
            return Ok(());
        }
        // Admitted eager and not eager now: captured (or broken). The query that invalidates a
        // capture is harmless on a stream that is not being captured.
        if admitted == Mode::Eager {
            capture::invalidate(self.stream);
        }
        match now {
            Ok(_) => Err(OrderError::CaptureChanged),
            Err(e) => Err(e),
        }
    }

    /// The helper stream for taking pointers without ordering (looked up once per `Access`).
    fn idle(&self) -> Result<&'static CudaStream, DriverError> {
        if let Some(p) = self.idle.get() {
            return Ok(p);
        }
        let p: &'static CudaStream = &helpers(self.stream.context())?.idle;
        self.idle.set(Some(p));
        Ok(p)
    }

    /// The pointer of `buf` for reading on the call's stream, and the guard to drop after enqueue.
    ///
    /// The guard borrows the buffer and the stream, not the `Access`, so guards of several calls
    /// can be kept together until their work is enqueued (a group).
    #[inline(always)]
    pub fn read<'a, T>(
        &self,
        buf: &'a (impl DeviceBuffer<T> + ?Sized),
    ) -> Result<(sys::CUdeviceptr, Guard<'a>), OrderError>
    where
        's: 'a,
    {
        let bytes = buf.num_bytes();
        let elem = ElemType::of::<T>();
        if let Some(ptr) = self.tracked_only(buf.tracked(), bytes, Use::Read, elem)? {
            return Ok((ptr, Guard::NONE));
        }
        self.take(bytes, Use::Read, elem, |stream| buf.device_ptr(stream))
    }

    /// The pointer of `buf` for writing on the call's stream, and the guard to drop after enqueue.
    #[inline(always)]
    pub fn write<'a, T>(
        &self,
        buf: &'a mut (impl DeviceBufferMut<T> + ?Sized),
    ) -> Result<(sys::CUdeviceptr, Guard<'a>), OrderError>
    where
        's: 'a,
    {
        let bytes = buf.num_bytes();
        let elem = ElemType::of::<T>();
        if let Some(ptr) = self.tracked_only(buf.tracked(), bytes, Use::Write, elem)? {
            return Ok((ptr, Guard::NONE));
        }
        self.take(bytes, Use::Write, elem, |stream| buf.device_ptr_mut(stream))
    }

    /// The address of a buffer with a tracker (`tracked`: its parts) when the tracker alone orders
    /// a use `how` of `bytes` bytes of elements `elem`, reading only its first cache line: an eager use on the stream
    /// the memory was last used on (nothing to wait for, nothing to record), a use captured by
    /// this thread's scope (recorded for the graph), a survey. `None` when the use must go through
    /// the buffer's `device_ptr`.
    #[inline]
    fn tracked_only(
        &self,
        tracked: Option<Tracked<'_>>,
        bytes: usize,
        how: Use,
        elem: ElemType,
    ) -> Result<Option<sys::CUdeviceptr>, OrderError> {
        let Some(t) = tracked else { return Ok(None) };
        Ok(match self.mode()? {
            Mode::Eager => t.tracker().needs_nothing(self.stream, how).then_some(t.ptr()),
            Mode::Captured => {
                capture::record_tracked_use(self.stream, t.tracker().key(), Used { ptr: t.ptr(), bytes, how, elem });
                Some(t.ptr())
            }
            Mode::Survey => Some(t.ptr()),
        })
    }

    /// The buffer's own `device_ptr` protocol (`get`), out of line: the tracked fast path of
    /// `read` / `write` stays small enough to inline into every call. Marked cold so that the
    /// compiler lays the calls to it out of the way of that fast path; the buffers that take it
    /// (cudarc's, following its event protocol) pay microseconds there, beside which a jump is
    /// nothing.
    #[cold]
    #[inline(never)]
    fn take<'a>(
        &self,
        bytes: usize,
        how: Use,
        elem: ElemType,
        get: impl FnOnce(&'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>),
    ) -> Result<(sys::CUdeviceptr, Guard<'a>), OrderError>
    where
        's: 'a,
    {
        let mode = self.mode()?;
        let idle = match mode {
            Mode::Eager => None,
            Mode::Captured | Mode::Survey => Some(self.idle()?),
        };
        let call = Call { stream: self.stream, mode, idle: idle.map(|p| p.cu_stream()) };
        let restore = Restore::enter(call);
        let taken = match idle {
            // The helper stream is idle and never captured: cudarc's waits land there, harmlessly,
            // and the guard is dropped unrecorded (nothing runs now).
            Some(idle) => {
                let (ptr, guard) = get(idle);
                std::mem::forget(guard);
                if mode == Mode::Captured {
                    capture::record_use(self.stream, Used { ptr, bytes, how, elem });
                }
                (ptr, Guard::NONE)
            }
            None => {
                let (ptr, guard) = get(self.stream);
                (ptr, Guard::from(guard))
            }
        };
        match restore.reported() {
            Some(ordered) => ordered?,
            None => {
                if how == Use::Read && mode == Mode::Eager {
                    taken.1.after_earlier_reader(self.stream)?;
                }
                // cudarc's protocol (or a type built on it) records a failed wait in the context.
                self.stream.context().check_err()?;
            }
        }
        // The waits of either protocol can make the stream join a capture: waiting for an event
        // recorded inside one (a cudarc copy of the buffer, or the use of a tracked buffer whose
        // guard dropped, inside an open capture) joins it. The call, admitted as eager, would
        // land in that graph, which keeps nothing alive.
        if mode == Mode::Eager {
            self.recheck()?;
        }
        Ok(taken)
    }
}

/// What a pointer taken through an [`Access`] still owes its buffer: dropped once the work that
/// uses the pointer is enqueued, it records that use (cudarc's event, a tracker's), so that later
/// uses and the free wait for the work. Most uses owe nothing (a tracked buffer on the stream it
/// was last used on, a captured use): their guard is empty, and dropping it costs one branch.
#[must_use = "drop the guard only after the work that uses the pointer is enqueued"]
#[derive(Debug)]
pub struct Guard<'a>(Option<Owed<'a>>);

/// cudarc's guard for a use that owes a record or a synchronisation, settled and dropped by
/// [`settle`] when dropped. A wrapper of its own, so that [`Guard`] needs no `Drop` of its own,
/// and holding cudarc's guard in a `ManuallyDrop`, so that all of its dropping happens out of
/// line: dropping an empty guard stays one inlined branch.
#[derive(Debug)]
struct Owed<'a>(ManuallyDrop<SyncOnDrop<'a>>);

impl Guard<'_> {
    /// A guard that owes nothing.
    pub const NONE: Self = Guard(None);

    /// True when dropping the guard does nothing.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

/// Slots of [`LAST_READS`].
const READ_SLOTS: usize = 64;

thread_local! {
    /// For cudarc read events this thread chained a read through (`Guard::after_earlier_reader`):
    /// the event's handle and the stream the read recorded it on, in a slot chosen by the handle.
    /// A later read of the same buffer on the same stream needs no question: its record follows
    /// that one in stream order.
    static LAST_READS: [Cell<(usize, usize)>; READ_SLOTS] = const { [const { Cell::new((0, 0)) }; READ_SLOTS] };
}

/// The slot of `event` in [`LAST_READS`] (Fibonacci hashing of the handle).
#[inline]
fn read_slot(event: usize) -> usize {
    (event.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - READ_SLOTS.trailing_zeros())) % READ_SLOTS
}

impl Guard<'_> {
    /// For a read through cudarc's protocol, which keeps one read event per buffer and re-records
    /// it on the reading stream when this guard is dropped: makes `stream` wait first for the
    /// reader that event stands for now, if it may still run (on another stream). The record
    /// then stands for both reads, so that a later write or free — which waits for the read event
    /// only — waits for each. Without it, reads on two streams followed by a write let the write
    /// overtake the first read.
    ///
    /// Nothing is asked when this thread's previous read of the buffer recorded the event on the
    /// same stream (the common case: one buffer, one stream), so reads recorded meanwhile by other
    /// threads, or by cudarc's own copies and kernels, are not waited for then. Nor while a
    /// capture scope is open on any thread: the event may have been recorded into that capture by
    /// a cudarc read on the captured stream, and CUDA answers a question about such an event by
    /// invalidating the capture. An event last recorded inside a capture that has ended stands
    /// for no work that runs now, and is not waited for. The question is asked in relaxed capture
    /// mode, which no capture of another thread forbids.
    #[inline]
    fn after_earlier_reader(&self, stream: &CudaStream) -> Result<(), DriverError> {
        let Some(Owed(owed)) = &self.0 else { return Ok(()) };
        let SyncOnDrop::Record(Some((event, _))) = &**owed else { return Ok(()) };
        let this = (event.cu_event() as usize, stream.cu_stream() as usize);
        let slot = read_slot(this.0);
        if LAST_READS.with(|r| r[slot].get()) == this {
            return Ok(());
        }
        if capture::any_scope_open() {
            return Ok(());
        }
        wait_for_reader(event, stream)?;
        LAST_READS.with(|r| r[slot].set(this));
        Ok(())
    }
}

/// Makes `stream` wait for `event` (a buffer's read event) if the read it stands for may still
/// run: see `Guard::after_earlier_reader`.
#[inline(never)]
fn wait_for_reader(event: &CudaEvent, stream: &CudaStream) -> Result<(), DriverError> {
    let running = relaxed(|| match event.try_is_complete() {
        Ok(done) => Ok(!done),
        Err(DriverError(sys::CUresult::CUDA_ERROR_CAPTURED_EVENT)) => Ok(false),
        Err(e) => Err(e),
    })?;
    if running {
        stream.wait(event)?;
    }
    Ok(())
}

impl<'a> Guard<'a> {
    /// Keeps the guard in `kept` (the guards of work enqueued together, dropped after it), unless
    /// it is empty. Always inlined: a group calls it per buffer of every call (plain `#[inline]`
    /// was left out of line there, 17 instructions more per grouped call).
    #[inline(always)]
    pub fn keep_in(self, kept: &mut Vec<Guard<'a>>) {
        if !self.is_empty() {
            kept.push(self);
        }
    }
}

impl Drop for Owed<'_> {
    /// Records the use's event, or synchronises its stream, as dropping cudarc's guard would —
    /// but also when the context holds a recorded error: see [`settle`].
    #[inline]
    fn drop(&mut self) {
        // SAFETY: cudarc's guard is dropped here only, once, as `self` is.
        unsafe { settle(&mut self.0) }
    }
}

/// Does what dropping cudarc's guard `guard` does — record the buffer's event on the stream of the
/// use (while cudarc manages synchronisation), or synchronise that stream — without cudarc's check
/// of the context's recorded error first. That check takes an error that any use of the context,
/// on any thread, recorded since the call's own check (another buffer's guard of the same call
/// that failed, say) and skips the record: the work was enqueued all the same, and the buffer's
/// event would stand for a point before it, so that a later write or the free would not wait for
/// it. A failure here is recorded in the context, as cudarc does; cudarc's own drop, run here
/// after, then finds nothing left to do.
///
/// # Safety
///
/// `guard` is dropped here: it must not be used or dropped again.
#[cold]
#[inline(never)]
unsafe fn settle(guard: &mut ManuallyDrop<SyncOnDrop<'_>>) {
    match &mut **guard {
        SyncOnDrop::Record(target) => {
            // cudarc records events only while it manages synchronisation.
            let owed = target.take().filter(|(_, stream)| stream.context().is_managing_stream_synchronization());
            if let Some((event, stream)) = owed {
                let ctx = stream.context();
                let done = if event.context().cu_ctx() == ctx.cu_ctx() {
                    crate::make_current(ctx).and_then(|()| {
                        // SAFETY: the event and the stream are alive (borrowed by the guard), both
                        // of the context just made current.
                        unsafe { result::event::record(event.cu_event(), stream.cu_stream()) }
                    })
                } else {
                    Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_CONTEXT))
                };
                ctx.record_err(done);
            }
        }
        SyncOnDrop::Sync(target) => {
            if let Some(stream) = target.take() {
                let done = crate::make_current(stream.context()).and_then(|()| {
                    // SAFETY: the stream is alive (borrowed by the guard), of the context just
                    // made current.
                    unsafe { result::stream::synchronize(stream.cu_stream()) }
                });
                stream.context().record_err(done);
            }
        }
    }
    // SAFETY: the caller's promise: dropped once, here.
    unsafe { ManuallyDrop::drop(guard) }
}

impl<'a> From<SyncOnDrop<'a>> for Guard<'a> {
    /// The guard a buffer's `device_ptr` / `device_ptr_mut` returned; empty when it records and
    /// synchronises nothing.
    #[inline]
    fn from(guard: SyncOnDrop<'a>) -> Self {
        if matches!(guard, SyncOnDrop::Record(None) | SyncOnDrop::Sync(None)) {
            // Dropping it would do nothing.
            std::mem::forget(guard);
            Guard::NONE
        } else {
            Guard(Some(Owed(ManuallyDrop::new(guard))))
        }
    }
}

/// The call in progress on this thread while one pointer is taken: entering it makes it current
/// with nothing reported yet; leaving it (on every path) puts back the call and report that were
/// in progress before (none, unless calls nest).
struct Restore {
    call: Option<Call>,
    reported: Reported,
}

impl Restore {
    #[inline]
    fn enter(call: Call) -> Self {
        Restore { call: CURRENT.with(|c| c.replace(Some(call))), reported: REPORTED.with(Cell::take) }
    }

    /// What the buffer's tracker reported, if it has one.
    #[inline]
    fn reported(&self) -> Reported {
        REPORTED.with(Cell::take)
    }
}

impl Drop for Restore {
    #[inline]
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.call));
        REPORTED.with(|r| r.set(self.reported.take()));
    }
}

/// The helper streams of one context, made once and kept for the life of the process (a handful
/// of bytes per GPU).
pub(crate) struct Helpers {
    /// Never captured, and never running anything: the stream on which pointers are taken
    /// without ordering (a captured or surveyed call), and events recorded outside any capture.
    /// cudarc's waits for those pointers land here, so it accumulates waits for whatever work
    /// last used those buffers: never wait for it.
    pub(crate) idle: Arc<CudaStream>,
    /// Never given any work or wait at all: what [`quiesce`](crate::quiesce) forks its private
    /// streams from, so that they start waiting for nothing.
    pub(crate) clean: Arc<CudaStream>,
}

/// The helper streams of `ctx`. The last context this thread asked for is remembered, so that
/// captured calls skip the shared map.
pub(crate) fn helpers(ctx: &Arc<CudaContext>) -> Result<&'static Helpers, DriverError> {
    thread_local! {
        static LAST: Cell<Option<(usize, &'static Helpers)>> = const { Cell::new(None) };
    }
    static ALL: Mutex<Option<HashMap<usize, &'static Helpers>>> = Mutex::new(None);
    let key = ctx.cu_ctx() as usize;
    if let Some((k, h)) = LAST.with(Cell::get) {
        if k == key {
            return Ok(h);
        }
    }
    let mut all = ALL.lock().unwrap_or_else(|e| e.into_inner());
    let map = all.get_or_insert_with(HashMap::new);
    if let Some(&h) = map.get(&key) {
        LAST.with(|l| l.set(Some((key, h))));
        return Ok(h);
    }
    let made: &'static Helpers = Box::leak(Box::new(Helpers { idle: leaked_stream(ctx)?, clean: leaked_stream(ctx)? }));
    map.insert(key, made);
    LAST.with(|l| l.set(Some((key, made))));
    Ok(made)
}

/// A new non-blocking stream of `ctx`, never destroyed. Made through the driver: cudarc's
/// `new_stream` synchronises the whole device when the context gets its first stream.
fn leaked_stream(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>, DriverError> {
    relaxed(|| {
        ctx.bind_to_thread()?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)?;
        // SAFETY: `raw` is a stream of this context that nothing else owns; it is never destroyed
        // (its only wrapper is leaked with the `Helpers`), so the wrapper can never outlive it.
        Ok(unsafe { ctx.wrap_borrowed_stream(raw) })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_that_would_do_nothing_are_empty() {
        assert!(Guard::NONE.is_empty());
        assert!(Guard::from(SyncOnDrop::Record(None)).is_empty());
        assert!(Guard::from(SyncOnDrop::Sync(None)).is_empty());
        // No larger than cudarc's guard: an empty one is its own niche.
        assert_eq!(size_of::<Guard<'_>>(), size_of::<SyncOnDrop<'_>>());
    }

    #[test]
    fn read_events_spread_over_every_slot() {
        // Driver handles are aligned addresses; consecutive ones must not share a few slots.
        let slots: std::collections::HashSet<usize> =
            (0..4096usize).map(|i| read_slot(0x5555_0000_0000 + i * 64)).collect();
        assert_eq!(slots.len(), READ_SLOTS);
        assert!(slots.iter().all(|&s| s < READ_SLOTS));
    }
}
