//! The operating-system side of child processes: process groups, signals and exit statuses.

use std::collections::HashSet;
use std::io;
use std::process::{Child, Command, ExitStatus};
#[cfg(unix)]
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
#[cfg(unix)]
use std::sync::Mutex;

/// Asks a child to stop: `SIGTERM` to its process group on Unix (so that it, and what it
/// started, can clean up), a hard kill elsewhere.
pub(super) fn terminate(child: &mut Child) {
    #[cfg(unix)]
    if signal_group(child, libc::SIGTERM) {
        return;
    }
    let _ = child.kill();
}

/// Kills a child: `SIGKILL` to its process group on Unix (what it started too).
pub(super) fn kill(child: &mut Child) {
    #[cfg(unix)]
    if signal_group(child, libc::SIGKILL) {
        return;
    }
    let _ = child.kill();
}

/// Sends `signal` to the process group of `child` ([`own_group`] made it the group's leader).
/// False when the signal could not be sent.
#[cfg(unix)]
pub(super) fn signal_group(child: &Child, signal: libc::c_int) -> bool {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else { return false };
    // SAFETY: kill(2) has no memory-safety preconditions. `pid` is a child of this process that
    // has not been reaped (callers only signal children that no wait has reaped: a rank seen
    // exiting by [`exited`] stays a zombie until its group is released), so neither its id nor
    // its group's (the same number) can have been reused.
    unsafe { libc::kill(-pid, signal) == 0 }
}

/// How a child that has exited ended, once it has; `held` when it is left unreaped (a zombie,
/// Linux), so that its process group's id stays its own until [`release`], and what it left
/// running in its group can still be signaled.
pub(super) struct Exit {
    pub(super) status: ExitStatus,
    pub(super) held: bool,
}

/// The exit of `child`, if it has exited: on Linux seen with `waitid(WNOWAIT)`, which leaves it
/// unreaped; elsewhere reaped at once (`held` false).
pub(super) fn exited(child: &mut Child) -> io::Result<Option<Exit>> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::ExitStatusExt;
        let pid = libc::id_t::try_from(child.id()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        loop {
            // SAFETY: siginfo_t is plain C data, for which all zero bytes are a valid value.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
            // SAFETY: waitid(2) gets a valid pointer to `info`, fills it in and keeps no pointer
            // to it; WNOWAIT leaves the child waitable (unreaped), WNOHANG returns at once.
            if unsafe { libc::waitid(libc::P_PID, pid, &mut info, flags) } != 0 {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(error);
            }
            // SAFETY: waitid(2) filled in a SIGCHLD's fields (or left them zeroed: still running).
            let (from, status) = unsafe { (info.si_pid(), info.si_status()) };
            if from == 0 {
                return Ok(None);
            }
            // The wait status that waitpid(2) would give.
            let raw = match info.si_code {
                libc::CLD_EXITED => (status & 0xff) << 8,
                libc::CLD_KILLED => status & 0x7f,
                libc::CLD_DUMPED => (status & 0x7f) | 0x80,
                // Stopped or continued: not asked for (no WSTOPPED, WCONTINUED).
                _ => return Ok(None),
            };
            return Ok(Some(Exit { status: ExitStatus::from_raw(raw), held: true }));
        }
    }
    #[cfg(not(target_os = "linux"))]
    Ok(child.try_wait()?.map(|status| Exit { status, held: false }))
}

/// Reaps a child that [`exited`] left unreaped (its status is the one `exited` gave).
pub(super) fn release(child: &mut Child) -> io::Result<()> {
    child.wait().map(drop)
}

/// The process groups of the processes running now, zombies left out (Linux, from `/proc`;
/// empty where it cannot be read, or elsewhere).
pub(super) fn live_groups() -> HashSet<u32> {
    #[cfg(target_os = "linux")]
    {
        let mut groups = HashSet::new();
        let Ok(entries) = std::fs::read_dir("/proc") else { return groups };
        for entry in entries.flatten() {
            if !entry.file_name().as_encoded_bytes().iter().all(u8::is_ascii_digit) {
                continue;
            }
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            // After the command name, which is in parentheses: the state, the parent, the group.
            let Some((_, rest)) = stat.rsplit_once(") ") else { continue };
            let mut fields = rest.split(' ');
            let (Some(state), Some(_), Some(group)) = (fields.next(), fields.next(), fields.next()) else { continue };
            if !matches!(state, "Z" | "X") {
                if let Ok(group) = group.parse() {
                    groups.insert(group);
                }
            }
        }
        groups
    }
    #[cfg(not(target_os = "linux"))]
    HashSet::new()
}

/// Puts the child in a process group of its own (Unix), so that stopping it reaches what it
/// starts (a shell's commands, Python's workers) instead of leaving them orphaned; the spawner
/// forwards the signals meant for the job ([`Forwarding`]), as a terminal's Ctrl-C now reaches
/// only the spawner.
pub(super) fn own_group(command: &mut Command) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        command.process_group(0);
    }
    #[cfg(not(unix))]
    let _ = command;
}

/// The signal most recently received for the jobs (0: none yet).
#[cfg(unix)]
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// How many signals the handler has received: each [`Forwarding`] passes on those received
/// since it last looked, so that jobs spawned at the same time by several threads each get them.
#[cfg(unix)]
static SIGNALS: AtomicUsize = AtomicUsize::new(0);

/// The handlers' installation, shared by the [`Forwarding`]s alive at one time (`spawn_local`
/// called by several threads at once): installed by the first, put back by the last, so that
/// the process's own handlers come back whatever order the calls end in.
#[cfg(unix)]
struct Installed {
    /// The live `Forwarding`s.
    calls: usize,
    /// The actions the handlers replaced.
    earlier: Vec<(libc::c_int, libc::sigaction)>,
    /// [`SIGNALS`] when the handlers were installed.
    signals_then: usize,
}

// SAFETY: `sigaction` is plain C data (numbers, a handler address, a signal set), valid on any
// thread.
#[cfg(unix)]
unsafe impl Send for Installed {}

#[cfg(unix)]
static INSTALLED: Mutex<Option<Installed>> = Mutex::new(None);

/// The signals a job's ranks get when the spawner gets them.
#[cfg(unix)]
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

#[cfg(unix)]
extern "C" fn received(signal: libc::c_int) {
    RECEIVED.store(signal, Ordering::Relaxed);
    SIGNALS.fetch_add(1, Ordering::Release);
}

/// While it lives, `SIGINT`, `SIGTERM` and `SIGHUP` to this process are caught for the ranks
/// ([`Forwarding::take`]) instead of ending it. When the last `Forwarding` alive is dropped
/// (several threads may spawn jobs at once: each job gets every signal), the earlier handlers
/// come back and, if one of those signals was caught meanwhile, it is raised again, so that the
/// spawner then ends (or runs its own handler) as it would have without the ranks: a `timeout`
/// or a batch system that stops the spawner still stops it, once its ranks are stopped.
pub(super) struct Forwarding {
    /// [`SIGNALS`] when this one last passed a signal on (or started).
    #[cfg(unix)]
    seen: std::cell::Cell<usize>,
}

#[cfg(unix)]
fn installed() -> std::sync::MutexGuard<'static, Option<Installed>> {
    // The state is consistent between statements, so a poisoned lock is still usable.
    INSTALLED.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Catches the forwarded signals, and returns the actions they had.
#[cfg(unix)]
fn install() -> Vec<(libc::c_int, libc::sigaction)> {
    let mut earlier = Vec::new();
    for signal in FORWARDED {
        // SAFETY: the structs are plain C data, zeroed then filled in; the handler only stores to
        // atomics, which is async-signal-safe; sigaction(2) is given valid pointers and keeps the
        // earlier action in `old`, put back by the last `Forwarding`.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = received as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, &action, &mut old) == 0 {
                earlier.push((signal, old));
            }
        }
    }
    earlier
}

impl Forwarding {
    pub(super) fn start() -> Forwarding {
        #[cfg(unix)]
        {
            let mut installed = installed();
            let state = installed.get_or_insert_with(|| Installed {
                calls: 0,
                signals_then: SIGNALS.load(Ordering::Acquire),
                earlier: install(),
            });
            state.calls += 1;
            Forwarding { seen: std::cell::Cell::new(SIGNALS.load(Ordering::Acquire)) }
        }
        #[cfg(not(unix))]
        Forwarding {}
    }

    /// The signal received since the last call, if any, to send on to the ranks.
    #[cfg(unix)]
    pub(super) fn take(&self) -> Option<libc::c_int> {
        let now = SIGNALS.load(Ordering::Acquire);
        if now == self.seen.replace(now) {
            return None;
        }
        Some(RECEIVED.load(Ordering::Relaxed)).filter(|&signal| signal != 0)
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        #[cfg(unix)]
        {
            let mut installed = installed();
            let Some(state) = installed.as_mut() else { return };
            state.calls -= 1;
            if state.calls > 0 {
                // The others keep the handlers, and pass on what comes.
                return;
            }
            let Some(state) = installed.take() else { return };
            drop(installed);
            for (signal, old) in &state.earlier {
                // SAFETY: `old` is the action sigaction(2) reported for `signal` when the handlers
                // were installed.
                unsafe {
                    libc::sigaction(*signal, old, std::ptr::null_mut());
                }
            }
            // A signal caught while the handlers were in place was meant for this process too.
            if SIGNALS.load(Ordering::Acquire) != state.signals_then {
                let signal = RECEIVED.load(Ordering::Relaxed);
                if signal != 0 {
                    // SAFETY: raise(3) has no memory-safety preconditions; the earlier action
                    // of `signal` is back in place.
                    unsafe {
                        libc::raise(signal);
                    }
                }
            }
        }
    }
}

/// Arranges for the child to get `SIGTERM` when the spawning thread's process dies (Linux),
/// so ranks do not outlive a spawner that was killed.
pub(super) fn stop_with_parent(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;

        let Ok(parent) = libc::pid_t::try_from(std::process::id()) else { return };
        let hook = move || -> std::io::Result<()> {
            // SAFETY: prctl(PR_SET_PDEATHSIG) only sets an attribute of the calling process and
            // is async-signal-safe; the argument is a signal number, passed as the unsigned long
            // the kernel reads.
            if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The spawner may have died before the attribute was set: then stop now.
            // SAFETY: getppid(2) has no preconditions and is async-signal-safe.
            if unsafe { libc::getppid() } != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        };
        // SAFETY: `pre_exec` requires the hook to be safe to run between fork and exec: it only
        // calls the async-signal-safe prctl(2) and getppid(2), and builds its errors from OS error
        // codes without allocating or taking locks.
        unsafe {
            command.pre_exec(hook);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

/// `exited with code 3`, `was killed by signal 9 (SIGKILL)`.
pub(super) fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            let core = if status.core_dumped() { ", core dumped" } else { "" };
            return match signal_name(signal) {
                Some(name) => format!("was killed by signal {signal} ({name}{core})"),
                None => format!("was killed by signal {signal}{core}"),
            };
        }
    }
    match status.code() {
        Some(code) => format!("exited with code {code}"),
        None => format!("ended abnormally ({status})"),
    }
}

#[cfg(unix)]
fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return None,
    })
}
