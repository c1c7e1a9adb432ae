//! Build-script side (feature `build`): the shared flow of the -sys build scripts, the common
//! bindgen setup, compiling `.cu` files into embedded kernel images ([`cu`], on top of [`nvcc`])
//! and reading a library's exported symbols.

pub mod cu;
mod error;
pub mod exports;
mod flavour;
pub mod nvcc;
mod sys;

pub use sys::{bindgen_builder, check_snapshot, Context, SysBuild};
