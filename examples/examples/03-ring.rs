//! # Lesson 3 — point to point: passing blocks around a ring
//!
//! What it teaches:
//! * `send` and `recv` move a buffer between two ranks; the receiver names the sender and posts a
//!   buffer of the same length and type;
//! * a rank that sends to its right neighbour and receives from its left one must issue both in
//!   one [`nccl::group`]: each send waits for its matching receive, so on their own they would wait
//!   for each other forever;
//! * in a ring of N ranks, N − 1 such steps bring every rank's block to every other rank — the
//!   data movement of a ring all-gather, done by hand (NCCL's own collectives are built from the
//!   same steps).
//!
//! How to run it (any number of GPUs ≥ 2, one process each):
//! `cargo run -p examples --example 03-ring -- --nproc 2` (or with `mpirun -np N`, or the
//! launcher variables of lesson 2).
//!
//! What you should see, once per rank: `rank r of N: after N−1 steps around the ring this rank
//! has seen every block, in order r−1, r−2, …`, and a non-zero exit status if any block arrived
//! wrong.

use nccl::launch::run_main;
use nccl::Collectives;

/// Elements per block: an odd number, nothing special about it.
const COUNT: usize = 100_003;

/// The block rank `r` starts with: every element is `r × 1000 + 7`.
fn block_of(rank: usize) -> f32 {
    (rank * 1000 + 7) as f32
}

fn main() -> std::process::ExitCode {
    run_main(|info| {
        // One rank would pass trivially (nothing to pass round, or to average): refused, clearly.
        gpucomm_examples::require_ranks(&info, 2)?;
        let (stream, comm) = gpucomm_examples::rank_comm(&info)?;
        let (rank, size) = (comm.rank(), comm.size());
        let (right, left) = ((rank + 1) % size, (rank + size - 1) % size);

        // What this rank holds now, and where the next block arrives.
        let mut holding = stream.clone_htod(&vec![block_of(rank); COUNT])?;
        let mut arriving = stream.alloc_zeros::<f32>(COUNT)?;
        let mut seen = Vec::new();
        for step in 1..size {
            // Send what we hold to the right while receiving from the left: one group, so NCCL
            // starts both together. The buffers stay borrowed until the group has been launched.
            nccl::group(|g| {
                let me = g.with(&comm);
                me.send(&holding, right)?;
                me.recv(&mut arriving, left)?;
                Ok(())
            })?;
            std::mem::swap(&mut holding, &mut arriving);

            // After `step` steps the block that started `step` ranks to the left is here.
            let from = (rank + size - step) % size;
            let host = stream.clone_dtoh(&holding)?;
            if let Some((i, v)) = host.iter().enumerate().find(|(_, &v)| v != block_of(from)) {
                return Err(
                    format!("rank {rank}, step {step}: element {i} is {v}, expected rank {from}'s block").into()
                );
            }
            seen.push(from.to_string());
        }
        println!(
            "rank {rank} of {size}: after {} steps around the ring this rank has seen every block, in order {}",
            size - 1,
            seen.join(", ")
        );
        comm.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}
