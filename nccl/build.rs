//! Re-derives the NCCL version cfgs (`nccl_2_28`, …) from the header version that `nccl-sys`
//! published (`DEP_NCCL_VERSION_NUMBER`), so this crate gates on the same facts.

use gpucomm_build_support::emit::Emitter;
use gpucomm_build_support::version::{Version, NCCL_SUPPORT};

fn main() {
    let mut out = Emitter::stdout();
    out.line("rerun-if-env-changed", "DEP_NCCL_VERSION_NUMBER");
    let code = std::env::var("DEP_NCCL_VERSION_NUMBER").ok().and_then(|v| v.parse().ok());
    // nccl-sys always publishes the number; the fallback only keeps `cargo check` of a broken
    // setup from failing here instead of in nccl-sys, whose error explains what is missing.
    let version = code.and_then(Version::from_nccl_code).unwrap_or(NCCL_SUPPORT.min);
    out.version_cfgs(&NCCL_SUPPORT, version);
}
