//! Nothing to run: this crate only has to compile. It names one item of each crate so that the
//! check type-checks their use together: a candle tensor's CUDA slice is the very type the `nccl`
//! crate's collectives take (one cudarc in the graph).

use candle_core::cuda::CudaStorage;
use nccl::{Collectives, Comm, ReduceOp};

/// Averages the f32 elements of a candle CUDA storage across `comm` (the pattern of the candle
/// lessons): the storage's `CudaSlice` goes to NCCL as it is.
pub fn all_reduce_storage(comm: &Comm, storage: &mut CudaStorage) -> Result<(), Box<dyn std::error::Error>> {
    let slice = storage.as_cuda_slice_mut::<f32>()?;
    comm.all_reduce_in_place(slice, ReduceOp::AVG)?;
    Ok(())
}

/// burn's CUDA backend type, and the launch and ordering crates, side by side.
pub type Backend = burn_cuda::Cuda<f32, i32>;
pub use gpucomm_launch::RankInfo;
pub use gpucomm_ordering::is_capturing;
pub use nvshmem::Runtime;
