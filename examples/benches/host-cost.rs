//! # What a safe NCCL call costs on the host, beside the raw C call
//!
//! A measuring program (not a lesson): the figures of `docs/host-cost.md`.
//!
//! What it measures, in one binary, on the same buffers: the host time of a 256-byte all-reduce
//! through the raw `nccl-sys` function and through the safe `nccl` crate, raw and safe calls
//! alternating call by call (eager calls from an idle stream; captured calls in one capture;
//! groups alternating which goes first), repeated, reported as medians (small collectives vary by
//! microseconds between runs and machines):
//! * eagerly, while capturing into a CUDA graph with [`nccl::capture`], and per call inside a
//!   group of 16;
//! * on [`nccl::MemBuffer`] (which remembers the streams of its outstanding uses, so on one stream
//!   ordering costs two atomic loads) and on cudarc's [`CudaSlice`](cudarc::driver::CudaSlice);
//! * the one driver call every safe call makes (`cuStreamIsCapturing`: a call on a stream captured
//!   by anything but `nccl::capture` is refused, because that graph would not keep its buffers
//!   alive);
//! * cudarc's own stream protocol on a `CudaSlice` (measured separately, without NCCL), which a
//!   safe call cannot skip;
//! * where a safe call's time goes on `MemBuffer`: four paths timed round-robin, call by call —
//!   the raw call, `gpucomm-ordering` alone (the `Access` and both buffers' pointers, no NCCL),
//!   the raw call inside that ordering, and the safe call — so that the overhead splits into what
//!   the ordering adds and what the `nccl` crate's own checks add.
//!
//! How to run it (2 GPUs, one process each):
//! `cargo bench -p examples --bench host-cost -- --nproc 2`; in the GPU bundle,
//! `bundle/benches/host-cost --nproc 2` (`bash bundle/gpu-host-cost.sh` runs it with the NVSHMEM
//! bench for `docs/host-cost.md`). `--reps N` takes N batches per cell instead of 100 (the medians
//! settle with more; 500 untimed batches of every cell come first); after NCCL's setup each rank pins its thread to a CPU of its own (`--no-pin`
//! leaves it to the scheduler).
//!
//! What it prints, once per rank: a table of median nanoseconds per call (raw, safe, the
//! difference of the medians, and the median and quartiles of the pairwise differences) for
//! MemBuffer and CudaSlice, eager / captured / grouped, the cost of
//! `cuStreamIsCapturing` and of cudarc's protocol alone, the four-path split, and a check that
//! every measured call computed the right sum, eagerly, grouped and replayed from graphs (the
//! program exits non-zero otherwise). Timing figures are printed, never judged: they depend on
//! the machine.

use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{result, sys, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use gpucomm_examples::bench::{flag, pin, switch, RawAllReduce};
use gpucomm_ordering::Access;
use nccl::launch::run_main;
use nccl::{Collectives, Comm, DeviceBufferMut, MemBuffer, ReduceOp};

/// 256 bytes of f32.
const ELEMS: usize = 64;
/// Calls timed back to back between two stream synchronisations.
const BATCH: usize = 32;
/// Batches per cell, interleaved across cells, unless `--reps N` says otherwise.
const REPS: usize = 100;
/// Calls per group in the grouped rows.
const GROUP: usize = 16;
/// Untimed batches of every cell before the measured ones (about a second): the first runs of a
/// process on a machine that had been idle measured raw calls up to 1.35× slower than later runs
/// (clocks rising, caches filling), and the overheads with them. A count, not a time: every
/// rank must make the same collectives.
const WARM_UP: usize = 500;

/// Nanoseconds `f` took.
fn timed(f: impl FnOnce() -> Result<(), Box<dyn Error>>) -> Result<u64, Box<dyn Error>> {
    let start = Instant::now();
    f()?;
    Ok(start.elapsed().as_nanos() as u64)
}

fn median(samples: &mut [u64]) -> u64 {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// One row of the table: raw and safe samples (ns per call), pushed in pairs — `raw[i]` and
/// `safe[i]` were timed one right after the other.
#[derive(Default)]
struct Cell {
    raw: Vec<u64>,
    safe: Vec<u64>,
}

impl Cell {
    /// The safe call's overhead measured pair by pair: the median and quartiles of `safe[i] -
    /// raw[i]`. Each difference compares two calls a few microseconds apart, so drifts slower than
    /// that (NCCL's queue, the clock, the neighbours) cancel out of it.
    fn paired(&self) -> [i64; 3] {
        let mut diffs: Vec<i64> = self.raw.iter().zip(&self.safe).map(|(&r, &s)| s as i64 - r as i64).collect();
        diffs.sort_unstable();
        let at = |q: usize| diffs[(diffs.len() - 1) * q / 4];
        [at(2), at(1), at(3)]
    }
}

/// The options after `--nproc`: `--reps N` (batches per cell, default [`REPS`]) and `--no-pin`.
struct Options {
    reps: usize,
    pin: bool,
}

impl Options {
    fn from_args() -> Result<Self, Box<dyn Error>> {
        let reps = match flag("--reps") {
            Some(n) => n.parse().map_err(|e| format!("--reps {n}: {e}"))?,
            None if switch("--reps") => return Err("--reps needs a number".into()),
            None => REPS,
        };
        if reps == 0 {
            return Err("--reps must be at least 1".into());
        }
        Ok(Options { reps, pin: !switch("--no-pin") })
    }
}

/// The buffers of one row: one send buffer and `GROUP` receive buffers, as cudarc or NCCL memory.
struct Buffers<B> {
    name: &'static str,
    send: B,
    recvs: Vec<B>,
    send_addr: u64,
    recv_addrs: Vec<u64>,
}

impl<B: DeviceBufferMut<f32>> Buffers<B> {
    fn new(
        name: &'static str,
        stream: &Arc<CudaStream>,
        make: impl Fn(&[f32]) -> Result<B, Box<dyn Error>>,
    ) -> Result<Self, Box<dyn Error>> {
        let send = make(&[1.0; ELEMS])?;
        let mut recvs = (0..GROUP).map(|_| make(&[0.0; ELEMS])).collect::<Result<Vec<_>, _>>()?;
        // The addresses for the raw calls, taken once (the guards just record a use here).
        let send_addr = send.device_ptr(stream).0;
        let recv_addrs = recvs.iter_mut().map(|r| r.device_ptr_mut(stream).0).collect();
        stream.synchronize()?;
        Ok(Buffers { name, send, recvs, send_addr, recv_addrs })
    }

    /// The receive buffers `which` hold the sum of `size` ones.
    fn check(&self, stream: &Arc<CudaStream>, size: usize, which: &[usize], after: &str) -> Result<(), Box<dyn Error>> {
        for &i in which {
            let host = stream.clone_dtoh(&self.recvs[i])?;
            if host.iter().any(|&x| x != size as f32) {
                return Err(
                    format!("{} buffer {i} after {after}: got {:?}, expected {size}", self.name, &host[..4]).into()
                );
            }
        }
        Ok(())
    }

    /// Zeroes every receive buffer.
    fn zero(&mut self, stream: &Arc<CudaStream>) -> Result<(), Box<dyn Error>> {
        for r in self.recvs.iter_mut() {
            stream.memset_zeros(r)?;
        }
        Ok(())
    }

    /// Eager calls, raw and safe alternating call by call (the first of each pair alternating too),
    /// from an idle stream: both paths see the same queue, the same caches and the same clock.
    fn eager(&mut self, raw: &RawAllReduce, comm: &Comm, cell: &mut Cell) -> Result<(), Box<dyn Error>> {
        comm.stream().synchronize()?;
        for i in 0..BATCH {
            let (send, recv) = (&self.send, &mut self.recvs[0]);
            let safe = || Ok(comm.all_reduce(send, recv, ReduceOp::SUM)?);
            // SAFETY: the addresses are of this program's buffers of ELEMS floats (`Buffers`),
            // which live, with the communicator, until the program ends.
            let raw_call = || unsafe { raw.all_reduce(self.send_addr, self.recv_addrs[0]) };
            if i % 2 == 0 {
                cell.raw.push(timed(raw_call)?);
                cell.safe.push(timed(safe)?);
            } else {
                cell.safe.push(timed(safe)?);
                cell.raw.push(timed(raw_call)?);
            }
        }
        Ok(())
    }

    /// The same while the stream is captured into a CUDA graph, raw and safe calls alternating in
    /// one capture opened by [`nccl::capture`] (a raw call on a captured stream is the caller's
    /// business; these buffers outlive the graph, which is dropped at once).
    fn captured(&mut self, raw: &RawAllReduce, comm: &Comm, cell: &mut Cell) -> Result<(), Box<dyn Error>> {
        let (send_addr, recv_addr) = (self.send_addr, self.recv_addrs[1]);
        let mut raw_failed = None;
        nccl::capture(comm.stream(), (comm, &self.send, &mut self.recvs[2]), |(comm, send, recv)| {
            for i in 0..BATCH {
                let start = Instant::now();
                if i % 2 == 1 {
                    comm.all_reduce(*send, *recv, ReduceOp::SUM)?;
                    cell.safe.push(start.elapsed().as_nanos() as u64);
                }
                let raw_start = Instant::now();
                // SAFETY: as in `eager`; the graph is launched only while they live.
                if let Err(e) = unsafe { raw.all_reduce(send_addr, recv_addr) } {
                    raw_failed.get_or_insert(e.to_string());
                }
                cell.raw.push(raw_start.elapsed().as_nanos() as u64);
                if i % 2 == 0 {
                    let start = Instant::now();
                    comm.all_reduce(*send, *recv, ReduceOp::SUM)?;
                    cell.safe.push(start.elapsed().as_nanos() as u64);
                }
            }
            Ok(())
        })
        .map_err(|(_, e)| e)?;
        raw_failed.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Replays one raw graph (into receive buffer 1) and one safe graph (into buffer 2) into
    /// zeroed buffers, and checks both sums. The safe graph's result is read on the buffers' home
    /// stream without synchronising: the launch is recorded as the buffer's last use.
    fn replay(&mut self, raw: &RawAllReduce, comm: &Comm, size: usize) -> Result<(), Box<dyn Error>> {
        let stream = comm.stream();
        self.zero(stream)?;
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        // SAFETY: as in `eager`; the graph is launched below, while they live.
        let captured = unsafe { raw.all_reduce(self.send_addr, self.recv_addrs[1]) };
        let raw_graph = stream.end_capture(sys::CUgraphInstantiate_flags(0))?.ok_or("empty raw capture")?;
        captured?;
        let mut safe_graph = nccl::capture(stream, (comm, &self.send, &mut self.recvs[2]), |(comm, send, recv)| {
            comm.all_reduce(*send, *recv, ReduceOp::SUM)
        })
        .map_err(|(_, e)| e)?;
        raw_graph.launch()?;
        safe_graph.launch()?;
        drop(safe_graph);
        stream.synchronize()?;
        drop(raw_graph);
        self.check(stream, size, &[1, 2], "a graph replay")
    }

    /// Groups of `GROUP` calls, timed per group and divided by `GROUP`.
    fn grouped(&mut self, raw: &RawAllReduce, comm: &Comm, cell: &mut Cell) -> Result<(), Box<dyn Error>> {
        let raw_first = cell.raw.len().is_multiple_of(2);
        if raw_first {
            comm.stream().synchronize()?;
            // SAFETY: as in `eager`, for every receive buffer.
            cell.raw.push(timed(|| unsafe { raw.group(self.send_addr, &self.recv_addrs) })? / GROUP as u64);
        }
        comm.stream().synchronize()?;
        let (send, recvs) = (&self.send, &mut self.recvs);
        let ns = timed(|| {
            Ok(nccl::group(|g| {
                for recv in recvs.iter_mut() {
                    g.with(comm).all_reduce(send, recv, ReduceOp::SUM)?;
                }
                Ok(())
            })?)
        })?;
        cell.safe.push(ns / GROUP as u64);
        if !raw_first {
            comm.stream().synchronize()?;
            // SAFETY: as in `eager`, for every receive buffer.
            cell.raw.push(timed(|| unsafe { raw.group(self.send_addr, &self.recv_addrs) })? / GROUP as u64);
        }
        Ok(())
    }
}

/// Where a safe call's time goes, on `MemBuffer`: four paths timed round-robin, call by call.
#[derive(Default)]
struct Parts {
    /// The raw call.
    raw: Vec<u64>,
    /// `gpucomm-ordering` alone: the `Access` (one `cuStreamIsCapturing`), both buffers' pointers
    /// and guards, no NCCL.
    ordering: Vec<u64>,
    /// The raw call between the ordering and the release of the guards.
    ordered_raw: Vec<u64>,
    /// The safe call.
    safe: Vec<u64>,
}

impl Parts {
    /// One round of the four paths, in a rotating order; `round` picks the rotation.
    fn round(
        &mut self,
        round: usize,
        (send, recv): (&MemBuffer<f32>, &mut MemBuffer<f32>),
        raw: &RawAllReduce,
        comm: &Comm,
    ) -> Result<(), Box<dyn Error>> {
        let stream = comm.stream();
        let (send_addr, recv_addr) = (send.device_ptr(stream).0, recv.device_ptr_mut(stream).0);
        for k in 0..4 {
            let recv = &mut *recv;
            match (round + k) % 4 {
                // SAFETY: the addresses of `send` and `recv`, borrowed for this function.
                0 => self.raw.push(timed(|| unsafe { raw.all_reduce(send_addr, recv_addr) })?),
                1 => self.ordering.push(timed(|| {
                    let access = Access::new(stream);
                    let (_, read) = access.read(send)?;
                    let (_, write) = access.write(recv)?;
                    drop((read, write));
                    Ok(())
                })?),
                2 => self.ordered_raw.push(timed(|| {
                    let access = Access::new(stream);
                    let (s, read) = access.read(send)?;
                    let (r, write) = access.write(recv)?;
                    // SAFETY: the addresses the access just took, of buffers borrowed here.
                    unsafe { raw.all_reduce(s, r) }?;
                    drop((read, write));
                    Ok(())
                })?),
                _ => self.safe.push(timed(|| Ok(comm.all_reduce(send, recv, ReduceOp::SUM)?))?),
            }
        }
        Ok(())
    }

    /// Prints the medians, labelled with the scope.
    fn print(&mut self, scope: &str) {
        let [raw, ordering, ordered_raw, safe] =
            [&mut self.raw, &mut self.ordering, &mut self.ordered_raw, &mut self.safe].map(|v| median(v) as i64);
        println!(
            "  {scope:<9} {raw:>8} {ordering:>10} {ordered_raw:>13} {safe:>8} {:>+12} {:>+10}",
            ordered_raw - raw,
            safe - ordered_raw
        );
    }
}

/// [`Parts`] eagerly (from an idle stream) and inside one capture of `nccl::capture`.
fn parts(
    bufs: &mut Buffers<MemBuffer<f32>>,
    raw: &RawAllReduce,
    comm: &Comm,
    reps: usize,
) -> Result<[Parts; 2], Box<dyn Error>> {
    let mut eager = Parts::default();
    let mut captured = Parts::default();
    for rep in 0..reps {
        comm.stream().synchronize()?;
        for i in 0..BATCH {
            eager.round(rep + i, (&bufs.send, &mut bufs.recvs[0]), raw, comm)?;
        }
    }
    comm.stream().synchronize()?;
    for rep in 0..reps {
        let mut failed = None;
        nccl::capture(comm.stream(), (comm, &bufs.send, &mut bufs.recvs[0]), |(comm, send, recv)| {
            for i in 0..BATCH {
                if let Err(e) = captured.round(rep + i, (send, recv), raw, comm) {
                    failed.get_or_insert(e.to_string());
                }
            }
            Ok(())
        })
        .map_err(|(_, e)| e)?;
        if let Some(e) = failed {
            return Err(e.into());
        }
    }
    Ok([eager, captured])
}

/// One batch of every cell (eager, captured, grouped) for one kind of buffer.
fn measure<B: DeviceBufferMut<f32>>(
    bufs: &mut Buffers<B>,
    raw: &RawAllReduce,
    comm: &Comm,
    cells: &mut [Cell; 3],
) -> Result<(), Box<dyn Error>> {
    bufs.eager(raw, comm, &mut cells[0])?;
    bufs.captured(raw, comm, &mut cells[1])?;
    bufs.grouped(raw, comm, &mut cells[2])?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    run_main(|info| {
        let Options { reps, pin: pinned } = Options::from_args()?;
        // The communicator on a stream of its own (the default stream cannot be captured).
        // Creating it also turned on cudarc's multi-stream mode: every CudaSlice is ordered with
        // events.
        let (stream, comm) = gpucomm_examples::rank_comm(&info)?;
        let (rank, size) = (comm.rank(), comm.size());
        let raw = RawAllReduce::new(&comm, ELEMS)?;

        let mut mem = Buffers::new("MemBuffer", &stream, |h| Ok(MemBuffer::from_host(&stream, h)?))?;
        let mut plain: Buffers<CudaSlice<f32>> = Buffers::new("CudaSlice", &stream, |h| Ok(stream.clone_htod(h)?))?;
        // Warm-up: NCCL connects at the first collective.
        comm.all_reduce(&mem.send, &mut mem.recvs[0], ReduceOp::SUM)?;
        stream.synchronize()?;
        let cpu = if pinned { Some(pin(rank, size)?) } else { None };

        for _ in 0..WARM_UP {
            let mut discarded: [Cell; 3] = Default::default();
            measure(&mut mem, &raw, &comm, &mut discarded)?;
            measure(&mut plain, &raw, &comm, &mut discarded)?;
        }
        let mut mem_cells: [Cell; 3] = Default::default();
        let mut plain_cells: [Cell; 3] = Default::default();
        for _ in 0..reps {
            measure(&mut mem, &raw, &comm, &mut mem_cells)?;
            measure(&mut plain, &raw, &comm, &mut plain_cells)?;
        }
        stream.synchronize()?;
        let all: Vec<usize> = (0..GROUP).collect();
        mem.check(&stream, size, &all, "eager and grouped calls")?;
        plain.check(&stream, size, &all, "eager and grouped calls")?;
        mem.replay(&raw, &comm, size)?;
        plain.replay(&raw, &comm, size)?;
        let mut parts = parts(&mut mem, &raw, &comm, reps)?;

        // The driver call every safe call makes once: is the stream being captured?
        let mut capturing = Vec::with_capacity(reps * BATCH);
        for _ in 0..reps * BATCH {
            capturing.push(timed(|| {
                // SAFETY: the stream is alive (borrowed) and its context current (bound above).
                unsafe { result::stream::is_capturing(stream.cu_stream()) }?;
                Ok(())
            })?);
        }

        // cudarc's own protocol on a CudaSlice, without NCCL: the waits and records one
        // all-reduce's two buffers cost (read: 1 wait + 1 record; write: 2 waits + 1 record).
        let mut protocol = Vec::with_capacity(reps * BATCH);
        for _ in 0..reps * BATCH {
            let (send, recv) = (&plain.send, &mut plain.recvs[0]);
            protocol.push(timed(|| {
                let (_, read) = send.device_ptr(&stream);
                let (_, write) = recv.device_ptr_mut(&stream);
                drop((read, write));
                Ok(())
            })?);
        }
        stream.synchronize()?;

        let placement = cpu.map_or("not pinned".to_string(), |c| format!("pinned to CPU {c}"));
        println!("rank {rank} of {size}: host time per 256-byte all_reduce, median ns ({reps} batches of {BATCH} calls per cell, interleaved; groups of {GROUP}: time per group / {GROUP}; {placement})");
        println!(
            "  {:<10} {:<9} {:>12} {:>10} {:>9} {:>8} {:>14}",
            "buffers", "scope", "raw nccl-sys", "safe nccl", "overhead", "paired", "paired p25..p75"
        );
        for (name, cells) in [("MemBuffer", &mut mem_cells), ("CudaSlice", &mut plain_cells)] {
            for (scope, cell) in ["eager", "capture", "group"].iter().zip(cells.iter_mut()) {
                let [paired, p25, p75] = cell.paired();
                let (raw_ns, safe_ns) = (median(&mut cell.raw), median(&mut cell.safe));
                println!(
                    "  {name:<10} {scope:<9} {raw_ns:>12} {safe_ns:>10} {:>+9} {paired:>+8} {:>14}",
                    safe_ns as i64 - raw_ns as i64,
                    format!("{p25:+}..{p75:+}")
                );
            }
        }
        println!(
            "  overhead: safe median - raw median; paired: the median of the differences of calls timed one right after the other, with its quartiles"
        );
        println!(
            "  cuStreamIsCapturing alone (made once by every safe call, to refuse captures nccl::capture did not open): {} ns",
            median(&mut capturing)
        );
        println!(
            "  cudarc's protocol alone on the two CudaSlices of one all_reduce (3 stream waits + 2 event records, no NCCL): {} ns",
            median(&mut protocol)
        );
        println!(
            "  Why a safe call pays it on CudaSlice: cudarc's copies, kernels and its Drop (the free) order themselves by those \
             events, so a call that skipped them would let cudarc overwrite or free memory NCCL still uses. Under a capture the \
             waits go to an idle helper stream (the capture stays valid) but are still made. MemBuffer, which remembers the \
             streams of its outstanding uses, needs none of it on one stream."
        );
        println!(
            "  where the time of a safe call on MemBuffer goes, median ns ({reps} batches of {BATCH} rounds, the four paths round-robin):"
        );
        println!(
            "  {:<9} {:>8} {:>10} {:>13} {:>8} {:>12} {:>10}",
            "scope", "raw", "ordering", "raw+ordering", "safe", "ordering adds", "nccl adds"
        );
        parts[0].print("eager");
        parts[1].print("capture");
        println!(
            "rank {rank}: every measured call computed the right sum ({size}), eager, grouped and replayed from graphs"
        );
        comm.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}
