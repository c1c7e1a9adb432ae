//! Timing helpers for the measuring programs (`benches/`) and lesson 15: the same method as nccl-tests (host wall clock around
//! back-to-back calls, then one stream synchronisation), eagerly and replayed from a CUDA graph,
//! with every rank starting together.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaStream, DriverError};
use nccl::{Collectives, Comm, Keep, MemBuffer, ReduceOp};

/// Everything a timing loop can fail with.
pub type BoxError = Box<dyn std::error::Error>;

/// The value after `name` on the command line (`--max 1048576` → `Some("1048576")`), `None`
/// when `name` is absent; the measuring programs' options.
pub fn flag(name: &str) -> Option<String> {
    let mut args = std::env::args().skip_while(|a| a != name);
    args.next().and(args.next())
}

/// True when `name` is on the command line.
pub fn switch(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// Waits until every rank got here: a one-element all-reduce, then a stream synchronisation.
pub fn barrier(comm: &Comm, scratch: &mut MemBuffer<f32>) -> Result<(), BoxError> {
    comm.all_reduce_in_place(scratch, ReduceOp::SUM)?;
    comm.stream().synchronize()?;
    Ok(())
}

/// Mean time of one call in µs: `warmup` untimed calls, a barrier, then `iters` calls back to back
/// timed on the host up to the end of a stream synchronisation (nccl-tests' eager method).
pub fn eager(
    comm: &Comm,
    scratch: &mut MemBuffer<f32>,
    warmup: usize,
    iters: usize,
    mut call: impl FnMut() -> Result<(), BoxError>,
) -> Result<f64, BoxError> {
    for _ in 0..warmup {
        call()?;
    }
    barrier(comm, scratch)?;
    let start = Instant::now();
    for _ in 0..iters {
        call()?;
    }
    comm.stream().synchronize()?;
    Ok(start.elapsed().as_secs_f64() * 1e6 / iters as f64)
}

/// Mean time of one call in µs when `iters` calls are captured into one CUDA graph on `stream`
/// and the graph is replayed `replays` times (nccl-tests' `-G`), and `keep` back. The graph keeps
/// `keep`: everything the calls use (buffers, communicators, …), which `call` gets to make them.
/// `stream` must not be the legacy default stream (which cannot be captured).
pub fn graph<K: Keep>(
    comm: &Comm,
    scratch: &mut MemBuffer<f32>,
    stream: &Arc<CudaStream>,
    iters: usize,
    replays: usize,
    keep: K,
    mut call: impl FnMut(&mut K) -> Result<(), BoxError>,
) -> Result<(f64, K), BoxError> {
    let mut graph =
        gpucomm_ordering::capture(stream, keep, |k| -> Result<(), BoxError> { (0..iters).try_for_each(|_| call(k)) })
            .map_err(|(_, e)| e)?;
    graph.launch()?;
    stream.synchronize()?;
    barrier(comm, scratch)?;
    let start = Instant::now();
    for _ in 0..replays {
        graph.launch()?;
    }
    stream.synchronize()?;
    let us = start.elapsed().as_secs_f64() * 1e6 / (iters * replays) as f64;
    Ok((us, graph.into_kept()))
}

/// nccl-tests' bus bandwidth of an all-reduce of `bytes` per rank over `ranks` ranks in `us` µs,
/// in GB/s (1 GB = 1e9 B): algorithm bandwidth × 2(n−1)/n.
pub fn all_reduce_busbw(bytes: usize, ranks: usize, us: f64) -> f64 {
    let algbw = bytes as f64 / (us * 1e-6) / 1e9;
    algbw * 2.0 * (ranks as f64 - 1.0) / ranks as f64
}

/// `8 B`, `4 KiB`, `64 MiB`.
pub fn size_label(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// Turns a driver error into this module's error type (for closures).
pub fn cuda(e: DriverError) -> BoxError {
    Box::new(e)
}
