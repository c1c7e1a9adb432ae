//! The paths one all-reduce can take: NCCL, or one of this crate's kernels.

use std::fmt;

/// How one all-reduce is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Path {
    /// `ncclAllReduce` (any type, any reduction, any communicator).
    Nccl,
    /// The LL one-shot kernel: no barrier, (data, flag) words pushed into every peer's window;
    /// messages up to [`crate::lsa::LL_MAX_BYTES`].
    Ll,
    /// The one-shot kernel: input staged in the window, one barrier, every peer's input loaded.
    OneShot,
    /// The two-shot kernel: reduce-scatter and all-gather by loads and stores, two barriers.
    TwoShot,
}

impl Path {
    /// Every path.
    pub const ALL: [Path; 4] = [Path::Nccl, Path::Ll, Path::OneShot, Path::TwoShot];

    /// The name tables and command lines use (`nccl`, `ll`, `one-shot`, `two-shot`).
    pub fn name(self) -> &'static str {
        match self {
            Path::Nccl => "nccl",
            Path::Ll => "ll",
            Path::OneShot => "one-shot",
            Path::TwoShot => "two-shot",
        }
    }

    /// The path named `name` ([`Path::name`]).
    pub fn parse(name: &str) -> Option<Path> {
        Path::ALL.into_iter().find(|p| p.name() == name)
    }

    /// True for this crate's kernels (every path but NCCL).
    pub fn is_kernel(self) -> bool {
        self != Path::Nccl
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
