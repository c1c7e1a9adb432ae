//! Creating communicators: `ncclCommInitRank`, `ncclCommInitRankConfig`,
//! `ncclCommInitRankScalable`, `ncclCommInitAll`, and the rendezvous shortcut.

use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaStream;
use nccl_sys::{ncclComm_t, ncclResult_t};

use super::{c_count, Comm, Config};
use crate::error::{Error, Result};
use crate::ffi::{call, call_unchecked, check, lib_version};
use crate::group::open::refuse_inside;
use crate::UniqueId;

/// A communicator NCCL is still creating: what a nonblocking [`Config`] gives before every rank
/// has joined.
///
/// [`PendingComm::init_rank`] returns as soon as NCCL has started the creation (at once for a
/// nonblocking config), so one thread can start several ranks' communicators — one per GPU — and
/// then [`wait`](PendingComm::wait) for all of them, as NCCL's user guide does in a group. For a
/// blocking config the creation has finished when `init_rank` returns. Dropping a pending
/// communicator aborts it.
#[must_use = "a pending communicator is aborted when dropped; call `wait`"]
pub struct PendingComm {
    comm: Option<Comm>,
    call: &'static str,
}

impl std::fmt::Debug for PendingComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingComm").field("call", &self.call).finish_non_exhaustive()
    }
}

/// The unique ids of a creating call.
#[derive(Clone, Copy)]
enum Ids<'a> {
    /// `ncclCommInitRankConfig`.
    One(&'a UniqueId),
    /// `ncclCommInitRankScalable`.
    #[cfg(nccl_2_23)]
    Many(&'a [UniqueId]),
}

impl PendingComm {
    /// Starts joining communicator `id` as `rank` of `nranks` with `config`
    /// (`ncclCommInitRankConfig`), on the device of `stream`, which becomes the communicator's
    /// default stream. Collective: every rank must make the same call with the same `id` and
    /// `nranks`.
    #[doc(alias = "ncclCommInitRankConfig")]
    pub fn init_rank(
        stream: Arc<CudaStream>,
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        config: &Config,
    ) -> Result<PendingComm> {
        Self::start(stream, Ids::One(id), rank, nranks, config)
    }

    /// [`PendingComm::init_rank`] with several unique ids (`ncclCommInitRankScalable`, NCCL ≥
    /// 2.23): see [`Comm::init_rank_scalable`].
    #[doc(alias = "ncclCommInitRankScalable")]
    #[cfg(nccl_2_23)]
    #[cfg_attr(docsrs, doc(cfg(nccl_2_23)))]
    pub fn init_rank_scalable(
        stream: Arc<CudaStream>,
        ids: &[UniqueId],
        rank: usize,
        nranks: usize,
        config: &Config,
    ) -> Result<PendingComm> {
        Self::start(stream, Ids::Many(ids), rank, nranks, config)
    }

    fn start(stream: Arc<CudaStream>, ids: Ids<'_>, rank: usize, nranks: usize, config: &Config) -> Result<Self> {
        refuse_inside()?;
        let n = c_count("nranks", nranks)?;
        if rank >= nranks {
            return Err(Error::InvalidRank { what: "rank", rank, size: nranks });
        }
        let mut raw_config = config.to_raw(lib_version()?)?;
        // NCCL creates the communicator on the current device.
        stream.context().bind_to_thread()?;
        let mut raw: ncclComm_t = ptr::null_mut();
        let (rc, call) = match ids {
            Ids::One(id) => {
                // SAFETY: `raw` is a valid out-pointer; `id` is a full ncclUniqueId passed by value;
                // `rank` < `n` (checked); the config was built from NCCL_CONFIG_INITIALIZER and its
                // string pointers live in `settings.strings`, which the communicator keeps; the
                // stream's context is current.
                let rc = unsafe {
                    call_unchecked!(ncclCommInitRankConfig(&mut raw, n, id.0, rank as i32, raw_config.as_mut_ptr()))
                }?;
                (rc, "ncclCommInitRankConfig")
            }
            #[cfg(nccl_2_23)]
            Ids::Many(ids) => {
                (start_scalable(&mut raw, n, ids, rank, nranks, &mut raw_config)?, "ncclCommInitRankScalable")
            }
        };
        // After the call: NCCL has read `NCCL_COMM_BLOCKING` (and its config files) by now. An
        // answer "in progress" outside a group proves the communicator nonblocking, whatever the
        // environment seemed to say (an NCCL environment plugin can answer from elsewhere).
        let mut settings = config.settings(Some(raw_config.strings()));
        settings.nonblocking |= rc == ncclResult_t::ncclInProgress;
        match NonNull::new(raw) {
            None => {
                check(call, rc, None)?;
                Err(Error::NullCommunicator)
            }
            Some(raw) => {
                let comm = Comm::unready(raw, stream, rank, nranks, settings);
                match rc {
                    ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => {
                        Ok(PendingComm { comm: Some(comm), call })
                    }
                    failed => {
                        // NCCL keeps a failed communicator allocated (with its error state) for the
                        // caller to abort: `Comm`'s drop would try to finalize it.
                        let err = check(call, failed, Some(comm.as_raw())).err();
                        comm.health.abort_quietly();
                        Err(err.unwrap_or(Error::NullCommunicator))
                    }
                }
            }
        }
    }

    /// True once NCCL has finished creating the communicator (one `ncclCommGetAsyncError`
    /// poll); an `Err` if the creation failed.
    #[doc(alias = "ncclCommGetAsyncError")]
    pub fn is_ready(&self) -> Result<bool> {
        let comm = self.comm.as_ref().ok_or(Error::Aborted)?;
        comm.health.check()?;
        comm.nccl_ready(self.call)
    }

    /// Waits until the communicator is ready and returns it. Bounded by `timeout`, or else by
    /// the config's [timeout](Config::timeout); when that expires the communicator is aborted and
    /// the result is [`Error::Timeout`] (a rank that never joined).
    pub fn wait(mut self, timeout: Option<Duration>) -> Result<Comm> {
        let mut comm = self.comm.take().ok_or(Error::Aborted)?;
        comm.await_ready(self.call, timeout)?;
        comm.identify()?;
        Ok(comm)
    }
}

impl Drop for PendingComm {
    fn drop(&mut self) {
        if let Some(comm) = self.comm.take() {
            comm.health.abort_quietly();
        }
    }
}

/// `ncclCommInitRankScalable` with every argument checked.
#[cfg(nccl_2_23)]
fn start_scalable(
    raw: &mut ncclComm_t,
    n: i32,
    ids: &[UniqueId],
    rank: usize,
    nranks: usize,
    config: &mut super::config::RawConfig,
) -> Result<ncclResult_t> {
    if ids.is_empty() || ids.len() > nranks {
        return Err(Error::InvalidCount { what: "the number of unique ids", max: nranks, got: ids.len() });
    }
    let mut list: Vec<nccl_sys::ncclUniqueId> = ids.iter().map(|id| id.0).collect();
    // SAFETY: `raw` is a valid out-pointer; `list` holds `ids.len()` (1 ≤ len ≤ nranks, checked,
    // so it fits an int) ids, which NCCL copies during the call; `rank` < `n`; config as for
    // ncclCommInitRankConfig above.
    unsafe {
        call_unchecked!(ncclCommInitRankScalable(
            raw,
            n,
            rank as i32,
            list.len() as i32,
            list.as_mut_ptr(),
            config.as_mut_ptr()
        ))
    }
}

impl Comm {
    /// Joins communicator `id` as `rank` of `nranks` (`ncclCommInitRank`), on the device of
    /// `stream`, which becomes the communicator's default stream. Collective: every rank must
    /// call it with the same `id` and `nranks`; it returns once all have joined.
    #[doc(alias = "ncclCommInitRank")]
    pub fn init_rank(stream: Arc<CudaStream>, id: &UniqueId, rank: usize, nranks: usize) -> Result<Self> {
        refuse_inside()?;
        let n = c_count("nranks", nranks)?;
        if rank >= nranks {
            return Err(Error::InvalidRank { what: "rank", rank, size: nranks });
        }
        // NCCL creates the communicator on the current device.
        stream.context().bind_to_thread()?;
        let mut raw: ncclComm_t = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `id` is a full ncclUniqueId passed by value; `rank`
        // and `n` were checked to be in range; the stream's context is current on this thread.
        let rc = unsafe { call_unchecked!(ncclCommInitRank(&mut raw, n, id.0, rank as i32)) }?;
        Self::created("ncclCommInitRank", rc, raw, stream, rank, nranks)
    }

    /// [`Comm::init_rank`] with options (`ncclCommInitRankConfig`): NCCL's `ncclConfig_t` fields
    /// and this crate's timeout. With a nonblocking config the creation is polled to completion,
    /// bounded by the config's timeout (see [`PendingComm`] to start several ranks from one
    /// thread).
    #[doc(alias = "ncclCommInitRankConfig")]
    pub fn init_rank_config(
        stream: Arc<CudaStream>,
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        config: &Config,
    ) -> Result<Self> {
        PendingComm::init_rank(stream, id, rank, nranks, config)?.wait(None)
    }

    /// [`Comm::init_rank_config`] with several unique ids (`ncclCommInitRankScalable`, NCCL ≥
    /// 2.23), which spreads the bootstrap of large jobs over several roots. Every rank passes the
    /// same ids in the same order, between 1 and `nranks` of them. NCCL's user guide recommends
    /// that id `i` of `n` be created by rank `i × nranks / n` (the first rank of each of `n` even
    /// blocks), which the rendezvous can then spread.
    #[doc(alias = "ncclCommInitRankScalable")]
    #[cfg(nccl_2_23)]
    #[cfg_attr(docsrs, doc(cfg(nccl_2_23)))]
    pub fn init_rank_scalable(
        stream: Arc<CudaStream>,
        ids: &[UniqueId],
        rank: usize,
        nranks: usize,
        config: &Config,
    ) -> Result<Self> {
        PendingComm::init_rank_scalable(stream, ids, rank, nranks, config)?.wait(None)
    }

    /// Joins a new communicator spanning every rank of `rendezvous`: rank 0 creates the
    /// [`UniqueId`], the rendezvous delivers it to the others, and all call
    /// [`Comm::init_rank`] with their rendezvous rank. Collective over the rendezvous.
    ///
    /// ```no_run
    /// use nccl::launch::{Options, RankInfo, Rendezvous};
    /// let info = RankInfo::from_env()?;
    /// let mut rendezvous = Rendezvous::connect(&info, &Options::from_env()?)?;
    /// let ordinal = info.device_ordinal(cudarc::driver::CudaContext::device_count()? as usize)?;
    /// let stream = cudarc::driver::CudaContext::new(ordinal)?.default_stream();
    /// let comm = nccl::Comm::from_rendezvous(stream, &mut rendezvous)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_rendezvous(stream: Arc<CudaStream>, rendezvous: &mut crate::launch::Rendezvous) -> Result<Self> {
        let id = exchange_id(rendezvous)?;
        Self::init_rank(stream, &id, rendezvous.rank(), rendezvous.world_size())
    }

    /// [`Comm::from_rendezvous`] with options ([`Comm::init_rank_config`]).
    pub fn from_rendezvous_config(
        stream: Arc<CudaStream>,
        rendezvous: &mut crate::launch::Rendezvous,
        config: &Config,
    ) -> Result<Self> {
        let id = exchange_id(rendezvous)?;
        Self::init_rank_config(stream, &id, rendezvous.rank(), rendezvous.world_size(), config)
    }

    /// Creates one communicator per stream, each on its stream's device, in one process
    /// (`ncclCommInitAll`). Rank `i` is the communicator of `streams[i]`. The devices must all
    /// differ. Drive the communicators together through [`crate::group`]. With
    /// `NCCL_COMM_BLOCKING=0` in the environment NCCL makes them nonblocking, and their creation
    /// is polled to completion.
    #[doc(alias = "ncclCommInitAll")]
    pub fn init_all(streams: &[Arc<CudaStream>]) -> Result<Vec<Self>> {
        refuse_inside()?;
        let n = c_count("the number of streams", streams.len())?;
        let devices: Vec<usize> = streams.iter().map(|s| s.context().ordinal()).collect();
        for (i, &device) in devices.iter().enumerate() {
            if devices[..i].contains(&device) {
                return Err(Error::DuplicateDevice { device });
            }
        }
        // cudarc opened each device from an int ordinal, so each fits one.
        let devlist: Vec<i32> = devices.iter().map(|&d| d as i32).collect();
        streams[0].context().bind_to_thread()?;
        let mut raws: Vec<ncclComm_t> = vec![ptr::null_mut(); streams.len()];
        // SAFETY: `raws` has room for `n` communicators, `devlist` holds `n` distinct device
        // ordinals that cudarc opened.
        let rc = unsafe { call_unchecked!(ncclCommInitAll(raws.as_mut_ptr(), n, devlist.as_ptr())) }?;
        // `ncclInProgress`: nonblocking communicators (`NCCL_COMM_BLOCKING=0`) still being
        // created, which `created` polls until each is ready.
        let started = match rc {
            ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress => Ok(()),
            failed => check("ncclCommInitAll", failed, None),
        };
        if let Err(e) = started {
            raws.iter().filter_map(|&raw| NonNull::new(raw)).for_each(abort_raw);
            return Err(e);
        }
        let mut comms = Vec::with_capacity(raws.len());
        for (i, (&raw, stream)) in raws.iter().zip(streams).enumerate() {
            match Self::created("ncclCommInitAll", rc, raw, stream.clone(), i, streams.len()) {
                Ok(comm) => comms.push(comm),
                Err(e) => {
                    // The communicators not adopted yet would leak: abort them (adopted ones are
                    // dropped with `comms`).
                    raws[i + 1..].iter().filter_map(|&raw| NonNull::new(raw)).for_each(abort_raw);
                    return Err(e);
                }
            }
        }
        Ok(comms)
    }

    /// Wraps a communicator a creating call without a config returned (blocking, unless
    /// `NCCL_COMM_BLOCKING=0` made it nonblocking).
    fn created(
        call: &'static str,
        rc: ncclResult_t,
        raw: ncclComm_t,
        stream: Arc<CudaStream>,
        rank: usize,
        nranks: usize,
    ) -> Result<Self> {
        let Some(raw) = NonNull::new(raw) else {
            check(call, rc, None)?;
            return Err(Error::NullCommunicator);
        };
        // NCCL's defaults, which `NCCL_COMM_BLOCKING=0` makes nonblocking ("in progress" proves
        // it, as in `PendingComm::start`).
        let mut settings = Config::new().settings(None);
        settings.nonblocking |= rc == ncclResult_t::ncclInProgress;
        let mut comm = Comm::unready(raw, stream, rank, nranks, settings);
        if let Err(e) = comm.complete(call, rc).and_then(|()| comm.identify()) {
            comm.health.abort_quietly();
            return Err(e);
        }
        Ok(comm)
    }
}

/// Rank 0 creates the id, the rendezvous delivers it.
fn exchange_id(rendezvous: &mut crate::launch::Rendezvous) -> Result<UniqueId> {
    let bytes = rendezvous.broadcast(|| UniqueId::new().map(|id| id.to_bytes().to_vec()).map_err(|e| e.to_string()))?;
    UniqueId::from_bytes(&bytes)
}

/// Aborts a communicator that no `Comm` owns yet.
fn abort_raw(raw: NonNull<nccl_sys::ncclComm>) {
    // SAFETY: `raw` is a live communicator that nothing else owns or uses.
    if let Err(e) = unsafe { call!(ncclCommAbort(raw.as_ptr())) } {
        log::warn!("nccl: aborting a communicator during cleanup failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_communicators_are_send() {
        fn send<T: Send>() {}
        send::<PendingComm>();
    }
}
