//! What the candle lessons (17–19) share, so that each lesson file shows only its lesson:
//!
//! * [`setup`]: one rank's candle device, the communication stream and the communicator, in the
//!   order cudarc needs (the second stream before any tensor), and the command-line flags;
//! * [`tensor`]: the bridge between a candle tensor and the buffers NCCL takes — the CUDA slice
//!   under a tensor (read, or written in place through candle's `InplaceOp1`), and a tensor made
//!   from a slice;
//! * [`model`]: the lessons' model (an MLP), its synthetic task (a fixed "teacher" network the
//!   model learns to imitate), and the single-GPU reference training that lessons 17 and 18 are
//!   compared with;
//! * [`buckets`]: how PyTorch's DDP groups gradients into buckets (lesson 17);
//! * [`layerwise`]: the model's training pass with the backward pass enqueued one layer at a
//!   time, so that lesson 17 can record "this layer's gradients are written" on candle's stream;
//! * [`timeline`]: CUDA events on both streams, turned into step time, communication time and the
//!   share of communication hidden behind computation.

pub mod buckets;
pub mod layerwise;
pub mod model;
pub mod setup;
pub mod tensor;
pub mod timeline;

/// Everything a lesson can fail with (candle's, cudarc's, nccl's errors and messages).
pub type BoxError = Box<dyn std::error::Error>;
