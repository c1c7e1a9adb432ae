//! The crate's error type, and NVSHMEM status codes as a newtype. (How a status becomes an
//! error is the call machinery's: [`crate::ffi`].)

use std::path::PathBuf;

/// An NVSHMEM status (`nvshmemx_status`), kept as the raw number so that codes a newer library
/// returns still fit.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[doc(alias = "nvshmemx_status")]
pub struct Status(pub i32);

impl Status {
    /// `NVSHMEMX_SUCCESS`.
    pub const SUCCESS: Self = Self(0);
}

/// For a newtype over a C code whose values index a table of C names: `name()`, and `Debug` /
/// `Display` as `NAME(value)` (or `Type(value)` for values the table does not know).
macro_rules! named_code {
    ($ty:ident, [$($name:literal),* $(,)?]) => {
        impl $ty {
            /// The C name, or `None` for a value this crate does not know.
            pub fn name(self) -> Option<&'static str> {
                const NAMES: &[&str] = &[$($name),*];
                usize::try_from(self.0).ok().and_then(|i| NAMES.get(i)).copied()
            }
        }

        impl ::std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                match self.name() {
                    Some(n) => write!(f, "{n}({})", self.0),
                    None => write!(f, concat!(stringify!($ty), "({})"), self.0),
                }
            }
        }

        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                ::std::fmt::Debug::fmt(self, f)
            }
        }
    };
}

pub(crate) use named_code;

named_code!(
    Status,
    [
        "NVSHMEMX_SUCCESS",
        "NVSHMEMX_ERROR_INVALID_VALUE",
        "NVSHMEMX_ERROR_OUT_OF_MEMORY",
        "NVSHMEMX_ERROR_NOT_SUPPORTED",
        "NVSHMEMX_ERROR_SYMMETRY",
        "NVSHMEMX_ERROR_GPU_NOT_SELECTED",
        "NVSHMEMX_ERROR_COLLECTIVE_LAUNCH_FAILED",
        "NVSHMEMX_ERROR_INTERNAL",
    ]
);

/// Everything that can go wrong in this crate. Arguments are checked before NVSHMEM is called, so
/// every variant but [`Error::Status`], [`Error::Cuda`] and the loading errors means NVSHMEM was
/// not reached and the process can carry on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An NVSHMEM call returned a failure status. NVSHMEM has no error-string API; set
    /// `NVSHMEM_DEBUG=WARN` (or `INFO`) for its own explanation on stderr.
    #[error("{call} failed with {status} (set NVSHMEM_DEBUG=WARN for NVSHMEM's explanation)")]
    Status {
        /// The C function.
        call: &'static str,
        /// The status it returned.
        status: Status,
    },
    /// The NVSHMEM library could not be loaded (the message lists every place tried).
    #[error(transparent)]
    Load(Box<nvshmem_sys::LoadError>),
    /// The loaded NVSHMEM lacks a function (the message names the version that added it).
    #[error(transparent)]
    MissingFunction(Box<nvshmem_sys::MissingFunction>),
    /// A CUDA driver call failed.
    #[error(transparent)]
    Cuda(#[from] cudarc::driver::DriverError),
    /// A buffer's uses could not be ordered, an operation was made on a stream captured by
    /// something other than [`crate::capture`], or a capture or graph launch was refused (see
    /// [`gpucomm_ordering::OrderError`]). CUDA failures while ordering are [`Error::Cuda`].
    #[error(transparent)]
    Ordering(gpucomm_ordering::OrderError),
    /// NVSHMEM is already running in this process: there is one [`crate::Runtime`] per process.
    #[error("NVSHMEM is already initialised in this process (one Runtime per process)")]
    AlreadyInitialized,
    /// NVSHMEM was finalised, or failed to start, in this process. It keeps process-global state
    /// that finalisation does not reset (NVIDIA/nvshmem#68), so it cannot start again.
    #[error("NVSHMEM was finalised (or failed to start) in this process and cannot be initialised again")]
    Finalized,
    /// A PE count outside `1..=i32::MAX`.
    #[error("the number of PEs must be between 1 and {}, got {got}", i32::MAX)]
    InvalidPeCount {
        /// The count given.
        got: usize,
    },
    /// NVSHMEM started with another PE number or count than the caller asked for.
    #[error("NVSHMEM started as PE {got_pe} of {got_n_pes}, but PE {pe} of {n_pes} was requested (another job's unique id?)")]
    PeMismatch {
        /// The PE requested.
        pe: usize,
        /// The PE count requested.
        n_pes: usize,
        /// `nvshmem_my_pe` after initialisation.
        got_pe: usize,
        /// `nvshmem_n_pes` after initialisation.
        got_n_pes: usize,
    },
    /// `NVSHMEM_BOOTSTRAP` names another bootstrap than the one requested.
    #[error("NVSHMEM_BOOTSTRAP={value} selects another bootstrap than {requested}: unset it, or start with Bootstrap::Environment")]
    BootstrapConflict {
        /// The bootstrap requested.
        requested: &'static str,
        /// The variable's value.
        value: String,
    },
    /// NVSHMEM's bootstrap plugin for the requested launcher cannot be loaded (checked before
    /// initialisation, so the reason is the dynamic loader's own).
    #[error("NVSHMEM's bootstrap plugin {} cannot be loaded: {reason}", plugin.display())]
    BootstrapPlugin {
        /// The plugin file.
        plugin: PathBuf,
        /// `dlerror()`.
        reason: String,
    },
    /// Unique-id bytes of the wrong length.
    #[error("an NVSHMEM unique id has {expected} bytes, got {got}")]
    UniqueIdLength {
        /// [`crate::UniqueId::BYTES`].
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// Unique-id bytes from another NVSHMEM release.
    #[error("unique id version word {got:#x} does not match this build's {expected:#x} (different NVSHMEM release?)")]
    UniqueIdVersion {
        /// This build's version word.
        expected: i32,
        /// The received version word.
        got: i32,
    },
    /// A symmetric allocation of zero bytes (NVSHMEM would return no buffer).
    #[error("symmetric allocations need at least one byte, got {len} elements of {elem_size} bytes")]
    ZeroSize {
        /// Elements requested.
        len: usize,
        /// Bytes per element.
        elem_size: usize,
    },
    /// A byte count that does not fit in `usize`.
    #[error("{len} elements of {elem_size} bytes overflow the address space")]
    SizeOverflow {
        /// Elements requested.
        len: usize,
        /// Bytes per element.
        elem_size: usize,
    },
    /// An alignment that is not a power of two, or smaller than the element's.
    #[error("alignment {align} is not a power of two of at least {min} bytes")]
    InvalidAlignment {
        /// The alignment given.
        align: usize,
        /// The element type's alignment.
        min: usize,
    },
    /// An aligned allocation whose size plus alignment (what `nvshmem_align` may need of the heap)
    /// does not fit in `usize`.
    #[error("{bytes} bytes aligned to {align} bytes overflow the address space (the heap may need size + alignment)")]
    AlignedSizeOverflow {
        /// Bytes requested.
        bytes: usize,
        /// The alignment given.
        align: usize,
    },
    /// The allocation cannot fit the symmetric heap's limit (see [`crate::HeapLimit`]), so NVSHMEM
    /// (which tears its dynamic heap down on such a request) was not asked.
    #[error(
        "{bytes} more bytes do not fit the symmetric heap: {in_use} bytes in use and {reserved} reserved for NVSHMEM's own buffers, limit {limit} bytes ({limit_from})"
    )]
    HeapExhausted {
        /// What the request takes of the limit: its size (plus its alignment for an aligned
        /// allocation, which `nvshmem_align` may need), rounded up to NVSHMEM's 512-byte chunks
        /// and to the heap's granularity ([`crate::HeapLimit::granularity`]).
        bytes: usize,
        /// Bytes of the heap that this process's live symmetric buffers hold: each one's size
        /// plus its alignment (for an aligned one), rounded up to NVSHMEM's 512-byte chunks.
        in_use: usize,
        /// Bytes of the limit held back for NVSHMEM's own symmetric buffers
        /// ([`crate::HeapLimit::reserved`]).
        reserved: usize,
        /// The limit.
        limit: usize,
        /// Where the limit comes from (the variable, or the device's memory).
        limit_from: &'static str,
    },
    /// On the dynamic heap, the allocation takes this process's symmetric buffers past the most
    /// they have held at once, so that NVSHMEM maps more of the GPU's memory for it, and the GPU
    /// has less free than that (memory other allocators hold, which the heap's limit cannot see):
    /// NVSHMEM (3.4.5) would tear the whole heap down and exit the process. NVSHMEM was not asked.
    #[error(
        "{bytes} more bytes would make the symmetric heap grow, but the GPU has only {free} bytes free (other allocators hold the rest), and NVSHMEM would tear the heap down and exit the process: free device memory first, or start NVSHMEM with a static heap (NVSHMEM_DISABLE_CUDA_VMM=1, sized by NVSHMEM_SYMMETRIC_SIZE)"
    )]
    DeviceMemoryShort {
        /// What the heap would grow by: the request's size (plus its alignment for an aligned
        /// allocation), rounded up to the heap's granularity ([`crate::HeapLimit::granularity`]).
        bytes: usize,
        /// The GPU's free memory when it was asked (`cuMemGetInfo`).
        free: usize,
    },
    /// NVSHMEM returned no buffer (heap exhausted or fragmented).
    #[error("the symmetric heap could not provide {bytes} bytes")]
    OutOfMemory {
        /// Bytes requested.
        bytes: usize,
    },
    /// A PE outside `0..n_pes` (of the world or of a team).
    #[error("{what} {pe} is out of range for {n_pes} PEs")]
    InvalidPe {
        /// Which PE argument.
        what: &'static str,
        /// The PE given.
        pe: usize,
        /// Number of PEs.
        n_pes: usize,
    },
    /// A sub-range that does not lie inside its buffer.
    #[error("range {start}..{end} is out of bounds for a buffer of {len} elements")]
    OutOfBounds {
        /// First element.
        start: usize,
        /// One past the last element.
        end: usize,
        /// Elements in the buffer.
        len: usize,
    },
    /// A buffer of the wrong length for the call.
    #[error("{what} has {got} elements but the call needs {expected}")]
    LengthMismatch {
        /// Which buffer.
        what: &'static str,
        /// Elements the call needs.
        expected: usize,
        /// Elements the buffer has.
        got: usize,
    },
    /// A buffer that does not split into one equal block per PE.
    #[error("{what} has {len} elements, which do not split into {parts} equal blocks")]
    NotDivisible {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The number of blocks (PEs in the team).
        parts: usize,
    },
    /// A buffer or stream on another device than the PE's.
    #[error("{what} is on CUDA device {got} but this PE uses device {expected}")]
    WrongDevice {
        /// Which argument.
        what: &'static str,
        /// The PE's device.
        expected: usize,
        /// The argument's device.
        got: usize,
    },
    /// A buffer or stream of another CUDA context of the PE's device (a context made with
    /// cudarc's `CudaContext::new_non_primary`): each context has its own address space, so
    /// NVSHMEM, which runs in the PE's context, cannot use its memory.
    #[error("{what} belongs to another CUDA context of device {device} than this PE's: its memory is not mapped in the PE's context")]
    WrongContext {
        /// Which argument.
        what: &'static str,
        /// The device both contexts belong to.
        device: usize,
    },
    /// A strided team split whose PEs do not all lie in the parent team.
    #[error("team split <start {start}, stride {stride}, size {size}> does not fit a parent team of {n_pes} PEs")]
    InvalidSplit {
        /// First PE (in the parent).
        start: usize,
        /// Distance between PEs.
        stride: usize,
        /// Number of PEs.
        size: usize,
        /// Size of the parent team.
        n_pes: usize,
    },
    /// The members of the parent team made different team splits at the same step: other
    /// arguments, or another kind of split. NVSHMEM computes each member's new team from that
    /// member's own arguments, so it would wait for ever or give members teams that share
    /// NVSHMEM's per-team state. The members compare their splits first: no team was created, on
    /// any member. (Splits made in different orders on different members break the collective
    /// order itself: members may wait for each other instead, see [`crate::Team`].)
    #[error("the members of the parent team made different team splits (member {pe}'s differs from member 0's); no team was created on any member")]
    #[doc(alias = "nvshmem_team_split_strided")]
    #[doc(alias = "nvshmem_team_split_2d")]
    AsymmetricSplit {
        /// The lowest member (numbered in the parent team) whose split differs from member 0's.
        pe: usize,
    },
    /// NVSHMEM could not make a member's row or column of a 2-D split ([`crate::Team::split_2d`]),
    /// most often because `NVSHMEM_MAX_TEAMS` teams exist; it reports success all the same. The
    /// members compare what they got: every member gets this error, and the teams that were made
    /// are destroyed.
    #[error("NVSHMEM made no {missing} team for member {pe} in the 2-D split (NVSHMEM_MAX_TEAMS reached? set NVSHMEM_DEBUG=WARN for NVSHMEM's explanation); no member kept a team of it")]
    #[doc(alias = "nvshmem_team_split_2d")]
    SplitIncomplete {
        /// The lowest member (numbered in the parent team) left without a team.
        pe: usize,
        /// `"row"` or `"column"`: the team NVSHMEM did not make for it.
        missing: &'static str,
    },
    /// A 2-D team split with an x range of zero.
    #[error("a 2-D team split needs an x range of at least 1")]
    ZeroXRange,
    /// A module image that was not device-linked with NVSHMEM's device library.
    #[error("the module is not device-linked with NVSHMEM's device library (no nvshmemi_device_lib_version_d): compile with `nvcc -rdc=true` and link with `nvcc -dlink … libnvshmem_device.a`")]
    NotNvshmemModule,
    /// A module whose global that NVSHMEM reads or writes when it registers the module
    /// (`nvshmemi_device_lib_version_d`, `nvshmemi_device_state_d`) does not have the size of the
    /// loaded NVSHMEM's type: NVSHMEM would copy past it or past its own copy.
    #[error("the module's {global} is {size} bytes, but this NVSHMEM's is {expected}: device-link the module with the libnvshmem_device.a of the NVSHMEM that runs it")]
    ModuleGlobalSize {
        /// The global.
        global: &'static str,
        /// Its size in the module, in bytes.
        size: usize,
        /// Its size in the NVSHMEM headers this crate was built with, in bytes.
        expected: usize,
    },
    /// The module was device-linked with an NVSHMEM device library that the loaded host library
    /// refuses: of another major version, or a newer minor one (`nvshmemx_cumodule_init` would
    /// fail). Nothing was registered; the module was unloaded.
    #[error("the module was device-linked with NVSHMEM {} but the loaded library is {library}, which takes modules of its own major version and of its minor version or older: device-link the module with the libnvshmem_device.a of the NVSHMEM that runs it", device.map_or_else(|| "of an unreadable version".to_string(), |v| v.to_string()))]
    #[doc(alias = "nvshmemi_device_lib_version_d")]
    ModuleVersion {
        /// The device library's version, as the module records it (`None`: unreadable).
        device: Option<nvshmem_sys::Version>,
        /// The loaded host library's version.
        library: nvshmem_sys::Version,
    },
    /// A module image that is not a complete cubin, fat binary or PTX text (truncated, corrupt,
    /// or something else), refused before the driver saw it: `cuModuleLoadData` takes no length,
    /// and would read past the end of such an image.
    #[error(transparent)]
    #[doc(alias = "cuModuleLoadData")]
    ModuleImage(#[from] gpucomm_ordering::ImageError),
    /// A module built for a GPU architecture the device cannot run.
    #[error("the module holds code for {} but device {device} is sm_{arch}", module.map(|m| format!("sm_{m}")).unwrap_or_else(|| "other architectures".into()))]
    WrongArchitecture {
        /// The module's architecture (`90` for sm_90), when the image says.
        module: Option<u32>,
        /// The device ordinal.
        device: usize,
        /// The device's compute capability as `major * 10 + minor`.
        arch: u32,
    },
    /// A kernel name that is not in the module (or that contains a NUL byte).
    #[error("the module has no kernel named `{name}`")]
    KernelNotFound {
        /// The name looked up.
        name: String,
    },
    /// A collective launch whose blocks cannot all be resident on the device at once, which a
    /// kernel that synchronises across blocks or PEs needs.
    #[error("a collective launch of {blocks} blocks cannot be co-resident: at most {per_sm} per SM × {sms} SMs for {threads} threads and {shared_mem} bytes of shared memory per block")]
    GridTooLarge {
        /// Blocks in the grid.
        blocks: u64,
        /// Blocks of this shape one SM holds at once.
        per_sm: u32,
        /// SMs on the device.
        sms: u32,
        /// Threads per block.
        threads: u32,
        /// Dynamic shared memory per block.
        shared_mem: u32,
    },
    /// A device that cannot launch cooperative kernels.
    #[error("device {device} does not support cooperative launches")]
    CooperativeUnsupported {
        /// The device ordinal.
        device: usize,
    },
    /// A kernel argument aligned to more than 8 bytes.
    #[error("kernel arguments may be aligned to at most 8 bytes, got a {size}-byte value aligned to {align}")]
    KernelArgument {
        /// The value's size.
        size: usize,
        /// Its alignment.
        align: usize,
    },
    /// Exchanging the unique id with the other PEs failed.
    #[error(transparent)]
    Rendezvous(Box<crate::launch::RendezvousError>),
    /// Two ranges of one call overlap where NVSHMEM requires them apart (or, for reductions, apart
    /// or identical): the result would be undefined.
    #[error("the {first} and the {second} overlap, which NVSHMEM leaves undefined: they must be {needed}")]
    Overlap {
        /// The first range.
        first: &'static str,
        /// The second range.
        second: &'static str,
        /// What NVSHMEM requires: `"disjoint"`, or `"disjoint or identical"`.
        needed: &'static str,
    },
    /// The local buffer of a put or get (a put's source, a get's destination) whose target PE this
    /// PE reaches over a network transport, not by loads and stores: NVSHMEM can use it there only
    /// when it lies on the symmetric heap or inside one [`crate::Registration`], and crashes or
    /// copies garbage otherwise. Nothing was called.
    #[error("the {what} is neither on the symmetric heap nor inside one registered buffer, which NVSHMEM needs to reach PE {pe} over its network transport: allocate it with Runtime::alloc or register it with Runtime::register (nothing was called)")]
    #[doc(alias = "nvshmemx_buffer_register")]
    LocalNotRegistered {
        /// Which buffer.
        what: &'static str,
        /// The target PE.
        pe: usize,
    },
    /// The PEs asked for different symmetric allocations in the same collective call: allocating
    /// would leave the symmetric heaps out of step (later buffers at different offsets on
    /// different PEs). Nothing was allocated, on any PE.
    #[error("the PEs asked for different symmetric allocations ({min_bytes}…{max_bytes} bytes, alignment {min_align}…{max_align}); nothing was allocated on any PE")]
    AsymmetricAlloc {
        /// The smallest size any PE asked for, in bytes.
        min_bytes: u64,
        /// The largest.
        max_bytes: u64,
        /// The smallest alignment any PE asked for (0: the default).
        min_align: u64,
        /// The largest.
        max_align: u64,
    },
    /// Another PE refused its part of this collective allocation (its own error says why), so no
    /// PE allocated.
    #[error("another PE refused this symmetric allocation (see its error); nothing was allocated on any PE")]
    PeerRefusedAlloc,
    /// The PEs freed different symmetric buffers (other offsets on the heap, or other sizes) in the
    /// same collective [`crate::Symmetric::free`]: freeing would leave holes at different offsets,
    /// which the next allocation fills, so that later buffers sit at different offsets on
    /// different PEs. Nothing was freed, on any PE: every PE got its buffer back.
    #[error("the PEs freed different symmetric buffers (offsets {min_offset:#x}…{max_offset:#x} from the heap's first buffer, {min_bytes}…{max_bytes} bytes); nothing was freed on any PE")]
    #[doc(alias = "nvshmem_free")]
    AsymmetricFree {
        /// The smallest offset any PE's buffer has from the runtime's first symmetric buffer.
        min_offset: u64,
        /// The largest.
        max_offset: u64,
        /// The smallest size any PE's buffer has, in bytes.
        min_bytes: u64,
        /// The largest.
        max_bytes: u64,
    },
    /// Another PE could not take its part in this collective [`crate::Symmetric::free`] (waiting
    /// for its buffer's streams failed; its own error says why), so no PE freed: every PE got its
    /// buffer back, and every PE must free it again.
    #[error(
        "another PE could not free its copy of this symmetric buffer (see its error); nothing was freed on any PE"
    )]
    PeerRefusedFree,
    /// Some PEs allocated while others freed, or some allocated zeroed
    /// ([`Runtime::alloc_zeroed`](crate::Runtime::alloc_zeroed)) while others did not, in the same
    /// collective step (a buffer dropped or freed on some PEs only, allocations made in different
    /// orders). Nothing was allocated or freed, on any PE.
    #[error(
        "the PEs made different symmetric-heap collectives at the same step (some allocated, some allocated zeroed, some freed); nothing was allocated or freed on any PE"
    )]
    MixedHeapCollectives,
    /// The PEs' collective allocations and frees are out of step: the check before an allocation
    /// or a free read another PE's words of a later check (numbers `min_check..=max_check`), which
    /// the check's protocol rules out while every PE follows it (kept as a check on it). Nothing
    /// was allocated or freed on this PE, and every later allocation and free of this PE is
    /// refused the same way: the heaps can no longer be trusted to be symmetric.
    #[error("the PEs' symmetric allocations and frees are out of step (this check read words of checks {min_check} to {max_check}): a PE allocated or freed without the others; nothing was allocated or freed on this PE")]
    HeapCollectivesOutOfStep {
        /// The lowest check number read.
        min_check: u64,
        /// The highest check number read.
        max_check: u64,
    },
    /// An earlier check before a collective allocation or free (number `check`) failed on this PE
    /// after it had sent its words (a CUDA error): the other PEs may have gone on to allocate or
    /// free, or wait for this PE inside that check, and this PE cannot tell which. Nothing was
    /// allocated or freed on this PE, and every later allocation and free of this PE is refused
    /// the same way.
    #[error("an earlier symmetric-heap check (number {check}) failed on this PE after it had sent its words; the PEs can no longer be trusted to allocate and free in step, so nothing more is allocated or freed on this PE")]
    HeapCheckFailed {
        /// The number of the check that failed.
        check: u64,
    },
    /// An earlier comparison of team-split arguments failed on this PE after it had sent its
    /// words (a CUDA error), or read a member's words of a later comparison (which its protocol
    /// rules out): the members may wait for this PE, or have split without it. No team was split
    /// on this PE, and every later split of this PE is refused the same way.
    #[error("an earlier comparison of team splits failed on this PE after it had sent its words; the members can no longer be trusted to split in step, so no team is split on this PE any more")]
    TeamCheckFailed,
    /// A [`crate::UniqueId`] was created in this process before NVSHMEM was started with another
    /// bootstrap. Creating the id loads NVSHMEM's unique-id plugin and NVSHMEM keeps it: it would
    /// then start `requested` through that plugin, which dereferences the missing unique-id
    /// arguments (NVSHMEM 3.4.5 `bootstrap_loader.cpp`, `bootstrap_uid.cpp`).
    #[error("a UniqueId was created in this process, which leaves NVSHMEM's bootstrap bound to its unique-id plugin; starting with {requested} would go through that plugin: start with Bootstrap::UniqueId, or create no UniqueId in a process that uses {requested}")]
    BootstrapAfterUniqueId {
        /// The bootstrap requested.
        requested: &'static str,
    },
    /// [`crate::UniqueId::new`] while NVSHMEM runs in this process: `nvshmemx_get_uniqueid` runs
    /// the unique-id bootstrap's set-up again, which rewrites, without a lock, the plugin's
    /// options and debug flag that the running bootstrap reads (NVSHMEM 3.4.5 `bootstrap_uid.cpp`,
    /// `nvshmemi_bootstrap_plugin_pre_init`), and it may run on any thread, while the runtime's
    /// thread is inside NVSHMEM, which runs `NVSHMEM_THREAD_SERIALIZED`. Nothing was called: make
    /// ids before starting NVSHMEM (a process starts it once).
    #[error("a UniqueId cannot be made while NVSHMEM runs in this process: NVSHMEM would redo its bootstrap's set-up under the running bootstrap (nothing was called)")]
    #[doc(alias = "nvshmemx_get_uniqueid")]
    UniqueIdWhileRunning,
    /// `NVSHMEM_BOOTSTRAP=UID` with [`crate::Bootstrap::Environment`], which cannot pass the
    /// unique id that bootstrap needs (NVSHMEM would dereference the missing arguments).
    #[error("NVSHMEM_BOOTSTRAP={value} selects the unique-id bootstrap, which needs an id that Bootstrap::Environment cannot pass: start with Bootstrap::UniqueId")]
    UniqueIdNeeded {
        /// The variable's value.
        value: String,
    },
    /// A variable that names the plugin of another bootstrap names NVSHMEM's unique-id plugin,
    /// which NVSHMEM would load without the unique id it needs (and dereference the missing
    /// arguments).
    #[error("{variable}={value} names NVSHMEM's unique-id bootstrap plugin for another bootstrap, which cannot pass it an id: unset it, or start with Bootstrap::UniqueId")]
    UniqueIdPluginElsewhere {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// Teardown that must wait for queued GPU work gave up after the runtime's timeout
    /// ([`crate::Runtime::set_timeout`]): the work is still running, so what it uses was kept.
    /// Also [`crate::Runtime::load_module`]'s wait for the device, which NVSHMEM's module init
    /// synchronises: nothing was loaded.
    #[error("{what} is still in use by queued GPU work after {after:?}; it was kept, not released")]
    StillInUse {
        /// What was being released.
        what: &'static str,
        /// The timeout that expired.
        after: std::time::Duration,
    },
    /// A capture holds NVSHMEM's internal copy streams: a non-blocking (`_nbi`) operation was
    /// captured on `stream`, which joined them to that capture until it ends. Until then NVSHMEM
    /// cannot use them for anything else without breaking the capture or losing track of its
    /// copies, so every other non-blocking operation, quiet or barrier (on another stream), host
    /// barrier, allocation, free, team split and team destroy is refused; nothing was called.
    #[error("a capture on stream {stream:#x} holds NVSHMEM's copy streams until it ends (a non-blocking operation was captured there): no other non-blocking operation, quiet, barrier, allocation, free or team split or destroy can run until the capture ends")]
    CopyStreamsCaptured {
        /// The captured stream (its driver handle).
        stream: usize,
    },
    /// `what`, a host call that waits on the host for NVSHMEM's streams (an allocation, a free,
    /// the host barrier, a team split or destroy), was made while this thread captures
    /// ([`crate::capture`]): CUDA refuses host waits inside a capture, and NVSHMEM exits the
    /// process on that refusal. Nothing was called. For a collective call the refusal is this
    /// PE's alone: the other PEs wait inside the same call until this one makes it after its
    /// capture.
    #[error("{what} waits on the host, which CUDA refuses while this thread captures a graph: make it before or after the capture (nothing was called)")]
    HostCallInCapture {
        /// The refused call.
        what: &'static str,
    },
    /// An in-place reduction that NVSHMEM's segmented algorithm would get wrong
    /// ([`Team::reduce_in_place_on_stream`](crate::Team::reduce_in_place_on_stream)), with an
    /// `NVSHMEM_REDUCE_SCRATCH_SIZE` too small to reduce one element per peer in a round.
    #[error("an in-place sum, product or xor over {n_pes} PEs of {elem_size}-byte elements needs NVSHMEM_REDUCE_SCRATCH_SIZE of at least {needed} bytes, or two buffers (nothing was called)")]
    ReduceScratchTooSmall {
        /// PEs in the team.
        n_pes: usize,
        /// Bytes per element.
        elem_size: usize,
        /// The smallest scratch size that works.
        needed: usize,
    },
    /// `call` is one that NVSHMEM does not support when several PEs share one GPU without MPS (a
    /// limited-MPG run, [`crate::InitStatus::LIMITED_MPG`]) and exits the process in
    /// (`NVSHMEM_API_NOT_SUPPORTED_WITH_LIMITED_MPG_RUNS`): a team collective or barrier on a
    /// stream, a team split, a wait on a signal on a stream. Nothing was called.
    #[error("{call} is not supported by NVSHMEM while several PEs share one GPU without MPS (a limited-MPG run), where it exits the process: run one PE per GPU, or the PEs that share a GPU under MPS (nothing was called)")]
    NotSupportedWithLimitedMpg {
        /// The refused NVSHMEM function.
        call: &'static str,
    },
}

build_support::family_error_conversions!(Error);

/// Shorthand for this crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn statuses_have_names() {
        assert_eq!(Status(7).to_string(), "NVSHMEMX_ERROR_INTERNAL(7)");
        assert_eq!(Status(-3).to_string(), "Status(-3)");
    }

    #[test]
    fn a_cuda_error_appears_once_in_the_chain() {
        // (Formatting a DriverError asks the driver for its text, which needs libcuda: compare the
        // structure instead.) `Cuda` is transparent, so the driver's text is the message itself
        // and nothing below it repeats it; the ordering crate's wrapper is unwrapped.
        let cuda = cudarc::driver::DriverError(cudarc::driver::sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE);
        assert!(Error::from(cuda).source().is_none());
        let ordered = Error::from(gpucomm_ordering::OrderError::Cuda(cuda));
        assert!(matches!(ordered, Error::Cuda(e) if e == cuda));
        let open = Error::from(gpucomm_ordering::OrderError::CaptureOpen);
        assert!(matches!(open, Error::Ordering(gpucomm_ordering::OrderError::CaptureOpen)), "{open}");
    }

    #[test]
    fn messages_name_the_facts() {
        let e = Error::HeapExhausted {
            bytes: 8,
            in_use: 1 << 30,
            reserved: 0,
            limit: 1 << 30,
            limit_from: "NVSHMEM_SYMMETRIC_SIZE",
        };
        assert_eq!(
            e.to_string(),
            "8 more bytes do not fit the symmetric heap: 1073741824 bytes in use and 0 reserved for NVSHMEM's own buffers, limit 1073741824 bytes (NVSHMEM_SYMMETRIC_SIZE)"
        );
        let e = Error::DeviceMemoryShort { bytes: 1 << 29, free: 1 << 28 };
        assert!(e.to_string().starts_with(
            "536870912 more bytes would make the symmetric heap grow, but the GPU has only 268435456 bytes free"
        ));
        assert!(e.to_string().ends_with("(NVSHMEM_DISABLE_CUDA_VMM=1, sized by NVSHMEM_SYMMETRIC_SIZE)"));
        let e = Error::WrongArchitecture { module: Some(80), device: 1, arch: 90 };
        assert_eq!(e.to_string(), "the module holds code for sm_80 but device 1 is sm_90");
        assert_eq!(
            Error::InvalidPeCount { got: 0 }.to_string(),
            "the number of PEs must be between 1 and 2147483647, got 0"
        );
        let e = Error::NotSupportedWithLimitedMpg { call: "nvshmemx_barrier_on_stream" };
        assert_eq!(
            e.to_string(),
            "nvshmemx_barrier_on_stream is not supported by NVSHMEM while several PEs share one GPU without MPS (a limited-MPG run), where it exits the process: run one PE per GPU, or the PEs that share a GPU under MPS (nothing was called)"
        );
        let e = Error::HostCallInCapture { what: "starting NVSHMEM (nvshmemx_hostlib_init_attr)" };
        assert!(e.to_string().starts_with("starting NVSHMEM (nvshmemx_hostlib_init_attr) waits on the host"), "{e}");
    }
}
