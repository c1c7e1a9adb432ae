//! Finding the NCCL and NVSHMEM copies a process could load: the ldconfig cache, the Python
//! wheels (and PyTorch's `torch/lib` beside them), `LD_LIBRARY_PATH`; and what the dynamic loader
//! gives for a soname. Versions come from a fresh child process (`gpucomm __probe-nccl`) that
//! opens one library and asks it, so this process never holds two NCCLs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use build_support::locate::Spec;
use serde::{Deserialize, Serialize};

use crate::error::{CliError, Result};

/// The file-name stem of NCCL's library.
pub const NCCL_STEM: &str = "libnccl.so";
/// The file-name stem of NVSHMEM's host library.
pub const NVSHMEM_STEM: &str = "libnvshmem_host.so";

/// One copy of a library on this machine (symlinks to the same file count once).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LibCopy {
    /// The file, symlinks resolved.
    pub path: PathBuf,
    /// Where it was found (`ldconfig cache`, `python3 wheel`, `torch/lib`, `LD_LIBRARY_PATH`).
    pub found: Vec<String>,
    /// Its version, when asked.
    pub version: Option<String>,
}

/// `ldconfig -p` lines for `stem`: `\tlibnccl.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnccl.so.2`.
pub fn parse_ldconfig(text: &str, stem: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let (name, path) = line.trim().split_once(" => ")?;
            name.starts_with(stem).then(|| PathBuf::from(path.trim()))
        })
        .collect()
}

fn ldconfig_cache() -> std::result::Result<String, String> {
    for program in ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"] {
        if let Ok(out) = Command::new(program).arg("-p").output() {
            if out.status.success() {
                return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
            }
        }
    }
    Err("ldconfig -p could not be run".into())
}

/// Library files in `dir` whose names start with `stem`.
fn files_in(dir: &Path, stem: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(stem))
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Where to look for copies, as `(how found, directory or file)`: wheels and `torch/lib` (asking
/// `python3`, or `X_SYS_PYTHON` for the library `spec` names, as its -sys crate does),
/// `LD_LIBRARY_PATH`, the ldconfig cache. `notes` collects what could not be searched.
fn places(spec: &Spec, stem: &str, wheel: &str, notes: &mut Vec<String>) -> Vec<(String, PathBuf)> {
    use build_support::env::Env;
    use build_support::locate::Locator;
    use build_support::python::NvidiaDirs;

    let mut out = Vec::new();
    let env = Env::running();
    let (python, dirs) = Locator::new(&env).nvidia_dirs(spec);
    let python = python.display();
    match dirs {
        NvidiaDirs::Found(dirs) => {
            for d in dirs {
                out.push((format!("{python} wheel"), d.join(wheel).join("lib")));
                if let Some(site) = d.parent() {
                    out.push((format!("{python} torch/lib"), site.join("torch").join("lib")));
                }
            }
        }
        NvidiaDirs::NoPackage(why) => notes.push(format!("no NVIDIA wheels in {python} ({why})")),
        NvidiaDirs::NoInterpreter(why) => notes.push(format!("Python wheels not searched: {why}")),
    }
    if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
        for d in std::env::split_paths(&paths).filter(|d| !d.as_os_str().is_empty()) {
            out.push(("LD_LIBRARY_PATH".to_string(), d));
        }
    }
    match ldconfig_cache() {
        Ok(text) => out.extend(parse_ldconfig(&text, stem).into_iter().map(|p| ("ldconfig cache".to_string(), p))),
        Err(e) => notes.push(e),
    }
    out
}

/// Every copy of the library `stem` found, merged by real path, in the order first found.
/// `spec` is the library's search (`locate::NCCL`, `locate::NVSHMEM`: which `X_SYS_PYTHON` names
/// the interpreter); `wheel` is the wheel's folder under `nvidia/` (`nccl`, `nvshmem`).
pub fn find_copies(spec: &Spec, stem: &str, wheel: &str, notes: &mut Vec<String>) -> Vec<LibCopy> {
    let mut copies: Vec<LibCopy> = Vec::new();
    for (how, place) in places(spec, stem, wheel, notes) {
        let files = if place.is_dir() { files_in(&place, stem) } else { vec![place] };
        for f in files {
            add_copy(&mut copies, &how, &f);
        }
    }
    copies
}

/// Adds `file`, found by `how`, to `copies`, merging it with a copy of the same real file.
fn add_copy(copies: &mut Vec<LibCopy>, how: &str, file: &Path) {
    let Ok(real) = std::fs::canonicalize(file) else { return };
    match copies.iter_mut().find(|c| c.path == real) {
        Some(c) if !c.found.iter().any(|h| h == how) => c.found.push(how.to_string()),
        Some(_) => {}
        None => copies.push(LibCopy { path: real, found: vec![how.to_string()], version: None }),
    }
}

/// What a fresh process got for one library.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// The file the dynamic loader opened.
    pub path: Option<PathBuf>,
    /// `ncclGetVersion`, as `2.28.9`.
    pub version: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
}

/// Runs `gpucomm __probe-nccl library` and reads its answer.
pub fn probe(library: &str) -> Probe {
    let failed = |error: String| Probe { path: None, version: None, error: Some(error) };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return failed(format!("cannot find this program to start a probe: {e}")),
    };
    let child = Command::new(exe).arg("__probe-nccl").arg(library).stdin(std::process::Stdio::null()).output();
    match child {
        Ok(out) => serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            failed(format!("probe of {library} gave no answer ({e}): {}", String::from_utf8_lossy(&out.stderr).trim()))
        }),
        Err(e) => failed(format!("could not start a probe: {e}")),
    }
}

/// Files of `stem` mapped into this process (`/proc/self/maps`).
pub fn mapped(stem: &str) -> Vec<PathBuf> {
    parse_maps(&std::fs::read("/proc/self/maps").unwrap_or_default(), stem)
}

/// `path`, with any bytes that are not UTF-8 replaced (U+FFFD), so that it goes into JSON (which
/// refuses such a path) as near to itself as JSON can carry.
pub fn json_safe(path: PathBuf) -> PathBuf {
    match path.to_str() {
        Some(_) => path,
        None => PathBuf::from(path.to_string_lossy().into_owned()),
    }
}

/// The files of `stem` in a `/proc/PID/maps` text, sorted, each once. The path is all of a line
/// after its fifth field (address, permissions, offset, device, inode), as bytes: a path may hold
/// spaces, or bytes that are not UTF-8.
fn parse_maps(maps: &[u8], stem: &str) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let path_of = |line: &[u8]| -> Option<PathBuf> {
        let mut rest = line;
        for _ in 0..5 {
            rest = rest.trim_ascii_start();
            rest = &rest[rest.iter().position(u8::is_ascii_whitespace)?..];
        }
        let path = rest.trim_ascii_start();
        (!path.is_empty()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(path)))
    };
    let mut out: Vec<PathBuf> = maps
        .split(|&b| b == b'\n')
        .filter_map(path_of)
        .filter(|p| p.file_name().is_some_and(|n| n.as_bytes().starts_with(stem.as_bytes())))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The body of `gpucomm __probe-nccl LIBRARY`: opens it as `dlopen` would, asks `ncclGetVersion`,
/// prints a [`Probe`] as JSON. Always exits 0 when it could print.
pub fn probe_main(library: &str) -> Result<()> {
    let answer = probe_here(library);
    let text =
        serde_json::to_string(&answer).map_err(|source| CliError::Json { what: "probe answer".into(), source })?;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
    // Leave without running the library's destructors (NCCL may have started threads).
    std::process::exit(0);
}

fn probe_here(library: &str) -> Probe {
    // SAFETY: opening NCCL runs its initialisers, which only set up internal state; this process
    // exists only to do this and exits right after.
    let lib = match unsafe { libloading::Library::new(library) } {
        Ok(l) => l,
        Err(e) => return Probe { path: None, version: None, error: Some(e.to_string()) },
    };
    let path = mapped(NCCL_STEM).into_iter().next().map(json_safe);
    type GetVersion = unsafe extern "C" fn(*mut i32) -> i32;
    // SAFETY: `ncclGetVersion` has this signature in every NCCL release.
    let version = match unsafe { lib.get::<GetVersion>(b"ncclGetVersion\0") } {
        Ok(f) => {
            let mut code = 0;
            // SAFETY: writes one int through a live local; needs no GPU.
            let rc = unsafe { f(&mut code) };
            (rc == 0).then(|| nccl_sys::Version::from_nccl_code(code.into()).map(|v| v.to_string())).flatten()
        }
        Err(_) => None,
    };
    let error = version.is_none().then(|| format!("{library} has no working ncclGetVersion"));
    std::mem::forget(lib);
    Probe { path, version, error }
}

/// Probes every copy whose version is not known yet (in parallel, each in its own process; the
/// library this process loaded has its version already), filling in versions.
pub fn add_versions(copies: &mut [LibCopy]) {
    let handles: Vec<_> = copies
        .iter()
        .map(|c| {
            let path = c.path.clone();
            c.version.is_none().then(|| std::thread::spawn(move || probe(&path.to_string_lossy()).version))
        })
        .collect();
    for (c, h) in copies.iter_mut().zip(handles) {
        if let Some(h) = h {
            c.version = h.join().ok().flatten();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ldconfig -p` on the GPU machine (abridged).
    const LDCONFIG: &str = "\
1234 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ml.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibnccl.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnccl.so.2
\tlibnccl.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libnccl.so
\tlibnccl-net.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libnccl-net.so
";

    #[test]
    fn ldconfig_lines() {
        assert_eq!(
            parse_ldconfig(LDCONFIG, NCCL_STEM),
            [PathBuf::from("/lib/x86_64-linux-gnu/libnccl.so.2"), PathBuf::from("/lib/x86_64-linux-gnu/libnccl.so")]
        );
        assert!(parse_ldconfig(LDCONFIG, NVSHMEM_STEM).is_empty());
    }

    #[test]
    fn copies_merge_symlinks_and_list_where_found() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("libnccl.so.2");
        std::fs::write(&real, b"x").unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("libnccl.so")).unwrap();
        std::fs::write(dir.path().join("libnvshmem_host.so.3"), b"y").unwrap();
        assert_eq!(files_in(dir.path(), NCCL_STEM).len(), 2);
        let mut copies: Vec<LibCopy> = Vec::new();
        for f in files_in(dir.path(), NCCL_STEM) {
            add_copy(&mut copies, "LD_LIBRARY_PATH", &f);
        }
        add_copy(&mut copies, "ldconfig cache", &real);
        add_copy(&mut copies, "ldconfig cache", &dir.path().join("missing.so"));
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].path, std::fs::canonicalize(&real).unwrap());
        assert_eq!(copies[0].found, ["LD_LIBRARY_PATH", "ldconfig cache"]);
    }

    #[test]
    fn maps_paths_keep_spaces_and_bytes_that_are_not_utf8() {
        use std::os::unix::ffi::OsStrExt;
        let maps: &[u8] = b"\
7f0000000000-7f0000001000 r--p 00000000 fd:01 1234                       /opt/my envs/nccl/lib/libnccl.so.2
7f0000001000-7f0000002000 r-xp 00001000 fd:01 1234                       /opt/my envs/nccl/lib/libnccl.so.2
7f0000002000-7f0000003000 r--p 00000000 fd:01 99                         /opt/caf\xe9/libnccl.so.2
7f0000003000-7f0000004000 rw-p 00000000 00:00 0 
7f0000004000-7f0000005000 rw-p 00000000 00:00 0                          [heap]
7f0000005000-7f0000006000 r--p 00000000 fd:01 77                         /usr/lib/libnvshmem_host.so.3
7f0000006000-7f0000007000 r--p 00000000 fd:01 78                         /usr/lib/libnccl.so.2 (deleted)
";
        let got = parse_maps(maps, NCCL_STEM);
        let want = [
            PathBuf::from(std::ffi::OsStr::from_bytes(b"/opt/caf\xe9/libnccl.so.2")),
            PathBuf::from("/opt/my envs/nccl/lib/libnccl.so.2"),
            PathBuf::from("/usr/lib/libnccl.so.2 (deleted)"),
        ];
        assert_eq!(got, want);
        assert_eq!(parse_maps(maps, NVSHMEM_STEM), [PathBuf::from("/usr/lib/libnvshmem_host.so.3")]);
        // The worker's and the probe's JSON still carry such a path.
        assert!(serde_json::to_string(&got[0]).is_err());
        assert_eq!(serde_json::to_string(&json_safe(got[0].clone())).unwrap(), "\"/opt/caf\u{fffd}/libnccl.so.2\"");
        assert_eq!(json_safe(got[1].clone()), got[1]);
    }

    #[test]
    fn a_missing_library_probes_to_an_error() {
        let p = probe_here("/nonexistent/libnccl.so.2");
        assert_eq!(p.path, None);
        assert!(p.error.unwrap().contains("/nonexistent/libnccl.so.2"));
    }
}
