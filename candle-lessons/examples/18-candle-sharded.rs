//! # Lesson 18 — sharded training with candle (ZeRO-3 / FSDP): all-gather before use, reduce-scatter after
//!
//! What it teaches:
//! * sharding: no rank holds the whole model. Each layer's parameters (weights and bias, one flat
//!   vector, zero-padded to a multiple of the number of ranks) are cut into one shard per rank;
//!   rank `r` keeps shard `r`, and the optimizer (AdamW) keeps its state for that shard only —
//!   `1/n` of the parameters, gradients and optimizer state per GPU;
//! * forward: each layer's full parameters are assembled with `all_gather` just before the layer
//!   runs, the **next** layer's gather is issued before this layer computes (prefetch: it travels
//!   on the communication stream meanwhile), and the gathered copy is dropped right after use — at
//!   most two gathered layers are alive, as in PyTorch's FSDP;
//! * backward without autograd hooks: candle computes gradients for a whole graph at once, so the
//!   lesson runs the backward pass layer by layer itself: re-gather the layer (prefetching the one
//!   below), recompute its forward from the saved input, and ask candle for the layer's
//!   vector-Jacobian product (`(y · ∂L/∂y).sum().backward()`), which gives the layer's full flat
//!   gradient and the gradient of its input. The flat gradient goes straight into `reduce_scatter`
//!   (`ReduceOp::AVG`): each rank receives the averaged gradient of its own shard, while the GPU
//!   computes the next layer's backward;
//! * ordering by events: candle's stream waits for a gather with `CudaStream::wait` on the event
//!   recorded after it; the reduce-scatter waits for the layer's backward the same way; buffers
//!   move between the streams with their cudarc events (the crates' stream ordering). No
//!   `synchronize()` orders anything;
//! * the price: every layer's parameters cross the network three times per step (two gathers, one
//!   reduce-scatter) instead of twice for data parallelism's all-reduce, and the forward is
//!   computed twice; what is bought is memory.
//!
//! What it checks: the loss curve equals the same model's trained on one GPU with the global batch
//! (whole parameters, one ordinary `backward()`, AdamW over everything; rank 0 trains it at the
//! end) within `model::loss_tolerance` (1e-3 relative at every logged step, 1e-6 with one rank: the same reasons as in
//! lesson 17 — only the order of f32 additions differs; AdamW works element by element, so its
//! update of a shard is exactly its update of those elements of the whole model).
//!
//! How to run it: as lesson 17 (`--nproc 2`; one GPU: `--nproc 1`, or `--nproc 2 --split-hosts`;
//! `--reference [--ranks 2]` trains only the single-GPU model). Sizes as lesson 17 (`--batch`
//! defaults to 1024 here), `--overlap-steps 10`, `--no-reference`.
//!
//! What you should see (rank 0): the shard sizes; every 10 steps the global loss, step time,
//! communication time and hidden share; a table of the same step with and without prefetching
//! the next layer's gather; the loss table beside the single-GPU run and `losses agree`.

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};
use candle_nn::Optimizer;
use cudarc::driver::{CudaEvent, CudaSlice};
use gpucomm_candle_lessons::model::{self, Config, Task};
use gpucomm_candle_lessons::setup::{self, Flags, Gpu};
use gpucomm_candle_lessons::tensor::{from_slice, with_slice};
use gpucomm_candle_lessons::timeline::{Kind, StepTimes, Timeline};
use gpucomm_candle_lessons::BoxError;
use nccl::launch::run_main;
use nccl::{Collectives, Comm, ReduceOp};

/// A layer's full parameters on their way: the gathered buffer, and the event after the gather.
struct Gathered {
    full: CudaSlice<f32>,
    done: CudaEvent,
}

/// One rank's share of the model and the optimizer.
struct Sharded<'a> {
    gpu: &'a Gpu,
    comm: &'a Comm,
    config: Config,
    task: Task,
    /// Shard `rank` of each layer's padded flat parameters, `shard_len` elements each.
    shards: Vec<Var>,
    shard_len: usize,
    opt: candle_nn::AdamW,
}

impl<'a> Sharded<'a> {
    fn new(gpu: &'a Gpu, comm: &'a Comm, config: Config) -> Result<Self, BoxError> {
        let n = comm.size();
        let shard_len = config.layer_len().div_ceil(n);
        let mut shards = Vec::new();
        for l in 0..config.layers {
            // Every rank draws rank 0's initial parameters (same seed) and keeps its own shard.
            let flat = model::initial_layer(&gpu.device, &config, l, 0)?;
            let pad = Tensor::zeros(shard_len * n - config.layer_len(), DType::F32, &gpu.device)?;
            let padded = Tensor::cat(&[flat, pad], 0)?;
            shards.push(Var::from_tensor(&padded.narrow(0, comm.rank() * shard_len, shard_len)?.contiguous()?)?);
        }
        if comm.rank() == 0 {
            println!(
                "{} parameters; each layer's {} in {n} shards of {shard_len}: {:.2} MiB of parameters per rank",
                config.parameters(),
                config.layer_len(),
                (config.layers * shard_len * 4) as f64 / (1 << 20) as f64
            );
        }
        let opt = model::optimizer(shards.clone(), &config)?;
        Ok(Sharded { gpu, comm, config, task: Task::new(&gpu.device, config)?, shards, shard_len, opt })
    }

    /// Issues the all-gather of layer `l`'s parameters on the communication stream.
    fn gather(&self, l: usize, timeline: &mut Timeline) -> Result<Gathered, BoxError> {
        let comm_stream = &self.gpu.comm;
        let mut full = comm_stream.alloc_zeros::<f32>(self.shard_len * self.comm.size())?;
        timeline.span(Kind::Comm, comm_stream, || {
            with_slice(self.shards[l].as_tensor(), |shard| Ok(self.comm.all_gather(&shard, &mut full)?))
        })?;
        Ok(Gathered { full, done: comm_stream.record_event(None)? })
    }

    /// Candle's stream waits for a gather; the layer's weights and bias as tensors over it
    /// (`variable`: for the backward pass, whose gradient is the flat gradient).
    fn use_gathered(&self, g: Gathered, variable: bool) -> Result<(Tensor, Tensor, Tensor), BoxError> {
        self.gpu.compute.wait(&g.done)?;
        let flat = from_slice(g.full, &self.gpu.cuda, variable);
        let (w, b) = model::split_layer(&flat.narrow(0, 0, self.config.layer_len())?, self.config.dim)?;
        Ok((flat, w, b))
    }

    /// One training step; returns this rank's loss and the step's times.
    fn step(&mut self, step: usize, prefetch: bool) -> Result<(Tensor, StepTimes), BoxError> {
        let (gpu, comm, layers) = (self.gpu, self.comm, self.config.layers);
        let (x, y) = self.task.batch(step, comm.rank(), comm.size())?;
        let mut timeline = Timeline::start(&gpu.compute)?;

        // Forward: gather layer l + 1 while layer l computes; keep only each layer's input.
        let mut inputs = Vec::with_capacity(layers);
        let mut next = Some(self.gather(0, &mut timeline)?);
        let mut h = x;
        for l in 0..layers {
            let current = match next.take() {
                Some(g) => g,
                None => self.gather(l, &mut timeline)?,
            };
            if prefetch && l + 1 < layers {
                next = Some(self.gather(l + 1, &mut timeline)?);
            }
            let (_flat, w, b) = self.use_gathered(current, false)?;
            timeline.open(Kind::Compute, &gpu.compute)?;
            inputs.push(h.clone());
            h = model::layer(&h, &w, &b, l + 1 == layers)?;
            timeline.close(&gpu.compute)?;
            // `_flat`, `w`, `b` are dropped here: the gathered copy is freed (stream-ordered).
        }
        let out = Var::from_tensor(&h)?;
        let loss = model::loss(out.as_tensor(), &y)?;
        let mut grad_h = loss.backward()?.get(out.as_tensor()).ok_or("no gradient for the output")?.clone();

        // Backward, layer by layer from the top: re-gather, recompute, vector-Jacobian product,
        // reduce-scatter the layer's gradient while the next one computes.
        let mut shard_grads = GradStore::default();
        let mut next = Some(self.gather(layers - 1, &mut timeline)?);
        for l in (0..layers).rev() {
            let current = match next.take() {
                Some(g) => g,
                None => self.gather(l, &mut timeline)?,
            };
            if prefetch && l > 0 {
                next = Some(self.gather(l - 1, &mut timeline)?);
            }
            let (flat, w, b) = self.use_gathered(current, true)?;
            timeline.open(Kind::Compute, &gpu.compute)?;
            let input = Var::from_tensor(&inputs[l])?;
            let out = model::layer(input.as_tensor(), &w, &b, l + 1 == layers)?;
            let grads = out.mul(&grad_h)?.sum_all()?.backward()?;
            timeline.close(&gpu.compute)?;
            let flat_grad = grads.get(&flat).ok_or("no gradient for the layer")?;
            // The reduce-scatter starts once this layer's backward kernels are done.
            gpu.comm.wait(&gpu.compute.record_event(None)?)?;
            let mut shard_grad = gpu.comm.alloc_zeros::<f32>(self.shard_len)?;
            timeline.span(Kind::Comm, &gpu.comm, || {
                with_slice(flat_grad, |g| Ok(comm.reduce_scatter(&g, &mut shard_grad, ReduceOp::AVG)?))
            })?;
            shard_grads.insert(self.shards[l].as_tensor(), from_slice(shard_grad, &gpu.cuda, false));
            if l > 0 {
                grad_h = grads.get(input.as_tensor()).ok_or("no gradient for the layer's input")?.clone();
            }
        }
        // AdamW on this rank's shards only; its kernels wait for the reduce-scatters' results.
        self.opt.step(&shard_grads)?;
        let times = timeline.finish(&[&gpu.compute, &gpu.comm])?;
        Ok((loss, times))
    }

    /// The loss averaged over ranks (the loss of the global batch).
    fn global_loss(&self, loss: &Tensor) -> Result<f32, BoxError> {
        // candle wrote the loss on its own stream without a write event (see `tensor.rs`): the
        // communication stream waits for candle's work so far before reading it.
        self.gpu.comm.wait(&self.gpu.compute.record_event(None)?)?;
        let mut out = self.gpu.comm.alloc_zeros::<f32>(1)?;
        with_slice(loss, |l| Ok(self.comm.all_reduce(&l, &mut out, ReduceOp::AVG)?))?;
        Ok(self.gpu.comm.clone_dtoh(&out)?[0])
    }
}

fn main() -> std::process::ExitCode {
    run_main(|info| {
        let flags = Flags::from_env();
        let config = Config::from_flags(&flags, 1024)?;
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
        setup::banner("lesson 18 (sharded)", &comm)?;
        let mut model = Sharded::new(&gpu, &comm, config)?;
        let rank0 = comm.rank() == 0;

        let mut losses = Vec::new();
        for step in 0..config.steps {
            let (loss, times) = model.step(step, true)?;
            if config.logs(step) {
                let global = model.global_loss(&loss)?;
                losses.push((step, global));
                if rank0 {
                    println!("step {step:4}  loss {global:.6}  {times}");
                }
            }
        }

        let n: usize = flags.get("--overlap-steps", 10)?;
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for i in 0..2 * n {
            let prefetch = i % 2 == 0;
            let (_, times) = model.step(config.steps + i, prefetch)?;
            if prefetch {
                with.push(times)
            } else {
                without.push(times)
            }
        }
        if rank0 {
            let (a, b) = (StepTimes::median(&with), StepTimes::median(&without));
            println!("\nprefetching the next layer's gather (medians of {n} steps each, {} ranks):", comm.size());
            println!("| all-gather | step (ms) | communication (ms) | hidden behind compute |");
            println!("|---|---:|---:|---:|");
            println!(
                "| next layer's issued before this layer computes | {:.3} | {:.3} | {:.0} % |",
                a.step_ms,
                a.comm_ms,
                100.0 * a.hidden_share()
            );
            println!(
                "| each layer's issued when it is needed | {:.3} | {:.3} | {:.0} % |",
                b.step_ms,
                b.comm_ms,
                100.0 * b.hidden_share()
            );
        }
        drop(model);
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
