//! # Lesson 6 — a job that survives a dead rank: timeout, abort, report
//!
//! What it teaches:
//! * a blocking NCCL communicator whose peer dies hangs the survivors: inside the collective call
//!   (the first one connects the ranks) or on the stream (later ones), with no error, forever;
//! * a **nonblocking** communicator ([`nccl::Config::blocking`]`(false)`) never blocks inside
//!   NCCL, and a **timeout** ([`nccl::Comm::set_timeout`], or [`nccl::Config::timeout`] from
//!   creation on) bounds every call and the work it
//!   enqueued: a peer that never arrives becomes [`nccl::Error::Timeout`] and an aborted
//!   communicator, as PyTorch's watchdog does;
//! * wait for results with [`nccl::Comm::wait`] (which watches the timeout and NCCL's error state)
//!   rather than the stream's own synchronize, which nothing can interrupt;
//! * after an abort every call says [`nccl::Error::Aborted`]; the survivors report and exit
//!   cleanly (a real job would now rebuild a communicator of the survivors, or restart).
//!
//! The job: every rank all-reduces `rank + 1` for up to 6 steps. The last rank leaves after 3
//! steps: it exits on the spot without finalizing anything, as a crashed process would (with
//! status 0, so that a launcher lets the others go on). The survivors' step 3 cannot complete;
//! 3 s later their communicators are aborted, they print a report and exit with status 0. Any
//! other outcome (a wrong sum, an error before step 3, no error at all) exits non-zero.
//!
//! How to run it (any number of GPUs N ≥ 2):
//! * `cargo run -p examples --example 06-dead-rank -- --nproc 2`
//!
//! What you should see (N = 2, under the spawner's `[rank N]` prefix), in about 4 s:
//! ```text
//! [rank 0] rank 0 of 2: step 0: all-reduce correct (3)
//! [rank 1] rank 1 of 2: step 0: all-reduce correct (3)
//! … (steps 1 and 2 alike)
//! [rank 1] rank 1 of 2: steps 0-2 correct; leaving the job now, without finalizing (a simulated crash)
//! [rank 0] rank 0 of 2: step 3 failed after 3.0s: ncclAllReduce did not complete within 3s; the communicator was aborted
//! [rank 0] rank 0 of 2: report: steps 0-2 correct; a peer stopped answering at step 3 (rank 1 left on purpose); ...
//! ```

use std::time::{Duration, Instant};

use nccl::launch::{run_main, Options, Rendezvous};
use nccl::{Collectives, Comm, Config, Error, ReduceOp};

const COUNT: usize = 1 << 16;
const STEPS: usize = 6;
/// The last rank leaves before this step.
const LEAVE_AT: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(3);

fn main() -> std::process::ExitCode {
    run_main(|info| {
        gpucomm_examples::require_ranks(&info, 2)?;
        gpucomm_examples::require_gpu_per_rank(&info)?;
        let stream = gpucomm_examples::rank_stream(&info)?;
        let mut rendezvous = Rendezvous::connect(&info, &Options::from_env()?)?;
        // Nonblocking: no NCCL call ever blocks this thread. The timeout is set once everyone has
        // joined (`Config::timeout` would bound the creation too, which can take seconds).
        let comm = Comm::from_rendezvous_config(stream.clone(), &mut rendezvous, &Config::new().blocking(false))?;
        comm.set_timeout(Some(TIMEOUT));
        let (rank, n) = (comm.rank(), comm.size());
        let leaver = n - 1;
        let expected = (n * (n + 1) / 2) as f32;

        for step in 0..STEPS {
            if rank == leaver && step == LEAVE_AT {
                println!("rank {rank} of {n}: steps 0-{} correct; leaving the job now, without finalizing (a simulated crash)", step - 1);
                std::process::exit(0);
            }
            let started = Instant::now();
            let mut buf = stream.clone_htod(&vec![(rank + 1) as f32; COUNT])?;
            // `wait` returns once the all-reduce has finished, or fails once the timeout expired.
            let done = comm.all_reduce_in_place(&mut buf, ReduceOp::SUM).and_then(|()| comm.wait(None));
            match done {
                Ok(()) => {
                    let host = stream.clone_dtoh(&buf)?;
                    if let Some(v) = host.iter().find(|&&v| v != expected) {
                        return Err(format!("rank {rank}: step {step} gave {v}, expected {expected}").into());
                    }
                    println!("rank {rank} of {n}: step {step}: all-reduce correct ({expected})");
                }
                Err(e) => return report(comm, step, started.elapsed(), e),
            }
        }
        Err(format!("rank {rank}: all {STEPS} steps succeeded, but rank {leaver} should have left at step {LEAVE_AT}")
            .into())
    })
}

/// A survivor's report after the failed step: what failed, how fast, and whether that is the
/// expected outcome.
fn report(comm: Comm, step: usize, after: Duration, error: Error) -> Result<(), Box<dyn std::error::Error>> {
    let (rank, n) = (comm.rank(), comm.size());
    println!("rank {rank} of {n}: step {step} failed after {after:.1?}: {error}");
    if step < LEAVE_AT {
        return Err(format!("rank {rank}: step {step} failed although every rank was still there: {error}").into());
    }
    let expected = matches!(error, Error::Timeout { .. } | Error::Nccl { .. });
    if !expected {
        return Err(format!("rank {rank}: unexpected kind of failure: {error:?}").into());
    }
    // A timeout has aborted the communicator already; after an NCCL error, abort it here.
    let aborting = Instant::now();
    let was_aborted = comm.is_aborted();
    comm.abort()?;
    println!(
        "rank {rank} of {n}: report: steps 0-{} correct; a peer stopped answering at step {step} (rank {} left on purpose); \
         detected after {after:.1?} (timeout {TIMEOUT:?}); communicator {}; exiting cleanly",
        step - 1,
        n - 1,
        if was_aborted { "aborted by its timeout".to_string() } else { format!("aborted in {:.1?}", aborting.elapsed()) },
    );
    Ok(())
}
