//! Rank 0 needs a file descriptor for each rank's connection to the store it hosts: it raises its
//! soft `RLIMIT_NOFILE` when that leaves no room for them, and fails at once, naming `ulimit -n`,
//! when the hard limit leaves none. The limits are changed in a child process (a lowered hard
//! limit cannot be raised again).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use gpucomm_launch::{Rendezvous, RendezvousError};

const TOKEN: &str = "descriptor-limit";
const PORT_VAR: &str = "GPUCOMM_TEST_FD_LIMIT_PORT";

/// The descriptors this process has open, counted as rank 0 counts them.
fn open_descriptors() -> libc::rlim_t {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as libc::rlim_t
}

fn get_limit() -> libc::rlimit {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) writes one `rlimit`, and `limit` is a live local of that type.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    limit
}

fn set_limit(limit: libc::rlimit) {
    // SAFETY: setrlimit(2) reads one `rlimit`, and `limit` is a live value of that type.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
}

/// The child: rank 0 of 2 (alone) under a low soft limit, then rank 0 of 100 under a low hard
/// limit.
#[test]
#[ignore = "helper process started by rank_0_raises_its_descriptor_limit_or_says_it_cannot"]
fn rank_0_under_low_descriptor_limits() {
    let Some(port) = std::env::var(PORT_VAR).ok().and_then(|p| p.parse().ok()) else { return };
    let hard = get_limit().rlim_max;
    assert!(hard >= 2048, "this test needs a hard descriptor limit of 2048, not {hard}");

    // A soft limit with room for ten more descriptors: rank 0 raises it to make room for the
    // 1024 connections its store takes (the default `max_connections`) and its own four.
    let open = open_descriptors();
    set_limit(libc::rlimit { rlim_cur: open + 10, rlim_max: hard });
    let err = Rendezvous::connect(&info(0, 2, port, TOKEN), &options(0.3)).unwrap_err();
    assert!(matches!(err, RendezvousError::TimedOut { .. }), "{err}");
    assert_eq!(get_limit().rlim_cur, open + 1024 + 4);
    assert_eq!(get_limit().rlim_max, hard);

    // A hard limit with room for ten more descriptors, and a job of 100 ranks: a clear error at
    // once, before rank 0 listens.
    let open = open_descriptors();
    set_limit(libc::rlimit { rlim_cur: open + 10, rlim_max: open + 10 });
    let started = Instant::now();
    let err = Rendezvous::connect(&info(0, 100, port, TOKEN), &options(30.0)).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    match err {
        RendezvousError::TooFewDescriptors { world_size, needed, hard_limit, open: seen } => {
            assert_eq!((world_size, needed, hard_limit, seen as libc::rlim_t), (100, open + 104, open + 10, open));
        }
        ref other => panic!("{other}"),
    }
    let needed = open + 104;
    assert_eq!(
        err.to_string(),
        format!(
            "rank 0 cannot host the store of 100 ranks: it needs {needed} file descriptors (one for each rank's \
             connection, {open} already open, and a few for the store), and its hard limit (RLIMIT_NOFILE, `ulimit \
             -Hn`) is {}. Start rank 0 with a hard limit of at least {needed} (which root raises: \
             /etc/security/limits.conf, or LimitNOFILE= of the service that starts the job) and `ulimit -n \
             {needed}` before it, or host the store elsewhere (GPUCOMM_STORE=external)",
            open + 10
        )
    );
    // Nothing listens: the check came first.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    println!("child done");
}

#[test]
fn rank_0_raises_its_descriptor_limit_or_says_it_cannot() {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "rank_0_under_low_descriptor_limits", "--ignored", "--nocapture", "--test-threads=1"])
        .env(PORT_VAR, free_port().to_string())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success() && stdout.contains("child done"), "{stdout}\n{stderr}");
}
