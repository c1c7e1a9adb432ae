//! Build-script side (feature `build`): the shared flow of the -sys build scripts, the common
//! bindgen setup, `nvcc` compilation and reading a library's exported symbols.

pub mod exports;
pub mod nvcc;
mod sys;

pub use sys::{bindgen_builder, check_snapshot, Context, SysBuild};
