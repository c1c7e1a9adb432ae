//! The error of the `.cu` build, shared by its two layers ([`nvcc`](crate::build::nvcc) and
//! [`cu`](crate::build::cu), which re-exports it), and how a build script reports it.

use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitStatus;

use crate::build::flavour::Flavour;
use crate::build::nvcc::diagnostic::{Diagnostic, Severity};
use crate::emit::Emitter;
use crate::locate::{NotFound, Probe};

/// Why `.cu` files could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CuError {
    /// No nvcc: every place searched, every variable consulted.
    #[error("{}", nvcc_not_found(searched, vars, stopped_by.as_deref()))]
    NvccNotFound {
        /// Each place looked at and why it was not used.
        searched: Vec<Probe>,
        /// Every variable consulted so far.
        vars: Vec<String>,
        /// The variable (`NVCC`) that named a missing binary and stopped the search.
        stopped_by: Option<String>,
    },
    /// nvcc was found but could not be started.
    #[error("could not start nvcc {} ({found_via}): {error}\ncommand: {command}", program.display())]
    NvccNotRunnable {
        /// The binary.
        program: PathBuf,
        /// How it was found.
        found_via: String,
        /// The command line.
        command: String,
        /// What the operating system said.
        error: std::io::Error,
    },
    /// `CUDA_ARCHS` is not a list of compute capabilities.
    #[error("CUDA_ARCHS={value:?} is not a list of compute capabilities such as `90` or `80,90a`")]
    Archs {
        /// The value given.
        value: String,
    },
    /// nvcc ran and failed: the file and line it complained about, the command, its output.
    #[error(transparent)]
    Compile(Box<CompileError>),
    /// The library a flavour needs (NCCL, NVSHMEM) was not found.
    #[error(
        "{flavour} kernels need the headers of the {} install that {} found; none was passed on \
         (DEP_{}_INCLUDE is not set: the crate does not depend on {} directly) and the search found none.\n{report}",
        report.spec.name, flavour.sys_crate(), report.spec.var, flavour.sys_crate()
    )]
    InstallNotFound {
        /// The flavour that needed it.
        flavour: Flavour,
        /// The search report.
        report: Box<NotFound>,
    },
    /// The install lacks a file the flavour needs (`nccl_device.h`, `libnvshmem_device.a`).
    #[error("{flavour} kernels need {}, which is not there (the directory comes from {origin}){hint}", missing.display())]
    InstallIncomplete {
        /// The flavour that needed it.
        flavour: Flavour,
        /// The file that is missing.
        missing: PathBuf,
        /// Where the directory came from (`DEP_NCCL_INCLUDE`, the search).
        origin: String,
        /// What usually causes it.
        hint: &'static str,
    },
    /// A `.cu` file given to the builder does not exist.
    #[error("no such .cu file: {}", path.display())]
    SourceMissing {
        /// The path, made absolute.
        path: PathBuf,
    },
    /// A kernel image name is not usable as a Rust constant name.
    #[error(
        "cannot name the image of {} `{name}`: image names must be Rust identifiers \
         ([A-Za-z_][A-Za-z0-9_]*) other than ARCHS and COMPILED (give one with `Kernels::image`)",
        source_file.display()
    )]
    InvalidName {
        /// The name.
        name: String,
        /// The `.cu` file it was for.
        source_file: PathBuf,
    },
    /// Two images would get the same constant name.
    #[error(
        "two kernel images are named `{name}`: {} and {} (give one another name with `Kernels::image`)",
        first.display(), second.display()
    )]
    DuplicateName {
        /// The name.
        name: String,
        /// The first `.cu` file.
        first: PathBuf,
        /// The second.
        second: PathBuf,
    },
    /// A path that `include_bytes!` cannot name (not UTF-8).
    #[error("the path {} is not UTF-8, so the generated Rust file cannot include it", path.display())]
    NonUtf8Path {
        /// The path.
        path: PathBuf,
    },
    /// Reading or writing a file failed.
    #[error("{action} {}: {error}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        error: std::io::Error,
    },
    /// `OUT_DIR` is not set: not running as a Cargo build script.
    #[error("OUT_DIR is not set: `.cu` files are built from a build script, which Cargo runs with OUT_DIR set")]
    NoOutDir,
}

fn nvcc_not_found(searched: &[Probe], vars: &[String], stopped_by: Option<&str>) -> String {
    let mut text = match stopped_by {
        Some(var) => format!("nvcc not found where {var} points. Searched, in order:\n"),
        None => "nvcc not found. Searched, in order:\n".to_string(),
    };
    for (i, p) in searched.iter().enumerate() {
        text.push_str(&format!("  {}. {}: {}\n", i + 1, p.place, p.reason));
    }
    text.push_str(&format!("Variables consulted: {}\n", vars.join(", ")));
    text.push_str(
        "To fix: set NVCC to an nvcc binary, or CUDA_HOME to a CUDA toolkit that has bin/nvcc, or install \
         the CUDA 13 compiler wheels (pip install nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-runtime nvidia-cuda-crt \
         nvidia-cuda-cccl) where the CUDA search finds them (GPUCOMM_PREFIX/py or python3's site-packages); \
         or set GPUCOMM_SKIP_CU=1 to build without kernels (their images are then empty).",
    );
    text
}

/// nvcc failed. `Display` starts with `path:line: error: message` (the first error nvcc reported),
/// lists the other errors, then names the nvcc that ran, the exact command line and nvcc's full
/// output.
#[derive(Debug)]
pub struct CompileError {
    /// The `.cu` file being compiled.
    pub source_file: PathBuf,
    /// The nvcc that ran.
    pub nvcc: PathBuf,
    /// How that nvcc was found.
    pub found_via: String,
    /// The exact command line that failed.
    pub command: String,
    /// nvcc's exit status.
    pub status: ExitStatus,
    /// nvcc's full output (stdout, then stderr).
    pub output: String,
    /// Every diagnostic read from the output.
    pub diagnostics: Vec<Diagnostic>,
}

impl CompileError {
    /// The error diagnostics, in nvcc's order.
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.severity == Severity::Error)
    }

    /// One line per error, each starting with a path (`file:line: error: …`); messages without
    /// a position (ptxas, nvlink, nvcc itself) are put on the `.cu` file. Never empty.
    pub fn error_lines(&self) -> Vec<String> {
        let source = self.source_file.display();
        let mut lines: Vec<String> = self
            .errors()
            .map(|d| match d.file {
                Some(_) => d.to_string(),
                None => format!("{source}: {d}"),
            })
            .collect();
        if lines.is_empty() {
            lines.push(format!("{source}: error: nvcc failed ({}) without an error message", self.status));
        }
        lines
    }
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in self.error_lines() {
            writeln!(f, "{line}")?;
        }
        writeln!(f, "nvcc failed on {} ({})", self.source_file.display(), self.status)?;
        writeln!(f, "nvcc: {} ({})", self.nvcc.display(), self.found_via)?;
        writeln!(f, "command: {}", self.command)?;
        write!(f, "--- nvcc output ---\n{}", self.output.trim_end())
    }
}

impl std::error::Error for CompileError {}

impl CuError {
    /// Reports the error from a build script: `cargo::warning=` lines (each nvcc error as
    /// `file:line: error: …`, or the first line of the report) into `out`, and the full report on
    /// stderr, which Cargo shows when the build script fails.
    pub fn report<W: Write>(&self, out: &mut Emitter<W>) {
        let lines = match self {
            CuError::Compile(e) => e.error_lines(),
            other => other.to_string().lines().next().map(str::to_string).into_iter().collect(),
        };
        let last = lines.len().saturating_sub(1);
        for (i, line) in lines.iter().enumerate() {
            let more = if i == last { " (full report below)" } else { "" };
            out.warning(&format!("{line}{more}"));
        }
        match self {
            // Already `path:line: error: …`.
            CuError::Compile(_) => eprintln!("\n{self}\n"),
            _ => eprintln!("\nerror: {self}\n"),
        }
    }
}
