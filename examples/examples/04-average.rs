//! # Lesson 4 — averaging gradients: `ReduceOp::AVG` and a custom PreMulSum operator
//!
//! What it teaches:
//! * data-parallel training averages each rank's gradients: an all-reduce that divides the sum by
//!   the number of ranks. NCCL does it with [`nccl::ReduceOp::AVG`];
//! * NCCL can also build an operator for it: [`nccl::PreMulSum`] multiplies every input by a
//!   scalar, then sums. With the scalar `1 / N` it averages; with other scalars it weights ranks
//!   differently (gradient accumulation, loss scaling). The scalar can live on the host (read
//!   once) or on the GPU (read by every collective that uses the operator, so a kernel can
//!   compute it without a copy to the host);
//! * a custom operator belongs to the communicator that created it — this crate ties the two
//!   together, and the element type is part of the operator's type;
//! * [`nccl::MemBuffer`]: memory from NCCL's own allocator, the buffer type this crate
//!   recommends for communication (see its documentation).
//!
//! How to run it (any number of GPUs ≥ 2, one process each):
//! `cargo run -p examples --example 04-average -- --nproc 2`.
//!
//! What you should see, once per rank: the three averages (AVG, PreMulSum with a host scalar,
//! PreMulSum with a device scalar), equal, and a non-zero exit status if they are not.

use nccl::launch::run_main;
use nccl::{Collectives, MemBuffer, PreMulSum, ReduceOp};

/// Gradient elements per rank.
const COUNT: usize = 1 << 20;

/// Rank `r`'s gradient at index `i`: small integers, so the sums are exact.
fn gradient(rank: usize, i: usize) -> f32 {
    ((rank + 1) * (1 + i % 4)) as f32
}

fn main() -> std::process::ExitCode {
    run_main(|info| {
        // One rank would pass trivially (nothing to pass round, or to average): refused, clearly.
        gpucomm_examples::require_ranks(&info, 2)?;
        let (stream, comm) = gpucomm_examples::rank_comm(&info)?;
        let (rank, size) = (comm.rank(), comm.size());
        let grads: Vec<f32> = (0..COUNT).map(|i| gradient(rank, i)).collect();
        // The mean over ranks of `(r + 1) × k` is `(size + 1) / 2 × k`.
        let expected = |i: usize| (size + 1) as f32 / 2.0 * (1 + i % 4) as f32;

        // 1. NCCL's average.
        let mut by_avg = MemBuffer::from_host(&stream, &grads)?;
        comm.all_reduce_in_place(&mut by_avg, ReduceOp::AVG)?;

        // 2. Pre-multiply by 1/N on the way in, then sum: the same average, by a custom operator.
        let mut by_host_scalar = MemBuffer::from_host(&stream, &grads)?;
        let one_over_n = PreMulSum::host(&comm, 1.0 / size as f32)?;
        comm.all_reduce_in_place(&mut by_host_scalar, &one_over_n)?;

        // 3. The same scalar, read from GPU memory while the all-reduce runs.
        let scalar = MemBuffer::from_host(&stream, &[1.0 / size as f32])?;
        let on_device = PreMulSum::device(&comm, &scalar)?;
        let mut by_device_scalar = MemBuffer::from_host(&stream, &grads)?;
        comm.all_reduce_in_place(&mut by_device_scalar, &on_device)?;

        let results = [
            ("AVG", &by_avg),
            ("PreMulSum, host scalar", &by_host_scalar),
            ("PreMulSum, device scalar", &by_device_scalar),
        ];
        for (how, buf) in results {
            let host = stream.clone_dtoh(buf)?;
            // 1/N is inexact unless N is a power of two: allow float rounding.
            // A NaN is wrong too (it compares false with everything, so `>` alone would pass it).
            let off = |i: usize, v: f32| (v - expected(i)).abs();
            let wrong = host.iter().enumerate().find(|&(i, &v)| off(i, v).is_nan() || off(i, v) > 1e-5 * expected(i));
            if let Some((i, v)) = wrong {
                return Err(format!("rank {rank}, {how}: element {i} is {v}, expected {}", expected(i)).into());
            }
            println!(
                "rank {rank} of {size}: average by {how:<25} first elements {:?} (expected {:?})",
                &host[..4],
                [expected(0), expected(1), expected(2), expected(3)]
            );
        }

        // Operators go before their communicator (the borrow checker insists).
        drop(on_device);
        drop(one_over_n);
        comm.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}
