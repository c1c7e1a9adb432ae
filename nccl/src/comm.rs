//! Communicators: creation, queries and teardown.

use std::ptr::{self, NonNull};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use nccl_sys::{ncclComm, ncclComm_t, ncclResult_t};

use crate::error::{call, check, Error, Result};
use crate::UniqueId;

/// One rank's membership in a group of GPUs that run collectives together (`ncclComm_t`).
///
/// A communicator is bound to one CUDA device and has a default stream on which its collectives
/// are enqueued. It is `Send` but not `Sync`: NCCL allows using a communicator from any thread, one
/// thread at a time.
///
/// # Teardown
///
/// Prefer [`Comm::finalize`], which flushes outstanding work, reports errors, and hands the
/// communicator back if it fails. [`Comm::abort`] stops outstanding work (after a failure). If a
/// `Comm` is simply dropped, it is destroyed (`ncclCommDestroy`, which also finalizes) when it is
/// healthy and no panic is unwinding; otherwise it is aborted, so that a failed job does not hang
/// waiting for peers that are gone (inside a [`crate::group`] closure it is leaked instead, with a
/// message). `Drop` never panics; errors there are ignored.
#[doc(alias = "ncclComm_t")]
pub struct Comm {
    raw: NonNull<ncclComm>,
    stream: Arc<CudaStream>,
    rank: usize,
    size: usize,
    device: usize,
}

// SAFETY: NCCL's thread-safety rules allow a communicator to be used from any thread as long as
// one thread at a time operates it (NCCL user guide, "Thread safety"). `Comm` is not `Sync`, so
// `&Comm` cannot be shared across threads, and moving it hands over exclusive use.
unsafe impl Send for Comm {}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device)
            .finish()
    }
}

fn nonzero(what: &'static str, n: usize) -> Result<i32> {
    match i32::try_from(n) {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(Error::InvalidArgument(format!("{what} must be between 1 and {}, got {n}", i32::MAX))),
    }
}

impl Comm {
    /// Joins communicator `id` as `rank` of `nranks` (`ncclCommInitRank`), on the device of
    /// `stream`, which becomes the communicator's default stream. Collective: every rank must
    /// call it with the same `id` and `nranks`; it returns once all have joined.
    #[doc(alias = "ncclCommInitRank")]
    pub fn init_rank(stream: Arc<CudaStream>, id: &UniqueId, rank: usize, nranks: usize) -> Result<Self> {
        outside_group()?;
        let n = nonzero("nranks", nranks)?;
        if rank >= nranks {
            return Err(Error::InvalidRank { what: "rank", rank, size: nranks });
        }
        // NCCL creates the communicator on the current device.
        stream.context().bind_to_thread()?;
        let mut raw: ncclComm_t = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `id` is a full ncclUniqueId passed by value; `rank`
        // and `n` were checked to be in range; the stream's context is current on this thread.
        unsafe { call!(ncclCommInitRank(&mut raw, n, id.0, rank as i32)) }?;
        Self::adopt(raw, stream)
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
        let bytes =
            rendezvous.broadcast(|| UniqueId::new().map(|id| id.to_bytes().to_vec()).map_err(|e| e.to_string()))?;
        let id = UniqueId::from_bytes(&bytes)?;
        Self::init_rank(stream, &id, rendezvous.rank(), rendezvous.world_size())
    }

    /// Creates one communicator per stream, each on its stream's device, in one process
    /// (`ncclCommInitAll`). Rank `i` is the communicator of `streams[i]`. The devices must all
    /// differ. Drive the communicators together through [`crate::group`].
    #[doc(alias = "ncclCommInitAll")]
    pub fn init_all(streams: &[Arc<CudaStream>]) -> Result<Vec<Self>> {
        outside_group()?;
        let n = nonzero("the number of streams", streams.len())?;
        let devices: Vec<usize> = streams.iter().map(|s| s.context().ordinal()).collect();
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(Error::InvalidArgument(format!(
                    "two streams are on CUDA device {d}; each rank needs its own device"
                )));
            }
        }
        let devlist =
            devices.iter().map(|&d| i32::try_from(d).map_err(|_| Error::InvalidArgument(format!("device {d}"))));
        let devlist = devlist.collect::<Result<Vec<i32>>>()?;
        streams[0].context().bind_to_thread()?;
        let mut raws: Vec<ncclComm_t> = vec![ptr::null_mut(); streams.len()];
        // SAFETY: `raws` has room for `n` communicators, `devlist` holds `n` distinct device
        // ordinals that cudarc opened.
        unsafe { call!(ncclCommInitAll(raws.as_mut_ptr(), n, devlist.as_ptr())) }?;
        let mut comms = Vec::with_capacity(raws.len());
        for (i, (raw, stream)) in raws.iter().zip(streams).enumerate() {
            match Self::adopt(*raw, stream.clone()) {
                Ok(c) => comms.push(c),
                Err(e) => {
                    // The communicators not adopted yet would leak: abort them (adopted ones are
                    // dropped with `comms`).
                    for &rest in &raws[i + 1..] {
                        abort_raw(rest);
                    }
                    return Err(e);
                }
            }
        }
        Ok(comms)
    }

    /// Takes ownership of a communicator created outside this crate (by C or C++ code, another
    /// binding, a framework), so that the safe API can drive it. Rank, size and device are queried
    /// from NCCL; the communicator must live on `stream`'s device, which becomes its default
    /// stream. It is finalized or aborted by this `Comm` unless given back with [`Comm::into_raw`].
    ///
    /// # Safety
    ///
    /// `raw` must be a live communicator that nothing else will destroy, finalize or abort while
    /// this `Comm` owns it, and that no other thread operates while this `Comm` does.
    pub unsafe fn from_raw(raw: ncclComm_t, stream: Arc<CudaStream>) -> Result<Self> {
        Self::adopt(raw, stream)
    }

    /// Gives up ownership without finalizing or destroying: the caller becomes responsible for the
    /// returned communicator (the inverse of [`Comm::from_raw`]).
    pub fn into_raw(self) -> ncclComm_t {
        let raw = self.as_raw();
        std::mem::forget(self);
        raw
    }

    /// Takes ownership of a communicator NCCL created, checking that it lives on the stream's device.
    fn adopt(raw: ncclComm_t, stream: Arc<CudaStream>) -> Result<Self> {
        let raw = NonNull::new(raw).ok_or(Error::NullCommunicator)?;
        let c = raw.as_ptr();
        let (mut rank, mut size, mut device) = (0, 0, 0);
        // SAFETY: `c` is a live communicator; each call writes one int through a live local.
        let queried = unsafe {
            call!(ncclCommUserRank(c, &mut rank), comm = c)
                .and_then(|()| call!(ncclCommCount(c, &mut size), comm = c))
                .and_then(|()| call!(ncclCommCuDevice(c, &mut device), comm = c))
        };
        let comm = Comm { raw, stream, rank: rank as usize, size: size as usize, device: device as usize };
        queried?;
        let expected = comm.stream.context().ordinal();
        if comm.device != expected {
            return Err(Error::WrongDevice { what: "the communicator NCCL created", expected, got: comm.device });
        }
        Ok(comm)
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

    /// The default stream collectives are enqueued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The CUDA context of the communicator's device.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// The raw handle, for `nccl-sys` calls this crate does not wrap. It stays owned by `self`.
    pub fn as_raw(&self) -> ncclComm_t {
        self.raw.as_ptr()
    }

    /// The error state of asynchronous operations (`ncclCommGetAsyncError`): `Ok` while healthy.
    #[doc(alias = "ncclCommGetAsyncError")]
    pub fn async_error(&self) -> Result<()> {
        let raw = self.as_raw();
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: live communicator; the out-pointer is a newtype over an integer, so any value
        // NCCL writes is a valid `ncclResult_t`.
        unsafe { call!(ncclCommGetAsyncError(raw, &mut state), comm = raw) }?;
        check("asynchronous operation", state, Some(raw))
    }

    /// Called with the result code of every call that enqueues work on this communicator, and the
    /// stream the work went to (for a group: once per communicator in it, after `ncclGroupEnd`):
    /// `Ok` once NCCL has really enqueued it, so that callers release their stream bookkeeping
    /// (the buffers' "in use until here" guards) only then.
    pub(crate) fn settle(&self, call: &'static str, rc: ncclResult_t, _stream: &CudaStream) -> Result<()> {
        check(call, rc, Some(self.as_raw()))
    }

    /// Flushes outstanding operations and releases the communicator (`ncclCommFinalize` then
    /// `ncclCommDestroy`). Collective within the node. On failure the communicator is handed back
    /// with the error, so the caller can [`abort`](Self::abort) it.
    #[doc(alias = "ncclCommFinalize")]
    #[doc(alias = "ncclCommDestroy")]
    pub fn finalize(self) -> std::result::Result<(), (Self, Error)> {
        let run = || -> Result<()> {
            outside_group()?;
            let raw = self.as_raw();
            // SAFETY: `raw` is live and owned; after a successful destroy `self` is forgotten below.
            unsafe { call!(ncclCommFinalize(raw), comm = raw).and_then(|()| call!(ncclCommDestroy(raw))) }
        };
        match run() {
            Ok(()) => {
                std::mem::forget(self);
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }

    /// Stops outstanding operations and frees the communicator (`ncclCommAbort`); use after an
    /// error or to unblock a hung job. Peers should abort theirs too.
    #[doc(alias = "ncclCommAbort")]
    pub fn abort(self) -> Result<()> {
        let raw = self.into_raw();
        // SAFETY: `raw` was live and owned, and `self` is consumed so nothing uses it afterwards.
        unsafe { call!(ncclCommAbort(raw)) }
    }
}

/// Creating and finalising communicators inside a [`crate::group`] would only be recorded until the
/// group ends, while this crate needs their results at once.
fn outside_group() -> Result<()> {
    if crate::group::is_open() {
        Err(Error::InsideGroup)
    } else {
        Ok(())
    }
}

fn abort_raw(raw: ncclComm_t) {
    // SAFETY: `raw` is a live communicator that nothing else owns.
    if let Err(e) = unsafe { call!(ncclCommAbort(raw)) } {
        log::warn!("nccl: aborting a communicator during cleanup failed: {e}");
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if crate::group::is_open() {
            // NCCL would only record the destroy until the group ends; leaking is the safe choice.
            log::warn!("nccl: a Comm dropped inside nccl::group is leaked; drop communicators outside groups");
            return;
        }
        let raw = self.as_raw();
        if std::thread::panicking() || self.async_error().is_err() {
            return abort_raw(raw);
        }
        // SAFETY: `raw` is live and owned, and is not used after drop. `finalize` is the checked
        // path; here a failure can only be logged.
        if let Err(e) = unsafe { call!(ncclCommDestroy(raw)) } {
            log::warn!("nccl: destroying a dropped communicator failed: {e}");
        }
    }
}
