//! The last-use tracker for device memory that has no cudarc events.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream, DriverError, SyncOnDrop};

use crate::access;
use crate::capture::{self, is_capturing, Complete};
use crate::context;
use crate::usage::{ElemType, Mode, Use};
use crate::OrderError;

/// Where a use ends.
enum End {
    /// On this stream, which the tracker keeps alive (so its handle cannot be reused by a new
    /// stream while it is remembered).
    Stream(Arc<CudaStream>),
    /// Recorded into this event, by the guard of a use on a stream the tracker cannot keep (one
    /// reached through cudarc's `&CudaStream` protocol). `stream` is that stream's handle (as a
    /// number: it is only compared).
    Event { event: Box<CudaEvent>, stream: usize },
}

/// A non-blocking operation whose completion (`complete`, e.g. NVSHMEM's quiet) has to be enqueued
/// on `stream` before the memory can be used again.
struct Pending {
    stream: Arc<CudaStream>,
    complete: Complete,
}

/// What the tracker knows about the memory's outstanding uses.
#[derive(Default)]
struct State {
    /// Where the last write ends (`None`: finished, or never written).
    writer: Option<End>,
    /// Where the reads since the last write end, on streams other than the writer's.
    readers: Vec<End>,
    /// Events no end uses any more, for the next uses on plain streams, each with the handle of
    /// the stream (as a number) that a guard may still record it on. They are only freed with the
    /// tracker, so a guard that still holds one never sees it freed; boxed, because guards hold
    /// their addresses while the vector grows. One is handed out again only for a use on its
    /// stream ([`StreamTracker::plain_event`]).
    spare: Vec<(Box<CudaEvent>, usize)>,
    pending: Option<Pending>,
}

/// Orders the uses of one device allocation across streams, for memory that cudarc's events do
/// not cover (`ncclMemAlloc`, the NVSHMEM symmetric heap).
///
/// It remembers where the last write ends and where every read since then ends. A read waits for
/// the last write; a write waits for the last write and every read. A read on the stream of the
/// last write, and any use on the stream that is the only user, cost two atomic loads (no lock, no
/// driver call); a use on another stream records an event on each stream it must wait for and
/// makes the new stream wait. Reads on several streams at once — two threads reading one buffer —
/// are all remembered, so a later write or the free waits for each of them.
///
/// Uses that are captured into a graph leave the tracker alone: the graph's launch orders itself
/// (see [`Graph`](crate::Graph)).
///
/// The fields that the common case reads (`fast`, `version`, `home`) come first, in this order
/// (`repr(C)`), so that they share one cache line with each other and, in a buffer that begins
/// with its address, length and stream (such as `nccl::MemBuffer`), with those too.
#[repr(C)]
pub struct StreamTracker {
    /// The fast paths, indexed by [`Use`] (`fast[0]` reads, `fast[1]` writes): the tagged handle
    /// ([`tag`]) of the stream on which such a use needs no wait and changes nothing — for reads,
    /// the stream of the last write; for writes, the only stream with outstanding uses — when that
    /// stream is held by `state` and belongs to the home context; 0 otherwise. Written under the
    /// lock, so that no other stream can have that handle while it is set.
    fast: [AtomicUsize; 2],
    /// Bumped before and after every change of `fast` (odd while changing): a reader that sees the
    /// same even value before and after its comparison knows the stream it matched was held alive
    /// throughout (a seqlock).
    version: AtomicUsize,
    /// The context of the stream the tracker was created on.
    home: Arc<CudaContext>,
    /// What the tracker knows about the outstanding uses; `fast` mirrors it.
    state: Mutex<State>,
    /// Recorded on a stream and waited for at once, under the lock.
    scratch: CudaEvent,
    /// The context handle the tracker's events are made from ([`context::unchecked`]): an error
    /// recorded in the user's handle makes cudarc skip no record of them.
    events: Arc<CudaContext>,
    /// The per-thread default stream under `events`' handle, made at the first use on that
    /// stream: the guard of such a use synchronises it, and cudarc's synchronisation through the
    /// user's handle would take an error recorded there and skip the wait.
    per_thread: OnceLock<Arc<CudaStream>>,
    /// This tracker's identity ([`StreamTracker::key`]), unique in the process: the tracker lives
    /// inside its buffer and moves with it, so its address cannot name it.
    key: usize,
}

/// The next [`StreamTracker::key`].
static NEXT_KEY: AtomicUsize = AtomicUsize::new(1);

/// A stream's handle as [`StreamTracker::fast`] stores it: never 0 (the legacy default stream's
/// handle is 0), and stream handles are even, so tagging keeps them distinct.
#[inline]
fn tag(stream: &CudaStream) -> usize {
    stream.cu_stream() as usize | 1
}

fn same(a: &CudaStream, b: &CudaStream) -> bool {
    a.cu_stream() == b.cu_stream() && Arc::ptr_eq(a.context(), b.context())
}

impl fmt::Debug for StreamTracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        let end = |e: &End| match e {
            End::Stream(s) => format!("stream {:p}", s.cu_stream()),
            End::Event { stream, .. } => format!("event on stream {stream:#x}"),
        };
        f.debug_struct("StreamTracker")
            .field("writer", &state.writer.as_ref().map(end))
            .field("readers", &state.readers.iter().map(end).collect::<Vec<_>>())
            .field("pending", &state.pending.is_some())
            .finish()
    }
}

impl StreamTracker {
    /// A tracker for memory whose first use (its allocation, or its first write) is on `home`.
    /// The per-thread default stream is refused ([`OrderError::PerThreadStream`]).
    pub fn new(home: &Arc<CudaStream>) -> Result<Self, OrderError> {
        capture::refuse_per_thread(home)?;
        let state = State { writer: Some(End::Stream(home.clone())), ..State::default() };
        let events = context::unchecked(home.context())?;
        Ok(StreamTracker {
            state: Mutex::new(state),
            fast: [AtomicUsize::new(tag(home)), AtomicUsize::new(tag(home))],
            version: AtomicUsize::new(0),
            home: home.context().clone(),
            scratch: events.new_event(None)?,
            events,
            per_thread: OnceLock::new(),
            key: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// True when a use `how` on `stream` certainly needs no wait and changes nothing: no lock, no
    /// driver call.
    #[inline]
    pub(crate) fn needs_nothing(&self, stream: &CudaStream, how: Use) -> bool {
        let before = self.version.load(Ordering::SeqCst);
        let fast = &self.fast[how as usize];
        let hit = fast.load(Ordering::SeqCst) == tag(stream) && Arc::ptr_eq(stream.context(), &self.home);
        hit && before.is_multiple_of(2) && self.version.load(Ordering::SeqCst) == before
    }

    /// This tracker's identity, for the capture scope's list of buffers a pending non-blocking
    /// operation still uses: a number given at creation, not the address (a buffer swapped with
    /// another inside a capture moves its tracker to the other's place, and a pending operation
    /// must follow its memory, not the place).
    #[inline]
    pub(crate) fn key(&self) -> usize {
        self.key
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent between statements, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the fast paths in step with `state` (call with the lock held, after every change).
    fn refresh(&self, state: &State) {
        let home = |s: &Arc<CudaStream>| if Arc::ptr_eq(s.context(), &self.home) { tag(s) } else { 0 };
        let (read, write) = match (&state.writer, state.readers.as_slice(), &state.pending) {
            (_, _, Some(_)) => (0, 0),
            (Some(End::Stream(s)), [], None) => (home(s), home(s)),
            (Some(End::Stream(s)), _, None) => (home(s), 0),
            // A write would have to become the last write: not without the lock.
            (None, [End::Stream(s)], None) => (home(s), 0),
            _ => (0, 0),
        };
        if self.fast[0].load(Ordering::SeqCst) == read && self.fast[1].load(Ordering::SeqCst) == write {
            return;
        }
        self.version.fetch_add(1, Ordering::SeqCst);
        self.fast[0].store(read, Ordering::SeqCst);
        self.fast[1].store(write, Ordering::SeqCst);
        self.version.fetch_add(1, Ordering::SeqCst);
    }

    /// Enqueues the completion of a pending non-blocking operation, if any. Not into a capture:
    /// the completion would not run now.
    fn complete_pending(&self, state: &mut State) -> Result<(), OrderError> {
        if let Some(p) = &state.pending {
            if is_capturing(&p.stream)? {
                return Err(OrderError::CaptureOpen);
            }
            (p.complete)(&p.stream).map_err(OrderError::Pending)?;
            state.pending = None;
        }
        Ok(())
    }

    /// Makes `stream` wait for the end `end` (nothing when it is on `stream` itself). True when
    /// it waited for an event recorded on another stream: the one kind of wait that can join
    /// `stream` to a capture open there (a stream end is refused while it is captured).
    fn wait_for(&self, end: &End, stream: &CudaStream) -> Result<bool, OrderError> {
        match end {
            End::Stream(s) if same(s, stream) => Ok(false),
            End::Stream(s) => {
                if is_capturing(s)? {
                    return Err(OrderError::CaptureOpen);
                }
                self.scratch.record(s)?;
                stream.wait(&self.scratch)?;
                Ok(false)
            }
            End::Event { event, stream: on } => match stream.wait(event) {
                Ok(()) => Ok(*on != stream.cu_stream() as usize),
                Err(e) if captured_record(&e) => {
                    self.replace_captured_record(event, stream).map_err(|_| e)?;
                    Ok(false)
                }
                Err(e) => Err(e.into()),
            },
        }
    }

    /// Recovers an end whose event CUDA no longer lets anyone wait for: one last recorded inside
    /// a capture that has ended (a cudarc guard dropped after its stream's capture began; the
    /// capture was then refused). The work that event stood for is somewhere in the context:
    /// the whole context is waited for, and the event recorded again, eagerly, on `stream`, so
    /// that it stands for that finished work from now on. Any error leaves the end as it was.
    /// The wait is for the whole device, with the tracker's lock held, and without a bound: work
    /// of other libraries that waits for this process's later work would hang it (README, "Known
    /// gaps"); the thread's capture mode is relaxed for it, so that another thread's capture does
    /// not refuse it.
    fn replace_captured_record(&self, event: &CudaEvent, stream: &CudaStream) -> Result<(), DriverError> {
        capture::relaxed(|| crate::quiesce::synchronize_device(&self.home))?;
        event.record(stream)
    }

    /// Makes `stream` wait for the uses a use `how` conflicts with (after enqueuing a pending
    /// completion). Call with the lock held, before the use is enqueued. True when one of the
    /// waits was for an event of another stream ([`Self::wait_for`]).
    fn wait_conflicts(&self, state: &mut State, stream: &CudaStream, how: Use) -> Result<bool, OrderError> {
        self.complete_pending(state)?;
        let mut other_events = false;
        if let Some(w) = &state.writer {
            other_events |= self.wait_for(w, stream)?;
        }
        if how == Use::Write {
            for r in &state.readers {
                other_events |= self.wait_for(r, stream)?;
            }
        }
        Ok(other_events)
    }

    /// Makes the use ending at `end` the last use of its kind, once [`Self::wait_conflicts`] has
    /// ordered it. Call with the lock held.
    fn place(&self, state: &mut State, end: End, how: Use) {
        match how {
            Use::Write => {
                // The write waited for every earlier use, so later uses need not. A guard of an
                // earlier use may still be alive, though, and record its event again when dropped
                // (views taken through `&self`, such as nvshmem's `Symmetric::as_slice`, let a
                // write through one view happen while a read's guard through another is kept):
                // the events stay tied to their streams among the spares.
                let old = state.writer.replace(end).into_iter().chain(state.readers.drain(..));
                let freed: Vec<_> = old.filter_map(into_event).collect();
                state.spare.extend(freed);
            }
            Use::Read => {
                let known = match (&end, &state.writer) {
                    (End::Stream(s), Some(End::Stream(w))) if same(s, w) => true,
                    (End::Stream(s), _) => state.readers.iter().any(|r| matches!(r, End::Stream(o) if same(o, s))),
                    _ => false,
                };
                // A known stream end needs nothing more: later writes already wait for it.
                if !known {
                    state.readers.push(end);
                }
            }
        }
        self.refresh(state);
    }

    /// Orders a use on `stream`, which the tracker keeps alive, after every conflicting earlier
    /// use; call it before enqueuing the work. Not for streams being captured.
    pub(crate) fn use_on(&self, stream: &Arc<CudaStream>, how: Use) -> Result<(), OrderError> {
        if self.needs_nothing(stream, how) {
            return Ok(());
        }
        // A stream of another context kept as the last use would have every later wait record
        // the scratch event there, which CUDA refuses: the buffer could be ordered no more.
        if context::placement(&self.home, stream.context()) != context::Placement::Same {
            return Err(OrderError::StreamOfOtherContext);
        }
        let mut state = self.lock();
        self.wait_conflicts(&mut state, stream, how)?;
        self.place(&mut state, End::Stream(stream.clone()), how);
        Ok(())
    }

    /// Blocks the host until every outstanding use has finished (after enqueuing a pending
    /// completion), e.g. before the memory is freed. What the tracker knows of those uses is kept:
    /// another thread may be ordering a use at the same time (placed here, not yet enqueued),
    /// which later uses and the free must still wait for.
    pub fn synchronize(&self) -> Result<(), OrderError> {
        let mut state = self.lock();
        self.complete_pending(&mut state)?;
        let ends = state.writer.iter().chain(state.readers.iter());
        for end in ends {
            match end {
                End::Stream(s) => {
                    if is_capturing(s)? {
                        return Err(OrderError::CaptureOpen);
                    }
                    self.scratch.record(s)?;
                    self.scratch.synchronize()?;
                }
                // An event last recorded inside a capture that has ended cannot be waited for
                // (see `replace_captured_record`): the context can, and it covers that use.
                End::Event { event, .. } => match event.synchronize() {
                    Err(e) if captured_record(&e) => {
                        capture::relaxed(|| crate::quiesce::synchronize_device(&self.home)).map_err(|_| e)?;
                    }
                    done => done?,
                },
            }
        }
        self.refresh(&state);
        Ok(())
    }

    /// Remembers a non-blocking operation on the memory, issued on `stream`, whose completion
    /// `complete(stream)` enqueues (NVSHMEM's quiet): every later use and the free enqueue it first
    /// (unless [`StreamTracker::completed`] says it was enqueued), so that forgetting the handle
    /// of the operation cannot skip it. It replaces the operation remembered before, if any.
    ///
    /// # Safety
    ///
    /// The completion of any operation the tracker still remembers has been enqueued where that
    /// operation ran, or `complete(stream)` completes it too: the one remembered before is
    /// forgotten, and the memory could otherwise be reused or freed while it still reads or
    /// writes it. (A use of the memory enqueues the remembered completion first, so an operation
    /// whose own use of the memory went through this tracker meets this.)
    pub unsafe fn pending(&self, stream: &Arc<CudaStream>, complete: Complete) {
        let mut state = self.lock();
        state.pending = Some(Pending { stream: stream.clone(), complete });
        self.refresh(&state);
    }

    /// Forgets the pending operation on `stream`: its completion was enqueued there.
    ///
    /// # Safety
    ///
    /// A completion of every non-blocking operation issued on `stream` before this call (for
    /// NVSHMEM: `nvshmemx_quiet_on_stream`) has been enqueued on `stream`. Without it, the memory
    /// could be reused or freed while the operation still reads or writes it.
    pub unsafe fn completed(&self, stream: &CudaStream) {
        let mut state = self.lock();
        if state.pending.as_ref().is_some_and(|p| same(&p.stream, stream)) {
            state.pending = None;
            self.refresh(&state);
        }
    }

    /// The guard for a use of `bytes` bytes at `ptr` (inside this tracker's allocation), as
    /// elements of `T`, through cudarc's [`DevicePtr`](cudarc::driver::DevicePtr) protocol on
    /// `stream`: [`tracked_device_ptr!`](crate::tracked_device_ptr) calls it. A graph keeps a
    /// captured use only in a buffer of elements of `T`.
    ///
    /// Inside an [`Access`](crate::Access) (a call of the communication crates) the access has
    /// already decided: the use is ordered on its stream, which the tracker keeps, or recorded by
    /// the capture scope. From other cudarc code (copies, kernel launches) the use is ordered here:
    /// on the scope's stream of this thread's [`capture`](crate::capture) it is recorded for the
    /// graph; on a stream being captured by anything else the capture is made to fail (the graph
    /// would use the memory without keeping it alive); otherwise it waits for the conflicting
    /// uses, and the returned guard records it in an event. Where no event can order it (the
    /// per-thread default stream, a failed CUDA call) the host waits for every earlier use and the
    /// guard synchronises the stream after it. CUDA errors that leave a use unordered are recorded
    /// in the context, as cudarc does in its own guards.
    ///
    /// # Safety
    ///
    /// A [`Use::Write`] needs that no other thread uses the memory until the guard is dropped, as
    /// a `&mut` to the buffer gives ([`DevicePtrMut`](cudarc::driver::DevicePtrMut)), or a buffer
    /// whose views all stay on one thread: a write forgets the earlier readers, since later uses
    /// wait for the write, which waits for them, so a read that another thread has ordered but not
    /// yet enqueued would be waited for by nobody, and the memory could be freed under it. Guards
    /// of earlier uses on this thread may still be alive (views taken through `&self`): their
    /// events are handed out again only for uses on their own streams. A [`Use::Read`] needs
    /// nothing more than the tracker's own promise.
    pub unsafe fn device_ptr_guard<'a, T>(
        &'a self,
        stream: &'a CudaStream,
        ptr: sys::CUdeviceptr,
        bytes: usize,
        how: Use,
    ) -> SyncOnDrop<'a> {
        let in_call = access::with_current(stream, |arc, mode| match mode {
            Mode::Eager => self.use_on(arc, how),
            Mode::Captured => {
                capture::complete_before_use(arc, self.key());
                Ok(())
            }
            Mode::Survey => Ok(()),
        });
        if let Some(ordered) = in_call {
            access::report(ordered);
            return SyncOnDrop::Record(None);
        }
        match capture::mode(stream) {
            Ok(Mode::Captured) => {
                capture::complete_before_use(stream, self.key());
                capture::record_use(stream, capture::Used { ptr, bytes, how, elem: ElemType::of::<T>() });
                return SyncOnDrop::Record(None);
            }
            Err(OrderError::ForeignCapture) => {
                // Only when the capture could not be broken is the refusal recorded in the
                // context: a recorded error makes cudarc's `end_capture` return it before ending
                // the capture, which would leave the stream capturing.
                if !capture::invalidate(stream) {
                    stream.context().record_err(Err::<(), _>(to_driver(OrderError::ForeignCapture)));
                }
                return SyncOnDrop::Record(None);
            }
            // CUDA invalidated the capture and refuses every enqueue into it: the use cannot
            // happen, and a recorded error would keep cudarc's `end_capture` from ending it.
            Err(OrderError::CaptureBroken(_)) => return SyncOnDrop::Record(None),
            // The per-thread default stream (one handle, another stream on each thread), or the
            // driver could not say whether the stream is captured: no event can order the use.
            Err(e) => return self.order_on_host(stream, to_driver(e)),
            Ok(_) => {}
        }
        if self.needs_nothing(stream, how) {
            return SyncOnDrop::Record(None);
        }
        if stream.cu_stream().is_null() {
            // The legacy default stream, which cudarc does not count among the context's
            // streams: the context may enter or leave cudarc's multi-stream mode (another thread
            // creating its first stream, or dropping its last) between this guard's creation and
            // its drop, and cudarc's guard would then skip its record or its synchronisation. So
            // the use ends "on the stream" instead: later uses and the free wait for everything
            // queued on it by then, this use included, with no guard to rely on.
            return match self.use_on(&stream.context().default_stream(), how) {
                Ok(()) => SyncOnDrop::Record(None),
                Err(e) => self.order_on_host(stream, to_driver(e)),
            };
        }
        let mut state = self.lock();
        let (event, was_reader) = match self.plain_event(&mut state, stream) {
            Ok(taken) => taken,
            Err(e) => {
                drop(state);
                return self.order_on_host(stream, e);
            }
        };
        // Kept, never freed: a guard of an earlier use may still hold it. A reader's event goes
        // back among the readers: that reader's guard may yet record it, and later uses must
        // still wait for it.
        let give_back = |state: &mut State, event: Box<CudaEvent>| {
            let on = stream.cu_stream() as usize;
            if was_reader {
                state.readers.push(End::Event { event, stream: on });
            } else {
                state.spare.push((event, on));
            }
        };
        let other_events = match self.wait_conflicts(&mut state, stream, how) {
            Ok(other_events) => other_events,
            Err(e) => {
                give_back(&mut state, event);
                drop(state);
                return self.order_on_host(stream, to_driver(e));
            }
        };
        // A wait for an event recorded inside an open capture joins `stream` to that capture:
        // the use would be captured into a graph that keeps nothing and is ordered with nothing.
        // The capture is broken instead (as `Access::recheck` does for the crates' calls), so the
        // use is refused by CUDA and the buffer keeps its earlier ends. Only a wait for another
        // stream's event can do that, so the driver is asked again only after one.
        match if other_events { capture::mode(stream) } else { Ok(Mode::Eager) } {
            Ok(Mode::Eager) => {}
            Ok(_) | Err(OrderError::ForeignCapture | OrderError::CaptureBroken(_)) => {
                give_back(&mut state, event);
                drop(state);
                if !capture::invalidate(stream) {
                    stream.context().record_err(Err::<(), _>(to_driver(OrderError::ForeignCapture)));
                }
                return SyncOnDrop::Record(None);
            }
            Err(e) => {
                give_back(&mut state, event);
                drop(state);
                return self.order_on_host(stream, to_driver(e));
            }
        }
        // The event stands for this use from here on, and `place` forgets the uses a write
        // replaces: it is recorded now, after the waits for them, and again when the guard drops.
        // A guard can be forgotten (`mem::forget` is safe) and an event never recorded counts as
        // complete, so without this record nothing would wait for those earlier uses any more,
        // neither a later use nor the free.
        if let Err(e) = event.record(stream) {
            give_back(&mut state, event);
            drop(state);
            return self.order_on_host(stream, e);
        }
        let event_ptr: *const CudaEvent = &*event;
        self.place(&mut state, End::Event { event, stream: stream.cu_stream() as usize }, how);
        drop(state);
        if stream.context().is_managing_stream_synchronization() {
            // SAFETY: the event is boxed and owned by this tracker (as an end or a spare) until
            // the tracker is dropped, which the borrow `'a` of `self` rules out while the guard
            // lives; boxes never move their contents.
            SyncOnDrop::Record(Some((unsafe { &*event_ptr }, stream)))
        } else {
            // cudarc records events only while it manages synchronisation: without that, the
            // stream is synchronised after the use instead, so the event (never recorded, hence
            // complete) stays truthful.
            SyncOnDrop::Sync(Some(stream))
        }
    }

    /// Orders a use through cudarc's protocol on `stream` that no event could order (`why`: the
    /// per-thread default stream, whose one handle names another stream on each thread, or a
    /// failed CUDA call): cudarc enqueues it whatever the guard says, so the host orders it
    /// instead. Every recorded use is waited for before it, and the guard synchronises `stream`
    /// once cudarc has enqueued it, so nothing of it is left running for later uses or the free
    /// to wait for. Nothing is recorded in the context then: cudarc's synchronisation in the guard
    /// would take a recorded error for its own and skip the wait.
    ///
    /// Only when the host cannot wait for the earlier uses (one of them on a stream that is being
    /// captured) is `why` recorded, as cudarc does in its own guards: the use races them. Its own
    /// end is then remembered as an event that the guard records after it ([`Self::end_after`]),
    /// through the tracker's own handle of the context, where nothing records errors, so that
    /// later uses and the free still wait for it. (Before session 29 the guard synchronised the
    /// stream through its own handle, whose recorded `why` made cudarc skip the wait: a buffer
    /// read by a cudarc copy on a busy stream while its last use's stream was captured could be
    /// freed under the copy.)
    ///
    /// The guard synchronises the per-thread default stream through the tracker's own handle of
    /// the context (the stream's handle names the same stream there, on the thread that drops the
    /// guard): through the user's handle, cudarc would take an error recorded there meanwhile (by
    /// any use of the context, on any thread) and skip the wait, and the use would be left running
    /// unrecorded. A use that a failed CUDA call left to the host on another stream keeps that
    /// stream's own synchronisation.
    #[cold]
    fn order_on_host<'a>(&'a self, stream: &'a CudaStream, why: DriverError) -> SyncOnDrop<'a> {
        if self.synchronize().is_err() {
            stream.context().record_err(Err::<(), _>(why));
            if let Some(guard) = self.end_after(stream) {
                return guard;
            }
        }
        if capture::is_per_thread(stream) {
            let unchecked = self.per_thread.get_or_init(|| self.events.per_thread_stream());
            return SyncOnDrop::Sync(Some(unchecked));
        }
        SyncOnDrop::Sync(Some(stream))
    }

    /// For a use on `stream` that could not be ordered after the earlier uses: an event among the
    /// readers' ends that the returned guard records once cudarc has enqueued the use, so that
    /// later uses and the free wait for it (recorded as a read, which replaces no earlier end: the
    /// use was not ordered after them). `None` where an event cannot serve: the per-thread default
    /// stream, a context out of cudarc's multi-stream mode (whose guards record nothing), or no
    /// event to be had.
    fn end_after<'a>(&'a self, stream: &'a CudaStream) -> Option<SyncOnDrop<'a>> {
        if capture::is_per_thread(stream) || !stream.context().is_managing_stream_synchronization() {
            return None;
        }
        let mut state = self.lock();
        let (event, _) = self.plain_event(&mut state, stream).ok()?;
        let event_ptr: *const CudaEvent = &*event;
        self.place(&mut state, End::Event { event, stream: stream.cu_stream() as usize }, Use::Read);
        // SAFETY: as in `device_ptr`: the event is boxed and owned by this tracker (as an end or a
        // spare) until the tracker is dropped, which the borrow `'a` of `self` rules out while
        // the guard lives; boxes never move their contents.
        Some(SyncOnDrop::Record(Some((unsafe { &*event_ptr }, stream))))
    }

    /// An event for the end of a use on the plain stream `stream`: a reader's event of the same
    /// stream that holds nothing unfinished (its last record completed, or its guard has yet to
    /// record on that very stream, which its borrow keeps alive), else a spare of the same stream
    /// or a new one; with whether it was a reader's. While a capture scope is open no reader's
    /// event is asked (`cuEventQuery` from the capturing thread, or of an event recorded into the
    /// capture, would invalidate the capture): a spare or a new one serves.
    ///
    /// A spare of another stream never serves: a guard of the use it stood for may still be alive
    /// and record it on its own stream when dropped, after which the event would stand for a point
    /// there instead of this use, and later uses and the free would not wait for this use (session
    /// 29 audit). On its own stream that later record stands for a point after this use too.
    fn plain_event(&self, state: &mut State, stream: &CudaStream) -> Result<(Box<CudaEvent>, bool), DriverError> {
        let reusable = if capture::any_scope_open() {
            None
        } else {
            state.readers.iter().position(|r| match r {
                End::Event { event, stream: s } => *s == stream.cu_stream() as usize && event.is_complete(),
                End::Stream(_) => false,
            })
        };
        if let Some(i) = reusable {
            if let Some((event, _)) = into_event(state.readers.swap_remove(i)) {
                return Ok((event, true));
            }
        }
        let on = stream.cu_stream() as usize;
        match state.spare.iter().rposition(|(_, s)| *s == on) {
            Some(i) => Ok((state.spare.swap_remove(i).0, false)),
            None => Ok((Box::new(self.events.new_event(None)?), false)),
        }
    }
}

/// True for what CUDA answers about an event last recorded inside a capture that has ended: a
/// wait for it is `CUDA_ERROR_INVALID_VALUE` (seen on an H100, CUDA 13), a host wait or query
/// `CUDA_ERROR_CAPTURED_EVENT`.
fn captured_record(e: &DriverError) -> bool {
    matches!(e.0, sys::CUresult::CUDA_ERROR_INVALID_VALUE | sys::CUresult::CUDA_ERROR_CAPTURED_EVENT)
}

/// The event of a plain-stream end, to be reused, with its stream's handle.
fn into_event(end: End) -> Option<(Box<CudaEvent>, usize)> {
    match end {
        End::Event { event, stream } => Some((event, stream)),
        End::Stream(_) => None,
    }
}

/// cudarc's contexts store only driver error codes.
fn to_driver(e: OrderError) -> DriverError {
    match e {
        OrderError::Cuda(e) => e,
        OrderError::PerThreadStream => DriverError(sys::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED),
        _ => DriverError(sys::cudaError_enum::CUDA_ERROR_STREAM_CAPTURE_ISOLATION),
    }
}

/// What [`tracked_device_ptr!`](crate::tracked_device_ptr) needs from a buffer: its address,
/// length in elements, tracker and home stream. Made only by the `unsafe` [`Tracked::new`], so
/// that safe code cannot describe memory it does not own.
#[derive(Clone, Copy)]
pub struct Tracked<'a> {
    ptr: sys::CUdeviceptr,
    len: usize,
    tracker: &'a StreamTracker,
    home: &'a Arc<CudaStream>,
}

impl<'a> Tracked<'a> {
    /// The parts of a tracked buffer of `len` elements at `ptr` in `home`'s context.
    ///
    /// # Safety
    ///
    /// `ptr` is valid device memory for `len` elements of the buffer's element type (aligned for
    /// it) in `home`'s context, for as long as the value the parts describe is borrowed; `tracker`
    /// is the tracker of the whole allocation (shared by every view of it), every use of the
    /// memory is ordered through it, and the allocation is freed only after
    /// [`StreamTracker::synchronize`] has returned. This is the promise of
    /// [`DeviceMemory`](crate::DeviceMemory) that [`tracked_device_ptr!`](crate::tracked_device_ptr)
    /// makes for the type. For a type that macro makes writable, also: while a `&mut` to the value
    /// lives, no other thread uses the memory — the value is the buffer or a view taken through
    /// `&mut` to it, or the buffer and all its views stay on one thread (neither `Send` nor
    /// `Sync`, as nvshmem's are).
    pub unsafe fn new(
        ptr: sys::CUdeviceptr,
        len: usize,
        tracker: &'a StreamTracker,
        home: &'a Arc<CudaStream>,
    ) -> Self {
        Tracked { ptr, len, tracker, home }
    }

    /// The device address.
    #[inline]
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The length in elements.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for zero elements.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The tracker.
    #[inline]
    pub fn tracker(&self) -> &'a StreamTracker {
        self.tracker
    }

    /// The home stream.
    #[inline]
    pub fn home(&self) -> &'a Arc<CudaStream> {
        self.home
    }
}

/// Implements cudarc's [`DeviceSlice`](cudarc::driver::DeviceSlice),
/// [`DevicePtr`](cudarc::driver::DevicePtr) and [`DevicePtrMut`](cudarc::driver::DevicePtrMut), and
/// this crate's [`DeviceMemory`](crate::DeviceMemory) (with [`DeviceMemory::tracked`](crate::DeviceMemory::tracked),
/// through which an [`Access`](crate::Access) orders the common case without `device_ptr`), for a
/// buffer type that holds a [`StreamTracker`], so that cudarc copies, cudarc kernels and the
/// communication calls all order themselves against it.
///
/// `tracked_device_ptr!([T] MemBuffer<T>, |b| unsafe { Tracked::new(b.ptr, b.len, &b.tracker, &b.home) })`:
/// the closure returns the buffer's [`Tracked`] parts, which only the `unsafe`
/// [`Tracked::new`] makes — its safety contract is the promise of `DeviceMemory`, so the
/// `unsafe` block (and its `// SAFETY:` comment) is the invoker's. The element type parameter
/// must be named `T`. With `read` in front (`tracked_device_ptr!(read ['a, T] View<'a, T>, |v| …)`)
/// only `DeviceSlice` and `DevicePtr` are implemented: for shared views, which must not be written
/// through. With `, registration |b| expr` after the closure, [`DeviceMemory::registration`](crate::DeviceMemory::registration)
/// returns `Some(expr)`: for memory that captured work reaches through a registration.
#[macro_export]
macro_rules! tracked_device_ptr {
    (read [$($gen:tt)*] $ty:ty, |$b:ident| $parts:expr) => {
        $crate::tracked_device_ptr!(@common [$($gen)*] $ty, |$b| $parts);
    };
    ([$($gen:tt)*] $ty:ty, |$b:ident| $parts:expr $(, registration |$r:ident| $reg:expr)?) => {
        $crate::tracked_device_ptr!(@common [$($gen)*] $ty, |$b| $parts $(, registration |$r| $reg)?);
        impl<$($gen)*> ::cudarc::driver::DevicePtrMut<T> for $ty {
            fn device_ptr_mut<'__a>(
                &'__a mut self,
                stream: &'__a ::cudarc::driver::CudaStream,
            ) -> (::cudarc::driver::sys::CUdeviceptr, ::cudarc::driver::SyncOnDrop<'__a>) {
                let $b = &*self;
                let parts: $crate::Tracked<'__a> = $parts;
                let bytes = parts.len() * ::std::mem::size_of::<T>();
                // SAFETY: no other thread uses the memory while `&mut self` (borrowed for the
                // guard's life) lives, as the invoker promised through `Tracked::new`.
                let guard = unsafe { parts.tracker().device_ptr_guard::<T>(stream, parts.ptr(), bytes, $crate::Use::Write) };
                (parts.ptr(), guard)
            }
        }
    };
    (@common [$($gen:tt)*] $ty:ty, |$b:ident| $parts:expr $(, registration |$r:ident| $reg:expr)?) => {
        impl<$($gen)*> ::cudarc::driver::DeviceSlice<T> for $ty {
            fn len(&self) -> usize {
                let $b = self;
                let parts: $crate::Tracked<'_> = $parts;
                parts.len()
            }
            fn stream(&self) -> &::std::sync::Arc<::cudarc::driver::CudaStream> {
                let $b = self;
                let parts: $crate::Tracked<'_> = $parts;
                parts.home()
            }
        }
        impl<$($gen)*> ::cudarc::driver::DevicePtr<T> for $ty {
            fn device_ptr<'__a>(
                &'__a self,
                stream: &'__a ::cudarc::driver::CudaStream,
            ) -> (::cudarc::driver::sys::CUdeviceptr, ::cudarc::driver::SyncOnDrop<'__a>) {
                let $b = self;
                let parts: $crate::Tracked<'__a> = $parts;
                let bytes = parts.len() * ::std::mem::size_of::<T>();
                // SAFETY: a read, which needs nothing more.
                let guard = unsafe { parts.tracker().device_ptr_guard::<T>(stream, parts.ptr(), bytes, $crate::Use::Read) };
                (parts.ptr(), guard)
            }
        }
        // SAFETY: the parts come from `Tracked::new`, whose caller (the invoker of this macro)
        // promised exactly what `DeviceMemory` requires; the implementations above hand out those
        // parts and order every use through the tracker.
        unsafe impl<$($gen)*> $crate::DeviceMemory for $ty {
            type Elem = T;
            #[inline]
            fn tracked(&self) -> ::std::option::Option<$crate::Tracked<'_>> {
                let $b = self;
                ::std::option::Option::Some($parts)
            }
            $(
                #[inline]
                fn registration(&self) -> ::std::option::Option<$crate::Resource> {
                    let $r = self;
                    ::std::option::Option::Some($reg)
                }
            )?
        }
    };
}

/// Tells the capture scope of `stream`, if any, that a non-blocking operation (NVSHMEM `_nbi`)
/// was just captured on it, completed by `complete` (NVSHMEM's quiet). Unless a completion is
/// captured after it ([`captured_completion`](crate::captured_completion)), the scope enqueues `complete` into the capture
/// before ending it, so that every launch of the graph completes the operation (and joins back
/// the streams it forked to). True when there is such a scope (the operation was captured, not
/// enqueued).
///
/// A later captured use of the operation's local buffer (whose tracker is `local`) gets the
/// completion enqueued before it, as an eager use does through the tracker: the buffer is the
/// operation's until then.
///
/// # Safety
///
/// `complete(stream)` completes every non-blocking operation captured on `stream` so far that no
/// captured completion followed: it replaces the completion the scope held for them.
pub unsafe fn captured_nonblocking(stream: &CudaStream, local: &StreamTracker, complete: Complete) -> bool {
    capture::nonblocking_captured(stream, local.key(), complete)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trackers_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<StreamTracker>();
    }
}
