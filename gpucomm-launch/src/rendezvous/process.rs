//! Whether the process that holds a claim still runs.
//!
//! A claim names its holder by host name, process id and store address (for messages), and,
//! under its MAC, by what sets a process apart from every other one on its machine
//! ([`Identity`]): the running kernel's boot id, the PID namespace it lives in and the time it
//! started. Only a process of the same boot and PID namespace can be looked up; another host's,
//! or another container's on the same host (which, with host networking, has the same host
//! name, and may even have the same process id), is never taken for gone. Within them a process
//! id can be reused: a holder is gone when no process has its id now (`kill(pid, 0)`, which sees
//! other users' processes too), or one that started at another time does; one whose start time
//! cannot be read (another user's, with `/proc` mounted `hidepid`) is taken to run.
//!
//! A claim of this very process is gone once the session that made it ended (an earlier attempt
//! of the rendezvous that failed): the sessions in progress register the nonces of their claims
//! ([`Live`]).

use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

/// Characters of a boot id kept (the kernel's is a 36-character UUID).
const MAX_BOOT: usize = 64;

/// What sets a process apart from every other one on its machine; empty (an empty boot id, a
/// namespace of 0) where `/proc` does not say, and then it is never taken for gone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Identity {
    /// `/proc/sys/kernel/random/boot_id`: random at each boot of the kernel.
    pub(super) boot: String,
    /// The inode of `/proc/self/ns/pid`: the PID namespace.
    pub(super) pidns: u64,
    /// When the process started, in clock ticks after boot (`/proc/<pid>/stat`, field 22).
    pub(super) started: u64,
}

impl Identity {
    /// This process's, read at each call (a child forked without `exec` is another process).
    /// Unknown when `/proc` is not this PID namespace's (`unshare -p` without a `/proc` of its
    /// own, a sandbox showing the host's): its process ids would name other processes.
    pub(super) fn of_this_process() -> Identity {
        let pid = std::process::id();
        let own_proc = std::fs::read_link("/proc/self").is_ok_and(|link| link.as_os_str() == pid.to_string().as_str());
        if !own_proc {
            return Identity::default();
        }
        Identity {
            boot: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|boot| boot.trim().chars().take(MAX_BOOT).collect())
                .unwrap_or_default(),
            pidns: std::fs::metadata("/proc/self/ns/pid").map_or(0, |ns| ns.ino()),
            started: started(pid).unwrap_or(0),
        }
    }

    fn known(&self) -> bool {
        !self.boot.is_empty() && self.pidns != 0 && self.started != 0
    }
}

/// Who made a claim: for messages, host, process id and the address its store connection came
/// from; and what tells whether it still runs ([`Identity`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Claimant {
    pub(super) host: String,
    pub(super) pid: u32,
    pub(super) addr: String,
    pub(super) id: Identity,
}

impl Claimant {
    /// This process, connected from `addr`.
    pub(super) fn this_process(addr: Option<std::net::SocketAddr>) -> Claimant {
        Claimant {
            host: hostname(),
            pid: std::process::id(),
            addr: addr.map_or_else(|| "an unknown address".to_string(), |a| a.to_string()),
            id: Identity::of_this_process(),
        }
    }
}

/// This machine's host name, or `unknown host`.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname(2) writes at most `buf.len()` bytes into `buf`, a live local array.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match (rc, std::str::from_utf8(&buf[..end])) {
        (0, Ok(name)) if !name.is_empty() => name.to_string(),
        _ => "unknown host".to_string(),
    }
}

/// What looking up a process id in this PID namespace finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// No process has it.
    Nothing,
    /// A process that started at this time (clock ticks after boot).
    Started(u64),
    /// A process whose start time cannot be read (another user's, with `/proc` mounted
    /// `hidepid`).
    Unreadable,
}

/// Looks up process `pid`: `kill(pid, 0)` tells whether it exists (another user's too), and
/// `/proc/<pid>/stat` when it started.
pub(super) fn look_up(pid: u32) -> Found {
    let Ok(id) = libc::pid_t::try_from(pid) else { return Found::Nothing };
    if id <= 0 {
        // 0 and negative ids name process groups: no process.
        return Found::Nothing;
    }
    // SAFETY: signal 0 is not sent: `kill` only checks that the process exists and may be
    // signalled; it touches no memory of this process.
    if unsafe { libc::kill(id, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return Found::Nothing;
    }
    started(pid).map_or(Found::Unreadable, Found::Started)
}

/// When process `pid` of this PID namespace started, in clock ticks after boot, as
/// `/proc/<pid>/stat` says (`None` when it cannot be read).
fn started(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`: the command name may hold spaces, parentheses and bytes that are
    // not UTF-8 (the kernel cuts it to 15 bytes, inside a character too), so the fields are
    // counted after its last `)`; the start time is field 22, the 20th after it.
    let after = stat.iter().rposition(|&b| b == b')')?;
    let fields = std::str::from_utf8(&stat[after + 1..]).ok()?;
    fields.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `who`, holding a claim with nonce `nonce`, runs no more as far as `me` can tell (see
/// the module's documentation). A claim of this very process counts only when `own` is set.
pub(super) fn gone(who: &Claimant, nonce: &[u8; 16], me: &Claimant, own: bool) -> bool {
    gone_by(who, nonce, me, own, look_up, Live::holds)
}

fn gone_by(
    who: &Claimant,
    nonce: &[u8; 16],
    me: &Claimant,
    own: bool,
    look_up: impl Fn(u32) -> Found,
    live: impl Fn(&[u8; 16]) -> bool,
) -> bool {
    let (theirs, mine) = (&who.id, &me.id);
    // The host name too: machines started from one snapshot of a running VM share a boot id, and
    // the first PID namespace has the same number everywhere.
    let here = who.host == me.host && theirs.boot == mine.boot && theirs.pidns == mine.pidns;
    if !here || !theirs.known() || !mine.known() {
        return false;
    }
    if who.pid == me.pid && theirs.started == mine.started {
        return own && !live(nonce);
    }
    match look_up(who.pid) {
        Found::Nothing => true,
        Found::Started(started) => started != theirs.started,
        Found::Unreadable => false,
    }
}

/// The nonces of the claims of this process's sessions in progress.
static LIVE: Mutex<Vec<[u8; 16]>> = Mutex::new(Vec::new());

/// A session's claim, registered as live while the value lives.
pub(super) struct Live([u8; 16]);

impl Live {
    pub(super) fn hold(nonce: [u8; 16]) -> Live {
        LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(nonce);
        Live(nonce)
    }

    fn holds(nonce: &[u8; 16]) -> bool {
        LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).contains(nonce)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let mut live = LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(at) = live.iter().position(|nonce| *nonce == self.0) {
            live.swap_remove(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pid: u32, boot: &str, pidns: u64, started: u64) -> Claimant {
        let id = Identity { boot: boot.into(), pidns, started };
        Claimant { host: "node".into(), pid, addr: "127.0.0.1:1".into(), id }
    }

    #[test]
    fn a_holder_is_gone_only_when_this_process_can_look_it_up() {
        let me = holder(100, "boot-a", 7, 5000);
        // Processes 200 (started at 900) and 1 run, and 400, another user's under `hidepid`.
        let look_up = |pid: u32| match pid {
            200 => Found::Started(900),
            1 => Found::Started(1),
            400 => Found::Unreadable,
            _ => Found::Nothing,
        };
        let gone = |who: &Claimant, own: bool, live: bool| gone_by(who, &[3; 16], &me, own, look_up, |_| live);
        assert!(gone(&holder(300, "boot-a", 7, 800), false, false), "no process has its id");
        assert!(gone(&holder(200, "boot-a", 7, 800), false, false), "its id was reused by a later process");
        assert!(!gone(&holder(200, "boot-a", 7, 900), false, false), "it runs: a duplicate");
        assert!(!gone(&holder(400, "boot-a", 7, 800), false, false), "a process that runs, its start unseen");
        assert!(!gone(&holder(300, "boot-a", 8, 800), false, false), "another PID namespace (a container)");
        assert!(!gone(&holder(1, "boot-a", 8, 1), false, false), "pid 1 of another namespace");
        assert!(!gone(&holder(300, "boot-b", 7, 800), false, false), "another machine, or an earlier boot");
        assert!(!gone(&holder(300, "", 0, 0), false, false), "an identity /proc did not give");
        assert!(!gone(&holder(300, "boot-a", 7, 0), false, false), "a start time /proc did not give");
        let mut elsewhere = holder(300, "boot-a", 7, 800);
        elsewhere.host = "a clone of this VM".into();
        assert!(!gone(&elsewhere, false, false), "another host with this boot id");
        // This very process: gone once the session that claimed has ended, where that counts.
        let this = holder(100, "boot-a", 7, 5000);
        assert!(gone(&this, true, false));
        assert!(!gone(&this, true, true), "a session of this process in progress");
        assert!(!gone(&this, false, false));
    }

    #[test]
    fn a_start_time_is_read_after_a_command_name_of_any_bytes() {
        let dir = std::env::temp_dir().join(format!("gpucomm-comm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A name of 22 bytes with a space and a parenthesis, which the kernel cuts to 15 inside a
        // character (a link: the name a program is started by is its command name; a copy of the
        // program could be busy, still open for writing in a child another test forks).
        let name = dir.join("ab (训练模型程序");
        std::os::unix::fs::symlink("/bin/sleep", &name).unwrap();
        let mut child = std::process::Command::new(&name).arg("60").spawn().unwrap();
        let found = look_up(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(found, Found::Started(t) if t > 0), "{found:?}");
    }

    #[test]
    fn this_processs_identity_and_start_time_are_read_from_proc() {
        let me = Identity::of_this_process();
        assert_eq!(me.boot.len(), 36, "{me:?}");
        assert!(me.pidns != 0 && me.started != 0, "{me:?}");
        assert_eq!(look_up(std::process::id()), Found::Started(me.started));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(look_up(pid), Found::Nothing);
        assert_eq!((look_up(0), look_up(u32::MAX)), (Found::Nothing, Found::Nothing));
        let live = Live::hold([9; 16]);
        assert!(Live::holds(&[9; 16]));
        drop(live);
        assert!(!Live::holds(&[9; 16]));
    }
}
