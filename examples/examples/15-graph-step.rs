//! # Lesson 15 — a whole step in one CUDA graph: compute, custom all-reduce, epilogue
//!
//! What it teaches:
//! * training and inference loops repeat the same sequence of kernels; capturing it once into a
//!   **CUDA graph** and replaying it removes the per-launch host cost, which dominates for small
//!   messages;
//! * a custom communication kernel can live inside the graph like any other: here a "compute"
//!   kernel produces this rank's values, gpucomm-kernels' LSA all-reduce (the production form of
//!   lesson 12's kernel: LL up to 64 KiB, one-shot above) sums them across ranks, and an
//!   "epilogue" kernel turns the sum into a mean (`examples/kernels/step.cu`);
//! * why that works: the LSA barrier keeps its state on the device, so a replay synchronises with
//!   the peers' replays; the buffers are [`nccl::MemBuffer`]s, whose uses inside a capture are
//!   recorded for the graph instead of waited for (cudarc's `CudaSlice` waits on its events,
//!   which breaks a capture);
//! * how a graph stays sound: the capture (`gpucomm_examples::bench::graph`, on
//!   [`nccl::capture`]'s mechanism) is given everything the step uses — its buffers and the
//!   all-reduce's staging window — and refuses a step that uses anything else; the graph keeps
//!   them until it is dropped, and each launch is ordered like a call;
//! * the step number is on the device too, so every replay computes new values, and the result of
//!   the last replay is checked exactly;
//! * the per-step time, eager (three launches per step) against replayed from the graph.
//!
//! How to run it (2 or more GPUs; one GPU runs too, the all-reduce then over a team of one):
//! `cargo run --release -p examples --example 15-graph-step -- --nproc 2`.
//!
//! What you should see, on every rank: `1000 graph replays correct`, then on rank 0 the µs per step
//! for 4 KiB and 256 KiB messages, eager and from the graph.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use gpucomm_examples::bench::{self, BoxError};
use gpucomm_examples::kernels;
use gpucomm_examples::lsa::{LsaAllReduce, LL_MAX_BYTES};
use nccl::launch::run_main;
use nccl::MemBuffer;

const REPLAYS: usize = 1000;

fn main() -> std::process::ExitCode {
    run_main(|info| {
        // A stream of its own: the legacy default stream cannot be captured into a graph.
        let (_, comm) = gpucomm_examples::rank_comm(&info)?;
        let lsa = LsaAllReduce::new(&comm, 256 << 10)?;
        let module = nccl::device::load_module(comm.context(), kernels::STEP)?;
        let step =
            Step { lsa: &lsa, produce: module.load_function("produce")?, epilogue: module.load_function("epilogue")? };
        let mut scratch = MemBuffer::<f32>::zeroed(comm.stream(), 1)?;
        let mut rows = Vec::new();
        for bytes in [4usize << 10, 256 << 10] {
            rows.push(step.run(bytes / 4, &mut scratch)?);
        }
        // The table after the checks, so that no rank's line lands inside it.
        if comm.rank() == 0 {
            println!("| message | eager step (µs) | graph step (µs) |\n|---:|---:|---:|");
            rows.iter().for_each(|row| println!("{row}"));
        }
        // Collective teardown, checked (dropping would hide a failure).
        drop(step);
        drop((scratch, lsa));
        comm.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}

struct Step<'a, 'c> {
    lsa: &'a LsaAllReduce<'c>,
    produce: CudaFunction,
    epilogue: CudaFunction,
}

/// The buffers of one step: the input `x`, the all-reduced `sum`, the output `y` and the step
/// counter (a tuple, so that a graph can keep it: see `nccl::capture`).
type Buffers = (MemBuffer<f32>, MemBuffer<f32>, MemBuffer<f32>, MemBuffer<f32>);

impl Step<'_, '_> {
    /// Enqueues one step on `stream`: produce → all-reduce → epilogue.
    fn enqueue(&self, stream: &Arc<CudaStream>, (x, sum, y, step): &mut Buffers) -> Result<(), BoxError> {
        let comm = self.lsa.comm();
        let n = x.len();
        let cfg = LaunchConfig::for_num_elems(n as u32);
        let rank = comm.rank() as f32;
        {
            let (x, _x) = x.device_ptr_mut(stream);
            let (step, _s) = step.device_ptr(stream);
            let mut launch = stream.launch_builder(&self.produce);
            launch.arg(&x).arg(&n).arg(&rank).arg(&step);
            // SAFETY: `produce(float*, size_t, float, const float*)`; `x` holds `n` floats and
            // `step` one, on this device, borrowed until the launch is enqueued.
            unsafe { launch.launch(cfg) }?;
        }
        if n * 4 <= LL_MAX_BYTES {
            self.lsa.ll(stream, x, sum)?;
        } else {
            self.lsa.one_shot(stream, x, sum)?;
        }
        let scale = 1.0 / comm.size() as f32;
        let (sum, _sum) = sum.device_ptr(stream);
        let (y, _y) = y.device_ptr_mut(stream);
        let (step, _s) = step.device_ptr_mut(stream);
        let mut launch = stream.launch_builder(&self.epilogue);
        launch.arg(&sum).arg(&y).arg(&n).arg(&scale).arg(&step);
        // SAFETY: `epilogue(const float*, float*, size_t, float, float*)`; `sum` and `y` hold `n`
        // floats and `step` one, on this device, borrowed until the launch is enqueued.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// Checks `n`-float steps run eagerly and from a graph, and returns their table row.
    fn run(&self, n: usize, scratch: &mut MemBuffer<f32>) -> Result<String, BoxError> {
        let comm = self.lsa.comm();
        let stream = comm.stream();
        let zeros = || MemBuffer::<f32>::zeroed(stream, n);
        let mut b: Buffers = (zeros()?, zeros()?, zeros()?, MemBuffer::zeroed(stream, 1)?);

        // Eager: three launches per step.
        let eager = bench::eager(comm, scratch, 10, 200, || self.enqueue(stream, &mut b))?;

        // The same step captured once, then replayed. The graph keeps the step's buffers and the
        // staging window of the all-reduce (and so the device communicator), and gives them back.
        b.3 = MemBuffer::<f32>::zeroed(stream, 1)?;
        let kept = (self.lsa.staging(), b);
        let (graph, (_, b)) =
            bench::graph(comm, scratch, stream, 1, REPLAYS - 1, kept, |(_, b)| self.enqueue(stream, b))?;

        // One capture launch + REPLAYS - 1 timed replays: the step counter is REPLAYS, and the last
        // replay computed with step REPLAYS - 1. The mean over ranks of (r + 1)(i mod 7) + s is
        // (N + 1)/2 (i mod 7) + s.
        let ranks = comm.size() as f32;
        let y = stream.clone_dtoh(&b.2)?;
        let last = (REPLAYS - 1) as f32;
        // A NaN is wrong too (it compares false with everything, so `>` alone would pass it).
        let off = |i: usize| (y[i] - ((ranks + 1.0) / 2.0 * (i % 7) as f32 + last)).abs();
        let wrong = (0..n).find(|&i| off(i).is_nan() || off(i) > 1e-3);
        if let Some(i) = wrong {
            return Err(format!("rank {}: element {i} after {REPLAYS} replays is {}", comm.rank(), y[i]).into());
        }
        println!("rank {}: {REPLAYS} graph replays correct ({} floats per step)", comm.rank(), n);
        Ok(format!("| {} | {eager:.2} | {graph:.2} |", bench::size_label(n * 4)))
    }
}
