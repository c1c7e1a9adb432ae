//! Safe NVSHMEM for Rust, on top of [cudarc] streams.
//!
//! * [`Runtime`]: the process's PE, started with [`Runtime::init`] from a [`UniqueId`] that PE 0
//!   created and shared (by [`launch::Rendezvous`](crate::launch), MPI, a file, …); consumed by
//!   [`Runtime::finalize`].
//! * [`Symmetric`]: a buffer on the symmetric heap of every PE, allocated collectively with
//!   [`Runtime::alloc`], freed collectively with [`Symmetric::free`], borrowed from the runtime so
//!   it cannot outlive NVSHMEM. Puts and gets to other PEs are stream-ordered and bounds-checked.
//! * [`Error`]: the failing call with its status, or a precise description of the refused argument.
//!
//! Only the host library (`libnvshmem_host.so.3`) is loaded, at run time; NVSHMEM is started with
//! `nvshmemx_hostlib_init_attr`, because the header-inline `nvshmem_init` family needs NVSHMEM's
//! static device library. NVLink multicast (`nvshmemx_mc_ptr`) is never used.
//!
//! ```no_run
//! use cudarc::driver::CudaContext;
//!
//! // A one-PE job: PE 0 makes the id and there is nobody to send it to.
//! let stream = CudaContext::new(0)?.default_stream();
//! let rt = nvshmem::Runtime::init(stream.clone(), &nvshmem::UniqueId::new()?, 0, 1)?;
//! let buf = rt.alloc::<i32>(4)?;
//! let src = stream.clone_htod(&[1, 2, 3, 4])?;
//! buf.put_on_stream(0, &src, 0, &stream)?;
//! rt.barrier_all_on_stream(&stream)?;
//! assert_eq!(stream.clone_dtoh(&buf)?, [1, 2, 3, 4]);
//! buf.free()?;
//! rt.finalize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod heap;
mod runtime;
mod unique_id;

pub use error::{Error, Result, Status};
pub use heap::Symmetric;
pub use runtime::Runtime;
pub use unique_id::UniqueId;

/// The raw bindings this crate is built on.
pub use nvshmem_sys as sys;

/// Starting multi-GPU jobs: rank discovery from launcher variables (torchrun, Slurm, Open MPI,
/// PMI), the TCP rendezvous that hands PE 0's unique id to every PE, and the local spawner
/// (`--nproc N`). Shared with the `nccl` crate: one implementation, one set of types.
pub use gpucomm_launch as launch;

pub use nvshmem_sys::Version;

/// The version of the NVSHMEM library loaded at run time (`nvshmemx_vendor_get_version_info`);
/// loads it if needed. Needs no GPU and no initialisation.
#[doc(alias = "nvshmemx_vendor_get_version_info")]
pub fn version() -> Result<Version> {
    Ok(error::lib()?.version())
}

/// The vendor version of the NVSHMEM headers this crate was compiled against.
pub fn header_version() -> Version {
    nvshmem_sys::HEADER_VERSION.parse().unwrap_or(Version::new(0, 0, 0))
}
