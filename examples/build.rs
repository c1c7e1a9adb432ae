//! Compiles the lessons' CUDA kernels into module images embedded in the crate, with
//! build-support's `.cu` API, in its three flavours: plain CUDA (`kernels/step.cu` → `STEP`), NCCL's
//! device API (lesson 12's own kernel, `examples/12-lsa-one-shot.cu` next to the lesson →
//! `LSA_ONE_SHOT`) and NVSHMEM device code device-linked with the `libnvshmem_device.a` that
//! nvshmem-sys found (`NVSHMEM_RING`, `NVSHMEM_BENCH`, `NVSHMEM_ALLREDUCE`). The fast LSA all-reduce
//! kernels of lessons 13 and 15 and the custom-kernels bench live in the gpucomm-kernels crate
//! (`gpucomm-kernels/cu/lsa_allreduce.cu`). No CUDA install is needed (the pinned nvcc wheels); the
//! architecture comes from `CUDA_ARCHS` (default sm_90).

use build_support::build::cu::{Flavour, Kernels};

fn main() -> std::process::ExitCode {
    Kernels::new()
        .cuda("kernels/step.cu")
        .image("LSA_ONE_SHOT", Flavour::Nccl, "examples/12-lsa-one-shot.cu")
        .nvshmem("kernels/nvshmem_ring.cu")
        .nvshmem("kernels/nvshmem_bench.cu")
        .nvshmem("kernels/nvshmem_allreduce.cu")
        .run()
}
