//! Safe NVSHMEM for Rust, on top of [cudarc] streams.
//!
//! * [`Runtime`]: the process's PE, started from a [`UniqueId`] that PE 0 created and shared
//!   ([`Runtime::init`], [`Runtime::from_rendezvous`]) or from the bootstrap plugins NVSHMEM ships
//!   for launchers ([`Runtime::with_bootstrap`] with [`Bootstrap::Mpi`] under `mpirun`,
//!   [`Bootstrap::Pmi`]); consumed by [`Runtime::finalize`]. [`Runtime::info`] reports the
//!   library, the specification version, the heap limit and which NCCL NVSHMEM uses.
//! * [`Symmetric`]: a buffer on the symmetric heap of every PE, allocated collectively
//!   ([`Runtime::alloc`], [`Runtime::alloc_zeroed`], [`Runtime::alloc_aligned`]) and freed
//!   collectively ([`Symmetric::free`]). It takes part in cudarc's stream ordering, so cudarc
//!   kernels and copies, NCCL collectives and NVSHMEM operations on different streams are ordered
//!   without explicit synchronisation. Sub-ranges ([`Symmetric::slice`]) and direct views of a
//!   peer's copy ([`Symmetric::peer`], `nvshmem_ptr`) are checked.
//! * One-sided operations on a stream ([`Runtime::put_on_stream`], [`Runtime::get_on_stream`], the
//!   `_nbi` variants, [`Runtime::put_signal_on_stream`], [`Runtime::signal_op_on_stream`],
//!   [`Runtime::signal_wait_until_on_stream`], [`Runtime::quiet_on_stream`],
//!   [`Runtime::barrier_all_on_stream`]).
//! * [`Team`]s ([`Runtime::world`], [`Runtime::shared`], [`Runtime::node`], splits) with barriers
//!   and collectives on a stream: reductions over the (type, [`ops`]) pairs NVSHMEM defines,
//!   broadcast, fcollect, alltoall.
//! * [`capture`]: operations captured into a CUDA [`Graph`] that keeps the runtime, teams,
//!   modules and buffers they use, and whose launches are ordered like calls; operations on a
//!   stream captured by anything else are refused.
//! * [`Registration`] of local device memory for remote transports.
//! * [`Module`]s of kernels that use NVSHMEM device calls, launched plainly or collectively.
//! * [`Error`]: the failing call with its status, or a precise description of the refused
//!   argument. Arguments are checked before C is called.
//!
//! Only the host library (`libnvshmem_host.so.3`) is loaded, at run time; NVSHMEM is started with
//! `nvshmemx_hostlib_init_attr`, because the header-inline `nvshmem_init` family needs NVSHMEM's
//! static device library. Every call that enqueues work binds the PE's CUDA context and checks
//! the stream's device first. NVLink multicast (`nvshmemx_mc_ptr`) is never used.
//!
//! ```no_run
//! use cudarc::driver::CudaContext;
//!
//! // A one-PE job: PE 0 makes the id and there is nobody to send it to.
//! let stream = CudaContext::new(0)?.default_stream();
//! let rt = nvshmem::Runtime::init(stream.clone(), &nvshmem::UniqueId::new()?, 0, 1)?;
//! let buf = rt.alloc::<i32>(4)?;
//! let src = stream.clone_htod(&[1, 2, 3, 4])?;
//! rt.put_on_stream(&buf, &src, 0, &stream)?;
//! rt.barrier_all_on_stream(&stream)?;
//! assert_eq!(stream.clone_dtoh(&buf)?, [1, 2, 3, 4]);
//! buf.free().map_err(|(_, e)| e)?;
//! rt.finalize().map_err(|(_, e)| e)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod agree;
mod bootstrap;
mod config;
mod error;
mod ffi;
mod graph;
mod heap;
mod lifecycle;
mod module;
mod nccl;
pub mod ops;
mod overlap;
mod quiesce;
mod register;
mod rma;
mod runtime;
mod team;
mod unique_id;

pub use bootstrap::Bootstrap;
pub use build_support::cubin::cubin_arch;
pub use error::{Error, Result, Status};
pub use gpucomm_ordering::{Captured, DeviceBuffer, DeviceBufferMut, DeviceMemory, Graph, Keep};
pub use graph::capture;
pub use heap::{Element, HeapLimit, PeerView, Symmetric, SymmetricMemory, SymmetricSlice};
pub use module::{Kernel, KernelArgs, Module};
pub use nccl::NcclUse;
pub use register::Registration;
pub use rma::{Cmp, Pending, SignalOp};
pub use runtime::{init_status, Info, InitStatus, Runtime};
pub use team::Team;
pub use unique_id::UniqueId;

/// The raw bindings this crate is built on.
pub use nvshmem_sys as sys;

/// Starting multi-GPU jobs: rank discovery from launcher variables (torchrun, Slurm, Open MPI,
/// PMI), the rendezvous on a TCPStore (torchrun's agent store, or one PE 0 hosts, wire-compatible
/// with PyTorch's) that hands PE 0's unique id to every PE, and the local spawner
/// (`--nproc N`). Shared with the `nccl` crate: one implementation, one set of types.
pub use gpucomm_launch as launch;

pub use nvshmem_sys::Version;

/// The version of the NVSHMEM library loaded at run time (`nvshmemx_vendor_get_version_info`);
/// loads it if needed. Needs no GPU and no initialisation.
#[doc(alias = "nvshmemx_vendor_get_version_info")]
pub fn version() -> Result<Version> {
    ffi::lib_version()
}

/// The vendor version of the NVSHMEM headers this crate was compiled against.
pub fn header_version() -> Version {
    nvshmem_sys::HEADER_VERSION.parse().unwrap_or(Version::new(0, 0, 0))
}
