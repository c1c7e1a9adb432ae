//! The kernels of `cu/lsa_allreduce.cu` and what they need on one rank: a device communicator
//! with one LSA barrier per CTA, and one symmetric window holding their call counters and staging
//! areas. [`crate::AllReduce`] is built on this; the course's lessons 13, 15 and 19 and its
//! custom-kernels bench use it directly.
//!
//! Window layout (bytes, every rank alike; sizes agreed between the ranks at creation):
//!
//! | offset | size | what |
//! |---|---|---|
//! | 0 | 4 KiB | per-CTA call counters: the one-shot's at 0, the LL kernel's at 128 |
//! | 4 KiB | 2 × `one_shot` | one-shot staging slots |
//! | … | 2 × 8 × 128 KiB | LL regions: (slot, source rank) pairs of (data, flag) words |
//! | … | `staged` | staged two-shot: input region |
//! | … | `staged` | staged two-shot: output region |

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DevicePtr, DeviceSlice, LaunchConfig, PushKernelArg, SyncOnDrop,
};
use gpucomm_ordering::range::{self, Meeting};
use gpucomm_ordering::{Access, DeviceMemory, Keep, Placement, Resource, Use, Visitor};
use nccl::device::{DevComm, DevCommRequirements};
use nccl::{
    Collectives, Comm, DataType, DeviceBuffer, DeviceBufferMut, MemBuffer, NcclType, ReduceOp, Version, Window,
    WindowFlags,
};

use crate::error::{Error, Result};
use crate::fallback::Fallback;
use crate::path::Path;

/// CTAs of a launch at most (one LSA barrier each).
pub const MAX_CTAS: u32 = 32;
/// Threads per CTA.
const THREADS: u32 = 512;
/// Bytes of the per-CTA call counters at the start of the window (see the kernels).
const CTRL_BYTES: usize = 4096;
/// Where the LL kernel's call counters start, after the one-shot's (at 0): each kernel counts its
/// own calls, so that the LL kernel's refresh of its regions (every 2^31 of its calls) cannot be
/// skipped by one-shot launches taking the call numbers that do it.
const LL_COUNTERS: usize = MAX_CTAS as usize * size_of::<u32>();
const _: () = assert!(2 * LL_COUNTERS <= CTRL_BYTES, "both kernels' counters fit the control area");
/// The largest message of the LL kernel.
pub const LL_MAX_BYTES: usize = 64 << 10;
/// The most ranks the kernels handle.
pub const MAX_PEERS: usize = 8;
/// Bytes of one LL region (one source rank, one slot): an 8-byte pair per 4-byte word.
const LL_REGION: usize = 2 * LL_MAX_BYTES;
/// Bytes of all LL regions.
const LL_BYTES: usize = 2 * MAX_PEERS * LL_REGION;
/// Window areas are multiples of this, so that every area starts 16-byte aligned (and more).
const AREA_ALIGN: usize = 4096;

/// Set by [`LsaKernels::fail_next_setup`] (feature `test-hooks`).
#[cfg(feature = "test-hooks")]
static FAIL_NEXT_SETUP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// An element type the kernels are compiled for (`lsa_*_sum_<suffix>`): f32, bf16, f16. The
/// launch methods take any [`NcclType`] and refuse the others at run time
/// ([`Error::UnsupportedType`]); this trait lets code require a kernel type at compile time.
pub trait Element: NcclType + sealed::Sealed {
    /// The kernel name suffix.
    const SUFFIX: &'static str;
}

impl Element for f32 {
    const SUFFIX: &'static str = "f32";
}
impl Element for half::bf16 {
    const SUFFIX: &'static str = "bf16";
}
impl Element for half::f16 {
    const SUFFIX: &'static str = "f16";
}

/// The kernel suffix of an NCCL data type, for the types the kernels exist for.
pub(crate) fn suffix(dtype: DataType) -> Option<&'static str> {
    [
        (<f32 as NcclType>::DATA_TYPE, f32::SUFFIX),
        (<half::bf16 as NcclType>::DATA_TYPE, half::bf16::SUFFIX),
        (<half::f16 as NcclType>::DATA_TYPE, half::f16::SUFFIX),
    ]
    .into_iter()
    .find(|(d, _)| *d == dtype)
    .map(|(_, s)| s)
}

/// A readable name of `T` for messages (`f64`, `half::binary16::f16` → `f16`).
pub(crate) fn type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

/// The staging areas of the window, in bytes (rounded up to 4 KiB each, at most [`MAX_AREA`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// The largest one-shot message (two slots of it are kept); 0 for none.
    pub one_shot: usize,
    /// The largest staged two-shot launch (input and output regions of it are kept; larger
    /// messages take several launches); 0 for none.
    pub staged: usize,
}

/// The largest staging area: beyond any GPU's memory, and small enough that the window's size
/// and every offset in it are computed without overflow.
pub const MAX_AREA: usize = 1 << 40;

impl Sizes {
    /// The sizes as the window lays them out: each rounded up to 4 KiB, and
    /// [`Error::AreaTooLarge`] for one above [`MAX_AREA`].
    pub(crate) fn rounded(self) -> Result<Sizes> {
        let area = |what, bytes: usize| {
            if bytes > MAX_AREA {
                Err(Error::AreaTooLarge { what, bytes, max: MAX_AREA })
            } else {
                Ok(round_area(bytes))
            }
        };
        Ok(Sizes { one_shot: area("one-shot", self.one_shot)?, staged: area("staged", self.staged)? })
    }

    /// Byte offsets in the window of the LL regions, the staged input and the staged output (the
    /// counters come first, then the two one-shot slots, where the kernel finds them; sizes
    /// [`Sizes::rounded`], so no overflow).
    fn offsets(self) -> (usize, usize, usize) {
        let ll = CTRL_BYTES + 2 * self.one_shot;
        let staged_in = ll + LL_BYTES;
        (ll, staged_in, staged_in + self.staged)
    }

    /// The window's bytes: everything [`Sizes::offsets`] lays out, up to the staged output's end.
    fn window_bytes(self) -> usize {
        self.offsets().2 + self.staged
    }
}

/// How many bytes of the message each CTA of a launch handles, per kernel: the launch has
/// `bytes / per CTA` CTAs (at least 1, at most [`MAX_CTAS`]) of 512 threads. More CTAs put more
/// loads and stores in flight; fewer make fewer barrier partners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtaBytes {
    /// LL (default 2 KiB: one 4-byte word per thread).
    pub ll: usize,
    /// One-shot (default 8 KiB: one 16-byte vector per thread).
    pub one_shot: usize,
    /// Both two-shots (default 64 KiB).
    pub two_shot: usize,
}

impl Default for CtaBytes {
    fn default() -> Self {
        CtaBytes { ll: 2 << 10, one_shot: 8 << 10, two_shot: 64 << 10 }
    }
}

impl CtaBytes {
    /// The three shares, as the ranks compare them.
    pub(crate) fn values(&self) -> [u64; 3] {
        [self.ll, self.one_shot, self.two_shot].map(|v| v as u64)
    }

    /// The launch of a message of `bytes` with `per_cta` bytes per CTA.
    fn config(bytes: usize, per_cta: usize) -> LaunchConfig {
        let ctas = bytes.div_ceil(per_cta.max(1)).clamp(1, MAX_CTAS as usize) as u32;
        LaunchConfig { grid_dim: (ctas, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
    }
}

/// The four kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    Ll,
    OneShot,
    TwoShot,
    Staged,
}

impl Kernel {
    /// The kernel that takes a path's calls on any buffers (two-shot: the staged one); none for
    /// NCCL.
    pub(crate) fn for_path(path: Path) -> Option<Kernel> {
        match path {
            Path::Ll => Some(Kernel::Ll),
            Path::OneShot => Some(Kernel::OneShot),
            Path::TwoShot => Some(Kernel::Staged),
            Path::Nccl => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kernel::Ll => "ll",
            Kernel::OneShot => "oneshot",
            Kernel::TwoShot => "twoshot",
            Kernel::Staged => "staged",
        }
    }
}

/// The kernels' window as their launches use it. Through the window handle, the kernels of this
/// rank and of the peers write all of it (call counters, flags, staging areas), so every use is
/// ordered as a write — one stream at a time — even one taken through the shared `DevicePtr`:
/// launches take it with [`Access::read`], which inside a capture records a read of memory that
/// `&LsaKernels` keeps shared, while the tracker orders each eager use, and each launch of a graph
/// that captured one, after every earlier use.
struct KernelWindow<'c>(Window<'c, u8>);

impl DeviceSlice<u8> for KernelWindow<'_> {
    fn len(&self) -> usize {
        self.0.buffer().len()
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.0.buffer().stream()
    }
}

impl DevicePtr<u8> for KernelWindow<'_> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        let buf = self.0.buffer();
        let ptr = buf.as_raw();
        // SAFETY: the window is private to its `LsaKernels`, which is not `Sync` (it holds a
        // `&Comm`): its uses come from one thread, one call at a time, so this write through `&`
        // excludes every other use as a `&mut` would.
        let guard = unsafe { buf.tracker().device_ptr_guard::<u8>(stream, ptr, buf.num_bytes(), Use::Write) };
        (ptr, guard)
    }
}

// SAFETY: the address and length are the window's `MemBuffer`'s (ncclMemAlloc memory of `len`
// bytes on the window's device), which the window owns and frees only after deregistering it,
// itself only after the buffer's tracker reports every use finished; every use is ordered through
// that tracker (as a write, which orders more than a read needs).
unsafe impl DeviceMemory for KernelWindow<'_> {
    type Elem = u8;
}

/// What a graph calls the kernels (their device communicator, module and window).
const KIND: &str = "LSA all-reduce kernels";

/// The kernels and what they need on one rank of a communicator: a device communicator with
/// [`MAX_CTAS`] LSA barriers and one symmetric window (see the [module docs](self)).
///
/// Every launch is collective: every rank makes the same calls, in the same order, with the same
/// counts. The window's uses are ordered across streams like a buffer that every launch writes, so
/// launches on several streams run one after the other. Creation is collective; drop it on every
/// rank once no rank launches on it any more (the peers' kernels read this rank's window).
///
/// Inside [`nccl::capture`] a launch records its buffers, the kernels and their window: the keep
/// set holds `&kernels` (or the [`crate::AllReduce`] they belong to) besides the buffers, so
/// that the graph keeps the device communicator, the module and the window alive. A capture not
/// opened through that scope is refused (`OrderError::ForeignCapture`), as by every call.
pub struct LsaKernels<'c> {
    comm: &'c Comm,
    // Destroyed first (`Drop`): destroying the device communicator waits for every kernel of the
    // device.
    dev: ManuallyDrop<DevComm<'c>>,
    window: KernelWindow<'c>,
    sizes: Sizes,
    cta: CtaBytes,
    // Dropped last, after the device communicator and the window: see `Functions`.
    functions: Functions<'c>,
}

/// The module's kernels, one per (kernel, element type), and the communicator they run on.
/// Dropped after the device communicator and the window, whose teardowns wait for the kernels —
/// except behind an abort (a watchdog's, an abort handle's, a timeout's, which those waits can
/// make themselves), inside a capture scope, or when the device stayed busy past the
/// communicator's timeout: then kernels may still run (spinning behind a dead peer), so the
/// module is leaked rather than unloaded under them.
struct Functions<'c> {
    comm: &'c Comm,
    list: ManuallyDrop<Vec<(Kernel, &'static str, CudaFunction)>>,
    /// The device communicator could not be destroyed (the device stayed busy, or the wait or
    /// the destroy failed): kernels may still run.
    may_run: bool,
}

impl Drop for Functions<'_> {
    fn drop(&mut self) {
        // Inside a capture scope the device communicator's destruction is refused: `may_run`.
        if self.may_run || self.comm.is_aborted() {
            log::warn!(
                "gpucomm-kernels: the communicator was aborted, a capture is open, or the device communicator \
                 could not be destroyed (see the warning before); the kernels' module is leaked, not unloaded"
            );
            return;
        }
        // SAFETY: dropped once, here, as `self` is.
        unsafe { ManuallyDrop::drop(&mut self.list) }
    }
}

impl Drop for LsaKernels<'_> {
    fn drop(&mut self) {
        // SAFETY: taken once, here, as `self` is dropped; not used after.
        let dev = unsafe { ManuallyDrop::take(&mut self.dev) };
        if let Err((dev, e)) = dev.destroy() {
            // First, so that nothing below (a logger that panics) can undo it: its drop would wait
            // for the device again, for a second timeout.
            std::mem::forget(dev);
            self.functions.may_run = true;
            log::warn!(
                "gpucomm-kernels: {e}; the device communicator is kept until NCCL frees it with the communicator"
            );
        }
    }
}

impl std::fmt::Debug for LsaKernels<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LsaKernels")
            .field("dev", &self.dev)
            .field("sizes", &self.sizes)
            .field("cta", &self.cta)
            .finish()
    }
}

impl<'c> LsaKernels<'c> {
    /// Collective over `comm`: checks that every rank can reach every other by loads and stores
    /// and that all ranks ask for the same `sizes`, then creates the device communicator and the
    /// window, and loads the kernels. Nothing is created when a check fails
    /// ([`Error::Unavailable`]).
    pub fn new(comm: &'c Comm, sizes: Sizes) -> Result<Self> {
        // Each rank's own verdicts are compared with the sizes, before anything fails: a rank
        // that stopped alone would leave the others waiting in the comparison.
        let (team, sizes) = (check_team(comm), sizes.rounded());
        let (one_shot, staged) = sizes.as_ref().map_or((0, 0), |s| (s.one_shot as u64, s.staged as u64));
        let mine = [u64::from(team.is_ok()), u64::from(sizes.is_ok()), one_shot, staged];
        let agreed = agree(comm, "staging sizes (and whether every rank can use the kernels and the sizes)", &mine);
        team.map_err(Error::Unavailable)?;
        let sizes = sizes?;
        agreed?;
        Self::create(comm, sizes)
    }

    /// [`LsaKernels::new`] after the dispatcher has done the checks (on every rank; `sizes`
    /// [`Sizes::rounded`]).
    pub(crate) fn create(comm: &'c Comm, sizes: Sizes) -> Result<Self> {
        if !crate::image::COMPILED {
            return Err(Error::Unavailable(Fallback::NotCompiled));
        }
        // What can fail on this rank alone comes first, and every rank learns whether it did
        // everywhere: a rank that failed would otherwise fall back while the others wait for it
        // in the collective steps below.
        let local = Self::load(comm, sizes);
        let everyone = min_max(comm, &[u64::from(local.is_ok())], ReduceOp::MIN)?[0] == 1;
        let (functions, buf) = match local {
            Ok(loaded) if everyone => loaded,
            Ok(_) => return Err(Error::Unavailable(Fallback::PeerCannot)),
            Err(e) => return Err(e),
        };
        let made = (|| -> Result<_> {
            let dev = DevComm::new(comm, &DevCommRequirements::default().lsa_barriers(MAX_CTAS))?;
            let window = KernelWindow(comm.register_window(buf, WindowFlags::COLL_SYMMETRIC).map_err(|(_, e)| e)?);
            Ok((dev, window))
        })();
        #[cfg(feature = "test-hooks")]
        let made = made.and_then(|made| match FAIL_NEXT_SETUP.swap(false, std::sync::atomic::Ordering::Relaxed) {
            true => Err(cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY).into()),
            false => Ok(made),
        });
        // The collective steps can fail on one rank alone after the others are through (a window
        // registration that fails there): every rank learns whether every rank made its parts, and
        // lets them go (locally) unless all did, or its kernels would wait for ever at barriers
        // that the failed rank's CTAs never reach.
        let everyone = min_max(comm, &[u64::from(made.is_ok())], ReduceOp::MIN)?[0] == 1;
        let (dev, window) = match made {
            Ok(made) if everyone => made,
            Ok(_) => return Err(Error::Unavailable(Fallback::PeerCannot)),
            Err(e) => return Err(e),
        };
        let functions = Functions { comm, list: ManuallyDrop::new(functions), may_run: false };
        Ok(LsaKernels { comm, dev: ManuallyDrop::new(dev), window, sizes, cta: CtaBytes::default(), functions })
    }

    /// [`LsaKernels::create`]'s steps on this rank alone: the kernels, and the window's memory,
    /// zeroed and synchronized.
    #[allow(clippy::type_complexity)]
    fn load(comm: &Comm, sizes: Sizes) -> Result<(Vec<(Kernel, &'static str, CudaFunction)>, MemBuffer<u8>)> {
        let module = nccl::device::load_module(comm.context(), crate::image::LSA_ALLREDUCE)?;
        let mut functions = Vec::new();
        for kernel in [Kernel::Ll, Kernel::OneShot, Kernel::TwoShot, Kernel::Staged] {
            for suffix in [f32::SUFFIX, half::bf16::SUFFIX, half::f16::SUFFIX] {
                let name = format!("lsa_{}_sum_{suffix}", kernel.name());
                functions.push((kernel, suffix, module.load_function(&name)?));
            }
        }
        let buf = MemBuffer::<u8>::zeroed(comm.stream(), sizes.window_bytes())?;
        // Zeroed before any peer can reach it: the LL kernel of a peer stores into this window
        // without waiting for this rank, and a late memset would wipe its flags.
        buf.tracker().synchronize().map_err(nccl::Error::from)?;
        Ok((functions, buf))
    }

    /// The communicator.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    /// For tests only (feature `test-hooks`): the next setup of the kernels in this process
    /// ([`LsaKernels::new`], [`crate::AllReduce::new`]) fails on this rank after its collective
    /// steps, with `CUDA_ERROR_OUT_OF_MEMORY`, as a window registration that fails on one rank
    /// alone does.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn fail_next_setup() {
        FAIL_NEXT_SETUP.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Collective, for tests only (feature `test-hooks`): sets the launch count that every
    /// kernel call reads as its call number (LL's flag is the call number plus one) to `calls`
    /// on every rank, once this rank's earlier launches have finished, so that a test can see
    /// what the kernels do after 2^32 launches without making them. Every rank must pass the
    /// same count (compared: [`Error::Mismatch`]).
    ///
    /// # Safety
    ///
    /// The count moves backwards or forwards by anything, so the LL kernel's words of earlier
    /// launches can carry the flags of later ones: every word of each slot the next launches read
    /// must have been written since with another flag (a test writes whole slots first), or the
    /// kernels sum stale data; and every rank's earlier launches must have finished.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub unsafe fn set_launch_count(&mut self, calls: u32) -> Result<()> {
        agree(self.comm, "launch counts", &[u64::from(calls)])?;
        let stream = self.comm.stream();
        let counters = [calls; 2 * MAX_CTAS as usize];
        let (ptr, guard) = self.window.device_ptr(stream);
        // SAFETY: the window begins with both kernels' MAX_CTAS 4-byte call counters (before
        // anything else, see `Sizes::offsets`), and the guard orders this copy after every
        // earlier use of the window; `counters` outlives the copy (synchronized below).
        unsafe { cudarc::driver::result::memcpy_htod_async(ptr, &counters, stream.cu_stream()) }?;
        drop(guard);
        stream.synchronize()?;
        Ok(())
    }

    /// The staging areas (as agreed, rounded up to 4 KiB).
    pub fn sizes(&self) -> Sizes {
        self.sizes
    }

    /// The launch shapes.
    pub fn cta_bytes(&self) -> CtaBytes {
        self.cta
    }

    /// Collective (every rank, outside any capture): sets the launch shapes, which must be the
    /// same on every rank, since CTA `i` meets CTA `i` of the peers at each barrier; compared
    /// across the ranks ([`Error::Mismatch`], nothing changed).
    pub fn set_cta_bytes(&mut self, cta: CtaBytes) -> Result<()> {
        agree(self.comm, "launch shapes (CTA bytes)", &cta.values())?;
        self.cta = cta;
        Ok(())
    }

    /// Sets launch shapes every rank has already agreed on.
    pub(crate) fn use_cta_bytes(&mut self, cta: CtaBytes) {
        self.cta = cta;
    }

    fn function(&self, kernel: Kernel, dtype: DataType, name: &'static str) -> Result<&CudaFunction> {
        let s = suffix(dtype).ok_or(Error::UnsupportedType { dtype: name })?;
        self.functions
            .list
            .iter()
            .find(|(k, sx, _)| *k == kernel && *sx == s)
            .map(|(_, _, f)| f)
            .ok_or(Error::UnsupportedType { dtype: name })
    }

    /// The largest message each kernel takes in one launch, in bytes (two-shot: per staged
    /// launch; 0 when the window has no room for it).
    pub fn max_bytes(&self, path: Path) -> usize {
        match path {
            Path::Ll => LL_MAX_BYTES,
            Path::OneShot => self.sizes.one_shot,
            Path::TwoShot => self.sizes.staged,
            Path::Nccl => usize::MAX,
        }
    }

    /// LL all-reduce (sum) of `send` into `recv` on `stream`, for messages of 1 to
    /// [`LL_MAX_BYTES`] bytes: no barrier, data and flags in 8-byte words.
    pub fn ll<T: NcclType>(
        &self,
        stream: &Arc<CudaStream>,
        send: &impl DeviceBuffer<T>,
        recv: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.pair(Kernel::Ll, &Access::new(stream), send, recv)
    }

    /// [`LsaKernels::ll`] in place.
    pub fn ll_in_place<T: NcclType>(&self, stream: &Arc<CudaStream>, buf: &mut impl DeviceBufferMut<T>) -> Result<()> {
        self.single(Kernel::Ll, &Access::new(stream), buf)
    }

    /// One-shot all-reduce (sum) of `send` into `recv` on `stream`, for messages of 1 to
    /// [`Sizes::one_shot`] bytes: any device buffers of the communicator's device.
    pub fn one_shot<T: NcclType>(
        &self,
        stream: &Arc<CudaStream>,
        send: &impl DeviceBuffer<T>,
        recv: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.pair(Kernel::OneShot, &Access::new(stream), send, recv)
    }

    /// [`LsaKernels::one_shot`] in place.
    pub fn one_shot_in_place<T: NcclType>(
        &self,
        stream: &Arc<CudaStream>,
        buf: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.single(Kernel::OneShot, &Access::new(stream), buf)
    }

    /// Two-shot all-reduce (sum) of `send` into `recv` on `stream` through the window's staging
    /// regions: any device buffers, any size (messages larger than [`Sizes::staged`] take several
    /// launches).
    pub fn staged<T: NcclType>(
        &self,
        stream: &Arc<CudaStream>,
        send: &impl DeviceBuffer<T>,
        recv: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.pair(Kernel::Staged, &Access::new(stream), send, recv)
    }

    /// [`LsaKernels::staged`] in place.
    pub fn staged_in_place<T: NcclType>(
        &self,
        stream: &Arc<CudaStream>,
        buf: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.single(Kernel::Staged, &Access::new(stream), buf)
    }

    /// Two-shot all-reduce (sum) of `count` elements from `send` (window, element offset
    /// `send_at`) into `recv` (window, element offset `recv_at`) on `stream`, reading and writing
    /// the peers' windows directly (no copies). Both windows must be registered on this
    /// communicator ([`Error::OtherCommunicator`]). The window may be the same for an in-place
    /// call (same offset) but must then be passed as `recv` only: see [`crate::AllReduce`] for a
    /// safe form. Inside [`nccl::capture`] the keep set holds `send` (`&send`), `recv` (`&mut
    /// recv`) and these kernels.
    ///
    /// # Safety
    ///
    /// Every rank's `send` and `recv` windows (registered together on this communicator) hold at
    /// least `send_at + count` and `recv_at + count` elements: the kernel loads and stores the
    /// peers' windows at these offsets, which this rank cannot check.
    pub unsafe fn two_shot<T: NcclType>(
        &self,
        stream: &Arc<CudaStream>,
        send: &Window<'c, T>,
        send_at: usize,
        recv: &mut Window<'c, T>,
        recv_at: usize,
        count: usize,
    ) -> Result<()> {
        for (what, w, at) in [("send window", send, send_at), ("recv window", &*recv, recv_at)] {
            let end = at.checked_add(count).filter(|&end| end <= w.buffer().len() && count > 0);
            if end.is_none() {
                return Err(Error::WindowRange {
                    what,
                    start: at,
                    end: at.saturating_add(count),
                    len: w.buffer().len(),
                });
            }
        }
        // SAFETY: both windows hold the elements on this rank (checked above) and on every rank
        // (the caller's contract).
        unsafe { self.two_shot_windows(&Access::new(stream), Some((send, send_at)), (recv, recv_at), count) }
    }

    /// Launches the window two-shot kernel on `access`'s stream, from elements `send_at..` of
    /// `send` (`None`: in place, from the same elements of `recv`) into `recv_at..` of `recv`,
    /// after recording both ranges and the kernels' window with `access`.
    ///
    /// # Safety
    ///
    /// Both windows hold `count` ≥ 1 elements of T from their element offsets on this rank and on
    /// every rank (the kernel works in the peers' windows at these offsets).
    pub(crate) unsafe fn two_shot_windows<T: NcclType>(
        &self,
        access: &Access<'_>,
        send: Option<(&Window<'c, T>, usize)>,
        (recv, recv_at): (&mut Window<'c, T>, usize),
        count: usize,
    ) -> Result<()> {
        for (what, w) in [("send window", send.map(|s| s.0)), ("recv window", Some(&*recv))] {
            if w.is_some_and(|w| !std::ptr::eq(w.comm(), self.comm)) {
                return Err(Error::OtherCommunicator { what });
            }
        }
        let kernel = self.function(Kernel::TwoShot, T::DATA_TYPE, type_name::<T>())?;
        self.admit(access)?;
        // The handles are taken only now that the communicator is known to be live (they die with
        // it), and as plain values: `recv` is borrowed mutably below, for the recorded write.
        let recv_win = recv.as_raw() as usize;
        let (send_win, send_at) = send.map_or((recv_win, recv_at), |(w, at)| (w.as_raw() as usize, at));
        let read = send.map(|(w, at)| w.slice(at..at + count)).transpose()?;
        let _read = read.as_ref().map(|v| access.read(v)).transpose()?;
        let mut written = recv.slice_mut(recv_at..recv_at + count)?;
        let (_, _write) = access.write(&mut written)?;
        // The device communicator's barriers are used by one launch at a time, as the window is.
        let (_, _window) = access.read(&self.window)?;
        let (send_off, recv_off) = (send_at * size_of::<T>(), recv_at * size_of::<T>());
        let stream = access.stream();
        let dev = self.dev.arg();
        let mut launch = stream.launch_builder(kernel);
        launch.arg(&dev).arg(&send_win).arg(&send_off).arg(&recv_win).arg(&recv_off).arg(&count);
        let cfg = CtaBytes::config(count * size_of::<T>(), self.cta.two_shot);
        // SAFETY: the kernel takes (ncclDevComm, ncclWindow_t, size_t, ncclWindow_t, size_t,
        // size_t), matching the arguments pushed (a window handle is a pointer, pushed as the
        // pointer-sized integer it was taken as); both windows are registered on this
        // communicator (checked), which is live (checked by `admit`, and nothing since can abort
        // it), and borrowed until the launch is enqueued; they hold the elements on every rank
        // (the caller's contract); their ranges and the kernels' window were ordered on the stream
        // or recorded for the capture scope's graph (whose keep set must hold them) by `access`;
        // the grid has at most MAX_CTAS CTAs, the LSA barriers of `dev`.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    fn check_stream(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.check_context("the stream", stream.context())
    }

    /// `Ok` when `ctx` (a stream's, a buffer's) is the communicator's CUDA context.
    fn check_context(&self, what: &'static str, ctx: &Arc<CudaContext>) -> Result<()> {
        let device = self.comm.device();
        match gpucomm_ordering::placement(self.comm.context(), ctx) {
            Placement::Same => Ok(()),
            Placement::OtherDevice { got } => Err(Error::WrongDevice { what, expected: device, got }),
            Placement::OtherContext => Err(Error::WrongContext { what, device }),
        }
    }

    /// The kernels as a resource of the capture scope: a graph that captured a launch must keep
    /// them (their device communicator, module and window).
    pub(crate) fn resource(&self) -> Resource {
        Resource::of(KIND, self)
    }

    /// Reports the kernels to a graph's visitor: the resource, and the window's memory (read
    /// through this shared member; its tracker orders every use as a write).
    pub(crate) fn visit_members<'k>(&'k self, v: &mut Visitor<'k>) {
        v.resource(self.resource(), !self.comm.is_aborted() && !self.comm.is_revoked());
        v.read(&self.window);
    }

    /// Admits one launch on `access`'s stream: the communicator must be live (the device
    /// communicator and the window die with it) and not revoked ([`Error::Revoked`]), and the
    /// stream on its device; inside a capture opened through [`nccl::capture`] the launch records
    /// the kernels, which the graph must keep, and a capture opened by anything else is refused.
    fn admit(&self, access: &Access<'_>) -> Result<()> {
        self.check_stream(access.stream())?;
        self.comm.live_raw()?;
        if self.comm.is_revoked() {
            return Err(Error::Revoked);
        }
        access.resource(self.resource())?;
        Ok(())
    }

    /// Checks one call's buffers: lengths, devices, and the kernel's size limit; returns the count.
    fn check<T>(
        &self,
        kernel: Kernel,
        stream: &Arc<CudaStream>,
        bufs: &[(&'static str, usize, &Arc<CudaContext>)],
    ) -> Result<usize> {
        self.check_stream(stream)?;
        let count = bufs[0].1;
        for &(what, len, ctx) in bufs {
            if len != count {
                return Err(Error::LengthMismatch { what, expected: count, got: len });
            }
            self.check_context(what, ctx)?;
        }
        let bytes = count * size_of::<T>();
        let (path, max) = match kernel {
            Kernel::Ll => (Path::Ll, LL_MAX_BYTES),
            Kernel::OneShot => (Path::OneShot, self.sizes.one_shot),
            Kernel::Staged | Kernel::TwoShot => (Path::TwoShot, if self.sizes.staged == 0 { 0 } else { usize::MAX }),
        };
        if bytes == 0 || bytes > max {
            return Err(Error::Size { path, max, got: bytes });
        }
        Ok(count)
    }

    /// `kernel` from `send` into `recv` on `access`'s stream, the buffers' and the window's uses
    /// taken through `access` (ordered eagerly, or recorded by the capture scope).
    pub(crate) fn pair<T: NcclType>(
        &self,
        kernel: Kernel,
        access: &Access<'_>,
        send: &impl DeviceBuffer<T>,
        recv: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let count = self.check::<T>(
            kernel,
            access.stream(),
            &[
                ("send buffer", send.len(), send.stream().context()),
                ("recv buffer", recv.len(), recv.stream().context()),
            ],
        )?;
        let function = self.function(kernel, T::DATA_TYPE, type_name::<T>())?;
        self.admit(access)?;
        let (src, _read) = access.read(send)?;
        let (dst, _write) = access.write(recv)?;
        let bytes = count * size_of::<T>();
        // The same range is `single`'s in-place call; a partial overlap would have the kernels
        // read elements they (or a peer's kernel) already wrote.
        if range::meet((src, bytes), (dst, bytes)) == Meeting::Partly {
            return Err(Error::Overlap);
        }
        let (_, _window) = access.read(&self.window)?;
        // SAFETY: `src` and `dst` address `count` elements of T on the communicator's device (the
        // buffers' `DeviceMemory` promise; lengths and devices checked), the same range or apart
        // (checked just above), borrowed (their guards alive) until the launches are enqueued;
        // the buffers and the window were ordered on the stream, or recorded for the capture
        // scope's graph, by `access`; the communicator is live.
        unsafe { self.launch::<T>(kernel, function, access.stream(), src, dst, count) }
    }

    /// [`LsaKernels::pair`] with one buffer as input and output.
    pub(crate) fn single<T: NcclType>(
        &self,
        kernel: Kernel,
        access: &Access<'_>,
        buf: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let count = self.check::<T>(kernel, access.stream(), &[("buffer", buf.len(), buf.stream().context())])?;
        let function = self.function(kernel, T::DATA_TYPE, type_name::<T>())?;
        self.admit(access)?;
        let (ptr, _write) = access.write(buf)?;
        let (_, _window) = access.read(&self.window)?;
        // SAFETY: as in `pair`, with one buffer as input and output; every kernel reads each
        // input element before it writes the same output element, or reads a staged copy.
        unsafe { self.launch::<T>(kernel, function, access.stream(), ptr, ptr, count) }
    }

    /// Launches `kernel` (`function`) on `count` elements from `src` into `dst` (the staged
    /// two-shot in launches of at most [`Sizes::staged`] bytes).
    ///
    /// # Safety
    ///
    /// `src` and `dst` address `count` elements of T on the communicator's device that stay
    /// allocated until the launches are enqueued; they and the window are ordered on `stream` or
    /// recorded for the capture scope's graph; the communicator is live; `count` is within the
    /// kernel's limit ([`LsaKernels::check`]).
    unsafe fn launch<T: NcclType>(
        &self,
        kernel: Kernel,
        function: &CudaFunction,
        stream: &Arc<CudaStream>,
        src: u64,
        dst: u64,
        count: usize,
    ) -> Result<()> {
        let (dev, win) = (self.dev.arg(), self.window.0.arg());
        let (ll_off, in_off, out_off) = self.sizes.offsets();
        let (slot, region) = (self.sizes.one_shot, LL_REGION);
        let base: usize = if kernel == Kernel::Ll { LL_COUNTERS } else { 0 };
        let elem = size_of::<T>();
        match kernel {
            Kernel::Ll | Kernel::OneShot => {
                let bytes = count * elem;
                let mut launch = stream.launch_builder(function);
                launch.arg(&dev).arg(&win).arg(&base);
                let cfg = if kernel == Kernel::Ll {
                    launch.arg(&ll_off).arg(&region);
                    CtaBytes::config(bytes, self.cta.ll)
                } else {
                    launch.arg(&slot);
                    CtaBytes::config(bytes, self.cta.one_shot)
                };
                launch.arg(&src).arg(&dst).arg(&count);
                // SAFETY: LL takes (ncclDevComm, ncclWindow_t, size_t base, size_t ll_off,
                // size_t region, const T*, T*, size_t), one-shot (ncclDevComm, ncclWindow_t,
                // size_t base, size_t slot_bytes, const T*, T*, size_t), matching the arguments
                // pushed; `src`/`dst` hold `count` elements (the caller's contract); the window
                // (the same size on every rank, agreed at creation) holds the kernel's counters at
                // `base` (inside the control area: the one-shot's at 0, LL's at LL_COUNTERS),
                // two one-shot slots of `slot` ≥ `bytes` bytes after them and, at `ll_off`,
                // 2 × MAX_PEERS LL regions of LL_REGION bytes, room for the pairs of LL_MAX_BYTES
                // ≥ `bytes`; the LSA team has at most MAX_PEERS ranks (checked at creation); the
                // grid has at most MAX_CTAS CTAs.
                unsafe { launch.launch(cfg) }?;
            }
            Kernel::Staged => {
                let per = (self.sizes.staged / elem).max(1);
                let mut at = 0;
                while at < count {
                    let n = per.min(count - at);
                    let (s, d) = (src + (at * elem) as u64, dst + (at * elem) as u64);
                    let mut launch = stream.launch_builder(function);
                    launch.arg(&dev).arg(&win).arg(&in_off).arg(&out_off).arg(&s).arg(&d).arg(&n);
                    // SAFETY: the kernel takes (ncclDevComm, ncclWindow_t, size_t in_off, size_t
                    // out_off, const T*, T*, size_t), matching the arguments pushed; elements
                    // at..at + n of `src`/`dst` exist (the caller's contract, n ≤ count − at);
                    // the window's input and output regions at `in_off`/`out_off` hold
                    // `sizes.staged` ≥ n × elem bytes on every rank (agreed at creation); the
                    // grid has at most MAX_CTAS CTAs.
                    unsafe { launch.launch(CtaBytes::config(n * elem, self.cta.two_shot)) }?;
                    at += n;
                }
            }
            Kernel::TwoShot => unreachable!("the window two-shot is launched by `two_shot_windows`"),
        }
        Ok(())
    }
}

// SAFETY: the borrow keeps the kernels — their device communicator, module and window — alive
// and in place for as long as the graph holds it; an aborted or revoked communicator is reported
// closed, so that no launch reaches its freed device communicator (or peers that have stopped).
unsafe impl Keep for &LsaKernels<'_> {
    fn visit<'k>(&'k mut self, v: &mut Visitor<'k>) {
        let kernels: &'k LsaKernels<'_> = self;
        kernels.visit_members(v);
    }
}

/// 4 KiB multiples, so that every area starts aligned.
fn round_area(bytes: usize) -> usize {
    bytes.div_ceil(AREA_ALIGN) * AREA_ALIGN
}

/// Whether `comm` suits the kernels: the device API is there and every rank reaches every other
/// by loads and stores (a host query, no communication).
pub(crate) fn check_team(comm: &Comm) -> Result<(), Fallback> {
    let loaded = nccl::version().map_err(|_| Fallback::SetupFailed)?;
    device_api(nccl::header_version(), loaded)?;
    let lsa = comm.team_lsa().map_err(|_| Fallback::SetupFailed)?;
    team(lsa.size, comm.size())
}

/// Whether kernels compiled against `header` can run with the `loaded` library: the device API
/// exists from 2.28.3, and the headers' device structures must be the library's
/// ([`nccl::device::check_layouts`]: 2.28.7 and 2.29.2 changed them, and from 2.29.2 the library
/// must not be older than the headers).
fn device_api(header: Version, loaded: Version) -> Result<(), Fallback> {
    if loaded < Version::new(2, 28, 3) {
        return Err(Fallback::NoDeviceApi { loaded });
    }
    nccl::device::check_layouts(header, loaded).map_err(|_| Fallback::HeaderMismatch { header, loaded })
}

/// Whether a communicator of `ranks` ranks whose LSA team has `lsa` ranks suits the kernels.
fn team(lsa: usize, ranks: usize) -> Result<(), Fallback> {
    if lsa != ranks {
        Err(Fallback::NotOneLsaTeam { lsa, ranks })
    } else if ranks > MAX_PEERS {
        Err(Fallback::TooManyRanks { ranks })
    } else {
        Ok(())
    }
}

/// Fails unless every rank passed the same `values` (a MIN and a MAX all-reduce on the
/// communicator's stream), named `what` in the error: the kernels write into the peers' windows
/// at offsets each rank computes from its own sizes, and meet the peers' CTAs at barriers.
pub(crate) fn agree(comm: &Comm, what: &'static str, mine: &[u64]) -> Result<()> {
    let (smallest, largest) = (min_max(comm, mine, ReduceOp::MIN)?, min_max(comm, mine, ReduceOp::MAX)?);
    if smallest != mine || largest != mine {
        return Err(Error::Mismatch { what, mine: mine.to_vec(), smallest, largest });
    }
    Ok(())
}

/// `values` reduced over the ranks with `op` (on the communicator's stream, waited for).
pub(crate) fn min_max(comm: &Comm, values: &[u64], op: ReduceOp) -> Result<Vec<u64>> {
    let stream = comm.stream();
    let mut buf = stream.clone_htod(values)?;
    comm.all_reduce_in_place(&mut buf, op)?;
    Ok(stream.clone_dtoh(&buf)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_types_map_to_suffixes() {
        assert_eq!(suffix(<f32 as NcclType>::DATA_TYPE), Some("f32"));
        assert_eq!(suffix(<half::bf16 as NcclType>::DATA_TYPE), Some("bf16"));
        assert_eq!(suffix(<half::f16 as NcclType>::DATA_TYPE), Some("f16"));
        assert_eq!(suffix(<f64 as NcclType>::DATA_TYPE), None);
        assert_eq!(suffix(<i32 as NcclType>::DATA_TYPE), None);
        assert_eq!(type_name::<half::f16>(), "f16");
        assert_eq!(type_name::<f64>(), "f64");
    }

    #[test]
    fn launches_have_one_cta_per_share_up_to_the_barriers() {
        let ctas = |bytes, per| CtaBytes::config(bytes, per).grid_dim.0;
        assert_eq!(
            [ctas(8, 2048), ctas(2048, 2048), ctas(2049, 2048), ctas(64 << 10, 2048), ctas(1 << 30, 2048)],
            [1, 1, 2, 32, 32]
        );
        assert_eq!(ctas(100, 0), 32, "a zero share is clamped to one byte per CTA");
        assert_eq!(CtaBytes::config(8, 2048).block_dim, (512, 1, 1));
    }

    #[test]
    fn areas_are_rounded_to_whole_pages() {
        assert_eq!([round_area(0), round_area(1), round_area(4096), round_area(4097)], [0, 4096, 4096, 8192]);
    }

    #[test]
    fn staging_sizes_beyond_max_area_are_refused() {
        // Before: the window's size wrapped around (release builds), so a window of 2 MiB was
        // made for sizes of 2^62 bytes, and the kernels staged past its end.
        let huge = Sizes { one_shot: 1 << 62, staged: 1 << 62 };
        assert!(matches!(huge.rounded(), Err(Error::AreaTooLarge { what: "one-shot", .. })));
        let huge = Sizes { one_shot: 0, staged: usize::MAX };
        let e = huge.rounded().unwrap_err();
        assert!(matches!(e, Error::AreaTooLarge { what: "staged", max: MAX_AREA, .. }), "{e}");
        // The largest sizes lay out without overflow.
        let max = Sizes { one_shot: MAX_AREA, staged: MAX_AREA }.rounded().unwrap();
        let expected = CTRL_BYTES as u128 + 4 * MAX_AREA as u128 + LL_BYTES as u128;
        assert_eq!(max.window_bytes() as u128, expected);
        assert_eq!(Sizes { one_shot: 1, staged: 4097 }.rounded().unwrap(), Sizes { one_shot: 4096, staged: 8192 });
    }

    #[test]
    fn the_device_api_must_match_the_headers() {
        let v = Version::new;
        assert_eq!(device_api(v(2, 28, 9), v(2, 28, 9)), Ok(()));
        assert_eq!(device_api(v(2, 28, 9), v(2, 28, 7)), Ok(()));
        assert_eq!(device_api(v(2, 28, 3), v(2, 28, 6)), Ok(()));
        assert_eq!(
            device_api(v(2, 28, 9), v(2, 28, 3)),
            Err(Fallback::HeaderMismatch { header: v(2, 28, 9), loaded: v(2, 28, 3) }),
            "2.28.7 inserted barrierCount"
        );
        assert_eq!(device_api(v(2, 28, 9), v(2, 27, 7)), Err(Fallback::NoDeviceApi { loaded: v(2, 27, 7) }));
        assert_eq!(
            device_api(v(2, 28, 9), v(2, 29, 2)),
            Err(Fallback::HeaderMismatch { header: v(2, 28, 9), loaded: v(2, 29, 2) })
        );
        assert_eq!(device_api(v(2, 29, 2), v(2, 29, 7)), Ok(()));
        assert_eq!(device_api(v(2, 29, 7), v(2, 32, 3)), Ok(()));
        assert_eq!(
            device_api(v(2, 30, 3), v(2, 29, 7)),
            Err(Fallback::HeaderMismatch { header: v(2, 30, 3), loaded: v(2, 29, 7) })
        );
    }

    #[test]
    fn the_lsa_team_must_be_the_whole_communicator() {
        assert_eq!(team(2, 2), Ok(()));
        assert_eq!(team(1, 1), Ok(()));
        assert_eq!(team(1, 2), Err(Fallback::NotOneLsaTeam { lsa: 1, ranks: 2 }));
        assert_eq!(team(16, 16), Err(Fallback::TooManyRanks { ranks: 16 }));
    }
}
