//! Reading configuration variables, with a record of every name consulted.
//!
//! Build scripts must tell Cargo about every variable they read (`rerun-if-env-changed`), and error
//! messages must name every variable that could have changed the outcome. [`Env`] does both: each
//! lookup is recorded, and the record is available to [`crate::emit::Emitter::rerun_if_env_changed`]
//! and to the "not found" reports.
//!
//! For a variable `NAME`, the target-specific spelling `<TARGET>_NAME` is tried first (the target
//! triple upper-cased with `-` and `.` turned into `_`, e.g. `X86_64_UNKNOWN_LINUX_GNU_NCCL_HOME`),
//! then `NAME` itself. Empty values count as unset. Values are read as OS strings: a path need not
//! be UTF-8, and a variable naming one is never taken for unset because it is not.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// A variable that was found set: the exact name that matched, and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Var {
    /// The spelling that was set (possibly the target-prefixed one).
    pub name: String,
    /// Its value as text, for messages: bytes that are not UTF-8 are shown as `�`. Paths and
    /// programs are taken from [`Self::value_os`] (through [`Self::path`]), never from this.
    pub value: String,
    /// Its value exactly as the environment holds it (not necessarily UTF-8).
    pub value_os: OsString,
}

impl Var {
    fn new(name: String, value_os: OsString) -> Self {
        Var { name, value: value_os.to_string_lossy().into_owned(), value_os }
    }

    /// The value as a path.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(&self.value_os)
    }

    /// The value as text, for the variables that hold no path; `None` when it is not UTF-8.
    pub fn text(&self) -> Option<&str> {
        self.value_os.to_str()
    }

    /// Whether the value contains a `/`: a program named with one is not looked up on `PATH`.
    pub fn has_slash(&self) -> bool {
        names_a_path(&self.value_os)
    }
}

/// Whether the program name `program` contains a `/`, so that it is not looked up on `PATH`.
pub(crate) fn names_a_path(program: &OsStr) -> bool {
    program.as_encoded_bytes().contains(&b'/')
}

impl std::fmt::Display for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.name, self.value)
    }
}

enum Source {
    Process,
    Map(BTreeMap<String, OsString>),
}

/// A view of the environment that records which names were read.
pub struct Env {
    target_prefix: Option<String>,
    source: Source,
    read: RefCell<Vec<String>>,
}

impl Env {
    /// The real process environment of a build script: the target triple comes from `TARGET`
    /// (set by Cargo), whose prefixed spellings are tried first.
    pub fn process() -> Self {
        let target = std::env::var("TARGET").ok();
        Env { target_prefix: target.map(|t| target_prefix(&t)), source: Source::Process, read: RefCell::default() }
    }

    /// The real process environment of a running program: no target prefix, whatever `TARGET`
    /// holds (an unrelated `TARGET=foo` would make the loader read `FOO_NCCL_SYS_LIBRARY`).
    pub fn running() -> Self {
        Env { target_prefix: None, source: Source::Process, read: RefCell::default() }
    }

    /// A fixed set of variables, for tests. `target` is the triple whose prefixed names are tried.
    /// Values may be any OS string (`&str`, `&OsStr`, `&Path`).
    pub fn from_pairs<'a, V: AsRef<OsStr>>(
        target: Option<&str>,
        pairs: impl IntoIterator<Item = (&'a str, V)>,
    ) -> Self {
        let map = pairs.into_iter().map(|(k, v)| (k.to_string(), v.as_ref().to_os_string())).collect();
        Env { target_prefix: target.map(target_prefix), source: Source::Map(map), read: RefCell::default() }
    }

    fn raw(&self, name: &str) -> Option<OsString> {
        self.note(name);
        self.cargo_var(name)
    }

    fn note(&self, name: &str) {
        let mut read = self.read.borrow_mut();
        if !read.iter().any(|n| n == name) {
            read.push(name.to_string());
        }
    }

    /// Looks `name` up, target-prefixed spelling first.
    pub fn get(&self, name: &str) -> Option<Var> {
        let prefixed = self.target_prefix.as_ref().map(|p| format!("{p}_{name}"));
        prefixed
            .into_iter()
            .chain(std::iter::once(name.to_string()))
            .find_map(|n| self.raw(&n).map(|value| Var::new(n, value)))
    }

    /// Looks up exactly `name`, without the target-prefixed spelling, and records it: for variables
    /// that other programs read under their plain name (`PATH`, nvcc's `NVCC_APPEND_FLAGS`).
    pub fn get_exact(&self, name: &str) -> Option<Var> {
        self.raw(name).map(|value| Var::new(name.to_string(), value))
    }

    /// A variable that Cargo itself sets for build scripts (`OUT_DIR`, `CARGO_MANIFEST_DIR`,
    /// `NUM_JOBS`, `DEP_<LINKS>_<KEY>`): exact name, not recorded, since Cargo already knows when
    /// it changes.
    pub fn cargo_var(&self, name: &str) -> Option<OsString> {
        let value = match &self.source {
            // `var_os`, not `var`: a value that is not UTF-8 is still set (`var` would call it unset,
            // and a variable naming a place would silently stop counting).
            Source::Process => std::env::var_os(name),
            Source::Map(map) => map.get(name).cloned(),
        };
        value.filter(|v| !v.is_empty())
    }

    /// True when `name` is set to `1`, `true`, `yes` or `on` (any case).
    pub fn flag(&self, name: &str) -> bool {
        self.get(name).is_some_and(|v| {
            v.text().is_some_and(|t| matches!(t.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
        })
    }

    /// Every spelling consulted so far, in first-read order.
    pub fn names_read(&self) -> Vec<String> {
        self.read.borrow().clone()
    }
}

/// `x86_64-unknown-linux-gnu` → `X86_64_UNKNOWN_LINUX_GNU`.
fn target_prefix(target: &str) -> String {
    target.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    /// A process variable whose value is not UTF-8 is set, not unset (`std::env::var` called it
    /// unset, and `NCCL_HOME=/tmp/\xffnccl` let the search fall through to other installs). Read
    /// in a child run of this test, so that no test changes this process's environment.
    #[test]
    fn process_values_need_not_be_utf8() {
        const NAME: &str = "GPUCOMM_ENV_TEST_NOT_UTF8";
        let value = OsStr::from_bytes(b"/tmp/\xffnccl");
        if std::env::var_os(NAME).is_some() {
            let v = Env::running().get(NAME).expect("a value that is not UTF-8 counts as set");
            assert_eq!(v.value_os, value);
            assert_eq!(v.path(), Path::new(value));
            assert_eq!(v.text(), None);
            assert_eq!(v.to_string(), format!("{NAME}=/tmp/\u{fffd}nccl"));
            return;
        }
        let test = "env::tests::process_values_need_not_be_utf8";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--test-threads=1"])
            .env(NAME, value)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("1 passed"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    }

    #[test]
    fn fixed_values_need_not_be_utf8() {
        let value = OsStr::from_bytes(b"/tmp/\xffnccl");
        let env = Env::from_pairs(None, [("NCCL_HOME", value), ("CUDA_ARCHS", OsStr::new("90"))]);
        assert_eq!(env.get("NCCL_HOME").unwrap().path(), Path::new(value));
        assert_eq!(env.get("CUDA_ARCHS").unwrap().text(), Some("90"));
    }

    #[test]
    fn target_spelling_wins_and_both_are_recorded() {
        let env = Env::from_pairs(
            Some("x86_64-unknown-linux-gnu"),
            [("NCCL_HOME", "/plain"), ("X86_64_UNKNOWN_LINUX_GNU_NCCL_HOME", "/target")],
        );
        let v = env.get("NCCL_HOME").unwrap();
        assert_eq!(v.name, "X86_64_UNKNOWN_LINUX_GNU_NCCL_HOME");
        assert_eq!(v.value, "/target");
        assert_eq!(env.names_read(), ["X86_64_UNKNOWN_LINUX_GNU_NCCL_HOME"]);
        assert_eq!(env.get("NCCL_LIB_DIR"), None);
        assert_eq!(
            env.names_read(),
            ["X86_64_UNKNOWN_LINUX_GNU_NCCL_HOME", "X86_64_UNKNOWN_LINUX_GNU_NCCL_LIB_DIR", "NCCL_LIB_DIR"]
        );
    }

    #[test]
    fn exact_and_cargo_lookups() {
        let env = Env::from_pairs(
            Some("x86_64-unknown-linux-gnu"),
            [("PATH", "/bin"), ("X86_64_UNKNOWN_LINUX_GNU_PATH", "/target"), ("OUT_DIR", "/out")],
        );
        assert_eq!(env.get_exact("PATH").unwrap().value, "/bin");
        assert_eq!(env.cargo_var("OUT_DIR").as_deref(), Some(OsStr::new("/out")));
        assert_eq!(env.names_read(), ["PATH"]);
    }

    #[test]
    fn empty_values_are_unset_and_flags_parse() {
        let env = Env::from_pairs(None, [("A", ""), ("B", "Yes"), ("C", "0")]);
        assert_eq!(env.get("A"), None);
        assert!(env.flag("B"));
        assert!(!env.flag("C"));
        assert!(!env.flag("D"));
    }
}
