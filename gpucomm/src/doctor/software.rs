//! Layer 2: the NCCL and NVSHMEM this process loaded, the other copies on the machine, what a
//! process that opens `libnccl.so.2` by name gets (NVSHMEM's host library does), the CUDA driver,
//! and the environment.

use std::collections::BTreeSet;
use std::path::PathBuf;

use build_support::locate::{NCCL, NVSHMEM};
use build_support::runtime::{Library, LoadError};
use build_support::version::Version;
use serde::Serialize;

use super::envvars;
use super::libs::{self, LibCopy, Probe, NCCL_STEM, NVSHMEM_STEM};
use super::report::{Check, Layer, Status};
use crate::cuda;
use gpucomm_launch::safety::Overridden;

const L: Layer = Layer::Software;

/// A library this process loaded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Loaded {
    /// The file opened.
    pub path: PathBuf,
    /// Its version.
    pub version: String,
    /// The search step that found it.
    pub place: String,
}

/// Why a -sys crate's loader found no library, and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoadFailure {
    /// The loader's report: every attempt, in order.
    pub report: String,
    /// The fix: the variable that stopped the search, when one did; else how to install it.
    pub fix: String,
}

/// Everything the software layer looks at.
#[derive(Clone, Debug, Serialize)]
pub struct SoftwareFacts {
    /// NCCL as `nccl-sys` loaded it, or why it could not.
    pub nccl: Result<Loaded, LoadFailure>,
    /// The version of the `nccl.h` gpucomm was built with.
    pub nccl_headers: String,
    /// NVSHMEM as `nvshmem-sys` loaded it, or why it could not.
    pub nvshmem: Result<Loaded, LoadFailure>,
    /// NCCL copies on the machine.
    pub nccl_copies: Vec<LibCopy>,
    /// NVSHMEM host-library copies on the machine.
    pub nvshmem_copies: Vec<LibCopy>,
    /// What a fresh process gets for `libnccl.so.2`.
    pub nccl_soname: Probe,
    /// `cuDriverGetVersion`.
    pub cuda_driver: Option<i32>,
    /// The environment variables the doctor reasons about ([`envvars::kept`]), as the user set
    /// them (safety variables with the user's values), secrets redacted ([`envvars::shown`]).
    pub env: Vec<(String, String)>,
    /// Places that could not be searched.
    pub notes: Vec<String>,
}

/// How to install NCCL when nothing named it.
const NCCL_INSTALL: &str =
    "pip install nvidia-nccl-cu13 (or -cu12), or set NCCL_LIB_DIR to the directory that holds libnccl.so.2";
/// How to install NVSHMEM when nothing named it.
const NVSHMEM_INSTALL: &str =
    "pip install nvidia-nvshmem-cu13, or set NVSHMEM_LIB_DIR to the directory that holds libnvshmem_host.so.3";

/// What a -sys crate's loader gave; `install` is the fix when no variable stopped the search.
fn loaded<A>(lib: Result<&Library<A>, LoadError>, install: &str) -> Result<Loaded, LoadFailure> {
    lib.map(|l| Loaded { path: l.path().to_path_buf(), version: l.version().to_string(), place: l.place().to_string() })
        .map_err(|e| LoadFailure { report: e.to_string(), fix: stopped_fix(&e).unwrap_or_else(|| install.to_string()) })
}

/// The fix for a search that a variable stopped (`NCCL_LIB_DIR=/tmp`): that variable, which
/// named a place without a loadable library. `None` when no variable stopped it.
fn stopped_fix(e: &LoadError) -> Option<String> {
    if !e.stopped_by_variable {
        return None;
    }
    let last = e.attempts.last()?;
    let path = last.path.to_string_lossy();
    Some(if last.place.ends_with(&format!("={path}")) {
        // The variable names the file itself (`NCCL_SYS_LIBRARY`).
        format!("{} could not be loaded ({}): fix or unset it", last.place, last.error)
    } else if last.path.exists() {
        format!("{}: {path} could not be loaded ({}): fix or unset it", last.place, last.error)
    } else {
        let file = last.path.file_name().map_or(path.clone(), |f| f.to_string_lossy());
        format!("{} holds no {file}: fix or unset it", last.place)
    })
}

/// Loads the libraries and looks around.
pub fn gather(overridden: &[Overridden]) -> SoftwareFacts {
    let nccl = loaded(nccl_sys::library(), NCCL_INSTALL);
    let nvshmem = loaded(nvshmem_sys::library(), NVSHMEM_INSTALL);
    let mut notes = Vec::new();
    let mut nccl_copies = libs::find_copies(&NCCL, NCCL_STEM, "nccl", &mut notes);
    add_loaded(&mut nccl_copies, &nccl);
    libs::add_versions(&mut nccl_copies);
    let mut nvshmem_copies = libs::find_copies(&NVSHMEM, NVSHMEM_STEM, "nvshmem", &mut notes);
    add_loaded(&mut nvshmem_copies, &nvshmem);
    notes.sort();
    notes.dedup();
    SoftwareFacts {
        nccl,
        nccl_headers: nccl::header_version().to_string(),
        nvshmem,
        nccl_copies,
        nvshmem_copies,
        nccl_soname: libs::probe("libnccl.so.2"),
        cuda_driver: cuda::driver_version(),
        env: user_env(overridden),
        notes,
    }
}

/// Adds the library this process loaded to `copies` when no search found it (a directory the
/// build used, `X_LIB_DIR`), and gives its copy the loaded version.
fn add_loaded(copies: &mut Vec<LibCopy>, loaded: &Result<Loaded, LoadFailure>) {
    let Ok(l) = loaded else { return };
    let Ok(real) = std::fs::canonicalize(&l.path) else { return };
    match copies.iter_mut().find(|c| c.path == real) {
        Some(c) => c.version = Some(l.version.clone()),
        None => copies.push(LibCopy { path: real, found: vec![l.place.clone()], version: Some(l.version.clone()) }),
    }
}

/// The variables the doctor reasons about, as the user set them: the safety variables this
/// process changed are shown with their original values (or left out when they were unset);
/// every other variable is left out, and secret values are redacted.
fn user_env(overridden: &[Overridden]) -> Vec<(String, String)> {
    let from_process = std::env::vars_os()
        .map(|(n, v)| (n.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
        .filter(|(n, _)| !overridden.iter().any(|o| o.name == n));
    let as_the_user_had = overridden.iter().filter_map(|o| Some((o.name.to_string(), o.was.clone()?)));
    let mut env: Vec<(String, String)> = from_process
        .chain(as_the_user_had)
        .filter(|(n, _)| envvars::kept(n))
        .map(|(n, v)| {
            let v = envvars::shown(&n, v);
            (n, v)
        })
        .collect();
    env.sort();
    env
}

fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

fn copy_lines(copies: &[LibCopy]) -> Vec<String> {
    copies
        .iter()
        .map(|c| format!("{:<8} {}  ({})", c.version.as_deref().unwrap_or("?"), c.path.display(), c.found.join(", ")))
        .collect()
}

/// The checks of this layer.
pub fn checks(f: &SoftwareFacts) -> Vec<Check> {
    let mut out = Vec::new();
    match &f.nccl {
        Ok(l) => out.push(Check::new(
            L,
            Status::Pass,
            format!("NCCL {} loaded from {} (found by: {})", l.version, l.path.display(), l.place),
        )),
        Err(e) => out.push(
            Check::fail(L, "NCCL could not be loaded", e.fix.clone()).with_detail(e.report.lines().map(str::to_string)),
        ),
    }
    out.extend(headers_check(f));
    match &f.nvshmem {
        Ok(l) => out.push(Check::new(
            L,
            Status::Pass,
            format!("NVSHMEM {} loaded from {} (found by: {})", l.version, l.path.display(), l.place),
        )),
        Err(e) => out.push(
            Check::warn(L, "NVSHMEM could not be loaded (only NVSHMEM programs need it)", e.fix.clone())
                .with_detail(e.report.lines().map(str::to_string)),
        ),
    }
    out.extend(copies_check(f));
    out.extend(soname_check(f));
    if !f.nvshmem_copies.is_empty() {
        out.push(
            Check::new(
                L,
                Status::Info,
                format!("{} NVSHMEM host library copies on this machine", f.nvshmem_copies.len()),
            )
            .with_detail(copy_lines(&f.nvshmem_copies)),
        );
    }
    match f.cuda_driver {
        Some(v) => out.push(Check::new(L, Status::Pass, format!("CUDA driver supports CUDA {} (cuDriverGetVersion = {v})", cuda::version_text(v)))),
        None => out.push(Check::fail(L, "no CUDA driver: libcuda.so.1 cannot be loaded", "install the NVIDIA driver, or add the directory holding libcuda.so.1 to LD_LIBRARY_PATH (containers: --gpus all)")),
    }
    out.extend(env_checks(f));
    for n in &f.notes {
        out.push(Check::new(L, Status::Info, n.clone()));
    }
    out
}

/// The loaded NCCL against the `nccl.h` gpucomm was built with: an older library may lack
/// functions (or behaviours) the headers promised.
fn headers_check(f: &SoftwareFacts) -> Option<Check> {
    let loaded = f.nccl.as_ref().ok()?;
    let (lib, headers) = (loaded.version.parse::<Version>().ok()?, f.nccl_headers.parse::<Version>().ok()?);
    (lib < headers).then(|| {
        Check::warn(
            L,
            format!(
                "the loaded NCCL {lib} is older than the nccl.h {headers} gpucomm was built with: functions it uses may be missing"
            ),
            format!(
                "load NCCL {headers} or newer (NCCL_LIB_DIR=<its dir>), or rebuild gpucomm against the headers of NCCL {lib}"
            ),
        )
    })
}

fn copies_check(f: &SoftwareFacts) -> Option<Check> {
    if f.nccl_copies.is_empty() {
        return None;
    }
    let versions: BTreeSet<&str> = f.nccl_copies.iter().filter_map(|c| c.version.as_deref()).collect();
    let lines = copy_lines(&f.nccl_copies);
    let unknown: Vec<String> =
        f.nccl_copies.iter().filter(|c| c.version.is_none()).map(|c| c.path.display().to_string()).collect();
    if versions.len() <= 1 && !unknown.is_empty() {
        // One version among those known says nothing about the others.
        let known = versions.first().map_or(String::new(), |v| format!("{v} where known; "));
        return Some(
            Check::new(
                L,
                Status::Info,
                format!(
                    "{} NCCL copy/copies on this machine: {known}version unknown for {} (the probe could not ask them)",
                    f.nccl_copies.len(),
                    unknown.join(", ")
                ),
            )
            .with_detail(lines),
        );
    }
    if versions.len() <= 1 {
        return Some(
            Check::new(
                L,
                Status::Pass,
                format!("{} NCCL copy/copies on this machine, one version", f.nccl_copies.len()),
            )
            .with_detail(lines),
        );
    }
    let loaded = match &f.nccl {
        Ok(l) => format!("your process loaded {} ({})", l.version, l.path.display()),
        Err(_) => "your process loaded none".to_string(),
    };
    let list: Vec<&str> = versions.into_iter().collect();
    Some(
        Check::warn(
            L,
            format!("{} NCCL versions on this machine ({}) — {loaded}", list.len(), list.join(", ")),
            "a program linked with -lnccl and no rpath gets the ldconfig cache's copy; pick one explicitly: LD_LIBRARY_PATH=<its dir> (C, PyTorch) or NCCL_LIB_DIR=<its dir> (gpucomm-rs)",
        )
        .with_detail(lines),
    )
}

fn soname_check(f: &SoftwareFacts) -> Option<Check> {
    let p = &f.nccl_soname;
    let got = match (&p.path, &p.version) {
        (Some(path), v) => format!("{} ({})", path.display(), v.as_deref().unwrap_or("version unknown")),
        (None, _) => format!("nothing ({})", p.error.as_deref().unwrap_or("not found")),
    };
    let title =
        format!("a process that opens libnccl.so.2 by name, as NVSHMEM's host library does for itself, gets {got}");
    let Ok(loaded) = &f.nccl else { return Some(Check::new(L, Status::Info, title)) };
    let dir = loaded.path.parent().map_or(String::from("<dir>"), |d| d.display().to_string());
    let fix = format!("create the NCCL communicator (or call nccl::version()) before starting NVSHMEM, or export LD_LIBRARY_PATH={dir}:$LD_LIBRARY_PATH");
    match &p.path {
        Some(path) if same_file(path, &loaded.path) => Some(Check::new(L, Status::Pass, title)),
        Some(_) if p.version.as_deref() == Some(loaded.version.as_str()) => Some(Check::new(L, Status::Pass, format!("{title}: the same version"))),
        Some(_) => Some(Check::warn(
            L,
            format!("{title}, not the NCCL {} your process loaded: a process that starts NVSHMEM before NCCL holds two NCCLs", loaded.version),
            fix,
        )),
        None => Some(Check::warn(L, format!("{title}: NVSHMEM started before NCCL finds no NCCL for its collectives"), fix)),
    }
}

fn env_checks(f: &SoftwareFacts) -> Vec<Check> {
    let mut out = Vec::new();
    let get = |name: &str| f.env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    for reason in envvars::transport_reasons(get) {
        out.push(Check::warn(
            L,
            format!("set in your environment: {reason}"),
            "unset it unless you mean to keep NCCL off NVLink / shared memory",
        ));
    }
    let relevant = envvars::relevant(f.env.iter().cloned());
    let lines: Vec<String> = relevant.iter().map(|(n, v, m)| format!("{n}={v} — {m}")).collect();
    let title = if lines.is_empty() {
        "environment: no variable that changes NCCL's or NVSHMEM's path is set".to_string()
    } else {
        format!("environment: {} variable(s) that concern NCCL, NVSHMEM or library loading", lines.len())
    };
    out.push(Check::new(L, Status::Info, title).with_detail(lines));
    let unsafe_now: Vec<String> = gpucomm_launch::SAFETY_VARS
        .iter()
        .filter(|(n, v)| get(n).as_deref() != Some(*v))
        .map(|(n, v)| format!("{n}={v}"))
        .collect();
    if !unsafe_now.is_empty() {
        out.push(Check::new(
            L,
            Status::Info,
            format!(
                "NVLink multicast stays off in gpucomm's own processes; your environment does not set {}",
                unsafe_now.join(" ")
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> SoftwareFacts {
        let wheel = PathBuf::from("/sp/nvidia/nccl/lib/libnccl.so.2");
        let system = PathBuf::from("/lib/x86_64-linux-gnu/libnccl.so.2");
        SoftwareFacts {
            nccl: Ok(Loaded { path: wheel.clone(), version: "2.28.9".into(), place: "NCCL_LIB_DIR".into() }),
            nccl_headers: "2.28.9".into(),
            nvshmem: Err(LoadFailure {
                report: "could not load the NVSHMEM library. Tried, in order:\n  1. …".into(),
                fix: NVSHMEM_INSTALL.into(),
            }),
            nccl_copies: vec![
                LibCopy { path: wheel, found: vec!["python3 wheel".into()], version: Some("2.28.9".into()) },
                LibCopy { path: system.clone(), found: vec!["ldconfig cache".into()], version: Some("2.28.3".into()) },
            ],
            nvshmem_copies: vec![],
            nccl_soname: Probe { path: Some(system), version: Some("2.28.3".into()), error: None },
            cuda_driver: Some(13000),
            env: vec![("NCCL_P2P_DISABLE".into(), "1".into()), ("NCCL_NVLS_ENABLE".into(), "0".into())],
            notes: vec![],
        }
    }

    #[test]
    fn the_gpu_machine_two_nccls() {
        let c = checks(&facts());
        let find =
            |start: &str| c.iter().find(|c| c.title.starts_with(start)).unwrap_or_else(|| panic!("{start}: {c:#?}"));
        assert_eq!(find("NCCL 2.28.9 loaded").status, Status::Pass);
        let nvshmem = find("NVSHMEM could not be loaded");
        assert_eq!((nvshmem.status, nvshmem.detail.len()), (Status::Warn, 2));
        let two = find("2 NCCL versions");
        assert_eq!(two.status, Status::Warn);
        assert_eq!(two.title, "2 NCCL versions on this machine (2.28.3, 2.28.9) — your process loaded 2.28.9 (/sp/nvidia/nccl/lib/libnccl.so.2)");
        assert_eq!(two.detail[1], "2.28.3   /lib/x86_64-linux-gnu/libnccl.so.2  (ldconfig cache)");
        let soname = find("a process that opens libnccl.so.2");
        assert_eq!(soname.status, Status::Warn);
        assert!(
            soname.title.contains("gets /lib/x86_64-linux-gnu/libnccl.so.2 (2.28.3), not the NCCL 2.28.9"),
            "{}",
            soname.title
        );
        assert!(soname.fix.as_deref().unwrap().contains("LD_LIBRARY_PATH=/sp/nvidia/nccl/lib:"));
        assert_eq!(find("CUDA driver").title, "CUDA driver supports CUDA 13.0 (cuDriverGetVersion = 13000)");
        let p2p = find("set in your environment: NCCL_P2P_DISABLE=1");
        assert_eq!(p2p.status, Status::Warn);
        let env = find("environment:");
        assert_eq!(env.detail.len(), 2);
        assert!(find("NVLink multicast stays off")
            .title
            .ends_with("does not set NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1"));
    }

    #[test]
    fn a_library_older_than_the_headers_is_a_warning() {
        let older = |f: &SoftwareFacts| -> Vec<Check> {
            checks(f).into_iter().filter(|c| c.title.contains("older than the nccl.h")).collect()
        };
        let mut f = facts();
        assert!(older(&f).is_empty(), "the same version");
        f.nccl_headers = "2.27.3".into();
        assert!(older(&f).is_empty(), "a newer library");
        f.nccl_headers = "2.29.1".into();
        let c = older(&f);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].status, Status::Warn);
        assert_eq!(
            c[0].title,
            "the loaded NCCL 2.28.9 is older than the nccl.h 2.29.1 gpucomm was built with: functions it uses may be missing"
        );
        assert_eq!(
            c[0].fix.as_deref(),
            Some("load NCCL 2.29.1 or newer (NCCL_LIB_DIR=<its dir>), or rebuild gpucomm against the headers of NCCL 2.28.9")
        );
    }

    #[test]
    fn copies_of_unknown_version_are_named_not_passed() {
        let mut f = facts();
        f.nccl_copies[1].version = None;
        f.nccl_copies.push(LibCopy {
            path: PathBuf::from("/opt/old/libnccl.so.2"),
            found: vec!["LD_LIBRARY_PATH".into()],
            version: None,
        });
        let c = checks(&f);
        let copies = c.iter().find(|c| c.title.contains("NCCL copy/copies")).unwrap();
        assert_eq!(copies.status, Status::Info);
        assert_eq!(
            copies.title,
            "3 NCCL copy/copies on this machine: 2.28.9 where known; version unknown for \
             /lib/x86_64-linux-gnu/libnccl.so.2, /opt/old/libnccl.so.2 (the probe could not ask them)"
        );
        assert_eq!(copies.detail[2], "?        /opt/old/libnccl.so.2  (LD_LIBRARY_PATH)");
        // Every version known and one: a ✓.
        f.nccl_copies[1].version = Some("2.28.9".into());
        f.nccl_copies.pop();
        let c = checks(&f);
        let copies = c.iter().find(|c| c.title.contains("NCCL copy/copies")).unwrap();
        assert_eq!(
            (copies.status, copies.title.as_str()),
            (Status::Pass, "2 NCCL copy/copies on this machine, one version")
        );
    }

    #[test]
    fn nothing_loaded_is_a_failure_with_a_fix() {
        let mut f = facts();
        f.nccl = Err(LoadFailure {
            report: "could not load the NCCL library. Tried, in order:\n  1. libnccl.so.2 (soname): not found".into(),
            fix: NCCL_INSTALL.into(),
        });
        f.cuda_driver = None;
        let c = checks(&f);
        let fails: Vec<&Check> = c.iter().filter(|c| c.status == Status::Fail).collect();
        assert_eq!(fails.len(), 2);
        assert_eq!(fails[0].title, "NCCL could not be loaded");
        assert!(fails[0].fix.as_deref().unwrap().starts_with("pip install nvidia-nccl-cu13"));
        assert_eq!(fails[1].title, "no CUDA driver: libcuda.so.1 cannot be loaded");
        assert!(c.iter().any(|c| c.title.contains("your process loaded none")));
    }

    fn stopped_at(place: &str, path: &std::path::Path, error: &str) -> LoadError {
        LoadError {
            name: "NCCL",
            attempts: vec![build_support::runtime::Attempt {
                place: place.into(),
                path: path.into(),
                error: error.into(),
            }],
            vars: vec!["NCCL_LIB_DIR".into()],
            hint: "pip install nvidia-nccl-cu13",
            docs: "nccl-sys",
            stopped_by_variable: true,
        }
    }

    #[test]
    fn a_variable_that_stopped_the_search_is_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let missing = dir.path().join("libnccl.so.2");
        let e = stopped_at(&format!("NCCL_LIB_DIR={d}"), &missing, "cannot open shared object file");
        assert_eq!(stopped_fix(&e).unwrap(), format!("NCCL_LIB_DIR={d} holds no libnccl.so.2: fix or unset it"));
        std::fs::write(&missing, b"not a library").unwrap();
        let e = stopped_at(&format!("NCCL_LIB_DIR={d}"), &missing, "invalid ELF header");
        assert_eq!(
            stopped_fix(&e).unwrap(),
            format!("NCCL_LIB_DIR={d}: {d}/libnccl.so.2 could not be loaded (invalid ELF header): fix or unset it")
        );
        let e = stopped_at("NCCL_SYS_LIBRARY=/x/libnccl.so.2", std::path::Path::new("/x/libnccl.so.2"), "not found");
        assert_eq!(
            stopped_fix(&e).unwrap(),
            "NCCL_SYS_LIBRARY=/x/libnccl.so.2 could not be loaded (not found): fix or unset it"
        );
        let searched = LoadError { stopped_by_variable: false, ..e };
        assert_eq!(stopped_fix(&searched), None);
        assert_eq!(loaded::<()>(Err(searched), NCCL_INSTALL).unwrap_err().fix, NCCL_INSTALL);
    }

    #[test]
    fn safety_vars_show_as_the_user_had_them() {
        let over = [
            Overridden { name: "NCCL_NVLS_ENABLE", was: Some("1".into()), now: "0" },
            Overridden { name: "NVSHMEM_DISABLE_NVLS", was: None, now: "1" },
        ];
        let env = user_env(&over);
        assert!(env.contains(&("NCCL_NVLS_ENABLE".to_string(), "1".to_string())));
        assert!(!env.iter().any(|(n, _)| n == "NVSHMEM_DISABLE_NVLS"));
    }
}
