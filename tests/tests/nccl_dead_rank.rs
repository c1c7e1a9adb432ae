//! A dead rank (issue 7, "Must show"): two processes, the peer killed with SIGKILL (a) after it
//! joined the communicator but before the first collective, and (b) after some collectives
//! succeeded. The survivor (nonblocking communicator, 3 s timeout) must get an `Err` within
//! twice its timeout, and carry on cleanly (its stream free again, a new communicator working);
//! 10 repetitions of each.
//!
//! The survivor is the test process itself (rank 0, GPU 0). Each victim (rank 1, GPU 1) is this
//! test binary started again with `GPUCOMM_TEST_VICTIM` set, driven over its stdin/stdout: `join
//! <id hex>`, `reduce`. The next victim is started while the current repetition runs, so that its
//! CUDA start-up overlaps the survivor's wait.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use gpucomm_tests::require_gpus;
use nccl::{Collectives, Comm, Config, Error, PendingComm, ReduceOp, UniqueId};

const TIMEOUT: Duration = Duration::from_secs(3);
const REPETITIONS: usize = 10;
/// Elements per all-reduce; the survivor contributes 1.0, the victim 2.0.
const COUNT: usize = 1 << 16;
/// Set in a victim process.
const VICTIM_VAR: &str = "GPUCOMM_TEST_VICTIM";
/// Prefix of the victim's protocol lines (the test harness prints its own lines too).
const SAYS: &str = "@victim ";
/// How long a victim may take to start or answer (CUDA and NCCL start-up included).
const ANSWER: Duration = Duration::from_secs(60);
/// Whole-test bound: past it the process aborts with a message instead of hanging the bundle.
const HANG: Duration = Duration::from_secs(200);

/// Joins the two-rank communicator: nonblocking, with the 3 s timeout for its work, but a
/// generous bound for the creation itself (a fresh process loads CUDA and NCCL first).
fn join(stream: Arc<cudarc::driver::CudaStream>, id: &UniqueId, rank: usize) -> Comm {
    let config = Config::new().blocking(false).timeout(TIMEOUT);
    PendingComm::init_rank(stream, id, rank, 2, &config).and_then(|p| p.wait(Some(ANSWER))).expect("join")
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn peer_killed_before_the_first_collective() {
    survive("peer_killed_before_the_first_collective", 0);
}

#[test]
#[ignore = "needs 2 GPUs: run by the GPU bundle"]
fn peer_killed_after_some_collectives() {
    survive("peer_killed_after_some_collectives", 3);
}

/// The survivor's side: `REPETITIONS` times, a communicator with a fresh victim, `warm_up`
/// correct all-reduces, the victim killed, and one more all-reduce that must fail in time.
fn survive(test: &str, warm_up: usize) {
    if std::env::var_os(VICTIM_VAR).is_some() {
        return victim();
    }
    let Some(streams) = require_gpus(test, 2) else { return };
    let _guard = HangGuard::arm(test);
    let context = streams[0].context().clone();
    let mut next = Victim::start(test);
    for repetition in 0..REPETITIONS {
        let mut victim = next;
        victim.expect("ready");
        let stream = context.new_stream().unwrap();
        let id = UniqueId::new().unwrap();
        victim.send(&format!("join {}", hex(&id.to_bytes())));
        let comm = join(stream.clone(), &id, 0);
        victim.expect("joined");
        let mut buf = stream.clone_htod(&vec![1.0f32; COUNT]).unwrap();
        for step in 0..warm_up {
            victim.send("reduce");
            stream.memcpy_htod(&vec![1.0f32; COUNT], &mut buf).unwrap();
            comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
            comm.wait(None).unwrap();
            let host = stream.clone_dtoh(&buf).unwrap();
            assert!(host.iter().all(|&v| v == 3.0), "repetition {repetition}, step {step}: wrong sum");
            assert_eq!(victim.expect("reduced"), "3", "the victim's sum");
        }
        next = Victim::start(test);
        victim.kill();

        let start = Instant::now();
        let outcome = comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).and_then(|()| comm.wait(None));
        let took = start.elapsed();
        let err = outcome.expect_err("an all-reduce with a dead peer succeeded");
        assert!(matches!(err, Error::Timeout { .. } | Error::Nccl { .. }), "repetition {repetition}: {err:?}");
        assert!(took < 2 * TIMEOUT, "repetition {repetition}: the error took {took:?}");
        // A timeout has aborted the communicator; after an NCCL error the survivor aborts it.
        comm.abort().unwrap();
        // Nothing is left hanging on the survivor's stream.
        let freed = Instant::now();
        stream.synchronize().unwrap();
        println!("repetition {repetition}: {err} after {took:?}; stream free {:?} later", freed.elapsed());
    }
    next.kill();
    // The survivor still works: a one-rank communicator on the same GPU.
    let comm = Comm::init_rank(streams[0].clone(), &UniqueId::new().unwrap(), 0, 1).unwrap();
    let mut buf = streams[0].clone_htod(&[4.0f32; 16]).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).unwrap();
    assert_eq!(streams[0].clone_dtoh(&buf).unwrap(), [4.0; 16]);
    comm.finalize().map_err(|(_, e)| e).unwrap();
}

/// The victim's side (rank 1 on GPU 1): follows the survivor's commands until killed, or until its
/// stdin closes (the survivor is gone), then exits without finalizing.
fn victim() {
    let say = |line: &str| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{SAYS}{line}").and_then(|()| out.flush()).expect("write to the survivor");
    };
    let stream = CudaContext::new(1).expect("open GPU 1").default_stream();
    say("ready");
    let mut comm = None;
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("read from the survivor");
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("join"), Some(id)) => {
                let id = UniqueId::from_bytes(&unhex(id)).expect("an id from the survivor");
                comm = Some(join(stream.clone(), &id, 1));
                say("joined");
            }
            (Some("reduce"), None) => {
                let comm = comm.as_ref().expect("joined before reducing");
                let mut buf = stream.clone_htod(&vec![2.0f32; COUNT]).expect("upload");
                comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).expect("all-reduce");
                comm.wait(None).expect("wait");
                let host = stream.clone_dtoh(&buf).expect("download");
                say(&format!("reduced {}", host[0]));
            }
            _ => panic!("unknown command {line:?}"),
        }
    }
    std::process::exit(0);
}

/// A victim process and its protocol lines.
struct Victim {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Victim {
    /// Starts this test again as a victim.
    fn start(test: &str) -> Victim {
        let exe = std::env::current_exe().expect("the test binary");
        let mut child = Command::new(exe)
            .args(["--exact", test, "--include-ignored", "--nocapture", "--test-threads=1"])
            .env(VICTIM_VAR, "1")
            .envs(gpucomm_launch::SAFETY_VARS)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a victim");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(said) = line.strip_prefix(SAYS) {
                    if tx.send(said.to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        Victim { child, stdin, lines }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").and_then(|()| self.stdin.flush()).expect("write to the victim");
    }

    /// Waits for the victim's next line, which must start with `word`; returns the rest.
    fn expect(&mut self, word: &str) -> String {
        let line = match self.lines.recv_timeout(ANSWER) {
            Ok(line) => line,
            Err(e) => panic!("no {word:?} from the victim within {ANSWER:?} ({e}): {:?}", self.child.try_wait()),
        };
        let rest = line.strip_prefix(word).unwrap_or_else(|| panic!("expected {word:?} from the victim, got {line:?}"));
        rest.trim().to_string()
    }

    /// SIGKILL (what `Child::kill` sends on Unix), and reap.
    fn kill(mut self) {
        self.child.kill().expect("kill the victim");
        let status = self.child.wait().expect("reap the victim");
        assert!(!status.success(), "the victim was killed, not exited: {status}");
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        // After `kill` this finds nothing left; on a failing test it makes sure no victim lingers.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Aborts the process if the test is still running after `HANG`: a hang must fail the test, not
/// stall the bundle.
struct HangGuard(Arc<AtomicBool>);

impl HangGuard {
    fn arm(test: &str) -> HangGuard {
        let done = Arc::new(AtomicBool::new(false));
        let (flag, test) = (done.clone(), test.to_string());
        thread::spawn(move || {
            let until = Instant::now() + HANG;
            while Instant::now() < until {
                if flag.load(Ordering::Acquire) {
                    return;
                }
                thread::sleep(Duration::from_millis(100));
            }
            eprintln!("{test}: still running after {HANG:?}: a survivor hangs; aborting the process");
            std::process::abort();
        });
        HangGuard(done)
    }
}

impl Drop for HangGuard {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2).unwrap_or("zz"), 16).expect("hex from the survivor"))
        .collect()
}
