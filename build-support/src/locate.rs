//! Finding CUDA, NCCL and NVSHMEM installs, at build time (headers and library) and at run time
//! (the shared library to load).
//!
//! # Search order
//!
//! For a library `X` (`NCCL`, `NVSHMEM`; for CUDA the home variables are `CUDA_HOME` and `CUDA_PATH`),
//! the places below are tried in this order. Every variable may also be spelled with the upper-case
//! target triple in front (see [`crate::env`]).
//!
//! 1. `X_INCLUDE_DIR` and `X_LIB_DIR` — explicit directories.
//! 2. `X_HOME` — a root with `include/` and `lib/` (or `lib64/`).
//! 3. A project-local prefix `GPUCOMM_PREFIX` holding pip-installed wheels:
//!    `$GPUCOMM_PREFIX/py/nvidia/<wheel>/`.
//! 4. The NVIDIA wheels of a Python interpreter: `X_SYS_PYTHON`, else `python3`, is asked for
//!    `nvidia.__path__` ([`crate::python`]); `<dir>/<wheel>/` is tried for each answer.
//!    `X_SYS_NO_PYTHON=1` turns this step off (no interpreter is started).
//! 5. CUDA-style roots and system folders (`/usr/local/cuda`, `/usr/include` + the multiarch lib dir,
//!    distro NVSHMEM folders such as `/usr/lib/x86_64-linux-gnu/nvshmem/13`).
//!
//! A place is accepted only if it has the header **and** one of the library files. Places named by
//! an explicit variable (1, 2) are binding: if they lack the library, the search stops with an error
//! instead of silently using something else.
//!
//! At run time a copy that the process has loaded already is taken first, when it is a supported
//! version (`runtime`: two copies in one process would not share a communicator). Then
//! ([`Locator::runtime_candidates_early`], then [`Locator::runtime_candidates_late`]) the order
//! is: `X_SYS_LIBRARY` (a file), `X_LIB_DIR`, `X_HOME`, the directory the build used, the
//! project-local prefix, the bare soname (`libnccl.so.2`), which the dynamic loader resolves through
//! `LD_LIBRARY_PATH`, rpaths and the ldconfig cache, and only as the last resort the Python wheels
//! (which starts `python3`; `X_SYS_NO_PYTHON=1` turns that step off).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::env::Env;
use crate::python::{self, NvidiaDirs};

/// Name of the variable that holds the project-local prefix.
pub const PREFIX_VAR: &str = "GPUCOMM_PREFIX";

/// What to look for: one library's file names and conventional places.
#[derive(Debug, PartialEq, Eq)]
pub struct Spec {
    /// Display name ("NCCL").
    pub name: &'static str,
    /// Prefix of the variables `<var>_INCLUDE_DIR`, `<var>_LIB_DIR`, `<var>_SYS_PYTHON`, `<var>_SYS_LIBRARY`.
    pub var: &'static str,
    /// Variables naming an install root.
    pub home_vars: &'static [&'static str],
    /// A header that must exist in the include directory.
    pub header: &'static str,
    /// Library file names, preferred first. Empty: headers only (CUDA).
    pub libraries: &'static [&'static str],
    /// Folder names under the `nvidia` namespace package of the pip wheels.
    pub wheel_dirs: &'static [&'static str],
    /// Conventional (include dir, lib dir) pairs, tried last.
    pub system: &'static [(&'static str, &'static str)],
    /// How to install it, shown when nothing was found.
    pub install_hint: &'static str,
    /// The crate whose documentation lists the variables (shown in reports).
    pub docs: &'static str,
}

/// The CUDA toolkit headers (and `nvcc` next to them). No library is needed: the driver library is
/// loaded by cudarc at run time.
pub const CUDA: Spec = Spec {
    name: "CUDA toolkit headers",
    var: "CUDA",
    home_vars: &["CUDA_HOME", "CUDA_PATH"],
    header: "cuda_runtime.h",
    libraries: &[],
    wheel_dirs: &["cu13", "cuda_runtime"],
    system: &[("/usr/local/cuda/include", ""), ("/opt/cuda/include", ""), ("/usr/include", "")],
    install_hint: "pip install nvidia-cuda-runtime nvidia-cuda-crt nvidia-cuda-cccl nvidia-cuda-nvcc nvidia-nvvm \
                   (CUDA 13 wheels), or install the CUDA toolkit and set CUDA_HOME",
    docs: "build-support",
};

/// NCCL: `nccl.h` and `libnccl.so.2`.
pub const NCCL: Spec = Spec {
    name: "NCCL",
    var: "NCCL",
    home_vars: &["NCCL_HOME"],
    header: "nccl.h",
    libraries: &["libnccl.so.2", "libnccl.so"],
    wheel_dirs: &["nccl"],
    system: &[
        ("/usr/local/cuda/include", "/usr/local/cuda/lib64"),
        ("/usr/include", "/usr/lib/x86_64-linux-gnu"),
        ("/usr/include", "/usr/lib/aarch64-linux-gnu"),
        ("/usr/include", "/usr/lib64"),
        ("/usr/local/include", "/usr/local/lib"),
    ],
    install_hint: "pip install nvidia-nccl-cu13 (or nvidia-nccl-cu12), or apt install libnccl-dev, \
                   or set NCCL_HOME to an NCCL build",
    docs: "nccl-sys",
};

/// NVSHMEM: `nvshmem_host.h` and `libnvshmem_host.so.3`.
pub const NVSHMEM: Spec = Spec {
    name: "NVSHMEM",
    var: "NVSHMEM",
    home_vars: &["NVSHMEM_HOME"],
    header: "nvshmem_host.h",
    libraries: &["libnvshmem_host.so.3", "libnvshmem_host.so"],
    wheel_dirs: &["nvshmem"],
    system: &[
        ("/usr/include/nvshmem_13", "/usr/lib/x86_64-linux-gnu/nvshmem/13"),
        ("/usr/include/nvshmem_12", "/usr/lib/x86_64-linux-gnu/nvshmem/12"),
        ("/usr/include/nvshmem_13", "/usr/lib/aarch64-linux-gnu/nvshmem/13"),
        ("/usr/include/nvshmem_13", "/usr/lib64/nvshmem/13"),
        ("/usr/include/nvshmem_12", "/usr/lib64/nvshmem/12"),
        ("/usr/local/nvshmem/include", "/usr/local/nvshmem/lib"),
        ("/opt/nvidia/nvshmem/include", "/opt/nvidia/nvshmem/lib"),
    ],
    install_hint: "pip install nvidia-nvshmem-cu13 (or nvidia-nvshmem-cu12), or apt install libnvshmem3-dev-cuda-13, \
                   or set NVSHMEM_HOME to an NVSHMEM install",
    docs: "nvshmem-sys",
};

/// A found install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    /// Where it came from, e.g. `NCCL_HOME=/opt/nccl` or `python3 wheel`.
    pub origin: String,
    /// The root of the install when there is one (the wheel folder, `X_HOME`).
    pub root: Option<PathBuf>,
    /// Directory that holds the header.
    pub include_dir: PathBuf,
    /// Directory that holds the library (None for header-only specs).
    pub lib_dir: Option<PathBuf>,
    /// The library file that was found (the first of [`Spec::libraries`] present).
    pub library: Option<PathBuf>,
}

impl Install {
    /// The install with absolute paths, a relative one (`NCCL_HOME=../nccl`) taken from the
    /// current directory: a build publishes them to its dependents' builds and to run time
    /// (`NCCL_SYS_BUILD_LIB_DIR`), which would read a relative one from other directories, miss
    /// the install, and fall through to another library than the headers'.
    fn absolute(self) -> Install {
        let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
        Install {
            origin: self.origin,
            root: self.root.map(absolute),
            include_dir: absolute(self.include_dir),
            lib_dir: self.lib_dir.map(absolute),
            library: self.library.map(absolute),
        }
    }
}

/// One place that was looked at and why it was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The place ("NCCL_HOME=/opt/nccl", "python3 wheel /…/nvidia/nccl").
    pub place: String,
    /// Why it was rejected.
    pub reason: String,
}

/// Nothing usable was found; the `Display` text is the full report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotFound {
    /// What was looked for.
    pub spec: &'static Spec,
    /// Every place looked at, in order.
    pub probes: Vec<Probe>,
    /// Every variable consulted.
    pub vars: Vec<String>,
    /// Set when an explicit variable stopped the search.
    pub stopped_by: Option<String>,
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, wanted) = (self.spec.name, wanted(self.spec));
        match &self.stopped_by {
            Some(var) => writeln!(f, "{name} not found where {var} points ({wanted}).")?,
            None => writeln!(f, "{name} not found ({wanted}).")?,
        }
        writeln!(f, "Searched, in order:")?;
        for (i, p) in self.probes.iter().enumerate() {
            writeln!(f, "  {}. {}: {}", i + 1, p.place, p.reason)?;
        }
        writeln!(f, "Variables consulted: {}", self.vars.join(", "))?;
        writeln!(f, "To fix: {}.", self.spec.install_hint)?;
        write!(
            f,
            "Point the build at an install with the variables above (the `{}` crate documentation lists them).",
            self.spec.docs
        )
    }
}

impl std::error::Error for NotFound {}

/// A group of directories to check together.
struct Place {
    label: String,
    include: Vec<PathBuf>,
    lib: Vec<PathBuf>,
    root: Option<PathBuf>,
    /// Set for places named by a variable: the variable's name; failure stops the search.
    explicit: Option<String>,
}

/// A library file to try loading at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeCandidate {
    /// Where the candidate comes from.
    pub place: String,
    /// A path to `dlopen`, or a bare soname left to the dynamic loader.
    pub path: PathBuf,
    /// Named by a variable: if it fails, loading stops there.
    pub explicit: bool,
    /// Set when the step could not offer a file (the reason); it is reported, not tried.
    pub unavailable: Option<String>,
}

/// Runs the search for a set of variables; caches Python answers.
pub struct Locator<'e> {
    env: &'e Env,
    python_answers: RefCell<BTreeMap<OsString, NvidiaDirs>>,
    /// The library whose `X_SYS_PYTHON` and `X_SYS_NO_PYTHON` also apply to the other searches
    /// ([`Locator::python_of`]).
    python_of: Option<&'static Spec>,
}

fn lib_dirs(root: &Path) -> Vec<PathBuf> {
    ["lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"].iter().map(|d| root.join(d)).collect()
}

impl<'e> Locator<'e> {
    /// A locator over `env`.
    pub fn new(env: &'e Env) -> Self {
        Locator { env, python_answers: RefCell::default(), python_of: None }
    }

    /// A locator whose searches for other libraries (the CUDA headers a -sys crate's build looks
    /// for beside its own library) also follow `spec`'s `X_SYS_PYTHON` and `X_SYS_NO_PYTHON`, when
    /// their own variables are not set: `NCCL_SYS_NO_PYTHON=1` starts no interpreter at all, and
    /// `NCCL_SYS_PYTHON` takes the CUDA headers from the same environment as NCCL.
    pub fn python_of(mut self, spec: &'static Spec) -> Self {
        self.python_of = Some(spec);
        self
    }

    /// The specs whose Python variables apply to a search for `spec`: its own, then
    /// [`Locator::python_of`]'s.
    fn python_vars<'s>(&self, spec: &'s Spec) -> impl Iterator<Item = &'s str> + use<'s, 'e> {
        std::iter::once(spec.var).chain(self.python_of.map(|p| p.var).filter(|&v| v != spec.var))
    }

    /// The interpreter asked for `spec`'s wheels: `X_SYS_PYTHON`, else `python3`.
    fn interpreter(&self, spec: &Spec) -> OsString {
        self.python_vars(spec)
            .find_map(|var| self.env.get(&format!("{var}_SYS_PYTHON")))
            .map(|v| v.value_os)
            .unwrap_or_else(|| "python3".into())
    }

    /// The `nvidia` package directories of the interpreter chosen for `spec`, with the
    /// interpreter. With `X_SYS_NO_PYTHON` set, no interpreter is started and the answer says why.
    pub fn nvidia_dirs(&self, spec: &Spec) -> (OsString, NvidiaDirs) {
        let python = self.interpreter(spec);
        let off = self.python_vars(spec).map(|var| format!("{var}_SYS_NO_PYTHON")).find(|off| self.env.flag(off));
        if let Some(off) = off {
            return (python, NvidiaDirs::NoInterpreter(format!("not asked: {off} is set")));
        }
        // A bare name is looked up on `PATH`, which then decides the install: recorded, so that
        // a build reruns when another environment (another venv's wheels) comes first.
        if !crate::env::names_a_path(&python) {
            self.env.get_exact("PATH");
        }
        let answer = self
            .python_answers
            .borrow_mut()
            .entry(python.clone())
            .or_insert_with(|| python::nvidia_dirs(&python))
            .clone();
        (python, answer)
    }

    /// The project-local prefix, if configured.
    pub fn prefix(&self) -> Option<PathBuf> {
        self.env.get(PREFIX_VAR).map(|v| v.path())
    }

    /// The places of `spec` that need no interpreter: explicit variables and the project prefix.
    /// The rest comes from [`Self::places_from_python`], called only when these all failed, so that
    /// Python is not started needlessly.
    fn places_before_python(&self, spec: &Spec) -> Vec<Place> {
        let mut places = Vec::new();
        let inc = self.env.get(&format!("{}_INCLUDE_DIR", spec.var));
        // A headers-only spec (CUDA's) has no library directory to name: `CUDA_LIB_DIR`, set for
        // other tools, must not become an explicit place without headers that stops the search.
        let lib = (!spec.libraries.is_empty()).then(|| self.env.get(&format!("{}_LIB_DIR", spec.var))).flatten();
        if inc.is_some() || lib.is_some() {
            let names: Vec<String> = [&inc, &lib].iter().filter_map(|v| v.as_ref().map(|v| v.to_string())).collect();
            places.push(Place {
                label: names.join(" + "),
                include: inc.iter().map(|v| v.path()).collect(),
                lib: lib.iter().map(|v| v.path()).collect(),
                root: None,
                explicit: Some(names.join(" / ")),
            });
        }
        for home in spec.home_vars {
            if let Some(v) = self.env.get(home) {
                let root = v.path();
                places.push(Place {
                    label: v.to_string(),
                    include: vec![root.join("include")],
                    lib: lib_dirs(&root),
                    root: Some(root),
                    explicit: Some(v.name.clone()),
                });
            }
        }
        if let Some(prefix) = self.prefix() {
            for wheel in spec.wheel_dirs {
                let root = prefix.join("py").join("nvidia").join(wheel);
                places.push(wheel_place(format!("project prefix ({PREFIX_VAR}) {}", root.display()), root));
            }
        }
        places
    }

    fn places_from_python(&self, spec: &Spec, probes: &mut Vec<Probe>) -> Vec<Place> {
        let mut places = Vec::new();
        let (python, answer) = self.nvidia_dirs(spec);
        let python = python.display();
        match answer {
            NvidiaDirs::Found(dirs) => {
                for dir in dirs {
                    for wheel in spec.wheel_dirs {
                        let root = dir.join(wheel);
                        places.push(wheel_place(format!("`{python}` wheel {}", root.display()), root));
                    }
                }
            }
            NvidiaDirs::NoPackage(why) | NvidiaDirs::NoInterpreter(why) => {
                probes.push(Probe { place: format!("`{python}` NVIDIA wheels"), reason: why })
            }
        }
        for (inc, lib) in spec.system {
            let label = if lib.is_empty() { inc.to_string() } else { format!("{inc} + {lib}") };
            places.push(Place {
                label,
                include: vec![PathBuf::from(inc)],
                lib: if lib.is_empty() { vec![] } else { vec![PathBuf::from(lib)] },
                root: None,
                explicit: None,
            });
        }
        places
    }

    /// Finds headers and library for the build.
    pub fn find(&self, spec: &'static Spec) -> Result<Install, NotFound> {
        let mut probes = Vec::new();
        let early = self.places_before_python(spec);
        for place in early {
            match check_place(spec, &place) {
                Ok(install) => return Ok(install.absolute()),
                Err(reason) => {
                    let stop = place.explicit.clone();
                    probes.push(Probe { place: place.label, reason });
                    if stop.is_some() {
                        return Err(self.not_found(spec, probes, stop));
                    }
                }
            }
        }
        let late = self.places_from_python(spec, &mut probes);
        for place in late {
            match check_place(spec, &place) {
                Ok(install) => return Ok(install.absolute()),
                Err(reason) => probes.push(Probe { place: place.label, reason }),
            }
        }
        Err(self.not_found(spec, probes, None))
    }

    fn not_found(&self, spec: &'static Spec, probes: Vec<Probe>, stopped_by: Option<String>) -> NotFound {
        NotFound { spec, probes, vars: self.env.names_read(), stopped_by }
    }

    /// The first library files to try at run time, in order: `X_SYS_LIBRARY`, the explicit
    /// directories, `build_lib_dir` (the directory the build used), the project prefix, then the
    /// bare sonames through the dynamic loader. When all of them fail, continue with
    /// [`Self::runtime_candidates_late`], the last resort, which starts Python.
    pub fn runtime_candidates_early(&self, spec: &Spec, build_lib_dir: Option<&Path>) -> Vec<RuntimeCandidate> {
        let mut out = Vec::new();
        if let Some(v) = self.env.get(&format!("{}_SYS_LIBRARY", spec.var)) {
            out.push(RuntimeCandidate { place: v.to_string(), path: v.path(), explicit: true, unavailable: None });
        }
        for place in self.places_before_python(spec) {
            push_lib_candidates(spec, &place, place.explicit.is_some(), &mut out);
        }
        // The build's directory goes after the explicit variables but before the prefix.
        if let Some(dir) = build_lib_dir {
            let pos = out.iter().position(|c| !c.explicit).unwrap_or(out.len());
            let place = Place {
                label: format!("directory used by the build {}", dir.display()),
                include: vec![],
                lib: vec![dir.to_path_buf()],
                root: None,
                explicit: None,
            };
            let mut build = Vec::new();
            push_lib_candidates(spec, &place, false, &mut build);
            out.splice(pos..pos, build);
        }
        out.extend(spec.libraries.iter().map(|name| RuntimeCandidate {
            place: format!("dynamic loader search path (LD_LIBRARY_PATH, rpath, ldconfig) for {name}"),
            path: PathBuf::from(name),
            explicit: false,
            unavailable: None,
        }));
        out
    }

    /// The last resort at run time: the Python wheels (this starts the interpreter, unless
    /// `X_SYS_NO_PYTHON` is set, in which case the answer is one failed attempt saying so).
    pub fn runtime_candidates_late(&self, spec: &Spec) -> Vec<RuntimeCandidate> {
        let (interpreter, answer) = self.nvidia_dirs(spec);
        let python = interpreter.display();
        let last_resort = |what: String| format!("last resort: {what} (set {}_SYS_NO_PYTHON=1 to skip)", spec.var);
        let dirs = match answer {
            NvidiaDirs::Found(dirs) => dirs,
            NvidiaDirs::NoPackage(why) | NvidiaDirs::NoInterpreter(why) => {
                return vec![RuntimeCandidate {
                    place: last_resort(format!("`{python}` NVIDIA wheels")),
                    path: PathBuf::from(&interpreter),
                    explicit: false,
                    unavailable: Some(why),
                }]
            }
        };
        let mut out = Vec::new();
        for dir in dirs {
            for wheel in spec.wheel_dirs {
                let root = dir.join(wheel);
                let place = wheel_place(last_resort(format!("`{python}` wheel {}", root.display())), root);
                push_lib_candidates(spec, &place, false, &mut out);
            }
        }
        if out.is_empty() {
            out.push(RuntimeCandidate {
                place: last_resort(format!("`{python}` NVIDIA wheels")),
                path: PathBuf::from(&interpreter),
                explicit: false,
                unavailable: Some(format!(
                    "no {} in its `nvidia/{}` folders",
                    spec.libraries[0],
                    spec.wheel_dirs.join("|")
                )),
            });
        }
        out
    }
}

fn wheel_place(label: String, root: PathBuf) -> Place {
    Place { label, include: vec![root.join("include")], lib: lib_dirs(&root), root: Some(root), explicit: None }
}

fn wanted(spec: &Spec) -> String {
    if spec.libraries.is_empty() {
        format!("header {}", spec.header)
    } else {
        format!("header {} and library {}", spec.header, spec.libraries.join(" or "))
    }
}

fn find_library(spec: &Spec, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter().find_map(|d| spec.libraries.iter().map(|l| d.join(l)).find(|p| p.is_file()))
}

fn check_place(spec: &Spec, place: &Place) -> Result<Install, String> {
    let include_dir = place.include.iter().find(|d| d.join(spec.header).is_file()).cloned();
    let library = find_library(spec, &place.lib);
    let missing_header = || {
        let dirs: Vec<String> = place.include.iter().map(|d| d.display().to_string()).collect();
        if dirs.is_empty() {
            "no include directory given".to_string()
        } else {
            format!("no {} in {}", spec.header, dirs.join(", "))
        }
    };
    let missing_lib = || {
        let dirs: Vec<String> = place.lib.iter().map(|d| d.display().to_string()).collect();
        if dirs.is_empty() {
            "no library directory given".to_string()
        } else {
            format!("no {} in {}", spec.libraries.join(" or "), dirs.join(", "))
        }
    };
    match (include_dir, library) {
        (Some(include_dir), lib) if spec.libraries.is_empty() || lib.is_some() => Ok(Install {
            origin: place.label.clone(),
            root: place.root.clone(),
            include_dir,
            lib_dir: lib.as_ref().and_then(|l| l.parent().map(Path::to_path_buf)),
            library: lib,
        }),
        (Some(_), _) => Err(missing_lib()),
        (None, lib) if spec.libraries.is_empty() || lib.is_some() => Err(missing_header()),
        (None, _) => Err(format!("{}; {}", missing_header(), missing_lib())),
    }
}

fn push_lib_candidates(spec: &Spec, place: &Place, explicit: bool, out: &mut Vec<RuntimeCandidate>) {
    let first = || place.lib.first().cloned().unwrap_or_default().join(spec.libraries[0]);
    match find_library(spec, &place.lib) {
        Some(path) => out.push(RuntimeCandidate { place: place.label.clone(), path, explicit, unavailable: None }),
        // Variables that give no library directory (`X_INCLUDE_DIR` alone, which only the build
        // reads) offer nothing to load.
        None if place.lib.is_empty() => {}
        // An explicit place without the library is kept as a failing candidate so that loading
        // stops there with a precise message.
        None if explicit => {
            out.push(RuntimeCandidate { place: place.label.clone(), path: first(), explicit, unavailable: None })
        }
        // Any other place was searched too: reported, not tried.
        None => out.push(RuntimeCandidate {
            place: place.label.clone(),
            path: first(),
            explicit,
            unavailable: Some(format!(
                "no {} in {}",
                spec.libraries.join(" or "),
                place.lib.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
            )),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn touch(p: &Path) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, b"").unwrap();
    }

    /// An NCCL install: `<root>/{include/nccl.h, lib/libnccl.so.2}`.
    fn fake_nccl(root: &Path) {
        touch(&root.join("include/nccl.h"));
        touch(&root.join("lib/libnccl.so.2"));
    }

    /// A wheel-shaped tree: `<root>/py/nvidia/nccl/{include/nccl.h, lib/libnccl.so.2}`.
    fn fake_prefix(root: &Path) {
        fake_nccl(&root.join("py/nvidia/nccl"));
    }

    /// Session 29 audit: nccl-sys's build searches the CUDA headers too, and that search read
    /// `CUDA_SYS_*` only: `NCCL_SYS_NO_PYTHON=1` still started `python3` for them, and
    /// `NCCL_SYS_PYTHON` took NCCL from one environment and the CUDA headers from another. A
    /// locator made for NCCL now applies NCCL's variables to the CUDA search where CUDA's own are
    /// not set.
    #[test]
    fn a_librarys_python_variables_apply_to_its_cuda_search() {
        let env = Env::from_pairs(None, [("NCCL_SYS_NO_PYTHON", "1")]);
        let (_, answer) = Locator::new(&env).python_of(&NCCL).nvidia_dirs(&CUDA);
        assert_eq!(answer, NvidiaDirs::NoInterpreter("not asked: NCCL_SYS_NO_PYTHON is set".into()));
        assert!(!env.names_read().iter().any(|n| n == "PATH"), "{:?}", env.names_read());
        let env = Env::from_pairs(None, [("NCCL_SYS_PYTHON", "/venv/bin/python")]);
        assert_eq!(Locator::new(&env).python_of(&NCCL).interpreter(&CUDA), "/venv/bin/python");
        assert_eq!(Locator::new(&env).interpreter(&CUDA), "python3", "only for the library it was made for");
        let env = Env::from_pairs(None, [("NCCL_SYS_PYTHON", "/venv/bin/python"), ("CUDA_SYS_PYTHON", "/cuda/python")]);
        assert_eq!(Locator::new(&env).python_of(&NCCL).interpreter(&CUDA), "/cuda/python", "CUDA's own comes first");
    }

    #[test]
    fn project_prefix_is_found() {
        let tmp = tempfile::tempdir().unwrap();
        fake_prefix(tmp.path());
        let prefix = tmp.path().to_str().unwrap();
        let env = Env::from_pairs(None, [("GPUCOMM_PREFIX", prefix), ("NCCL_SYS_PYTHON", "/nonexistent/py")]);
        let install = Locator::new(&env).find(&NCCL).unwrap();
        assert_eq!(install.include_dir, tmp.path().join("py/nvidia/nccl/include"));
        assert_eq!(install.library.unwrap(), tmp.path().join("py/nvidia/nccl/lib/libnccl.so.2"));
        assert_eq!(install.root.unwrap(), tmp.path().join("py/nvidia/nccl"));
    }

    #[test]
    fn home_wins_over_prefix_and_accepts_unversioned_lib64() {
        let tmp = tempfile::tempdir().unwrap();
        fake_prefix(&tmp.path().join("prefix"));
        let home = tmp.path().join("home");
        touch(&home.join("include/nccl.h"));
        touch(&home.join("lib64/libnccl.so"));
        let env = Env::from_pairs(
            None,
            [("GPUCOMM_PREFIX", tmp.path().join("prefix").to_str().unwrap()), ("NCCL_HOME", home.to_str().unwrap())],
        );
        let install = Locator::new(&env).find(&NCCL).unwrap();
        assert_eq!(install.origin, format!("NCCL_HOME={}", home.display()));
        assert_eq!(install.library.unwrap(), home.join("lib64/libnccl.so"));
    }

    /// Session 29 audit: a relative `NCCL_HOME` gave relative directories, which the build
    /// publishes to its dependents and to run time, where they are read from other directories.
    #[test]
    fn a_relative_home_gives_absolute_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        fake_nccl(&home);
        // The same directory, written relative to this process's current directory.
        let cwd = std::env::current_dir().unwrap();
        let up = "../".repeat(cwd.components().count() - 1);
        let relative = PathBuf::from(up).join(home.strip_prefix("/").unwrap());
        assert!(relative.is_relative() && relative.join("include/nccl.h").exists(), "{}", relative.display());
        let env = Env::from_pairs(None, [("NCCL_HOME", relative.as_os_str())]);
        let install = Locator::new(&env).find(&NCCL).unwrap();
        for dir in [&install.include_dir, install.lib_dir.as_ref().unwrap(), install.library.as_ref().unwrap()] {
            assert!(dir.is_absolute(), "{}", dir.display());
            assert!(dir.exists(), "{}", dir.display());
        }
    }

    #[test]
    fn explicit_home_without_library_is_an_error_not_a_fallthrough() {
        let tmp = tempfile::tempdir().unwrap();
        fake_prefix(&tmp.path().join("prefix"));
        let empty = tmp.path().join("empty");
        fs::create_dir_all(&empty).unwrap();
        let env = Env::from_pairs(
            None,
            [("GPUCOMM_PREFIX", tmp.path().join("prefix").to_str().unwrap()), ("NCCL_HOME", empty.to_str().unwrap())],
        );
        let err = Locator::new(&env).find(&NCCL).unwrap_err();
        assert_eq!(err.stopped_by.as_deref(), Some("NCCL_HOME"));
        assert_eq!(err.probes.len(), 1);
        let text = err.to_string();
        assert!(text.contains("NCCL not found where NCCL_HOME points"), "{text}");
        assert!(text.contains(&format!("no nccl.h in {}", empty.join("include").display())), "{text}");
        assert!(text.contains("To fix: pip install nvidia-nccl-cu13"), "{text}");
        assert!(text.contains("the `nccl-sys` crate documentation lists them"), "{text}");
        assert!(!text.contains("dev.sh"), "{text}");
    }

    #[test]
    fn include_and_lib_dirs_must_both_hold_their_file() {
        let tmp = tempfile::tempdir().unwrap();
        touch(&tmp.path().join("inc/nccl.h"));
        let env = Env::from_pairs(
            None,
            [
                ("NCCL_INCLUDE_DIR", tmp.path().join("inc").to_str().unwrap()),
                ("NCCL_LIB_DIR", tmp.path().join("lib").to_str().unwrap()),
            ],
        );
        let err = Locator::new(&env).find(&NCCL).unwrap_err();
        assert!(err.probes[0].reason.starts_with("no libnccl.so.2 or libnccl.so in"), "{:?}", err.probes);
        touch(&tmp.path().join("lib/libnccl.so.2"));
        assert!(Locator::new(&env).find(&NCCL).is_ok());
    }

    #[test]
    fn nothing_found_lists_every_place_and_variable() {
        let tmp = tempfile::tempdir().unwrap();
        let env = Env::from_pairs(
            Some("x86_64-unknown-linux-gnu"),
            [("GPUCOMM_PREFIX", tmp.path().to_str().unwrap()), ("NVSHMEM_SYS_PYTHON", "/nonexistent/python")],
        );
        let err = Locator::new(&env).find(&NVSHMEM).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("NVSHMEM not found (header nvshmem_host.h and library libnvshmem_host.so.3"),
            "{text}"
        );
        assert!(text.contains("project prefix (GPUCOMM_PREFIX)"), "{text}");
        assert!(text.contains("`/nonexistent/python` NVIDIA wheels: could not run"), "{text}");
        assert!(text.contains("/usr/include/nvshmem_13 + /usr/lib/x86_64-linux-gnu/nvshmem/13"), "{text}");
        for var in
            ["X86_64_UNKNOWN_LINUX_GNU_NVSHMEM_HOME", "NVSHMEM_HOME", "NVSHMEM_INCLUDE_DIR", "NVSHMEM_SYS_PYTHON"]
        {
            assert!(err.vars.iter().any(|v| v == var), "{var} missing from {:?}", err.vars);
        }
        assert!(text.contains("pip install nvidia-nvshmem-cu13"), "{text}");
    }

    #[test]
    fn python_wheels_are_found_through_the_interpreter() {
        let tmp = tempfile::tempdir().unwrap();
        let site = tmp.path().join("site");
        fake_nccl(&site.join("nvidia/nccl"));
        // A stand-in interpreter: prints the sentinel line whatever it is asked.
        let script = tmp.path().join("fake-python");
        fs::write(&script, format!("#!/bin/sh\necho noise\necho GPUCOMM_NVIDIA_DIR={}/nvidia\n", site.display()))
            .unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        let env = Env::from_pairs(None, [("NCCL_SYS_PYTHON", script.to_str().unwrap())]);
        let install = Locator::new(&env).find(&NCCL).unwrap();
        assert!(install.origin.contains("wheel"), "{}", install.origin);
        assert_eq!(install.lib_dir.unwrap(), site.join("nvidia/nccl/lib"));

        // At run time the wheel is the last resort, after the sonames, and says so.
        let locator = Locator::new(&env);
        let early = locator.runtime_candidates_early(&NCCL, None);
        assert_eq!(early.last().unwrap().path, PathBuf::from("libnccl.so"));
        let late = locator.runtime_candidates_late(&NCCL);
        assert_eq!(late[0].path, site.join("nvidia/nccl/lib/libnccl.so.2"));
        assert!(late[0].place.starts_with("last resort: "), "{}", late[0].place);
        assert!(late[0].place.ends_with("(set NCCL_SYS_NO_PYTHON=1 to skip)"), "{}", late[0].place);

        // NCCL_SYS_NO_PYTHON turns the step off: no interpreter runs, and the report says why.
        let env = Env::from_pairs(None, [("NCCL_SYS_PYTHON", "/nonexistent/python"), ("NCCL_SYS_NO_PYTHON", "1")]);
        let late = Locator::new(&env).runtime_candidates_late(&NCCL);
        assert_eq!(late.len(), 1);
        assert_eq!(late[0].unavailable.as_deref(), Some("not asked: NCCL_SYS_NO_PYTHON is set"));
    }

    #[test]
    fn runtime_order_explicit_file_then_home_then_build_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        touch(&home.join("lib/libnccl.so.2"));
        let build = tmp.path().join("build");
        touch(&build.join("libnccl.so.2"));
        let env =
            Env::from_pairs(None, [("NCCL_SYS_LIBRARY", "/x/libnccl.so.2"), ("NCCL_HOME", home.to_str().unwrap())]);
        let c = Locator::new(&env).runtime_candidates_early(&NCCL, Some(&build));
        let paths: Vec<_> = c.iter().map(|c| c.path.clone()).collect();
        assert_eq!(
            paths,
            [
                PathBuf::from("/x/libnccl.so.2"),
                home.join("lib/libnccl.so.2"),
                build.join("libnccl.so.2"),
                PathBuf::from("libnccl.so.2"),
                PathBuf::from("libnccl.so")
            ]
        );
        assert_eq!(c.iter().map(|c| c.explicit).collect::<Vec<_>>(), [true, true, false, false, false]);
    }

    /// Paths need not be UTF-8: such a variable is used as it is, and binding like any other (it
    /// was taken for unset, and the search went on to other installs without reporting it).
    #[test]
    fn variables_naming_paths_that_are_not_utf8_are_used_and_binding() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir().unwrap();
        fake_prefix(&tmp.path().join("prefix"));
        let home = tmp.path().join(OsStr::from_bytes(b"home\xff"));
        touch(&home.join("include/nccl.h"));
        touch(&home.join("lib/libnccl.so.2"));
        let prefix = tmp.path().join("prefix");
        let env = Env::from_pairs(None, [("GPUCOMM_PREFIX", prefix.as_os_str()), ("NCCL_HOME", home.as_os_str())]);
        assert_eq!(Locator::new(&env).find(&NCCL).unwrap().library.unwrap(), home.join("lib/libnccl.so.2"));

        let missing = tmp.path().join(OsStr::from_bytes(b"\xffnccl"));
        let env = Env::from_pairs(None, [("GPUCOMM_PREFIX", prefix.as_os_str()), ("NCCL_HOME", missing.as_os_str())]);
        let err = Locator::new(&env).find(&NCCL).unwrap_err();
        assert_eq!(err.stopped_by.as_deref(), Some("NCCL_HOME"));
        assert_eq!(err.probes[0].place, format!("NCCL_HOME={}", missing.display()));

        let library = OsStr::from_bytes(b"/tmp/\xffnccl/libnccl.so.2");
        let env = Env::from_pairs(None, [("GPUCOMM_PREFIX", prefix.as_os_str()), ("NCCL_SYS_LIBRARY", library)]);
        let c = Locator::new(&env).runtime_candidates_early(&NCCL, None);
        assert_eq!((c[0].path.as_os_str(), c[0].explicit), (library, true));
        assert!(c[0].place.starts_with("NCCL_SYS_LIBRARY=/tmp/"), "{}", c[0].place);
    }

    #[test]
    fn an_interpreter_found_on_path_makes_path_an_input() {
        let env = Env::from_pairs(None, [("NCCL_SYS_PYTHON", "gpucomm-no-such-python3")]);
        let (_, answer) = Locator::new(&env).nvidia_dirs(&NCCL);
        assert!(matches!(answer, NvidiaDirs::NoInterpreter(_)), "{answer:?}");
        assert!(env.names_read().iter().any(|n| n == "PATH"), "{:?}", env.names_read());
    }

    #[test]
    fn runtime_candidates_report_every_place_and_skip_a_header_only_variable() {
        // NCCL_INCLUDE_DIR alone (read by builds only) made an explicit candidate of the bare
        // soname, tried before the build's directory, and loading stopped there; a prefix and a
        // build directory without the library went unreported.
        let tmp = tempfile::tempdir().unwrap();
        let build = tmp.path().join("build");
        touch(&build.join("libnccl.so.2"));
        let env = Env::from_pairs(None, [("NCCL_INCLUDE_DIR", "/x/include")]);
        let c = Locator::new(&env).runtime_candidates_early(&NCCL, Some(&build));
        assert_eq!(c[0].path, build.join("libnccl.so.2"));
        assert!(!c[0].explicit);
        let empty = tmp.path().join("empty");
        fs::create_dir_all(&empty).unwrap();
        let env = Env::from_pairs(None, [("GPUCOMM_PREFIX", empty.to_str().unwrap())]);
        let c = Locator::new(&env).runtime_candidates_early(&NCCL, Some(&empty));
        let reported: Vec<_> = c.iter().filter(|c| c.unavailable.is_some()).map(|c| c.place.as_str()).collect();
        assert!(reported.iter().any(|p| p.starts_with("directory used by the build")), "{reported:?}");
        assert!(reported.iter().any(|p| p.contains("GPUCOMM_PREFIX")), "{reported:?}");
    }

    #[test]
    fn cuda_needs_headers_only() {
        let tmp = tempfile::tempdir().unwrap();
        touch(&tmp.path().join("include/cuda_runtime.h"));
        let env = Env::from_pairs(None, [("CUDA_PATH", tmp.path().to_str().unwrap())]);
        let install = Locator::new(&env).find(&CUDA).unwrap();
        assert_eq!(install.origin, format!("CUDA_PATH={}", tmp.path().display()));
        assert_eq!(install.library, None);
        // CUDA_LIB_DIR (set for other tools) named an explicit place without headers that
        // stopped the search before CUDA_PATH.
        let env = Env::from_pairs(None, [("CUDA_LIB_DIR", "/x/lib64"), ("CUDA_PATH", tmp.path().to_str().unwrap())]);
        let install = Locator::new(&env).find(&CUDA).unwrap();
        assert_eq!(install.origin, format!("CUDA_PATH={}", tmp.path().display()));
    }
}
