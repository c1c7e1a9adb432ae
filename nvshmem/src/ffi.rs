//! The call machinery: the loaded library and its version, resolving a function, and one NVSHMEM
//! call as one expression ([`call!`], which always checks a returned status, and the rare
//! [`call_unchecked!`]).
//!
//! The `nccl` crate's `ffi` module has the same shape: `lib`, `resolve!`, `call!` (checked),
//! `call_unchecked!` (what C returned), `check`.

use std::ffi::c_int;

use nvshmem_sys::Version;

use crate::error::{Error, Result, Status};

/// The loaded library, as this crate's error type.
#[inline]
pub(crate) fn lib() -> Result<&'static nvshmem_sys::Library<nvshmem_sys::Nvshmem>> {
    Ok(nvshmem_sys::library()?)
}

/// The loaded library's version.
pub(crate) fn lib_version() -> Result<Version> {
    Ok(lib()?.version())
}

/// Resolves one NVSHMEM function in the loaded library: a missing one is
/// [`Error::MissingFunction`], naming the version that added it.
macro_rules! resolve {
    ($name:ident) => {
        $crate::ffi::lib().and_then(|lib| Ok(*lib.resolve(&lib.$name, stringify!($name))?))
    };
}

/// One NVSHMEM call as one expression: resolves the function ([`resolve!`]), calls it, and turns
/// what it returns into a [`Result`] ([`Returned`]): a status (`int`) is checked — `Ok(())` for
/// `NVSHMEMX_SUCCESS`, [`Error::Status`] naming the function otherwise — and so cannot be
/// forgotten; a `void` function gives `Ok(())`, a pointer `Ok(pointer)`. Functions whose `int` is
/// a value rather than a status (`nvshmem_my_pe`) are called with [`call_unchecked!`].
///
/// It must stand inside an `unsafe` block whose `// SAFETY:` comment vouches for the arguments:
///
/// ```ignore
/// // SAFETY: NVSHMEM is initialised; `ptr` came from nvshmem_malloc and nothing uses it any more.
/// unsafe { call!(nvshmem_free(ptr)) }?;
/// ```
macro_rules! call {
    ($name:ident($($arg:expr),* $(,)?)) => {
        match $crate::ffi::resolve!($name) {
            Ok(f) => $crate::ffi::Returned::checked(f($($arg),*), stringify!($name)),
            Err(e) => Err(e),
        }
    };
}

/// [`call!`] without the check, for the few functions whose `int` is a value, not a status
/// (`nvshmem_my_pe`, `nvshmem_team_translate_pe`, `nvshmemx_init_status`): resolves the function
/// and calls it, giving what it returned, or the error that the function is missing. Inside an
/// `unsafe` block, like [`call!`].
macro_rules! call_unchecked {
    ($name:ident($($arg:expr),* $(,)?)) => {
        $crate::ffi::resolve!($name).map(|f| f($($arg),*))
    };
}

pub(crate) use {call, call_unchecked, resolve};

/// What an NVSHMEM function returns, as [`call!`] hands it back.
pub(crate) trait Returned {
    /// What the call gives on success.
    type Value;
    /// The result of a call to `call` that returned `self`.
    fn checked(self, call: &'static str) -> Result<Self::Value>;
}

/// An `nvshmemx_status`: checked.
impl Returned for c_int {
    type Value = ();
    fn checked(self, call: &'static str) -> Result<()> {
        check(call, self)
    }
}

/// A `void` function: nothing to check.
impl Returned for () {
    type Value = ();
    fn checked(self, _call: &'static str) -> Result<()> {
        Ok(())
    }
}

/// A pointer (an allocation, a peer's address): handed back for the caller to check for null,
/// which means something different for each function.
impl<T> Returned for *mut T {
    type Value = *mut T;
    fn checked(self, _call: &'static str) -> Result<*mut T> {
        Ok(self)
    }
}

/// `Ok` for `NVSHMEMX_SUCCESS`, else [`Error::Status`].
pub(crate) fn check(call: &'static str, status: c_int) -> Result<()> {
    if status == Status::SUCCESS.0 {
        Ok(())
    } else {
        Err(Error::Status { call, status: Status(status) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_checked_and_name_the_call() {
        let e = check("nvshmemx_hostlib_init_attr", 7).unwrap_err();
        assert_eq!(
            e.to_string(),
            "nvshmemx_hostlib_init_attr failed with NVSHMEMX_ERROR_INTERNAL(7) (set NVSHMEM_DEBUG=WARN for NVSHMEM's explanation)"
        );
        assert!(check("x", 0).is_ok());
        // What `call!` does with each kind of return.
        assert!(matches!(Returned::checked(7 as c_int, "f"), Err(Error::Status { call: "f", status: Status(7) })));
        assert!(Returned::checked((), "f").is_ok());
        let p = std::ptr::NonNull::<u8>::dangling().as_ptr();
        assert_eq!(Returned::checked(p, "f").unwrap(), p);
    }
}
