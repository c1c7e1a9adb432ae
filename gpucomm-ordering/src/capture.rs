//! Capture state: whether a stream is being captured, this thread's capture scope (what its
//! captured calls use), breaking a capture these crates did not open, ending the scope's capture
//! whatever happened inside it, and host-side waits during a capture.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::{result, sys, CudaStream, DriverError};

use crate::usage::{ElemType, Mode, Resource, Use};
use crate::OrderError;

/// True while `stream` is being captured into a CUDA graph (`cuStreamIsCapturing`).
#[inline]
pub fn is_capturing(stream: &CudaStream) -> Result<bool, DriverError> {
    bind_if_implicit(stream)?;
    // SAFETY: the stream is borrowed, so it and its context are alive.
    let status = unsafe { result::stream::is_capturing(stream.cu_stream()) }?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// `CU_STREAM_LEGACY`: the handle of the legacy default stream (null names it too).
const LEGACY: usize = 1;
/// `CU_STREAM_PER_THREAD`: the handle of the calling thread's own default stream.
const PER_THREAD: usize = 2;

/// True for the per-thread default stream (cudarc's `per_thread_stream`).
#[inline]
pub(crate) fn is_per_thread(stream: &CudaStream) -> bool {
    stream.cu_stream() as usize == PER_THREAD
}

/// [`OrderError::PerThreadStream`] for the per-thread default stream.
#[inline]
pub(crate) fn refuse_per_thread(stream: &CudaStream) -> Result<(), OrderError> {
    if is_per_thread(stream) {
        Err(OrderError::PerThreadStream)
    } else {
        Ok(())
    }
}

/// Makes `stream`'s context current when its handle names no stream by itself: null and
/// `CU_STREAM_LEGACY` (1), the legacy default stream, and `CU_STREAM_PER_THREAD` (2), cudarc's
/// `per_thread_stream`. The driver resolves these through the current context: asked with another
/// context current, it would answer for another stream.
#[inline]
fn bind_if_implicit(stream: &CudaStream) -> Result<(), DriverError> {
    if stream.cu_stream() as usize <= PER_THREAD {
        stream.context().bind_to_thread()?;
    }
    Ok(())
}

/// Breaks the capture of `stream` (one these crates did not open), so that CUDA refuses to make
/// its graph: queries the stream (`cuStreamQuery`), which CUDA forbids on a stream being captured
/// and answers by invalidating the capture. Through the driver directly: cudarc's calls first
/// return an error recorded in the context and would skip the query. True when the capture is
/// invalidated now; ending it (cudarc's `end_capture`) then fails and leaves the stream usable.
pub(crate) fn invalidate(stream: &CudaStream) -> bool {
    if bind_if_implicit(stream).is_err() {
        return false;
    }
    // SAFETY: the stream is borrowed, so it and its context are alive; the query only reads it.
    // Its error (the refusal that invalidates the capture) is the point, not a failure.
    let _ = unsafe { sys::cuStreamQuery(stream.cu_stream()) };
    // SAFETY: as above.
    let status = unsafe { result::stream::is_capturing(stream.cu_stream()) };
    status == Ok(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED)
}

/// The captures this crate's scopes have open, on every thread ([`open`] to [`end`]).
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// True while a capture scope is open on some thread: an event may then stand for work recorded
/// into its capture, and asking CUDA about such an event (`cuEventQuery`) invalidates the
/// capture, whatever the asking thread's capture mode.
#[inline]
pub(crate) fn any_scope_open() -> bool {
    OPEN.load(Ordering::Acquire) > 0
}

/// The private stream a scope's capture begins on ([`begin`]). CUDA lets only the stream that
/// began a capture end it: the stream given to [`crate::capture`] joins the capture instead, so
/// code that holds that stream (cudarc's safe `CudaStream::end_capture`, called inside the
/// scope's closure) cannot end the capture and walk away with a graph that keeps nothing alive.
pub(crate) struct Origin {
    stream: sys::CUstream,
}

impl Drop for Origin {
    fn drop(&mut self) {
        // SAFETY: created by `begin` and destroyed once, here, after its capture ended (`end`)
        // or failed to begin; CUDA releases a stream once its work is done. A failure cannot be
        // acted on in a drop.
        let _ = unsafe { result::stream::destroy(self.stream) };
    }
}

/// Begins capturing `stream` in thread-local mode: on a new private [`Origin`] stream, which
/// `stream` then joins (it waits for an event recorded into the capture), so that every call
/// enqueued on `stream` is captured until [`end`].
pub(crate) fn begin(stream: &CudaStream) -> Result<Origin, DriverError> {
    if stream.cu_stream() as usize <= LEGACY {
        // CUDA refuses to capture the legacy default stream (`cuStreamBeginCapture` answers
        // this), and the stream every thread shares must not join this thread's capture.
        return Err(DriverError(sys::cudaError_enum::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
    }
    crate::make_current(stream.context())?;
    let origin = Origin { stream: result::stream::create(result::stream::StreamKind::NonBlocking)? };
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    // SAFETY: the origin was just created in the current context and is not capturing.
    unsafe { result::stream::begin_capture(origin.stream, mode) }?;
    if let Err(e) = follow(stream.cu_stream(), origin.stream) {
        // `stream` could not join (another thread began capturing it since `capture` asked,
        // say): end the empty capture.
        // SAFETY: this thread began the origin's capture just above.
        if let Ok(graph) = unsafe { result::stream::end_capture(origin.stream) } {
            destroy_graph(graph);
        }
        return Err(e);
    }
    Ok(origin)
}

/// Makes `waiter` wait for the work enqueued on `after` so far, through an event of its own:
/// inside a capture, the stream that was not capturing joins the capture of the other.
fn follow(waiter: sys::CUstream, after: sys::CUstream) -> Result<(), DriverError> {
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
    let wait = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
    // SAFETY: the event was just created in the current context, the streams' own; both streams
    // are alive (the caller's borrow, and the origin its capture scope owns).
    let joined =
        unsafe { result::event::record(event, after).and_then(|()| result::stream::wait_event(waiter, event, wait)) };
    // SAFETY: created above and destroyed once; a wait on it keeps what it needs (CUDA defers
    // the release), and a captured record and wait are edges of the graph, not uses of the event.
    let _ = unsafe { result::event::destroy(event) };
    joined
}

/// Destroys a graph that nothing else refers to (null: nothing to destroy).
fn destroy_graph(graph: sys::CUgraph) {
    if !graph.is_null() {
        // SAFETY: the caller owns the graph and hands it over; a failure leaves nothing to do.
        let _ = unsafe { result::graph::destroy(graph) };
    }
}

/// Ends the capture of `stream` ([`begin`] on `origin`, then [`open`]) whatever happened inside
/// it, and instantiates its graph (`None` when CUDA returned none). CUDA's failures are
/// [`OrderError::CaptureBroken`]; a graph that allocates memory it does not free is
/// [`OrderError::AllocationLeft`].
pub(crate) fn end(stream: &CudaStream, origin: &Origin) -> Result<Option<Exec>, OrderError> {
    let ended = end_capture(stream, origin);
    OPEN.fetch_sub(1, Ordering::AcqRel);
    ended
}

/// [`end`]'s work: `stream` joins back into the origin, which ends the capture. Through the
/// driver directly: cudarc's `end_capture` returns an error recorded in the context (by cudarc's
/// own guards, inside the capture or on another thread) *before* ending the capture, which would
/// leave the stream capturing for good. The capture is ended even when the join fails (a capture
/// CUDA invalidated refuses it): ending it then fails, and every stream leaves the capture.
fn end_capture(stream: &CudaStream, origin: &Origin) -> Result<Option<Exec>, OrderError> {
    let joined = crate::make_current(stream.context()).and_then(|()| follow(origin.stream, stream.cu_stream()));
    // SAFETY: the origin is alive and being captured by this thread (`begin`).
    let graph = unsafe { result::stream::end_capture(origin.stream) }.map_err(OrderError::CaptureBroken)?;
    if let Err(e) = joined {
        destroy_graph(graph);
        return Err(OrderError::CaptureBroken(e));
    }
    if graph.is_null() {
        return Ok(None);
    }
    match allocation_left(graph) {
        Ok(None) => {}
        // The graph is left alive (leaked): while it lives its allocations' addresses stay
        // reserved, unbacked, so that the slice that names one faults when used instead of
        // reaching memory a later graph allocates there.
        Ok(Some((ptr, bytes))) => return Err(OrderError::AllocationLeft { ptr, bytes }),
        Err(e) => {
            destroy_graph(graph);
            return Err(OrderError::CaptureBroken(e));
        }
    }
    // SAFETY: `graph` was just returned by CUDA and is owned here.
    match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
        Ok(exec) => Ok(Some(Exec { graph, exec })),
        Err(e) => {
            destroy_graph(graph);
            Err(OrderError::CaptureBroken(e))
        }
    }
}

/// The first allocation (address, bytes) that `graph` makes and does not free, if any. cudarc
/// allocates on a stream being captured without refusing: the allocation becomes a node of the
/// graph, backed only while a launch of the graph holds it, so a `CudaSlice` made inside a
/// capture and kept past it names memory that nothing backs before the graph's first launch and
/// that other graphs may share. One driver call per node, once per capture.
fn allocation_left(graph: sys::CUgraph) -> Result<Option<(sys::CUdeviceptr, usize)>, DriverError> {
    use sys::CUgraphNodeType::{CU_GRAPH_NODE_TYPE_MEM_ALLOC, CU_GRAPH_NODE_TYPE_MEM_FREE};
    let mut count = 0;
    // SAFETY: `graph` is alive (the caller owns it); a null array asks for the count only.
    unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count) }.result()?;
    if count == 0 {
        // An empty graph (a one-rank communicator's in-place call captures nothing): CUDA
        // answers a second call with an array and a count of 0 with CUDA_ERROR_INVALID_VALUE
        // (one H100, CUDA 13).
        return Ok(None);
    }
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: the array holds `count` nodes, and CUDA writes at most that many (and says how many).
    unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) }.result()?;
    nodes.truncate(count);
    let (mut made, mut freed) = (Vec::new(), Vec::new());
    for node in nodes {
        let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: `node` is a node of the live graph; CUDA writes its type.
        unsafe { sys::cuGraphNodeGetType(node, &mut kind) }.result()?;
        if kind == CU_GRAPH_NODE_TYPE_MEM_ALLOC {
            // SAFETY: an all-zero parameter block is valid (plain integers and a null pointer);
            // CUDA fills it for an allocation node.
            let mut params: sys::CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
            // SAFETY: `node` is an allocation node of the live graph.
            unsafe { sys::cuGraphMemAllocNodeGetParams(node, &mut params) }.result()?;
            made.push((params.dptr, params.bytesize));
        } else if kind == CU_GRAPH_NODE_TYPE_MEM_FREE {
            let mut ptr = 0;
            // SAFETY: `node` is a free node of the live graph; CUDA writes the address it frees.
            unsafe { sys::cuGraphMemFreeNodeGetParams(node, &mut ptr) }.result()?;
            freed.push(ptr);
        }
    }
    Ok(made.into_iter().find(|(ptr, _)| !freed.contains(ptr)))
}

/// A captured graph and its executable instance, owned (cudarc's `CudaGraph` cannot be made from a
/// capture that [`end`] ended).
pub(crate) struct Exec {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl Exec {
    /// Launches the graph on `stream` (`cuGraphLaunch`).
    pub(crate) fn launch(&self, stream: &CudaStream) -> Result<(), DriverError> {
        stream.context().bind_to_thread()?;
        // SAFETY: the executable graph is alive (owned by `self`), and so is the stream.
        unsafe { result::graph::launch(self.exec, stream.cu_stream()) }
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        // SAFETY: both are owned by `self` and destroyed once, here; a launch still running keeps
        // its resources until it completes (CUDA defers the release). Failures cannot be acted
        // on in a drop.
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}

/// Runs `f` with this thread's capture interaction mode set to relaxed
/// (`cuThreadExchangeStreamCaptureMode`), then restores the previous mode. Host-side waits for
/// streams that are *not* being captured are harmless to a capture, but the default (global) mode
/// would refuse them while any capture is open. The mode is restored when `f` panics too.
pub fn relaxed<R, E: From<DriverError>>(f: impl FnOnce() -> Result<R, E>) -> Result<R, E> {
    let mut mode = relax()?;
    let out = f();
    let restored = mode.restore();
    let out = out?;
    restored.map(|()| out).map_err(E::from)
}

/// This thread's capture interaction mode set to relaxed (`cuThreadExchangeStreamCaptureMode`)
/// until the guard is dropped, which puts the previous mode back: for host calls of a library
/// that waits on the host or copies synchronously inside (NVSHMEM's allocation and host
/// barrier), which the default (global) mode makes CUDA refuse while another thread captures in
/// global mode (PyTorch's default), and which such a library may answer by exiting the process.
/// What the thread does meanwhile must not touch a stream being captured. Drop guards in the
/// reverse order of taking them: one dropped before a guard taken after it, or forgotten, leaves
/// the thread relaxed (CUDA then lets its calls that could break a capture through, instead of
/// refusing them).
#[doc(alias = "cuThreadExchangeStreamCaptureMode")]
pub fn relax() -> Result<RelaxedMode, DriverError> {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: the call swaps a plain enum through a valid pointer.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result()?;
    Ok(RelaxedMode { earlier: Some(mode), _thread: std::marker::PhantomData })
}

/// The guard of [`relax`]: puts this thread's earlier capture interaction mode back when dropped.
/// Not `Send`: the mode is the thread's.
#[must_use = "the mode is relaxed only while the guard lives"]
pub struct RelaxedMode {
    earlier: Option<sys::CUstreamCaptureMode>,
    _thread: std::marker::PhantomData<*const ()>,
}

impl RelaxedMode {
    /// Puts the earlier mode back now (once).
    fn restore(&mut self) -> Result<(), DriverError> {
        let Some(mut mode) = self.earlier.take() else { return Ok(()) };
        // SAFETY: the call swaps a plain enum through a valid pointer; this restores the mode
        // the first exchange read.
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result()
    }
}

impl Drop for RelaxedMode {
    fn drop(&mut self) {
        // A failure cannot be acted on in a drop.
        let _ = self.restore();
    }
}

/// One use of device memory by a captured call, on the scope's stream (a scope records uses on
/// that stream only, so each is made in its device and CUDA context: see [`Place`]). The address
/// comes first, so that comparing two uses of different buffers stops at the first field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Used {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) bytes: usize,
    pub(crate) how: Use,
    /// The element type of the buffer the use was made through.
    pub(crate) elem: ElemType,
}

/// The device and CUDA context (`CUcontext` as a number) of a scope's stream, where all of the
/// scope's recorded uses were made: two contexts of one device map the same address to different
/// memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) ordinal: usize,
    pub(crate) ctx: usize,
}

impl Place {
    /// The place of `stream`'s uses.
    pub(crate) fn of(stream: &CudaStream) -> Self {
        Place { ordinal: stream.context().ordinal(), ctx: stream.context().cu_ctx() as usize }
    }
}

/// The capture this thread has open through [`crate::capture`]: its stream, and what the calls
/// captured so far use.
pub(crate) struct Scope {
    stream: sys::CUstream,
    ctx: sys::CUcontext,
    pub(crate) used: Vec<Used>,
    pub(crate) resources: Vec<Resource>,
    /// What the resources asked to be held while captured work holds them
    /// ([`Access::resource_held`](crate::Access::resource_held)): moved into the graph, or
    /// dropped once the capture failed and its partial graph is gone.
    pub(crate) held: Vec<Held>,
    /// The chains the graph's launches join ([`join_launches`]), each once.
    pub(crate) chains: Vec<LaunchChain>,
    /// Non-blocking operations captured with no completion after them yet: their completion is
    /// enqueued into the capture before a captured use of their local buffers, or else before
    /// the capture ends.
    pending: Option<Nonblocking>,
    /// Why an earlier completion could not be enqueued.
    failed: Option<String>,
}

/// How many of the latest recorded uses a new one is compared with: a loop captures the same few
/// buffers again and again, and a repeated use adds nothing to the graph's plan, so it is not
/// recorded twice (the list, and the plan made from it, stay as long as the distinct uses).
const RECENT_USES: usize = 8;

impl Scope {
    /// A scope for the capture of stream `stream` of context `ctx`, with nothing recorded yet.
    fn empty(stream: sys::CUstream, ctx: sys::CUcontext) -> Self {
        Scope {
            stream,
            ctx,
            used: Vec::new(),
            resources: Vec::new(),
            held: Vec::new(),
            chains: Vec::new(),
            pending: None,
            failed: None,
        }
    }

    /// Records a captured use, unless one of the latest recorded ones is the same (looked for
    /// from the latest back: a loop's repeated call finds its uses among the last few).
    #[inline]
    fn note(&mut self, used: Used) {
        if !self.has_recent(used) {
            self.used.push(used);
        }
    }

    /// Whether `used` is one of the latest recorded uses (looked for from the latest back).
    #[inline]
    fn has_recent(&self, used: Used) -> bool {
        let recent = &self.used[self.used.len().saturating_sub(RECENT_USES)..];
        recent.iter().rev().any(|u| *u == used)
    }

    /// Records a resource, unless it is recorded already, with what `hold` makes the first time.
    /// (`iter().any` rather than `contains`, which is not inlined: 34 instructions more per
    /// captured call, `tools/host-instructions.sh`.)
    #[inline]
    #[allow(clippy::manual_contains)]
    fn note_resource(&mut self, resource: Resource, hold: Option<impl FnOnce() -> Held>) {
        if !self.resources.iter().any(|r| *r == resource) {
            self.resources.push(resource);
            self.held.extend(hold.map(|make| make()));
        }
    }

    /// True when this scope captures `stream`.
    #[inline]
    fn captures(&self, stream: &CudaStream) -> bool {
        self.stream == stream.cu_stream() && self.ctx == stream.context().cu_ctx()
    }
}

/// Non-blocking operations awaiting their completion inside a capture.
struct Nonblocking {
    complete: Complete,
    /// The keys of their local buffers' trackers ([`StreamTracker::key`](crate::StreamTracker)).
    locals: Vec<usize>,
}

/// Enqueues the completion of the non-blocking operations issued on a stream before it
/// (NVSHMEM's quiet); the error as text.
pub type Complete = fn(&CudaStream) -> Result<(), String>;

thread_local! {
    /// This thread's open scope: set by [`open`] to a scope that [`close`] takes back, null
    /// otherwise. A pointer, not the scope itself: a thread-local without a destructor is reached
    /// with one load, where one that owns vectors first checks its registration (every captured
    /// call reaches the scope several times).
    static SCOPE: Cell<*const RefCell<Scope>> = const { Cell::new(std::ptr::null()) };
}

/// Installs `scope` as this thread's open scope (none may be open).
fn install(scope: Scope) {
    let scope = Box::into_raw(Box::new(RefCell::new(scope)));
    let earlier = SCOPE.replace(scope);
    debug_assert!(earlier.is_null(), "one scope per thread (`capture` refuses nesting)");
}

/// Takes this thread's open scope back, if one is open.
fn uninstall() -> Option<Scope> {
    let scope = SCOPE.replace(std::ptr::null());
    // SAFETY: a non-null pointer is the box `install` leaked, and taking it out of the
    // thread-local first makes this its only owner.
    (!scope.is_null()).then(|| unsafe { Box::from_raw(scope as *mut RefCell<Scope>) }.into_inner())
}

/// Runs `f` on this thread's open scope, if one is open.
#[inline]
fn on_scope<R>(f: impl FnOnce(&RefCell<Scope>) -> R) -> Option<R> {
    let scope = SCOPE.get();
    // SAFETY: a non-null pointer is the box `install` leaked, freed only by `uninstall` on this
    // thread, which nulls the pointer first; `f` gets it for this call only and nothing it is
    // handed reaches `uninstall` (closing happens in `crate::capture`'s own frame).
    (!scope.is_null()).then(|| f(unsafe { &*scope }))
}

/// True when this thread's scope captures `stream`.
#[inline]
fn owns(stream: &CudaStream) -> bool {
    on_scope(|s| s.borrow().captures(stream)).unwrap_or(false)
}

/// How work enqueued on `stream` now is handled: run eagerly, or recorded by this thread's scope.
/// A capture the scope did not open (cudarc's `begin_capture`, another library's, another stream
/// joined into the scope's capture) is refused: its graph would not keep alive what the work uses.
/// A capture that CUDA invalidated, whoever opened it, is refused with
/// [`OrderError::CaptureBroken`]: CUDA would refuse the work anyway, and a library that takes that
/// refusal for a fatal error (NVSHMEM exits the process) must not be called. The per-thread
/// default stream is refused ([`OrderError::PerThreadStream`]). One `cuStreamIsCapturing`.
#[inline]
pub(crate) fn mode(stream: &CudaStream) -> Result<Mode, OrderError> {
    refuse_per_thread(stream)?;
    if !capturing(stream)? {
        Ok(Mode::Eager)
    } else if owns(stream) {
        Ok(Mode::Captured)
    } else {
        Err(OrderError::ForeignCapture)
    }
}

/// True while `stream` is being captured into a CUDA graph (`cuStreamIsCapturing`), by anyone; a
/// capture that CUDA invalidated is refused with [`OrderError::CaptureBroken`]: CUDA refuses any
/// work on it, and a library that takes that refusal for a fatal error (NVSHMEM exits the
/// process) must not be called on it.
#[inline]
pub fn capturing(stream: &CudaStream) -> Result<bool, OrderError> {
    use sys::CUstreamCaptureStatus as Status;
    bind_if_implicit(stream)?;
    // SAFETY: the stream is borrowed, so it and its context are alive.
    match unsafe { result::stream::is_capturing(stream.cu_stream()) }? {
        Status::CU_STREAM_CAPTURE_STATUS_NONE => Ok(false),
        Status::CU_STREAM_CAPTURE_STATUS_ACTIVE => Ok(true),
        _ => Err(broken()),
    }
}

/// [`OrderError::CaptureBroken`] for a capture that CUDA invalidated.
#[cold]
pub(crate) fn broken() -> OrderError {
    OrderError::CaptureBroken(DriverError(sys::cudaError_enum::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED))
}

/// Runs `f` on this thread's scope, if it captures `stream`, and returns what `f` returns (`None`
/// without such a scope). The recording functions below move their values into `f` and take their
/// results out as its return value, rather than through references to their own locals: a
/// captured call records each buffer and resource through here, and the references cost loads
/// and stores on every record (a captured `all_reduce`: 50 instructions fewer this way).
#[inline]
fn with_scope<R>(stream: &CudaStream, f: impl FnOnce(&mut Scope) -> R) -> Option<R> {
    on_scope(|s| {
        let mut scope = s.borrow_mut();
        scope.captures(stream).then(|| f(&mut scope))
    })
    .flatten()
}

/// Records a captured use (`used`) on `stream`'s device.
pub(crate) fn record_use(stream: &CudaStream, used: Used) {
    with_scope(stream, |s| s.note(used));
}

/// Records a captured use (`used`) on `stream`'s device, in memory whose tracker has the key
/// `local`: after the completion of a pending non-blocking operation on that memory,
/// as [`complete_before_use`] enqueues it, then as [`record_use`] records it (one look at the
/// scope for both).
///
/// A loop's repeated call finds its use among the latest recorded ones with no operation pending,
/// and then nothing is left to do: that case is looked for first, with a shared borrow, and
/// anything else goes through [`record_tracked_use_slow`] (each buffer of a captured call comes
/// here: a captured `all_reduce` costs 483 instructions over the raw call this way, 513 with
/// everything in one function, `tools/host-instructions.sh`; inlining this one made the eager,
/// grouped and captured calls dearer).
pub(crate) fn record_tracked_use(stream: &CudaStream, local: usize, used: Used) {
    let done =
        on_scope(|s| s.try_borrow().is_ok_and(|s| s.pending.is_none() && s.captures(stream) && s.has_recent(used)));
    if done == Some(false) {
        record_tracked_use_slow(stream, local, used);
    }
}

/// [`record_tracked_use`] of a use not found among the latest, or with an operation pending.
#[cold]
#[inline(never)]
fn record_tracked_use_slow(stream: &CudaStream, local: usize, used: Used) {
    let due = with_scope(stream, |s| {
        let due = take_pending_use(s, local);
        s.note(used);
        due
    });
    complete_now(stream, due.flatten());
}

/// What a graph holds for a resource its captured calls use ([`Scope::held`]).
pub(crate) type Held = Box<dyn Send + Sync>;

/// Records that a captured call uses `resource`, and the first time the scope records it, what
/// `hold` makes, if given.
#[inline]
pub(crate) fn record_resource(stream: &CudaStream, resource: Resource, hold: Option<impl FnOnce() -> Held>) {
    with_scope(stream, |s| s.note_resource(resource, hold));
}

/// How a graph's launch joins the order that work of its kind keeps among eager work: called with
/// the launch stream (its context current) and the launch itself, it runs the launch in that
/// order (after the work before it, and recorded for the work after it). NVSHMEM's collective
/// chain is one: a PE's collectives, eager or in a graph, run one at a time.
pub type LaunchChain = fn(&CudaStream, &mut dyn FnMut() -> Result<(), OrderError>) -> Result<(), OrderError>;

/// Records that the work a call captures on `stream` (by this thread's scope; nothing otherwise)
/// makes the graph's launches join `chain`.
pub fn join_launches(stream: &CudaStream, chain: LaunchChain) {
    with_scope(stream, |s| {
        if !s.chains.iter().any(|&c| std::ptr::fn_addr_eq(c, chain)) {
            s.chains.push(chain);
        }
    });
}

/// Admits a call on `stream` that uses `resources` and no buffer (a barrier, a quiet): refused
/// inside a capture this crate did not open and inside one CUDA invalidated, recorded inside its
/// own. `Ok(true)` when the call is captured by this thread's scope.
pub fn admit(stream: &CudaStream, resources: &[Resource]) -> Result<bool, OrderError> {
    let captured = mode(stream)? == Mode::Captured;
    if captured {
        for &r in resources {
            record_resource(stream, r, None::<fn() -> Held>);
        }
    }
    Ok(captured)
}

/// The capture side of [`captured_nonblocking`](crate::captured_nonblocking): `local` is the key of
/// the operation's local buffer's tracker.
pub(crate) fn nonblocking_captured(stream: &CudaStream, local: usize, complete: Complete) -> bool {
    with_scope(stream, |s| {
        let pending = s.pending.get_or_insert(Nonblocking { complete, locals: Vec::new() });
        pending.complete = complete;
        pending.locals.push(local);
    })
    .is_some()
}

/// Before a captured use on `stream` of memory whose tracker has the key `local`: if a
/// non-blocking operation captured without a completion yet uses that memory, enqueues the
/// completion first.
pub(crate) fn complete_before_use(stream: &CudaStream, local: usize) {
    let due = with_scope(stream, |s| take_pending_use(s, local));
    complete_now(stream, due.flatten());
}

/// The scope's pending non-blocking operations, taken out, if one of them uses the memory whose
/// tracker has the key `local`.
fn take_pending_use(s: &mut Scope, local: usize) -> Option<Nonblocking> {
    if s.pending.as_ref().is_some_and(|p| p.locals.contains(&local)) {
        s.pending.take()
    } else {
        None
    }
}

/// Enqueues the completion of `due` (taken out of the scope of `stream`) into the capture, with
/// the scope not borrowed: the completion is a caller's function, which may ask the scope again.
/// A failure is kept in the scope, for [`close`] to return.
#[inline]
fn complete_now(stream: &CudaStream, due: Option<Nonblocking>) {
    if let Some(p) = due {
        complete_due(stream, p);
    }
}

/// [`complete_now`] of a due completion, out of line.
#[inline(never)]
fn complete_due(stream: &CudaStream, p: Nonblocking) {
    if let Err(e) = (p.complete)(stream) {
        with_scope(stream, |s| {
            s.failed.get_or_insert(e);
        });
    }
}

/// Tells the capture scope of `stream`, if any, that a completion (NVSHMEM's quiet) of every
/// non-blocking operation before it was captured on it.
///
/// # Safety
///
/// That completion has just been enqueued on `stream`. Without it, the scope would end the
/// capture without one, and the graph's launches would leave the operations running after the
/// graph completes, on memory that may then be reused or freed.
pub unsafe fn captured_completion(stream: &CudaStream) {
    with_scope(stream, |s| s.pending = None);
}

/// True when this thread has a capture scope open ([`crate::capture`]): host-side waits on this
/// thread are then refused by CUDA (the scope captures in thread-local mode).
pub fn scope_open() -> bool {
    !SCOPE.get().is_null()
}

thread_local! {
    /// What [`after_scope`] put off until this thread's scope closes.
    static AFTER: RefCell<Vec<Box<dyn FnOnce()>>> = const { RefCell::new(Vec::new()) };
}

/// Puts `f` off until this thread's capture scope has closed and its capture has ended, on every
/// path out of [`crate::capture`] (a panic in its closure included): for a teardown that waits on
/// the host, which CUDA refuses inside the capture — NVSHMEM's finalize when its runtime is
/// dropped inside the closure. `Err(f)` when this thread has no scope open (then nothing needs
/// putting off).
pub fn after_scope(f: Box<dyn FnOnce()>) -> Result<(), Box<dyn FnOnce()>> {
    if !scope_open() {
        return Err(f);
    }
    AFTER.with(|a| a.borrow_mut().push(f));
    Ok(())
}

/// Runs, in order, what [`after_scope`] put off: once the scope is closed and the capture ended.
pub(crate) fn run_after_scope() {
    let put_off = AFTER.with(|a| std::mem::take(&mut *a.borrow_mut()));
    for f in put_off {
        f();
    }
}

/// Opens this thread's scope for `stream`, which is being captured from now on.
pub(crate) fn open(stream: &CudaStream) {
    install(Scope::empty(stream.cu_stream(), stream.context().cu_ctx()));
    OPEN.fetch_add(1, Ordering::AcqRel);
}

/// Closes this thread's scope and returns what it recorded, after enqueuing on `stream` the
/// completion of non-blocking operations captured without one (a failure to enqueue this or an
/// earlier completion is returned with the scope).
pub(crate) fn close(stream: &CudaStream) -> (Option<Scope>, Result<(), String>) {
    let mut scope = uninstall();
    let Some(s) = scope.as_mut() else { return (None, Ok(())) };
    let completed = match s.pending.take() {
        Some(p) => (p.complete)(stream),
        None => Ok(()),
    };
    let completed = match s.failed.take() {
        Some(e) => Err(e),
        None => completed,
    };
    (scope, completed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> Scope {
        Scope::empty(std::ptr::null_mut(), std::ptr::null_mut())
    }

    #[test]
    fn a_resource_is_recorded_and_held_once() {
        use std::sync::Arc;
        let (comm, team) = (1u8, 2u8);
        let (comm, team) = (Resource::of("communicator", &comm), Resource::of("team", &team));
        let count = Arc::new(());
        let hold = || -> Held { Box::new(count.clone()) };
        let mut s = scope();
        for _ in 0..3 {
            s.note_resource(comm, Some(hold));
            s.note_resource(team, None::<fn() -> Held>);
        }
        assert_eq!(s.resources, [comm, team]);
        assert_eq!((s.held.len(), Arc::strong_count(&count)), (1, 2), "one hold, taken at the first record");
        drop(s);
        assert_eq!(Arc::strong_count(&count), 1, "the hold goes with the scope");
    }

    #[test]
    fn what_is_put_off_runs_once_after_the_scope_in_order() {
        use std::cell::RefCell;
        use std::rc::Rc;
        let ran = Rc::new(RefCell::new(Vec::new()));
        let note = |n: u8| -> Box<dyn FnOnce()> {
            let ran = ran.clone();
            Box::new(move || ran.borrow_mut().push(n))
        };
        // No scope open: handed back, nothing kept.
        assert!(after_scope(note(0)).is_err());
        install(scope());
        assert!(after_scope(note(1)).is_ok() && after_scope(note(2)).is_ok());
        assert!(ran.borrow().is_empty(), "nothing runs while the scope is open");
        drop(uninstall());
        run_after_scope();
        run_after_scope();
        assert_eq!(*ran.borrow(), [1, 2]);
    }

    #[test]
    fn a_repeated_use_is_recorded_once() {
        let mut s = scope();
        let read = Used { ptr: 0x1000, bytes: 256, how: Use::Read, elem: ElemType::of::<f32>() };
        let write = Used { ptr: 0x2000, how: Use::Write, ..read };
        for _ in 0..100 {
            s.note(read);
            s.note(write);
        }
        assert_eq!(s.used, [read, write]);
        // A use that differs in anything is recorded: here only in how the memory is used, then
        // only in the element type it was made through.
        s.note(Used { how: Use::Write, ..read });
        assert_eq!(s.used.len(), 3);
        s.note(Used { elem: ElemType::of::<u32>(), ..read });
        assert_eq!(s.used.len(), 4);
        // Beyond the latest RECENT_USES, a repeat is recorded again (the plan is the same).
        for i in 0..RECENT_USES as u64 {
            s.note(Used { ptr: 0x10_000 + i, ..read });
        }
        s.note(read);
        assert_eq!(s.used.len(), 5 + RECENT_USES);
    }
}
