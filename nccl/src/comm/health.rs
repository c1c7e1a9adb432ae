//! Who may abort a communicator, and when.
//!
//! NCCL's rule for aborting from another thread (user guide, "Fault Tolerance"): the communicator
//! must be nonblocking, and no thread may be inside another NCCL call on it while
//! `ncclCommAbort` runs. The owner of a [`Comm`](crate::Comm) can be inside NCCL at any moment it is not
//! waiting inside this crate, so the state below tells the two apart:
//!
//! * `LIVE`: the owner may be inside an NCCL call. An [`AbortHandle`](crate::AbortHandle) only leaves a request
//!   (`REQUESTED`), which the owner carries out at its next call into this crate.
//! * `PARKED`: the owner is waiting between two polls inside this crate ([`Comm::wait`](crate::Comm::wait), or a
//!   call NCCL answered with "in progress"), guaranteed outside NCCL. An [`AbortHandle`](crate::AbortHandle) may abort
//!   right away (`ABORTING`); the owner, waking up, cannot leave `PARKED` and waits for `CLOSED`
//!   (or `ABANDONED`).
//! * `CLOSED`: aborted or destroyed (or given away with [`Comm::into_raw`](crate::Comm::into_raw)); the handle is gone.
//!   Reached from `ABORTING` only once `ncclCommAbort` was called (whatever it returned), so NCCL
//!   has released everything the communicator used.
//! * `ABANDONED`: an abort that could not call `ncclCommAbort` (its CUDA context could not be made
//!   current), or an owner's teardown that found graphs still holding the communicator's work
//!   (one forgotten with `mem::forget`, or the capture open around the teardown), which NCCL's
//!   destroy and abort would wait for for ever: its work is stopped as in `DEFERRED`; or a
//!   deferred abort whose revoke found a call in progress or failed, after which NCCL must not
//!   be called on the communicator again (`Health::revoke`). The handle
//!   must not be used again, like a closed one, but NCCL may still own and use what the
//!   communicator was given — its background jobs' out-pointers, config strings, registered
//!   memory — so none of it is freed: it is leaked ([`Health::is_abandoned`]).
//! * `PEEKING`: a [`crate::Watchdog`] reads NCCL's error state (`ncclCommGetAsyncError`) while the
//!   owner is parked; entered only from `PARKED` and left back to it. The owner waking up, and an
//!   [`AbortHandle`](crate::AbortHandle), wait for it to end (one NCCL query).
//! * `DEFERRED`: aborted while captured work holds the communicator: a capture of its calls is
//!   open, or a graph made of one is alive ([`GraphHold`] counts them). NCCL's `ncclCommAbort`
//!   waits until every graph holding its work is destroyed, and those graphs borrow the
//!   [`Comm`](crate::Comm), so an abort that cannot wait (a timeout, an
//!   [`AbortHandle`](crate::AbortHandle)) only stops the communicator's work (`ncclCommRevoke`,
//!   NCCL ≥ 2.28.7; older libraries leave it running) and closes it for every use. The owner's
//!   teardown, which needs the `Comm` by value and so comes after every such graph is gone (or
//!   else abandons it), then calls `ncclCommAbort` ([`Health::finish`]). Until then NCCL keeps
//!   what was registered with the communicator, so releasing a registration or window keeps
//!   (leaks) its buffer.
//!
//! Every transition out of `LIVE`/`REQUESTED` except `LIVE → REQUESTED` is the owner's, and
//! every transition out of `PARKED` except `PARKED → LIVE` is a handle's, so `ncclCommAbort` can
//! never run while the owner is inside NCCL, and runs at most once.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaContext;
use nccl_sys::{ncclComm, ncclResult_t};

use crate::error::{Error, Result};
use crate::ffi::{call, call_unchecked, check};

const LIVE: u8 = 0;
const PARKED: u8 = 1;
const REQUESTED: u8 = 2;
const ABORTING: u8 = 3;
const CLOSED: u8 = 4;
const PEEKING: u8 = 5;
const ABANDONED: u8 = 6;
const DEFERRED: u8 = 7;

/// The hold of a capture of a communicator's calls, and of the graph made of it, on that
/// communicator ([`Access::resource_held`], taken at the first captured call): the communicator
/// counts them, so that an abort knows whether NCCL's abort would wait for graphs, and its
/// owner's teardown can tell a graph forgotten without being destroyed.
///
/// [`Access::resource_held`]: gpucomm_ordering::Access::resource_held
pub(crate) struct GraphHold(Arc<Health>);

impl GraphHold {
    pub(crate) fn new(health: &Arc<Health>) -> Self {
        health.graphs.fetch_add(1, Ordering::AcqRel);
        GraphHold(health.clone())
    }
}

impl Drop for GraphHold {
    fn drop(&mut self) {
        self.0.graphs.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long stopping a communicator's work waits for NCCL's revoke to complete ([`Health::revoke`]):
/// normally milliseconds, once the abort flag it sets has ended the kernels.
#[cfg(nccl_2_28_7)]
const REVOKE_WAIT: Duration = Duration::from_secs(10);

/// What stopping a communicator's work ([`Health::stop_work`]) came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    /// Revoked (now or before): its work is stopped.
    Yes,
    /// Not stopped: the library has no `ncclCommRevoke`.
    No,
    /// Revoked while a call's background job may have been linked to it (NCCL freed the job
    /// and keeps a pointer to it), or revoked without completing within [`REVOKE_WAIT`] (the
    /// revoke runs on in NCCL's background): the communicator must never be passed to NCCL again.
    Abandon,
}

/// The abort state of one communicator, shared by its [`Comm`](crate::Comm) and its [`AbortHandle`](crate::AbortHandle)s.
pub(crate) struct Health {
    state: AtomicU8,
    raw: NonNull<ncclComm>,
    /// Bound before `ncclCommAbort`, which may run on a thread that never used this device.
    context: Arc<CudaContext>,
    /// The graphs alive (and captures open) that hold the communicator's work ([`GraphHold`]):
    /// while there are any, an abort is deferred (module docs).
    graphs: AtomicUsize,
    /// Set once `ncclCommRevoke` was called (by the owner, [`Health::note_revoked`], or by a
    /// deferred abort): NCCL refuses a second revoke, and `ncclCommFinalize` after one.
    revoked: AtomicBool,
    /// Whether the communicator is nonblocking (what [`Comm::is_nonblocking`](crate::Comm::is_nonblocking)
    /// says): only a nonblocking one has background jobs that NCCL links to it ([`Health::revoke`]).
    nonblocking: bool,
}

// SAFETY: `raw` is only passed to `ncclCommAbort`, and only by whoever moved `state` to
// `ABORTING`, which the protocol above allows exactly once and only while the owner is outside
// NCCL, or to `ncclCommGetAsyncError` by whoever moved `state` from `PARKED` to `PEEKING`, which
// keeps the owner (and every abort) out until it is moved back; everything else is atomics and an
// `Arc<CudaContext>` (itself `Send + Sync`).
unsafe impl Send for Health {}
// SAFETY: as above; shared access goes through the atomic state.
unsafe impl Sync for Health {}

impl Health {
    pub(crate) fn new(raw: NonNull<ncclComm>, context: Arc<CudaContext>, nonblocking: bool) -> Self {
        Health {
            state: AtomicU8::new(LIVE),
            raw,
            context,
            graphs: AtomicUsize::new(0),
            revoked: AtomicBool::new(false),
            nonblocking,
        }
    }

    /// Whether the communicator is nonblocking (fixed at its creation or adoption).
    #[inline]
    pub(crate) fn is_nonblocking(&self) -> bool {
        self.nonblocking
    }

    /// The owner revoked the communicator (`Comm::revoke`): its work is stopped already.
    pub(crate) fn note_revoked(&self) {
        self.revoked.store(true, Ordering::Release);
    }

    /// True once the communicator was revoked.
    pub(crate) fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// True once aborted, destroyed or given away (or abandoned): the handle must not be used.
    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.state.load(Ordering::Acquire), ABORTING | CLOSED | ABANDONED | DEFERRED)
    }

    /// True while captured work holds the communicator: a capture of its calls is open, or a graph
    /// made of one is alive (or was forgotten).
    pub(crate) fn held_by_graphs(&self) -> bool {
        self.graphs.load(Ordering::Acquire) > 0
    }

    /// The owner's check before it destroys or aborts the communicator: `Ok` when no graph
    /// holds its work. The owner holds the `Comm` by value then, so no graph borrows it: a graph
    /// still counted ([`GraphHold`]) was forgotten without being destroyed (`mem::forget`, a
    /// reference cycle), or the teardown runs inside the capture of the communicator's calls,
    /// and NCCL's destroy and abort would wait for that graph for ever. The communicator is then
    /// abandoned instead (its work stopped, itself leaked with what NCCL may still use) and the
    /// error says so. `Ok` for a communicator NCCL has already released.
    pub(crate) fn no_graph_left(&self) -> Result<()> {
        if !self.held_by_graphs() || (self.is_closed() && !self.is_deferred()) {
            return Ok(());
        }
        self.abandon();
        Err(Error::GraphForgotten)
    }

    /// The owner's teardown gives up a communicator that graphs still hold ([`Health::no_graph_left`]):
    /// stops its work as a deferred abort does, unless it is deferred (stopped already), and
    /// ends in `ABANDONED`. The owner is tearing down, outside NCCL and not parked, so no handle
    /// can be aborting it meanwhile.
    fn abandon(&self) {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let next = match state {
                LIVE | REQUESTED => ABORTING,
                DEFERRED => ABANDONED,
                _ => return,
            };
            match self.state.compare_exchange(state, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => state = now,
            }
        }
        if state != DEFERRED {
            if let Err(e) = self.stop_work() {
                log::warn!("nccl: stopping the work of an abandoned communicator failed: {e}");
            }
            self.state.store(ABANDONED, Ordering::Release);
        }
        log::error!("nccl: {}", Error::GraphForgotten);
    }

    /// True while an abort waits for the owner's teardown (module docs): NCCL still holds what
    /// was registered with the communicator.
    pub(crate) fn is_deferred(&self) -> bool {
        self.state.load(Ordering::Acquire) == DEFERRED
    }

    /// The owner's teardown (which holds the `Comm` by value, so no graph borrows it any more):
    /// carries out a deferred abort with `ncclCommAbort`. `Ok` when there was none to carry out.
    pub(crate) fn finish(&self) -> Result<()> {
        if self.state.compare_exchange(DEFERRED, ABORTING, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Ok(());
        }
        self.call_abort_now()
    }

    /// True once an abort could not call `ncclCommAbort` (module docs): NCCL may still use what
    /// the communicator was given, which must then be leaked, never freed.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.state.load(Ordering::Acquire) == ABANDONED
    }

    /// Runs `query` with the handle while the owner is parked (outside NCCL, and unable to tear the
    /// communicator down until `query` returns); `None` when it is not parked.
    pub(crate) fn peek<R>(&self, query: impl FnOnce(NonNull<ncclComm>) -> R) -> Option<R> {
        self.state.compare_exchange(PARKED, PEEKING, Ordering::AcqRel, Ordering::Acquire).ok()?;
        let result = gpucomm_ordering::make_current(&self.context).map(|()| query(self.raw));
        self.state.store(PARKED, Ordering::Release);
        result.ok()
    }

    /// The owner's check before (and after) it uses the communicator: carries out a pending abort
    /// request, and refuses an aborted communicator. One atomic load when healthy.
    #[inline]
    pub(crate) fn check(&self) -> Result<()> {
        match self.state.load(Ordering::Acquire) {
            LIVE => Ok(()),
            REQUESTED => {
                self.abort_quietly();
                Err(Error::Aborted)
            }
            _ => Err(Error::Aborted),
        }
    }

    /// The owner aborts (`ncclCommAbort`): `Ok(true)` if this call did, `Ok(false)` if the
    /// communicator was already closed. The communicator is closed afterwards even when NCCL
    /// reports a failure: it must not be used again either way. When `ncclCommAbort` could not be
    /// called at all, it is abandoned instead (module docs) and the error says why.
    pub(crate) fn abort(&self) -> Result<bool> {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            if state != LIVE && state != REQUESTED {
                return Ok(false);
            }
            match self.state.compare_exchange(state, ABORTING, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => state = now,
            }
        }
        self.call_abort().map(|()| true)
    }

    /// [`Health::abort`] where the caller has nothing to report a failure to.
    #[cold]
    pub(crate) fn abort_quietly(&self) {
        if let Err(e) = self.abort() {
            log::warn!("nccl: aborting a communicator failed: {e}");
        }
    }

    /// The owner has destroyed the communicator or given it away: handles must leave it alone.
    pub(crate) fn detach(&self) {
        self.state.store(CLOSED, Ordering::Release);
    }

    /// Aborts for whoever moved the state to `ABORTING`: at once, or, while graphs hold the
    /// communicator's work, deferred ([`Health::defer`]). The count only changes on the owner's
    /// thread, while it is outside this crate's waits: not while a handle may abort.
    fn call_abort(&self) -> Result<()> {
        if self.held_by_graphs() {
            return self.defer();
        }
        self.call_abort_now()
    }

    /// An abort while graphs that captured the communicator may be alive (module docs): stops its
    /// work (`ncclCommRevoke`, where the library has it) and ends `ABORTING` in `DEFERRED`, for
    /// [`Health::finish`] to call `ncclCommAbort`. The communicator is closed for use either way.
    /// When the revoke left NCCL unusable for this communicator ([`Stopped::Abandon`]) the state
    /// ends in `ABANDONED` instead: its teardown leaks it.
    fn defer(&self) -> Result<()> {
        let stopped = self.stop_work();
        if let Ok(Stopped::Abandon) = stopped {
            // `revoke` logged why.
            self.state.store(ABANDONED, Ordering::Release);
        } else {
            self.state.store(DEFERRED, Ordering::Release);
        }
        stopped.map(|_| ())
    }

    /// Stops the communicator's work without waiting for the graphs that hold it
    /// (`ncclCommRevoke`), for whoever moved the state to `ABORTING` (or the owner's teardown).
    /// [`Stopped::No`] when the library is older than the call: its kernels then run on until an
    /// abort.
    fn stop_work(&self) -> Result<Stopped> {
        // Revoked already (NCCL would refuse a second revoke with ncclInvalidArgument): stopped.
        if self.revoked.load(Ordering::Acquire) {
            return Ok(Stopped::Yes);
        }
        match gpucomm_ordering::make_current(&self.context).map_err(Error::from).and_then(|()| self.revoke()) {
            Err(Error::MissingFunction(_)) => Ok(Stopped::No),
            other => other,
        }
    }

    /// `ncclCommRevoke`. NCCL's revoke aborts the background job of a nonblocking call still
    /// linked to the communicator (`ncclCommEnsureReady` → `ncclGroupJobAbort`, which joins and
    /// frees it) but leaves `comm->groupJob` pointing at it (2.28.9 to 2.30.7), and every later
    /// NCCL call that looks at that pointer (`ncclCommGetAsyncError` once the revoke's own job
    /// succeeds, `ncclCommAbort`'s `ncclCommEnsureReady`) uses freed memory. Only an
    /// `ncclCommGetAsyncError` that answers success unlinks the job; so NCCL is asked first:
    ///
    /// * success: nothing is linked; the revoke is polled until NCCL has stopped the work
    ///   ([`Stopped::Yes`]).
    /// * in progress, or an error: a job may be linked (and may still launch the call's kernels,
    ///   which is what the revoke stops: it joins the job before returning). The revoke is made
    ///   and not polled, and the communicator must never be passed to NCCL again
    ///   ([`Stopped::Abandon`]). A window remains inside NCCL: its revoke ends with its own
    ///   `ncclCommGetAsyncError`, which would use the freed job if the revoke's background job
    ///   (stream synchronisations, the proxy's stop) had already succeeded by then.
    ///
    /// A blocking communicator never has a job linked (NCCL links them in nonblocking groups
    /// only): it is revoked and polled whatever its error state.
    ///
    /// The polling is bounded by [`REVOKE_WAIT`]. NCCL's revoke first waits for the work
    /// enqueued before it, graph launches included (with NCCL's graph mixing on, its default, the
    /// graphs record NCCL's stream event, which the revoke synchronises), so a launch held back
    /// behind work that never ends holds it as long (one H100, session 27: a launch held by a
    /// stream wait). Past the bound the revoke is left running in NCCL's background job, which
    /// still uses the communicator: it is never passed to NCCL again ([`Stopped::Abandon`]).
    #[cfg(nccl_2_28_7)]
    fn revoke(&self) -> Result<Stopped> {
        let raw = self.raw.as_ptr();
        let mut before = ncclResult_t::ncclSuccess;
        if self.nonblocking {
            // SAFETY: the caller moved the state to ABORTING, which only happens once and only
            // while the owner is outside NCCL (module docs), so the handle is live and nothing
            // else uses it (or it is the owner, tearing down); the out-pointer is a live local of
            // a newtype over an integer; the context is current.
            unsafe { call!(ncclCommGetAsyncError(raw, &mut before)) }?;
        }
        let flags = nccl_sys::NCCL_REVOKE_DEFAULT as i32;
        // SAFETY: as for the query above (the handle is live and nothing else uses it; the
        // context is current); the flags are the only value NCCL accepts.
        let mut state = unsafe { call_unchecked!(ncclCommRevoke(raw, flags)) }?;
        // Called (a library without it is `MissingFunction` above): NCCL refuses a second one.
        self.revoked.store(true, Ordering::Release);
        if before != ncclResult_t::ncclSuccess {
            if state != ncclResult_t::ncclInProgress {
                if let Err(e) = check("ncclCommRevoke", state, None) {
                    log::warn!("nccl: revoking a communicator being abandoned: {e}");
                }
            }
            log::error!(
                "nccl: a nonblocking communicator stopped while a call of it was in progress or had failed, \
                 and while graphs held its work, was revoked and is abandoned: NCCL keeps a pointer to the \
                 call's job that the revoke freed, so the communicator is never passed to NCCL again, and what \
                 it holds is leaked"
            );
            return Ok(Stopped::Abandon);
        }
        let start = std::time::Instant::now();
        while state == ncclResult_t::ncclInProgress {
            if start.elapsed() >= REVOKE_WAIT {
                log::error!(
                    "nccl: revoking a communicator did not complete within {REVOKE_WAIT:?} (NCCL's revoke waits \
                     for the work enqueued before it, such as a graph launch held behind other work); the \
                     revoke runs on in NCCL's background, so the communicator is never passed to NCCL again, \
                     and what it holds is leaked"
                );
                return Ok(Stopped::Abandon);
            }
            std::thread::sleep(Duration::from_micros(200));
            // SAFETY: as above; no job was linked before the revoke (asked above).
            unsafe { call!(ncclCommGetAsyncError(raw, &mut state)) }?;
        }
        check("ncclCommRevoke", state, Some(raw)).map(|()| Stopped::Yes)
    }

    /// Without `ncclCommRevoke` in the headers, the work runs on until the teardown aborts.
    #[cfg(not(nccl_2_28_7))]
    fn revoke(&self) -> Result<Stopped> {
        Ok(Stopped::No)
    }

    /// Calls `ncclCommAbort` for whoever moved the state to `ABORTING`, and ends that state:
    /// `CLOSED` once NCCL was called (whatever it returned), `ABANDONED` if it could not be.
    fn call_abort_now(&self) -> Result<()> {
        if let Err(e) = gpucomm_ordering::make_current(&self.context) {
            self.state.store(ABANDONED, Ordering::Release);
            log::error!(
                "nccl: cannot abort a communicator ({e}); it is abandoned, and what NCCL may still use is leaked"
            );
            return Err(Error::Abandoned { cause: Some(e) });
        }
        let raw = self.raw.as_ptr();
        // SAFETY: the caller moved the state to ABORTING, which only happens once and only while
        // the owner is outside NCCL (module docs), so the handle is live and nothing else uses it;
        // the communicator's context is current (just above).
        let result = unsafe { call!(ncclCommAbort(raw)) };
        self.state.store(CLOSED, Ordering::Release);
        result
    }

    /// The owner is about to wait without calling NCCL: handles may abort from now on.
    pub(super) fn park(&self) -> Result<()> {
        match self.state.compare_exchange(LIVE, PARKED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(()),
            // REQUESTED (carried out by `check`) or CLOSED.
            Err(_) => {
                self.check()?;
                Err(Error::Aborted)
            }
        }
    }

    /// The owner stops waiting. If a handle aborted meanwhile, waits until it has finished, so
    /// that the caller's `Err(Aborted)` means the communicator's work is stopped.
    pub(super) fn unpark(&self) -> Result<()> {
        loop {
            match self.state.compare_exchange(PARKED, LIVE, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                // A watchdog is reading NCCL's error state: it ends in one query.
                Err(PEEKING) => std::hint::spin_loop(),
                Err(_) => break,
            }
        }
        while !matches!(self.state.load(Ordering::Acquire), CLOSED | ABANDONED | DEFERRED) {
            std::thread::sleep(Duration::from_micros(200));
        }
        Err(Error::Aborted)
    }
}

/// A handle that aborts a communicator from another thread (a watchdog): obtained with
/// [`Comm::abort_handle`](crate::Comm::abort_handle), `Send + Sync + Clone`, usable while the [`Comm`](crate::Comm) is in use elsewhere.
///
/// NCCL allows `ncclCommAbort` from another thread only for nonblocking communicators and only
/// while no thread is inside another NCCL call on the communicator (user guide, "Fault
/// Tolerance"). So [`AbortHandle::abort`] aborts at once when the owning thread is waiting inside
/// this crate — in [`Comm::wait`](crate::Comm::wait), or polling a call NCCL answered with "in progress", which is
/// where a thread facing a dead peer waits — and otherwise leaves a request that the owner
/// carries out at its next call into the communicator. A thread blocked in the stream's own
/// `synchronize` (or a cudarc copy) on a hung stream is outside both: wait through
/// [`Comm::wait`](crate::Comm::wait) instead.
///
/// Aborting one communicator does not abort its peers: every surviving rank must abort its own
/// (NCCL's rule), which each rank's timeout or watchdog does. With `splitShare`/`shrinkShare`,
/// aborting a parent can make children that share its resources unusable too.
#[derive(Clone)]
pub struct AbortHandle {
    health: Arc<Health>,
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortHandle").field("closed", &self.is_closed()).finish()
    }
}

/// What [`AbortHandle::abort`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbortStatus {
    /// The communicator was aborted by this call (its owner was waiting inside this crate, and
    /// now returns [`Error::Aborted`]).
    Aborted,
    /// The owner was busy (possibly inside NCCL); it aborts at its next call into the
    /// communicator, which then returns [`Error::Aborted`].
    Requested,
    /// Already aborted, destroyed, or given away with [`Comm::into_raw`](crate::Comm::into_raw): nothing done.
    Closed,
}

impl AbortHandle {
    /// A handle on the communicator whose abort state `health` is.
    pub(super) fn new(health: Arc<Health>) -> Self {
        AbortHandle { health }
    }

    /// Aborts the communicator (`ncclCommAbort`) as soon as NCCL's rules allow: now if its owner
    /// is waiting inside this crate, otherwise at the owner's next call (see [`AbortHandle`](crate::AbortHandle)).
    /// Once a CUDA graph kept the communicator, the abort only stops its work (`ncclCommRevoke`,
    /// NCCL ≥ 2.28.7) and the owner's [`Comm::abort`](crate::Comm::abort) or drop frees it: NCCL's
    /// own abort would wait until every such graph is destroyed.
    /// An `Err` is NCCL's or CUDA's report from `ncclCommAbort`; the communicator is closed anyway
    /// ([`Error::Abandoned`] when `ncclCommAbort` could not be called at all).
    #[doc(alias = "ncclCommAbort")]
    pub fn abort(&self) -> Result<AbortStatus> {
        let state = &self.health.state;
        loop {
            let now = state.load(Ordering::Acquire);
            let (next, status) = match now {
                PARKED => (ABORTING, AbortStatus::Aborted),
                LIVE => (REQUESTED, AbortStatus::Requested),
                REQUESTED => return Ok(AbortStatus::Requested),
                PEEKING => {
                    std::hint::spin_loop();
                    continue;
                }
                _ => return Ok(AbortStatus::Closed),
            };
            if state.compare_exchange(now, next, Ordering::AcqRel, Ordering::Acquire).is_err() {
                continue;
            }
            if next == ABORTING {
                self.health.call_abort()?;
            }
            return Ok(status);
        }
    }

    /// True once the communicator is aborted, destroyed or given away.
    pub fn is_closed(&self) -> bool {
        self.health.is_closed()
    }

    /// NCCL's error state of the communicator (`ncclCommGetAsyncError`), read only while its
    /// owner is parked (see the module docs); `None` otherwise, or if the query itself failed.
    pub(crate) fn peek_async_error(&self) -> Option<nccl_sys::ncclResult_t> {
        self.health.peek(|raw| {
            let mut state = ncclResult_t::ncclSuccess;
            // SAFETY: `peek` runs this only while the owner is parked, outside NCCL and unable to
            // destroy or abort the communicator until it returns; the out-pointer is a live local
            // of a newtype over an integer.
            let rc = unsafe { call!(ncclCommGetAsyncError(raw.as_ptr(), &mut state)) };
            rc.map(|()| state).ok()
        })?
    }
}
