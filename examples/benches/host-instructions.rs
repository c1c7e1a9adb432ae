//! # What a safe NCCL call costs on the host, counted in instructions
//!
//! A measuring program (not a lesson): the instruction counts of `docs/host-cost.md`.
//!
//! Why count: the safe call's overhead is a few hundred nanoseconds beside an enqueue of several
//! microseconds that varies by a microsecond from call to call, so timings (`benches/host-cost`)
//! need hundreds of batches and still move by ±50 ns from run to run. The instructions the
//! crates execute per call do not move. `tools/host-instructions.sh` runs this program under
//! valgrind's callgrind on any Linux machine, against CPU stand-ins for the driver and NCCL
//! (`tools/cpu-standins/`: device memory is host memory, a collective copies its send buffer
//! into its receive buffer), once with 0 calls and once with many, and divides the difference by
//! the number of calls. The stand-ins' own instructions (a few dozen per call) are in both the
//! raw and the safe count; what the real `cuStreamIsCapturing` costs (about 50 ns on an H200
//! machine) is not.
//!
//! How to run it: `tools/host-instructions.sh` (needs valgrind). Here the program takes a path
//! and a number of calls, `host-instructions safe 1000`; the paths are `raw` (nccl-sys's
//! `ncclAllReduce`), `safe` (`Comm::all_reduce` on [`MemBuffer`]), `capture-raw` and `capture`
//! (the same inside [`nccl::capture`]; the graph is launched once), `group-raw` and `group`
//! (groups of 16 calls). Without arguments it makes 100 calls of every path, as the GPU bundle
//! does on a real GPU (one rank).
//!
//! What it prints: one line per path, `PATH: N calls, every result checked`. It exits non-zero
//! when a receive buffer does not hold the one-rank sum afterwards.

use std::error::Error;
use std::ffi::c_void;

use cudarc::driver::CudaContext;
use nccl::sys::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};
use nccl::{Collectives, Comm, MemBuffer, ReduceOp, UniqueId};

/// 256 bytes of f32, as in `benches/host-cost`.
const ELEMS: usize = 64;
/// Calls per group in the grouped paths.
const GROUP: usize = 16;
/// The paths, in the order a run without arguments takes them.
const PATHS: [&str; 6] = ["raw", "safe", "capture-raw", "capture", "group-raw", "group"];

type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;

/// The raw entry points and handles.
struct Raw {
    all_reduce: AllReduceFn,
    group_start: unsafe extern "C" fn() -> ncclResult_t,
    group_end: unsafe extern "C" fn() -> ncclResult_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
}

impl Raw {
    /// One raw all-reduce from `send` to `recv`.
    fn all_reduce(&self, send: u64, recv: u64) -> Result<(), Box<dyn Error>> {
        // SAFETY: `send` and `recv` are device addresses of buffers of ELEMS floats on the
        // communicator's device, alive for the whole program; the communicator and stream are live.
        let rc = unsafe {
            (self.all_reduce)(
                send as *const c_void,
                recv as *mut c_void,
                ELEMS,
                ncclDataType_t::ncclFloat32,
                ncclRedOp_t::ncclSum,
                self.comm,
                self.stream,
            )
        };
        ok("ncclAllReduce", rc)
    }

    /// One raw group of `recvs.len()` all-reduces.
    fn group(&self, send: u64, recvs: &[u64]) -> Result<(), Box<dyn Error>> {
        // SAFETY: plain group brackets on this thread, around calls as in `all_reduce`.
        ok("ncclGroupStart", unsafe { (self.group_start)() })?;
        let calls: Result<(), Box<dyn Error>> = recvs.iter().try_for_each(|&r| self.all_reduce(send, r));
        // SAFETY: closes the group opened above.
        let rc = unsafe { (self.group_end)() };
        calls?;
        ok("ncclGroupEnd", rc)
    }
}

/// A raw result code as a `Result`.
fn ok(call: &str, rc: ncclResult_t) -> Result<(), Box<dyn Error>> {
    if rc == ncclResult_t::ncclSuccess {
        Ok(())
    } else {
        Err(format!("raw {call} returned {}", rc.0).into())
    }
}

/// `calls` all-reduces (`GROUP` receive buffers for the grouped paths, one otherwise) along `path`.
fn run(
    path: &str,
    calls: usize,
    raw: &Raw,
    comm: &Comm,
    send: &MemBuffer<f32>,
    recvs: &mut [MemBuffer<f32>],
) -> Result<(), Box<dyn Error>> {
    let (send_addr, recv_addr) = (send.as_raw(), recvs[0].as_raw());
    let recv_addrs: Vec<u64> = recvs.iter().map(MemBuffer::as_raw).collect();
    match path {
        "raw" => (0..calls).try_for_each(|_| raw.all_reduce(send_addr, recv_addr))?,
        "safe" => (0..calls).try_for_each(|_| comm.all_reduce(send, &mut recvs[0], ReduceOp::SUM))?,
        "capture-raw" | "capture" => {
            let mut raw_failed = None;
            let mut graph = nccl::capture(comm.stream(), (comm, send, &mut recvs[0]), |(comm, send, recv)| {
                for _ in 0..calls {
                    if path == "capture" {
                        comm.all_reduce(*send, *recv, ReduceOp::SUM)?;
                    } else if let Err(e) = raw.all_reduce(send_addr, recv_addr) {
                        raw_failed.get_or_insert(e.to_string());
                    }
                }
                Ok(())
            })
            .map_err(|(_, e)| e)?;
            if let Some(e) = raw_failed {
                return Err(e.into());
            }
            graph.launch()?;
        }
        "group-raw" => (0..calls / GROUP).try_for_each(|_| raw.group(send_addr, &recv_addrs))?,
        "group" => (0..calls / GROUP).try_for_each(|_| {
            nccl::group(|g| {
                for recv in recvs.iter_mut() {
                    g.with(comm).all_reduce(send, recv, ReduceOp::SUM)?;
                }
                Ok(())
            })
        })?,
        _ => return Err(format!("unknown path {path:?}; the paths are {PATHS:?}").into()),
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let (paths, calls): (Vec<&str>, usize) = match args.as_slice() {
        [] => (PATHS.to_vec(), 100),
        [path, calls] => (vec![path.as_str()], calls.parse().map_err(|e| format!("calls {calls:?}: {e}"))?),
        _ => return Err("usage: host-instructions [PATH CALLS]".into()),
    };
    let stream = CudaContext::new(0)?.new_stream()?;
    let comm = Comm::init_rank(stream.clone(), &UniqueId::new()?, 0, 1)?;
    let send = MemBuffer::from_host(&stream, &[1.0f32; ELEMS])?;
    let mut recvs = (0..GROUP).map(|_| MemBuffer::<f32>::zeroed(&stream, ELEMS)).collect::<Result<Vec<_>, _>>()?;
    let lib = nccl::sys::library()?;
    let raw = Raw {
        all_reduce: *nccl::sys::function!(lib, ncclAllReduce)?,
        group_start: *nccl::sys::function!(lib, ncclGroupStart)?,
        group_end: *nccl::sys::function!(lib, ncclGroupEnd)?,
        comm: comm.as_raw(),
        stream: stream.cu_stream() as cudaStream_t,
    };
    // The first call of each kind resolves functions and connects: outside the counted calls.
    comm.all_reduce(&send, &mut recvs[0], ReduceOp::SUM)?;
    for path in paths {
        for recv in recvs.iter_mut() {
            stream.memset_zeros(recv)?;
        }
        run(path, calls, &raw, &comm, &send, &mut recvs)?;
        stream.synchronize()?;
        let used = if path.starts_with("group") && calls >= GROUP { GROUP } else { 1 };
        for recv in &recvs[..used] {
            let got = stream.clone_dtoh(recv)?;
            if got != [1.0f32; ELEMS] {
                return Err(format!("{path}: a receive buffer holds {:?}, not the one-rank sum 1.0", got[0]).into());
            }
        }
        println!("{path}: {calls} calls, every result checked");
    }
    comm.finalize().map_err(|(_, e)| e)?;
    Ok(())
}
