//! Everything that can stop a `gpucomm` command, and the exit status each one gives.

use std::path::PathBuf;

/// Exit status: the command ran and found a problem (a ✗ in `doctor`, wrong elements in `bench`).
pub const EXIT_FOUND_PROBLEM: u8 = 1;
/// Exit status: bad command line or unusable input file (clap's own usage errors are 2 as well).
pub const EXIT_USAGE: u8 = 2;
/// Exit status: the run itself failed (NCCL, CUDA, a rank, the file system).
pub const EXIT_RUN_FAILED: u8 = 3;

/// Why a command stopped.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A size option that does not parse.
    #[error("{flag} {value:?}: {why}")]
    BadSize {
        /// The option (`-b`, `-e`).
        flag: &'static str,
        /// What was given.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// `-b` larger than `-e`, or a zero size with a factor.
    #[error("invalid size range: {0}")]
    SizeRange(String),
    /// A collective the bench does not know, or cannot run yet.
    #[error("collective {name:?}: {why}")]
    Collective {
        /// What was asked for.
        name: String,
        /// Why it cannot run.
        why: String,
    },
    /// A data type or reduction operator that is unknown or not usable with this collective.
    #[error("{what} {value:?}: {why}")]
    BadChoice {
        /// `-d` or `-o`.
        what: &'static str,
        /// What was given.
        value: String,
        /// The accepted values or the reason.
        why: String,
    },
    /// Options that cannot be used together, or a mode this machine cannot run.
    #[error("{0}")]
    Usage(String),
    /// The run failed in a way no argument explains: a raw NCCL call's code, the spawner's
    /// thread, ranks that reported nothing, a broken invariant of the bench (exit 3).
    #[error("{0}")]
    RunFailed(String),
    /// An input file (an nccl-tests log, a bench JSON) that cannot be read.
    #[error("cannot read {what} {}: {source}", path.display())]
    ReadInput {
        /// What the file is.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An input file that was read but holds no usable results.
    #[error("{}: {why}", path.display())]
    BadInput {
        /// Its path.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// An output file (`--plot`, `--out`, `--json-out`) that cannot be written.
    #[error("cannot write {what} {}: {why}", path.display())]
    WriteOutput {
        /// What the file is.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The reason.
        why: String,
    },
    /// An NCCL call failed.
    #[error(transparent)]
    Nccl(#[from] nccl::Error),
    /// gpucomm-kernels (the dispatching all-reduce).
    #[error("gpucomm-kernels: {0}")]
    Kernels(#[from] gpucomm_kernels::Error),
    /// The CUDA driver library cannot be loaded (the loader's words).
    #[error("no CUDA driver: libcuda.so.1 could not be loaded ({0}); run `gpucomm doctor`")]
    NoDriver(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver error")]
    Cuda(#[source] cudarc::driver::DriverError),
    /// The launcher variables are inconsistent.
    #[error(transparent)]
    Launch(#[from] gpucomm_launch::EnvError),
    /// The rendezvous between the ranks failed.
    #[error(transparent)]
    Rendezvous(#[from] gpucomm_launch::RendezvousError),
    /// The ranks could not be started.
    #[error(transparent)]
    Spawn(#[from] gpucomm_launch::SpawnError),
    /// A rank failed.
    #[error("{0}")]
    RanksFailed(gpucomm_launch::Outcome),
    /// A file of the run (results, logs) could not be read or written.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Results exchanged between processes do not parse.
    #[error("{what}")]
    Json {
        /// Which data.
        what: String,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// Validation (`-c`) found wrong elements.
    #[error("{0} wrong elements found by validation")]
    WrongResults(u64),
    /// `doctor` found at least one ✗.
    #[error("doctor found {0} problem(s)")]
    DoctorFailed(usize),
}

impl From<gpucomm_ordering::OrderError> for CliError {
    /// A refusal of the capture scope (`-G`), as the `nccl` crate reports it.
    fn from(e: gpucomm_ordering::OrderError) -> Self {
        CliError::Nccl(nccl::Error::from(e))
    }
}

impl From<cudarc::driver::DriverError> for CliError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CliError::Cuda(e)
    }
}

impl CliError {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::BadSize { .. }
            | CliError::SizeRange(_)
            | CliError::Collective { .. }
            | CliError::BadChoice { .. }
            | CliError::Usage(_)
            | CliError::ReadInput { .. }
            | CliError::BadInput { .. }
            | CliError::WriteOutput { .. } => EXIT_USAGE,
            CliError::WrongResults(_) | CliError::DoctorFailed(_) => EXIT_FOUND_PROBLEM,
            // A rank's own usage error or failed run keeps its status; anything else a rank ends
            // with (a signal, which the spawner reports as 1, a panic's 101) is a failed run: 1
            // would read as wrong elements, which the parent alone reports.
            CliError::RanksFailed(outcome) => match u8::try_from(outcome.exit_code()) {
                Ok(code @ (EXIT_USAGE | EXIT_RUN_FAILED)) => code,
                _ => EXIT_RUN_FAILED,
            },
            _ => EXIT_RUN_FAILED,
        }
    }

    /// Reads `path` as the input file `what`: at most [`MAX_INPUT`] bytes of UTF-8 text (a
    /// larger file, or an endless one such as `/dev/zero`, is refused without reading it all).
    pub fn read_input(what: &'static str, path: &std::path::Path) -> Result<String, CliError> {
        use std::io::Read;
        let failed = |source| CliError::ReadInput { what, path: path.to_path_buf(), source };
        let mut bytes = Vec::new();
        std::fs::File::open(path).and_then(|f| f.take(MAX_INPUT + 1).read_to_end(&mut bytes)).map_err(failed)?;
        if bytes.len() as u64 > MAX_INPUT {
            return Err(CliError::BadInput {
                path: path.to_path_buf(),
                why: format!("larger than {} MiB: not a {what}", MAX_INPUT >> 20),
            });
        }
        String::from_utf8(bytes).map_err(|e| failed(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
    }
}

/// The largest input file (an nccl-tests log, a bench JSON, a crossover table) read, in bytes.
pub const MAX_INPUT: u64 = 64 << 20;

/// Shorthand for this crate's results.
pub type Result<T, E = CliError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endless_or_huge_inputs_are_refused_and_run_failures_exit_3() {
        let e = CliError::read_input("nccl-tests log", std::path::Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.to_string(), "/dev/zero: larger than 64 MiB: not a nccl-tests log");
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert_eq!(CliError::RunFailed("the spawner thread panicked".into()).exit_code(), EXIT_RUN_FAILED);
    }

    #[test]
    fn a_failed_rank_gives_a_documented_status() {
        use std::os::unix::process::ExitStatusExt;
        let failed = |raw: i32, how: &str| {
            CliError::RanksFailed(gpucomm_launch::Outcome {
                statuses: vec![
                    (0, std::process::ExitStatus::from_raw(0)),
                    (1, std::process::ExitStatus::from_raw(raw)),
                ],
                first_failure: Some((1, how.to_string())),
            })
            .exit_code()
        };
        // Killed by SIGKILL: a failed run, not "validation found wrong elements".
        assert_eq!(failed(9, "was killed by signal 9"), EXIT_RUN_FAILED);
        // A panic (101), and a code the help does not define.
        assert_eq!(failed(101 << 8, "exited with code 101"), EXIT_RUN_FAILED);
        assert_eq!(failed(1 << 8, "exited with code 1"), EXIT_RUN_FAILED);
        assert_eq!(failed(124 << 8, "exited with code 124"), EXIT_RUN_FAILED);
        // The documented ones pass through.
        assert_eq!(failed(2 << 8, "exited with code 2"), EXIT_USAGE);
        assert_eq!(failed(3 << 8, "exited with code 3"), EXIT_RUN_FAILED);
    }
}
