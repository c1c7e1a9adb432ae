//! Re-derives the NCCL version cfgs (`nccl_2_28`, …) from the header version that `nccl-sys`
//! published (`DEP_NCCL_VERSION_NUMBER`), so this crate gates on the same facts.
//!
//! A few things arrived in patch releases, so a minor cfg cannot tell whether the header has them;
//! those get patch cfgs of their own (`nccl_2_28_7`: "header ≥ 2.28.7"):
//! `ncclCommRevoke` (2.28.7), `ncclConfig_t.graphStreamOrdering` (2.30.5),
//! `ncclDevCommRequirements.ginStrongSignalsRequired` (2.30.7) and `ncclConfig_t.hostCftMode`
//! (2.31.1).

use build_support::emit::Emitter;
use build_support::version::{Version, NCCL_SUPPORT};

/// The patch releases this crate gates on, beyond the minor cfgs.
const PATCH_CFGS: [Version; 4] =
    [Version::new(2, 28, 7), Version::new(2, 30, 5), Version::new(2, 30, 7), Version::new(2, 31, 1)];

fn main() {
    let mut out = Emitter::stdout();
    out.line("rerun-if-env-changed", "DEP_NCCL_VERSION_NUMBER");
    let code = std::env::var("DEP_NCCL_VERSION_NUMBER").ok().and_then(|v| v.parse().ok());
    // nccl-sys always publishes the number; the fallback only keeps `cargo check` of a broken
    // setup from failing here instead of in nccl-sys, whose error explains what is missing.
    let version = code.and_then(Version::from_nccl_code).unwrap_or(NCCL_SUPPORT.min);
    out.version_cfgs(&NCCL_SUPPORT, version);
    for patch in PATCH_CFGS {
        let name = format!("{}_{}_{}_{}", NCCL_SUPPORT.cfg_prefix, patch.major, patch.minor, patch.patch);
        out.check_cfg(&name);
        if version >= patch {
            out.cfg(&name);
        }
    }
}
