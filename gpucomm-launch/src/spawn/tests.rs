use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::{run_main, Options, Rendezvous};

/// Set by [`ranks_rendezvous_across_processes`] for its children: the folder for their results.
const CHILD_DIR: &str = "GPUCOMM_TEST_CHILD_DIR";

struct Captured {
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
}

impl Captured {
    fn new() -> Captured {
        Captured { out: Arc::default(), err: Arc::default() }
    }
    fn sinks(&self) -> [Sink; 2] {
        [Sink::Buffer(self.out.clone()), Sink::Buffer(self.err.clone())]
    }
    fn out(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }
    fn err(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().unwrap()).into_owned()
    }
}

fn sh(nproc: usize, script: &str, extra: &[(String, String)], grace: Duration, captured: &Captured) -> Outcome {
    let args = [OsString::from("-c"), OsString::from(script)];
    spawn_to(nproc, Path::new("/bin/sh"), &args, extra, grace, captured.sinks()).unwrap()
}

#[test]
fn output_is_prefixed_and_variables_are_set() {
    let captured = Captured::new();
    let script = "echo hello from $RANK of $WORLD_SIZE local $LOCAL_RANK of $LOCAL_WORLD_SIZE; \
                  echo oops >&2; \
                  echo vars $NCCL_NVLS_ENABLE $NVSHMEM_DISABLE_NVLS $TORCH_SYMM_MEM_DISABLE_MULTICAST \
                  $GPUCOMM_SPAWNED $MASTER_ADDR $MY_VAR; \
                  echo port $MASTER_PORT token $GPUCOMM_JOB_TOKEN key $GPUCOMM_JOB_KEY";
    let extra = [("NCCL_NVLS_ENABLE".to_string(), "1".to_string()), ("MY_VAR".to_string(), "mine".to_string())];
    let outcome = sh(2, script, &extra, Duration::from_secs(1), &captured);
    assert!(outcome.success(), "{outcome}");
    assert_eq!(outcome.exit_code(), 0);
    assert_eq!(outcome.statuses.len(), 2);
    assert_eq!(outcome.to_string(), "all 2 ranks exited successfully");
    let out = captured.out();
    for rank in 0..2 {
        assert!(out.contains(&format!("[rank {rank}] hello from {rank} of 2 local {rank} of 2\n")), "{out}");
        // The safety variables win over extra_env.
        assert!(out.contains(&format!("[rank {rank}] vars 0 1 1 1 127.0.0.1 mine\n")), "{out}");
        assert!(captured.err().contains(&format!("[rank {rank}] oops\n")));
    }
    // Both ranks got the same port, token and key: 32 and 64 random hex digits.
    let ports: Vec<&str> = out.lines().filter(|l| l.contains("] port ")).map(|l| &l[9..]).collect();
    assert_eq!(ports.len(), 2);
    assert_eq!(ports[0], ports[1], "{out}");
    let words: Vec<&str> = ports[0].split(' ').collect();
    assert_eq!((words[2], words[4]), ("token", "key"), "{out}");
    assert!(words[3].len() == 32 && words[5].len() == 64, "{out}");
    assert!(words[3].bytes().chain(words[5].bytes()).all(|c| c.is_ascii_hexdigit()), "{out}");
    assert!(out.lines().all(|l| l.starts_with("[rank 0] ") || l.starts_with("[rank 1] ")));
}

#[test]
fn one_failure_stops_the_others_quickly() {
    let captured = Captured::new();
    let started = Instant::now();
    let script = "if [ \"$RANK\" = 1 ]; then echo failing; exit 3; fi; exec sleep 30";
    let outcome = sh(3, script, &[], Duration::from_secs(5), &captured);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert!(!outcome.success());
    assert_eq!(outcome.first_failure, Some((1, "exited with code 3".to_string())));
    assert_eq!(outcome.exit_code(), 3);
    assert_eq!(outcome.to_string(), "rank 1 exited with code 3; the ranks still running were stopped");
    for (rank, status) in &outcome.statuses {
        if *rank != 1 {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(libc::SIGTERM), "rank {rank}");
        }
    }
    assert!(captured.out().contains("[rank 1] failing\n"));
}

#[test]
fn survivors_of_sigterm_are_killed_after_the_grace_period() {
    let captured = Captured::new();
    let started = Instant::now();
    // `trap '' TERM` makes the shell, and the sleep it execs, ignore SIGTERM. Rank 0 fails only
    // once rank 1 has set that up.
    let dir = tempfile::tempdir().unwrap();
    let script = "trap '' TERM; \
                  if [ \"$RANK\" = 0 ]; then while [ ! -e \"$READY_DIR/ready\" ]; do sleep 0.02; done; exit 1; fi; \
                  touch \"$READY_DIR/ready\"; exec sleep 30";
    let extra = [("READY_DIR".to_string(), dir.path().to_string_lossy().into_owned())];
    let outcome = sh(2, script, &extra, Duration::from_millis(300), &captured);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert_eq!(outcome.first_failure, Some((0, "exited with code 1".to_string())));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(outcome.statuses[1].1.signal(), Some(libc::SIGKILL));
}

#[test]
fn a_signal_is_reported_as_such() {
    let captured = Captured::new();
    let outcome = sh(1, "kill -KILL $$", &[], Duration::from_secs(1), &captured);
    assert_eq!(outcome.first_failure, Some((0, "was killed by signal 9 (SIGKILL)".to_string())));
    assert_eq!(outcome.exit_code(), 1);
    // One rank: no others to stop (the message said "the other ranks were stopped").
    assert_eq!(outcome.to_string(), "rank 0 was killed by signal 9 (SIGKILL)");
}

#[test]
fn spawn_errors() {
    let missing = Path::new("/nonexistent/gpucomm-test-program");
    match spawn_to(2, missing, &[], &[], Duration::from_secs(1), Captured::new().sinks()) {
        Err(e @ SpawnError::Spawn { rank: 0, .. }) => {
            assert!(e.to_string().starts_with("could not start rank 0 (/nonexistent/gpucomm-test-program)"))
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(spawn_local(0, missing, &[], &[], Duration::ZERO), Err(SpawnError::NoProcesses)));
}

/// Parent half of the cross-process test: three copies of this test binary, each running only
/// [`child_rank`], meet through a real rendezvous.
#[test]
fn ranks_rendezvous_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let args: Vec<OsString> =
        ["spawn::tests::child_rank", "--exact", "--nocapture", "--test-threads=1"].map(OsString::from).into();
    let extra = [
        (CHILD_DIR.to_string(), dir.path().to_string_lossy().into_owned()),
        ("GPUCOMM_RENDEZVOUS_TIMEOUT".to_string(), "20".to_string()),
    ];
    let captured = Captured::new();
    let outcome = spawn_to(3, &exe, &args, &extra, Duration::from_secs(2), captured.sinks()).unwrap();
    assert!(outcome.success(), "{outcome}\nstdout:\n{}\nstderr:\n{}", captured.out(), captured.err());
    let results: Vec<String> =
        (0..3).map(|rank| std::fs::read_to_string(dir.path().join(format!("rank{rank}"))).unwrap()).collect();
    assert!(results.iter().all(|r| r == &results[0]), "{results:?}");
    assert_eq!(results[0].lines().count(), 2);
    assert!(captured.out().contains("child rank 2 of 3 done"), "{}", captured.out());
}

/// Child half: does nothing unless started by [`ranks_rendezvous_across_processes`].
#[test]
fn child_rank() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else { return };
    let code = run_main(|info| {
        let mut rendezvous = Rendezvous::connect(&info, &Options::from_env()?)?;
        let first = rendezvous.broadcast(|| Ok(std::process::id().to_be_bytes().repeat(32)))?;
        let second = rendezvous.broadcast(|| Ok(std::env::var(crate::JOB_TOKEN_VAR).unwrap().into_bytes()))?;
        // The spawner's key protects the rendezvous; rank 0 hosted the store.
        assert!(Options::from_env()?.job_key.is_some());
        assert_eq!(rendezvous.store_stats().is_some(), info.rank == 0);
        rendezvous.barrier()?;
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let text = format!("{}\n{}\n", hex(&first), hex(&second));
        std::fs::write(Path::new(&dir).join(format!("rank{}", info.rank)), text)?;
        println!("child rank {} of {} done", info.rank, info.world_size);
        Ok(())
    });
    assert_eq!(code, ExitCode::SUCCESS);
}

#[test]
fn output_still_draining_when_the_ranks_exit_is_all_relayed() {
    // A rank prints 300 lines and exits at once, and the parent's output takes each line 10 ms
    // later (a terminal that drains slowly): 3 s of relaying after the exit. Before: the spawner
    // gave up 2 s after the exit, whatever the relays were still doing, and the last lines (an
    // error's, usually) were lost.
    let out = Arc::new(Mutex::new(Vec::new()));
    let sinks = [Sink::Slow(out.clone(), Duration::from_millis(10)), Sink::Buffer(Arc::default())];
    let args = [OsString::from("-c"), OsString::from("i=0; while [ $i -lt 300 ]; do echo line $i; i=$((i+1)); done")];
    let outcome = spawn_to(1, Path::new("/bin/sh"), &args, &[], Duration::from_secs(1), sinks).unwrap();
    assert!(outcome.success(), "{outcome}");
    let out = String::from_utf8_lossy(&out.lock().unwrap()).into_owned();
    assert_eq!(out.lines().count(), 300, "{out}");
    assert!(out.ends_with("[rank 0] line 299\n"));
}

/// True while process `pid` runs (gone, or a zombie waiting for its parent, counts as ended).
/// Whether the process whose pid `pid_file` holds still runs 10 s from now (it is killed then,
/// so that a failing test leaves nothing behind).
fn survives(pid_file: &std::path::Path) -> bool {
    let pid: u32 = std::fs::read_to_string(pid_file).unwrap().trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while runs(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let survived = runs(pid);
    if survived {
        // SAFETY: kill(2) has no memory-safety preconditions; the test started this process.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
    survived
}

fn runs(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

#[test]
fn stopping_a_rank_stops_what_it_started() {
    // Rank 1 fails; rank 0 is a shell waiting for a `sleep` it started. Before: the SIGTERM went
    // to the shell only, which died, and the `sleep` ran on, orphaned, holding the output pipes.
    // Now the rank's whole process group gets it.
    let dir = std::env::temp_dir().join(format!("gpucomm-spawn-group-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pid_file = dir.join("sleep.pid");
    let _ = std::fs::remove_file(&pid_file);
    // Rank 1 fails once rank 0's `sleep` is running (its pid written), or after 60 s.
    let script = format!(
        "if [ $RANK = 1 ]; then i=0; while [ ! -s {pid} ] && [ $i -lt 3000 ]; do sleep 0.02; i=$((i+1)); done; exit 3; \
         fi; sleep 600 & echo $! > {pid}; wait $!",
        pid = pid_file.display()
    );
    let captured = Captured::new();
    let outcome = sh(2, &script, &[], Duration::from_secs(2), &captured);
    assert_eq!(outcome.first_failure, Some((1, "exited with code 3".to_string())), "{outcome}");
    let survived = survives(&pid_file);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!survived, "the sleep rank 0 started outlived the job");
}

#[test]
fn what_a_failed_rank_left_running_is_stopped_too() {
    // Rank 0 starts a `sleep` in the background and fails at once. Before: only ranks still
    // running were signaled, so the orphaned `sleep` (in rank 0's process group) ran on for ten
    // minutes, holding the output pipes (and what a real rank holds: its GPU).
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("sleep.pid");
    let script = format!("sleep 600 & echo $! > {pid}; exit 3", pid = pid_file.display());
    let captured = Captured::new();
    let outcome = sh(1, &script, &[], Duration::from_secs(2), &captured);
    assert_eq!(outcome.first_failure, Some((0, "exited with code 3".to_string())), "{outcome}");
    let survived = survives(&pid_file);
    assert!(!survived, "the sleep the failed rank started outlived it");
}

#[test]
fn what_a_rank_left_running_that_ignores_sigterm_is_killed_after_the_grace_period() {
    // The rank succeeds, leaving a `sleep` that ignores SIGTERM in its group: it gets SIGKILL
    // 0.3 s later, and the call returns once it is gone.
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("sleep.pid");
    let script = format!("(trap '' TERM; exec sleep 600) & echo $! > {pid}; exit 0", pid = pid_file.display());
    let captured = Captured::new();
    let outcome = sh(1, &script, &[], Duration::from_millis(300), &captured);
    assert!(outcome.success(), "{outcome}");
    let survived = survives(&pid_file);
    assert!(!survived, "the sleep the rank started outlived it");
}

/// Set by [`a_signal_to_the_spawner_reaches_the_ranks_and_then_the_spawner`] for its child.
const SPAWNER_CHILD: &str = "GPUCOMM_TEST_SPAWNER_CHILD";

#[test]
fn a_signal_to_the_spawner_reaches_the_ranks_and_then_the_spawner() {
    // A spawner (this test binary, running only `spawner_child`) with one rank that traps SIGINT.
    // SIGINT to the spawner — what Ctrl-C does, the ranks being in groups of their own — is
    // passed on to the rank, whose trap runs, and then ends the spawner itself, as it would have
    // without ranks (a `timeout` that stops the spawner still stops it).
    let exe = std::env::current_exe().unwrap();
    let mut spawner = std::process::Command::new(exe)
        .args(["spawn::tests::spawner_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(SPAWNER_CHILD, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(spawner.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("trap set") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0, "the spawner ended early");
    }
    // SAFETY: kill(2) has no memory-safety preconditions; the test started this process.
    unsafe { libc::kill(spawner.id() as libc::pid_t, libc::SIGINT) };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = spawner.wait().unwrap();
    assert!(rest.contains("[rank 0] got SIGINT"), "{rest}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}\n{rest}");
}

/// Child half: does nothing unless started by the test above.
#[test]
fn spawner_child() {
    if std::env::var_os(SPAWNER_CHILD).is_none() {
        return;
    }
    // In the foreground, so that the SIGINT reaches the `sleep` too (a shell's background
    // commands ignore it) and nothing outlives the test.
    // SIGINT's default action, which the spawner puts back and raises again: a shell that starts
    // the tests in the background without job control hands them SIGINT ignored.
    // SAFETY: signal(2) with SIG_DFL installs no handler; nothing else in this process (one
    // test, run by the test above) relies on SIGINT's disposition.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_DFL) };
    let script = "trap 'echo got SIGINT; exit 5' INT; echo trap set; while :; do sleep 0.1; done";
    let args = [OsString::from("-c"), OsString::from(script)];
    let _ = spawn_local(1, Path::new("/bin/sh"), &args, &[], Duration::from_secs(2));
    unreachable!("the SIGINT passed on to the rank ends the spawner too");
}

/// Set by [`concurrent_spawns_put_the_signal_handlers_back`] for its child.
const CONCURRENT_CHILD: &str = "GPUCOMM_TEST_CONCURRENT_CHILD";

/// Session 29 audit: two threads in `spawn_local` at once left `SIGINT`, `SIGTERM` and `SIGHUP`
/// caught and ignored for the rest of the process: each call saved the actions it found and put
/// them back when it returned, so the call that returned last put back the other's catching
/// handler (Ctrl-C or a batch system's `SIGTERM` no longer stopped the process). Now the first
/// call alive installs the handlers and the last puts the earlier actions back. Run in a child
/// process of its own (this test binary, running only `concurrent_child`): it changes the
/// process's signal actions.
#[test]
fn concurrent_spawns_put_the_signal_handlers_back() {
    let out = crate::test_child::run("spawn::tests::concurrent_child", CONCURRENT_CHILD, |_| {});
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}\n{printed}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(printed.contains("every action back"), "{printed}");
}

/// Child half: does nothing unless started by the test above. The first call returns while the
/// second still runs; then every forwarded signal must have its default action again.
#[test]
fn concurrent_child() {
    if std::env::var_os(CONCURRENT_CHILD).is_none() {
        return;
    }
    let action = |signal| {
        // SAFETY: sigaction(2) with a null new action only reads the current one into `old`.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(signal, std::ptr::null(), &mut old), 0);
            old.sa_sigaction
        }
    };
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: signal(2) with SIG_DFL installs no handler; nothing else runs in this process.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }
    let run = |seconds: &str| {
        let args = [OsString::from("-c"), OsString::from(format!("sleep {seconds}"))];
        spawn_local(1, Path::new("/bin/sh"), &args, &[], Duration::from_secs(2)).unwrap()
    };
    let second = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        run("1")
    });
    assert!(run("0.3").success());
    assert!(second.join().unwrap().success());
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        assert_eq!(action(signal), libc::SIG_DFL, "signal {signal}: the action after both calls returned");
    }
    println!("every action back");
}
