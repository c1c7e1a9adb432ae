//! Why a call went to NCCL, or the kernels are off: [`Fallback`].

use std::fmt;

use nccl::Version;

use crate::path::Path;

/// Why a call went to NCCL although a kernel could have been picked, or why the kernels are off
/// for the whole communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fallback {
    /// The loaded NCCL has no device API (before 2.28.3).
    NoDeviceApi {
        /// The loaded library.
        loaded: Version,
    },
    /// The kernels were compiled against NCCL headers whose device-API structures the loaded
    /// library does not share (2.28.3, 2.28.7 and 2.29.2 changed them; from 2.29.2 the library
    /// must not be older than the headers).
    HeaderMismatch {
        /// The headers the kernels were compiled with.
        header: Version,
        /// The loaded library.
        loaded: Version,
    },
    /// Not every rank can reach every other by loads and stores (ranks on other nodes, or NCCL
    /// talking over the network): the LSA team is smaller than the communicator.
    NotOneLsaTeam {
        /// Ranks in this rank's LSA team.
        lsa: usize,
        /// Ranks in the communicator.
        ranks: usize,
    },
    /// More ranks than the kernels handle (8).
    TooManyRanks {
        /// Ranks in the communicator.
        ranks: usize,
    },
    /// The crate was built without its kernels (`GPUCOMM_SKIP_CU`, docs.rs).
    NotCompiled,
    /// Turned off by [`crate::Options::kernels`].
    Disabled,
    /// Another rank could not use the kernels (every rank then falls back, so that all make the
    /// same calls).
    PeerCannot,
    /// Creating the device communicator or the window failed on this rank
    /// ([`crate::AllReduce::setup_error`] has the error).
    SetupFailed,
    /// The element type has no kernel (f32, bf16 and f16 have).
    UnsupportedType {
        /// The type's name.
        dtype: &'static str,
    },
    /// The kernels only sum.
    UnsupportedOp,
    /// Zero elements.
    Empty,
    /// Larger than the kernel's staging area.
    TooLarge {
        /// The kernel.
        path: Path,
        /// Its limit in bytes.
        max: usize,
    },
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fallback::NoDeviceApi { loaded } => write!(f, "the loaded NCCL {loaded} has no device API (needs ≥ 2.28.3)"),
            Fallback::HeaderMismatch { header, loaded } => write!(
                f,
                "the kernels were compiled against NCCL {header} headers, whose device API the loaded NCCL {loaded} does not share"
            ),
            Fallback::NotOneLsaTeam { lsa, ranks } => write!(
                f,
                "only {lsa} of the {ranks} ranks can reach each other by loads and stores (other nodes, or a network transport)"
            ),
            Fallback::TooManyRanks { ranks } => write!(f, "{ranks} ranks; the kernels handle at most 8"),
            Fallback::NotCompiled => write!(f, "the crate was built without its kernels (GPUCOMM_SKIP_CU or docs.rs)"),
            Fallback::Disabled => write!(f, "turned off in the options"),
            Fallback::PeerCannot => write!(f, "another rank cannot use the kernels"),
            Fallback::SetupFailed => write!(f, "creating the device communicator or the window failed"),
            Fallback::UnsupportedType { dtype } => write!(f, "no kernel for {dtype} (f32, bf16 and f16 only)"),
            Fallback::UnsupportedOp => write!(f, "the kernels only sum"),
            Fallback::Empty => write!(f, "zero elements"),
            Fallback::TooLarge { path, max } => write!(f, "larger than the {path} kernel's {max} bytes"),
        }
    }
}
