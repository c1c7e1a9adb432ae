//! The crate's error type, and NCCL result codes as a newtype. (How a result code becomes an
//! error, with NCCL's own strings, is the call machinery's: [`crate::ffi`].)

use std::fmt;
use std::time::Duration;

use nccl_sys::{ncclResult_t, Version};

/// An NCCL result code (`ncclResult_t`), kept as the raw number: a newer library can return codes
/// this crate's headers do not list (2.30 added `ncclTimeout`), and a Rust enum cannot hold them.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[doc(alias = "ncclResult_t")]
pub struct ResultCode(pub u32);

impl ResultCode {
    /// `ncclSuccess`.
    pub const SUCCESS: Self = Self(0);
    /// `ncclUnhandledCudaError`: a CUDA call inside NCCL failed.
    pub const UNHANDLED_CUDA_ERROR: Self = Self(1);
    /// `ncclSystemError`: a system call failed (socket, memory, …).
    pub const SYSTEM_ERROR: Self = Self(2);
    /// `ncclInternalError`: an NCCL bug or a corrupted state.
    pub const INTERNAL_ERROR: Self = Self(3);
    /// `ncclInvalidArgument`: the call had no effect; the communicator stays usable.
    pub const INVALID_ARGUMENT: Self = Self(4);
    /// `ncclInvalidUsage`: the API was used wrongly (e.g. mismatched calls across ranks).
    pub const INVALID_USAGE: Self = Self(5);
    /// `ncclRemoteError`: a peer failed or went away.
    pub const REMOTE_ERROR: Self = Self(6);
    /// `ncclInProgress`: a nonblocking operation has not finished.
    pub const IN_PROGRESS: Self = Self(7);
    /// `ncclTimeout` (NCCL ≥ 2.30.3).
    pub const TIMEOUT: Self = Self(8);

    /// The C name, or `None` for a code this crate does not know.
    pub fn name(self) -> Option<&'static str> {
        const NAMES: [&str; 9] = [
            "ncclSuccess",
            "ncclUnhandledCudaError",
            "ncclSystemError",
            "ncclInternalError",
            "ncclInvalidArgument",
            "ncclInvalidUsage",
            "ncclRemoteError",
            "ncclInProgress",
            "ncclTimeout",
        ];
        NAMES.get(self.0 as usize).copied()
    }

    /// True for codes after which the communicator must be aborted and re-created (NCCL user
    /// guide, "Communicators"): every failure except `InvalidArgument` and `InProgress`.
    pub fn is_fatal(self) -> bool {
        !matches!(self, Self::SUCCESS | Self::INVALID_ARGUMENT | Self::IN_PROGRESS)
    }
}

impl From<ncclResult_t> for ResultCode {
    fn from(rc: ncclResult_t) -> Self {
        Self(rc.0)
    }
}

impl fmt::Debug for ResultCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}({})", self.0),
            None => write!(f, "ResultCode({})", self.0),
        }
    }
}

impl fmt::Display for ResultCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An NCCL call returned an error code.
    #[error("{call} failed with {code}: {message}{}", detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Nccl {
        /// The C function.
        call: &'static str,
        /// Its result code.
        code: ResultCode,
        /// `ncclGetErrorString(code)`.
        message: String,
        /// `ncclGetLastError(comm)`, read right after the failure, when NCCL had something to say.
        detail: Option<String>,
    },
    /// The NCCL library could not be loaded (the message lists every place tried).
    #[error(transparent)]
    Load(Box<nccl_sys::LoadError>),
    /// The loaded NCCL lacks a function (the message names the version that added it).
    #[error(transparent)]
    MissingFunction(Box<nccl_sys::MissingFunction>),
    /// A CUDA driver call failed. Displayed as cudarc's own message, once: the error is
    /// transparent, so an error chain does not repeat it.
    #[error(transparent)]
    Cuda(#[from] cudarc::driver::DriverError),
    /// A buffer has the wrong number of elements for the call.
    #[error("{what} has {got} elements but the call needs {expected}")]
    LengthMismatch {
        /// Which buffer.
        what: &'static str,
        /// Elements the call needs.
        expected: usize,
        /// Elements the buffer has.
        got: usize,
    },
    /// A call's send and receive buffers share bytes in another way than NCCL's in-place form of
    /// the call. Views taken through `&self` (NVSHMEM's `Symmetric::slice`, a peer view of this
    /// PE, a framework's tensors) can name the same memory, which Rust's borrows cannot see; NCCL
    /// would read bytes it had already overwritten. Nothing was enqueued.
    #[error("the send and receive buffers of {call} share bytes, which NCCL allows only in its in-place form ({in_place}): pass separate buffers, or one buffer to the call's `_in_place` method")]
    Overlap {
        /// The NCCL function.
        call: &'static str,
        /// NCCL's in-place rule for the call (`"none"` where it has none).
        in_place: &'static str,
    },
    /// Two calls of one group share bytes and one of them writes them: the calls of a group run
    /// together, so the result would depend on their timing. Views taken through `&self` can name
    /// the same memory in two calls, which the group's borrows cannot see. Nothing was launched.
    #[error("calls {first} ({first_call}) and {second} ({second_call}) of one group share bytes that one of them writes; the calls of a group run together: pass disjoint buffers, or make the calls in two groups")]
    GroupOverlap {
        /// The index of the first call in the group (from 0).
        first: usize,
        /// Its NCCL function.
        first_call: &'static str,
        /// The index of the second call.
        second: usize,
        /// Its NCCL function.
        second_call: &'static str,
    },
    /// A rank (root, peer, own rank) outside `0..size`.
    #[error("{what} {rank} is out of range for {size} ranks")]
    InvalidRank {
        /// Which rank ("root", "peer", "rank").
        what: &'static str,
        /// The rank given.
        rank: usize,
        /// The communicator size.
        size: usize,
    },
    /// A buffer or stream on another device than the communicator's.
    #[error("{what} is on CUDA device {got} but the communicator uses device {expected}")]
    WrongDevice {
        /// Which argument.
        what: &'static str,
        /// The communicator's device.
        expected: usize,
        /// The argument's device.
        got: usize,
    },
    /// A buffer or stream of another CUDA context of the communicator's device (a context made
    /// with cudarc's `CudaContext::new_non_primary`): each context has its own address space, so
    /// NCCL's kernels, which run in the communicator's context, cannot use its memory.
    #[error("{what} belongs to another CUDA context of device {device} than the communicator's: its memory is not mapped in the communicator's context")]
    WrongContext {
        /// Which argument.
        what: &'static str,
        /// The device both contexts belong to.
        device: usize,
    },
    /// A count (ranks of a communicator, streams, unique ids, excluded ranks) outside what the
    /// call accepts.
    #[error("{what} must be between 1 and {max}, got {got}")]
    InvalidCount {
        /// What was counted ("nranks", "the number of streams", …).
        what: &'static str,
        /// The largest value accepted.
        max: usize,
        /// The value given.
        got: usize,
    },
    /// A value that C receives as an `int` but that does not fit in one (a colour, a config field).
    #[error("{what} is {value}, more than the largest C int ({})", i32::MAX)]
    TooLarge {
        /// The argument or config field.
        what: &'static str,
        /// The value given.
        value: u64,
    },
    /// Two streams of [`crate::Comm::init_all`] on the same device: each rank needs its own.
    #[error("two streams are on CUDA device {device}; each rank needs its own device")]
    DuplicateDevice {
        /// The device ordinal given twice.
        device: usize,
    },
    /// A rank listed twice (the excluded ranks of [`crate::Comm::shrink`]).
    #[error("rank {rank} is listed twice")]
    DuplicateRank {
        /// The rank.
        rank: usize,
    },
    /// [`crate::Comm::shrink`] called by a rank that excludes itself: excluded ranks must not call
    /// it (NCCL's rule); they release their communicator instead.
    #[error("rank {rank} excludes itself from the shrunk communicator; excluded ranks must not call shrink")]
    ShrinkExcludesSelf {
        /// This rank.
        rank: usize,
    },
    /// Bytes that are not a unique id ([`crate::UniqueId::from_bytes`]).
    #[error("a unique id has {expected} bytes, got {got}")]
    UniqueIdLength {
        /// [`crate::UniqueId::BYTES`].
        expected: usize,
        /// The number of bytes given.
        got: usize,
    },
    /// A string config field with a NUL byte inside, which C cannot see past.
    #[error("config field {field} contains a NUL byte")]
    NulInString {
        /// The `ncclConfig_t` field.
        field: &'static str,
    },
    /// An [`AbortHandle`](crate::AbortHandle) was asked of a blocking communicator: a blocking
    /// NCCL call cannot be interrupted, so NCCL supports aborting from another thread only for
    /// nonblocking communicators ([`Config::blocking`](crate::Config::blocking)`(false)`).
    #[error("an abort handle needs a nonblocking communicator (Config::blocking(false))")]
    NeedsNonblocking,
    /// Work on the communicator did not complete within its timeout (a peer that never arrived,
    /// or died): the communicator was aborted, and every later call on it fails with
    /// [`Error::Aborted`].
    #[error("{what} did not complete within {after:?}; the communicator was aborted")]
    Timeout {
        /// The NCCL call (or wait) that was overdue.
        what: &'static str,
        /// The timeout that expired.
        after: std::time::Duration,
    },
    /// The communicator was aborted (by its timeout, an [`AbortHandle`](crate::AbortHandle), or
    /// after a failure): nothing can be done with it any more; create a new one.
    #[error("the communicator was aborted")]
    Aborted,
    /// Releasing a registration or window of a communicator whose abort waits for its owner's
    /// teardown: aborted while CUDA graphs that captured it may be alive, whom NCCL's
    /// `ncclCommAbort` would wait for, it was only stopped, and NCCL releases what was registered
    /// with it when the [`Comm`](crate::Comm) is dropped or [aborted](crate::Comm::abort). The
    /// registration keeps its buffer, which is leaked when the registration is dropped.
    #[error("the communicator was aborted while graphs that captured it may be alive; NCCL releases its registrations only when the communicator is dropped, so this buffer stays registered and is kept")]
    AbortPending,
    /// An abort could not call `ncclCommAbort`: making the communicator's CUDA context current
    /// failed (the cause); or, without a cause, the communicator was abandoned for a forgotten
    /// graph ([`Error::GraphForgotten`]). Every later call on it fails with
    /// [`Error::Aborted`], and what NCCL may still use — registered buffers, windows, the
    /// communicator's own allocations — is leaked rather than freed; releasing a registration or
    /// window of it returns this error (without a cause) and keeps the buffer.
    #[error("the communicator was abandoned (its abort could not make its CUDA context current, or a CUDA graph that captured it was forgotten), and what NCCL may still use is leaked")]
    Abandoned {
        /// Why the context could not be made current: the driver's error, from the abort itself.
        #[source]
        cause: Option<cudarc::driver::DriverError>,
    },
    /// A CUDA graph that captured this communicator's calls was forgotten without being destroyed
    /// (`mem::forget` of a [`Graph`](crate::Graph), a reference cycle): NCCL's destroy and abort
    /// wait until every graph holding the communicator's work is destroyed, which a forgotten
    /// graph never is. The communicator is abandoned instead of waiting for ever: later calls
    /// fail with [`Error::Aborted`], releasing its registrations and windows returns
    /// [`Error::Abandoned`] and keeps their buffers, and it is leaked with what NCCL may still
    /// use.
    #[error("a CUDA graph that captured this communicator was forgotten (mem::forget) and NCCL would wait for it for ever: the communicator was abandoned, and is leaked")]
    GraphForgotten,
    /// A direct call (collective, init, finalize, nested group) while a group is open on this
    /// thread: NCCL would defer it to the end of the group, after this call had already released
    /// its buffers or needed its result.
    #[error("a group is open on this thread: issue collectives inside it through the `Group` handle, and create, finalize or nest outside it")]
    InsideGroup,
    /// A feature, element type or config field the loaded library is too old for. (NCCL would
    /// silently ignore a config field newer than itself, so this crate refuses it.)
    #[error("{what} needs NCCL ≥ {needed}, but the loaded library is {loaded}")]
    Unsupported {
        /// The feature, element type, or `config field <ncclConfig_t field>`.
        what: &'static str,
        /// The first release that has it.
        needed: Version,
        /// The loaded library's version.
        loaded: Version,
    },
    /// Exchanging the unique id with the other ranks failed.
    #[error(transparent)]
    Rendezvous(Box<crate::launch::RendezvousError>),
    /// NCCL reported success but handed back a null communicator, or a null handle was adopted.
    #[error("null communicator handle")]
    NullCommunicator,
    /// A split or shrink (`call`) would make a communicator that shares this one's resources
    /// (`splitShare` or `shrinkShare` in its [`Config`](crate::Config), or
    /// `NCCL_COMM_SPLIT_SHARE_RESOURCES` / `NCCL_COMM_SHRINK_SHARE_RESOURCES` set): NCCL forbids
    /// calls on the two from different threads at the same time, and an abort of one stops the
    /// other's work, which safe code could do with two `Send` communicators. Nothing was called.
    #[error("{call} would make a communicator that shares this one's resources (splitShare or shrinkShare, set by the config or NCCL_COMM_SPLIT_SHARE_RESOURCES / NCCL_COMM_SHRINK_SHARE_RESOURCES), which must never be used from two threads at once: promise that with the unsafe Comm::allow_shared_resources first, or leave sharing off (nothing was called)")]
    SharedResources {
        /// The refused call (`ncclCommSplit`, `ncclCommShrink`).
        call: &'static str,
    },
    // The data path.
    /// An allocation or registration of zero bytes (`ncclMemAlloc`, `ncclCommRegister`), which
    /// NCCL does not define. (Calls with zero elements are accepted: NCCL treats them as no-ops.)
    #[error("{call} of zero bytes")]
    ZeroSize {
        /// The C function.
        call: &'static str,
    },
    /// A length multiplied by the number of ranks (or a byte size) does not fit in `usize`.
    #[error("{what}: {count} × {factor} overflows")]
    CountOverflow {
        /// Which length.
        what: &'static str,
        /// The length.
        count: usize,
        /// What it is multiplied by: the communicator size, or an element size.
        factor: usize,
    },
    /// A buffer that the call splits into one block per rank has a length that is not a multiple
    /// of the number of ranks.
    #[error("{what} has {len} elements, which do not split into {parts} equal blocks")]
    NotDivisible {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The number of blocks (the communicator size).
        parts: usize,
    },
    /// [`crate::Root::Rank`] named this rank: the root must pass its buffer with
    /// [`crate::Root::Here`].
    #[error("{call}: root {rank} is this rank, which must pass its buffer with Root::Here")]
    RootWithoutBuffer {
        /// The C function.
        call: &'static str,
        /// This rank.
        rank: usize,
    },
    /// A custom reduction operator ([`crate::PreMulSum`]) used with a communicator other than the
    /// one it was created for: NCCL's operator ids are per communicator.
    #[error("a custom reduction operator can only be used with the communicator it was created for")]
    ForeignOp,
    /// The closure given to [`crate::group`] returned `Ok`, but calls inside it were refused (their
    /// errors went to the closure, which ignored them). A group is all or nothing, so nothing in
    /// it was launched.
    #[error("{refused} call(s) in the group were refused, so nothing in it was launched")]
    GroupRefused {
        /// How many calls were refused.
        refused: usize,
    },
    /// A call in a [`crate::group`] on a communicator whose mode (blocking or not,
    /// [`Config::blocking`](crate::Config::blocking)) differs from the group's first
    /// communicator's, or [`crate::register_windows`] over communicators of both modes. NCCL
    /// gives a group one mode, its last call's communicator's, and a nonblocking group leaves its
    /// blocking members "in progress" for good, so their settling would wait for ever (or abort
    /// them on their timeout). The call counts as refused: nothing in the group is launched (no
    /// window is registered). Group the communicators of each mode apart.
    #[error("a group mixes blocking and nonblocking communicators, which NCCL cannot settle: group each kind apart (nothing in the group was launched)")]
    #[doc(alias = "ncclGroupEnd")]
    MixedBlocking,
    /// A call captured into a CUDA graph on a communicator made with NCCL's graph mixing off
    /// (`setting`: `NCCL_GRAPH_MIXING_SUPPORT=0`, or a config's `graphUsageMode` 0 or 1 or
    /// `graphStreamOrdering` 0, NCCL ≥ 2.29). NCCL then does not order eager calls after an
    /// outstanding launch of a graph of the same communicator, on which this crate's graphs rely
    /// (a graph's launch and a later eager call would run together on the communicator's
    /// resources). The call is refused before NCCL is called, and the capture fails; leave the
    /// setting at NCCL's default to capture.
    #[error("{setting} turns off NCCL's ordering of eager calls after a graph launch of the same communicator, which this crate's graphs rely on: its calls are not captured (leave the setting at NCCL's default)")]
    GraphMixingOff {
        /// The variable or config field that turned it off.
        setting: &'static str,
    },
    /// A split or shrink that would share the parent's resources (`splitShare`, `shrinkShare`)
    /// with a config whose graph mixing differs from the parent's (NCCL ≥ 2.29's
    /// `graphUsageMode` 0 or 1, or `graphStreamOrdering` 0, on one side only). Communicators that
    /// share resources share NCCL's internal streams, and one whose eager calls do not wait for
    /// graph launches would run beside the other's graphs. Refused before NCCL is called.
    #[error("{call} would make a communicator that shares this one's resources with another graph-mixing setting (graphUsageMode or graphStreamOrdering) than this one's: give the child the parent's setting, or do not share resources (nothing was called)")]
    GraphMixingDiffers {
        /// The C function.
        call: &'static str,
    },
    /// A point-to-point call (send, receive, or all-to-all, gather and scatter, which NCCL turns
    /// into sends and receives) in a [`crate::simulate`]d group. NCCL (2.28) leaves simulated
    /// point-to-point operations queued on the communicator, where a later group would launch
    /// them with buffers nobody borrows any more, so such groups are refused.
    #[error("{call} cannot be simulated: NCCL keeps simulated point-to-point operations queued for a later launch")]
    NotSimulable {
        /// The C function.
        call: &'static str,
    },
    /// A buffer's uses could not be ordered, a call was made on a stream captured by something
    /// other than [`crate::capture`], or a capture or graph launch was refused (see
    /// [`gpucomm_ordering::OrderError`]). CUDA failures while ordering are [`Error::Cuda`].
    #[error(transparent)]
    Ordering(gpucomm_ordering::OrderError),
    /// A view of elements `start..end` of a buffer of `len` elements: empty or past the end.
    #[error("view {start}..{end} of a buffer of {len} elements is empty or past its end")]
    OutOfBounds {
        /// First element.
        start: usize,
        /// One past the last element.
        end: usize,
        /// The buffer's length.
        len: usize,
    },
    // The device API.
    /// NVLink multicast was requested; this crate never requests it (it can take shared GPUs out of
    /// service).
    #[error("NVLink multicast (multimem/NVLS) was requested; this crate never requests it")]
    MulticastRefused,
    /// GIN (GPU-initiated networking) was requested but NCCL could not provide it: it needs a
    /// GIN-capable network (InfiniBand with GPUDirect), which this machine does not offer to NCCL.
    #[error("GIN is not available on this machine (needs a GIN-capable network such as InfiniBand with GPUDirect); NCCL said {code}{}", detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    GinUnavailable {
        /// NCCL's result code.
        code: ResultCode,
        /// `ncclGetLastError`, when NCCL had something to say.
        detail: Option<String>,
    },
    /// A device-communicator requirement, or a size or count NCCL derives from it (barrier
    /// buffers, GIN signals), does not fit NCCL's `int`.
    #[error("{what} = {value} is more than NCCL accepts")]
    RequirementTooLarge {
        /// Which requirement, or which count NCCL derives.
        what: &'static str,
        /// The value given, or the derived count (at most `u32::MAX`).
        value: u32,
    },
    /// A kernel image cannot run on this GPU (built for another architecture, or not an image).
    #[error("{reason}")]
    KernelImage {
        /// What is wrong, naming the image's and the device's architectures.
        reason: String,
    },
    /// A module image that is not a complete cubin, fat binary or PTX text (truncated, corrupt,
    /// or something else), refused before the driver saw it: `cuModuleLoadData` takes no length,
    /// and would read past the end of such an image.
    #[error(transparent)]
    #[doc(alias = "cuModuleLoadData")]
    ModuleImage(#[from] gpucomm_ordering::ImageError),
    /// The device-API structs (`ncclDevCommRequirements`, `ncclDevComm`) of the headers this
    /// crate was compiled against and of the loaded library have different layouts, so NCCL would
    /// read and write fields that are not where this crate put them.
    #[error("the NCCL headers this crate was built with ({header}) and the loaded library ({library}) lay out the device-API structs differently: {reason}")]
    DeviceApiLayout {
        /// The headers' version ([`crate::header_version`]).
        header: nccl_sys::Version,
        /// The loaded library's version ([`crate::version`]).
        library: nccl_sys::Version,
        /// What differs, and what to do.
        reason: &'static str,
    },
    /// Teardown that must wait for queued GPU work gave up after the communicator's timeout: the
    /// work is still running, so what it uses was kept (not deregistered, destroyed or freed).
    #[error("{what} is still in use by GPU work queued before it, after {after:?}; it was kept, not released")]
    StillInUse {
        /// What was being released.
        what: &'static str,
        /// The timeout that expired.
        after: Duration,
    },
    /// A registration, window or device communicator released while this thread has a capture
    /// scope open ([`crate::capture`]): calls captured earlier in the scope may use it, and their
    /// graph cannot keep it any more once the closure let it go (a device communicator's release
    /// would also wait for the device, which invalidates the capture). Nothing was released (a
    /// dropped one is kept, its memory leaked, until the communicator goes).
    #[error("{what} inside a capture: calls captured into the graph may use it; release it after the capture (nothing was released)")]
    ReleaseInCapture {
        /// What was being released.
        what: &'static str,
    },
    /// [`Comm::wait`](crate::Comm::wait) inside a capture scope ([`crate::capture`]): the work
    /// captured so far runs only when the graph is launched, and CUDA refuses the host-side
    /// queries the wait makes while this thread captures (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`
    /// on the GPU machine). Nothing was waited for; the capture goes on.
    #[error("Comm::wait inside a capture: wait after the capture (the captured work runs when the graph is launched)")]
    WaitInCapture,
    /// A device-API team (`nccl::device::Team`) NCCL cannot take: a field larger than a C int, or a rank
    /// whose translation would overflow one (NCCL computes it in C ints). Teams NCCL describes
    /// never are.
    #[error("team of {size} ranks (this rank {rank}, stride {stride}) cannot be passed to NCCL: {reason}")]
    InvalidTeam {
        /// The team's `size`.
        size: usize,
        /// The team's `rank`.
        rank: usize,
        /// The team's `stride`.
        stride: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A resource buffer's alignment is not a power of two, or is more than 1 GiB.
    #[error("resource buffer alignment {align} is not a power of two of at most 1 GiB (2^30 bytes)")]
    InvalidAlignment {
        /// The alignment given.
        align: usize,
    },
    /// A device communicator's resource buffers (NCCL's barrier buffers first, then the ones
    /// requested, each at its alignment) do not fit its resource window, which NCCL addresses with
    /// 32-bit handles in 128-byte units: NCCL would truncate the buffer's handle.
    #[error("resource buffer {index} ({size} bytes aligned to {align}) ends past the {} bytes that NCCL's 32-bit resource handles (in 128-byte units) can address, counting the buffers before it and NCCL's own", u64::from(u32::MAX) * 128)]
    #[doc(alias = "ncclDevResourceHandle_t")]
    ResourceWindowTooLarge {
        /// Its index in the order of `DevCommRequirements::resource_buffer`.
        index: usize,
        /// Its size in bytes.
        size: usize,
        /// Its alignment in bytes.
        align: usize,
    },
}

build_support::family_error_conversions!(Error);

/// Shorthand for this crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_have_names_and_unknown_codes_survive() {
        assert_eq!(format!("{}", ResultCode::INVALID_ARGUMENT), "ncclInvalidArgument(4)");
        assert_eq!(format!("{:?}", ResultCode(42)), "ResultCode(42)");
        assert_eq!(ResultCode(42).name(), None);
        assert!(ResultCode::REMOTE_ERROR.is_fatal());
        assert!(ResultCode(42).is_fatal());
        assert!(!ResultCode::INVALID_ARGUMENT.is_fatal());
    }

    #[test]
    fn errors_display_their_parts() {
        let e = Error::Nccl {
            call: "ncclAllReduce",
            code: ResultCode::INVALID_USAGE,
            message: "invalid usage".into(),
            detail: Some("peer mismatch".into()),
        };
        assert_eq!(e.to_string(), "ncclAllReduce failed with ncclInvalidUsage(5): invalid usage (peer mismatch)");
        let e = Error::LengthMismatch { what: "recv buffer", expected: 8, got: 4 };
        assert_eq!(e.to_string(), "recv buffer has 4 elements but the call needs 8");
        let e = Error::Timeout { what: "ncclAllReduce", after: std::time::Duration::from_secs(3) };
        assert_eq!(e.to_string(), "ncclAllReduce did not complete within 3s; the communicator was aborted");
        assert_eq!(
            Error::DuplicateDevice { device: 0 }.to_string(),
            "two streams are on CUDA device 0; each rank needs its own device"
        );
    }

    #[test]
    fn a_cuda_error_appears_once_in_a_chain() {
        use cudarc::driver::{sys::CUresult, DriverError};
        // Transparent: the error *is* cudarc's (same message), with no source repeating it.
        // (Formatting a DriverError needs the CUDA driver, so only the chain is checked here.)
        let e = Error::from(DriverError(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert!(std::error::Error::source(&e).is_none(), "the CUDA error would be printed twice");
        assert!(matches!(e, Error::Cuda(DriverError(CUresult::CUDA_ERROR_INVALID_VALUE))));
    }
}
