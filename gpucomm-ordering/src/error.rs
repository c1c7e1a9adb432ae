//! Why a use could not be ordered, a capture was refused, or a graph not launched.

use std::fmt;

use cudarc::driver::DriverError;

/// Why a use could not be ordered, a capture was refused, or a graph was not launched.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OrderError {
    /// A CUDA call (event record, stream wait, synchronisation) failed.
    Cuda(DriverError),
    /// The buffer's last use is part of a capture that is still open on another stream; an eager
    /// use now could not be ordered after the work queued before that capture began.
    CaptureOpen,
    /// The stream is being captured into a CUDA graph that this crate did not open (cudarc's
    /// `begin_capture`, another library, or another stream joined into a capture). Such a graph
    /// would not keep the call's buffers and communicators alive.
    ForeignCapture,
    /// A capture was started while this thread already had one open.
    NestedCapture,
    /// The call's stream was admitted as not captured (or as captured by this thread's scope), and
    /// is not any more when the call is about to be issued: a capture began, ended or was
    /// invalidated in between (by code that ran between the two, such as a group's closure).
    /// Nothing was enqueued.
    CaptureChanged,
    /// A group's calls go to streams of which some are captured by this thread's capture scope
    /// and some are not: NCCL cannot launch them together, and ordering the group's streams after
    /// each other would pull the uncaptured ones into the capture.
    MixedCapture,
    /// A graph was launched on a stream that is being captured.
    LaunchInCapture,
    /// A new buffer's first contents (zeros, a copy of host memory) were to be written on a
    /// stream that is being captured: the write would only be recorded into the graph, and the
    /// buffer handed out before anything wrote it.
    InitInCapture,
    /// CUDA broke the capture: some work inside it waited for work outside it (a cudarc copy or
    /// kernel on a `CudaSlice` whose events were recorded before the capture, an event of another
    /// stream), or a stream joined into it was not joined back.
    CaptureBroken(DriverError),
    /// The capture allocated device memory that it did not free: a cudarc allocation on the
    /// captured stream (`alloc_zeros`, `clone_htod`, …) inside the closure, whose slice outlives
    /// it. Such memory is a node of the graph, backed only while a launch of the graph holds it:
    /// the slice names memory that nothing backs now. The graph is refused (and kept, unlaunched,
    /// so that the address stays reserved): drop such slices inside the closure, or allocate them
    /// before the capture.
    AllocationLeft {
        /// The address the graph allocated.
        ptr: u64,
        /// Its size in bytes.
        bytes: usize,
    },
    /// A captured call used device memory that none of the graph's kept buffers holds.
    NotKept {
        /// The device.
        ordinal: usize,
        /// The address.
        ptr: u64,
        /// Bytes used.
        bytes: usize,
    },
    /// A captured call writes memory that the graph keeps only through a shared reference.
    KeptShared {
        /// The device.
        ordinal: usize,
        /// The address.
        ptr: u64,
        /// Bytes written.
        bytes: usize,
    },
    /// A captured call used a communicator, team, runtime, module or operator that the graph does
    /// not keep.
    ResourceNotKept {
        /// What it is ("communicator", "team", …).
        kind: &'static str,
    },
    /// A graph's communicator (or other resource) was closed (aborted) since the capture.
    ResourceClosed {
        /// What it is.
        kind: &'static str,
    },
    /// Enqueuing the completion of an earlier non-blocking operation failed.
    Pending(String),
    /// A graph's launch could not join the order its work keeps among eager work
    /// ([`LaunchChain`](crate::LaunchChain)); the launch did not happen, or (when the text says
    /// so) it happened and later work of its kind cannot be ordered after it.
    LaunchChain(String),
    /// The stream is the per-thread default stream (cudarc's `per_thread_stream`, handle
    /// `CU_STREAM_PER_THREAD`): one handle that names a different stream on each thread, so that
    /// a use on it cannot be told from a use on another thread's, nor waited for from there.
    PerThreadStream,
    /// The stream belongs to another CUDA context than the buffer's memory (another device, or
    /// another context of the same device): the buffer's events cannot be recorded or waited for
    /// there.
    StreamOfOtherContext,
}

impl fmt::Display for OrderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OrderError::Cuda(e) => write!(f, "ordering the buffer's streams failed: {e}"),
            OrderError::CaptureOpen => write!(
                f,
                "the buffer was last used on a stream that is still being captured into a graph; \
                 end that capture before using the buffer on another stream"
            ),
            OrderError::ForeignCapture => write!(
                f,
                "the stream is being captured into a CUDA graph that these crates did not open; capture \
                 through nccl::capture / nvshmem::capture, whose graph keeps what its calls use alive \
                 (only the scope's own stream can be used inside it)"
            ),
            OrderError::NestedCapture => write!(f, "a capture is already open on this thread"),
            OrderError::MixedCapture => write!(
                f,
                "a group's calls go to a stream being captured and to one that is not: capture the whole \
                 group on the capture's stream, or make the other calls outside the capture"
            ),
            OrderError::CaptureChanged => write!(
                f,
                "the stream's capture state changed between the call's admission and its launch (a capture \
                 began, ended or was invalidated in between); nothing was enqueued"
            ),
            OrderError::LaunchInCapture => write!(f, "a graph cannot be launched on a stream that is being captured"),
            OrderError::InitInCapture => write!(
                f,
                "a new buffer cannot be filled on a stream that is being captured (the fill would only be recorded \
                 into the graph): make it before the capture, or on a stream that is not captured"
            ),
            OrderError::CaptureBroken(e) => write!(
                f,
                "CUDA broke the capture ({e}): something inside it waited for work outside it (a cudarc copy \
                 or kernel on a CudaSlice, an event recorded before the capture) or left a stream unjoined"
            ),
            OrderError::AllocationLeft { ptr, bytes } => write!(
                f,
                "the capture allocated {bytes} bytes at {ptr:#x} and did not free them: memory allocated on a \
                 captured stream belongs to the graph, and the slice that names it is not usable outside it; \
                 drop it inside the capture, or allocate it before"
            ),
            OrderError::NotKept { ordinal, ptr, bytes } => write!(
                f,
                "a captured call used {bytes} bytes at {ptr:#x} on device {ordinal}, which none of the graph's \
                 kept buffers holds: give that buffer to the capture"
            ),
            OrderError::KeptShared { ordinal, ptr, bytes } => write!(
                f,
                "a captured call writes {bytes} bytes at {ptr:#x} on device {ordinal}, which the graph keeps only \
                 through a shared reference: give it as `&mut` (or by value)"
            ),
            OrderError::ResourceNotKept { kind } => {
                write!(f, "a captured call used a {kind} that the graph does not keep: give it to the capture")
            }
            OrderError::ResourceClosed { kind } => write!(f, "the graph's {kind} was closed since the capture"),
            OrderError::Pending(e) => write!(f, "completing an earlier non-blocking operation failed: {e}"),
            OrderError::LaunchChain(e) => {
                write!(f, "ordering the graph's launch among the eager work of its kind failed: {e}")
            }
            OrderError::PerThreadStream => write!(
                f,
                "the per-thread default stream (cudarc's per_thread_stream) names another stream on each \
                 thread, which the buffers' ordering cannot follow: use a stream of CudaContext::new_stream \
                 (or the default stream)"
            ),
            OrderError::StreamOfOtherContext => write!(
                f,
                "the stream belongs to another CUDA context than the buffer (another device, or another \
                 context of it): use the buffer on a stream of its own context"
            ),
        }
    }
}

impl std::error::Error for OrderError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OrderError::Cuda(e) | OrderError::CaptureBroken(e) => Some(e),
            _ => None,
        }
    }
}

impl From<DriverError> for OrderError {
    fn from(e: DriverError) -> Self {
        OrderError::Cuda(e)
    }
}
