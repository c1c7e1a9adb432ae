//! The crate's error type, and NVSHMEM status codes as a newtype.

use std::fmt;

/// An NVSHMEM status (`nvshmemx_status`), kept as the raw number so that codes a newer library
/// returns still fit.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[doc(alias = "nvshmemx_status")]
pub struct Status(pub i32);

impl Status {
    /// `NVSHMEMX_SUCCESS`.
    pub const SUCCESS: Self = Self(0);

    /// The C name, or `None` for a code this crate does not know.
    pub fn name(self) -> Option<&'static str> {
        const NAMES: [&str; 8] = [
            "NVSHMEMX_SUCCESS",
            "NVSHMEMX_ERROR_INVALID_VALUE",
            "NVSHMEMX_ERROR_OUT_OF_MEMORY",
            "NVSHMEMX_ERROR_NOT_SUPPORTED",
            "NVSHMEMX_ERROR_SYMMETRY",
            "NVSHMEMX_ERROR_GPU_NOT_SELECTED",
            "NVSHMEMX_ERROR_COLLECTIVE_LAUNCH_FAILED",
            "NVSHMEMX_ERROR_INTERNAL",
        ];
        usize::try_from(self.0).ok().and_then(|i| NAMES.get(i)).copied()
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}({})", self.0),
            None => write!(f, "Status({})", self.0),
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An NVSHMEM call returned a failure status. NVSHMEM has no error-string API; set
    /// `NVSHMEM_DEBUG=WARN` (or `INFO`) for its own explanation on stderr.
    #[error("{call} failed with {status} (set NVSHMEM_DEBUG=WARN for NVSHMEM's explanation)")]
    Status {
        /// The C function.
        call: &'static str,
        /// The status it returned.
        status: Status,
    },
    /// The NVSHMEM library could not be loaded (the message lists every place tried).
    #[error(transparent)]
    Load(Box<nvshmem_sys::LoadError>),
    /// The loaded NVSHMEM lacks a function (the message names the version that added it).
    #[error(transparent)]
    MissingFunction(#[from] nvshmem_sys::MissingFunction),
    /// A CUDA driver call failed.
    #[error("CUDA driver error: {0}")]
    Cuda(#[from] cudarc::driver::DriverError),
    /// The symmetric heap could not provide the allocation.
    #[error("nvshmem_malloc of {bytes} bytes failed (heap exhausted? raise NVSHMEM_SYMMETRIC_SIZE)")]
    OutOfMemory {
        /// Bytes requested.
        bytes: usize,
    },
    /// A PE (processing element) outside `0..n_pes`.
    #[error("{what} {pe} is out of range for {n_pes} PEs")]
    InvalidPe {
        /// Which PE argument.
        what: &'static str,
        /// The PE given.
        pe: usize,
        /// Number of PEs.
        n_pes: usize,
    },
    /// A transfer that does not fit its buffers.
    #[error("{what}: {got} elements do not fit {available} available")]
    OutOfBounds {
        /// Which transfer.
        what: &'static str,
        /// Elements requested.
        got: usize,
        /// Elements available.
        available: usize,
    },
    /// A buffer or stream on another device than the PE's.
    #[error("{what} is on CUDA device {got} but this PE uses device {expected}")]
    WrongDevice {
        /// Which argument.
        what: &'static str,
        /// The PE's device.
        expected: usize,
        /// The argument's device.
        got: usize,
    },
    /// NVSHMEM is already initialised in this process, or was finalised and cannot start again.
    #[error("{0}")]
    Runtime(&'static str),
    /// Exchanging the unique id with the other PEs failed.
    #[error(transparent)]
    Rendezvous(Box<crate::launch::RendezvousError>),
    /// Any other invalid argument, described.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl From<nvshmem_sys::LoadError> for Error {
    fn from(e: nvshmem_sys::LoadError) -> Self {
        Error::Load(Box::new(e))
    }
}

impl From<crate::launch::RendezvousError> for Error {
    fn from(e: crate::launch::RendezvousError) -> Self {
        Error::Rendezvous(Box::new(e))
    }
}

/// Shorthand for this crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The loaded library, as this crate's error type.
pub(crate) fn lib() -> Result<&'static nvshmem_sys::Library<nvshmem_sys::Nvshmem>> {
    Ok(nvshmem_sys::library()?)
}

/// `Ok` for `NVSHMEMX_SUCCESS`, else [`Error::Status`].
pub(crate) fn check(call: &'static str, status: i32) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(Error::Status { call, status: Status(status) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_have_names_and_messages() {
        assert_eq!(Status(7).to_string(), "NVSHMEMX_ERROR_INTERNAL(7)");
        assert_eq!(Status(-3).to_string(), "Status(-3)");
        let e = check("nvshmemx_hostlib_init_attr", 7).unwrap_err();
        assert_eq!(
            e.to_string(),
            "nvshmemx_hostlib_init_attr failed with NVSHMEMX_ERROR_INTERNAL(7) (set NVSHMEM_DEBUG=WARN for NVSHMEM's explanation)"
        );
        assert!(check("x", 0).is_ok());
    }
}
