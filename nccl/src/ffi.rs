//! The call machinery: the loaded library and its version, resolving a function, and one NCCL call
//! as one expression ([`call!`], which always checks the result code, and the rare
//! [`call_unchecked!`]), with NCCL's own strings for a failure.
//!
//! The `nvshmem` crate's `ffi` module has the same shape: `lib`, `resolve!`, `call!` (checked),
//! `call_unchecked!` (what C returned), `check`.

use std::ffi::CStr;
use std::sync::atomic::Ordering;

use nccl_sys::{ncclComm_t, ncclResult_t, Version};

use crate::error::{Error, Result, ResultCode};

/// The loaded library, as this crate's error type.
#[inline]
pub(crate) fn lib() -> Result<&'static nccl_sys::Library<nccl_sys::Nccl>> {
    Ok(nccl_sys::library()?)
}

/// The loaded library's version.
pub(crate) fn lib_version() -> Result<Version> {
    Ok(lib()?.version())
}

/// `Ok` when the loaded library is at least `needed`, else [`Error::Unsupported`] naming `what`.
pub(crate) fn require(needed: Version, what: &'static str) -> Result<()> {
    check_version(what, needed, lib_version()?)
}

/// `Ok` when `loaded` is at least `needed`, else [`Error::Unsupported`] naming `what`: what
/// [`require`] checks, for a version given rather than loaded (a config checked against the
/// library it is for).
pub(crate) fn check_version(what: &'static str, needed: Version, loaded: Version) -> Result<()> {
    if loaded >= needed {
        Ok(())
    } else {
        Err(Error::Unsupported { what, needed, loaded })
    }
}

/// Resolves one NCCL function in the loaded library: a missing one is [`Error::MissingFunction`],
/// naming the version that added it.
macro_rules! resolve {
    ($name:ident) => {
        $crate::ffi::lib().and_then(|lib| Ok(*::nccl_sys::function!(lib, $name)?))
    };
}

/// One NCCL call as one expression: resolves the function ([`resolve!`]), calls it, and turns the
/// result code into `Ok` or [`Error::Nccl`] carrying `ncclGetErrorString` and, when `comm = …` names
/// the communicator, `ncclGetLastError`. It must stand inside an `unsafe` block whose `// SAFETY:`
/// comment vouches for the arguments:
///
/// ```ignore
/// // SAFETY: `raw` is a live communicator; the out-pointer is a live local.
/// unsafe { call!(ncclCommCount(raw, &mut n), comm = raw) }?;
/// ```
macro_rules! call {
    ($name:ident($($arg:expr),* $(,)?) $(, comm = $comm:expr)?) => {
        match $crate::ffi::resolve!($name) {
            Ok(f) => $crate::ffi::check(stringify!($name), f($($arg),*), $crate::ffi::call!(@comm $($comm)?)),
            Err(e) => Err(e),
        }
    };
    (@comm $comm:expr) => { Some($comm) };
    (@comm) => { None };
}

/// [`call!`] without the check, for the few calls whose result is not a status to turn into an
/// error: where `ncclInProgress` is an answer (nonblocking communicators; the caller settles the
/// code), and functions that return a value (`ncclTeamWorld`). Resolves the function and calls it,
/// giving what it returned, or the error that the function is missing. Inside an `unsafe` block,
/// like [`call!`].
macro_rules! call_unchecked {
    ($name:ident($($arg:expr),* $(,)?)) => {
        $crate::ffi::resolve!($name).map(|f| f($($arg),*))
    };
}

pub(crate) use {call, call_unchecked, resolve};

/// Turns a result code into `Ok` or a full [`Error::Nccl`] (with NCCL's own strings).
pub(crate) fn check(call: &'static str, rc: ncclResult_t, comm: Option<ncclComm_t>) -> Result<()> {
    if rc == ncclResult_t::ncclSuccess {
        return Ok(());
    }
    let code = ResultCode::from(rc);
    Err(Error::Nccl { call, code, message: code.message(), detail: comm.and_then(last_error) })
}

impl ResultCode {
    /// NCCL's description of this code (`ncclGetErrorString`), or a note saying the library
    /// could not be loaded to ask.
    #[doc(alias = "ncclGetErrorString")]
    pub fn message(self) -> String {
        let Ok(f) = resolve!(ncclGetErrorString) else {
            return String::from("(NCCL library unavailable for the message)");
        };
        // SAFETY: ncclGetErrorString returns a pointer to a static NUL-terminated string for any
        // code, known or not.
        let ptr = unsafe { f(ncclResult_t(self.0)) };
        if ptr.is_null() {
            return String::new();
        }
        // SAFETY: non-null, NUL-terminated, static (see above).
        unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
    }
}

/// The size of NCCL's last-error buffer: `char ncclLastError[1024]` in `src/debug.cc`, the same
/// from 2.18.1 to 2.30.7.
const LAST_ERROR_BYTES: usize = 1024;

/// `ncclGetLastError`: NCCL's last error message, or `None` when there is none or the library
/// cannot be loaded. NCCL keeps one message per process and ignores the communicator argument, so
/// none is passed (after an abort there is none to pass).
///
/// NCCL writes the message (`vsnprintf` into its static buffer) under a mutex of its own that
/// callers cannot take, and `ncclGetLastError` returns the buffer itself. So the message is copied
/// here byte by byte with atomic loads, never through a reference to the buffer (which another
/// thread may be writing), within the buffer's bounds, and read again until two copies agree: a
/// message written concurrently by another thread can still come out mixed, but the copy is always
/// in bounds.
pub(crate) fn last_error(_comm: ncclComm_t) -> Option<String> {
    let f = resolve!(ncclGetLastError).ok()?;
    // SAFETY: NCCL documents the argument as unused ("can be set to NULL"); the call only returns
    // the address of its static buffer.
    let ptr = unsafe { f(std::ptr::null_mut()) };
    if ptr.is_null() {
        return None;
    }
    let copy = || {
        let mut bytes = Vec::new();
        for i in 0..LAST_ERROR_BYTES - 1 {
            // SAFETY: `ptr` is NCCL's static buffer of LAST_ERROR_BYTES bytes, so every offset below
            // the last byte is in bounds and lives as long as the library; `AtomicU8` has the layout
            // of a byte, and an atomic load forms no reference to memory NCCL may be writing.
            let byte = unsafe { (*ptr.add(i).cast::<std::sync::atomic::AtomicU8>()).load(Ordering::Acquire) };
            if byte == 0 {
                break;
            }
            bytes.push(byte);
        }
        bytes
    };
    let mut text = copy();
    for _ in 0..3 {
        let again = copy();
        if again == text {
            break;
        }
        text = again;
    }
    let text = String::from_utf8_lossy(&text).trim().to_string();
    (!text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_come_from_the_library() {
        // Needs the NCCL library (loaded without a GPU), not a device.
        assert!(ResultCode::INVALID_ARGUMENT.message().starts_with("invalid argument"));
        assert_eq!(ResultCode(42).message(), "unknown result code");
        let e = check("ncclAllReduce", ncclResult_t(5), None).unwrap_err();
        assert!(e.to_string().starts_with("ncclAllReduce failed with ncclInvalidUsage(5): invalid usage"), "{e}");
    }

    #[test]
    fn the_last_error_is_copied_out_of_nccls_buffer() {
        // Needs the NCCL library, not a device: destroying a built-in operator makes NCCL WARN,
        // which writes its last-error buffer.
        let destroy = resolve!(ncclRedOpDestroy).unwrap();
        // SAFETY: NCCL refuses a built-in operator before it looks at the (null) communicator.
        let rc = unsafe { destroy(nccl_sys::ncclRedOp_t(0), std::ptr::null_mut()) };
        assert_eq!(ResultCode::from(rc), ResultCode::INVALID_ARGUMENT);
        let text = last_error(std::ptr::null_mut()).expect("NCCL's WARN sets the last error");
        assert_eq!(text, "ncclRedOpDestroy : operator is a NCCL builtin.");
        assert!(text.len() < LAST_ERROR_BYTES);
    }

    #[test]
    fn versions_below_the_needed_one_are_unsupported() {
        let (old, new) = (Version::new(2, 26, 6), Version::new(2, 27, 3));
        check_version("config field CTAPolicy", new, new).unwrap();
        let err = check_version("config field CTAPolicy", new, old).unwrap_err();
        assert!(
            matches!(err, Error::Unsupported { what: "config field CTAPolicy", needed, loaded } if needed == new && loaded == old)
        );
        assert_eq!(err.to_string(), "config field CTAPolicy needs NCCL ≥ 2.27.3, but the loaded library is 2.26.6");
    }
}
