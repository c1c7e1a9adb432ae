//! Timing helpers for the measuring programs (`benches/`) and lesson 15: the same method as nccl-tests (host wall clock around
//! back-to-back calls, then one stream synchronisation), eagerly and replayed from a CUDA graph,
//! with every rank starting together.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaStream, DriverError};
use nccl::sys::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};
use nccl::{Collectives, Comm, Keep, MemBuffer, ReduceOp};

/// Everything a timing loop can fail with.
pub type BoxError = Box<dyn std::error::Error>;

/// `ncclAllReduce`'s C signature.
type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;

/// The raw `nccl-sys` all-reduce that the host-cost programs put beside the safe call: the entry
/// points resolved once, the communicator's raw handle and its stream, `count` floats summed per
/// call.
pub struct RawAllReduce {
    all_reduce: AllReduceFn,
    group_start: unsafe extern "C" fn() -> ncclResult_t,
    group_end: unsafe extern "C" fn() -> ncclResult_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
    count: usize,
}

impl RawAllReduce {
    /// The raw calls of `comm`, on its own stream, of `count` floats each.
    pub fn new(comm: &Comm, count: usize) -> Result<Self, BoxError> {
        let lib = nccl::sys::library()?;
        Ok(RawAllReduce {
            all_reduce: *nccl::sys::function!(lib, ncclAllReduce)?,
            group_start: *nccl::sys::function!(lib, ncclGroupStart)?,
            group_end: *nccl::sys::function!(lib, ncclGroupEnd)?,
            comm: comm.as_raw(),
            stream: comm.stream().cu_stream() as cudaStream_t,
            count,
        })
    }

    /// One raw `ncclAllReduce` (sum) from `send` to `recv`.
    ///
    /// # Safety
    ///
    /// `send` and `recv` are device addresses of at least `count` floats on the communicator's
    /// device, which stay allocated until the work is done; the communicator is alive and not
    /// aborted; its stream is not being captured, or captured into a graph launched only while
    /// all of that holds.
    #[inline]
    pub unsafe fn all_reduce(&self, send: u64, recv: u64) -> Result<(), BoxError> {
        // SAFETY: the arguments are as this function's contract says; the rest is NCCL's
        // signature, with a data type and operator it knows.
        let rc = unsafe {
            (self.all_reduce)(
                send as *const c_void,
                recv as *mut c_void,
                self.count,
                ncclDataType_t::ncclFloat32,
                ncclRedOp_t::ncclSum,
                self.comm,
                self.stream,
            )
        };
        ok("ncclAllReduce", rc)
    }

    /// Raw all-reduces from `send` into each of `recvs`, between `ncclGroupStart` and
    /// `ncclGroupEnd`.
    ///
    /// # Safety
    ///
    /// As for [`RawAllReduce::all_reduce`], for `send` and every one of `recvs`.
    pub unsafe fn group(&self, send: u64, recvs: &[u64]) -> Result<(), BoxError> {
        // SAFETY: plain group brackets on this thread.
        ok("ncclGroupStart", unsafe { (self.group_start)() })?;
        // SAFETY: forwarded from this function's contract.
        let calls: Result<(), BoxError> = recvs.iter().try_for_each(|&r| unsafe { self.all_reduce(send, r) });
        // SAFETY: closes the group opened above.
        let rc = unsafe { (self.group_end)() };
        calls?;
        ok("ncclGroupEnd", rc)
    }
}

/// A raw result code as a `Result`.
#[inline]
fn ok(call: &str, rc: ncclResult_t) -> Result<(), BoxError> {
    if rc == ncclResult_t::ncclSuccess {
        Ok(())
    } else {
        Err(format!("raw {call} returned {}", rc.0).into())
    }
}

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

/// Pins this thread to one CPU of its own, so that the scheduler cannot move it between the
/// timed calls (a move costs its caches, and shows as microseconds in a sample). The CPUs this
/// process may use are split into one block per rank; rank `r` takes the second CPU of block `r`
/// (the first of block 0 is usually CPU 0, which takes most interrupts), or the block's only one.
/// Call it after NCCL's or NVSHMEM's setup, whose own threads keep the affinity they were
/// started with. Returns the CPU.
pub fn pin(rank: usize, size: usize) -> Result<usize, BoxError> {
    // SAFETY: `cpu_set_t` is plain bits, for which all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable `cpu_set_t` of the size passed.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Err(format!("sched_getaffinity: {}", std::io::Error::last_os_error()).into());
    }
    // SAFETY: `CPU_ISSET` reads the set, for CPU numbers below its capacity.
    let allowed: Vec<usize> =
        (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect();
    if allowed.is_empty() {
        return Err("sched_getaffinity returned no CPU".into());
    }
    let block = (allowed.len() / size.max(1)).max(1);
    let first = rank * block;
    let cpu = allowed[(first + usize::from(block > 1)).min(allowed.len() - 1)];
    // SAFETY: as above; the set is then handed to the kernel, which copies it.
    unsafe {
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
    }
    // SAFETY: `set` is a valid `cpu_set_t` of the size passed; 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(format!("sched_setaffinity(CPU {cpu}): {}", std::io::Error::last_os_error()).into());
    }
    Ok(cpu)
}
