//! The crate's error type.

use crate::fallback::Fallback;
use crate::path::Path;

/// Everything this crate's calls can fail with. A refused call has enqueued nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An NCCL call (through the `nccl` crate) failed.
    #[error(transparent)]
    Nccl(#[from] nccl::Error),
    /// A CUDA call failed.
    #[error("CUDA: {0}")]
    Cuda(#[from] cudarc::driver::DriverError),
    /// Input and output differ in length.
    #[error("{what} has {got} elements, {expected} expected")]
    LengthMismatch {
        /// Which buffer.
        what: &'static str,
        /// The length it must have.
        expected: usize,
        /// Its length.
        got: usize,
    },
    /// The send and receive buffers share bytes without being the same range (views taken
    /// through `&self`, such as NVSHMEM's `Symmetric::slice`, can name the same memory, which
    /// Rust's borrows cannot see): every path would read bytes it had already overwritten. Pass
    /// separate buffers, or one buffer to [`AllReduce::all_reduce_in_place`](crate::AllReduce::all_reduce_in_place).
    #[error("the send and receive buffers share bytes without being the same range: pass separate buffers, or one buffer to all_reduce_in_place")]
    Overlap,
    /// A buffer or stream is not on the communicator's device.
    #[error("{what} is on device {got}, the communicator on device {expected}")]
    WrongDevice {
        /// Which buffer or stream.
        what: &'static str,
        /// The communicator's device.
        expected: usize,
        /// The buffer's or stream's device.
        got: usize,
    },
    /// A buffer or stream of another CUDA context of the communicator's device (a context made
    /// with cudarc's `CudaContext::new_non_primary`): the kernels run in the communicator's
    /// context, where its memory is not mapped.
    #[error("{what} belongs to another CUDA context of device {device} than the communicator's: its memory is not mapped there")]
    WrongContext {
        /// Which buffer or stream.
        what: &'static str,
        /// The device both contexts belong to.
        device: usize,
    },
    /// The communicator was revoked ([`nccl::Comm::revoke`]): NCCL's collectives on it fail, and
    /// so do these kernels' launches (the peers have stopped; a kernel would wait for them for
    /// ever).
    #[error("the communicator was revoked: its kernels are not launched")]
    Revoked,
    /// A message too large (or empty) for a kernel that has a fixed staging area.
    #[error("the {path} kernel takes 1 to {max} bytes per call; this call has {got}")]
    Size {
        /// The kernel.
        path: Path,
        /// Its limit, in bytes.
        max: usize,
        /// The call's size, in bytes.
        got: usize,
    },
    /// A staging area larger than [`MAX_AREA`](crate::lsa::MAX_AREA) bytes.
    #[error("the {what} staging area of {bytes} bytes is over the limit of {max}")]
    AreaTooLarge {
        /// Which area (`one-shot`, `staged`).
        what: &'static str,
        /// The size asked for.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// A window range past the window's end.
    #[error("{what}: elements {start}..{end} do not fit a window of {len} elements")]
    WindowRange {
        /// Which window.
        what: &'static str,
        /// First element.
        start: usize,
        /// One past the last element.
        end: usize,
        /// The window's length in elements.
        len: usize,
    },
    /// A window registered on another communicator than the kernels'.
    #[error("the {what} is registered on another communicator than the kernels'")]
    OtherCommunicator {
        /// Which window.
        what: &'static str,
    },
    /// The kernels exist for f32, bf16 and f16 only.
    #[error("the all-reduce kernels have no {dtype} version (f32, bf16 and f16 only)")]
    UnsupportedType {
        /// The element type asked for.
        dtype: &'static str,
    },
    /// A path was forced ([`crate::AllReduce::force`]) that cannot take this call.
    #[error("the forced {path} path cannot take this call: {why}")]
    Forced {
        /// The forced path.
        path: Path,
        /// Why not.
        why: Fallback,
    },
    /// The kernels are not usable on this communicator (see [`crate::Fallback`]).
    #[error("the all-reduce kernels are not available: {0}")]
    Unavailable(Fallback),
    /// A crossover table that does not parse or makes no sense.
    #[error("crossover table, line {line}: {reason}")]
    Table {
        /// 1-based line number (0: the table as a whole).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A calibration setting that cannot be used.
    #[error("calibration: {0}")]
    Calibration(String),
    /// The ranks passed different values to a collective call that needs the same on every
    /// rank (options, a forced path, a table, launch shapes, a symmetric buffer's length):
    /// nothing was changed or allocated on any rank.
    #[error("the ranks asked for different {what} (this rank {mine:?}; smallest {smallest:?}, largest {largest:?}); nothing changed on any rank")]
    Mismatch {
        /// What was compared.
        what: &'static str,
        /// This rank's values.
        mine: Vec<u64>,
        /// The smallest value of each over the ranks.
        smallest: Vec<u64>,
        /// The largest value of each over the ranks.
        largest: Vec<u64>,
    },
}

impl From<gpucomm_ordering::OrderError> for Error {
    /// A refusal of the stream ordering or the capture scope (a capture not opened through
    /// `nccl::capture`, …), as the `nccl` crate reports it.
    fn from(e: gpucomm_ordering::OrderError) -> Self {
        Error::Nccl(nccl::Error::from(e))
    }
}

/// This crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
