//! Communicators: what one is, and the calls every communicator call goes through.
//!
//! * [`config`]: the `ncclConfig_t` builder.
//! * [`create`]: creation (`ncclCommInitRank*`, `ncclCommInitAll`) and the not-yet-ready
//!   [`PendingComm`].
//! * [`child`]: split, shrink, revoke.
//! * [`health`]: who may abort a communicator and when ([`AbortHandle`]).
//! * [`wait`]: [`Comm::wait`], polling NCCL with deadlines.
//! * [`watch`]: the opt-in timeout's record of enqueued work.
//! * [`teardown`]: finalize, abort, drop.
//! * [`borrowed`]: communicators someone else owns ([`BorrowedComm`]).
//! * [`parked`]: waiting outside NCCL where a watchdog can abort ([`Comm::parked`], and the
//!   bounded wait of a registration's teardown).

mod borrowed;
mod child;
mod config;
mod create;
mod health;
mod parked;
mod teardown;
mod wait;
mod watch;

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream};
use gpucomm_ordering::Placement;
use nccl_sys::{ncclComm, ncclComm_t, ncclResult_t};

use crate::error::{Error, Result};
use crate::ffi::{call, check};

pub use borrowed::BorrowedComm;
#[cfg(nccl_2_27)]
pub use child::ShrinkFlags;
pub use config::Config;
#[cfg(nccl_2_27)]
pub use config::CtaPolicy;
pub use create::PendingComm;
pub use health::{AbortHandle, AbortStatus};
pub use teardown::Finalizing;

/// `NCCL_API_MAGIC` and `NCCL_CONFIG_UNDEF_INT`, for the other structs NCCL initialises alike.
#[cfg(nccl_2_29)]
pub(crate) use config::MAGIC as API_MAGIC;
#[cfg(nccl_2_30)]
pub(crate) use config::UNDEF_INT;
use config::{ConfigStrings, Settings, Sharing, Unmixed};
use health::Health;
use watch::Watch;

/// One rank's membership in a group of GPUs that run collectives together (`ncclComm_t`).
///
/// A communicator is bound to one CUDA device and has a default stream on which its collectives
/// are enqueued. It is `Send` but not `Sync`: NCCL allows using a communicator from any thread, one
/// thread at a time.
///
/// # Creating one
///
/// [`Comm::init_rank`] / [`Comm::init_rank_config`] (one process or thread per GPU, all sharing a
/// [`UniqueId`](crate::UniqueId)), [`Comm::init_rank_scalable`] (several ids, for large jobs),
/// [`Comm::from_rendezvous`] (rank discovery and id exchange done for you), [`Comm::init_all`] (one
/// process driving several GPUs), or from an existing communicator with [`Comm::split`] and
/// [`Comm::shrink`]. A [`Config`] sets NCCL's options and this crate's [timeout](Config::timeout).
///
/// # Nonblocking communicators, timeouts, dead peers
///
/// With [`Config::blocking`]`(false)` no NCCL call blocks the host: a call that NCCL answers with
/// "in progress" is polled (`ncclCommGetAsyncError`) until NCCL has really done it, and only then
/// does this crate report success and release the buffers' stream bookkeeping. What may wait for
/// a peer can then be bounded:
///
/// * **A timeout** ([`Config::timeout`], [`Comm::set_timeout`]): every call must be enqueued, and
///   the work it enqueued must finish, within the timeout; otherwise the communicator is aborted
///   and the call, or the next [`Comm::wait`], returns [`Error::Timeout`]. This is how a job
///   survives a peer that never arrives or dies (PyTorch's watchdog does the same).
/// * **[`Comm::wait`]**: waits for everything the communicator enqueued, polling NCCL's error
///   state, the timeout and abort requests. Wait with it rather than with the stream's own
///   `synchronize`, which no timeout or abort can interrupt.
/// * **[`AbortHandle`]**: a `Send + Sync` handle that a watchdog thread uses to abort a hung
///   communicator.
///
/// After an abort, every call on the communicator returns [`Error::Aborted`], [`Comm::finalize`]
/// too, and dropping it does nothing more.
///
/// # Teardown
///
/// Prefer [`Comm::finalize`], which flushes outstanding work, reports errors, and hands the
/// communicator back if it fails. [`Comm::abort`] stops outstanding work (after a failure). If a
/// `Comm` is simply dropped, it is finalized and destroyed when it is healthy and no panic is
/// unwinding; otherwise it is aborted, so that a failed job does not hang waiting for peers that
/// are gone (inside a [`crate::group`] closure it is leaked instead, with a message). With a
/// [timeout](Config::timeout) set, finalizing (dropping included) first waits for the outstanding
/// work within it, and aborts the communicator when it does not finish: a collective stuck behind
/// a dead peer, which NCCL keeps reporting as a success, would otherwise keep NCCL's finalize
/// waiting. A *blocking* communicator without a timeout has no such bound: dropping it while its
/// work is stuck blocks inside NCCL for as long as that work runs, for ever behind a dead peer
/// (abort it instead, or use a nonblocking one, whose drop an [`AbortHandle`] or a
/// [`Watchdog`](crate::Watchdog) can end). `Drop` never panics; failures there are logged through
/// the `log` crate.
#[doc(alias = "ncclComm_t")]
// What every call reads (handle, abort state, stream, device, blocking mode, and the watch's borrow
// flag and timeout) comes first, in this order: 64 bytes, one or two cache lines. (Not aligned to
// a line: that would round the value up to 256 bytes, too large for frameworks' enums.)
#[repr(C)]
pub struct Comm {
    raw: NonNull<ncclComm>,
    /// The abort state, shared with [`AbortHandle`]s.
    health: Arc<Health>,
    stream: Arc<CudaStream>,
    device: usize,
    watch: RefCell<Watch>,
    rank: usize,
    size: usize,
    /// Strings NCCL keeps pointers to (`commName`), alive as long as the communicator.
    _strings: Option<Arc<ConfigStrings>>,
    /// Whether its children share its resources, as its config says.
    sharing: Sharing,
    /// What turned NCCL's graph mixing off for it, if anything: its calls are not captured.
    graphs_unmixed: Option<Unmixed>,
    /// Set by [`Comm::allow_shared_resources`]: children that share its resources may be made.
    sharing_allowed: Cell<bool>,
    /// The out-pointers given to `ncclCommSplit`/`ncclCommShrink`, which NCCL's background job
    /// writes: kept until this communicator is gone (fields drop after `Drop::drop` has destroyed
    /// or aborted it), so that no late write can land in freed memory. Boxed: NCCL holds their
    /// addresses while the vector grows.
    #[allow(clippy::vec_box)]
    child_slots: RefCell<Vec<Box<std::sync::atomic::AtomicPtr<ncclComm>>>>,
}

// SAFETY: NCCL's thread-safety rules allow a communicator to be used from any thread as long as
// one thread at a time operates it (NCCL user guide, "Thread safety"). `Comm` is not `Sync` (its
// `Cell`/`RefCell` fields make sure of that), so `&Comm` cannot be shared across threads, and
// moving it hands over exclusive use. Communicators that share resources (which NCCL forbids
// using from two threads at once) are made only after the unsafe `allow_shared_resources`, whose
// caller keeps them on one thread at a time. The other fields (`Arc<Health>`, cudarc streams,
// events) are `Send`.
unsafe impl Send for Comm {}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device)
            .field("nonblocking", &self.is_nonblocking())
            .field("aborted", &self.health.is_closed())
            .finish()
    }
}

impl Comm {
    /// Wraps a communicator NCCL handed out, before it is known to be ready: `rank`, `size` and the
    /// device are the requested ones until [`Comm::identify`] asks NCCL. From here on the handle is
    /// owned, so every failure path aborts it (through `Drop` or explicitly).
    fn unready(raw: NonNull<ncclComm>, stream: Arc<CudaStream>, rank: usize, size: usize, settings: Settings) -> Self {
        let device = stream.context().ordinal();
        Comm {
            raw,
            health: Arc::new(Health::new(raw, stream.context().clone(), settings.nonblocking)),
            stream,
            rank,
            size,
            device,
            watch: RefCell::new(Watch::new(settings.timeout)),
            _strings: settings.strings,
            sharing: settings.sharing,
            graphs_unmixed: settings.graphs_unmixed,
            sharing_allowed: Cell::new(false),
            child_slots: RefCell::default(),
        }
    }

    /// Asks NCCL for rank, size and device (`ncclCommUserRank`, `ncclCommCount`,
    /// `ncclCommCuDevice`) once the communicator is ready, and checks that it lives on its stream's
    /// device.
    fn identify(&mut self) -> Result<()> {
        let c = self.live_raw()?;
        let (mut rank, mut size, mut device) = (0, 0, 0);
        // SAFETY: `c` is live (checked just above, and only this thread could abort it) and ready;
        // each call writes one int through a live local.
        unsafe {
            call!(ncclCommUserRank(c, &mut rank), comm = c)?;
            call!(ncclCommCount(c, &mut size), comm = c)?;
            call!(ncclCommCuDevice(c, &mut device), comm = c)?;
        }
        // NCCL reports non-negative ints; the clamp only keeps a broken library from wrapping.
        (self.rank, self.size, self.device) = (rank.max(0) as usize, size.max(0) as usize, device.max(0) as usize);
        let expected = self.stream.context().ordinal();
        if self.device != expected {
            return Err(Error::WrongDevice { what: "the communicator NCCL created", expected, got: self.device });
        }
        Ok(())
    }

    /// Takes ownership of a communicator created outside this crate (by C or C++ code, another
    /// binding, a framework), so that the safe API can drive it. Rank, size and device are queried
    /// from NCCL; the communicator must live on `stream`'s device, which becomes its default
    /// stream. It is finalized or aborted by this `Comm` unless given back with [`Comm::into_raw`].
    /// A blocking communicator: adopt a nonblocking one with [`Comm::from_raw_nonblocking`]. Its
    /// config is unknown to this crate, so it counts as sharing its resources with the
    /// communicators split or shrunk from it ([`Comm::allow_shared_resources`]). On error the
    /// communicator is left untouched, still the caller's.
    ///
    /// # Safety
    ///
    /// `raw` must be a live, ready communicator that nothing else will destroy, finalize or abort
    /// while this `Comm` owns it, and that no other thread operates while this `Comm` does — nor
    /// any communicator that shares its resources (NCCL's `splitShare`).
    ///
    /// `raw` must be blocking (NCCL's default: created without a config or with `blocking = 1`,
    /// and without `NCCL_COMM_BLOCKING=0`). NCCL cannot be asked, and this crate relies on the
    /// mode: a group that mixes blocking and nonblocking communicators leaves the blocking ones
    /// "in progress" in NCCL for good ([`Error::MixedBlocking`] refuses such groups only for
    /// modes it knows), and capturing a nonblocking communicator's calls needs `ncclCommRevoke`.
    ///
    /// No NCCL group opened outside this crate (`ncclGroupStart` called by the caller, by C code
    /// or by a framework — PyTorch's coalescing manager, say) may be open on a thread while it
    /// calls through this `Comm`, or through anything made from it. NCCL only records the calls
    /// made inside a group and enqueues them at that group's `ncclGroupEnd`, while this crate
    /// ends its buffers' stream bookkeeping when the call returns: the buffers could then be
    /// freed or reused before NCCL's kernels run on them (a use after free). This crate knows
    /// its own [groups](crate::group()) only, and cannot tell that another is open.
    ///
    /// Its graph mixing must be NCCL's default: not created with a config whose
    /// `graphUsageMode` is 0 or 1 or whose `graphStreamOrdering` is 0 (NCCL ≥ 2.29). NCCL cannot
    /// be asked, and this crate captures its calls into graphs that rely on NCCL ordering eager
    /// calls after their launches (`NCCL_GRAPH_MIXING_SUPPORT=0` it sees, and refuses captures:
    /// [`Error::GraphMixingOff`]).
    pub unsafe fn from_raw(raw: ncclComm_t, stream: Arc<CudaStream>) -> Result<Self> {
        // SAFETY: forwarded (the caller's contract, `raw` blocking included).
        unsafe { Self::adopt(raw, stream, false) }
    }

    /// [`Comm::from_raw`] for a nonblocking communicator (created with `blocking = 0` in its
    /// config, or with `NCCL_COMM_BLOCKING=0`): calls that NCCL answers with "in progress" are
    /// polled to completion, and [`Comm::abort_handle`] works.
    ///
    /// # Safety
    ///
    /// As for [`Comm::from_raw`], except that `raw` must be nonblocking.
    pub unsafe fn from_raw_nonblocking(raw: ncclComm_t, stream: Arc<CudaStream>) -> Result<Self> {
        // SAFETY: forwarded (the caller's contract, `raw` nonblocking included).
        unsafe { Self::adopt(raw, stream, true) }
    }

    /// Wraps `raw`, whose blocking mode the caller states (`nonblocking`), asking NCCL its rank,
    /// size and device; hands it back untouched on error.
    ///
    /// # Safety
    ///
    /// As for [`Comm::from_raw`], with `raw` nonblocking exactly when `nonblocking` is true.
    pub(crate) unsafe fn adopt(raw: ncclComm_t, stream: Arc<CudaStream>, nonblocking: bool) -> Result<Self> {
        let raw = NonNull::new(raw).ok_or(Error::NullCommunicator)?;
        let mut comm = Comm::unready(raw, stream, 0, 0, Settings::unknown(nonblocking));
        match comm.identify() {
            Ok(()) => Ok(comm),
            Err(e) => {
                // Not ours after all: hand it back untouched.
                comm.health.detach();
                Err(e)
            }
        }
    }

    /// Gives up ownership without finalizing or destroying: the caller becomes responsible for the
    /// returned communicator (the inverse of [`Comm::from_raw`]). [`AbortHandle`]s of this
    /// communicator do nothing afterwards. Null if the communicator was aborted, or an abort was
    /// requested of it (by an [`AbortHandle`](crate::AbortHandle) or a
    /// [`Watchdog`](crate::Watchdog)), which is carried out first.
    ///
    /// The out-pointers that earlier [`Comm::split`]s and [`Comm::shrink`]s handed to NCCL stay
    /// allocated for good (8 bytes each): NCCL's background job can write one after the call has
    /// returned (a split that timed out, or whose child this crate gave up waiting for), and after
    /// this call nothing tells when the communicator is gone. So do the config strings NCCL keeps
    /// pointers to.
    pub fn into_raw(mut self) -> ncclComm_t {
        // An abort requested of it (a watchdog's, an abort handle's, while this thread was inside
        // NCCL) is carried out, as its next call would: it was judged hung. The error only says so.
        let _ = self.health.check();
        // An abort deferred while graphs held it: nothing borrows it now, unless a graph was
        // forgotten, which NCCL's abort would wait for: then it is not aborted, nor stopped (it
        // may be a borrowed communicator that its owner still uses).
        if self.health.held_by_graphs() {
            log::warn!(
                "nccl: a communicator is given away while a forgotten CUDA graph holds its work: NCCL's destroy \
                 or abort of it will wait for that graph for ever"
            );
        } else if let Err(e) = self.health.finish() {
            log::warn!("nccl: aborting a communicator given away after its abort was deferred failed: {e}");
        }
        let raw = self.as_raw();
        self.health.detach();
        std::mem::forget(self.child_slots.take());
        std::mem::forget(self._strings.take());
        raw
    }

    /// This rank (`ncclCommUserRank`).
    #[doc(alias = "ncclCommUserRank")]
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks (`ncclCommCount`).
    #[doc(alias = "ncclCommCount")]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The CUDA device ordinal (`ncclCommCuDevice`).
    #[doc(alias = "ncclCommCuDevice")]
    pub fn device(&self) -> usize {
        self.device
    }

    /// `Ok` when `stream` (a stream to enqueue on, or a buffer's home stream) belongs to the
    /// communicator's CUDA context, else [`Error::WrongDevice`] or [`Error::WrongContext`] naming
    /// `what`: the one check of that precondition.
    #[inline]
    pub(crate) fn check_device(&self, what: &'static str, stream: &CudaStream) -> Result<()> {
        match gpucomm_ordering::placement(self.stream.context(), stream.context()) {
            Placement::Same => Ok(()),
            Placement::OtherDevice { got } => Err(Error::WrongDevice { what, expected: self.device, got }),
            Placement::OtherContext => Err(Error::WrongContext { what, device: self.device }),
        }
    }

    /// The default stream collectives are enqueued on.
    #[inline]
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The CUDA context of the communicator's device.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// Hands out an [`AbortHandle`] for a watchdog thread. Nonblocking communicators only
    /// ([`Error::NeedsNonblocking`] otherwise): a blocking NCCL call cannot be interrupted.
    pub fn abort_handle(&self) -> Result<AbortHandle> {
        if !self.is_nonblocking() {
            return Err(Error::NeedsNonblocking);
        }
        Ok(AbortHandle::new(self.health.clone()))
    }

    /// This communicator's identity for the watchdog: the address of its shared health state,
    /// which lives as long as the communicator or any of its abort handles (a watched entry holds
    /// one), so no other communicator has it meanwhile — unlike NCCL's handle, which an abort
    /// frees while the `Comm` lives on.
    #[inline]
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.health) as usize
    }

    /// The shared health state whose address [`Comm::identity`] is, for naming the communicator
    /// as a graph's resource (a graph's hold keeps it alive).
    #[inline]
    pub(crate) fn identity_ref(&self) -> &impl Sized {
        &*self.health
    }

    /// True for a communicator created nonblocking ([`Config::blocking`]`(false)`,
    /// `NCCL_COMM_BLOCKING=0`, or NCCL answering its creation "in progress"), or adopted with
    /// [`Comm::from_raw_nonblocking`].
    #[inline]
    pub fn is_nonblocking(&self) -> bool {
        self.health.is_nonblocking()
    }

    /// What turned NCCL's graph mixing off for this communicator, if anything (its calls are then
    /// not captured: [`Error::GraphMixingOff`]).
    pub(crate) fn graphs_unmixed(&self) -> Option<&'static str> {
        self.graphs_unmixed.map(Unmixed::setting)
    }

    /// True once the communicator was aborted (by its timeout, an [`AbortHandle`] or a failure).
    pub fn is_aborted(&self) -> bool {
        self.health.is_closed()
    }

    /// True once the communicator's work was stopped with `ncclCommRevoke` (by [`Comm::revoke`],
    /// or by an abort deferred while graphs held its work): collectives on it fail, and graphs
    /// that captured its calls can no longer be launched.
    #[doc(alias = "ncclCommRevoke")]
    pub fn is_revoked(&self) -> bool {
        self.health.is_revoked()
    }

    /// The raw handle, for `nccl-sys` calls this crate does not wrap. It stays owned by `self`.
    /// Null once the communicator was aborted: NCCL frees the communicator when it aborts, and
    /// passing either the freed handle or null to NCCL is undefined behaviour for most of its
    /// functions (2.28.9 dereferences the handle in `ncclCommWindowRegister`, `ncclDevCommCreate`,
    /// `ncclTeamWorld`, … without checking it). Check [`Comm::is_aborted`] before using it. This
    /// crate itself never passes this value to NCCL: it goes through a checked accessor that
    /// refuses an aborted communicator with [`Error::Aborted`].
    pub fn as_raw(&self) -> ncclComm_t {
        if self.health.is_closed() {
            std::ptr::null_mut()
        } else {
            self.raw.as_ptr()
        }
    }

    /// The error state of asynchronous operations (`ncclCommGetAsyncError`): `Ok` while healthy,
    /// [`Error::Nccl`] with NCCL's code once something failed (including `ncclInProgress` while a
    /// nonblocking operation is under way), [`Error::Aborted`] after an abort.
    #[doc(alias = "ncclCommGetAsyncError")]
    pub fn async_error(&self) -> Result<()> {
        let raw = self.live_raw()?;
        check("ncclCommGetAsyncError", self.async_state()?, Some(raw))
    }

    /// The handle for an NCCL call, or [`Error::Aborted`] (after carrying out a pending abort
    /// request) once the communicator is aborted: the one way this crate's code — and code that
    /// calls `nccl-sys` or launches kernels with handles that die with the communicator (device
    /// communicators, windows) — gets the handle it passes on, so that neither a freed handle nor
    /// null ever reaches NCCL. One atomic load.
    ///
    /// The handle stays valid until this thread next calls into this crate's waiting code: only
    /// the owning thread carries out an abort (an [`AbortHandle`] aborts directly only while the
    /// owner is parked in a wait; see `health`), so take it again for each call instead of keeping
    /// it.
    #[inline]
    pub fn live_raw(&self) -> Result<ncclComm_t> {
        self.health.check()?;
        Ok(self.raw.as_ptr())
    }

    /// For teardown that found the communicator closed: `Ok` when NCCL released everything with it
    /// (aborted, destroyed, or given away), so that what was registered with it may be freed;
    /// [`Error::Abandoned`] when its abort could not call NCCL, so that NCCL may still use it and
    /// it must be kept (leaked); [`Error::AbortPending`] while an abort waits for the owner's
    /// teardown (aborted while graphs that captured it may be alive), which releases them.
    #[cfg(nccl_2_19)]
    pub(crate) fn released_by_nccl(&self) -> Result<()> {
        if self.health.is_abandoned() {
            Err(Error::Abandoned { cause: None })
        } else if self.health.is_deferred() {
            Err(Error::AbortPending)
        } else {
            Ok(())
        }
    }

    /// What a capture of this communicator's calls, and the graph made of it, hold while they
    /// live (see `health`).
    pub(crate) fn graph_hold(&self) -> Box<dyn Send + Sync> {
        Box::new(health::GraphHold::new(&self.health))
    }

    /// Aborts the communicator (`ncclCommAbort`) from its owner, logging a failure: the last resort
    /// for a resource this crate could not release otherwise, which NCCL releases with it.
    pub(crate) fn abort_quietly(&self) {
        self.health.abort_quietly();
    }

    /// NCCL's last error message (`ncclGetLastError`), for a failure this crate did not already
    /// report with its [`Error::Nccl`] detail. NCCL keeps one message per process, not per
    /// communicator.
    #[doc(alias = "ncclGetLastError")]
    pub fn last_error(&self) -> Option<String> {
        crate::ffi::last_error(self.as_raw())
    }

    /// NCCL's asynchronous state of this communicator (`ncclCommGetAsyncError`), as the raw code.
    fn async_state(&self) -> Result<ncclResult_t> {
        let raw = self.live_raw()?;
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: `raw` is live (checked just above); the out-pointer is a newtype over an integer,
        // so any value NCCL writes is a valid `ncclResult_t`.
        unsafe { call!(ncclCommGetAsyncError(raw, &mut state), comm = raw) }?;
        Ok(state)
    }

    /// Called with the result code of every call that enqueues work on this communicator, and the
    /// stream the work went to (for a group: once per communicator in it, after `ncclGroupEnd`).
    ///
    /// `Ok` once NCCL has really enqueued the work, so that callers release their stream
    /// bookkeeping (the buffers' "in use until here" guards) only then: `ncclInProgress` (a
    /// nonblocking communicator still connecting or enqueuing) is polled until NCCL reports
    /// success, a failure, or the communicator's timeout, which aborts it and gives
    /// [`Error::Timeout`]; on a nonblocking communicator so is success (see [`Comm::complete`]).
    /// After an abort, [`Error::Aborted`] whatever `rc` says. A stream other than the
    /// communicator's own is remembered for [`Comm::wait`]. With a timeout set, the work is then
    /// recorded for the watch (an event on `stream`, unless `stream` is being captured: `captured`
    /// says so when the caller already asked the driver, `None` has the watch ask); without one, on
    /// a blocking communicator's own stream, this costs three branches (a nonblocking one adds one
    /// `ncclCommGetAsyncError`).
    #[inline(always)]
    pub(crate) fn settle(
        &self,
        call: &'static str,
        rc: ncclResult_t,
        stream: &Arc<CudaStream>,
        captured: Option<bool>,
    ) -> Result<()> {
        // Only the owner (this thread) aborts a blocking communicator — abort handles, and so
        // watchdogs, need a nonblocking one — so a blocking one that succeeded is as live as when
        // the call checked it.
        if rc != ncclResult_t::ncclSuccess || self.is_nonblocking() {
            self.health.check()?;
            self.complete(call, rc)?;
        }
        let mut watch = self.watch.borrow_mut();
        if !Arc::ptr_eq(stream, &self.stream) {
            watch.side_stream(stream);
        }
        let overdue = watch.enqueued(call, stream, captured)?;
        drop(watch);
        match overdue {
            None => Ok(()),
            Some(late) => Err(self.time_out(late.call, late.after)),
        }
    }

    /// The timeout of this communicator ([`Config::timeout`], [`Comm::set_timeout`]).
    pub fn timeout(&self) -> Option<Duration> {
        self.watch.borrow().timeout()
    }

    /// Sets or clears the timeout: from now on, a call that NCCL does not complete, or whose
    /// enqueued work does not finish, within `timeout` aborts the communicator and returns
    /// [`Error::Timeout`] (from the call, from a later call, or from [`Comm::wait`]). Work enqueued
    /// before the timeout was set is not watched.
    ///
    /// While a timeout is set, each enqueuing call records one CUDA event on its stream (none while
    /// the stream is being captured into a CUDA graph: captured work runs when the graph is
    /// launched, outside this communicator's view). A blocking communicator can still block inside
    /// NCCL where no timeout reaches (a peer that never arrives at the first collective, whose
    /// connections NCCL makes lazily): use nonblocking communicators where peers may die.
    pub fn set_timeout(&self, timeout: Option<Duration>) {
        self.watch.borrow_mut().set_timeout(timeout);
    }

    /// The settings a child communicator gets: from `config` when one is given, else the parent's
    /// (NCCL then copies the parent's `ncclConfig_t`, string pointers included).
    fn child_settings(&self, config: Option<&Config>, strings: Option<Arc<ConfigStrings>>) -> Settings {
        match config {
            Some(config) => config.settings(strings),
            None => Settings {
                nonblocking: self.is_nonblocking(),
                timeout: self.timeout(),
                strings: self._strings.clone(),
                sharing: self.sharing,
                graphs_unmixed: self.graphs_unmixed,
            },
        }
    }
}

/// A count C receives as a positive `int` (ranks, streams, ids).
fn c_count(what: &'static str, n: usize) -> Result<i32> {
    match i32::try_from(n) {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(Error::InvalidCount { what, max: i32::MAX as usize, got: n }),
    }
}

/// A value C receives as an `int`.
fn c_int(what: &'static str, value: u64) -> Result<i32> {
    i32::try_from(value).map_err(|_| Error::TooLarge { what, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn communicators_are_send() {
        fn send<T: Send>() {}
        send::<Comm>();
    }

    #[test]
    fn counts_and_ints_are_checked() {
        assert_eq!(c_count("nranks", 4).unwrap(), 4);
        let err = c_count("nranks", 0).unwrap_err();
        assert!(matches!(err, Error::InvalidCount { what: "nranks", got: 0, .. }), "{err:?}");
        assert_eq!(err.to_string(), "nranks must be between 1 and 2147483647, got 0");
        assert!(matches!(c_count("nranks", 1 << 31), Err(Error::InvalidCount { .. })));
        assert_eq!(c_int("color", 7).unwrap(), 7);
        let err = c_int("color", 1 << 31).unwrap_err();
        assert_eq!(err.to_string(), "color is 2147483648, more than the largest C int (2147483647)");
    }
}
