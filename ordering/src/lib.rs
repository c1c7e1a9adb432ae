//! Stream ordering for the GPU communication crates, shared by `nccl` and `nvshmem`.
//!
//! cudarc orders its own buffers ([`CudaSlice`](cudarc::driver::CudaSlice) and views) between
//! streams with two events per buffer: every use waits for the events and records one afterwards.
//! That protocol has two gaps that matter for communication libraries, and this crate closes them:
//!
//! * **Memory cudarc did not allocate** (`ncclMemAlloc` buffers, NVSHMEM's symmetric heap) has no
//!   events at all. A [`StreamTracker`] gives such a buffer the same guarantee — every use on a
//!   stream is ordered after every earlier use on another stream — at the price of nothing while
//!   the buffer stays on one stream: it remembers the stream of the last use and only records an
//!   event and waits for it when the stream changes. [`tracked_device_ptr!`] makes such a type a
//!   cudarc [`DevicePtr`](cudarc::driver::DevicePtr)/[`DevicePtrMut`](cudarc::driver::DevicePtrMut),
//!   so cudarc copies and kernels order themselves against it too.
//! * **CUDA graph capture**: waiting on an event recorded outside a capture invalidates it
//!   (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`), so cudarc's protocol breaks every capture of a call on
//!   an ordinary buffer. [`Access`] takes buffer pointers for one call on one stream: outside a
//!   capture it follows cudarc's protocol exactly; inside one it takes the pointer without waiting
//!   and records nothing, because captured work does not run until the graph is launched.
//!
//! # What a captured use means
//!
//! Work captured into a graph runs when the graph is launched, not when it is captured. Like
//! cudarc, this crate leaves the ordering of a graph *launch* to the caller: launch a graph on the
//! stream it was captured on (or join the streams first). When a captured call uses a tracked
//! buffer whose last use was on another stream, the earlier work is waited for on the host before
//! the call is captured, so nothing queued before the capture can overlap the graph.
#![deny(missing_docs)]

mod access;
mod capture;
mod pinned;
mod quiesce;
pub mod range;
mod tracker;

pub use access::Access;
pub use capture::{is_capturing, relaxed};
pub use pinned::PinnedMut;
pub use quiesce::{device_idle_within, wait_for_uses};
pub use tracker::{OrderError, StreamTracker};
