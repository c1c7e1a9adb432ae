//! Safe, idiomatic NCCL for Rust, on top of [cudarc] buffers and streams.
//!
//! * [`Comm`]: a communicator, created with [`Comm::init_rank`] (one process or thread per GPU,
//!   all sharing a [`UniqueId`]) or [`Comm::init_all`] (one process driving several GPUs), with
//!   options through a [`Config`] ([`Comm::init_rank_config`]), or from another one
//!   ([`Comm::split`], [`Comm::shrink`]).
//! * Nonblocking communicators and timeouts: a [`Config`] with `blocking(false)` and a
//!   [`timeout`](Config::timeout) turns a peer that never arrives, or dies, into
//!   [`Error::Timeout`] and an aborted communicator; an [`AbortHandle`] lets a watchdog thread
//!   abort one; a [`Watchdog`] thread does it for you, and reports which call hung from its
//!   flight recorder of recent calls; [`Comm::parked`] is how to block on the GPU where it can.
//! * [`BorrowedComm`]: a communicator a framework created and owns, used through this crate's
//!   checked calls and never torn down by it.
//! * [`Collectives`]: every NCCL collective and point-to-point call, written once for every
//!   target — a communicator on its own stream (`comm.all_reduce(..)`), on another stream of its
//!   device (`comm.on(&stream).all_reduce(..)`), or recorded in a [`group`]
//!   (`g.with(&comm).all_reduce(..)`). Every length, root, peer, count and device is checked before
//!   NCCL sees it; buffers are [`DeviceBuffer`]s — cudarc's (`CudaSlice`, views), [`MemBuffer`],
//!   or a framework's own type with an `unsafe impl` [`DeviceMemory`] — taken through the
//!   stream-ordering protocol of `gpucomm-ordering`.
//! * [`capture`]: calls captured into a CUDA [`Graph`] that keeps every buffer, communicator and
//!   operator they use, and whose launches are ordered like calls; calls on a stream captured by
//!   anything else are refused.
//! * [`group`]: several calls issued as one, all or nothing: nothing launches unless every call in
//!   it was accepted, and every buffer stays borrowed until NCCL has enqueued the work.
//!   [`simulate`] asks NCCL for the group's estimated time instead.
//! * [`MemBuffer`]: memory from `ncclMemAlloc`, the recommended buffer type (zero-cost ordering on
//!   one stream, registration- and window-ready); [`Registration`] and [`Window`] make buffers
//!   known to a communicator, for as long as it lives.
//! * [`ReduceOp`] (NCCL's operators) and [`PreMulSum`] (a custom operator tied to its
//!   communicator).
//! * [`Error`]: NCCL's code with `ncclGetErrorString` and `ncclGetLastError`, or a precise
//!   description of the argument that was refused.
//!
//! The library is loaded at run time (see `nccl-sys` for the search order); [`version`] says which
//! one was found. A function the loaded NCCL lacks is an error naming the version that added it.
//!
//! ```no_run
//! use cudarc::driver::CudaContext;
//! use nccl::Collectives; // the communication calls
//!
//! let stream = CudaContext::new(0)?.default_stream();
//! let id = nccl::UniqueId::new()?;
//! let comm = nccl::Comm::init_rank(stream.clone(), &id, 0, 1)?;
//! let send = stream.clone_htod(&[1.0f32, 2.0, 3.0])?;
//! let mut recv = stream.alloc_zeros::<f32>(3)?;
//! comm.all_reduce(&send, &mut recv, nccl::ReduceOp::SUM)?;
//! assert_eq!(stream.clone_dtoh(&recv)?, [1.0, 2.0, 3.0]);
//! comm.finalize().map_err(|(_, e)| e)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod call;
mod coll;
mod comm;
#[cfg(nccl_2_28)]
#[cfg_attr(docsrs, doc(cfg(nccl_2_28)))]
pub mod device;
mod error;
mod ffi;
mod graph;
mod group;
// ncclMemAlloc and ncclCommRegister appeared in NCCL 2.19.
#[cfg(nccl_2_19)]
mod mem;
mod op;
#[cfg(nccl_2_19)]
mod register;
mod target;
mod types;
mod unique_id;
pub mod watchdog;

pub use coll::{Collectives, Root};
pub use comm::{AbortHandle, AbortStatus, BorrowedComm, Comm, Config, Finalizing, PendingComm};
#[cfg(nccl_2_27)]
pub use comm::{CtaPolicy, ShrinkFlags};
pub use error::{Error, Result, ResultCode};
pub use gpucomm_ordering::{Captured, DeviceBuffer, DeviceBufferMut, DeviceMemory, Graph, Keep};
pub use graph::capture;
pub use group::{group, Group, Member};
#[cfg(nccl_2_22)]
pub use group::{simulate, Simulated};
#[cfg(nccl_2_19)]
pub use mem::{MemBuffer, MemView, MemViewMut};
pub use op::{PreMulSum, Reduction};
#[cfg(nccl_2_19)]
pub use register::Registration;
#[cfg(nccl_2_27)]
pub use register::{register_windows, Window, WindowFlags};
pub use target::OnStream;
pub use types::{DataType, NcclType, ReduceOp};
pub use unique_id::UniqueId;
pub use watchdog::Watchdog;

/// `use nccl::prelude::*;` brings the [`Collectives`] trait into scope, whose methods are the
/// communication calls, and the types every call names.
pub mod prelude {
    pub use crate::{Collectives, ReduceOp, Root};
}

/// The raw bindings this crate is built on.
pub use nccl_sys as sys;

/// Starting multi-GPU jobs: rank discovery from launcher variables (torchrun, Slurm, Open MPI,
/// PMI), the rendezvous on a TCPStore (torchrun's agent store, or one rank 0 hosts, wire-compatible
/// with PyTorch's) that hands rank 0's unique id to every rank, and the local spawner
/// (`--nproc N`). Shared with the `nvshmem` crate: one implementation, one set of types.
pub use gpucomm_launch as launch;

pub use nccl_sys::Version;

/// The version of the NCCL library loaded at run time (`ncclGetVersion`); loads it if needed.
#[doc(alias = "ncclGetVersion")]
pub fn version() -> Result<Version> {
    ffi::lib_version()
}

/// The version of the `nccl.h` this crate was compiled against.
pub fn header_version() -> Version {
    // The build script wrote a well-formed version; the fallback never triggers in practice.
    nccl_sys::HEADER_VERSION.parse().unwrap_or(Version::new(0, 0, 0))
}
