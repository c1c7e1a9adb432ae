//! Compiles the lessons' CUDA kernels (`kernels/*.cu`) into module images embedded in the crate,
//! with build-support's `.cu` API, in two of its flavours: plain CUDA (`STEP`) and NVSHMEM device
//! code device-linked with the `libnvshmem_device.a` that nvshmem-sys found (`NVSHMEM_RING`,
//! `NVSHMEM_BENCH`, `NVSHMEM_ALLREDUCE`). The NCCL device-API kernels of lessons 12–15 and the
//! custom-kernels bench live in the gpucomm-kernels crate (`kernels/cu/lsa_allreduce.cu`). No CUDA install is needed (the pinned
//! nvcc wheels); the architecture comes from `CUDA_ARCHS` (default sm_90).

use gpucomm_build_support::build::cu::Kernels;

fn main() -> std::process::ExitCode {
    Kernels::new()
        .cuda("kernels/step.cu")
        .nvshmem("kernels/nvshmem_ring.cu")
        .nvshmem("kernels/nvshmem_bench.cu")
        .nvshmem("kernels/nvshmem_allreduce.cu")
        .run()
}
