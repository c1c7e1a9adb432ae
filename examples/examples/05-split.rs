//! # Lesson 5 — splitting a communicator into two halves
//!
//! What it teaches:
//! * [`nccl::Comm::split`] makes new communicators out of an existing one: ranks that pass the
//!   same colour end up in the same new communicator, ordered by their key (`None` would keep a
//!   rank out of every new communicator). It is collective: every rank of the parent calls it;
//! * a child is a communicator like any other, with its own ranks `0..k` and collectives that
//!   involve only its members, here on a stream of its own; the parent keeps working;
//! * the job: even and odd world ranks form two halves; each half all-reduces `world rank + 1`
//!   over its members only, then the whole world does the same, and every rank checks both sums.
//!
//! How to run it (any number of GPUs N ≥ 2; with 2, each half has one rank):
//! * `cargo run -p examples --example 05-split -- --nproc 4`
//! * or any launcher of lesson 2 (torchrun-style variables by hand, `mpirun -np N`, `srun`).
//!
//! What you should see, once per rank (here N = 4, under the spawner's `[rank N]` prefix):
//! `world rank 2 of 4 → rank 1 of 2 in the even half: half sum 4 (ranks 0, 2), world sum 10`.

use nccl::launch::run_main;
use nccl::{Collectives, Comm, ReduceOp};

const COUNT: usize = 1 << 16;

fn main() -> std::process::ExitCode {
    run_main(|info| {
        gpucomm_examples::require_ranks(&info, 2)?;
        let (stream, world) = gpucomm_examples::rank_comm(&info)?;
        let (rank, n) = (world.rank(), world.size());

        // Colour = parity, key = world rank: the halves keep the world's order.
        let parity = rank % 2;
        let side = stream.context().new_stream()?;
        let half = world
            .split(Some(parity as u32), rank as i32, None, Some(side.clone()))?
            .ok_or("a rank that passes a colour always gets a communicator")?;
        let members: Vec<usize> = (0..n).filter(|r| r % 2 == parity).collect();
        if (half.rank(), half.size()) != (rank / 2, members.len()) {
            return Err(format!("world rank {rank}: got rank {} of {} in its half", half.rank(), half.size()).into());
        }

        let half_sum = all_reduce(&half, rank)?;
        let expected: usize = members.iter().map(|r| r + 1).sum();
        if half_sum != expected as f32 {
            return Err(format!("world rank {rank}: the half summed to {half_sum}, expected {expected}").into());
        }
        // The parent is untouched by the split.
        let world_sum = all_reduce(&world, rank)?;
        if world_sum != (n * (n + 1) / 2) as f32 {
            return Err(format!("world rank {rank}: the world summed to {world_sum}").into());
        }

        let name = if parity == 0 { "even" } else { "odd" };
        let list = members.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ");
        println!(
            "world rank {rank} of {n} → rank {} of {} in the {name} half: half sum {half_sum} (ranks {list}), \
             world sum {world_sum}",
            half.rank(),
            half.size()
        );
        half.finalize().map_err(|(_, e)| e)?;
        world.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}

/// All-reduces `rank + 1` over `comm` on its stream; returns the sum every element holds.
fn all_reduce(comm: &Comm, rank: usize) -> Result<f32, Box<dyn std::error::Error>> {
    let stream = comm.stream();
    let mut buf = stream.clone_htod(&vec![(rank + 1) as f32; COUNT])?;
    comm.all_reduce_in_place(&mut buf, ReduceOp::SUM)?;
    let host = stream.clone_dtoh(&buf)?;
    match host.iter().find(|&&v| v != host[0]) {
        None => Ok(host[0]),
        Some(v) => Err(format!("world rank {rank}: elements differ ({} and {v})", host[0]).into()),
    }
}
