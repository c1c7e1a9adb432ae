//! # How far apart the ranks leave a barrier
//!
//! A measuring program (no GPU). A benchmark's timed block starts right after a barrier on every
//! rank and reports the time averaged over the ranks (as nccl-tests does): a rank that leaves the
//! barrier earlier waits for the others inside its first collective, and half of that gap per
//! block lands in the reported time. `gpucomm bench` uses this crate's [`Rendezvous::barrier`]
//! before each timed block, so its small-message times carry the barrier's skew.
//!
//! How to run it: `cargo run --release -p gpucomm-launch --example barrier-skew [BARRIERS]`. It
//! starts itself as two ranks through the local spawner; each records `CLOCK_MONOTONIC` (one
//! clock for every process of a host) as it leaves each barrier, 200 µs apart, and the parent
//! prints the difference rank 1 − rank 0 over the barriers after the first ten.
//!
//! What you should see: `barrier-skew: 200 barriers, rank 1 − rank 0 on leaving: mean … µs, mean
//! |…| … µs, median … µs, p10 … µs, p90 … µs`. Before rank 0 mirrored the others' round trips to
//! the store (see `collective::barrier`), rank 1 left about 55 µs after rank 0 on a 2-core VM.

use std::error::Error;
use std::path::PathBuf;
use std::time::Duration;

use gpucomm_launch::{spawn_local, Options, RankInfo, Rendezvous};

/// Set in the ranks: the folder their exit times go to.
const OUT_VAR: &str = "GPUCOMM_BARRIER_SKEW_OUT";
/// Barriers left out at the start (connections warming up).
const WARM_UP: usize = 10;

/// `CLOCK_MONOTONIC` in nanoseconds: the same clock in every process of the host.
fn monotonic_ns() -> i128 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
}

/// One rank: `barriers` barriers, 200 µs apart, each exit time written to `out/rank{r}`.
fn rank(out: PathBuf, barriers: usize) -> Result<(), Box<dyn Error>> {
    let info = RankInfo::from_env()?;
    let mut rendezvous = Rendezvous::connect(&info, &Options::from_env()?)?;
    let mut times = Vec::with_capacity(barriers);
    for _ in 0..barriers {
        rendezvous.barrier()?;
        times.push(monotonic_ns());
        std::thread::sleep(Duration::from_micros(200));
    }
    let text: String = times.iter().map(|t| format!("{t}\n")).collect();
    std::fs::write(out.join(format!("rank{}", info.rank)), text)?;
    Ok(())
}

/// The exit times rank `r` wrote.
fn read(out: &std::path::Path, r: usize) -> Result<Vec<i128>, Box<dyn Error>> {
    let text = std::fs::read_to_string(out.join(format!("rank{r}")))?;
    Ok(text.lines().map(str::parse).collect::<Result<_, _>>()?)
}

fn main() -> Result<(), Box<dyn Error>> {
    let barriers: usize = std::env::args().nth(1).map(|n| n.parse()).transpose()?.unwrap_or(200) + WARM_UP;
    if let Some(out) = std::env::var_os(OUT_VAR) {
        return rank(out.into(), barriers);
    }
    let out = std::env::temp_dir().join(format!("gpucomm-barrier-skew-{}", std::process::id()));
    std::fs::create_dir_all(&out)?;
    let exe = std::env::current_exe()?;
    let args = [barriers.saturating_sub(WARM_UP).to_string().into()];
    let env = [(OUT_VAR.to_string(), out.display().to_string())];
    let outcome = spawn_local(2, &exe, &args, &env, Duration::from_secs(10))?;
    if outcome.statuses.iter().any(|(_, status)| !status.success()) {
        return Err(format!("a rank failed: {outcome:?}").into());
    }
    let (first, second) = (read(&out, 0)?, read(&out, 1)?);
    std::fs::remove_dir_all(&out)?;
    let mut skew: Vec<f64> = first.iter().zip(&second).skip(WARM_UP).map(|(a, b)| (b - a) as f64 / 1000.0).collect();
    skew.sort_by(f64::total_cmp);
    let n = skew.len();
    if n == 0 {
        return Err("no barriers measured".into());
    }
    let mean = skew.iter().sum::<f64>() / n as f64;
    let mean_abs = skew.iter().map(|s| s.abs()).sum::<f64>() / n as f64;
    println!(
        "barrier-skew: {n} barriers, rank 1 − rank 0 on leaving: mean {mean:.1} µs, mean |…| {mean_abs:.1} µs, \
         median {:.1} µs, p10 {:.1} µs, p90 {:.1} µs",
        skew[n / 2],
        skew[n / 10],
        skew[9 * n / 10]
    );
    Ok(())
}
