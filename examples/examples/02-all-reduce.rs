//! # Lesson 2 — one process per GPU: launchers, the rendezvous, an all-reduce
//!
//! What it teaches:
//! * the usual deployment is one process per GPU, started by a launcher (this example's own
//!   `--nproc N` spawner, torchrun-style variables, `mpirun`, `srun`); [`nccl::launch::run_main`]
//!   reads the rank from whichever launcher started the process;
//! * the local rank picks the GPU;
//! * rank 0 creates the NCCL unique id and the rendezvous hands it to every rank
//!   ([`nccl::Comm::from_rendezvous`]) through a TCPStore at `MASTER_ADDR:MASTER_PORT`: under
//!   torchrun the one its agent hosts, otherwise one rank 0 hosts (with `GPUCOMM_JOB_KEY` set —
//!   the spawner sets one — the id travels encrypted);
//! * an all-reduce where rank `r` contributes `r + 1`, checked on every rank.
//!
//! How to run it (two GPUs):
//! * `cargo run -p examples --example 02-all-reduce -- --nproc 2`
//! * by hand: build it (`cargo build -p examples --example 02-all-reduce`), then in two
//!   shells `RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1
//!   MASTER_PORT=29500 GPUCOMM_JOB_TOKEN=job1 target/debug/examples/02-all-reduce`, and the same
//!   with `RANK=1 LOCAL_RANK=1` (`GPUCOMM_JOB_TOKEN`: one value on every rank of the job, which
//!   names it);
//! * `torchrun --nproc-per-node 2 --no-python target/debug/examples/02-all-reduce` (also with
//!   `--standalone` or `--rdzv-backend c10d --rdzv-endpoint HOST:PORT`);
//! * `mpirun -np 2 target/debug/examples/02-all-reduce` or `srun -n 2 --gpus-per-task=1 …`.
//!
//! Add `NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_DEBUG=INFO` to make NCCL use
//! its network transport between the processes, as between two nodes (the log then shows `via
//! NET/Socket`; without `NCCL_IB_DISABLE=1`, a machine with InfiniBand shows `NET/IB`).
//!
//! What you should see, once per rank (prefixed `[rank N]` under the spawner):
//! `rank 0 of 2 on GPU 0: all-reduce of 1048576 floats correct (every element 3)`.

use nccl::launch::{run_main, Options, Rendezvous};
use nccl::{Collectives, Comm, ReduceOp};

const COUNT: usize = 1 << 20;

fn main() -> std::process::ExitCode {
    run_main(|info| {
        // One GPU per rank on a node: NCCL refuses two ranks on one GPU, so more ranks than GPUs
        // are refused here first, with a message that says what to do.
        gpucomm_examples::require_gpu_per_rank(&info)?;
        let stream = gpucomm_examples::rank_stream(&info)?;
        let mut rendezvous = Rendezvous::connect(&info, &Options::from_env()?)?;
        let comm = Comm::from_rendezvous(stream.clone(), &mut rendezvous)?;

        let mut buf = stream.clone_htod(&vec![(comm.rank() + 1) as f32; COUNT])?;
        comm.all_reduce_in_place(&mut buf, ReduceOp::SUM)?;
        let expected = (comm.size() * (comm.size() + 1) / 2) as f32;
        let host = stream.clone_dtoh(&buf)?;
        if let Some((i, v)) = host.iter().enumerate().find(|(_, &v)| v != expected) {
            return Err(format!("rank {}: element {i} is {v}, expected {expected}", comm.rank()).into());
        }
        println!(
            "rank {} of {} on GPU {}: all-reduce of {COUNT} floats correct (every element {expected})",
            comm.rank(),
            comm.size(),
            comm.device()
        );
        comm.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}
