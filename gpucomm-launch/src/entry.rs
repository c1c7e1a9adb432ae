//! [`run_main`]: the `main` of every multi-rank example.

use std::error::Error;
use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use super::env::RankInfo;
use super::spawn::{spawn_local, SpawnError, SPAWNED_VAR};

/// The flag that makes [`run_main`] start copies of the program: `--nproc N` or `--nproc=N`.
pub const NPROC_FLAG: &str = "--nproc";

/// How long ranks get to stop after `SIGTERM` when a sibling failed under `--nproc`.
const GRACE: Duration = Duration::from_secs(5);

/// Exit code for command-line mistakes.
const USAGE: u8 = 2;

/// Runs `body` as one rank of a job, or starts the job first.
///
/// First of all it turns NVLink multicast off in this process ([`safety::enforce`](crate::safety::enforce):
/// `NCCL_NVLS_ENABLE=0` and its NVSHMEM and PyTorch twins, replacing other values with a note on
/// stderr), so call it first thing in `main`, before starting threads or loading NCCL.
///
/// * With `--nproc N` (or `--nproc=N`) among the arguments (before any `--`), and not itself
///   started by the spawner (`GPUCOMM_SPAWNED` unset): starts `N` copies of the current executable
///   through [`spawn_local`], with the same arguments minus the flag, and returns their combined
///   exit code ([`Outcome::exit_code`](crate::Outcome::exit_code)). `body` does not run in
///   this process. Refused (exit 2) when a launcher already made this process one rank of
///   several (`srun -n2 prog --nproc 2` would start two unrelated jobs on the same GPUs); one
///   process per node (a world size of 1) may start its node's ranks.
/// * Otherwise: reads [`RankInfo::from_env`] and runs `body` with it.
///
/// Errors are printed to stderr as `error: {e}`, followed by one `caused by:` line per source, and
/// turn into a failing exit code (2 for a bad `--nproc` value).
///
/// ```no_run
/// use gpucomm_launch::{run_main, Options, Rendezvous};
///
/// fn main() -> std::process::ExitCode {
///     run_main(|info| {
///         let mut rendezvous = Rendezvous::connect(&info, &Options::from_env()?)?;
///         let id = rendezvous.broadcast(|| Ok(b"an id made by rank 0".to_vec()))?;
///         println!("rank {} of {} got {:?}", info.rank, info.world_size, id);
///         Ok(())
///     })
/// }
/// ```
pub fn run_main<F>(body: F) -> ExitCode
where
    F: FnOnce(RankInfo) -> Result<(), Box<dyn Error>>,
{
    crate::safety::enforce_with_note();
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let (nproc, rest) = match split_nproc(&args) {
        Ok(split) => split,
        Err(error) => {
            report(&error);
            return ExitCode::from(USAGE);
        }
    };
    if let Some(nproc) = nproc {
        if std::env::var_os(SPAWNED_VAR).is_none() {
            if let Err(error) = RankInfo::from_env().map_or(Ok(()), |info| alone(&info)) {
                report(&error);
                return ExitCode::from(USAGE);
            }
            return spawn_copies(nproc, &rest);
        }
    }
    let info = match RankInfo::from_env() {
        Ok(info) => info,
        Err(error) => {
            report(&error);
            return ExitCode::FAILURE;
        }
    };
    match body(info) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            report(error.as_ref());
            ExitCode::FAILURE
        }
    }
}

fn spawn_copies(nproc: usize, args: &[OsString]) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(error) => {
            report(&SpawnError::CurrentExe { error });
            return ExitCode::FAILURE;
        }
    };
    match spawn_local(nproc, &exe, args, &[], GRACE) {
        Ok(outcome) if outcome.success() => ExitCode::SUCCESS,
        Ok(outcome) => {
            report_line(&format!("error: {outcome}"));
            exit_code(outcome.exit_code())
        }
        Err(error) => {
            report(&error);
            ExitCode::FAILURE
        }
    }
}

/// A process exit code for an `i32` status: itself when in `1..=255`, else 1 (0 stays success).
fn exit_code(code: i32) -> ExitCode {
    match u8::try_from(code) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(code),
        Err(_) => ExitCode::FAILURE,
    }
}

/// `Ok` unless a launcher made this process one rank of several: then `--nproc` would start one
/// job per rank.
fn alone(info: &RankInfo) -> Result<(), SpawnError> {
    if info.world_size == 1 {
        return Ok(());
    }
    Err(SpawnError::BadArgs {
        message: format!(
            "{NPROC_FLAG} starts a job of its own, but this process is already rank {} of {} ({}), and each of \
             those ranks would start one: drop {NPROC_FLAG} under a launcher (or start one process per node)",
            info.rank, info.world_size, info.launcher
        ),
    })
}

/// Takes `--nproc N` / `--nproc=N` out of `args` (not after a `--`).
fn split_nproc(args: &[OsString]) -> Result<(Option<usize>, Vec<OsString>), SpawnError> {
    let mut nproc = None;
    let mut rest = Vec::with_capacity(args.len());
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            rest.push(arg.clone());
            rest.extend(iter.cloned());
            break;
        }
        let value = if arg == NPROC_FLAG {
            iter.next().map(|value| value.to_string_lossy().into_owned())
        } else if let Some(value) = arg.to_str().and_then(|a| a.strip_prefix("--nproc=")) {
            Some(value.to_string())
        } else {
            rest.push(arg.clone());
            continue;
        };
        let Some(value) = value else {
            return Err(bad_args(format!(
                "{NPROC_FLAG} needs a value: the number of processes to start, e.g. --nproc 2"
            )));
        };
        if nproc.is_some() {
            return Err(bad_args(format!("{NPROC_FLAG} is given more than once")));
        }
        match value.trim().parse::<usize>() {
            Ok(n) if n > 0 => nproc = Some(n),
            _ => return Err(bad_args(format!("{NPROC_FLAG} expects a positive integer, got {value:?}"))),
        }
    }
    Ok((nproc, rest))
}

fn bad_args(message: String) -> SpawnError {
    SpawnError::BadArgs { message }
}

/// Prints `error: {e}` and the chain of sources.
fn report(error: &dyn Error) {
    let mut text = format!("error: {error}");
    let mut source = error.source();
    // A bound, in case a source chain loops.
    for _ in 0..32 {
        let Some(cause) = source else { break };
        text.push_str(&format!("\n  caused by: {cause}"));
        source = cause.source();
    }
    report_line(&text);
}

/// Writes one line to stderr, ignoring failures (there is nowhere else to report them).
fn report_line(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn nproc_is_refused_under_a_launcher_with_several_ranks() {
        // Before: `srun -n2 prog --nproc 2` started two unrelated 2-rank jobs on the same GPUs.
        let mut info = RankInfo::single();
        assert!(alone(&info).is_ok());
        (info.rank, info.world_size, info.launcher) = (1, 2, crate::Launcher::Slurm);
        let m = alone(&info).unwrap_err().to_string();
        assert!(
            m.starts_with("--nproc starts a job of its own, but this process is already rank 1 of 2 (Slurm"),
            "{m}"
        );
        // One process per node may start its node's ranks.
        (info.rank, info.world_size) = (0, 1);
        assert!(alone(&info).is_ok());
    }

    #[test]
    fn nproc_is_taken_out() {
        let (n, rest) = split_nproc(&args(&["a", "--nproc", "2", "b"])).unwrap();
        assert_eq!((n, rest), (Some(2), args(&["a", "b"])));
        let (n, rest) = split_nproc(&args(&["--nproc=4", "-x"])).unwrap();
        assert_eq!((n, rest), (Some(4), args(&["-x"])));
        let (n, rest) = split_nproc(&args(&["x", "--", "--nproc", "2"])).unwrap();
        assert_eq!((n, rest), (None, args(&["x", "--", "--nproc", "2"])));
        assert_eq!(split_nproc(&args(&[])).unwrap(), (None, vec![]));
    }

    #[test]
    fn bad_nproc_values_are_clear_errors() {
        for (list, expected) in [
            (&["--nproc"][..], "--nproc needs a value"),
            (&["--nproc", "0"][..], "--nproc expects a positive integer, got \"0\""),
            (&["--nproc=abc"][..], "--nproc expects a positive integer, got \"abc\""),
            (&["--nproc", "-1"][..], "--nproc expects a positive integer, got \"-1\""),
            (&["--nproc=2", "--nproc", "3"][..], "--nproc is given more than once"),
        ] {
            let message = split_nproc(&args(list)).unwrap_err().to_string();
            assert!(message.starts_with(expected), "{list:?}: {message}");
        }
    }

    /// Set in the child half of the test below.
    const SAFETY_CHILD: &str = "GPUCOMM_TEST_SAFETY_CHILD";

    #[test]
    fn run_main_turns_nvlink_multicast_off_for_its_process() {
        // Before: only ranks the spawner started had the variables; a rank started by torchrun,
        // mpirun or srun left NCCL's and NVSHMEM's multicast defaults on.
        let out = crate::test_child::run("entry::tests::safety_child", SAFETY_CHILD, |command| {
            command
                .env("NCCL_NVLS_ENABLE", "1")
                .env_remove("NVSHMEM_DISABLE_NVLS")
                .env_remove("TORCH_SYMM_MEM_DISABLE_MULTICAST")
                .envs([("RANK", "0"), ("WORLD_SIZE", "1")]);
        });
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(
            stdout.contains("seen: NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1"),
            "{stdout}"
        );
        assert!(stderr.contains("note: NVLink multicast stays off: using NCCL_NVLS_ENABLE=0 (was \"1\")"), "{stderr}");
    }

    /// Child half: does nothing unless started by the test above.
    #[test]
    fn safety_child() {
        if std::env::var_os(SAFETY_CHILD).is_none() {
            return;
        }
        let code = run_main(|_| {
            let seen: Vec<String> = crate::SAFETY_VARS
                .iter()
                .map(|(name, _)| format!("{name}={}", std::env::var(name).unwrap_or_default()))
                .collect();
            println!("seen: {}", seen.join(" "));
            Ok(())
        });
        assert_eq!(code, ExitCode::SUCCESS);
    }

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(0), ExitCode::SUCCESS);
        assert_eq!(exit_code(3), ExitCode::from(3));
        assert_eq!(exit_code(300), ExitCode::FAILURE);
        assert_eq!(exit_code(-1), ExitCode::FAILURE);
    }
}
