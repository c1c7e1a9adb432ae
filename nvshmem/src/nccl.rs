//! The NCCL that NVSHMEM uses for its own collectives.
//!
//! NVSHMEM's host library opens `libnccl.so.2` by its soname during initialisation. Left alone,
//! the dynamic loader resolves that through `LD_LIBRARY_PATH` and the ldconfig cache, which can
//! find another NCCL than the one the `nccl` crate loads (on a machine with a system NCCL and a
//! pip wheel, the two end up in one process). Before initialising, this crate therefore loads the
//! NCCL that `nccl-sys` would load, along the same search (`NCCL_SYS_LIBRARY`, `NCCL_LIB_DIR`,
//! `NCCL_HOME`, the directory the build found, `GPUCOMM_PREFIX`, the soname, `python3`'s wheels):
//! glibc matches an already loaded object by its `SONAME`, so NVSHMEM's `dlopen` returns that copy.
//! With `NVSHMEM_DISABLE_NCCL` set nothing is loaded.

use std::ffi::{c_int, c_void, CStr};
use std::path::PathBuf;

use build_support::locate::NCCL;
use build_support::runtime::preload;
use build_support::version::NCCL_SUPPORT;
use nvshmem_sys::Version;

use crate::config;

/// The soname NVSHMEM opens.
const SONAME: &str = "libnccl.so.2";

/// The directory where the build found NCCL (as `nccl-sys`'s build would have), from build.rs.
const BUILD_LIB_DIR: &str = env!("NVSHMEM_NCCL_BUILD_LIB_DIR");

/// Which NCCL NVSHMEM uses for its collectives, as found after initialisation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NcclUse {
    /// `NVSHMEM_DISABLE_NCCL` is set: NVSHMEM uses its own collective kernels, and this crate
    /// loaded nothing.
    Disabled,
    /// The process has this `libnccl.so.2` loaded: it is the one NVSHMEM's `dlopen` returns.
    Loaded {
        /// The file the loaded object came from.
        path: PathBuf,
        /// What its `ncclGetVersion` reports.
        version: Version,
    },
    /// No NCCL is loaded, so NVSHMEM uses its own collective kernels.
    Missing {
        /// Why the search found none (the first line of its report).
        reason: String,
    },
}

impl std::fmt::Display for NcclUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NcclUse::Disabled => write!(f, "none (NVSHMEM_DISABLE_NCCL is set)"),
            NcclUse::Loaded { path, version } => write!(f, "NCCL {version} from {}", path.display()),
            NcclUse::Missing { reason } => write!(f, "none ({reason})"),
        }
    }
}

/// True when NVSHMEM is told not to use NCCL.
pub(crate) fn disabled() -> bool {
    config::flag("NVSHMEM_DISABLE_NCCL")
}

/// Loads the NCCL the `nccl` crate would load, for the rest of the process. `Err` summarises the
/// search: how many places were tried, and why the last one failed.
pub(crate) fn preload_for_nvshmem() -> Result<(), String> {
    let build_dir = (!BUILD_LIB_DIR.is_empty()).then(|| std::path::Path::new(BUILD_LIB_DIR));
    // SAFETY: NCCL's initialisers only set up internal state and may run on any thread;
    // `version_of` calls nothing but ncclGetVersion.
    match unsafe { preload(&NCCL, build_dir, NCCL_SUPPORT.min, version_of) } {
        Ok(_) => Ok(()),
        Err(e) => Err(match e.attempts.last() {
            Some(last) => format!(
                "no usable NCCL: {} places tried, the last {} ({}): {}",
                e.attempts.len(),
                last.path.display(),
                last.place,
                last.error
            ),
            None => "no usable NCCL: nothing to try".to_string(),
        }),
    }
}

/// The NCCL version an open library reports.
///
/// # Safety
///
/// `lib` must be a library whose `ncclGetVersion`, if it has one, has NCCL's signature.
unsafe fn version_of(lib: &libloading::Library) -> Result<Version, String> {
    // SAFETY: the signature is NCCL's `ncclResult_t ncclGetVersion(int *)` (the caller's contract).
    let get = unsafe { lib.get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"ncclGetVersion\0") }
        .map_err(|e| format!("not an NCCL library (no ncclGetVersion: {e})"))?;
    let mut code = 0;
    // SAFETY: writes one int through a pointer to a live local.
    let rc = unsafe { get(&mut code) };
    if rc != 0 {
        return Err(format!("ncclGetVersion returned {rc}"));
    }
    Version::from_nccl_code(code.into()).ok_or_else(|| format!("ncclGetVersion gave an invalid version {code}"))
}

/// The `libnccl.so.2` loaded in this process, if any: the object that `dlopen("libnccl.so.2")`
/// returns, which is what NVSHMEM received. Loads nothing (`RTLD_NOLOAD`).
pub(crate) fn in_process() -> Option<(PathBuf, Version)> {
    // SAFETY: with RTLD_NOLOAD nothing new is loaded, so no initialiser runs; the handle only
    // raises the reference count of an object already in the process, and drops it again.
    let lib = unsafe { libloading::os::unix::Library::open(Some(SONAME), libc::RTLD_LAZY | libc::RTLD_NOLOAD) }.ok()?;
    let lib = libloading::Library::from(lib);
    // SAFETY: the object answers to NCCL's soname, so its ncclGetVersion has NCCL's signature.
    let version = unsafe { version_of(&lib) }.ok()?;
    // SAFETY: as above; the symbol is only used for its address.
    let symbol = unsafe { lib.get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"ncclGetVersion\0") }.ok()?;
    Some((object_path(*symbol as *const c_void)?, version))
}

/// The file of the loaded object that contains `address` (`dladdr`).
pub(crate) fn object_path(address: *const c_void) -> Option<PathBuf> {
    // SAFETY: an all-zero Dl_info is a valid value (null pointers), which dladdr overwrites.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address and writes `info`; it accepts any address.
    if unsafe { libc::dladdr(address, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated, owned by the loader for as long as the object is loaded.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(name.to_string_lossy().into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The preload makes `libnccl.so.2` — the name NVSHMEM opens — resolve to the library the
    /// search chose (here the project's wheel through `GPUCOMM_PREFIX`, which `cargo test` sets),
    /// whatever the dynamic loader's own search would have found. Needs no GPU.
    #[test]
    fn the_soname_resolves_to_the_preloaded_nccl() {
        if let Err(why) = preload_for_nvshmem() {
            eprintln!("no NCCL to preload here ({why}); nothing to check");
            return;
        }
        let (path, version) = in_process().expect("the preloaded NCCL answers to libnccl.so.2");
        assert!(version >= NCCL_SUPPORT.min, "{version}");
        assert!(path.ends_with("libnccl.so.2"), "{}", path.display());
        if let Some(prefix) = std::env::var_os("GPUCOMM_PREFIX") {
            let prefix = std::path::Path::new(&prefix).canonicalize().unwrap();
            assert!(
                path.canonicalize().unwrap().starts_with(&prefix),
                "{} is not under {}",
                path.display(),
                prefix.display()
            );
        }
        let shown = NcclUse::Loaded { path: path.clone(), version }.to_string();
        assert_eq!(shown, format!("NCCL {version} from {}", path.display()));
    }
}
