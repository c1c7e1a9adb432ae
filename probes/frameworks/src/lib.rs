//! Nothing to run: this crate only has to compile, once with each framework. It names items of
//! our crates and of the framework side by side, so that `cargo check` type-checks their use in
//! one program with one cudarc.

pub use gpucomm_kernels::AllReduce;
pub use gpucomm_launch::RankInfo;
pub use gpucomm_ordering::is_capturing;
pub use nvshmem::Runtime;

/// Averages the f32 elements of a candle CUDA storage across `comm`: the storage's `CudaSlice`
/// goes to NCCL as it is — the same cudarc type. A type check of the two crates together, not a
/// pattern to copy: it takes the whole storage, ignoring the tensor's layout (a view's storage is
/// shared with other tensors); the candle lessons' `with_slice` takes exactly the tensor's
/// elements.
#[cfg(feature = "candle")]
pub fn all_reduce_storage(
    comm: &nccl::Comm,
    storage: &mut candle_core::cuda::CudaStorage,
) -> Result<(), Box<dyn std::error::Error>> {
    use nccl::Collectives;
    let slice = storage.as_cuda_slice_mut::<f32>()?;
    comm.all_reduce_in_place(slice, nccl::ReduceOp::AVG)?;
    Ok(())
}

/// burn's CUDA backend, beside the communicator type.
#[cfg(feature = "burn")]
pub type Backend = (burn_cuda::Cuda, nccl::Comm);

/// Sums the f32 elements of a candle CUDA storage across the ranks with gpucomm-kernels'
/// dispatching all-reduce (on candle's cudarc stream type): the same buffer, through the kernels.
/// A type check, like [`all_reduce_storage`]: the whole storage, whatever the tensor's layout.
#[cfg(feature = "candle")]
pub fn sum_storage(
    all_reduce: &AllReduce<'_>,
    stream: &std::sync::Arc<candle_core::cuda::cudarc::driver::CudaStream>,
    storage: &mut candle_core::cuda::CudaStorage,
) -> Result<gpucomm_kernels::Decision, Box<dyn std::error::Error>> {
    let slice = storage.as_cuda_slice_mut::<f32>()?;
    Ok(all_reduce.all_reduce_in_place(stream, slice, nccl::ReduceOp::SUM)?)
}
