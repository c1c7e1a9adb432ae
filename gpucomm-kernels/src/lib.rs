//! All-reduce kernels over NCCL's device API, and an all-reduce that dispatches each call to the
//! fastest of them and NCCL.
//!
//! NCCL's device API (NCCL ≥ 2.28) lets a CUDA kernel load from and store to the memory of every
//! rank it reaches over NVLink (an LSA team) and synchronise with them (LSA barriers). This crate
//! holds four all-reduce kernels written against it (`cu/lsa_allreduce.cu`, compiled by `build.rs`
//! and embedded, checked against the GPU's architecture when loaded):
//!
//! | path | kernel | best for (2×H200) |
//! |---|---|---|
//! | [`Path::Ll`] | LL one-shot: (data, flag) words stored straight into every peer, no barrier | ≤ 64 KiB |
//! | [`Path::OneShot`] | input staged in a window, one barrier, every peer's input loaded | 128–512 KiB |
//! | [`Path::TwoShot`] | reduce-scatter and all-gather by loads and stores, two barriers | 1 MiB and up |
//! | [`Path::Nccl`] | `ncclAllReduce` | what the kernels cannot do, very large messages |
//!
//! * [`AllReduce`]: the one type frameworks need. Created once per communicator, it owns the
//!   device communicator and the symmetric window the kernels stage through and, for each call,
//!   picks the path from a crossover [`Table`] (the committed one for the machine, or one measured
//!   at start by [`AllReduce::calibrate`]), falling back to NCCL where the kernels cannot help. It
//!   works on every buffer the `nccl` calls take (cudarc's and candle's buffers, the `nccl`
//!   crate's [`nccl::MemBuffer`]), on any stream of the device, and inside [`nccl::capture`]
//!   ([`capture`]), whose graphs keep it and the buffers; every call returns its [`Decision`].
//! * [`lsa::LsaKernels`]: the kernels one by one, for lessons and experiments.
//!
//! Nothing here requests NVLink multicast.
//!
//! # Building
//!
//! The build script compiles `cu/lsa_allreduce.cu` with **nvcc** (no GPU needed; NVIDIA's
//! `nvidia-cuda-nvcc` wheel is enough): `NVCC`, or the `bin/nvcc` of the CUDA install that
//! `CUDA_HOME`, `CUDA_PATH` or `GPUCOMM_PREFIX` names, or `nvcc` on `PATH` (the search of
//! build-support's `build::cu`). It needs NCCL headers with the device API (≥ 2.28; the
//! workspace's pinned 2.28.9), those nccl-sys found. Without nvcc the build fails and says where it
//! looked; `GPUCOMM_SKIP_CU=1` builds the crate without kernels instead (as docs.rs does), and every
//! call then takes NCCL's path ([`Fallback::NotCompiled`]). At run time any NCCL works, the kernels
//! only where its device API matches the headers ([`Fallback::HeaderMismatch`]).
//!
//! Like the `nccl` crate, this one leaves cudarc's linking mode and CUDA version to the program
//! (default feature `cuda-version-from-build-system`; `cuda-XXXXX` features pick one).

#![deny(missing_docs)]

mod calibrate;
mod decide;
mod dispatch;
mod error;
mod fallback;
pub mod lsa;
mod path;
pub mod table;

/// The compiled kernels (`build.rs`): `LSA_ALLREDUCE`, a module image for `cuModuleLoadData`
/// (empty, with `COMPILED` false, in builds that skip `.cu` files).
pub mod image {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

pub use calibrate::Calibration;
pub use decide::{Decision, Why};
pub use dispatch::{capture, AllReduce, Options, SymmetricBuffer};
pub use error::{Error, Result};
pub use fallback::Fallback;
pub use path::Path;
pub use table::{Mode, Table};
