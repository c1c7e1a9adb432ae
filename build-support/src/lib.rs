//! Build and load support for the `nccl-sys` and `nvshmem-sys` crates.
//!
//! * At **build time** (feature `build`): finding the CUDA, NCCL and NVSHMEM installs
//!   ([`locate`]), reading their versions from the headers and turning them into cumulative cfgs
//!   ([`version`], [`emit`]), running bindgen with the family's settings, and compiling `.cu` files
//!   into kernel images embedded in the crate (`build::cu`: plain CUDA, NCCL device API, NVSHMEM;
//!   `build`, behind the `build` feature).
//! * At **run time**: loading `libnccl.so.2` / `libnvshmem_host.so.3` along the same search order,
//!   with reports that list every place tried ([`runtime`]).
//!
//! The search order, every variable and its meaning are documented in [`locate`] and in this
//! crate's README. Nothing here probes GPUs: builds work on machines without one.
#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod cubin;
pub mod emit;
pub mod env;
pub mod locate;
pub mod python;
pub mod runtime;
pub mod version;

#[cfg(feature = "build")]
pub mod build;
