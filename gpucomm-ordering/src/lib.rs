//! Stream ordering for the GPU communication crates, shared by `nccl` and `nvshmem`.
//!
//! cudarc orders its own buffers ([`CudaSlice`](cudarc::driver::CudaSlice) and views) between
//! streams with two events per buffer: every use waits for the events and records one afterwards.
//! Communication libraries need more than that, and this crate provides it once for both:
//!
//! * **A buffer promise the calls can trust.** cudarc's buffer traits are safe to implement, so a
//!   type could claim any length. The calls take [`DeviceBuffer`] / [`DeviceBufferMut`], which
//!   need the `unsafe` [`DeviceMemory`]: implemented for cudarc's slices and views, the crates' own
//!   buffers, and by frameworks for their tensors (see [`buffer`](mod@buffer)).
//! * **Memory cudarc did not allocate** (`ncclMemAlloc` buffers, NVSHMEM's symmetric heap) has no
//!   events at all. A [`StreamTracker`] gives such a buffer the same guarantee — every use on a
//!   stream is ordered after the earlier uses it conflicts with, reads on several streams
//!   included — at the price of nothing while the buffer stays on one stream.
//!   [`tracked_device_ptr!`] makes such a type a cudarc buffer and a [`DeviceMemory`].
//! * **CUDA graphs.** [`capture`] records the calls of a closure into a [`Graph`] that keeps alive
//!   every buffer, communicator, team, runtime and module they use, and whose launches are
//!   ordered like calls (see [`graph`](mod@graph)). A capture opened by anything else is refused
//!   by every call ([`OrderError::ForeignCapture`]). [`Access`] is how a call takes its buffers'
//!   pointers, eagerly or inside such a capture.
//!
//!   The refusal asks the driver once per call, before the call is enqueued. What it cannot see is
//!   a capture that another thread begins on the same stream after that question and before the
//!   enqueue: cudarc's `CudaStream::begin_capture` is safe and its streams are `Sync`, so nothing
//!   stops that thread, and the call would land in its graph. cudarc's own calls on the stream
//!   are just as exposed, and they ask nothing at all. So: do not begin a capture on a stream
//!   while another thread enqueues on it.
#![deny(missing_docs)]

mod access;
pub mod buffer;
mod capture;
mod context;
mod error;
pub mod graph;
pub mod image;
mod pinned;
mod quiesce;
pub mod range;
mod tracker;
mod usage;

pub use access::{Access, Guard};
pub use buffer::{DeviceBuffer, DeviceBufferMut, DeviceMemory};
pub use capture::{
    admit, after_scope, captured_completion, capturing, is_capturing, join_launches, relax, relaxed, scope_open,
    Complete, LaunchChain, RelaxedMode,
};
pub use context::{make_current, placement, Placement};
pub use error::OrderError;
pub use graph::{capture, Captured, Graph, Keep, Visitor};
pub use image::{ImageError, ImageKind, ModuleImage};
pub use pinned::PinnedMut;
pub use quiesce::{device_idle_within, wait_for_uses};
pub use tracker::{captured_nonblocking, StreamTracker, Tracked};
pub use usage::{Resource, Use};
