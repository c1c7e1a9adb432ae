//! The operating-system side of child processes: signals and exit statuses.

use std::process::{Child, Command, ExitStatus};

/// Asks a child to stop: `SIGTERM` on Unix (so it can clean up), a hard kill elsewhere.
pub(super) fn terminate(child: &mut Child) {
    #[cfg(unix)]
    {
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) has no memory-safety preconditions. `pid` is a child of this process
            // that has not been reaped (callers only signal children whose `try_wait` has not
            // returned a status), so the id cannot have been reused by an unrelated process.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
            return;
        }
    }
    let _ = child.kill();
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
