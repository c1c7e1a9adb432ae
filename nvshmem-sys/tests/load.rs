//! Loads the real NVSHMEM host library (from the wheels that `./dev.sh setup` installs) and calls
//! the functions that need no GPU.

use nvshmem_sys::{function, nvshmemx_status, nvshmemx_uniqueid_t};
use std::ffi::CStr;

#[test]
fn loads_and_reports_the_header_version() {
    let lib = nvshmem_sys::library().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lib.version().to_string(), nvshmem_sys::HEADER_VERSION);
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvshmem_info_get_version writes two ints; it needs no initialisation.
    unsafe { function!(lib, nvshmem_info_get_version).unwrap()(&mut major, &mut minor) };
    // The OpenSHMEM specification version this NVSHMEM implements.
    assert_eq!((major, minor), (nvshmem_sys::NVSHMEM_MAJOR_VERSION as i32, nvshmem_sys::NVSHMEM_MINOR_VERSION as i32));
    let mut name = [0 as std::os::raw::c_char; 256];
    // SAFETY: nvshmem_info_get_name writes at most NVSHMEM_MAX_NAME_LEN (256) bytes, NUL included.
    unsafe { function!(lib, nvshmem_info_get_name).unwrap()(name.as_mut_ptr()) };
    // SAFETY: the buffer is NUL-terminated by the call above.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_str().unwrap();
    assert_eq!(name, format!("NVSHMEM v{}", nvshmem_sys::HEADER_VERSION));
    println!("loaded {name} (spec {major}.{minor}) from {}", lib.path().display());
}

#[test]
fn unique_ids_need_no_gpu() {
    let lib = nvshmem_sys::library().unwrap();
    let get = function!(lib, nvshmemx_get_uniqueid).unwrap();
    let mut a = nvshmemx_uniqueid_t::initializer();
    let mut b = nvshmemx_uniqueid_t::initializer();
    // SAFETY: nvshmemx_get_uniqueid fills one initialised id.
    unsafe {
        assert_eq!(get(&mut a), nvshmemx_status::NVSHMEMX_SUCCESS.0 as i32);
        assert_eq!(get(&mut b), nvshmemx_status::NVSHMEMX_SUCCESS.0 as i32);
    }
    assert_eq!(a.version, nvshmemx_uniqueid_t::initializer().version, "the version word is kept");
    assert_ne!(a.internal, [0; 124]);
    assert_ne!(a.internal, b.internal, "two ids must differ");
}

#[test]
fn host_only_entry_points_are_bound_and_inline_ones_are_not() {
    let lib = nvshmem_sys::library().unwrap();
    assert!(function!(lib, nvshmemx_hostlib_init_attr).is_ok());
    assert!(function!(lib, nvshmemx_hostlib_finalize).is_ok());
    assert!(function!(lib, nvshmemx_putmem_on_stream).is_ok());
    // nvshmem_init / nvshmemx_init_attr / nvshmem_finalize are header-inline: no field exists for
    // them, which this file would fail to compile against if they were bound.
}
