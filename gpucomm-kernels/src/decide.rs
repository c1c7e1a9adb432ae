//! Which path one call takes, and why: the dispatcher's decision as a pure function of what the
//! kernels can do here, the crossover table and the call (CPU-tested).

use std::fmt;

use crate::error::{Error, Result};
use crate::fallback::Fallback;
use crate::path::Path;
use crate::table::{Mode, Table};

/// Why a call took its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The crossover table.
    Table,
    /// Forced ([`crate::AllReduce::force`]).
    Forced,
    /// NCCL, because the kernels could not take the call.
    Fallback(Fallback),
}

/// The path of one call, and why ([`crate::AllReduce::last`], and what every call returns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The path taken.
    pub path: Path,
    /// Why.
    pub why: Why,
    /// The table section that was consulted.
    pub mode: Mode,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.why {
            Why::Table => write!(f, "{} (crossover table, {})", self.path, self.mode.name()),
            Why::Forced => write!(f, "{} (forced)", self.path),
            Why::Fallback(why) => write!(f, "{} (fallback: {why})", self.path),
        }
    }
}

/// What the kernels can take on this communicator: their size limits, or why none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Largest LL message in bytes.
    pub ll: usize,
    /// Largest one-shot message in bytes (0: none).
    pub one_shot: usize,
    /// Whether the two-shot kernel can run (any size: larger messages go in several launches).
    pub two_shot: bool,
}

impl Limits {
    /// Why `path` cannot take `bytes`, if it cannot.
    fn refuses(&self, path: Path, bytes: usize) -> Option<Fallback> {
        let too_large = |max: usize| (bytes > max).then_some(Fallback::TooLarge { path, max });
        match path {
            Path::Nccl => None,
            Path::Ll => too_large(self.ll),
            Path::OneShot => too_large(self.one_shot),
            Path::TwoShot => (!self.two_shot).then_some(Fallback::TooLarge { path, max: 0 }),
        }
    }
}

/// One call as the decision sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    /// Bytes per rank.
    pub bytes: usize,
    /// The element type's name when it has no kernel.
    pub unsupported_type: Option<&'static str>,
    /// Whether the reduction is a sum.
    pub sum: bool,
    /// Eager or captured.
    pub mode: Mode,
}

/// The path of `call`: forced, or from `table`, moved to a larger kernel (LL → one-shot →
/// two-shot) where the chosen one's staging area is too small, and to NCCL where no kernel can
/// take it. A forced path that cannot take the call is an error.
pub(crate) fn decide(
    kernels: Result<Limits, Fallback>,
    table: &Table,
    force: Option<Path>,
    call: Call,
) -> Result<Decision> {
    let Call { bytes, unsupported_type, sum, mode } = call;
    let nccl = |why| Decision { path: Path::Nccl, why: Why::Fallback(why), mode };
    // What keeps every kernel from this call, before any table or forcing.
    let blocked = match kernels {
        Err(why) => Some(why),
        Ok(_) if bytes == 0 => Some(Fallback::Empty),
        Ok(_) => match (unsupported_type, sum) {
            (Some(dtype), _) => Some(Fallback::UnsupportedType { dtype }),
            (None, false) => Some(Fallback::UnsupportedOp),
            (None, true) => None,
        },
    };
    if let Some(path) = force {
        if path == Path::Nccl {
            return Ok(Decision { path, why: Why::Forced, mode });
        }
        if let Some(why) = blocked {
            return Err(Error::Forced { path, why });
        }
        let limits = kernels.map_err(Error::Unavailable)?;
        return match limits.refuses(path, bytes) {
            Some(why) => Err(Error::Forced { path, why }),
            None => Ok(Decision { path, why: Why::Forced, mode }),
        };
    }
    if let Some(why) = blocked {
        return Ok(nccl(why));
    }
    let limits = kernels.map_err(Error::Unavailable)?;
    let chosen = table.choose(bytes as u64, mode);
    let order = [Path::Ll, Path::OneShot, Path::TwoShot];
    let start = order.iter().position(|&p| p == chosen);
    let Some(start) = start else { return Ok(Decision { path: Path::Nccl, why: Why::Table, mode }) };
    let mut refused = None;
    for &path in &order[start..] {
        match limits.refuses(path, bytes) {
            None => return Ok(Decision { path, why: Why::Table, mode }),
            Some(why) => refused = refused.or(Some(why)),
        }
    }
    Ok(nccl(refused.unwrap_or(Fallback::TooLarge { path: chosen, max: 0 })))
}

#[cfg(test)]
mod tests {
    use nccl::Version;

    use super::*;

    const LIMITS: Limits = Limits { ll: 64 << 10, one_shot: 512 << 10, two_shot: true };

    fn table() -> Table {
        Table::parse("[eager]\nll <= 64K\none-shot <= 512K\ntwo-shot <= 32M\nnccl\n[graph]\nll <= 256K\nnccl\n")
            .unwrap()
    }

    fn call(bytes: usize) -> Call {
        Call { bytes, unsupported_type: None, sum: true, mode: Mode::Eager }
    }

    fn path(kernels: Result<Limits, Fallback>, force: Option<Path>, c: Call) -> Path {
        decide(kernels, &table(), force, c).unwrap().path
    }

    #[test]
    fn the_table_picks_by_size_and_mode() {
        let sizes = [8, 64 << 10, (64 << 10) + 4, 512 << 10, 1 << 20, 32 << 20, (32 << 20) + 4];
        let got: Vec<Path> = sizes.iter().map(|&b| path(Ok(LIMITS), None, call(b))).collect();
        assert_eq!(got, [Path::Ll, Path::Ll, Path::OneShot, Path::OneShot, Path::TwoShot, Path::TwoShot, Path::Nccl]);
        let d = decide(Ok(LIMITS), &table(), None, call(8)).unwrap();
        assert_eq!(d, Decision { path: Path::Ll, why: Why::Table, mode: Mode::Eager });
        assert_eq!(d.to_string(), "ll (crossover table, eager)");
    }

    #[test]
    fn a_kernel_too_small_for_the_message_hands_it_to_the_next() {
        // The graph section asks for LL up to 256 KiB, but LL holds 64 KiB: one-shot takes the rest.
        let c = Call { mode: Mode::Graph, ..call(128 << 10) };
        assert_eq!(path(Ok(LIMITS), None, c), Path::OneShot);
        let small = Limits { ll: 64 << 10, one_shot: 0, two_shot: true };
        assert_eq!(path(Ok(small), None, c), Path::TwoShot);
        let none = Limits { ll: 64 << 10, one_shot: 0, two_shot: false };
        let d = decide(Ok(none), &table(), None, c).unwrap();
        assert_eq!(d.path, Path::Nccl);
        assert_eq!(d.why, Why::Fallback(Fallback::TooLarge { path: Path::Ll, max: 64 << 10 }));
    }

    #[test]
    fn nccl_takes_what_no_kernel_can() {
        let why = |kernels, c| decide(kernels, &table(), None, c).unwrap();
        let loaded = Version::new(2, 27, 7);
        let d = why(Err(Fallback::NoDeviceApi { loaded }), call(8));
        assert_eq!((d.path, d.why), (Path::Nccl, Why::Fallback(Fallback::NoDeviceApi { loaded })));
        let d = why(Ok(LIMITS), Call { unsupported_type: Some("f64"), ..call(8) });
        assert_eq!(d.why, Why::Fallback(Fallback::UnsupportedType { dtype: "f64" }));
        assert_eq!(d.to_string(), "nccl (fallback: no kernel for f64 (f32, bf16 and f16 only))");
        let d = why(Ok(LIMITS), Call { sum: false, ..call(8) });
        assert_eq!(d.why, Why::Fallback(Fallback::UnsupportedOp));
        let d = why(Ok(LIMITS), call(0));
        assert_eq!(d.why, Why::Fallback(Fallback::Empty));
        let d = why(Err(Fallback::NotOneLsaTeam { lsa: 1, ranks: 2 }), call(1 << 20));
        assert_eq!(d.path, Path::Nccl);
    }

    #[test]
    fn forcing_a_path_overrides_the_table_or_fails_plainly() {
        assert_eq!(path(Ok(LIMITS), Some(Path::TwoShot), call(8)), Path::TwoShot);
        assert_eq!(path(Ok(LIMITS), Some(Path::Nccl), call(8)), Path::Nccl);
        assert_eq!(path(Err(Fallback::Disabled), Some(Path::Nccl), call(8)), Path::Nccl);
        let err = |kernels, force, c| decide(kernels, &table(), Some(force), c).unwrap_err().to_string();
        assert_eq!(
            err(Ok(LIMITS), Path::Ll, call(1 << 20)),
            "the forced ll path cannot take this call: larger than the ll kernel's 65536 bytes"
        );
        assert_eq!(
            err(Err(Fallback::Disabled), Path::OneShot, call(8)),
            "the forced one-shot path cannot take this call: turned off in the options"
        );
        assert_eq!(
            err(Ok(LIMITS), Path::TwoShot, Call { sum: false, ..call(8) }),
            "the forced two-shot path cannot take this call: the kernels only sum"
        );
    }
}
