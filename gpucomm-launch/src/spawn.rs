//! Starting N ranks on this machine, torchrun-style, and stopping them all when one fails.

mod process;
mod relay;
#[cfg(test)]
mod tests;

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::random;
use crate::safety::SAFETY_VARS;
use relay::{Relays, Sink};

/// Set (to `1`) in every spawned rank; [`run_main`](crate::run_main) does not spawn again
/// when it sees it.
pub const SPAWNED_VAR: &str = "GPUCOMM_SPAWNED";

/// Variables of other launchers (and a store choice meant for the spawner's own launcher),
/// removed from the ranks' environment so that they cannot contradict what the spawner sets.
const FOREIGN_VARS: [&str; 19] = [
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_TASKS_PER_NODE",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "GROUP_RANK",
    "ROLE_RANK",
    crate::STORE_VAR,
];

/// How often the spawner checks on its children.
const POLL: Duration = Duration::from_millis(10);

/// How long the spawner waits for output still in flight, once every child has exited, without a
/// line relayed (a grandchild may hold the pipe open, or the parent's output may not drain: what
/// is left is then left behind).
const RELAY_LINGER: Duration = Duration::from_secs(2);
/// The longest the spawner relays output after every child has exited (a grandchild that keeps
/// printing).
const RELAY_LIMIT: Duration = Duration::from_secs(30);

/// How often the spawner looks for what exited ranks left running in their process groups
/// (reading `/proc`), while there is some.
const GROUP_LOOK: Duration = Duration::from_millis(50);

/// How the ranks ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Every rank's exit status, in rank order.
    pub statuses: Vec<(usize, ExitStatus)>,
    /// The first rank seen failing (non-zero exit or a signal) and how, e.g.
    /// `(1, "exited with code 3")`. Ranks stopped by the spawner afterwards do not count.
    pub first_failure: Option<(usize, String)>,
}

impl Outcome {
    /// True when every rank exited with status 0.
    pub fn success(&self) -> bool {
        self.first_failure.is_none() && self.statuses.iter().all(|(_, status)| status.success())
    }

    /// 0 on success; else the first failed rank's exit code, or 1 if a signal ended it.
    pub fn exit_code(&self) -> i32 {
        if self.success() {
            return 0;
        }
        let failed = self.first_failure.as_ref().map(|(rank, _)| *rank);
        self.statuses
            .iter()
            .find(|(rank, _)| Some(*rank) == failed)
            .and_then(|(_, status)| status.code())
            .filter(|&code| code != 0)
            .unwrap_or(1)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.first_failure {
            None if self.success() => write!(f, "all {} ranks exited successfully", self.statuses.len()),
            None => f.write_str("some ranks failed"),
            Some((rank, how)) if self.statuses.len() == 1 => write!(f, "rank {rank} {how}"),
            Some((rank, how)) => write!(f, "rank {rank} {how}; the ranks still running were stopped"),
        }
    }
}

/// Why the ranks could not be started.
#[derive(Debug)]
#[non_exhaustive]
pub enum SpawnError {
    /// `nproc` was 0.
    NoProcesses,
    /// Bad command-line use of [`run_main`](crate::run_main) (`--nproc`).
    BadArgs {
        /// What is wrong.
        message: String,
    },
    /// No free port could be found for `MASTER_PORT`.
    FreePort {
        /// The OS error.
        error: io::Error,
    },
    /// A rank could not be started (the ranks already started were killed).
    Spawn {
        /// The rank.
        rank: usize,
        /// The program.
        program: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The state of a rank could not be read (the other ranks were killed).
    Wait {
        /// The rank.
        rank: usize,
        /// The OS error.
        error: io::Error,
    },
    /// The path of the running program is unknown (for `--nproc`).
    CurrentExe {
        /// The OS error.
        error: io::Error,
    },
    /// No random bytes for the job key from the kernel.
    Random {
        /// The OS error.
        error: io::Error,
    },
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpawnError::NoProcesses => f.write_str("asked to start 0 processes; start at least 1"),
            SpawnError::BadArgs { message } => f.write_str(message),
            SpawnError::FreePort { error } => {
                write!(f, "could not find a free port on 127.0.0.1 for MASTER_PORT: {error}")
            }
            SpawnError::Spawn { rank, program, error } => {
                write!(f, "could not start rank {rank} ({}): {error}", program.display())
            }
            SpawnError::Wait { rank, error } => write!(f, "could not check on rank {rank}: {error}"),
            SpawnError::CurrentExe { error } => {
                write!(f, "cannot find this program's executable to start copies of it: {error}")
            }
            SpawnError::Random { error } => {
                write!(f, "cannot get random bytes for the ranks' job key: {error}")
            }
        }
    }
}

impl std::error::Error for SpawnError {}

/// Starts `nproc` copies of `program` on this machine and waits for all of them.
///
/// Rank `i` gets `RANK=i`, `WORLD_SIZE=nproc`, `LOCAL_RANK=i`, `LOCAL_WORLD_SIZE=nproc`,
/// `MASTER_ADDR=127.0.0.1`, `MASTER_PORT=<a free port>`, `GPUCOMM_JOB_TOKEN=<32 random hex
/// digits>` (the job identity), `GPUCOMM_JOB_KEY=<64 random hex digits>` (the secret that
/// protects the rendezvous: see the crate's security section) and `GPUCOMM_SPAWNED=1`; then
/// `extra_env`; then [`SAFETY_VARS`], which nothing overrides. The rest of the environment is
/// inherited, except other launchers' rank variables (`OMPI_COMM_WORLD_*`, `PMI_RANK`,
/// `SLURM_PROCID`, torchrun's `TORCHELASTIC_*`, …) and `GPUCOMM_STORE`, which would contradict
/// these. Standard input is closed.
///
/// Every line a rank prints is re-printed on the parent's stdout or stderr as `[rank N] line`.
/// Each rank runs in a process group of its own, so that stopping a rank stops what it started
/// too (a shell's commands, Python's workers). When a rank fails (non-zero exit or a signal) the
/// others' groups get `SIGTERM`, and `SIGKILL` after `grace`. On Linux, when a rank exits (fails
/// or not), what it left running in its group (a shell's background command, a worker it did
/// not wait for) gets `SIGTERM` too, and `SIGKILL` if it still runs `grace` later: the call
/// returns once nothing of any rank's group runs. `SIGINT`, `SIGTERM` and `SIGHUP`
/// sent to the spawner while the ranks run (Ctrl-C in a terminal reaches the spawner only) are
/// passed on to every rank's group, and the ranks still running get `SIGKILL` after `grace`:
/// meanwhile this process's own handlers of those signals are set aside, and put back when the
/// call returns (when the last returns, of calls made by several threads at once; each of their
/// jobs gets every signal). On Linux the ranks also get `SIGTERM` if the spawner itself dies.
pub fn spawn_local(
    nproc: usize,
    program: &Path,
    args: &[OsString],
    extra_env: &[(String, String)],
    grace: Duration,
) -> Result<Outcome, SpawnError> {
    spawn_to(nproc, program, args, extra_env, grace, [Sink::Stdout, Sink::Stderr])
}

/// [`spawn_local`] with the output sent to `sinks` (stdout's, stderr's).
pub(crate) fn spawn_to(
    nproc: usize,
    program: &Path,
    args: &[OsString],
    extra_env: &[(String, String)],
    grace: Duration,
    [out, err]: [Sink; 2],
) -> Result<Outcome, SpawnError> {
    if nproc == 0 {
        return Err(SpawnError::NoProcesses);
    }
    let port = free_port().map_err(|error| SpawnError::FreePort { error })?;
    let token = random::hex(16).map_err(|error| SpawnError::Random { error })?;
    let key = random::hex(32).map_err(|error| SpawnError::Random { error })?;
    let relays = Relays::new();
    // Before the first rank starts: a Ctrl-C from now on is the job's, not only the spawner's.
    let forwarding = process::Forwarding::start();
    let mut children: Vec<Child> = Vec::with_capacity(nproc);
    for rank in 0..nproc {
        let mut command = Command::new(program);
        command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        for name in FOREIGN_VARS {
            command.env_remove(name);
        }
        let (rank_text, size_text) = (rank.to_string(), nproc.to_string());
        command
            .env("RANK", &rank_text)
            .env("WORLD_SIZE", &size_text)
            .env("LOCAL_RANK", &rank_text)
            .env("LOCAL_WORLD_SIZE", &size_text)
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env(crate::JOB_TOKEN_VAR, &token)
            .env(crate::JOB_KEY_VAR, &key)
            .env(SPAWNED_VAR, "1");
        command.envs(extra_env.iter().map(|(k, v)| (k, v)));
        command.envs(SAFETY_VARS);
        process::stop_with_parent(&mut command);
        process::own_group(&mut command);
        let started = command.spawn().and_then(|mut child| {
            let prefix = format!("[rank {rank}] ");
            let pipes = (child.stdout.take(), child.stderr.take());
            children.push(child);
            if let Some(pipe) = pipes.0 {
                relays.start(pipe, prefix.clone(), out.clone())?;
            }
            if let Some(pipe) = pipes.1 {
                relays.start(pipe, prefix, err.clone())?;
            }
            Ok(())
        });
        if let Err(error) = started {
            kill_all(children.iter_mut());
            return Err(SpawnError::Spawn { rank, program: program.to_path_buf(), error });
        }
    }
    let outcome = supervise(&mut children, grace, &forwarding);
    relays.wait(RELAY_LINGER, RELAY_LIMIT);
    outcome
}

/// Polls the children until all have exited, stopping the rest after the first failure, and
/// passing on to every rank's group a signal the spawner received (then stopping them like after
/// a failure: `SIGKILL` after `grace`). What a rank leaves running in its group when it exits
/// gets `SIGTERM`, and `SIGKILL` once `grace` has passed since then (or since the ranks began to
/// be stopped); the rank is reaped only once nothing of its group runs (Linux), so that until
/// then its group's id cannot be reused.
fn supervise(children: &mut [Child], grace: Duration, forwarding: &process::Forwarding) -> Result<Outcome, SpawnError> {
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; children.len()];
    // Exited, not reaped yet: since when what it left in its group is being stopped.
    let mut lingering: Vec<Option<Instant>> = vec![None; children.len()];
    let mut first_failure: Option<(usize, String)> = None;
    let mut stopping_since: Option<Instant> = None;
    let mut killed = false;
    let mut last_look: Option<Instant> = None;
    loop {
        let mut exits = false;
        for (rank, child) in children.iter_mut().enumerate() {
            if statuses[rank].is_some() {
                continue;
            }
            match process::exited(child) {
                Ok(Some(exit)) => {
                    statuses[rank] = Some(exit.status);
                    if !exit.status.success() && first_failure.is_none() {
                        first_failure = Some((rank, process::describe(exit.status)));
                    }
                    if exit.held {
                        // A shell's background commands, a program's workers: they go with it.
                        #[cfg(unix)]
                        process::signal_group(child, libc::SIGTERM);
                        let now = Instant::now();
                        lingering[rank] = Some(stopping_since.map_or(now, |since| since.min(now)));
                        exits = true;
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    kill_all(unreaped(children, &statuses, &lingering));
                    return Err(SpawnError::Wait { rank, error });
                }
            }
        }
        let look = exits || last_look.is_none_or(|at| at.elapsed() >= GROUP_LOOK);
        if look && lingering.iter().any(Option::is_some) {
            last_look = Some(Instant::now());
            let live = process::live_groups();
            for rank in 0..children.len() {
                let Some(since) = lingering[rank] else { continue };
                let child = &mut children[rank];
                let left = live.contains(&child.id());
                if left && since.elapsed() < grace {
                    continue;
                }
                if left {
                    process::kill(child);
                }
                if let Err(error) = process::release(child) {
                    kill_all(unreaped(children, &statuses, &lingering));
                    return Err(SpawnError::Wait { rank, error });
                }
                lingering[rank] = None;
            }
        }
        if (0..children.len()).all(|rank| is_reaped(&statuses, &lingering, rank)) {
            break;
        }
        let running = || children_running(&statuses);
        #[cfg(unix)]
        if let Some(signal) = forwarding.take() {
            for rank in (0..children.len()).filter(|&rank| !is_reaped(&statuses, &lingering, rank)) {
                process::signal_group(&children[rank], signal);
            }
            stopping_since.get_or_insert_with(Instant::now);
        }
        if first_failure.is_some() && stopping_since.is_none() {
            for rank in running().collect::<Vec<_>>() {
                process::terminate(&mut children[rank]);
            }
            stopping_since = Some(Instant::now());
        }
        if let Some(since) = stopping_since {
            if !killed && since.elapsed() >= grace {
                for rank in running().collect::<Vec<_>>() {
                    process::kill(&mut children[rank]);
                }
                killed = true;
            }
        }
        std::thread::sleep(POLL);
    }
    let statuses = statuses.into_iter().enumerate().filter_map(|(rank, s)| s.map(|s| (rank, s))).collect();
    Ok(Outcome { statuses, first_failure })
}

fn children_running(statuses: &[Option<ExitStatus>]) -> impl Iterator<Item = usize> + '_ {
    statuses.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(rank, _)| rank)
}

/// Whether rank `rank` has been reaped: it exited, and nothing it left in its group is being
/// stopped any more.
fn is_reaped(statuses: &[Option<ExitStatus>], lingering: &[Option<Instant>], rank: usize) -> bool {
    statuses[rank].is_some() && lingering[rank].is_none()
}

/// The children not reaped yet (whose groups may still be signaled).
fn unreaped<'a>(
    children: &'a mut [Child],
    statuses: &'a [Option<ExitStatus>],
    lingering: &'a [Option<Instant>],
) -> impl Iterator<Item = &'a mut Child> {
    children.iter_mut().enumerate().filter(move |(rank, _)| !is_reaped(statuses, lingering, *rank)).map(|(_, c)| c)
}

/// Kills and reaps children that have not been reaped (error paths).
fn kill_all<'a>(children: impl Iterator<Item = &'a mut Child>) {
    for child in children {
        process::kill(child);
        let _ = child.wait();
    }
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
