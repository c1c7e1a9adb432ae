//! The operating-system side of child processes: process groups, signals and exit statuses.

use std::process::{Child, Command, ExitStatus};
#[cfg(unix)]
use std::sync::atomic::{AtomicI32, Ordering};

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
    // has not been reaped (callers only signal children whose `try_wait` has not returned a
    // status), so neither its id nor its group's (the same number) can have been reused.
    unsafe { libc::kill(-pid, signal) == 0 }
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

/// The signal most recently received for the job and not yet forwarded (0: none).
#[cfg(unix)]
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// The signals a job's ranks get when the spawner gets them.
#[cfg(unix)]
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

#[cfg(unix)]
extern "C" fn received(signal: libc::c_int) {
    RECEIVED.store(signal, Ordering::Relaxed);
}

/// While it lives, `SIGINT`, `SIGTERM` and `SIGHUP` to this process are caught for the ranks
/// ([`Forwarding::take`]) instead of ending it; dropping it puts the earlier handlers back and,
/// if one of those signals was caught, raises it again, so that the spawner then ends (or runs
/// its own handler) as it would have without the ranks: a `timeout` or a batch system that
/// stops the spawner still stops it, once its ranks are stopped.
pub(super) struct Forwarding {
    #[cfg(unix)]
    earlier: Vec<(libc::c_int, libc::sigaction)>,
    #[cfg(unix)]
    caught: std::cell::Cell<Option<libc::c_int>>,
}

impl Forwarding {
    pub(super) fn start() -> Forwarding {
        #[cfg(unix)]
        {
            RECEIVED.store(0, Ordering::Relaxed);
            let mut earlier = Vec::new();
            for signal in FORWARDED {
                // SAFETY: the structs are plain C data, zeroed then filled in; the handler only
                // stores to an atomic, which is async-signal-safe; sigaction(2) is given valid
                // pointers and keeps the earlier action in `old`, put back on drop.
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
            Forwarding { earlier, caught: std::cell::Cell::new(None) }
        }
        #[cfg(not(unix))]
        Forwarding {}
    }

    /// The signal received since the last call, if any, to send on to the ranks.
    #[cfg(unix)]
    pub(super) fn take(&self) -> Option<libc::c_int> {
        let signal = Some(RECEIVED.swap(0, Ordering::Relaxed)).filter(|&signal| signal != 0);
        if signal.is_some() {
            self.caught.set(signal);
        }
        signal
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        #[cfg(unix)]
        {
            for (signal, old) in &self.earlier {
                // SAFETY: `old` is the action sigaction(2) reported for `signal` in `start`.
                unsafe {
                    libc::sigaction(*signal, old, std::ptr::null_mut());
                }
            }
            // One that came after the ranks were gone was never passed on: it is this process's.
            let caught = self.caught.get().or_else(|| self.take());
            if let Some(signal) = caught {
                // SAFETY: raise(3) has no memory-safety preconditions; the earlier action of
                // `signal` is back in place.
                unsafe {
                    libc::raise(signal);
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
