//! Capturing calls into a CUDA graph that keeps alive — and orders — everything they use.
//!
//! [`capture`] runs a closure while its stream is captured, on the things the graph will keep
//! (`keep`: buffers, communicators, runtimes, teams, modules, in any tuple, array, `Vec` or
//! `Option` of them). Every communication call inside reports what it uses; when the capture
//! ends, each of those uses must lie in something `keep` holds, or the capture is refused. The
//! [`Graph`] owns `keep` — buffers by value, or the borrows you gave it — so nothing a captured
//! call uses can be freed, moved or destroyed while the graph exists: that is checked by the
//! compiler.
//!
//! [`Graph::launch`] orders each launch like a call: before it, the launch stream waits for
//! earlier uses of the kept buffers on other streams; after it, each buffer's ordering state (its
//! cudarc events, its [`StreamTracker`](crate::StreamTracker)) records the launch as a read or a
//! write, as the captured calls used it. So between launches you read outputs and write inputs
//! through [`Graph::kept`] / [`Graph::kept_mut`] on any stream, and dropping the graph (or
//! [`Graph::into_kept`] and dropping the buffers) waits for the last launch. If you replace a
//! kept buffer through `kept_mut`, the next launch notices that the memory the graph was captured
//! with is no longer kept and refuses to run.
//!
//! Calls on a stream being captured by anything else (cudarc's `begin_capture`, another library)
//! are refused with [`OrderError::ForeignCapture`]: such a graph would keep nothing alive.
//!
//! # What is covered
//!
//! * Every call of `nccl` and `nvshmem` on the scope's stream: its buffers, its communicator,
//!   operator, runtime, team or module.
//! * cudarc copies and kernel launches on the scope's stream that take a buffer with a
//!   [`StreamTracker`](crate::StreamTracker) (`MemBuffer`, `Symmetric`) through cudarc's
//!   `DevicePtr`: recorded and checked like the calls' uses. On a stream captured by anything
//!   else, such a use makes CUDA refuse that capture.
//! * cudarc work on cudarc's own `CudaSlice` inside a capture waits on the slice's events. For a
//!   slice used before the capture, CUDA refuses that wait inside it, and the capture fails
//!   ([`OrderError::CaptureBroken`]): give such buffers to the communication calls instead, which
//!   take them without waiting. A slice allocated inside `f` has no earlier event; its
//!   stream-ordered allocation is captured with it, so the graph's launches allocate that memory
//!   themselves: free it inside `f` too. A capture whose graph allocates memory it does not free
//!   (a slice that leaves `f`, in `keep` or in a variable outside) is refused
//!   ([`OrderError::AllocationLeft`]): such a slice names graph memory that nothing backs outside
//!   a launch of the graph, and that CUDA may share with other graphs' allocations (cudarc
//!   allocates on a capturing stream without refusing). The refused graph is kept, never
//!   launched, so that the slice's address stays reserved; do not use the slice (forget it).
//!   The per-thread default stream is refused ([`OrderError::PerThreadStream`]): in a
//!   context with that stream only, cudarc orders nothing by events, and its work on a slice would
//!   be captured without a trace.
//! * What a kernel reaches through raw addresses (a window handle, a pointer passed by value) is
//!   the kernel launch's own `unsafe` promise; keep what owns that memory in `keep` (its borrow
//!   then outlives the graph).
//! * Only the scope's stream is captured into the graph. Work forked to other streams inside the
//!   capture (through events) is refused like any foreign capture.
//! * A non-blocking operation (NVSHMEM `_nbi`) whose completion (quiet) is not captured after it
//!   — its handle forgotten, or `f` returning early — gets one before the next captured use of
//!   its local buffer, or else at the end of the capture: every launch completes it before the
//!   buffer is reused, and the internal streams it forked to are joined back.
//! * However `capture` returns (an error of `f`, a broken capture, a panic), the stream leaves
//!   capture mode: the capture is ended through the driver, not through cudarc's `end_capture`,
//!   which gives up before ending it when an error is recorded in the context.
//! * Only the scope can end its capture. The capture begins on a private stream that the given
//!   stream joins, and CUDA lets only the stream that began a capture end it: cudarc's safe
//!   `CudaStream::end_capture`, called on the given stream inside `f`, fails
//!   (`CUDA_ERROR_STREAM_CAPTURE_UNMATCHED`) instead of handing out a graph of the calls so far
//!   that would keep none of what they use.
//!
//! # Example
//!
//! `nccl::capture` and `nvshmem::capture` are this function with their crate's error type; the
//! example of `nccl::capture` captures one training step and replays it. In short:
//!
//! ```text
//! let mut step = nccl::capture(&side, (&comm, &average, grads), |(comm, average, grads)| {
//!     comm.on(&side).all_reduce_in_place(grads, *average)
//! })
//! .map_err(|(_kept, e)| e)?;                             // a refusal hands the keep set back
//! for _ in 0..100 {
//!     home.memcpy_htod(&inputs, &mut step.kept_mut().2)?; // write an input between launches
//!     step.launch()?;
//!     let out = home.clone_dtoh(&step.kept().2)?;        // read an output, on any stream
//! }
//! let (_, _, grads) = step.into_kept();                   // comm and average outlive the graph
//! ```

use std::fmt;
use std::sync::Arc;

use cudarc::driver::{sys, CudaStream, DevicePtr, DevicePtrMut, DriverError};

use crate::access::{Access, Guard};
use crate::capture::{self, is_capturing, Exec, Held, LaunchChain, Place, Used};
pub use crate::usage::Resource;
use crate::usage::{ElemType, Mode, Use};
use crate::{DeviceMemory, OrderError};

/// What a [`Graph`] keeps: buffers (by value, `&` or `&mut`) and the resources its calls use, in
/// any combination of tuples, arrays, `Vec`, `Box` and `Option`.
///
/// # Safety
///
/// `visit` must report exactly what `self` keeps alive for as long as it lives: every buffer it
/// passes to [`Visitor::read`] / [`Visitor::write`] is owned or borrowed by `self`, and every
/// resource passed to [`Visitor::resource`] is a borrow held by `self` of the very value the
/// resource names (so it cannot be dropped, moved or destroyed while `self` exists). The crates
/// implement it for their own types; implement it yourself only for wrappers of such members.
pub unsafe trait Keep {
    /// Reports every member to `v`, in the same order each time.
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>);
}

/// One member of a [`Keep`], as the graph saw it when it was planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Member {
    /// `ctx`: its CUDA context (`CUcontext` as a number), since two contexts of one device map
    /// the same address to different memory.
    Buffer {
        ordinal: usize,
        ctx: usize,
        ptr: sys::CUdeviceptr,
        bytes: usize,
        elem: ElemType,
        writable: bool,
    },
    Resource(Resource),
}

/// What the graph does with each member: `None` for members no captured call uses.
type Plan = Vec<(Member, Option<Use>)>;

/// Walks the members of a [`Keep`]: to list them (when a graph is planned) or to order the used
/// ones on the launch stream (when it is launched).
pub struct Visitor<'k> {
    job: Job<'k>,
    next: usize,
    error: Option<OrderError>,
}

enum Job<'k> {
    Survey { access: &'k Access<'k>, members: Vec<Member> },
    Launch { access: &'k Access<'k>, plan: &'k [(Member, Option<Use>)], guards: Vec<Guard<'k>>, stale: bool },
}

impl<'k> Visitor<'k> {
    fn fail(&mut self, e: OrderError) {
        self.error.get_or_insert(e);
    }

    /// The planned member at the current position, if its kind matches.
    fn planned(&self) -> Option<(Member, Option<Use>)> {
        match &self.job {
            Job::Launch { plan, .. } => plan.get(self.next).copied(),
            Job::Survey { .. } => None,
        }
    }

    /// Compares a used buffer's address, size and element type now with the plan's.
    fn check(&mut self, now: Member) {
        let same = self.planned().is_some_and(|(planned, _)| same_buffer(planned, now));
        if let Job::Launch { stale, .. } = &mut self.job {
            *stale |= !same;
        }
    }

    /// Ends the visit of one buffer member: what taking its pointer gave (a pointer to compare
    /// with the plan, nothing, or an error to keep), and on to the next member.
    fn taken(&mut self, taken: Result<Option<sys::CUdeviceptr>, OrderError>, at: Place, bytes: usize, elem: ElemType) {
        let Place { ordinal, ctx } = at;
        match taken {
            Ok(Some(ptr)) => self.check(Member::Buffer { ordinal, ctx, ptr, bytes, elem, writable: false }),
            Ok(None) => {}
            Err(e) => self.fail(e),
        }
        self.next += 1;
    }

    /// A buffer the graph keeps and may only read.
    pub fn read<B: DeviceMemory + DevicePtr<B::Elem>>(&mut self, buf: &'k B) {
        let Place { ordinal, ctx } = Place::of(buf.stream());
        let (bytes, elem) = (buf.num_bytes(), ElemType::of::<B::Elem>());
        let planned = self.planned();
        let taken = match &mut self.job {
            Job::Survey { access, members, .. } => access.read(buf).map(|(ptr, _)| {
                members.push(Member::Buffer { ordinal, ctx, ptr, bytes, elem, writable: false });
                None
            }),
            Job::Launch { access, guards, stale, .. } => match planned {
                Some((Member::Buffer { writable: false, .. }, Some(Use::Read))) => access.read(buf).map(|(ptr, g)| {
                    g.keep_in(guards);
                    Some(ptr)
                }),
                Some((Member::Buffer { writable: false, .. }, None)) => Ok(None),
                _ => {
                    *stale = true;
                    Ok(None)
                }
            },
        };
        self.taken(taken, Place { ordinal, ctx }, bytes, elem);
    }

    /// A buffer the graph keeps and may write.
    pub fn write<B: DeviceMemory + DevicePtr<B::Elem> + DevicePtrMut<B::Elem>>(&mut self, buf: &'k mut B) {
        let Place { ordinal, ctx } = Place::of(buf.stream());
        let (bytes, elem) = (buf.num_bytes(), ElemType::of::<B::Elem>());
        let planned = self.planned();
        let taken = match &mut self.job {
            Job::Survey { access, members, .. } => access.read(&*buf).map(|(ptr, _)| {
                members.push(Member::Buffer { ordinal, ctx, ptr, bytes, elem, writable: true });
                None
            }),
            Job::Launch { access, guards, stale, .. } => match planned {
                Some((Member::Buffer { writable: true, .. }, Some(how))) => {
                    let taken = match how {
                        Use::Read => access.read(&*buf),
                        Use::Write => access.write(buf),
                    };
                    taken.map(|(ptr, g)| {
                        g.keep_in(guards);
                        Some(ptr)
                    })
                }
                Some((Member::Buffer { writable: true, .. }, None)) => Ok(None),
                _ => {
                    *stale = true;
                    Ok(None)
                }
            },
        };
        self.taken(taken, Place { ordinal, ctx }, bytes, elem);
    }

    /// A resource the graph keeps; `live` is false once it cannot be used any more (an aborted
    /// communicator).
    pub fn resource(&mut self, resource: Resource, live: bool) {
        let planned = self.planned();
        match &mut self.job {
            Job::Survey { members, .. } => members.push(Member::Resource(resource)),
            Job::Launch { stale, .. } => match planned {
                Some((Member::Resource(r), used)) if r == resource => {
                    if used.is_some() && !live {
                        self.error.get_or_insert(OrderError::ResourceClosed { kind: resource.kind() });
                    }
                }
                _ => *stale = true,
            },
        }
        self.next += 1;
    }
}

/// Whether buffer `now` is the buffer the plan saw as `planned`: the same device, context,
/// address, size and element type.
fn same_buffer(planned: Member, now: Member) -> bool {
    matches!((planned, now), (
        Member::Buffer { ptr: p, ordinal: o, ctx: c, bytes: b, elem: e, .. },
        Member::Buffer { ptr, ordinal, ctx, bytes, elem, .. },
    ) if p == ptr && o == ordinal && c == ctx && b == bytes && e == elem)
}

/// Lists the members of `keep`, taking buffer addresses without ordering anything.
fn survey<K: Keep>(keep: &mut K, stream: &Arc<CudaStream>) -> Result<Vec<Member>, OrderError> {
    let access = Access::with_mode(stream, Mode::Survey);
    let mut v = Visitor { job: Job::Survey { access: &access, members: Vec::new() }, next: 0, error: None };
    keep.visit(&mut v);
    let Visitor { job, error, .. } = v;
    let members = match job {
        Job::Survey { members, .. } => members,
        Job::Launch { .. } => Vec::new(),
    };
    match error {
        Some(e) => Err(e),
        None => Ok(members),
    }
}

/// Orders the used members of `keep` on the access's stream, as `plan` says; the guards record
/// the uses when dropped (after the launch). `false` when the members no longer match the plan.
fn order_members<'k, K: Keep>(
    keep: &'k mut K,
    access: &'k Access<'k>,
    plan: &'k [(Member, Option<Use>)],
) -> Result<(Vec<Guard<'k>>, bool), OrderError> {
    let mut v = Visitor { job: Job::Launch { access, plan, guards: Vec::new(), stale: false }, next: 0, error: None };
    keep.visit(&mut v);
    let Visitor { job, next, error } = v;
    if let Some(e) = error {
        return Err(e);
    }
    match job {
        Job::Launch { guards, stale, .. } => Ok((guards, !stale && next == plan.len())),
        Job::Survey { .. } => Ok((Vec::new(), false)),
    }
}

/// Which member holds each use (all made at `place`, the captured stream's device and context):
/// every use must lie inside a kept buffer (a writable one for a write) and every resource must
/// be kept, and a use lies only in a buffer of the element type it was made through (see
/// [`ElemType`]), whether planned at the end of the capture or again after members changed.
fn plan(members: Vec<Member>, place: Place, used: &[Used], resources: &[Resource]) -> Result<Plan, OrderError> {
    let mut plan: Plan = members.into_iter().map(|m| (m, None)).collect();
    for u in used.iter().filter(|u| u.bytes > 0) {
        let contains = |m: &Member| match *m {
            Member::Buffer { ordinal, ctx, ptr, bytes, .. } => {
                ordinal == place.ordinal
                    && ctx == place.ctx
                    && u.ptr >= ptr
                    && u.ptr - ptr <= bytes as u64
                    && u.bytes as u64 <= bytes as u64 - (u.ptr - ptr)
            }
            Member::Resource(_) => false,
        };
        let elem = |m: &Member| match *m {
            Member::Buffer { elem, .. } => Some(elem),
            Member::Resource(_) => None,
        };
        let holds = |m: &Member| contains(m) && elem(m) == Some(u.elem);
        let writable = |m: &Member| matches!(m, Member::Buffer { writable: true, .. });
        let found = match u.how {
            Use::Write => plan.iter().position(|(m, _)| holds(m) && writable(m)),
            Use::Read => plan.iter().position(|(m, _)| holds(m)),
        };
        let (ordinal, ptr, bytes) = (place.ordinal, u.ptr, u.bytes);
        match found {
            Some(i) => {
                let how = &mut plan[i].1;
                if *how != Some(Use::Write) {
                    *how = Some(u.how);
                }
            }
            None if plan.iter().any(|(m, _)| holds(m)) => return Err(OrderError::KeptShared { ordinal, ptr, bytes }),
            None => return Err(OrderError::NotKept { ordinal, ptr, bytes }),
        }
    }
    for r in resources {
        match plan.iter_mut().find(|(m, _)| *m == Member::Resource(*r)) {
            Some((_, used)) => *used = Some(Use::Read),
            None => return Err(OrderError::ResourceNotKept { kind: r.kind() }),
        }
    }
    Ok(plan)
}

/// A CUDA graph captured by [`capture`], with everything its calls use (`K`). See the
/// [module documentation](self).
pub struct Graph<K> {
    // Declared first, so that the executable graph is destroyed before what it uses is dropped.
    graph: Exec,
    stream: Arc<CudaStream>,
    plan: Plan,
    used: Vec<Used>,
    resources: Vec<Resource>,
    /// What the captured calls' resources asked the graph to hold
    /// ([`Access::resource_held`](crate::Access::resource_held)), dropped after `graph`.
    _held: Vec<Held>,
    /// The chains each launch joins ([`join_launches`](crate::join_launches)).
    chains: Vec<LaunchChain>,
    keep: K,
}

impl<K> fmt::Debug for Graph<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("stream", &self.stream.cu_stream())
            .field("members", &self.plan.len())
            .field("uses", &self.used.len())
            .finish()
    }
}

impl<K: Keep> Graph<K> {
    /// Launches the graph on the stream it was captured on (`cuGraphLaunch`), ordered like a call:
    /// the stream first waits for earlier uses of the kept buffers on other streams, and each
    /// buffer records the launch as its last use (a write where a captured call writes it). A
    /// graph whose captured calls joined a chain ([`join_launches`](crate::join_launches):
    /// NVSHMEM's collectives) is launched inside it.
    ///
    /// Refused, launching nothing: while the stream is being captured
    /// ([`OrderError::LaunchInCapture`]); when a kept communicator was aborted
    /// ([`OrderError::ResourceClosed`]); when memory the graph uses is no longer kept (a buffer
    /// replaced through [`Graph::kept_mut`]: [`OrderError::NotKept`]).
    #[doc(alias = "cuGraphLaunch")]
    pub fn launch(&mut self) -> Result<(), OrderError> {
        if is_capturing(&self.stream)? {
            return Err(OrderError::LaunchInCapture);
        }
        let Graph { graph, stream, plan, used, resources, keep, chains, .. } = self;
        // At most one re-plan: after it, the plan matches the members just surveyed.
        for _ in 0..2 {
            let access = Access::with_mode(stream, Mode::Eager);
            let (guards, fresh) = order_members(keep, &access, plan)?;
            if fresh {
                launch_in(chains, stream, &mut || Ok(graph.launch(stream)?))?;
                // The guards record the launch as the buffers' last use.
                drop(guards);
                return Ok(());
            }
            // Some member changed since the plan: the guards taken record uses that order
            // nothing (no launch follows them), which is harmless.
            drop(guards);
            let members = survey(keep, stream)?;
            *plan = self::plan(members, Place::of(stream), used, resources)?;
        }
        Err(OrderError::Cuda(DriverError(sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE)))
    }

    /// What the graph keeps, for reading between launches (on any stream: the last launch is
    /// recorded in each buffer's ordering).
    pub fn kept(&self) -> &K {
        &self.keep
    }

    /// What the graph keeps, for writing between launches. A buffer replaced here makes the next
    /// launch refuse to run unless the memory the graph uses is still kept.
    pub fn kept_mut(&mut self) -> &mut K {
        &mut self.keep
    }

    /// Destroys the executable graph and hands back what it kept. Dropping the buffers then waits
    /// for the last launch, as any later use does.
    pub fn into_kept(self) -> K {
        let Graph { graph, keep, _held: held, .. } = self;
        drop(graph);
        drop(held);
        keep
    }

    /// The stream the graph was captured on and is launched on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

/// Runs `launch` inside every chain of `chains` (the first outermost).
fn launch_in(
    chains: &[LaunchChain],
    stream: &CudaStream,
    launch: &mut dyn FnMut() -> Result<(), OrderError>,
) -> Result<(), OrderError> {
    match chains.split_first() {
        None => launch(),
        Some((chain, rest)) => chain(stream, &mut || launch_in(rest, stream, launch)),
    }
}

/// Ends the capture on every path out of [`capture`] (a panic) that did not end it, completing a
/// pending non-blocking operation first: the stream is never left capturing.
struct Capturing<'a> {
    stream: &'a Arc<CudaStream>,
    /// The stream the capture began on (destroyed with the guard, after the capture ended).
    origin: capture::Origin,
    open: bool,
}

/// What ending a capture gives: what the scope recorded, with the closing completion's outcome,
/// and the graph.
type Ended = ((Option<capture::Scope>, Result<(), String>), Result<Option<Exec>, OrderError>);

impl Capturing<'_> {
    /// Closes the scope (enqueuing a pending completion) and ends the capture. The guard stays
    /// armed until the scope is closed: a completion that panics leaves the capture to the
    /// guard's drop.
    fn end(&mut self) -> Ended {
        let closed = capture::close(self.stream);
        self.open = false;
        (closed, capture::end(self.stream, &self.origin))
    }
}

impl Drop for Capturing<'_> {
    fn drop(&mut self) {
        if self.open {
            // The half-made graph is dropped at once (before the scope's holds, see `capture`); a
            // failure is moot here.
            let (closed, graph) = self.end();
            drop(graph);
            drop(closed);
        }
        // The capture has ended, on every path: what waited for that runs now.
        capture::run_after_scope();
    }
}

/// Captures the calls `f` makes on `stream` into a CUDA graph that keeps `keep` (see the
/// [module documentation](self)).
///
/// `f` gets `keep` back to make its calls with. Every call of the communication crates inside it
/// on `stream` is captured; its buffers must lie in `keep` (written ones in a member given by
/// value or `&mut`), and its communicator (team, runtime, module, operator) must be in `keep`,
/// or the capture is refused ([`OrderError::NotKept`], [`OrderError::KeptShared`],
/// [`OrderError::ResourceNotKept`]). Calls on other streams inside `f` run eagerly, as outside.
/// cudarc copies and kernels on `stream` are captured too: on buffers with a
/// [`StreamTracker`](crate::StreamTracker) their uses are checked like the calls'; on cudarc's
/// own `CudaSlice` used before the capture, cudarc's event waits break the capture, which is
/// then refused ([`OrderError::CaptureBroken`]).
///
/// A non-blocking operation captured without a completion after it is completed before the
/// next captured use of its local buffer, or else at the end of the capture (its completion is
/// enqueued into the graph). Whatever the outcome, the stream
/// is no longer being captured when `capture` returns.
///
/// Errors, each with `keep` handed back unchanged (`Err((keep, error))`), so that owned members
/// are never lost to a refused capture: [`OrderError::NestedCapture`] when this thread is already
/// capturing, [`OrderError::PerThreadStream`] for the per-thread default stream,
/// [`OrderError::ForeignCapture`] when `stream` is already being captured, `f`'s own
/// error (the capture is discarded), [`OrderError::Pending`] when the closing completion could
/// not be enqueued, [`OrderError::AllocationLeft`] when the graph allocates memory it does not
/// free, the keep set's refusals ([`OrderError::NotKept`] and friends), and CUDA's.
#[doc(alias = "cuStreamBeginCapture")]
#[doc(alias = "cuStreamEndCapture")]
pub fn capture<K: Keep, E: From<OrderError>>(
    stream: &Arc<CudaStream>,
    keep: K,
    f: impl FnOnce(&mut K) -> Result<(), E>,
) -> Captured<K, E> {
    if capture::scope_open() {
        return Err((keep, OrderError::NestedCapture.into()));
    }
    if let Err(e) = capture::refuse_per_thread(stream) {
        return Err((keep, e.into()));
    }
    match is_capturing(stream) {
        Ok(false) => {}
        Ok(true) => return Err((keep, OrderError::ForeignCapture.into())),
        Err(e) => return Err((keep, OrderError::from(e).into())),
    }
    let origin = match capture::begin(stream) {
        Ok(origin) => origin,
        Err(e) => return Err((keep, OrderError::from(e).into())),
    };
    capture::open(stream);
    let mut keep = keep;
    let mut capturing = Capturing { stream, origin, open: true };
    let result = f(&mut keep);
    // Whatever `f` did, the capture ends here, with every non-blocking operation completed.
    let ((scope, completed), graph) = capturing.end();
    drop(capturing);
    let refused: Option<E> = match (result, completed) {
        (Err(e), _) => Some(e),
        (Ok(()), Err(why)) => Some(OrderError::Pending(why).into()),
        (Ok(()), Ok(())) => None,
    };
    // On every path the graph goes before the scope's holds: while a hold lives, its resource's
    // owner counts a graph that holds its work (an abort meanwhile must see it).
    let (graph, mut scope) = match (graph, scope, refused) {
        (Ok(Some(graph)), Some(scope), None) => (graph, scope),
        (graph, scope, refused) => {
            let e = refused.unwrap_or_else(|| match (&scope, &graph) {
                (Some(_), Err(e)) => e.clone().into(),
                _ => capture::broken().into(),
            });
            drop(graph);
            drop(scope);
            return Err((keep, e));
        }
    };
    let planned = survey(&mut keep, stream).and_then(|members| {
        pin_numbered(&members, &mut scope.resources);
        plan(members, Place::of(stream), &scope.used, &scope.resources)
    });
    match planned {
        Err(e) => {
            drop(graph);
            drop(scope);
            Err((keep, e.into()))
        }
        Ok(plan) => Ok(Graph {
            graph,
            stream: stream.clone(),
            plan,
            used: scope.used,
            resources: scope.resources,
            _held: scope.held,
            chains: scope.chains,
            keep,
        }),
    }
}

/// Counts the numbered resources among a new graph's `members` (registrations, see
/// [`Resource::numbered`]) as used by its captured calls: the captured work refers to these very
/// ones (NCCL's kernels know a window by its handle, not its memory), so every later plan of the
/// graph needs them kept.
fn pin_numbered(members: &[Member], resources: &mut Vec<Resource>) {
    for m in members {
        if let Member::Resource(r) = m {
            if r.is_numbered() && !resources.contains(r) {
                resources.push(*r);
            }
        }
    }
}

/// What [`capture`] returns: the graph, or the keep set handed back with the error.
pub type Captured<K, E> = Result<Graph<K>, (K, E)>;

// SAFETY: an empty keep set reports nothing.
unsafe impl Keep for () {
    fn visit<'k>(&'k mut self, _v: &mut Visitor<'k>) {}
}

// SAFETY: a shared borrow keeps the buffer alive, and unwritable by anyone, for the borrow's life
// (and with it the registration it reports, which owns or outlives it).
unsafe impl<B: DeviceMemory + DevicePtr<B::Elem>> Keep for &B {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        let registration = self.registration();
        v.read(&**self);
        if let Some(r) = registration {
            v.resource(r, true);
        }
    }
}

// SAFETY: an exclusive borrow keeps the buffer alive for the borrow's life (and with it the
// registration it reports).
unsafe impl<B: DeviceMemory + DevicePtr<B::Elem> + DevicePtrMut<B::Elem>> Keep for &mut B {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        let registration = self.registration();
        v.write(&mut **self);
        if let Some(r) = registration {
            v.resource(r, true);
        }
    }
}

/// `Keep` for owned buffer types: the value itself is the member.
macro_rules! keep_owned {
    ($([$($gen:tt)*] $ty:ty),* $(,)?) => {$(
        // SAFETY: the buffer is owned by the keep set.
        unsafe impl<$($gen)*> Keep for $ty {
            fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
                v.write(self);
            }
        }
    )*};
}

keep_owned!([T] cudarc::driver::CudaSlice<T>, ['a, T] cudarc::driver::CudaViewMut<'a, T>);

// SAFETY: a shared view borrows its slice for its whole life, and cannot write it.
unsafe impl<T> Keep for cudarc::driver::CudaView<'_, T> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.read(self);
    }
}

// SAFETY: each element is kept by the box / option / collection, and visited in a fixed order.
unsafe impl<K: Keep + ?Sized> Keep for Box<K> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        (**self).visit(v);
    }
}

// SAFETY: as for `Box`.
unsafe impl<K: Keep> Keep for Option<K> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        if let Some(k) = self {
            k.visit(v);
        }
    }
}

// SAFETY: as for `Box`.
unsafe impl<K: Keep> Keep for Vec<K> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        for k in self.iter_mut() {
            k.visit(v);
        }
    }
}

// SAFETY: as for `Box`.
unsafe impl<K: Keep, const N: usize> Keep for [K; N] {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        for k in self.iter_mut() {
            k.visit(v);
        }
    }
}

macro_rules! keep_tuple {
    ($($name:ident)+) => {
        // SAFETY: as for `Box`: each field is kept by the tuple.
        unsafe impl<$($name: Keep),+> Keep for ($($name,)+) {
            #[allow(non_snake_case)]
            fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
                let ($($name,)+) = self;
                $($name.visit(v);)+
            }
        }
    };
}

keep_tuple!(A);
keep_tuple!(A B);
keep_tuple!(A B C);
keep_tuple!(A B C D);
keep_tuple!(A B C D E);
keep_tuple!(A B C D E F);
keep_tuple!(A B C D E F G);
keep_tuple!(A B C D E F G H);
keep_tuple!(A B C D E F G H I);
keep_tuple!(A B C D E F G H I J);
keep_tuple!(A B C D E F G H I J K);
keep_tuple!(A B C D E F G H I J K L);

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(ptr: u64, bytes: usize, writable: bool) -> Member {
        Member::Buffer { ordinal: 0, ctx: 1, ptr, bytes, elem: ElemType::of::<f32>(), writable }
    }

    fn used(ptr: u64, bytes: usize, how: Use) -> Used {
        Used { ptr, bytes, how, elem: ElemType::of::<f32>() }
    }

    /// The device and context of `buffer`'s members.
    const HERE: Place = Place { ordinal: 0, ctx: 1 };

    #[test]
    fn a_buffer_of_another_element_type_at_the_same_place_is_another_buffer() {
        // Before, a kept f32 buffer swapped (through `kept_mut`) for a bool buffer that the
        // allocator put at the same address, with the same byte count, passed for the planned one,
        // and the graph wrote f32 bytes into bools.
        let planned = buffer(0x1000, 256, true);
        assert!(same_buffer(planned, buffer(0x1000, 256, true)));
        let Member::Buffer { ordinal, ctx, ptr, bytes, writable, .. } = planned else { unreachable!() };
        let bools = Member::Buffer { ordinal, ctx, ptr, bytes, elem: ElemType::of::<bool>(), writable };
        assert!(!same_buffer(planned, bools));
        let u32s = Member::Buffer { ordinal, ctx, ptr, bytes, elem: ElemType::of::<u32>(), writable };
        assert!(!same_buffer(planned, u32s), "same size and alignment, another type");
        assert!(!same_buffer(planned, buffer(0x1000, 128, true)));
        assert!(!same_buffer(planned, buffer(0x2000, 256, true)));
        // Planned again after the swap, the write the graph captured into the f32 buffer finds
        // no buffer of its type: refused, where it used to be planned into the bools.
        let write = [used(0x1000, 256, Use::Write)];
        assert!(plan(vec![planned], HERE, &write, &[]).is_ok());
        let err = plan(vec![bools], HERE, &write, &[]).unwrap_err();
        assert_eq!(err, OrderError::NotKept { ordinal: 0, ptr: 0x1000, bytes: 256 });
        assert!(plan(vec![buffer(0x1000, 256, true)], HERE, &write, &[]).is_ok());
    }

    /// Session 29 audit: the first plan, made when the capture ends, looked at addresses only, so
    /// a closure that freed the buffer its captured call wrote, and kept in its place a buffer of
    /// `bool`s that the allocator put at the freed address, got a graph writing `f32` bytes into
    /// those bools (invalid values for safe code to read). Every use now records the element type
    /// it was made through, and every plan, the first included, keeps it only in a buffer of that
    /// type.
    #[test]
    fn the_first_plan_keeps_a_use_only_in_a_buffer_of_its_element_type() {
        let Member::Buffer { ordinal, ctx, ptr, bytes, writable, .. } = buffer(0x1000, 1024, true) else {
            unreachable!()
        };
        let bools = Member::Buffer { ordinal, ctx, ptr, bytes, elem: ElemType::of::<bool>(), writable };
        let f32_write = used(0x1000, 256, Use::Write);
        let err = plan(vec![bools], HERE, &[f32_write], &[]).unwrap_err();
        assert_eq!(err, OrderError::NotKept { ordinal: 0, ptr: 0x1000, bytes: 256 });
        // A read is kept by type as well; the use made through bools is kept in the bools.
        let f32_read = used(0x1000, 256, Use::Read);
        assert!(matches!(plan(vec![bools], HERE, &[f32_read], &[]), Err(OrderError::NotKept { .. })));
        let bool_write = Used { elem: ElemType::of::<bool>(), ..f32_write };
        let kept = plan(vec![bools], HERE, &[bool_write], &[]).unwrap();
        assert_eq!(kept, [(bools, Some(Use::Write))]);
        // With both kept, each use finds its own type's buffer at the same place.
        let floats = buffer(0x1000, 1024, true);
        let both = plan(vec![bools, floats], HERE, &[f32_write], &[]).unwrap();
        assert_eq!(both, [(bools, None), (floats, Some(Use::Write))]);
    }

    #[test]
    fn every_use_must_lie_in_a_kept_buffer() {
        let members = vec![buffer(0x1000, 256, false), buffer(0x2000, 256, true)];
        let plan =
            plan(members.clone(), HERE, &[used(0x1010, 16, Use::Read), used(0x2000, 256, Use::Write)], &[]).unwrap();
        assert_eq!(plan.iter().map(|p| p.1).collect::<Vec<_>>(), [Some(Use::Read), Some(Use::Write)]);

        // Past the end of the buffer by one byte.
        let err = self::plan(members.clone(), HERE, &[used(0x2001, 256, Use::Read)], &[]).unwrap_err();
        assert_eq!(err, OrderError::NotKept { ordinal: 0, ptr: 0x2001, bytes: 256 });
        // Another device.
        let other = Place { ordinal: 1, ..HERE };
        let err = self::plan(members.clone(), other, &[used(0x1000, 4, Use::Read)], &[]);
        assert!(matches!(err, Err(OrderError::NotKept { ordinal: 1, .. })));
        // Another context of the same device, at the same address (the audit: a kept buffer
        // swapped for one of another context that got the freed address).
        let other = Place { ctx: 2, ..HERE };
        let err = self::plan(members.clone(), other, &[used(0x1000, 4, Use::Read)], &[]);
        assert!(matches!(err, Err(OrderError::NotKept { ordinal: 0, .. })));
        // Written, but kept only shared.
        let err = self::plan(members.clone(), HERE, &[used(0x1000, 4, Use::Write)], &[]).unwrap_err();
        assert_eq!(err, OrderError::KeptShared { ordinal: 0, ptr: 0x1000, bytes: 4 });
        // Empty uses touch nothing.
        assert!(self::plan(members, HERE, &[used(0x9000, 0, Use::Write)], &[]).is_ok());
    }

    #[test]
    fn a_registration_kept_when_captured_must_stay_kept() {
        let (first, again) = (Resource::next_serial(), Resource::next_serial());
        let window = Resource::numbered("window", first);
        let members = vec![buffer(0x1000, 64, true), Member::Resource(window)];
        let uses = [used(0x1000, 64, Use::Write)];
        let mut resources = Vec::new();
        pin_numbered(&members, &mut resources);
        pin_numbered(&members, &mut resources);
        assert_eq!(resources, [window], "pinned once");
        assert!(plan(members, HERE, &uses, &resources).is_ok());
        // The same memory, kept with another registration of it: the re-plan is refused.
        let swapped = vec![buffer(0x1000, 64, true), Member::Resource(Resource::numbered("window", again))];
        assert_eq!(plan(swapped, HERE, &uses, &resources).unwrap_err(), OrderError::ResourceNotKept { kind: "window" });
        // Resources named by address are not pinned: only the captured calls' own count.
        let comm = 7u8;
        let mut resources = Vec::new();
        pin_numbered(&[Member::Resource(Resource::of("communicator", &comm))], &mut resources);
        assert!(resources.is_empty());
    }

    #[test]
    fn a_write_wins_over_reads_and_resources_must_be_kept() {
        let comm = 7u8;
        let r = Resource::of("communicator", &comm);
        let members = vec![buffer(0x1000, 64, true), Member::Resource(r)];
        let uses = [used(0x1000, 8, Use::Write), used(0x1008, 8, Use::Read)];
        let plan = plan(members.clone(), HERE, &uses, &[r]).unwrap();
        assert_eq!(plan[0].1, Some(Use::Write));
        assert_eq!(plan[1].1, Some(Use::Read));
        let other = 8u8;
        let err = self::plan(members, HERE, &[], &[Resource::of("team", &other)]).unwrap_err();
        assert_eq!(err, OrderError::ResourceNotKept { kind: "team" });
        assert_eq!(err.to_string(), "a captured call used a team that the graph does not keep: give it to the capture");
    }
}
