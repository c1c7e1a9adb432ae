//! The three kinds of `.cu` files: what a file is compiled against.

use std::fmt;

/// What a `.cu` file is compiled against, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavour {
    /// Plain CUDA C++: one `nvcc -cubin` (or `-fatbin`).
    Cuda,
    /// NCCL's device API (`#include <nccl_device.h>`: LSA barriers, `ncclGetLsaPointer`, …):
    /// header-only, so like [`Flavour::Cuda`] with NCCL's include directory.
    Nccl,
    /// NVSHMEM device code (`#include <nvshmem.h>`): compiled with `-rdc=true`, then device-linked
    /// with `libnvshmem_device.a` into one self-contained image (load it, then
    /// `nvshmemx_cumodule_init`).
    Nvshmem,
}

impl Flavour {
    /// The -sys crate whose install the flavour uses.
    pub(crate) fn sys_crate(self) -> &'static str {
        match self {
            Flavour::Cuda => "no -sys crate",
            Flavour::Nccl => "nccl-sys",
            Flavour::Nvshmem => "nvshmem-sys",
        }
    }
}

impl fmt::Display for Flavour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Flavour::Cuda => "plain CUDA",
            Flavour::Nccl => "NCCL device API",
            Flavour::Nvshmem => "NVSHMEM",
        })
    }
}
