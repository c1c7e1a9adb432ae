//! Loads the real NCCL library (from the wheels that `./dev.sh setup` installs) and calls the
//! functions that need no GPU.

use nccl_sys::{function, ncclResult_t, ncclUniqueId};
use std::ffi::CStr;

#[test]
fn loads_and_reports_the_header_version() {
    let lib = nccl_sys::library().unwrap_or_else(|e| panic!("{e}"));
    // The pinned wheel and its headers are the same release.
    assert_eq!(lib.version().to_string(), nccl_sys::HEADER_VERSION);
    let mut code = 0;
    // SAFETY: ncclGetVersion writes one int.
    let rc = unsafe { function!(lib, ncclGetVersion).unwrap()(&mut code) };
    assert_eq!(rc, ncclResult_t::ncclSuccess);
    assert_eq!(code as u32, nccl_sys::NCCL_VERSION_CODE);
    println!("loaded NCCL {} ({code}) from {}", lib.version(), lib.path().display());
}

#[test]
fn error_strings_come_from_the_library() {
    let lib = nccl_sys::library().unwrap();
    let get = function!(lib, ncclGetErrorString).unwrap();
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
    let text = unsafe { CStr::from_ptr(get(ncclResult_t::ncclInvalidArgument)) };
    assert_eq!(text.to_str().unwrap(), "invalid argument (run with NCCL_DEBUG=WARN for details)");
}

#[test]
fn unique_ids_need_no_gpu() {
    let lib = nccl_sys::library().unwrap();
    let mut a = ncclUniqueId { internal: [0; 128] };
    let mut b = ncclUniqueId { internal: [0; 128] };
    // SAFETY: ncclGetUniqueId writes one ncclUniqueId through the pointer.
    unsafe {
        assert_eq!(function!(lib, ncclGetUniqueId).unwrap()(&mut a), ncclResult_t::ncclSuccess);
        assert_eq!(function!(lib, ncclGetUniqueId).unwrap()(&mut b), ncclResult_t::ncclSuccess);
    }
    assert_ne!(a.internal, [0; 128]);
    assert_ne!(a.internal, b.internal, "two ids must differ");
}
