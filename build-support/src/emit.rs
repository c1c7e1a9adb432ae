//! Writing `cargo::` instructions from a build script, into any writer (stdout in a build, a
//! buffer in tests).

use std::io::Write;
use std::path::Path;

use crate::env::Env;
use crate::version::{Support, Version};

/// Writes Cargo build-script instructions.
pub struct Emitter<W: Write> {
    out: W,
}

impl Emitter<std::io::Stdout> {
    /// Instructions to standard output, where Cargo reads them.
    pub fn stdout() -> Self {
        Emitter { out: std::io::stdout() }
    }
}

impl<W: Write> Emitter<W> {
    /// Instructions into `out`.
    pub fn new(out: W) -> Self {
        Emitter { out }
    }

    /// The writer, to inspect what was written.
    pub fn into_inner(self) -> W {
        self.out
    }

    /// One raw `cargo::KEY=VALUE` line. Write errors are ignored: Cargo owns stdout and a build
    /// script has no better place to report them.
    pub fn line(&mut self, key: &str, value: impl std::fmt::Display) {
        let _ = writeln!(self.out, "cargo::{key}={value}");
    }

    /// `rerun-if-env-changed` for every variable `env` consulted.
    pub fn rerun_if_env_changed(&mut self, env: &Env) {
        for name in env.names_read() {
            self.line("rerun-if-env-changed", name);
        }
    }

    /// `rerun-if-changed` for a file or directory.
    pub fn rerun_if_changed(&mut self, path: &Path) {
        self.line("rerun-if-changed", path.display());
    }

    /// A one-line warning that Cargo shows to the user.
    pub fn warning(&mut self, text: &str) {
        for l in text.lines() {
            self.line("warning", l);
        }
    }

    /// `links` metadata, visible to direct dependents as `DEP_<LINKS>_<KEY>`.
    pub fn metadata(&mut self, key: &str, value: impl std::fmt::Display) {
        self.line("metadata", format!("{key}={value}"));
    }

    /// Declares the cfg `name` (`rustc-check-cfg`), so that code gated on it compiles without
    /// warnings whether or not it is set.
    pub fn check_cfg(&mut self, name: &str) {
        self.line("rustc-check-cfg", format!("cfg({name})"));
    }

    /// Sets the cfg `name` (`rustc-cfg`); declare it with [`Emitter::check_cfg`] too.
    pub fn cfg(&mut self, name: &str) {
        self.line("rustc-cfg", name);
    }

    /// Declares every cfg of `support` and sets those that hold for `version`.
    pub fn version_cfgs(&mut self, support: &Support, version: Version) {
        for cfg in support.all_cfgs() {
            self.check_cfg(&cfg);
        }
        for cfg in support.cfgs_for(version) {
            self.cfg(&cfg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::NVSHMEM_SUPPORT;

    #[test]
    fn writes_cargo_lines() {
        let env = Env::from_pairs(None, [("NCCL_HOME", "/x")]);
        env.get("NCCL_HOME");
        let mut e = Emitter::new(Vec::new());
        e.rerun_if_env_changed(&env);
        e.metadata("version_number", 22809);
        e.warning("two\nlines");
        e.version_cfgs(&NVSHMEM_SUPPORT, Version::new(3, 4, 5));
        e.check_cfg("extra");
        e.cfg("extra");
        let text = String::from_utf8(e.into_inner()).unwrap();
        assert!(text.starts_with(
            "cargo::rerun-if-env-changed=NCCL_HOME\ncargo::metadata=version_number=22809\n\
             cargo::warning=two\ncargo::warning=lines\ncargo::rustc-check-cfg=cfg(nvshmem_3_3)\n"
        ));
        assert!(
            text.ends_with(
                "cargo::rustc-cfg=nvshmem_3_3\ncargo::rustc-cfg=nvshmem_3_4\n\
                 cargo::rustc-check-cfg=cfg(extra)\ncargo::rustc-cfg=extra\n"
            ),
            "{text}"
        );
        assert_eq!(text.matches("rustc-check-cfg").count(), 7);
    }
}
