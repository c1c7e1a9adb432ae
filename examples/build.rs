//! Compiles the lessons' NVSHMEM kernels (`kernels/*.cu`) with build-support's `.cu` builder:
//! device-linked against the `libnvshmem_device.a` that `nvshmem-sys` found, for `CUDA_ARCHS`
//! (default sm_90), embedded as `gpucomm_examples::kernels::NVSHMEM_RING` and `NVSHMEM_BENCH`.

use gpucomm_build_support::build::cu::Kernels;

fn main() -> std::process::ExitCode {
    Kernels::new().nvshmem("kernels/nvshmem_ring.cu").nvshmem("kernels/nvshmem_bench.cu").run()
}
