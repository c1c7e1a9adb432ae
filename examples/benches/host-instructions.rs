//! # What a safe NCCL call or NVSHMEM put costs on the host, counted in instructions
//!
//! A measuring program (not a lesson): the instruction counts of `docs/host-cost.md`.
//!
//! Why count: the safe call's overhead is a few hundred nanoseconds beside an enqueue of several
//! microseconds that varies by a microsecond from call to call, so timings (`benches/host-cost`,
//! `benches/nvshmem`) need hundreds of batches and still move by ±50 ns from run to run. The
//! instructions the crates execute per call do not move. `tools/host-instructions.sh` runs this
//! program under valgrind's callgrind on any Linux machine, against CPU stand-ins for the driver,
//! NCCL and NVSHMEM (`tools/cpu-standins/`: device memory is host memory, a collective copies its
//! send buffer into its receive buffer, a put copies its source into its destination), once with
//! 0 calls and once with many, and divides the difference by the number of calls. The stand-ins'
//! own instructions (a few dozen per call) are in both the raw and the safe count; what the real
//! `cuStreamIsCapturing` costs (about 50 ns on an H200 machine) is not, nor what the real
//! `nvshmem_ptr` costs (the safe put asks it once per call, for its overlap check).
//!
//! How to run it: `tools/host-instructions.sh` (needs valgrind). Here the program takes a path
//! and a number of calls, `host-instructions safe 1000`. The all-reduce paths (256 bytes) are
//! `raw` (nccl-sys's `ncclAllReduce`), `safe` (`Comm::all_reduce` on [`MemBuffer`]), `slice`
//! (the same on cudarc's `CudaSlice`, which follows cudarc's event protocol: stream waits and
//! event records),
//! `capture-raw` and `capture` (the same inside [`nccl::capture`]; the graph is launched once),
//! `group-raw` and `group` (groups of 16 calls). The put paths (64 bytes, from one [`Symmetric`]
//! buffer into another on the PE itself, as `benches/nvshmem` times them) are `put-raw`
//! (nvshmem-sys's `nvshmemx_putmem_on_stream`) and `put` ([`Runtime::put_on_stream`]). NCCL (one
//! rank) starts only when an all-reduce path runs, NVSHMEM (one PE) only when a put path runs.
//! Without arguments it makes 100 calls of every path, as the GPU bundle does on a real GPU.
//!
//! What it prints: one line per path, `PATH: N calls, every result checked`. It exits non-zero
//! when a receive buffer does not hold the one-rank sum afterwards, or a put's destination does
//! not hold its source.

use std::error::Error;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use gpucomm_examples::bench::RawAllReduce;
use nccl::{Collectives, Comm, MemBuffer, ReduceOp, UniqueId};
use nvshmem::{Runtime, Symmetric};

/// 256 bytes of f32, as in `benches/host-cost`.
const ELEMS: usize = 64;
/// Calls per group in the grouped paths.
const GROUP: usize = 16;
/// Bytes per put, as in the host time per put of `benches/nvshmem`.
const PUT_BYTES: usize = 64;
/// The paths, in the order a run without arguments takes them: the all-reduces, then the puts.
const PATHS: [&str; 9] = ["raw", "safe", "slice", "capture-raw", "capture", "group-raw", "group", "put-raw", "put"];

/// `nvshmemx_putmem_on_stream`.
type PutFn = unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32, nvshmem::sys::cudaStream_t);

/// The raw NVSHMEM put and the stream it enqueues on.
struct RawPut {
    put: PutFn,
    stream: nvshmem::sys::cudaStream_t,
}

impl RawPut {
    /// One raw put of `PUT_BYTES` bytes from `src` into this PE's own copy of `dst`.
    fn put(&self, dst: u64, src: u64) {
        // SAFETY: `dst` and `src` are the device addresses of two distinct symmetric buffers of
        // PUT_BYTES bytes, alive until NVSHMEM is finalised; PE 0 is this PE, the only one; the
        // stream belongs to the PE's device, whose context the runtime made current on this
        // thread: the raw call the safe one wraps.
        unsafe { (self.put)(dst as *mut c_void, src as *const c_void, PUT_BYTES, 0, self.stream) }
    }
}

/// `calls` all-reduces (`GROUP` receive buffers for the grouped paths, one otherwise) along `path`.
fn run(
    path: &str,
    calls: usize,
    raw: &RawAllReduce,
    comm: &Comm,
    send: &MemBuffer<f32>,
    recvs: &mut [MemBuffer<f32>],
) -> Result<(), Box<dyn Error>> {
    let (send_addr, recv_addr) = (send.as_raw(), recvs[0].as_raw());
    let recv_addrs: Vec<u64> = recvs.iter().map(MemBuffer::as_raw).collect();
    match path {
        "raw" => (0..calls).try_for_each(|_| {
            // SAFETY: the addresses are of `send` and `recvs`, borrowed here, with the
            // communicator (the captured graph below is launched before this function returns).
            unsafe { raw.all_reduce(send_addr, recv_addr) }
        })?,
        "safe" => (0..calls).try_for_each(|_| comm.all_reduce(send, &mut recvs[0], ReduceOp::SUM))?,
        "capture-raw" | "capture" => {
            let mut raw_failed = None;
            let mut graph = nccl::capture(comm.stream(), (comm, send, &mut recvs[0]), |(comm, send, recv)| {
                for _ in 0..calls {
                    if path == "capture" {
                        comm.all_reduce(*send, *recv, ReduceOp::SUM)?;
                    // SAFETY: see the raw path above.
                    } else if let Err(e) = unsafe { raw.all_reduce(send_addr, recv_addr) } {
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
        // SAFETY: see the raw path above.
        "group-raw" => (0..calls / GROUP).try_for_each(|_| unsafe { raw.group(send_addr, &recv_addrs) })?,
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

/// `calls` eager all-reduces on cudarc's buffers (the `slice` path).
fn run_slices(
    calls: usize,
    comm: &Comm,
    send: &CudaSlice<f32>,
    recv: &mut CudaSlice<f32>,
) -> Result<(), Box<dyn Error>> {
    (0..calls).try_for_each(|_| comm.all_reduce(send, recv, ReduceOp::SUM))?;
    Ok(())
}

/// `calls` puts along `path`: raw, or through the safe crate, from `src` into this PE's `dst`.
/// Both are passed as sub-ranges ([`Symmetric::slice`]) taken once before the calls, as
/// `benches/nvshmem` passes the first 64 bytes of its larger buffers, so that the safe call
/// counted here is the one timed there.
fn run_puts(
    path: &str,
    calls: usize,
    raw: &RawPut,
    rt: &Runtime,
    dst: &Symmetric<u8>,
    src: &Symmetric<u8>,
    stream: &Arc<CudaStream>,
) -> Result<(), Box<dyn Error>> {
    let (dst, src) = (dst.slice(..PUT_BYTES)?, src.slice(..PUT_BYTES)?);
    let (dst_addr, src_addr) = (dst.device_address(), src.device_address());
    match path {
        "put-raw" => (0..calls).for_each(|_| raw.put(dst_addr, src_addr)),
        "put" => (0..calls).try_for_each(|_| rt.put_on_stream(&dst, &src, 0, stream))?,
        _ => return Err(format!("unknown path {path:?}; the paths are {PATHS:?}").into()),
    }
    Ok(())
}

/// Starts NCCL (one rank) on `stream` and takes each of the all-reduce `paths` with `calls` calls,
/// checking the receive buffers after each.
fn all_reduces(stream: &Arc<CudaStream>, paths: &[&str], calls: usize) -> Result<(), Box<dyn Error>> {
    let comm = Comm::init_rank(stream.clone(), &UniqueId::new()?, 0, 1)?;
    let send = MemBuffer::from_host(stream, &[1.0f32; ELEMS])?;
    let mut recvs = (0..GROUP).map(|_| MemBuffer::<f32>::zeroed(stream, ELEMS)).collect::<Result<Vec<_>, _>>()?;
    let slice_send = stream.clone_htod(&[1.0f32; ELEMS])?;
    let mut slice_recv = stream.alloc_zeros::<f32>(ELEMS)?;
    let raw = RawAllReduce::new(&comm, ELEMS)?;
    // The first call of each kind resolves functions and connects: outside the counted calls.
    comm.all_reduce(&send, &mut recvs[0], ReduceOp::SUM)?;
    comm.all_reduce(&slice_send, &mut slice_recv, ReduceOp::SUM)?;
    for &path in paths {
        for recv in recvs.iter_mut() {
            stream.memset_zeros(recv)?;
        }
        stream.memset_zeros(&mut slice_recv)?;
        let got = if path == "slice" {
            run_slices(calls, &comm, &slice_send, &mut slice_recv)?;
            stream.synchronize()?;
            vec![stream.clone_dtoh(&slice_recv)?]
        } else {
            run(path, calls, &raw, &comm, &send, &mut recvs)?;
            stream.synchronize()?;
            let used = if path.starts_with("group") { GROUP } else { 1 };
            recvs[..used].iter().map(|r| stream.clone_dtoh(r)).collect::<Result<Vec<_>, _>>()?
        };
        // Grouped paths make whole groups only; with no call made, the buffers stay zero (the
        // runs with 0 calls that the counts subtract take the same path as the others).
        let made = if path.starts_with("group") { calls / GROUP * GROUP } else { calls };
        let want = if made > 0 { 1.0f32 } else { 0.0 };
        if let Some(wrong) = got.iter().find(|g| **g != [want; ELEMS]) {
            return Err(format!("{path}: a receive buffer holds {:?}, not {want}", wrong[0]).into());
        }
        println!("{path}: {calls} calls, every result checked");
    }
    comm.finalize().map_err(|(_, e)| e)?;
    Ok(())
}

/// Starts NVSHMEM (one PE, through a unique id) on `stream` and takes each of the put `paths`
/// with `calls` calls, checking the destination after each.
fn puts(stream: &Arc<CudaStream>, paths: &[&str], calls: usize) -> Result<(), Box<dyn Error>> {
    let rt = Runtime::init(stream.clone(), &nvshmem::UniqueId::new()?, 0, 1)?;
    // Collective allocations: every PE (here the only one) asks for the same sizes.
    let mut src = rt.alloc::<u8>(PUT_BYTES)?;
    let mut dst = rt.alloc::<u8>(PUT_BYTES)?;
    let data: Vec<u8> = (1..=PUT_BYTES as u8).collect();
    stream.memcpy_htod(&data, &mut src)?;
    let raw = RawPut {
        put: *nvshmem::sys::function!(nvshmem::sys::library()?, nvshmemx_putmem_on_stream)?,
        stream: stream.cu_stream() as nvshmem::sys::cudaStream_t,
    };
    // One put before the counted calls, as for the all-reduces: whatever a first call sets up
    // stays outside the counts.
    rt.put_on_stream(&dst, &src, 0, stream)?;
    for &path in paths {
        stream.memset_zeros(&mut dst)?;
        run_puts(path, calls, &raw, &rt, &dst, &src, stream)?;
        // The barrier completes the puts (a blocking put on a stream is complete only for its
        // source when the stream moves past it); then the host waits for the stream.
        rt.barrier_all_on_stream(stream)?;
        stream.synchronize()?;
        let got = stream.clone_dtoh(&dst)?;
        let want = if calls > 0 { data.clone() } else { vec![0; PUT_BYTES] };
        if got != want {
            return Err(format!("{path}: the destination holds {:?}…, not {:?}…", &got[..4], &want[..4]).into());
        }
        println!("{path}: {calls} calls, every result checked");
    }
    src.free().map_err(|(_, e)| e)?;
    dst.free().map_err(|(_, e)| e)?;
    rt.finalize().map_err(|(_, e)| e)?;
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
    let (put_paths, all_reduce_paths): (Vec<&str>, Vec<&str>) = paths.into_iter().partition(|p| p.starts_with("put"));
    if !all_reduce_paths.is_empty() {
        all_reduces(&stream, &all_reduce_paths, calls)?;
    }
    if !put_paths.is_empty() {
        puts(&stream, &put_paths, calls)?;
    }
    Ok(())
}
