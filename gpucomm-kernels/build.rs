//! Compiles the all-reduce kernels (`cu/lsa_allreduce.cu`, NCCL device API) into a module image
//! embedded in the crate, with build-support's `.cu` API. No CUDA install is needed (the pinned
//! nvcc wheels); the architecture comes from `CUDA_ARCHS` (default sm_90). The NCCL headers are
//! those nccl-sys found (`DEP_NCCL_INCLUDE`), so the kernels and the bindings agree on the
//! device-API structures.

use build_support::build::cu::Kernels;

fn main() -> std::process::ExitCode {
    Kernels::new().nccl("cu/lsa_allreduce.cu").run()
}
