//! # NVSHMEM puts: bandwidth, host time per call and device latency, beside C
//!
//! A measuring program (not a lesson): the NVSHMEM figures of `docs/host-cost.md`. Three
//! experiments:
//! * bandwidth: `nvshmemx_putmem_on_stream` of 256 MiB to the next PE, every PE at once, timed
//!   with CUDA events after a warm-up, through the raw `nvshmem-sys` function and through
//!   [`nvshmem::Runtime::put_on_stream`], interleaved;
//! * host time per call: 64-byte puts through both, batches of each in turn, with the median of
//!   the paired differences; beside them, batches of raw puts each preceded by the library calls
//!   a safe put makes beyond the raw one (`cuStreamIsCapturing`, `cuCtxGetCurrent`,
//!   `nvshmem_ptr`), which split the safe put's extra time into those calls and the crate's own
//!   code, and each of those calls timed alone (with `cuCtxSetCurrent`, which a safe call makes
//!   only when another context was current). Like `host-cost`, the thread is pinned to one CPU
//!   of its own for these;
//! * latency: a device-side ping-pong (`examples/kernels/nvshmem_bench.cu`): one thread on each of
//!   PEs 0 and 1 bouncing a counter with `nvshmem_int_p` and `nvshmem_int_wait_until`.
//!
//! The C baseline is NVSHMEM's C API on the same machine (NVSHMEM 3.4.5, 2 × H200; recorded in
//! `docs/host-cost.md`): `nvshmemx_putmem_on_stream` of 256 MiB with both PEs putting at once,
//! 3 warm-up + 10 timed puts + quiet, CUDA events: 390.3 GB/s per PE; the same ping-pong in C,
//! 10,000 round trips in one kernel, host wall clock / iterations / 2: 1.23 µs. Goals: ≥ 0.98 ×
//! the C bandwidth, the C latency ± 0.05 µs, and at most 0.15 µs of host time per call over the
//! raw call.
//!
//! How to run it (two GPUs; with more, PEs put to the next PE and only PEs 0 and 1 ping-pong):
//! `cargo bench -p examples --bench nvshmem -- --nproc 2`; in the GPU bundle,
//! `bundle/benches/nvshmem --nproc 2` (`bash bundle/gpu-host-cost.sh` runs it with the host-cost
//! bench for `docs/host-cost.md`). With one GPU (one PE) it still runs, but the puts go to the PE
//! itself (a copy inside the GPU, not comparable with the baseline) and the ping-pong, which
//! needs a second PE, is left out.
//!
//! What it prints, from each PE: a markdown table, e.g.
//!
//! ```text
//! | PE 0 | C baseline | raw nvshmem-sys | safe nvshmem | safe / goal |
//! |---|---:|---:|---:|---|
//! | putmem_on_stream 256 MiB, GB/s | 390.3 | 390.2 | 390.3 | 1.00 × C (goal ≥ 0.98) |
//! | host time per 64-byte put, µs | — | 2.10 | 2.19 | +0.09 µs paired (goal ≤ +0.15) |
//! | device p ping-pong, half round trip, µs | 1.23 | — | 1.23 | goal 1.23 ± 0.05 |
//! ```
//!
//! followed by two lines on where a safe put's extra host time goes (the raw put after the safe
//! put's library calls, and each call alone, in nanoseconds).
//!
//! The program fails only when a result is wrong (the data a put delivered, the ping-pong
//! counter); the figures are reported, not enforced.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{result, CudaStream, LaunchConfig};
use gpucomm_examples::bench::pin;
use nvshmem::launch::run_main;
use nvshmem::sys::function;
use nvshmem::{Runtime, Symmetric};

/// The device-linked cubin that build.rs made from `kernels/nvshmem_bench.cu`.
const BENCH: &[u8] = gpucomm_examples::kernels::NVSHMEM_BENCH;

const BYTES: usize = 256 << 20;
const WARMUP: usize = 3;
const TIMED: usize = 10;
const SMALL: usize = 64;
const BATCH: usize = 256;
const BATCHES: usize = 200;
const ITERS: i32 = 10_000;
const C_BANDWIDTH: f64 = 390.3;
const C_HALF_RTT: f64 = 1.23;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One way of issuing `nvshmemx_putmem_on_stream`: through the safe crate or the raw function.
#[derive(Clone, Copy)]
enum Way {
    Safe,
    Raw,
}

/// The host-time batches' ways: [`Way`]'s, and the raw function after the library calls a safe put
/// makes beyond it.
#[derive(Clone, Copy)]
enum Batch {
    Safe,
    Raw,
    RawAfterCalls,
}

/// Puts of `src` into the next PE's `dst`, on `stream`.
struct Puts<'a> {
    rt: &'a Runtime,
    dst: &'a Symmetric<'a, u8>,
    src: &'a Symmetric<'a, u8>,
    pe: usize,
    stream: &'a Arc<CudaStream>,
}

impl Puts<'_> {
    /// One put of `bytes` bytes.
    fn put(&self, way: Way, bytes: usize) -> Res<()> {
        let (dst, src) = (self.dst.slice(..bytes)?, self.src.slice(..bytes)?);
        match way {
            Way::Safe => self.rt.put_on_stream(&dst, &src, self.pe, self.stream)?,
            Way::Raw => {
                let f = function!(nvshmem::sys::library()?, nvshmemx_putmem_on_stream)?;
                // SAFETY: both ranges are live symmetric memory of `bytes` bytes on this PE's
                // device, `pe` is in range, the stream belongs to this device, whose context the
                // runtime bound; this is the raw call the safe one wraps.
                unsafe {
                    f(
                        dst.device_address() as *mut c_void,
                        src.device_address() as *const c_void,
                        bytes,
                        self.pe as i32,
                        self.stream.cu_stream() as nvshmem::sys::cudaStream_t,
                    )
                };
            }
        }
        Ok(())
    }

    /// GB/s of `TIMED` puts of the whole buffer after `WARMUP` ones, every PE at once.
    fn bandwidth(&self, way: Way) -> Res<f64> {
        let (rt, stream, bytes) = (self.rt, self.stream, self.dst.len());
        rt.barrier_all_on_stream(stream)?;
        for _ in 0..WARMUP {
            self.put(way, bytes)?;
        }
        rt.quiet_on_stream(stream)?;
        rt.barrier_all_on_stream(stream)?;
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        for _ in 0..TIMED {
            self.put(way, bytes)?;
        }
        rt.quiet_on_stream(stream)?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let seconds = f64::from(start.elapsed_ms(&end)?) / 1e3;
        Ok((TIMED * bytes) as f64 / seconds / 1e9)
    }

    /// Host time of one `SMALL`-byte put, in µs: `BATCHES` rounds, each timing a batch of `BATCH`
    /// raw calls, a batch of `BATCH` safe ones and a batch of `BATCH` raw calls each preceded by
    /// the library calls a safe put makes beyond the raw one (which goes first rotates), the
    /// stream drained before every batch so that its queue never fills. Returns the medians of
    /// each way and the median of the paired differences (safe − raw of one round). The raw calls
    /// resolve the functions and the addresses once, outside the timed loop.
    fn host_cost(&self) -> Res<HostCost> {
        let (dst, src) = (self.dst.slice(..SMALL)?, self.src.slice(..SMALL)?);
        let raw = function!(nvshmem::sys::library()?, nvshmemx_putmem_on_stream)?;
        let calls = SafeCalls::new(self.stream)?;
        let (d, s, pe, stream) = (dst.device_address(), src.device_address(), self.pe, self.stream);
        let batch = |way: Batch| -> Res<f64> {
            stream.synchronize()?;
            let t = Instant::now();
            for _ in 0..BATCH {
                if let Batch::Safe = way {
                    self.rt.put_on_stream(&dst, &src, pe, stream)?;
                    continue;
                }
                if let Batch::RawAfterCalls = way {
                    calls.capturing()?;
                    calls.current()?;
                    calls.ptr(d, pe);
                }
                // SAFETY: as in `put`, for `SMALL` bytes.
                unsafe { raw(d as *mut c_void, s as *const c_void, SMALL, pe as i32, stream.cu_stream() as _) };
            }
            Ok(t.elapsed().as_secs_f64() * 1e6 / BATCH as f64)
        };
        let (mut raws, mut safes, mut after_calls, mut pairs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let ways = [Batch::Raw, Batch::Safe, Batch::RawAfterCalls];
        for round in 0..BATCHES {
            let mut times = [0.0; 3];
            for k in 0..3 {
                let i = (round + k) % 3;
                times[i] = batch(ways[i])?;
            }
            raws.push(times[0]);
            safes.push(times[1]);
            after_calls.push(times[2]);
            pairs.push(times[1] - times[0]);
        }
        stream.synchronize()?;
        Ok(HostCost {
            raw: median(raws),
            safe: median(safes),
            paired: median(pairs),
            raw_after_calls: median(after_calls),
            alone: calls.alone(d, pe)?,
        })
    }
}

/// Host time per put, µs: see [`Puts::host_cost`].
struct HostCost {
    raw: f64,
    safe: f64,
    paired: f64,
    /// The raw put after the library calls a safe put makes beyond it.
    raw_after_calls: f64,
    /// Each of those calls alone, and `cuCtxSetCurrent`, ns: see [`SafeCalls::alone`].
    alone: [f64; 4],
}

/// The library calls a safe put makes beyond the raw one, made directly: the capture query of its
/// stream, the check that the PE's context is current, and the target's address for the
/// source/destination overlap check.
struct SafeCalls<'a> {
    stream: &'a CudaStream,
    ptr: unsafe extern "C" fn(*const c_void, i32) -> *mut c_void,
}

impl<'a> SafeCalls<'a> {
    fn new(stream: &'a CudaStream) -> Res<Self> {
        Ok(SafeCalls { stream, ptr: *function!(nvshmem::sys::library()?, nvshmem_ptr)? })
    }

    /// `cuStreamIsCapturing` on the stream.
    fn capturing(&self) -> Res<()> {
        // SAFETY: the stream is alive (borrowed).
        unsafe { result::stream::is_capturing(self.stream.cu_stream()) }?;
        Ok(())
    }

    /// `cuCtxGetCurrent`, compared with the stream's context.
    fn current(&self) -> Res<bool> {
        Ok(result::ctx::get_current()? == Some(self.stream.context().cu_ctx()))
    }

    /// `nvshmem_ptr` of `addr` (symmetric) on `pe`.
    fn ptr(&self, addr: u64, pe: usize) -> *mut c_void {
        // SAFETY: NVSHMEM is initialised, `addr` lies in a live symmetric allocation and `pe` is
        // in range; nvshmem_ptr only computes an address.
        unsafe { (self.ptr)(addr as *const c_void, pe as i32) }
    }

    /// Median ns per call, over `BATCHES` batches of `BATCH` calls, of each call alone, warm:
    /// `cuStreamIsCapturing`, `cuCtxGetCurrent`, `nvshmem_ptr` and `cuCtxSetCurrent` of the
    /// context already current (which a safe call skips).
    fn alone(&self, addr: u64, pe: usize) -> Res<[f64; 4]> {
        let ctx = self.stream.context().cu_ctx();
        let each = |call: &mut dyn FnMut() -> Res<()>| -> Res<f64> {
            let mut batches = Vec::with_capacity(BATCHES);
            for _ in 0..BATCHES {
                let t = Instant::now();
                for _ in 0..BATCH {
                    call()?;
                }
                batches.push(t.elapsed().as_secs_f64() * 1e9 / BATCH as f64);
            }
            Ok(median(batches))
        };
        Ok([
            each(&mut || self.capturing())?,
            each(&mut || self.current().map(drop))?,
            each(&mut || {
                std::hint::black_box(self.ptr(addr, pe));
                Ok(())
            })?,
            // SAFETY: the stream's context is alive (the stream holds it) and current already.
            each(&mut || Ok(unsafe { result::ctx::set_current(ctx) }?))?,
        ])
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Half round trip of the device ping-pong, in µs (host wall clock of the whole kernel). Only
/// PEs 0 and 1 take part, so it needs at least two PEs: every PE calls it when there are.
fn ping_pong(rt: &Runtime, stream: &Arc<CudaStream>) -> Res<f64> {
    let module = rt.load_module(BENCH)?;
    let kernel = module.kernel("ping_pong")?;
    let active = i32::from(rt.my_pe() < 2 && rt.n_pes() >= 2);
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
    let mut result = 0.0;
    // The first run warms up (module, first launch, peer mappings); the second is measured.
    for _ in 0..2 {
        let mut flag = rt.alloc_zeroed::<i32>(1)?;
        rt.barrier_all_on_stream(stream)?;
        stream.synchronize()?;
        rt.barrier_all()?;
        let t = Instant::now();
        // SAFETY: the arguments match `ping_pong(int *flag, int iters, int active)`; the kernel
        // touches one int of `flag` on this PE and on PE 1 - me, and only where `active` is 1,
        // which needs PE 1 - me to exist (the kernel checks it again).
        unsafe {
            kernel.launch_collective(cfg, stream, |a| {
                a.buffer_mut(&mut flag)?.value(ITERS)?.value(active)?;
                Ok(())
            })
        }?;
        stream.synchronize()?;
        result = t.elapsed().as_secs_f64() * 1e6 / f64::from(ITERS) / 2.0;
        let last = stream.clone_dtoh(&flag)?[0];
        if active == 1 && last != ITERS {
            return Err(format!("PE {}: the ping-pong counter ended at {last}, expected {ITERS}", rt.my_pe()).into());
        }
        rt.barrier_all_on_stream(stream)?;
        flag.free().map_err(|(_, e)| e)?;
    }
    Ok(result)
}

fn main() -> std::process::ExitCode {
    run_main(|info| {
        // The GPU, the rendezvous and NVSHMEM's start, as in lesson 7.
        let (stream, rt) = gpucomm_examples::nvshmem_runtime(&info)?;
        let (me, n) = (rt.my_pe(), rt.n_pes());
        let next = (me + 1) % n;

        let dst = rt.alloc::<u8>(BYTES)?;
        let mut src = rt.alloc::<u8>(BYTES)?;
        let pattern = |pe: usize| (0..BYTES).map(move |i| (i % 251) as u8 ^ pe as u8);
        stream.memcpy_htod(&pattern(me).collect::<Vec<_>>(), &mut src)?;

        // Interleaved, twice each; the better of the two runs of each way is reported.
        let puts = Puts { rt: &rt, dst: &dst, src: &src, pe: next, stream: &stream };
        let ways = [Way::Raw, Way::Safe];
        let mut bw = [0.0f64; 2];
        for _ in 0..2 {
            for (k, way) in ways.into_iter().enumerate() {
                bw[k] = bw[k].max(puts.bandwidth(way)?);
            }
        }
        rt.barrier_all_on_stream(&stream)?;
        let prev = (me + n - 1) % n;
        if stream.clone_dtoh(&dst)?.into_iter().zip(pattern(prev)).any(|(a, b)| a != b) {
            return Err(format!("PE {me}: the 256 MiB buffer from PE {prev} is wrong").into());
        }
        // The host times are taken on one CPU, as host-cost takes them: a thread the scheduler
        // moves pays for cold caches in the samples of both ways.
        let cpu = pin(me, n)?;
        let cost = puts.host_cost()?;
        rt.barrier_all_on_stream(&stream)?;
        // With one PE there is no one to bounce the counter with.
        let half_rtt = if n >= 2 { ping_pong(&rt, &stream)? } else { f64::NAN };

        let active = me < 2 && n >= 2;
        let mut table = format!(
            "| PE {me} | C baseline | raw nvshmem-sys | safe nvshmem | safe / goal |\n|---|---:|---:|---:|---|\n"
        );
        table += &format!(
            "| putmem_on_stream 256 MiB, GB/s | {C_BANDWIDTH:.1} | {:.1} | {:.1} | {:.3} × C (goal ≥ 0.98) |\n",
            bw[0],
            bw[1],
            bw[1] / C_BANDWIDTH
        );
        table += &format!(
            "| host time per {SMALL}-byte put, µs | — | {:.2} | {:.2} | {:+.2} µs paired (goal ≤ +0.15) |\n",
            cost.raw, cost.safe, cost.paired
        );
        if active {
            table += &format!(
                "| device p ping-pong, half round trip, µs | {C_HALF_RTT:.2} | — | {half_rtt:.2} | goal {C_HALF_RTT:.2} ± 0.05 |\n"
            );
        }
        let met =
            bw[1] >= 0.98 * C_BANDWIDTH && cost.paired <= 0.15 && (!active || (half_rtt - C_HALF_RTT).abs() <= 0.05);
        println!("{table}PE {me}: goals {}", if met { "met" } else { "missed (see the table)" });
        println!(
            "PE {me}: where a safe put's host time goes (pinned to CPU {cpu}), median µs per put: raw {:.2}, raw after the safe put's library calls (cuStreamIsCapturing, cuCtxGetCurrent, nvshmem_ptr) {:.2}, safe {:.2}: the calls add {:+.2}, the crate's own code {:+.2}",
            cost.raw,
            cost.raw_after_calls,
            cost.safe,
            cost.raw_after_calls - cost.raw,
            cost.safe - cost.raw_after_calls
        );
        let [capturing, current, ptr, set] = cost.alone;
        println!(
            "PE {me}: each alone, warm, ns per call: cuStreamIsCapturing {capturing:.0}, cuCtxGetCurrent {current:.0}, nvshmem_ptr {ptr:.0}; cuCtxSetCurrent of the current context {set:.0} (a safe call makes it only when another context is current)"
        );
        if n == 1 {
            println!("PE 0 of 1: the puts went to this PE itself (a copy inside the GPU); the ping-pong needs 2 PEs");
        }

        rt.barrier_all_on_stream(&stream)?;
        src.free().map_err(|(_, e)| e)?;
        dst.free().map_err(|(_, e)| e)?;
        rt.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}
