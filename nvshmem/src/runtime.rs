//! The NVSHMEM runtime: a process-wide token created by initialisation (from a unique id, or from
//! the bootstrap of a launcher) and consumed by finalisation.

use std::cell::Cell;
use std::ffi::{c_char, CStr};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream};
use gpucomm_ordering::{Access, Keep, Placement, Resource, Visitor};
use nvshmem_sys::{cudaStream_t, nvshmemx_init_attr_t, NVSHMEMX_INIT_WITH_MPI_COMM, NVSHMEMX_INIT_WITH_UNIQUEID};

use crate::agree::Agreement;
use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::ffi::{call, call_unchecked, lib};
use crate::heap::{HeapLimit, HeapUse};
use crate::lifecycle;
use crate::nccl::{self, NcclUse};
use crate::quiesce;
use crate::register::Registered;
use crate::unique_id::{self, UniqueId};
use crate::Version;

/// `Ok` when NVSHMEM can be started now: never started in this process, and no capture scope
/// open on this thread ([`Error::HostCallInCapture`]: NVSHMEM's start waits on the host, which
/// CUDA refuses inside a capture, and NVSHMEM exits the process on that refusal).
fn check_start() -> Result<()> {
    lifecycle::never_started()?;
    if gpucomm_ordering::scope_open() {
        return Err(Error::HostCallInCapture { what: "starting NVSHMEM (nvshmemx_hostlib_init_attr)" });
    }
    Ok(())
}

/// What NVSHMEM reports about itself once running, and what this crate set up around it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Info {
    /// The library's name and version string, e.g. `"NVSHMEM v3.4.5"` (`nvshmem_info_get_name`).
    pub name: String,
    /// The OpenSHMEM specification version it implements, e.g. `(1, 3)`
    /// (`nvshmem_info_get_version`).
    pub spec_version: (u32, u32),
    /// The vendor version of the loaded library (`nvshmemx_vendor_get_version_info`).
    pub version: Version,
    /// Which NCCL NVSHMEM uses for its collectives (see [`NcclUse`]).
    pub nccl: NcclUse,
    /// The symmetric heap's configured limit, which allocations are checked against.
    pub heap: HeapLimit,
}

/// This process's NVSHMEM processing element (PE). Created by [`Runtime::init`],
/// [`Runtime::from_rendezvous`] or [`Runtime::with_bootstrap`]; symmetric buffers, teams, modules
/// and registrations borrow it, so none of them can outlive it, and [`Runtime::finalize`]
/// consumes it.
///
/// Only one `Runtime` exists per process, and a finalised process cannot start NVSHMEM again:
/// a second start is [`Error::AlreadyInitialized`] (or [`Error::Finalized`]) and the running
/// runtime is not disturbed. It is `Send` (NVSHMEM runs at `NVSHMEM_THREAD_SERIALIZED`: any
/// thread, one at a time, and every call binds the PE's CUDA context first) but not `Sync`.
///
/// Dropping it finalises NVSHMEM once the device is idle; [`Runtime::finalize`] does the same and
/// reports failures. NVSHMEM's finalize synchronises the whole device itself, so both wait for the
/// device first, bounded by [`Runtime::set_timeout`]: when that expires, `finalize` hands the
/// runtime back with [`Error::StillInUse`], and a drop leaves NVSHMEM running (not finalised) in
/// this process rather than hang on work that is stuck elsewhere on the device.
///
/// Finalising is collective (a barrier over all PEs, then one of the bootstrap) and waits on the
/// host, so a drop also leaves NVSHMEM running, with a warning through the `log` crate, while its
/// thread panics (the other PEs are not finalising at this step: it would wait for them for ever,
/// and for the device without bound); the process cannot start NVSHMEM again then
/// ([`Error::Finalized`]), and its exit may crash (NVSHMEM's proxy thread racing the exit
/// handlers). Dropped inside a capture ([`crate::capture`]: CUDA refuses host waits there, and
/// NVSHMEM exits the process on that refusal), the runtime is finalised as soon as the capture
/// has ended, before `capture` returns.
pub struct Runtime {
    stream: Arc<CudaStream>,
    my_pe: usize,
    n_pes: usize,
    info: Box<Info>,
    /// What this process's symmetric buffers hold of the heap, and the most they have held.
    pub(crate) heap_use: HeapUse,
    /// The ranges of this PE's live registrations, which transfers over a network transport
    /// check their local buffers against.
    pub(crate) registered: Registered,
    /// The checks that every PE makes the same allocation; `None` only while starting.
    agreement: Option<Agreement>,
    /// Bounds the waits of teardown ([`Runtime::set_timeout`]).
    timeout: Cell<Option<Duration>>,
    /// Several PEs share this GPU without MPS ([`InitStatus::LIMITED_MPG`], read once at start):
    /// NVSHMEM exits the process in the calls it does not support then.
    limited_mpg: bool,
    /// The bytes NVSHMEM's segmented reduction exchanges with one peer per round, read at start
    /// (see [`Team::reduce_in_place_on_stream`](crate::Team::reduce_in_place_on_stream)).
    pub(crate) reduce_segment: usize,
    /// Set by the consuming teardown once the C resource is gone (NVSHMEM finalised, by
    /// [`Runtime::finalize`]): `Drop` then has nothing to do.
    released: bool,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("my_pe", &self.my_pe)
            .field("n_pes", &self.n_pes)
            .field("device", &self.device())
            .finish()
    }
}

/// NVSHMEM's initialisation state (`nvshmemx_init_status`), kept as the raw number.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[doc(alias = "nvshmemx_init_status_t")]
pub struct InitStatus(pub i32);

impl InitStatus {
    /// `NVSHMEM_STATUS_NOT_INITIALIZED`.
    pub const NOT_INITIALIZED: Self = Self(0);
    /// `NVSHMEM_STATUS_IS_BOOTSTRAPPED`: the PEs found each other, the heap is not set up yet.
    pub const IS_BOOTSTRAPPED: Self = Self(1);
    /// `NVSHMEM_STATUS_IS_INITIALIZED`: fully running.
    pub const IS_INITIALIZED: Self = Self(2);
    /// `NVSHMEM_STATUS_LIMITED_MPG`: several PEs share a GPU, with limits.
    pub const LIMITED_MPG: Self = Self(3);
    /// `NVSHMEM_STATUS_FULL_MPG`: several PEs share a GPU.
    pub const FULL_MPG: Self = Self(4);
}

crate::error::named_code!(
    InitStatus,
    [
        "NVSHMEM_STATUS_NOT_INITIALIZED",
        "NVSHMEM_STATUS_IS_BOOTSTRAPPED",
        "NVSHMEM_STATUS_IS_INITIALIZED",
        "NVSHMEM_STATUS_LIMITED_MPG",
        "NVSHMEM_STATUS_FULL_MPG",
    ]
);

/// Reads NVSHMEM's state without changing it (`nvshmemx_init_status`); needs no runtime and no
/// GPU.
#[doc(alias = "nvshmemx_init_status")]
pub fn init_status() -> Result<InitStatus> {
    // Any thread may ask, while another starts or finalises NVSHMEM (which write that state):
    // both hold this lock across their NVSHMEM call.
    let _serial = unique_id::plugin();
    // SAFETY: nvshmemx_init_status only reads process state; no start or finalise runs meanwhile
    // (the lock above), which is all NVSHMEM's serialised threading asks of another thread.
    Ok(InitStatus(unsafe { call_unchecked!(nvshmemx_init_status()) }?))
}

impl Runtime {
    /// Starts NVSHMEM as PE `pe` of `n_pes` through the unique-id bootstrap
    /// (`nvshmemx_set_attr_uniqueid_args` + `nvshmemx_hostlib_init_attr`), on the device of
    /// `stream`, which becomes the runtime's default stream. Collective over all PEs, which must
    /// pass the same `id` and `n_pes`. The same as [`Runtime::with_bootstrap`] with
    /// [`Bootstrap::UniqueId`].
    #[doc(alias = "nvshmemx_hostlib_init_attr")]
    #[doc(alias = "nvshmemx_set_attr_uniqueid_args")]
    #[doc(alias = "nvshmemx_init_attr")]
    #[doc(alias = "nvshmem_init")]
    pub fn init(stream: Arc<CudaStream>, id: &UniqueId, pe: usize, n_pes: usize) -> Result<Self> {
        Self::with_bootstrap(stream, Bootstrap::UniqueId { id, pe, n_pes })
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
        check_start()?;
        let bytes = rendezvous.broadcast(|| UniqueId::new().map(|id| id.to_bytes()).map_err(|e| e.to_string()))?;
        let id = UniqueId::from_bytes(&bytes)?;
        Self::init(stream, &id, rendezvous.rank(), rendezvous.world_size())
    }

    /// Starts NVSHMEM with the given bootstrap (see [`Bootstrap`]: a unique id, or the MPI / PMI
    /// plugins NVSHMEM ships for launchers), on the device of `stream`, which becomes the runtime's
    /// default stream. Collective over all PEs.
    ///
    /// Before NVSHMEM starts, the NCCL the `nccl` crate would load is loaded for it (see
    /// [`NcclUse`]); [`Runtime::info`] says which one NVSHMEM got.
    ///
    /// ```no_run
    /// // Under `mpirun -np 2`: NVSHMEM's MPI plugin forms the job from MPI_COMM_WORLD.
    /// let info = nvshmem::launch::RankInfo::from_env()?;
    /// let ordinal = info.device_ordinal(cudarc::driver::CudaContext::device_count()? as usize)?;
    /// let stream = cudarc::driver::CudaContext::new(ordinal)?.default_stream();
    /// let rt = nvshmem::Runtime::with_bootstrap(stream, nvshmem::Bootstrap::Mpi)?;
    /// assert_eq!(rt.my_pe(), info.rank);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "nvshmemx_hostlib_init_attr")]
    #[doc(alias = "nvshmemx_set_attr_uniqueid_args")]
    ///
    /// Only [`Bootstrap::UniqueId`] can start NVSHMEM in a process that created a [`UniqueId`]
    /// ([`Error::BootstrapAfterUniqueId`]: NVSHMEM would start the other bootstrap through its
    /// unique-id plugin, which dereferences arguments it does not have). A [`UniqueId::new`] on
    /// another thread waits until the start has finished.
    ///
    /// Refused with [`Error::HostCallInCapture`] while this thread has a capture scope open
    /// ([`crate::capture`]): NVSHMEM's start waits on the host, which CUDA refuses inside a
    /// capture, and NVSHMEM exits the process on that refusal. Before NVSHMEM is called the start
    /// waits for the device's queued work: while another thread captures (PyTorch's graphs),
    /// CUDA refuses that wait with [`Error::Cuda`] (and invalidates that capture), and nothing was
    /// started; start again once the capture has ended.
    pub fn with_bootstrap(stream: Arc<CudaStream>, bootstrap: Bootstrap<'_>) -> Result<Self> {
        let expected = bootstrap.expected_pes()?;
        check_start()?;
        // Held until NVSHMEM has started: no `UniqueId::new` (on another thread) can load the
        // unique-id plugin between this check and `nvshmemx_hostlib_init_attr`.
        let plugin = unique_id::plugin();
        if expected.is_none() && *plugin {
            return Err(Error::BootstrapAfterUniqueId { requested: bootstrap.name() });
        }
        let lib = lib()?;
        bootstrap.check_environment()?;
        // Read before NVSHMEM starts, so that a failure leaves it untouched; NVSHMEM's own buffers
        // grow with the PE count, which only NVSHMEM knows for every bootstrap: read again below.
        let heap = HeapLimit::from_environment(stream.context(), 1)?;
        lifecycle::start()?;
        // NVSHMEM binds the PE to the current device; the context must exist before init.
        let reached_c = Cell::new(false);
        let started = (|| {
            stream.context().bind_to_thread()?;
            // NVSHMEM's start makes calls that conflict with any capture in the context, relaxed
            // or not, and exits the process when CUDA refuses one (one H100, session 26, while
            // another thread captured in global mode). Synchronising the device conflicts the
            // same way, so CUDA refuses it here first, with an error (and invalidates that other
            // capture, as it would on NVSHMEM's call).
            gpucomm_ordering::device_idle_within(stream.context(), None)?;
            let nccl = if nccl::disabled() { Ok(()) } else { nccl::preload_for_nvshmem() };
            let mut attr = nvshmemx_init_attr_t::initializer();
            let (flags, attr_ptr) = match bootstrap {
                Bootstrap::UniqueId { id, pe, n_pes } => {
                    // SAFETY: `id` is a complete unique id that outlives the init call below (the
                    // attribute stores a pointer to it); `attr` is initialised like
                    // NVSHMEMX_INIT_ATTR_INITIALIZER; `expected_pes` checked that `pe < n_pes
                    // <= i32::MAX`, so both casts are exact.
                    unsafe { call!(nvshmemx_set_attr_uniqueid_args(pe as i32, n_pes as i32, &id.0, &mut attr)) }?;
                    (NVSHMEMX_INIT_WITH_UNIQUEID, &mut attr as *mut nvshmemx_init_attr_t)
                }
                // No communicator given: the MPI plugin uses MPI_COMM_WORLD (and initialises MPI
                // itself when the program has not).
                Bootstrap::Mpi => (NVSHMEMX_INIT_WITH_MPI_COMM, &mut attr as *mut nvshmemx_init_attr_t),
                // Flags 0 and no attributes: NVSHMEM_BOOTSTRAP (default PMI) picks the plugin; the
                // plugin mode refuses attributes.
                Bootstrap::Pmi | Bootstrap::Environment => (0, std::ptr::null_mut()),
            };
            reached_c.set(true);
            // SAFETY: `attr_ptr` is null or points at the initialised `attr` (unique-id arguments
            // set where the flag says so), which outlives the call; the PE's CUDA context is
            // current on this thread.
            unsafe { call!(nvshmemx_hostlib_init_attr(flags as u32, attr_ptr)) }?;
            Ok::<_, Error>(nccl)
        })();
        drop(plugin);
        let nccl_preload = match started {
            Ok(n) => n,
            Err(e) => {
                // Once NVSHMEM has been entered its process state is no longer pristine.
                lifecycle::failed_start(reached_c.get());
                return Err(e);
            }
        };
        let placeholder =
            Info { name: String::new(), spec_version: (0, 0), version: lib.version(), nccl: NcclUse::Disabled, heap };
        let mut rt = Runtime {
            stream,
            my_pe: 0,
            n_pes: 0,
            info: Box::new(placeholder),
            heap_use: HeapUse::default(),
            registered: Registered::default(),
            agreement: None,
            timeout: Cell::new(None),
            limited_mpg: false,
            reduce_segment: 0,
            released: false,
            _not_sync: PhantomData,
        };
        // From here on, dropping `rt` finalises NVSHMEM.
        // SAFETY: NVSHMEM is initialised; both calls only read its state.
        let (me, n) = unsafe { (call_unchecked!(nvshmem_my_pe())?, call_unchecked!(nvshmem_n_pes())?) };
        if me < 0 || me >= n {
            return Err(Error::InvalidPe {
                what: "the PE NVSHMEM reports",
                pe: me.max(0) as usize,
                n_pes: n.max(0) as usize,
            });
        }
        (rt.my_pe, rt.n_pes) = (me as usize, n as usize);
        rt.limited_mpg = init_status()? == InitStatus::LIMITED_MPG;
        if let Some((pe, n_pes)) = expected {
            if (rt.my_pe, rt.n_pes) != (pe, n_pes) {
                return Err(Error::PeMismatch { pe, n_pes, got_pe: rt.my_pe, got_n_pes: rt.n_pes });
            }
        }
        rt.info.heap = HeapLimit::from_environment(rt.context(), rt.n_pes)?;
        rt.reduce_segment = crate::heap::reduce_segment_bytes();
        rt.info.name = library_name()?;
        rt.info.spec_version = spec_version()?;
        rt.info.nccl = match (nccl::disabled(), nccl::in_process(), nccl_preload) {
            (true, _, _) => NcclUse::Disabled,
            (false, Some((path, version)), _) => NcclUse::Loaded { path, version },
            (false, None, Err(reason)) => NcclUse::Missing { reason },
            (false, None, Ok(())) => NcclUse::Missing { reason: "no libnccl.so.2 is loaded".into() },
        };
        quiesce::start()?;
        rt.agreement = Some(Agreement::new(rt.my_pe, rt.n_pes)?);
        Ok(rt)
    }

    /// This PE's number in the world team (`nvshmem_my_pe`).
    #[doc(alias = "nvshmem_my_pe")]
    pub fn my_pe(&self) -> usize {
        self.my_pe
    }

    /// Number of PEs in the job (`nvshmem_n_pes`).
    #[doc(alias = "nvshmem_n_pes")]
    pub fn n_pes(&self) -> usize {
        self.n_pes
    }

    /// What NVSHMEM reports about itself, which NCCL it uses, and the heap's limit.
    #[doc(alias = "nvshmem_info_get_name")]
    #[doc(alias = "nvshmem_info_get_version")]
    pub fn info(&self) -> &Info {
        &self.info
    }

    /// NVSHMEM's current state (`nvshmemx_init_status`): [`InitStatus::IS_INITIALIZED`] while
    /// the runtime is up.
    #[doc(alias = "nvshmemx_init_status")]
    pub fn init_status(&self) -> Result<InitStatus> {
        init_status()
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

    /// `pe` as C wants it, or [`Error::InvalidPe`].
    pub(crate) fn check_pe(&self, what: &'static str, pe: usize) -> Result<i32> {
        if pe < self.n_pes {
            Ok(pe as i32)
        } else {
            Err(Error::InvalidPe { what, pe, n_pes: self.n_pes })
        }
    }

    /// `Ok` when `stream` (a stream to enqueue on, or a buffer's home stream) belongs to the PE's
    /// CUDA context, else [`Error::WrongDevice`] or [`Error::WrongContext`] naming `what`: the one
    /// check of that precondition.
    pub(crate) fn check_device(&self, what: &'static str, stream: &CudaStream) -> Result<()> {
        match gpucomm_ordering::placement(self.context(), stream.context()) {
            Placement::Same => Ok(()),
            Placement::OtherDevice { got } => Err(Error::WrongDevice { what, expected: self.device(), got }),
            Placement::OtherContext => Err(Error::WrongContext { what, device: self.device() }),
        }
    }

    /// `Ok` unless this is a limited-MPG run (several PEs share the GPU without MPS,
    /// [`InitStatus::LIMITED_MPG`]), in which NVSHMEM exits the process in `call`, one of the calls
    /// it marks `NVSHMEM_API_NOT_SUPPORTED_WITH_LIMITED_MPG_RUNS`: then
    /// [`Error::NotSupportedWithLimitedMpg`]. Made before anything else by those calls.
    #[inline]
    pub(crate) fn check_not_limited_mpg(&self, call: &'static str) -> Result<()> {
        if self.limited_mpg {
            Err(Error::NotSupportedWithLimitedMpg { call })
        } else {
            Ok(())
        }
    }

    /// Prepares a call that enqueues work on the admitted stream: checks that the stream belongs
    /// to the PE's device, makes the PE's context current (NVSHMEM resolves the legacy default
    /// stream, and does its own CUDA calls, through the current context), and returns the stream as
    /// C wants it.
    #[inline]
    pub(crate) fn enqueue_on(&self, admitted: &Admitted<'_>) -> Result<cudaStream_t> {
        self.check_device("stream", admitted.stream)?;
        // Not `bind_to_thread`: an error something else recorded in the context (any thread, any
        // use) would refuse a collective on this PE alone, and be taken from its owner.
        gpucomm_ordering::make_current(self.context())?;
        Ok(admitted.stream.cu_stream() as cudaStream_t)
    }

    /// Blocks the host until all PEs reach the barrier and all earlier NVSHMEM operations are
    /// complete (`nvshmem_barrier_all`). It does not wait for work queued on your own streams:
    /// use [`Runtime::barrier_all_on_stream`] for that — except for the collectives enqueued on
    /// them (barriers, syncs, team collectives): NVSHMEM runs this barrier on its own stream, with
    /// the same per-team state, so it first waits on the host until they have finished (see
    /// [`crate::Team`]).
    #[doc(alias = "nvshmem_barrier_all")]
    pub fn barrier_all(&self) -> Result<()> {
        let _relaxed = quiesce::relaxed_host();
        gpucomm_ordering::make_current(self.context())?;
        quiesce::host_collective("the host barrier (nvshmem_barrier_all)")?;
        // SAFETY: NVSHMEM is initialised and the PE's context is current.
        unsafe { call!(nvshmem_barrier_all()) }
    }

    /// The checks that every PE makes the same allocation (set up by every start).
    pub(crate) fn agreement(&self) -> Result<&Agreement> {
        self.agreement.as_ref().ok_or(Error::Finalized)
    }

    /// Bounds how long teardown waits for queued GPU work: [`Runtime::finalize`] and dropping the
    /// runtime (for the whole device, see [`Runtime`]), destroying or dropping a
    /// [`Team`](crate::Team) and dropping a [`Module`](crate::Module) (for the whole device), and
    /// unregistering a [`Registration`](crate::Registration) (for its buffer); and how long
    /// [`Runtime::load_module`] waits for the whole device before NVSHMEM synchronises it. `None`
    /// (the default) waits as long as it takes.
    pub fn set_timeout(&self, timeout: Option<Duration>) {
        self.timeout.set(timeout);
    }

    /// The teardown bound ([`Runtime::set_timeout`]).
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout.get()
    }

    /// Finalises NVSHMEM (`nvshmemx_hostlib_finalize`) once all work on the PE's device has
    /// finished. Collective: every PE must finalise. Symmetric buffers, teams and modules borrow
    /// the runtime, so all of them are gone by now.
    ///
    /// NVSHMEM's finalize synchronises the whole device itself (3.4.5: `cudaDeviceSynchronize`
    /// after its final barrier), so it is called only once the device is idle, waited for within
    /// [`Runtime::timeout`]: when that expires (work stuck on some stream of the device, e.g. an
    /// NCCL kernel waiting for a dead peer), the runtime comes back with [`Error::StillInUse`],
    /// and NVSHMEM is untouched. A failing wait comes back the same way. (Dropping a runtime whose
    /// device does not become idle leaves NVSHMEM initialised in the process, with a warning.)
    ///
    /// Refused, with the runtime handed back and nothing called, while this thread has a capture
    /// scope open ([`Error::HostCallInCapture`]: NVSHMEM's finalize waits on the host, which CUDA
    /// refuses inside a capture, and NVSHMEM exits the process on that refusal) and while a
    /// capture holds NVSHMEM's copy streams ([`Error::CopyStreamsCaptured`]).
    #[doc(alias = "nvshmemx_hostlib_finalize")]
    #[doc(alias = "nvshmem_finalize")]
    // The runtime comes back on failure, as fallible teardown does throughout the family.
    #[allow(clippy::result_large_err)]
    pub fn finalize(mut self) -> std::result::Result<(), (Self, Error)> {
        if let Err(e) = quiesce::host_call("finalising NVSHMEM (nvshmemx_hostlib_finalize)") {
            return Err((self, e));
        }
        if let Err(e) = self.wait_for_device("the PE's device (NVSHMEM's finalize waits for all of its work)") {
            return Err((self, e));
        }
        self.finish();
        Ok(())
    }

    /// Moves this runtime into a new value, leaving this one released (its drop does nothing).
    fn take_over(&mut self) -> Runtime {
        self.released = true;
        Runtime {
            stream: self.stream.clone(),
            my_pe: self.my_pe,
            n_pes: self.n_pes,
            info: self.info.clone(),
            heap_use: self.heap_use.clone(),
            registered: std::mem::take(&mut self.registered),
            agreement: self.agreement.take(),
            timeout: self.timeout.clone(),
            limited_mpg: self.limited_mpg,
            reduce_segment: self.reduce_segment,
            released: false,
            _not_sync: PhantomData,
        }
    }

    /// Leaves NVSHMEM running (not finalised) in this process because of `why`, with a warning:
    /// the process cannot start it again.
    fn leak(&self, why: &str) {
        log::warn!("nvshmem: {why}: NVSHMEM stays initialised (not finalised) in this process");
        lifecycle::finish();
    }

    /// Waits until the PE's device is idle, within the timeout ([`Error::StillInUse`] about `what`
    /// otherwise): before tearing down what work queued on streams this crate does not know may
    /// still use (NVSHMEM itself, a team, a module), and before a call that NVSHMEM ends with an
    /// unbounded wait for the device (loading a module).
    pub(crate) fn wait_for_device(&self, what: &'static str) -> Result<()> {
        let timeout = self.timeout.get();
        if gpucomm_ordering::device_idle_within(self.context(), timeout)? {
            Ok(())
        } else {
            Err(Error::StillInUse { what, after: timeout.unwrap_or_default() })
        }
    }

    /// `nvshmemx_hostlib_finalize`, once.
    fn finish(&mut self) {
        self.released = true;
        if let Some(agreement) = self.agreement.take() {
            agreement.close();
        }
        quiesce::stop();
        if let Err(e) = gpucomm_ordering::make_current(self.context()) {
            log::warn!("nvshmem: making the PE's CUDA context current before finalising failed: {e}");
        }
        // No other thread reads NVSHMEM's state meanwhile (`init_status` takes this lock too).
        let _serial = unique_id::plugin();
        // SAFETY: NVSHMEM was initialised by this runtime, which is the only one, and is
        // finalised exactly once (it is marked released above); the device is idle (both callers waited
        // for it successfully), so nothing uses the heap that finalising releases.
        if let Err(e) = unsafe { call!(nvshmemx_hostlib_finalize()) } {
            log::warn!("nvshmem: finalising failed: {e}");
        }
        lifecycle::finish();
    }
}

impl Runtime {
    /// The runtime as a resource a graph must keep: what an operation on it inside [`crate::capture`] records.
    pub(crate) fn resource(&self) -> Resource {
        Resource::of("NVSHMEM runtime", self)
    }
}

// SAFETY: the borrow keeps the runtime (NVSHMEM itself) running and in place.
unsafe impl Keep for &Runtime {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        v.resource(self.resource(), true);
    }
}

/// `nvshmem_info_get_name`.
fn library_name() -> Result<String> {
    let mut name = [0 as c_char; nvshmem_sys::NVSHMEM_MAX_NAME_LEN as usize];
    // SAFETY: NVSHMEM writes at most NVSHMEM_MAX_NAME_LEN bytes, NUL included, into the buffer.
    unsafe { call!(nvshmem_info_get_name(name.as_mut_ptr())) }?;
    // SAFETY: the buffer is NUL-terminated (NVSHMEM writes a C string; the last byte stays 0
    // from the initialiser in any case).
    let text = unsafe { CStr::from_ptr(name.as_ptr()) };
    Ok(text.to_string_lossy().into_owned())
}

/// `nvshmem_info_get_version`.
fn spec_version() -> Result<(u32, u32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes one int through each pointer to a live local.
    unsafe { call!(nvshmem_info_get_version(&mut major, &mut minor)) }?;
    Ok((major.max(0) as u32, minor.max(0) as u32))
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Finalising is collective (a barrier over all PEs and one of the bootstrap): while this
        // thread unwinds, the other PEs are not finalising at this step, and the device wait below
        // would be unbounded without a timeout. `Team`'s drop leaks for the same reason.
        if std::thread::panicking() {
            return self.leak("the runtime was dropped while its thread panics (finalising is collective)");
        }
        // The host waits of finalising would be refused by CUDA inside the capture, and NVSHMEM
        // exits the process on that refusal: the runtime is finalised once the capture has ended
        // (leaving NVSHMEM initialised instead can crash the process at exit, its proxy thread
        // racing the exit handlers). Without a scope open, `after_scope` hands the drop back,
        // and dropping it finalises now.
        if gpucomm_ordering::scope_open() {
            let moved = self.take_over();
            let _ = gpucomm_ordering::after_scope(Box::new(move || drop(moved)));
            return;
        }
        // Pending kernels may still use the symmetric heap that finalize releases, and NVSHMEM's
        // finalize would wait for the whole device anyway.
        if let Err(e) = self.wait_for_device("the PE's device (NVSHMEM's finalize waits for all of its work)") {
            return self.leak(&e.to_string());
        }
        self.finish();
    }
}

/// A call's stream, admitted by the crates' ordering: not being captured, or captured by this
/// thread's capture scope, which records the resource the call uses. Anything else is refused
/// before NVSHMEM is called: a capture these crates did not open
/// ([`gpucomm_ordering::OrderError::ForeignCapture`]), and one that CUDA invalidated
/// ([`gpucomm_ordering::OrderError::CaptureBroken`]), on which NVSHMEM's CUDA calls would fail and
/// NVSHMEM would exit the process. [`Runtime::enqueue_on`] takes one, so no call reaches NVSHMEM
/// unadmitted; the driver is asked once per call, by the call's [`Access`] when it has one.
#[derive(Clone, Copy)]
pub(crate) struct Admitted<'s> {
    stream: &'s CudaStream,
    /// Captured by this thread's capture scope.
    pub(crate) captured: bool,
}

impl<'s> Admitted<'s> {
    /// Admits the call of `access` (which also takes its buffers' pointers), using `resource`.
    #[inline]
    pub(crate) fn access(access: &Access<'s>, resource: Resource) -> Result<Self> {
        access.resource(resource)?;
        Ok(Admitted { stream: access.stream(), captured: access.capturing()? })
    }

    /// Admits a call on `stream` that uses `resource` and no buffer (a barrier, a quiet).
    #[inline]
    pub(crate) fn stream(stream: &'s CudaStream, resource: Resource) -> Result<Self> {
        Ok(Admitted { stream, captured: gpucomm_ordering::admit(stream, &[resource])? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_stays_send() {
        fn send<T: Send>() {}
        send::<Runtime>();
    }

    /// The status constants are the headers' values.
    #[test]
    fn init_statuses_match_the_headers() {
        use nvshmem_sys::nvshmemx_init_status_t as C;
        assert_eq!(InitStatus::NOT_INITIALIZED.0 as u32, C::NVSHMEM_STATUS_NOT_INITIALIZED.0);
        assert_eq!(InitStatus::IS_BOOTSTRAPPED.0 as u32, C::NVSHMEM_STATUS_IS_BOOTSTRAPPED.0);
        assert_eq!(InitStatus::IS_INITIALIZED.0 as u32, C::NVSHMEM_STATUS_IS_INITIALIZED.0);
        assert_eq!(InitStatus::LIMITED_MPG.0 as u32, C::NVSHMEM_STATUS_LIMITED_MPG.0);
        assert_eq!(InitStatus::FULL_MPG.0 as u32, C::NVSHMEM_STATUS_FULL_MPG.0);
        assert_eq!(InitStatus(2).to_string(), "NVSHMEM_STATUS_IS_INITIALIZED(2)");
        assert_eq!(InitStatus(9).to_string(), "InitStatus(9)");
    }

    /// The status query needs neither a GPU nor a runtime.
    #[test]
    fn nothing_is_initialised_before_a_runtime_starts() {
        match init_status() {
            Ok(status) => assert_eq!(status, InitStatus::NOT_INITIALIZED),
            Err(Error::Load(e)) => eprintln!("no NVSHMEM library here: {e}"),
            Err(e) => panic!("{e}"),
        }
    }
}
