//! # Lesson 17 — data-parallel training with candle: bucketed gradient all-reduce, overlapped
//!
//! What it teaches:
//! * a candle CUDA tensor is a cudarc `CudaSlice` underneath, the buffer type the `nccl` crate
//!   takes: read it through `Tensor::storage_and_layout`, write it through candle's in-place
//!   operator (`InplaceOp1`) — see `candle-lessons/src/tensor.rs`. No `unsafe`, no copies to the
//!   host, no `unsafe impl Send`;
//! * data parallelism: every rank holds the whole model, trains on its own rows of each global
//!   batch, and averages the gradients (`ReduceOp::AVG`) before the optimizer step, so that every
//!   rank takes the same step. The parameters start equal because rank 0 broadcasts its own
//!   (each rank drew different ones, as independent processes would);
//! * buckets the way PyTorch's DDP makes them (`src/buckets.rs`): reverse layer order, first
//!   bucket 1 MiB, the others 25 MiB, each packed into one flat buffer and all-reduced with one call;
//! * overlap without autograd hooks: candle has none, and `backward()` enqueues the whole backward
//!   pass at once. The step therefore enqueues it one layer at a time (`src/layerwise.rs`), last
//!   layer first; after each layer it records an event on candle's stream — "this layer's
//!   gradients are written" — and the communication stream waits for that event, then copies and
//!   all-reduces every bucket that layer completed. The last layers' buckets travel while the GPU
//!   still computes the first layers' gradients. The event is needed: cudarc's per-buffer events
//!   (which the copies and the `nccl` calls honour) see candle's *reads* but not the kernels that
//!   write a tensor (candle passes a kernel's output to cudarc as a shared reference), so without
//!   it the copy of a gradient does not wait for candle to write it. The other way round, the copy
//!   back into a gradient records its write event, and an event on the communication stream makes
//!   candle's stream wait for the last copy before the optimizer. No `synchronize()` orders anything;
//! * measuring it: CUDA events on both streams give the step time, the communication time and the
//!   share of communication hidden behind compute (`src/timeline.rs`); the run ends with the
//!   overlap figure: the same step with bucketed, overlapped all-reduces beside one all-reduce of
//!   all gradients after the whole backward pass.
//!
//! What it checks:
//! * after training, every rank's parameters are **bitwise identical** to rank 0's;
//! * the loss curve equals the same model's trained on one GPU with the global batch (rank 0
//!   trains that reference at the end, on its GPU) within `model::loss_tolerance` at every logged
//!   step: 1e-3 relative with several ranks (see its documentation for why not 0), 1e-6 with one
//!   rank, where both runs do the same arithmetic and agree exactly.
//!
//! How to run it:
//! * 2 GPUs: `cargo run --release --example 17-candle-data-parallel -- --nproc 2` (in
//!   `candle-lessons/`; `./dev.sh setup` installs what candle needs to build), or under
//!   `mpirun -np 2` / torchrun-style variables, like lesson 2;
//! * 1 GPU, 1 rank: `--nproc 1` (the losses then equal the reference's exactly);
//! * 1 GPU, 2 ranks: `--nproc 2 --split-hosts`. Each rank sets its own `NCCL_HOSTID`, so NCCL takes
//!   the two processes for two machines and connects them over sockets (NCCL refuses two ranks on
//!   one GPU of one host). By hand: two shells with `NCCL_HOSTID=a` / `NCCL_HOSTID=b` and the
//!   torchrun-style variables of lesson 2;
//! * the reference alone: `--reference [--ranks 2]` (one process, no NCCL: the single-GPU run
//!   with the global batch of that many ranks), printing its losses;
//! * sizes: `--dim 1024 --layers 4 --batch 4096 --steps 200 --log-every 10 --lr 1e-3`, buckets
//!   `--bucket-mib 25 --first-bucket-mib 1`, `--overlap-steps 20`; `--no-reference` skips the
//!   comparison.
//!
//! What you should see (rank 0): the bucket layout; every 10 steps the global loss, step time,
//! communication time and hidden share; `parameters bitwise identical` on every rank; the overlap
//! table (bucketed: a sizeable share hidden, the step shorter; after-backward: about 0 % hidden);
//! the loss table beside the single-GPU run, and `losses agree`. Non-zero exit status otherwise.

use candle_core::{Tensor, Var};
use candle_nn::Optimizer;
use cudarc::driver::CudaSlice;
use gpucomm_candle_lessons::buckets::{self, CAP_BYTES, FIRST_CAP_BYTES};
use gpucomm_candle_lessons::layerwise;
use gpucomm_candle_lessons::model::{self, Config, Task};
use gpucomm_candle_lessons::setup::{self, Flags, Gpu};
use gpucomm_candle_lessons::tensor::{bits, copy_into, with_slice, with_slice_mut};
use gpucomm_candle_lessons::timeline::{Kind, StepTimes, Timeline};
use gpucomm_candle_lessons::BoxError;
use nccl::launch::run_main;
use nccl::{Collectives, Comm, DeviceBuffer, ReduceOp, Root};

/// How gradients are averaged in a step.
#[derive(Clone, Copy, PartialEq)]
enum Sync {
    /// DDP: buckets in reverse layer order, each as soon as its gradients are written.
    Buckets,
    /// One all-reduce of every gradient, after the whole backward pass.
    AfterBackward,
}

/// A bucket: which parameters (index, offset in the flat buffer, length), the flat buffer, and the
/// layer whose backward pass completes it.
struct Bucket {
    members: Vec<(usize, usize, usize)>,
    flat: CudaSlice<f32>,
    ready_after: usize,
}

impl Bucket {
    fn new(gpu: &Gpu, params: &[Var], indices: &[usize]) -> Result<Self, BoxError> {
        let mut members = Vec::new();
        let mut offset = 0;
        for &i in indices {
            let len = params[i].elem_count();
            members.push((i, offset, len));
            offset += len;
        }
        // Parameter i belongs to layer i / 2 (`w0, b0, w1, b1, …`).
        let ready_after = buckets::ready_after(indices, |i| i / 2).ok_or("an empty bucket")?;
        Ok(Bucket { members, flat: gpu.comm.alloc_zeros::<f32>(offset)?, ready_after })
    }

    /// Copies the members' gradients in, averages the bucket across ranks, copies the results
    /// back, all on the communication stream. The caller has made that stream wait for the event
    /// after the layer that completed the bucket: candle records no write event for its gradients.
    fn all_reduce(
        &mut self,
        gpu: &Gpu,
        comm: &Comm,
        params: &[Var],
        grads: &candle_core::backprop::GradStore,
        timeline: &mut Timeline,
    ) -> Result<(), BoxError> {
        let grad = |i: usize| grads.get(&params[i]).ok_or_else(|| format!("no gradient for parameter {i}"));
        for &(i, offset, len) in &self.members {
            let mut dst = self.flat.slice_mut(offset..offset + len);
            with_slice(grad(i)?, |src| Ok(gpu.comm.memcpy_dtod(&src, &mut dst)?))?;
        }
        timeline.span(Kind::Comm, &gpu.comm, || Ok(comm.all_reduce_in_place(&mut self.flat, ReduceOp::AVG)?))?;
        for &(i, offset, len) in &self.members {
            copy_into(&gpu.comm, &self.flat.slice(offset..offset + len), grad(i)?)?;
        }
        Ok(())
    }
}

/// One rank's training state.
struct Trainer<'a> {
    gpu: &'a Gpu,
    comm: &'a Comm,
    task: Task,
    /// `w0, b0, w1, b1, …` (forward order).
    params: Vec<Var>,
    opt: candle_nn::AdamW,
    buckets: Vec<Bucket>,
    /// Every gradient in one buffer, for [`Sync::AfterBackward`].
    everything: Bucket,
}

impl<'a> Trainer<'a> {
    fn new(gpu: &'a Gpu, comm: &'a Comm, config: Config, flags: &Flags) -> Result<Self, BoxError> {
        let mut params = Vec::new();
        for l in 0..config.layers {
            let flat = model::initial_layer(&gpu.device, &config, l, comm.rank())?;
            let (w, b) = model::split_layer(&flat, config.dim)?;
            params.push(Var::from_tensor(&w.contiguous()?)?);
            params.push(Var::from_tensor(&b.contiguous()?)?);
        }
        // Every rank starts from rank 0's parameters: a broadcast into each parameter's storage,
        // on the communication stream once candle's stream has written them (an explicit event:
        // candle records no write event for its kernels' outputs), and candle's stream waits for
        // the broadcasts before it uses them.
        gpu.comm.wait(&gpu.compute.record_event(None)?)?;
        for p in &params {
            with_slice_mut(p.as_tensor(), |buf| Ok(comm.broadcast_in_place(buf, 0)?))?;
        }
        gpu.compute.wait(&gpu.comm.record_event(None)?)?;
        // Gradients become ready last layer first: bucket the parameters in reverse order.
        let ready: Vec<usize> = (0..params.len()).rev().collect();
        let bytes: Vec<usize> = ready.iter().map(|&i| params[i].elem_count() * 4).collect();
        let mib = |name, default: usize| flags.get(name, default >> 20).map(|m: usize| m << 20);
        let layout =
            buckets::assign(&bytes, mib("--first-bucket-mib", FIRST_CAP_BYTES)?, mib("--bucket-mib", CAP_BYTES)?);
        let mut list = Vec::new();
        for bucket in &layout {
            let indices: Vec<usize> = bucket.iter().map(|&k| ready[k]).collect();
            list.push(Bucket::new(gpu, &params, &indices)?);
        }
        if comm.rank() == 0 {
            println!("{} parameters in {} buckets (reverse layer order):", config.parameters(), list.len());
            for (k, b) in list.iter().enumerate() {
                let names: Vec<String> =
                    b.members.iter().map(|&(i, _, _)| format!("{}{}", ["w", "b"][i % 2], i / 2)).collect();
                println!("  bucket {k}: {:.2} MiB: {}", b.flat.len() as f64 * 4.0 / (1 << 20) as f64, names.join(" "));
            }
        }
        let everything = Bucket::new(gpu, &params, &ready)?;
        let opt = model::optimizer(params.clone(), &config)?;
        Ok(Trainer { gpu, comm, task: Task::new(&gpu.device, config)?, params, opt, buckets: list, everything })
    }

    /// One training step; returns this rank's loss (a one-element tensor) and the step's times.
    fn step(&mut self, step: usize, sync: Sync) -> Result<(Tensor, StepTimes), BoxError> {
        let gpu = self.gpu;
        let (x, y) = self.task.batch(step, self.comm.rank(), self.comm.size())?;
        let mut timeline = Timeline::start(&gpu.compute)?;
        // Forward and backward: enqueued on candle's stream, the backward pass one layer at a time,
        // long before the GPU has run what was enqueued.
        timeline.open(Kind::Compute, &gpu.compute)?;
        let pass = layerwise::forward(&x, &y, &self.params)?;
        let buckets = match sync {
            // DDP: each bucket right after the layer that completes it.
            Sync::Buckets => &mut self.buckets[..],
            // One bucket of everything, completed by layer 0: after the whole backward pass.
            Sync::AfterBackward => std::slice::from_mut(&mut self.everything),
        };
        let (params, comm) = (&self.params, self.comm);
        let grads = pass.backward(|layer, grads| {
            let mut ready = buckets.iter_mut().filter(|b| b.ready_after == layer).peekable();
            if ready.peek().is_some() {
                // Everything enqueued on candle's stream so far — this layer's gradients included —
                // comes before this event; the communication stream starts once it has passed.
                gpu.comm.wait(&gpu.compute.record_event(None)?)?;
                for bucket in ready {
                    bucket.all_reduce(gpu, comm, params, grads, &mut timeline)?;
                }
            }
            Ok(())
        })?;
        timeline.close(&gpu.compute)?;
        // AdamW reads the averaged gradients: candle's stream waits for the last copy back.
        gpu.compute.wait(&gpu.comm.record_event(None)?)?;
        self.opt.step(&grads)?;
        let times = timeline.finish(&[&gpu.compute, &gpu.comm])?;
        Ok((pass.loss().clone(), times))
    }

    /// The loss averaged over ranks (the loss of the global batch).
    fn global_loss(&self, loss: &Tensor) -> Result<f32, BoxError> {
        let mut out = self.gpu.comm.alloc_zeros::<f32>(1)?;
        self.gpu.comm.wait(&self.gpu.compute.record_event(None)?)?;
        with_slice(loss, |l| Ok(self.comm.all_reduce(&l, &mut out, ReduceOp::AVG)?))?;
        Ok(self.gpu.comm.clone_dtoh(&out)?[0])
    }

    /// Compares every parameter with rank 0's, bit for bit; returns the number of differing elements.
    fn differing_from_rank0(&self) -> Result<usize, BoxError> {
        let mut differ = 0;
        self.gpu.comm.wait(&self.gpu.compute.record_event(None)?)?;
        for p in &self.params {
            let mut theirs = self.gpu.comm.alloc_zeros::<f32>(p.elem_count())?;
            with_slice(p.as_tensor(), |mine| {
                let root =
                    if self.comm.rank() == 0 { Root::Here(&mine as &dyn DeviceBuffer<f32>) } else { Root::Rank(0) };
                Ok(self.comm.broadcast(root, &mut theirs)?)
            })?;
            let theirs: Vec<u32> = self.gpu.comm.clone_dtoh(&theirs)?.into_iter().map(f32::to_bits).collect();
            differ += bits(p.as_tensor())?.iter().zip(&theirs).filter(|(a, b)| a != b).count();
        }
        Ok(differ)
    }
}

fn main() -> std::process::ExitCode {
    run_main(|info| {
        let flags = Flags::from_env();
        // 4096 rows per rank: enough that the GPU, not candle's host code, sets the pace of a step
        // (otherwise the backward pass is over on the GPU by the time `backward()` returns, and
        // nothing is left to overlap).
        let config = Config::from_flags(&flags, 4096)?;
        if flags.has("--reference") {
            let gpu = Gpu::open(info.device_ordinal(gpucomm_examples::cuda_devices()?)?)?;
            let ranks = flags.get("--ranks", 2)?;
            println!("reference: one GPU, global batch {} × {ranks} rows", config.batch);
            for (step, loss) in model::train_reference(&gpu.device, &config, ranks)? {
                println!("step {step:4}  loss {loss:.6}");
            }
            return Ok(());
        }
        setup::split_hosts(&flags, &info);
        let (gpu, comm) = setup::rank_gpu_comm(&info)?;
        setup::banner("lesson 17 (data-parallel)", &comm)?;
        let mut trainer = Trainer::new(&gpu, &comm, config, &flags)?;
        let rank0 = comm.rank() == 0;

        let mut losses = Vec::new();
        for step in 0..config.steps {
            let (loss, times) = trainer.step(step, Sync::Buckets)?;
            if config.logs(step) {
                let global = trainer.global_loss(&loss)?;
                losses.push((step, global));
                if rank0 {
                    println!("step {step:4}  loss {global:.6}  {times}");
                }
            }
        }

        let differ = trainer.differing_from_rank0()?;
        if differ != 0 {
            return Err(format!("rank {}: {differ} parameter elements differ from rank 0's", comm.rank()).into());
        }
        println!("rank {}: parameters bitwise identical to rank 0's ({} elements)", comm.rank(), config.parameters());

        // The overlap figure: the two ways of averaging, interleaved step by step.
        let n: usize = flags.get("--overlap-steps", 20)?;
        let (mut bucketed, mut after) = (Vec::new(), Vec::new());
        for i in 0..2 * n {
            let sync = if i % 2 == 0 { Sync::Buckets } else { Sync::AfterBackward };
            let (_, times) = trainer.step(config.steps + i, sync)?;
            if sync == Sync::Buckets {
                bucketed.push(times)
            } else {
                after.push(times)
            }
        }
        if rank0 {
            let (b, a) = (StepTimes::median(&bucketed), StepTimes::median(&after));
            println!("\noverlap figure (medians of {n} steps each, {} ranks):", comm.size());
            println!("| gradient all-reduce | step (ms) | communication (ms) | hidden behind compute |");
            println!("|---|---:|---:|---:|");
            let row = |name: &str, t: &StepTimes| {
                println!("| {name} | {:.3} | {:.3} | {:.0} % |", t.step_ms, t.comm_ms, 100.0 * t.hidden_share())
            };
            row(&format!("{} buckets, reverse layer order, right after backward()", trainer.buckets.len()), &b);
            row("one all-reduce after the whole backward pass", &a);
        }
        // The overlap steps trained too (both ways of averaging): still bitwise identical.
        let differ = trainer.differing_from_rank0()?;
        if differ != 0 {
            return Err(format!(
                "rank {}: after the overlap steps {differ} parameter elements differ from rank 0's",
                comm.rank()
            )
            .into());
        }
        drop(trainer);
        comm.finalize().map_err(|(_, e)| e)?;

        if rank0 && !flags.has("--no-reference") {
            println!(
                "\nthe same model trained on one GPU with the global batch ({} rows):",
                config.batch * info.world_size
            );
            let reference = model::train_reference(&gpu.device, &config, info.world_size)?;
            model::compare_losses(&losses, &reference, info.world_size)?;
        }
        Ok(())
    })
}
