//! Rust equivalents of NVSHMEM's initializer macros, which bindgen cannot translate.
//!
//! Each versioned struct starts with a version word `(N << 16) + sizeof(struct)`, where `N` is the
//! `_vN` suffix of the struct the header's typedef names (read from the headers at build time into
//! the `*_STRUCT_VERSION` constants). `nvshmemx_hostlib_init_attr` does not fill these words itself
//! (only the header-inline `nvshmemx_init_attr` does), so they must be right here. A test compiles
//! the C macros and compares every field.

use std::mem::size_of;

use crate::{
    nvshmemx_init_args_t, nvshmemx_init_attr_t, nvshmemx_uniqueid_args_t, nvshmemx_uniqueid_t,
    NVSHMEMX_INIT_ARGS_STRUCT_VERSION, NVSHMEMX_INIT_ATTR_STRUCT_VERSION, NVSHMEMX_UNIQUEID_ARGS_STRUCT_VERSION,
    NVSHMEMX_UNIQUEID_STRUCT_VERSION, UNIQUEID_ARGS_INVALID,
};

/// `(major << 16) + size`, NVSHMEM's version word.
const fn version_word(major: i32, size: usize) -> i32 {
    (major << 16) + size as i32
}

impl nvshmemx_uniqueid_t {
    /// `NVSHMEMX_UNIQUEID_INITIALIZER`: the version word, zeroed contents.
    #[doc(alias = "NVSHMEMX_UNIQUEID_INITIALIZER")]
    pub fn initializer() -> Self {
        Self { version: version_word(NVSHMEMX_UNIQUEID_STRUCT_VERSION, size_of::<Self>()), ..Default::default() }
    }
}

impl nvshmemx_uniqueid_args_t {
    /// `NVSHMEMX_UNIQUEID_ARGS_INITIALIZER`: no id, rank and size invalid (-1).
    #[doc(alias = "NVSHMEMX_UNIQUEID_ARGS_INITIALIZER")]
    pub fn initializer() -> Self {
        Self {
            version: version_word(NVSHMEMX_UNIQUEID_ARGS_STRUCT_VERSION, size_of::<Self>()),
            id: std::ptr::null_mut(),
            myrank: UNIQUEID_ARGS_INVALID,
            nranks: UNIQUEID_ARGS_INVALID,
        }
    }
}

impl nvshmemx_init_args_t {
    /// `NVSHMEMX_INIT_ARGS_INITIALIZER`.
    #[doc(alias = "NVSHMEMX_INIT_ARGS_INITIALIZER")]
    pub fn initializer() -> Self {
        #[allow(unused_mut)]
        let mut args = Self {
            version: version_word(NVSHMEMX_INIT_ARGS_STRUCT_VERSION, size_of::<Self>()),
            uid_args: nvshmemx_uniqueid_args_t::initializer(),
            ..Default::default()
        };
        // Version 2 of the arguments (NVSHMEM 3.8) adds the device to use; -1 means "current".
        #[cfg(nvshmem_init_args_v2)]
        {
            args.cuda_device_id = -1;
        }
        args
    }
}

impl nvshmemx_init_attr_t {
    /// `NVSHMEMX_INIT_ATTR_INITIALIZER`: no MPI communicator, default arguments.
    #[doc(alias = "NVSHMEMX_INIT_ATTR_INITIALIZER")]
    pub fn initializer() -> Self {
        Self {
            version: version_word(NVSHMEMX_INIT_ATTR_STRUCT_VERSION, size_of::<Self>()),
            mpi_comm: std::ptr::null_mut(),
            args: nvshmemx_init_args_t::initializer(),
        }
    }
}
