//! Finds the NCCL library directory the way `nccl-sys`'s build does (same search, same
//! variables), so that at run time this crate preloads for NVSHMEM the very NCCL the `nccl` crate
//! would load (see `src/nccl.rs`). Nothing fails here: without NCCL the directory is empty.

use gpucomm_build_support::emit::Emitter;
use gpucomm_build_support::env::Env;
use gpucomm_build_support::locate::{Locator, NCCL};

fn main() {
    let env = Env::process();
    let mut out = Emitter::stdout();
    let dir = if env.get("DOCS_RS").is_some() {
        None
    } else {
        Locator::new(&env).find(&NCCL).ok().and_then(|install| install.lib_dir)
    };
    out.line("rustc-env", format!("NVSHMEM_NCCL_BUILD_LIB_DIR={}", dir.unwrap_or_default().display()));
    out.rerun_if_env_changed(&env);
}
