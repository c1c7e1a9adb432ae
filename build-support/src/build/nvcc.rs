//! Running `nvcc`: finding it, the target architectures, one compilation ([`Job`]) and its
//! results (the input files it read, its diagnostics).
//!
//! Most build scripts want the higher-level [`crate::build::cu::Kernels`]; this layer is for
//! one-off compilations such as layout checks (`static_assert`s compiled by [`Nvcc::check`]).
//!
//! * **Which nvcc**: `NVCC` (a path, or a name looked up on `PATH`; when set, nothing else is
//!   tried), else `<CUDA root>/bin/nvcc` of the CUDA install that [`crate::locate::CUDA`] found
//!   (for the pip wheels `nvidia/cu13/bin/nvcc`), else `nvcc` on `PATH`. When none is found the
//!   error lists every place searched and every variable consulted.
//! * **Architectures** come from `CUDA_ARCHS` (comma-separated compute capabilities such as `80,90`
//!   or `90a`; default [`DEFAULT_ARCHS`]), never from the build machine's GPU. One architecture
//!   gives a `.cubin`, several a `.fatbin`; both load with `cuModuleLoadData`.
//! * **Flags**: `-std=c++17`, CCCL on the include path (`<cuda>/include/cccl` when it exists),
//!   `-ccbin $NVCC_CCBIN` when set. nvcc's own `NVCC_PREPEND_FLAGS` / `NVCC_APPEND_FLAGS` are
//!   passed through, recorded and shown with the command line.
//! * **Errors** name the file and line nvcc complained about, the nvcc that ran and how it was
//!   found, the exact command line and nvcc's full output ([`CompileError`]).
//! * **Dependencies**: every compilation writes a dependency file (`-MD -MF`); [`Compiled::inputs`]
//!   lists the files the result depends on (the source, every header it included, device
//!   libraries, nvcc itself).

pub mod depfile;
pub mod diagnostic;

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use crate::build::error::{CompileError, CuError};
use crate::env::{Env, Var};
use crate::locate::{Install, Probe};
use diagnostic::{Diagnostic, Severity};

/// Default `CUDA_ARCHS`: Hopper (H100/H200).
pub const DEFAULT_ARCHS: &str = "90";

/// nvcc's own variables, passed through to it and recorded.
const NVCC_OWN_VARS: [&str; 2] = ["NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS"];

/// A target architecture: compute capability `number` (`90` is 9.0) with an optional feature-set
/// suffix (`90a`: architecture-specific features such as `wgmma`, loads only on 9.0 devices).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Arch {
    /// Major × 10 + minor.
    pub number: u32,
    /// `a` or `f`, if given.
    pub suffix: Option<char>,
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.number)?;
        self.suffix.map_or(Ok(()), |s| write!(f, "{s}"))
    }
}

impl Arch {
    fn gencode(self) -> OsString {
        format!("-gencode=arch=compute_{self},code=sm_{self}").into()
    }
}

/// Reads `CUDA_ARCHS` (default [`DEFAULT_ARCHS`]): `"80, sm_90a"` → `[80, 90a]`.
pub fn archs_from(env: &Env) -> Result<Vec<Arch>, CuError> {
    let Some(var) = env.get("CUDA_ARCHS") else {
        return parse_archs(DEFAULT_ARCHS).ok_or(CuError::Archs { value: DEFAULT_ARCHS.to_string() });
    };
    // Not UTF-8: refused like any other unreadable list, not taken for unset.
    var.text().and_then(parse_archs).ok_or(CuError::Archs { value: var.value })
}

fn parse_archs(text: &str) -> Option<Vec<Arch>> {
    let mut archs: Vec<Arch> = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let s = s.strip_prefix("sm_").or_else(|| s.strip_prefix("compute_")).unwrap_or(s);
            let (digits, suffix) = match s.strip_suffix(['a', 'f']) {
                Some(d) => (d, s.chars().last()),
                None => (s, None),
            };
            Some(Arch { number: digits.parse().ok()?, suffix })
        })
        .collect::<Option<_>>()?;
    archs.sort();
    archs.dedup();
    (!archs.is_empty()).then_some(archs)
}

/// Runs a prepared command and returns its output: the process by default; tests inject their
/// own (to count invocations, say). Any `Fn(&mut Command) -> io::Result<Output>` is a runner.
pub trait Runner: Send + Sync {
    /// Runs `command` to completion, capturing stdout and stderr.
    fn output(&self, command: &mut Command) -> std::io::Result<Output>;
}

impl<F: Fn(&mut Command) -> std::io::Result<Output> + Send + Sync> Runner for F {
    fn output(&self, command: &mut Command) -> std::io::Result<Output> {
        self(command)
    }
}

fn run_process(command: &mut Command) -> std::io::Result<Output> {
    command.output()
}

/// A configured `nvcc`: the binary, the architectures and the flags every compilation gets.
#[derive(Clone)]
pub struct Nvcc {
    program: PathBuf,
    found_via: String,
    archs: Vec<Arch>,
    flags: Vec<OsString>,
    own_vars: Vec<Var>,
    runner: Arc<dyn Runner>,
}

impl fmt::Debug for Nvcc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nvcc")
            .field("program", &self.program)
            .field("found_via", &self.found_via)
            .field("archs", &self.archs)
            .field("flags", &self.flags)
            .field("own_vars", &self.own_vars)
            .finish_non_exhaustive()
    }
}

/// A planned compilation: one nvcc run, or two for device-linked modules.
#[derive(Debug, Clone)]
pub struct Job {
    source: PathBuf,
    steps: Vec<Vec<OsString>>,
    depfile: PathBuf,
    libs: Vec<PathBuf>,
}

impl Job {
    /// The `.cu` file compiled.
    pub fn source(&self) -> &Path {
        &self.source
    }
}

/// What a successful compilation produced besides its output file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// Every file the result depends on: nvcc, the source, each header it included (from nvcc's
    /// dependency file; canonical paths), and the device libraries linked in.
    pub inputs: Vec<PathBuf>,
    /// nvcc's warnings.
    pub warnings: Vec<Diagnostic>,
}

impl Nvcc {
    /// Finds `nvcc` and reads `CUDA_ARCHS`, `NVCC_CCBIN`, `NVCC_PREPEND_FLAGS` and
    /// `NVCC_APPEND_FLAGS` from `env`. `cuda` is the CUDA install the locator found, if any.
    pub fn locate(env: &Env, cuda: Option<&Install>) -> Result<Nvcc, CuError> {
        let archs = archs_from(env)?;
        let (program, found_via) = find_program(env, cuda)?;
        let mut flags: Vec<OsString> = vec!["-std=c++17".into()];
        if let Some(ccbin) = env.get("NVCC_CCBIN") {
            flags.extend(["-ccbin".into(), ccbin.value_os]);
        }
        let toolkit_root = program.parent().and_then(Path::parent).map(Path::to_path_buf);
        let cccl = toolkit_root
            .into_iter()
            .chain(cuda.and_then(cuda_root))
            .map(|r| r.join("include/cccl"))
            .find(|d| d.is_dir());
        if let Some(cccl) = cccl {
            flags.push(include_flag(&cccl));
        }
        let own_vars = NVCC_OWN_VARS.iter().filter_map(|n| env.get_exact(n)).collect();
        Ok(Nvcc { program, found_via, archs, flags, own_vars, runner: Arc::new(run_process) })
    }

    /// The `nvcc` that runs.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// How it was found: `NVCC=/opt/cuda/bin/nvcc`, `PATH`, or `the CUDA install of <where the
    /// CUDA search found it>`.
    pub fn found_via(&self) -> &str {
        &self.found_via
    }

    /// The target architectures.
    pub fn archs(&self) -> &[Arch] {
        &self.archs
    }

    /// `cubin` for one architecture, `fatbin` for several.
    pub fn image_extension(&self) -> &'static str {
        if self.archs.len() == 1 {
            "cubin"
        } else {
            "fatbin"
        }
    }

    /// Adds an include directory to every compilation.
    pub fn include(&mut self, dir: &Path) -> &mut Self {
        self.flags.push(include_flag(dir));
        self
    }

    /// Adds a raw flag to every compilation (not to the device-link step).
    pub fn flag(&mut self, flag: impl Into<OsString>) -> &mut Self {
        self.flags.push(flag.into());
        self
    }

    /// Replaces the process runner (tests: count or fake invocations).
    pub fn set_runner(&mut self, runner: Arc<dyn Runner>) -> &mut Self {
        self.runner = runner;
        self
    }

    fn gencodes(&self) -> impl Iterator<Item = OsString> + '_ {
        self.archs.iter().map(|a| a.gencode())
    }

    fn image_flag(&self) -> OsString {
        format!("-{}", self.image_extension()).into()
    }

    /// Plans `src` → module image `out` (no relocatable device code); the dependency file is
    /// `out` with the extension `d`.
    pub fn module_job(&self, src: &Path, out: &Path) -> Job {
        let depfile = out.with_extension("d");
        let mut args = self.flags.clone();
        args.extend(self.gencodes());
        args.extend([self.image_flag(), src.into(), "-o".into(), out.into()]);
        args.extend(depfile_flags(&depfile));
        Job { source: src.to_path_buf(), steps: vec![args], depfile, libs: vec![] }
    }

    /// Plans `src` compiled with `-rdc=true` into `obj`, then device-linked with `libs` (such as
    /// `libnvshmem_device.a`) into one self-contained module image `out`.
    pub fn device_linked_job(&self, src: &Path, libs: &[&Path], obj: &Path, out: &Path) -> Job {
        let depfile = out.with_extension("d");
        let mut compile = self.flags.clone();
        compile.extend(self.gencodes());
        compile.extend(["-rdc=true".into(), "-c".into(), src.into(), "-o".into(), obj.into()]);
        compile.extend(depfile_flags(&depfile));
        let mut link: Vec<OsString> = self.gencodes().collect();
        link.extend(["-dlink".into(), self.image_flag(), obj.into()]);
        link.extend(libs.iter().map(|l| l.as_os_str().to_owned()));
        link.extend(["-o".into(), out.into()]);
        let libs = libs.iter().map(|l| l.to_path_buf()).collect();
        Job { source: src.to_path_buf(), steps: vec![compile, link], depfile, libs }
    }

    /// Plans a compile-only check of `src` (`-c` to the throw-away object `obj`): for
    /// `static_assert`s.
    pub fn check_job(&self, src: &Path, obj: &Path) -> Job {
        let depfile = obj.with_extension("d");
        let mut args = self.flags.clone();
        args.extend(self.gencodes());
        args.extend(["-c".into(), src.into(), "-o".into(), obj.into()]);
        args.extend(depfile_flags(&depfile));
        Job { source: src.to_path_buf(), steps: vec![args], depfile, libs: vec![] }
    }

    /// The exact command lines of `job`, one per line, with nvcc's own variables in front when
    /// set. Identical text means an identical compilation.
    pub fn describe(&self, job: &Job) -> String {
        job.steps.iter().map(|s| self.command_line(s)).collect::<Vec<_>>().join("\n")
    }

    fn command_line(&self, args: &[OsString]) -> String {
        let vars = self.own_vars.iter().map(|v| format!("{}={}", v.name, quote(&v.value_os)));
        let words = std::iter::once(quote(self.program.as_os_str())).chain(args.iter().map(|a| quote(a)));
        vars.chain(words).collect::<Vec<_>>().join(" ")
    }

    /// Runs `job`: every step, then reads the dependency file.
    pub fn run(&self, job: &Job) -> Result<Compiled, CuError> {
        let mut warnings = Vec::new();
        for step in &job.steps {
            let mut command = Command::new(&self.program);
            command.args(step);
            for name in NVCC_OWN_VARS {
                command.env_remove(name);
            }
            command.envs(self.own_vars.iter().map(|v| (&v.name, &v.value_os)));
            let output = self.runner.output(&mut command).map_err(|error| CuError::NvccNotRunnable {
                program: self.program.clone(),
                found_via: self.found_via.clone(),
                command: self.command_line(step),
                error,
            })?;
            let text = [&output.stdout, &output.stderr]
                .iter()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .filter(|t| !t.trim().is_empty())
                .collect::<Vec<_>>()
                .join("\n");
            let diagnostics = diagnostic::parse(&text);
            if !output.status.success() {
                return Err(CuError::Compile(Box::new(CompileError {
                    source_file: job.source.clone(),
                    nvcc: self.program.clone(),
                    found_via: self.found_via.clone(),
                    command: self.command_line(step),
                    status: output.status,
                    output: text,
                    diagnostics,
                })));
            }
            warnings.extend(diagnostics.into_iter().filter(|d| d.severity == Severity::Warning));
        }
        let deps = std::fs::read_to_string(&job.depfile).map_err(|error| CuError::Io {
            action: "cannot read nvcc's dependency file",
            path: job.depfile.clone(),
            error,
        })?;
        let cwd = std::env::current_dir().unwrap_or_default();
        let listed = depfile::parse(&deps, &cwd);
        let mut inputs: Vec<PathBuf> = Vec::new();
        let all = std::iter::once(&self.program).chain(std::iter::once(&job.source)).chain(&listed).chain(&job.libs);
        for path in all {
            let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            if !inputs.contains(&path) {
                inputs.push(path);
            }
        }
        Ok(Compiled { inputs, warnings })
    }

    /// Compiles `src` into the module image `out` (see [`Self::module_job`]).
    pub fn module(&self, src: &Path, out: &Path) -> Result<Compiled, CuError> {
        self.run(&self.module_job(src, out))
    }

    /// Compiles and device-links `src` with `libs` into `out` (see [`Self::device_linked_job`]).
    pub fn device_linked_module(
        &self,
        src: &Path,
        libs: &[&Path],
        obj: &Path,
        out: &Path,
    ) -> Result<Compiled, CuError> {
        self.run(&self.device_linked_job(src, libs, obj, out))
    }

    /// Only checks that `src` compiles (see [`Self::check_job`]).
    pub fn check(&self, src: &Path, obj: &Path) -> Result<Compiled, CuError> {
        self.run(&self.check_job(src, obj))
    }
}

fn include_flag(dir: &Path) -> OsString {
    let mut flag = OsString::from("-I");
    flag.push(dir);
    flag
}

fn depfile_flags(depfile: &Path) -> [OsString; 3] {
    ["-MD".into(), "-MF".into(), depfile.into()]
}

/// The root of a CUDA install: its recorded root, else the parent of its include directory.
fn cuda_root(cuda: &Install) -> Option<PathBuf> {
    cuda.root.clone().or_else(|| cuda.include_dir.parent().map(Path::to_path_buf))
}

/// `NVCC` → the CUDA install's `bin/nvcc` → `PATH`.
fn find_program(env: &Env, cuda: Option<&Install>) -> Result<(PathBuf, String), CuError> {
    let not_found = |searched, stopped_by| CuError::NvccNotFound { searched, vars: env.names_read(), stopped_by };
    if let Some(var) = env.get("NVCC") {
        let (found, reason) = if var.has_slash() {
            let path = var.path();
            (path.is_file().then_some(path), "no such file".to_string())
        } else {
            let dirs = env.get_exact("PATH").map(|v| v.value_os).unwrap_or_default();
            (search_path(&dirs, &var.value_os), format!("not found in any directory of PATH ({})", dirs.display()))
        };
        return match found {
            Some(path) => Ok((path, var.to_string())),
            None => Err(not_found(vec![Probe { place: var.to_string(), reason }], Some(var.name))),
        };
    }
    let mut searched = vec![Probe { place: "NVCC".into(), reason: "not set".into() }];
    match cuda.and_then(|c| Some((c, cuda_root(c)?))) {
        Some((install, root)) => {
            let candidate = root.join("bin/nvcc");
            let place = format!("the CUDA install of {}", install.origin);
            if candidate.is_file() {
                return Ok((candidate, place));
            }
            searched.push(Probe { place, reason: format!("no {}", candidate.display()) });
        }
        None => searched.push(Probe {
            place: "the CUDA toolkit".into(),
            reason: "none found (CUDA_HOME, CUDA_PATH, the project prefix, the Python wheels, /usr/local/cuda)".into(),
        }),
    }
    let dirs = env.get_exact("PATH").map(|v| v.value_os).unwrap_or_default();
    if let Some(path) = search_path(&dirs, OsStr::new("nvcc")) {
        return Ok((path, "PATH".into()));
    }
    searched.push(Probe {
        place: format!("PATH ({})", dirs.display()),
        reason: "no nvcc in any of its directories".into(),
    });
    Err(not_found(searched, None))
}

fn search_path(dirs: &OsStr, name: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(dirs).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Shell-style quoting, only where needed, so that a printed command can be pasted into a shell.
fn quote(arg: &OsStr) -> String {
    let text = arg.to_string_lossy();
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-+=/.,:@%".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.into_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archs_parse() {
        let shown = |t: &str| parse_archs(t).map(|a| a.iter().map(ToString::to_string).collect::<Vec<_>>());
        assert_eq!(shown("90").unwrap(), ["90"]);
        assert_eq!(shown(" 90, sm_80 ,80").unwrap(), ["80", "90"]);
        assert_eq!(shown("sm_90a,100f").unwrap(), ["90a", "100f"]);
        assert_eq!(parse_archs("hopper"), None);
        assert_eq!(parse_archs("90b"), None);
        assert_eq!(parse_archs(""), None);
        let env = Env::from_pairs(None, [("CUDA_ARCHS", "volta")]);
        assert_eq!(
            archs_from(&env).unwrap_err().to_string(),
            "CUDA_ARCHS=\"volta\" is not a list of compute capabilities such as `90` or `80,90a`"
        );
        // Not UTF-8: refused, not taken for unset (which built the default list).
        use std::os::unix::ffi::OsStrExt;
        let env = Env::from_pairs(None, [("CUDA_ARCHS", OsStr::from_bytes(b"90\xff"))]);
        assert!(archs_from(&env).unwrap_err().to_string().starts_with("CUDA_ARCHS=\"90\u{fffd}\" is not"));
    }

    #[test]
    fn explicit_nvcc_and_options_are_used() {
        let tmp = tempfile::tempdir().unwrap();
        let program = tmp.path().join("bin/nvcc");
        std::fs::create_dir_all(program.parent().unwrap()).unwrap();
        std::fs::write(&program, "").unwrap();
        std::fs::create_dir_all(tmp.path().join("include/cccl")).unwrap();
        let env = Env::from_pairs(
            None,
            [
                ("NVCC", program.to_str().unwrap()),
                ("CUDA_ARCHS", "80,90"),
                ("NVCC_CCBIN", "g++-12"),
                ("NVCC_APPEND_FLAGS", "-lineinfo -G"),
            ],
        );
        let nvcc = Nvcc::locate(&env, None).unwrap();
        assert_eq!(nvcc.program(), program);
        assert_eq!(nvcc.found_via(), format!("NVCC={}", program.display()));
        assert_eq!(nvcc.image_extension(), "fatbin");
        let cccl = tmp.path().join("include/cccl");
        let job = nvcc.module_job(Path::new("/s/a.cu"), Path::new("/o/a.fatbin"));
        assert_eq!(
            nvcc.describe(&job),
            format!(
                "NVCC_APPEND_FLAGS='-lineinfo -G' {} -std=c++17 -ccbin g++-12 -I{} \
                 -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 \
                 -fatbin /s/a.cu -o /o/a.fatbin -MD -MF /o/a.d",
                program.display(),
                cccl.display()
            )
        );
        let linked = nvcc.device_linked_job(
            Path::new("/s/r.cu"),
            &[Path::new("/l/libx.a")],
            Path::new("/o/r.o"),
            Path::new("/o/r.fatbin"),
        );
        let text = nvcc.describe(&linked);
        let link = text.lines().nth(1).unwrap();
        assert!(link.ends_with("-dlink -fatbin /o/r.o /l/libx.a -o /o/r.fatbin"), "{link}");
        assert!(text.lines().next().unwrap().contains("-rdc=true -c /s/r.cu -o /o/r.o -MD -MF /o/r.d"), "{text}");
    }

    #[test]
    fn nvcc_search_names_every_place_and_variable() {
        let tmp = tempfile::tempdir().unwrap();
        let cuda = Install {
            origin: "CUDA_HOME=/opt/cuda".into(),
            root: Some(tmp.path().to_path_buf()),
            include_dir: tmp.path().join("include"),
            lib_dir: None,
            library: None,
        };
        let env = Env::from_pairs(None, [("PATH", "/nonexistent/a:/nonexistent/b")]);
        let err = Nvcc::locate(&env, Some(&cuda)).unwrap_err().to_string();
        let expected = format!(
            "nvcc not found. Searched, in order:\n  \
             1. NVCC: not set\n  \
             2. the CUDA install of CUDA_HOME=/opt/cuda: no {}/bin/nvcc\n  \
             3. PATH (/nonexistent/a:/nonexistent/b): no nvcc in any of its directories\n\
             Variables consulted: CUDA_ARCHS, NVCC, PATH\n",
            tmp.path().display()
        );
        assert!(err.starts_with(&expected), "{err}");

        // Found on PATH, and NVCC set to a bare name is looked up there too.
        std::fs::create_dir_all(tmp.path().join("bin")).unwrap();
        std::fs::write(tmp.path().join("bin/nvcc-13"), "").unwrap();
        let path = tmp.path().join("bin");
        let env = Env::from_pairs(None, [("NVCC", "nvcc-13"), ("PATH", path.to_str().unwrap())]);
        assert_eq!(Nvcc::locate(&env, None).unwrap().program(), path.join("nvcc-13"));

        // An explicit NVCC that does not exist stops the search there.
        let env = Env::from_pairs(None, [("NVCC", "/nonexistent/nvcc"), ("PATH", path.to_str().unwrap())]);
        let err = Nvcc::locate(&env, None).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "nvcc not found where NVCC points. Searched, in order:\n  1. NVCC=/nonexistent/nvcc: no such file\n"
            ),
            "{err}"
        );
    }

    #[test]
    fn quoting() {
        assert_eq!(quote(OsStr::new("-I/a/b")), "-I/a/b");
        assert_eq!(quote(OsStr::new("/my dir/x.cu")), "'/my dir/x.cu'");
        assert_eq!(quote(OsStr::new("it's")), r"'it'\''s'");
    }
}
