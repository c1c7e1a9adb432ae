//! The NVSHMEM runtime: a process-wide token created by initialisation and consumed by
//! finalisation.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use nvshmem_sys::{function, nvshmemx_init_attr_t, NVSHMEMX_INIT_WITH_UNIQUEID};

use crate::error::{check, lib, Error, Result};
use crate::UniqueId;

/// NVSHMEM's process state: never started, running, or finished. NVSHMEM keeps process-global
/// state and does not reset its bootstrap on finalize (NVIDIA/nvshmem#68), so one process gets
/// one runtime.
static STATE: AtomicU8 = AtomicU8::new(NEVER);
const NEVER: u8 = 0;
const RUNNING: u8 = 1;
const FINISHED: u8 = 2;

fn state_error(state: u8) -> Error {
    match state {
        RUNNING => Error::Runtime("NVSHMEM is already initialised in this process"),
        _ => Error::Runtime("NVSHMEM was finalised in this process and cannot be initialised again"),
    }
}

/// `Ok` when NVSHMEM can still be started in this process.
fn check_state() -> Result<()> {
    match STATE.load(Ordering::Acquire) {
        NEVER => Ok(()),
        state => Err(state_error(state)),
    }
}

/// This process's NVSHMEM processing element (PE). Created by [`Runtime::init`]; symmetric buffers
/// borrow it, so they cannot outlive it, and [`Runtime::finalize`] consumes it.
///
/// Only one `Runtime` exists per process at a time, and a finalised process cannot start NVSHMEM
/// again. It is `Send` (NVSHMEM runs at `NVSHMEM_THREAD_SERIALIZED`: any thread, one at a time,
/// and every call binds the PE's CUDA context first) but not `Sync`.
///
/// Dropping it finalises NVSHMEM after synchronising the device; [`Runtime::finalize`] does the
/// same and reports CUDA errors.
pub struct Runtime {
    stream: Arc<CudaStream>,
    my_pe: usize,
    n_pes: usize,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("my_pe", &self.my_pe).field("n_pes", &self.n_pes).finish()
    }
}

impl Runtime {
    /// Starts NVSHMEM as PE `rank` of `n_pes` through the unique-id bootstrap
    /// (`nvshmemx_set_attr_uniqueid_args` + `nvshmemx_hostlib_init_attr`), on the device of
    /// `stream`, which becomes the runtime's default stream. Collective over all PEs, which must
    /// pass the same `id` and `n_pes`.
    #[doc(alias = "nvshmemx_hostlib_init_attr")]
    #[doc(alias = "nvshmemx_init_attr")]
    #[doc(alias = "nvshmem_init")]
    pub fn init(stream: Arc<CudaStream>, id: &UniqueId, rank: usize, n_pes: usize) -> Result<Self> {
        let npes = i32::try_from(n_pes).ok().filter(|&n| n > 0);
        let npes = npes
            .ok_or_else(|| Error::InvalidArgument(format!("n_pes must be between 1 and {}, got {n_pes}", i32::MAX)))?;
        if rank >= n_pes {
            return Err(Error::InvalidPe { what: "rank", pe: rank, n_pes });
        }
        let lib = lib()?;
        let set_args = function!(lib, nvshmemx_set_attr_uniqueid_args)?;
        let init = function!(lib, nvshmemx_hostlib_init_attr)?;
        STATE.compare_exchange(NEVER, RUNNING, Ordering::AcqRel, Ordering::Acquire).map_err(state_error)?;
        let started = (|| {
            // NVSHMEM binds the PE to the current device; the context must exist before init.
            stream.context().bind_to_thread()?;
            let mut attr = nvshmemx_init_attr_t::initializer();
            // SAFETY: `id` is a complete unique id that outlives the init call below (the attribute
            // stores a pointer to it); `attr` is initialised like NVSHMEMX_INIT_ATTR_INITIALIZER.
            check("nvshmemx_set_attr_uniqueid_args", unsafe { set_args(rank as i32, npes, &id.0, &mut attr) })?;
            // SAFETY: `attr` is fully initialised, with the unique-id arguments set; the flag
            // matches them; the PE's CUDA context is current on this thread.
            check("nvshmemx_hostlib_init_attr", unsafe { init(NVSHMEMX_INIT_WITH_UNIQUEID as u32, &mut attr) })
        })();
        if let Err(e) = started {
            STATE.store(NEVER, Ordering::Release);
            return Err(e);
        }
        let mut rt = Runtime { stream, my_pe: 0, n_pes: 0, _not_sync: PhantomData };
        let (my_pe, got_n) = rt.query()?;
        if my_pe != rank || got_n != n_pes {
            return Err(Error::InvalidArgument(format!(
                "NVSHMEM started as PE {my_pe} of {got_n}, but PE {rank} of {n_pes} was requested (another job's id?)"
            )));
        }
        (rt.my_pe, rt.n_pes) = (my_pe, got_n);
        Ok(rt)
    }

    /// Starts NVSHMEM on every PE of `rendezvous`: PE 0 creates the [`UniqueId`], the rendezvous
    /// delivers it, and all call [`Runtime::init`] with their rendezvous rank. Collective.
    ///
    /// ```no_run
    /// use nvshmem::launch::{Options, RankInfo, Rendezvous};
    /// let info = RankInfo::from_env()?;
    /// let mut rendezvous = Rendezvous::connect(&info, &Options::from_env()?)?;
    /// let ordinal = info.device_ordinal(cudarc::driver::CudaContext::device_count()? as usize)?;
    /// let stream = cudarc::driver::CudaContext::new(ordinal)?.default_stream();
    /// let rt = nvshmem::Runtime::from_rendezvous(stream, &mut rendezvous)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_rendezvous(stream: Arc<CudaStream>, rendezvous: &mut crate::launch::Rendezvous) -> Result<Self> {
        // Refuse before talking to the other PEs, which would otherwise wait for a second init.
        check_state()?;
        let bytes = rendezvous.broadcast(|| UniqueId::new().map(|id| id.to_bytes()).map_err(|e| e.to_string()))?;
        let id = UniqueId::from_bytes(&bytes)?;
        Self::init(stream, &id, rendezvous.rank(), rendezvous.world_size())
    }

    fn query(&self) -> Result<(usize, usize)> {
        let lib = lib()?;
        let (my_pe, n_pes) = (function!(lib, nvshmem_my_pe)?, function!(lib, nvshmem_n_pes)?);
        // SAFETY: NVSHMEM is initialised (this runtime exists); both calls only read state.
        let (me, n) = unsafe { (my_pe(), n_pes()) };
        let me = usize::try_from(me).map_err(|_| Error::InvalidArgument(format!("nvshmem_my_pe returned {me}")))?;
        let n = usize::try_from(n).map_err(|_| Error::InvalidArgument(format!("nvshmem_n_pes returned {n}")))?;
        Ok((me, n))
    }

    /// This PE's number (`nvshmem_my_pe`).
    #[doc(alias = "nvshmem_my_pe")]
    pub fn my_pe(&self) -> usize {
        self.my_pe
    }

    /// Number of PEs (`nvshmem_n_pes`).
    #[doc(alias = "nvshmem_n_pes")]
    pub fn n_pes(&self) -> usize {
        self.n_pes
    }

    /// The runtime's default stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The CUDA context of the PE's device.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// The PE's CUDA device ordinal.
    pub fn device(&self) -> usize {
        self.context().ordinal()
    }

    pub(crate) fn check_pe(&self, what: &'static str, pe: usize) -> Result<i32> {
        if pe < self.n_pes {
            Ok(pe as i32)
        } else {
            Err(Error::InvalidPe { what, pe, n_pes: self.n_pes })
        }
    }

    pub(crate) fn check_stream(&self, stream: &CudaStream) -> Result<()> {
        let got = stream.context().ordinal();
        if got == self.device() {
            Ok(())
        } else {
            Err(Error::WrongDevice { what: "stream", expected: self.device(), got })
        }
    }

    /// Enqueues a barrier over all PEs on `stream` (`nvshmemx_barrier_all_on_stream`): when it
    /// completes, every PE's earlier operations on its stream, puts included, are complete and
    /// visible.
    #[doc(alias = "nvshmemx_barrier_all_on_stream")]
    pub fn barrier_all_on_stream(&self, stream: &CudaStream) -> Result<()> {
        self.check_stream(stream)?;
        let f = function!(lib()?, nvshmemx_barrier_all_on_stream)?;
        self.context().bind_to_thread()?;
        // SAFETY: NVSHMEM is initialised; the stream belongs to the PE's device (checked).
        unsafe { f(stream.cu_stream() as nvshmem_sys::cudaStream_t) };
        Ok(())
    }

    /// Blocks the host until all PEs reach the barrier and all earlier operations are complete
    /// (`nvshmem_barrier_all`). It does not wait for work queued on your own streams.
    #[doc(alias = "nvshmem_barrier_all")]
    pub fn barrier_all(&self) -> Result<()> {
        let f = function!(lib()?, nvshmem_barrier_all)?;
        self.context().bind_to_thread()?;
        // SAFETY: NVSHMEM is initialised and the PE's context is current.
        unsafe { f() };
        Ok(())
    }

    /// Finalises NVSHMEM (`nvshmemx_hostlib_finalize`) after waiting for all work on the PE's
    /// device. Collective: every PE must finalise. Symmetric buffers borrow the runtime, so all of
    /// them are gone by now.
    #[doc(alias = "nvshmemx_hostlib_finalize")]
    #[doc(alias = "nvshmem_finalize")]
    pub fn finalize(self) -> Result<()> {
        let synced = self.context().synchronize();
        drop(self);
        Ok(synced?)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Pending kernels may still use the symmetric heap that finalize releases.
        let _ = self.context().synchronize();
        if let Ok(f) = lib().and_then(|l| Ok(function!(l, nvshmemx_hostlib_finalize)?)) {
            let _ = self.context().bind_to_thread();
            // SAFETY: NVSHMEM was initialised by this runtime, which is the only one, and is
            // finalised exactly once here.
            unsafe { f() };
        }
        STATE.store(FINISHED, Ordering::Release);
    }
}
