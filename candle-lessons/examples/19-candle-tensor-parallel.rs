//! # Lesson 19 — tensor-parallel inference with candle: column- then row-parallel MLP, one all-reduce per block
//!
//! What it teaches:
//! * tensor parallelism splits each weight matrix across the ranks instead of the batch. In a
//!   transformer's MLP block `y = x + gelu(x·W1)·W2`, `W1` is split by **columns** (rank `r` holds
//!   `hidden/n` of them) and `W2` by **rows** (the matching `hidden/n` rows): each rank computes
//!   `gelu(x·W1_r)·W2_r` from the whole input without talking to anyone — `gelu` works element
//!   by element, so the column split needs no communication — and the block's output is the **sum
//!   over ranks** of these partial products: one all-reduce per block, nothing else (Megatron-LM's
//!   layout);
//! * decoding moves small messages (`tokens × dim` values per block: 64 KiB with the defaults),
//!   where an all-reduce's latency, not bandwidth, counts. The gpucomm-kernels crate's one-shot
//!   kernel over NCCL's device API (`gpucomm-kernels/cu/lsa_allreduce.cu`, the production form of lesson
//!   12's, used through `examples/src/lsa.rs`) does it in one launch with one barrier, reading the peers'
//!   partial sums straight over NVLink; candle's tensors go to it as they are (`src/tensor.rs`).
//!   It needs every rank to reach every other by loads and stores (one NVLink domain); otherwise
//!   (ranks on different machines, or two ranks sharing one GPU through sockets) the lesson falls
//!   back to `ncclAllReduce` and says so;
//! * hiding the all-reduce: two micro-batches take turns, so that while one micro-batch's partial
//!   sums travel on the communication stream, candle's stream computes the other's (ordered by
//!   events: `CudaStream::wait`, no `synchronize()`). Events on both streams measure step time,
//!   communication time and the share hidden behind compute.
//!
//! What it checks: every decode step's output equals the same blocks computed on one GPU with the
//! whole matrices, within 1e-4 of the output's largest magnitude. Why not exactly: with the whole
//! matrices each output value is one f32 sum of `hidden` products; here it is `n` partial sums
//! added afterwards, a different order of additions (about 1e-7 relative each, ~1e-6 over the
//! `hidden` = 8192 terms, growing mildly through the blocks' residuals). A wrong shard, a missing
//! rank or a stale buffer is off by the size of the values themselves.
//!
//! How to run it: as lesson 17 (`--nproc 2`; one GPU: `--nproc 1`, whose one-rank LSA kernel still
//! runs, or `--nproc 2 --split-hosts`, which shows the fallback). Sizes: `--dim 2048 --hidden 8192
//! --blocks 4 --tokens 8 --steps 50 --log-every 10`; `--nccl` forces `ncclAllReduce`.
//!
//! What you should see (rank 0): which all-reduce ran (`LSA one-shot kernel` or `ncclAllReduce`
//! and why), every 10 steps the first output values, the largest difference from the single-GPU
//! blocks, step time, communication time and hidden share; `outputs agree` on every rank.

use candle_core::{Device, Tensor};
use cudarc::driver::{CudaEvent, CudaSlice};
use gpucomm_candle_lessons::model::worse;
use gpucomm_candle_lessons::setup::{self, Flags, Gpu};
use gpucomm_candle_lessons::tensor::{from_slice, with_slice};
use gpucomm_candle_lessons::timeline::{Kind, StepTimes, Timeline};
use gpucomm_candle_lessons::BoxError;
use gpucomm_examples::lsa::LsaAllReduce;
use nccl::launch::run_main;
use nccl::{Collectives, Comm, ReduceOp};

/// How close the tensor-parallel output must be to the single-GPU one, relative to its largest
/// magnitude (see the header).
const TOLERANCE: f32 = 1e-4;
/// Micro-batches in flight.
const MICRO_BATCHES: usize = 2;
const WEIGHT_SEED: u64 = 10;
const INPUT_SEED: u64 = 2_000_000;

/// One MLP block: this rank's shards, and (for the check) the whole matrices.
struct Block {
    w1: Tensor,
    w2: Tensor,
    full_w1: Tensor,
    full_w2: Tensor,
}

impl Block {
    /// Block `k`: every rank draws the same whole matrices and keeps its columns of `W1` and rows
    /// of `W2`.
    fn new(device: &Device, k: usize, dim: usize, hidden: usize, rank: usize, n: usize) -> Result<Self, BoxError> {
        device.set_seed(WEIGHT_SEED + k as u64)?;
        let full_w1 = Tensor::randn(0f32, 1.0 / (dim as f32).sqrt(), (dim, hidden), device)?;
        let full_w2 = Tensor::randn(0f32, 1.0 / (hidden as f32).sqrt(), (hidden, dim), device)?;
        let part = hidden / n;
        let w1 = full_w1.narrow(1, rank * part, part)?.contiguous()?;
        let w2 = full_w2.narrow(0, rank * part, part)?.contiguous()?;
        Ok(Block { w1, w2, full_w1, full_w2 })
    }

    /// This rank's partial output `gelu(x·W1_r)·W2_r`.
    fn partial(&self, x: &Tensor) -> Result<Tensor, BoxError> {
        Ok(x.matmul(&self.w1)?.gelu()?.matmul(&self.w2)?.contiguous()?)
    }

    /// The whole block on one GPU: `x + gelu(x·W1)·W2`.
    fn reference(&self, x: &Tensor) -> Result<Tensor, BoxError> {
        Ok((x + x.matmul(&self.full_w1)?.gelu()?.matmul(&self.full_w2)?)?)
    }
}

/// The all-reduce of partial outputs: the LSA one-shot kernel, or NCCL's.
enum AllReduce<'c> {
    Lsa(Box<LsaAllReduce<'c>>),
    Nccl(&'c Comm),
}

impl AllReduce<'_> {
    /// Sums `partial` over the ranks into a new buffer, on the communication stream.
    fn sum(&self, gpu: &Gpu, partial: &Tensor) -> Result<CudaSlice<f32>, BoxError> {
        let mut out = gpu.comm.alloc_zeros::<f32>(partial.elem_count())?;
        with_slice(partial, |p| match self {
            AllReduce::Lsa(lsa) => lsa.one_shot(&gpu.comm, &p, &mut out),
            AllReduce::Nccl(comm) => Ok(comm.all_reduce(&p, &mut out, ReduceOp::SUM)?),
        })?;
        Ok(out)
    }
}

/// A micro-batch between blocks: its input, and the all-reduce of the last block's partial
/// output still to be added (with the event that says it has arrived).
struct InFlight {
    x: Tensor,
    sum: Option<(CudaSlice<f32>, CudaEvent)>,
}

impl InFlight {
    /// Adds the arrived sum to the input (the block's residual): candle's stream first waits for it.
    fn settle(&mut self, gpu: &Gpu) -> Result<(), BoxError> {
        if let Some((sum, arrived)) = self.sum.take() {
            gpu.compute.wait(&arrived)?;
            let shape = self.x.shape().clone();
            self.x = (&self.x + from_slice(sum, &gpu.cuda, false).reshape(shape)?)?;
        }
        Ok(())
    }
}

fn main() -> std::process::ExitCode {
    run_main(|info| {
        let flags = Flags::from_env();
        let dim: usize = flags.get("--dim", 2048)?;
        let hidden: usize = flags.get("--hidden", 8192)?;
        let nblocks: usize = flags.get("--blocks", 4)?;
        let tokens: usize = flags.get("--tokens", 8)?;
        let steps: usize = flags.get("--steps", 50)?;
        let log_every: usize = flags.get("--log-every", 10)?;
        // Refused before any GPU work: with a zero the check below would compare nothing and
        // still report agreement.
        let sizes = [
            ("--dim", dim),
            ("--hidden", hidden),
            ("--blocks", nblocks),
            ("--tokens", tokens),
            ("--steps", steps),
            ("--log-every", log_every),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, value)| *value == 0) {
            return Err(format!("{name} 0: every size must be positive (nothing would be compared)").into());
        }
        if hidden % info.world_size != 0 {
            return Err(format!("--hidden {hidden} must be a multiple of the {} ranks", info.world_size).into());
        }
        setup::split_hosts(&flags, &info);
        let (gpu, comm) = setup::rank_gpu_comm(&info)?;
        setup::banner("lesson 19 (tensor-parallel inference)", &comm)?;
        let (rank, n) = (comm.rank(), comm.size());
        let blocks =
            (0..nblocks).map(|k| Block::new(&gpu.device, k, dim, hidden, rank, n)).collect::<Result<Vec<_>, _>>()?;

        let message = tokens * dim * size_of::<f32>();
        let all_reduce = if flags.has("--nccl") {
            AllReduce::Nccl(&comm)
        } else {
            match LsaAllReduce::new(&comm, message) {
                Ok(lsa) => AllReduce::Lsa(Box::new(lsa)),
                Err(why) => {
                    if rank == 0 {
                        println!("the LSA kernel cannot run here ({why}): falling back to ncclAllReduce");
                    }
                    AllReduce::Nccl(&comm)
                }
            }
        };
        if rank == 0 {
            let path = match all_reduce {
                AllReduce::Lsa(_) => "the LSA one-shot kernel (gpucomm-kernels)",
                AllReduce::Nccl(_) => "ncclAllReduce",
            };
            println!("{nblocks} blocks {dim} → {hidden} → {dim} split over {n} ranks; {tokens} tokens per micro-batch, {MICRO_BATCHES} micro-batches; all-reduce of {} KiB per block and micro-batch by {path}", message >> 10);
        }

        let mut worst = 0f32;
        let mut times = Vec::new();
        for step in 0..steps {
            let inputs = (0..MICRO_BATCHES)
                .map(|m| {
                    gpu.device.set_seed(INPUT_SEED + (step * MICRO_BATCHES + m) as u64)?;
                    Ok(Tensor::randn(0f32, 1.0, (tokens, dim), &gpu.device)?)
                })
                .collect::<Result<Vec<_>, BoxError>>()?;
            let mut flight: Vec<InFlight> = inputs.iter().map(|x| InFlight { x: x.clone(), sum: None }).collect();
            let mut timeline = Timeline::start(&gpu.compute)?;
            for block in &blocks {
                for mb in flight.iter_mut() {
                    mb.settle(&gpu)?;
                    let partial = timeline.span(Kind::Compute, &gpu.compute, || block.partial(&mb.x))?;
                    // The communication stream waits for the partial output, then sums it.
                    gpu.comm.wait(&gpu.compute.record_event(None)?)?;
                    let sum = timeline.span(Kind::Comm, &gpu.comm, || all_reduce.sum(&gpu, &partial))?;
                    mb.sum = Some((sum, gpu.comm.record_event(None)?));
                }
            }
            for mb in flight.iter_mut() {
                // Wait before the span opens, so that it times the addition, not the wait.
                if let Some((_, arrived)) = &mb.sum {
                    gpu.compute.wait(arrived)?;
                }
                timeline.span(Kind::Compute, &gpu.compute, || mb.settle(&gpu))?;
            }
            let t = timeline.finish(&[&gpu.compute, &gpu.comm])?;
            times.push(t);

            // The check, outside the timed step: the same blocks on one GPU, whole matrices.
            let mut step_worst = 0f32;
            for (mb, x) in flight.iter().zip(&inputs) {
                let mut expected = x.clone();
                for block in &blocks {
                    expected = block.reference(&expected)?;
                }
                let scale = expected.abs()?.max_all()?.to_scalar::<f32>()?;
                let diff = (&mb.x - &expected)?.abs()?.max_all()?.to_scalar::<f32>()? / scale.max(f32::MIN_POSITIVE);
                step_worst = worse(step_worst, diff);
            }
            worst = worse(worst, step_worst);
            if rank == 0 && (step % log_every == 0 || step + 1 == steps) {
                let first: Vec<f32> = flight[0].x.narrow(0, 0, 1)?.narrow(1, 0, 4)?.flatten_all()?.to_vec1()?;
                println!("step {step:3}  output[0, ..4] {first:.4?}  max difference {step_worst:.1e}  {t}");
            }
        }
        if worst.is_nan() || worst > TOLERANCE {
            return Err(format!("rank {rank}: outputs differ from the single-GPU blocks by {worst:.1e} (relative), more than {TOLERANCE:.0e}").into());
        }
        let median = StepTimes::median(&times);
        println!("rank {rank}: outputs agree with the single-GPU blocks (largest difference {worst:.1e} ≤ {TOLERANCE:.0e}); median {median}");
        drop(all_reduce);
        comm.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}
