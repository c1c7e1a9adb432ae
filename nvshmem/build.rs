//! Finds the NCCL library directory the way `nccl-sys`'s build does (same search, same
//! variables), so that at run time this crate preloads for NVSHMEM the very NCCL the `nccl` crate
//! would load (see `src/nccl.rs`). Nothing fails here: without NCCL the directory is empty.
//!
//! It reruns when a variable of the search changes (as `nccl-sys`'s build does), and when the
//! found install's header (which `nccl-sys`'s bindings track) or library changes.

use build_support::emit::Emitter;
use build_support::env::Env;
use build_support::locate::{Locator, NCCL};

fn main() {
    let env = Env::process();
    let mut out = Emitter::stdout();
    let install = if env.get("DOCS_RS").is_some() { None } else { Locator::new(&env).find(&NCCL).ok() };
    if let Some(install) = &install {
        out.rerun_if_changed(&install.include_dir.join(NCCL.header));
        if let Some(library) = &install.library {
            out.rerun_if_changed(library);
        }
    }
    let dir = install.and_then(|install| install.lib_dir).unwrap_or_default();
    out.line("rustc-env", format!("NVSHMEM_NCCL_BUILD_LIB_DIR={}", dir.display()));
    out.rerun_if_env_changed(&env);
}
