//! Communicators made from a communicator: split (`ncclCommSplit`), shrink (`ncclCommShrink`,
//! NCCL ≥ 2.27), and revoke (`ncclCommRevoke`, NCCL ≥ 2.28.7), which prepares a communicator for
//! them after a failure.
//!
//! NCCL writes the child's handle from the split's background job, through the out-pointer given to
//! the call. So the slot lives on the heap, owned by the parent, and is freed only with the parent:
//! after the parent is destroyed or aborted, no job of it can write any more. (A slot freed as soon
//! as the split had returned corrupted the heap on the GPU machine.)

use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

use cudarc::driver::CudaStream;
use nccl_sys::{ncclComm, ncclConfig_t, ncclResult_t};

use super::{c_int, Comm, Config};
use crate::error::{Error, Result};
use crate::ffi::{call_unchecked, lib_version};
use crate::group::open::refuse_inside;

impl Comm {
    /// Splits this communicator (`ncclCommSplit`): ranks that pass the same `color` form a new
    /// communicator, ordered by `key` (ties by their rank here); `None` (`NCCL_SPLIT_NOCOLOR`)
    /// takes part in the split without joining any new communicator and gets `Ok(None)`.
    /// Collective: every rank of this communicator must call it, with no NCCL operation of its own
    /// outstanding.
    ///
    /// `config` sets the child's options; `None` makes it inherit this communicator's (NCCL's and
    /// this crate's: blocking mode and timeout). The child's default stream is `stream`, or this
    /// communicator's when `None`; it must be on the same device. A nonblocking split is polled to
    /// completion, bounded by this communicator's timeout.
    ///
    /// ```no_run
    /// # fn demo(world: &nccl::Comm) -> nccl::Result<()> {
    /// // Even and odd ranks, each half ordered as in the world.
    /// let half = world.split(Some((world.rank() % 2) as u32), world.rank() as i32, None, None)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ncclCommSplit")]
    #[doc(alias = "NCCL_SPLIT_NOCOLOR")]
    pub fn split(
        &self,
        color: Option<u32>,
        key: i32,
        config: Option<&Config>,
        stream: Option<Arc<CudaStream>>,
    ) -> Result<Option<Comm>> {
        let c_color = match color {
            Some(c) => c_int("color", u64::from(c))?,
            None => nccl_sys::NCCL_SPLIT_NOCOLOR,
        };
        let shares = self.sharing.split_now();
        let child =
            self.make_child("ncclCommSplit", color.is_some(), shares, config, stream, |parent, slot, config| {
                // SAFETY: `parent` is live and ready; `slot` stays valid until NCCL is done with it
                // (module docs); `config` is null or built from NCCL_CONFIG_INITIALIZER with its
                // strings kept alive by the child.
                unsafe { call_unchecked!(ncclCommSplit(parent, c_color, key, slot, config)) }
            })?;
        match (color, child) {
            (Some(_), None) => Err(Error::NullCommunicator),
            (_, child) => Ok(child),
        }
    }

    /// Makes a communicator of every rank but `exclude` (`ncclCommShrink`, NCCL ≥ 2.27): ranks are
    /// renumbered to stay contiguous. Called by every rank that stays (excluded ranks must not
    /// call it: [`Error::ShrinkExcludesSelf`]), with no NCCL operation outstanding unless `flags`
    /// is [`ShrinkFlags::ABORT`], which first aborts whatever is still running on this
    /// communicator — the way to drop ranks that failed. `config` and `stream` as for
    /// [`Comm::split`].
    #[doc(alias = "ncclCommShrink")]
    #[cfg(nccl_2_27)]
    #[cfg_attr(docsrs, doc(cfg(nccl_2_27)))]
    pub fn shrink(
        &self,
        exclude: &[usize],
        flags: ShrinkFlags,
        config: Option<&Config>,
        stream: Option<Arc<CudaStream>>,
    ) -> Result<Comm> {
        super::c_count("the number of excluded ranks", exclude.len())?;
        for (i, &rank) in exclude.iter().enumerate() {
            if rank >= self.size() {
                return Err(Error::InvalidRank { what: "excluded rank", rank, size: self.size() });
            }
            if exclude[..i].contains(&rank) {
                return Err(Error::DuplicateRank { rank });
            }
        }
        if exclude.contains(&self.rank()) {
            return Err(Error::ShrinkExcludesSelf { rank: self.rank() });
        }
        // In range, so each fits an int; NCCL sorts the list in place during the call.
        let mut list: Vec<i32> = exclude.iter().map(|&r| r as i32).collect();
        let count = list.len() as i32;
        let shares = flags.0 & ShrinkFlags::ABORT.0 == 0 && self.sharing.shrink_now();
        let child = self.make_child("ncclCommShrink", true, shares, config, stream, |parent, slot, config| {
            // SAFETY: `parent` is live and ready; `list` holds `count` distinct ranks of it, not
            // this one (checked), and is writable; `slot` and `config` as for ncclCommSplit.
            unsafe { call_unchecked!(ncclCommShrink(parent, list.as_mut_ptr(), count, slot, config, flags.0)) }
        })?;
        child.ok_or(Error::NullCommunicator)
    }

    /// Stops every operation in flight on this communicator without freeing it
    /// (`ncclCommRevoke`, NCCL ≥ 2.28.7); polled until NCCL reports it quiet. Afterwards new
    /// collectives fail (`ncclInvalidUsage`), while [`Comm::split`], [`Comm::shrink`] and
    /// teardown still work ([`Comm::finalize`] then only destroys, as NCCL forbids finalizing a
    /// revoked communicator). Local: each rank revokes its own. Children of a revoked communicator
    /// never share its resources. Graphs that captured its calls are no longer launched
    /// ([`gpucomm_ordering::OrderError::ResourceClosed`]): the revoke frees the pools their host
    /// nodes write. NCCL's revoke first waits for the work enqueued before it, graph launches
    /// included: a launch held back behind work that never ends holds the revoke as long (on a
    /// nonblocking communicator, until its timeout, if it has one: see [`Comm::set_timeout`]).
    ///
    /// A nonblocking communicator is refused with NCCL's asynchronous error ([`Error::Nccl`] for
    /// `ncclCommGetAsyncError`) while it has one, or while a call of it is still in progress:
    /// NCCL's revoke would free that call's background job and keep using it (2.28.9 to 2.30.7:
    /// its `ncclCommEnsureReady` frees the job and keeps `comm->groupJob`); abort the
    /// communicator instead.
    #[doc(alias = "ncclCommRevoke")]
    #[cfg(nccl_2_28_7)]
    #[cfg_attr(docsrs, doc(cfg(nccl_2_28_7)))]
    pub fn revoke(&self) -> Result<()> {
        let raw = self.live_raw()?;
        refuse_inside()?;
        self.context().bind_to_thread()?;
        // Only an `ncclCommGetAsyncError` that answers success unlinks a nonblocking call's
        // background job from the communicator, which the revoke would free and NCCL use again.
        if self.is_nonblocking() {
            let mut before = ncclResult_t::ncclSuccess;
            // SAFETY: `raw` is live and owned; the out-pointer is a live local.
            unsafe { crate::ffi::call!(ncclCommGetAsyncError(raw, &mut before), comm = raw) }?;
            crate::ffi::check("ncclCommGetAsyncError", before, Some(raw))?;
        }
        let flags = nccl_sys::NCCL_REVOKE_DEFAULT as i32;
        // SAFETY: `raw` is live and owned; the flags are the only value NCCL accepts.
        let rc = unsafe { call_unchecked!(ncclCommRevoke(raw, flags)) }?;
        if rc == ncclResult_t::ncclSuccess || rc == ncclResult_t::ncclInProgress {
            self.health.note_revoked();
        }
        self.complete("ncclCommRevoke", rc)
    }

    /// Promises that this communicator, and every communicator made from it that shares its
    /// resources, is never used from two threads at the same time — no calls, and no
    /// [`AbortHandle`](crate::AbortHandle) or [watchdog](crate::watchdog) acting on one while
    /// another thread uses another — so that [`Comm::split`] and [`Comm::shrink`] may make
    /// children that share its resources ([`Config::split_share`], [`Config::shrink_share`],
    /// `NCCL_COMM_SPLIT_SHARE_RESOURCES`, `NCCL_COMM_SHRINK_SHARE_RESOURCES`); without it they
    /// refuse with [`Error::SharedResources`]. Children that share its resources inherit the
    /// promise. Aborting one of them stops the others' work too (NCCL gives them one abort flag).
    ///
    /// # Safety
    ///
    /// NCCL forbids calls on communicators that share resources from several threads in parallel
    /// ("Thread Safety" in NCCL's user guide); its shared state would race. The caller keeps them
    /// on one thread at a time, including their abort handles and watchdogs.
    pub unsafe fn allow_shared_resources(&self) {
        self.sharing_allowed.set(true);
    }

    /// The part split and shrink share: checks, the call (`start`, given the parent, the slot and
    /// the config), waiting for NCCL, and adopting the child (`expected`: this rank gets one;
    /// `shares`: it would share this communicator's resources).
    fn make_child(
        &self,
        call: &'static str,
        expected: bool,
        shares: bool,
        config: Option<&Config>,
        stream: Option<Arc<CudaStream>>,
        start: impl FnOnce(nccl_sys::ncclComm_t, *mut nccl_sys::ncclComm_t, *mut ncclConfig_t) -> Result<ncclResult_t>,
    ) -> Result<Option<Comm>> {
        let parent = self.live_raw()?;
        refuse_inside()?;
        // NCCL never shares the resources of a revoked communicator.
        let shares = shares && !self.health.is_revoked();
        if shares && !self.sharing_allowed.get() {
            return Err(Error::SharedResources { call });
        }
        let stream = stream.unwrap_or_else(|| self.stream.clone());
        self.check_device("the child's stream", &stream)?;
        let mut raw_config = config.map(|c| c.to_raw(lib_version()?)).transpose()?;
        let settings = self.child_settings(config, raw_config.as_ref().map(|c| c.strings()));
        // NCCL decides per communicator whether its eager calls wait for graph launches, but
        // communicators that share resources share the streams those waits are on: one that
        // does not wait would run beside another's graph. So they must agree.
        if shares && settings.graphs_unmixed != self.graphs_unmixed {
            return Err(Error::GraphMixingDiffers { call });
        }
        let config_ptr = raw_config.as_mut().map_or(ptr::null_mut(), |c| c.as_mut_ptr());
        self.context().bind_to_thread()?;
        let slot = Box::new(AtomicPtr::<ncclComm>::new(ptr::null_mut()));
        let (cell, out): (*const AtomicPtr<ncclComm>, _) = (&*slot, slot.as_ptr());
        self.child_slots.borrow_mut().push(slot);
        let rc = start(parent, out, config_ptr)?;
        let done = self.complete(call, rc);
        if rc == ncclResult_t::ncclInProgress && done.is_err() && !self.health.is_closed() {
            // NCCL's job may still be making the child, reading the config's strings.
            settings.leak_strings();
            return done.map(|()| None);
        }
        // SAFETY: `cell` is the slot the parent owns (pushed above, boxed, never removed before the
        // parent is gone); NCCL writes it with a release store, read here with an acquire load.
        let slot = unsafe { &*cell };
        // NCCL 2.28.9 can store the child from the split's job after the call has returned, even
        // for a blocking parent (seen on the GPU machine): wait for it, within the timeout.
        // A timeout too large for an `Instant` (`Duration::MAX`) waits without a deadline.
        let wait = self.timeout().unwrap_or(std::time::Duration::from_secs(60));
        let deadline = std::time::Instant::now().checked_add(wait);
        let before_deadline = || deadline.is_none_or(|d| std::time::Instant::now() < d);
        while expected && done.is_ok() && slot.load(Ordering::Acquire).is_null() && before_deadline() {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        let Some(raw) = NonNull::new(slot.load(Ordering::Acquire)) else {
            // A child that was expected may still be stored later, by a job that reads the
            // config's strings (the child's name) until then and keeps the pointer after.
            if expected {
                settings.leak_strings();
            }
            return done.map(|()| None);
        };
        let mut child = Comm::unready(raw, stream, 0, 0, settings);
        // A child of a failed or aborted parent is aborted, never finalized: its peers may be gone.
        match done.and_then(|()| child.await_ready(call, None)).and_then(|()| child.identify()) {
            Ok(()) => {
                // The promise covers every communicator that shares these resources.
                child.sharing_allowed.set(shares);
                Ok(Some(child))
            }
            Err(e) => {
                child.health.abort_quietly();
                Err(e)
            }
        }
    }
}

/// How [`Comm::shrink`] treats the parent (`NCCL_SHRINK_*`).
#[cfg(nccl_2_27)]
#[cfg_attr(docsrs, doc(cfg(nccl_2_27)))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShrinkFlags(i32);

#[cfg(nccl_2_27)]
impl ShrinkFlags {
    /// A healthy parent with nothing outstanding; with `shrinkShare` the child reuses its
    /// resources (`NCCL_SHRINK_DEFAULT`).
    #[doc(alias = "NCCL_SHRINK_DEFAULT")]
    pub const DEFAULT: Self = Self(nccl_sys::NCCL_SHRINK_DEFAULT as i32);
    /// After an error: abort every operation still outstanding on the parent first, share
    /// nothing with it (`NCCL_SHRINK_ABORT`).
    #[doc(alias = "NCCL_SHRINK_ABORT")]
    pub const ABORT: Self = Self(nccl_sys::NCCL_SHRINK_ABORT as i32);
}
