//! Compiles the lessons' CUDA kernels (`kernels/*.cu`) into cubins embedded in the crate, with
//! build-support's `.cu` API: plain CUDA, NCCL device API and NVSHMEM flavours. No CUDA install is
//! needed (the pinned nvcc wheels); the architecture comes from `CUDA_ARCHS` (default sm_90).

use gpucomm_build_support::build::cu::Kernels;

fn main() -> std::process::ExitCode {
    Kernels::new()
        .cuda("kernels/step.cu")
        .nccl("kernels/lsa_allreduce.cu")
        .nvshmem("kernels/nvshmem_allreduce.cu")
        .run()
}
