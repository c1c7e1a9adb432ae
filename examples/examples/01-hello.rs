//! # Lesson 1 — what is installed, which GPUs there are, and a first all-reduce
//!
//! What it teaches:
//! * the crates load NCCL and NVSHMEM at run time (no CUDA install needed to build) and tell you
//!   which library they found and its version;
//! * how to list the GPUs with cudarc;
//! * a first collective: one process drives every GPU it sees ([`nccl::Comm::init_all`]); each
//!   GPU contributes `rank + 1` and an all-reduce leaves the sum on all of them. Several
//!   communicators driven from one thread must be issued together, inside [`nccl::group`].
//!
//! How to run it: `./dev.sh run` (installs what is missing, then runs this example), or
//! `cargo run -p examples --example 01-hello`.
//!
//! What you should see: the NCCL and NVSHMEM versions and where they were loaded from, one line per
//! GPU, then `all-reduce over N GPU(s): every element is S (expected S)`. On a machine without a
//! GPU the versions are printed, then the program stops at once with `error: no CUDA driver: …`
//! and exit status 1.

use std::process::ExitCode;

use gpucomm_examples::cuda_devices;
use nccl::{Collectives, Comm, ReduceOp};

fn main() -> ExitCode {
    // NVLink multicast stays off in this process (the lessons that go through `run_main` get
    // this from it).
    nccl::launch::safety::enforce_with_note();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    // 1. The libraries. Loading needs no GPU: this works on any Linux machine with the wheels.
    let nccl_lib = nccl::sys::library()?;
    println!(
        "NCCL    {} (headers {}), loaded from {}",
        nccl_lib.version(),
        nccl::header_version(),
        nccl_lib.path().display()
    );
    let shmem_lib = nvshmem::sys::library()?;
    println!(
        "NVSHMEM {} (headers {}), loaded from {}",
        shmem_lib.version(),
        nvshmem::header_version(),
        shmem_lib.path().display()
    );

    // 2. The GPUs. Everything above works without one; from here on a GPU is needed.
    let count = cuda_devices()?;
    let mut streams = Vec::new();
    for ordinal in 0..count {
        let ctx = cudarc::driver::CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        println!(
            "GPU {ordinal}: {} ({:.0} GiB, compute capability {major}.{minor})",
            ctx.name()?,
            ctx.total_mem()? as f64 / (1u64 << 30) as f64
        );
        streams.push(ctx.default_stream());
    }

    // 3. One communicator per GPU, all in this process.
    let comms = Comm::init_all(&streams)?;
    let mut buffers = Vec::new();
    for comm in &comms {
        buffers.push(comm.stream().clone_htod(&[(comm.rank() + 1) as f32; 1024])?);
    }
    // Every communicator's call goes into one group; NCCL launches them together at its end.
    nccl::group(|g| {
        for (comm, buf) in comms.iter().zip(buffers.iter_mut()) {
            g.with(comm).all_reduce_in_place(buf, ReduceOp::SUM)?;
        }
        Ok(())
    })?;
    let expected = (count * (count + 1) / 2) as f32;
    for (comm, buf) in comms.iter().zip(&buffers) {
        let host = comm.stream().clone_dtoh(buf)?;
        if let Some(bad) = host.iter().find(|&&v| v != expected) {
            return Err(format!("GPU {}: got {bad}, expected {expected}", comm.device()).into());
        }
    }
    println!("all-reduce over {count} GPU(s): every element is {expected} (expected {expected})");
    for comm in comms {
        comm.finalize().map_err(|(_, e)| e)?;
    }
    Ok(())
}
