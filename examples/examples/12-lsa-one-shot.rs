//! # Lesson 12 — your own all-reduce kernel over NCCL's device API (one-shot, LSA)
//!
//! What it teaches: how a CUDA kernel of your own reads the other GPUs' memory through NCCL
//! (≥ 2.28), and how Rust launches it. Three pieces, all created in this file:
//! * a **symmetric window** ([`nccl::Window`]): memory from [`nccl::MemBuffer`] registered on every
//!   rank, which every rank of the **LSA team** ("load/store accessible": the GPUs one NVLink
//!   domain connects) can load from directly;
//! * a **device communicator** ([`nccl::device::DevComm`]) with one **LSA barrier** per CTA of the
//!   kernel: the kernel takes it by value and meets the peers' CTAs at its barriers;
//! * the **kernel**, [`12-lsa-one-shot.cu`](./12-lsa-one-shot.cu) next to this file: a one-shot
//!   all-reduce (every rank loads the whole message from every rank's window and sums it, between
//!   two barriers). `build.rs` compiles it with build-support's nvcc helper (no CUDA install
//!   needed: the pinned nvcc wheels) into `gpucomm_examples::kernels::LSA_ONE_SHOT`, and cudarc
//!   launches it with the `DevComm` and the `Window` as arguments.
//!
//! The launch is `unsafe`, and says why: the kernel loads from the peers' windows, whose sizes
//! this rank cannot see, so every rank must pass the same count on windows of the same size.
//! The result is checked against a host reference and against `ncclAllReduce` on the same input,
//! for 1, 3, 1000 and 1000003 floats.
//!
//! This kernel is written to be read. The fast ones are in the gpucomm-kernels crate (an LL
//! variant without barriers, a one-shot that alternates two staging slots and needs one barrier
//! per call, the two-shot of lesson 13), with `gpucomm_kernels::AllReduce`, which picks one per
//! message size; the custom-kernels bench (`examples/benches/custom-kernels.rs`) times them
//! against NCCL.
//!
//! How to run it (GPUs in one NVLink domain, one process each):
//! `cargo run -p examples --example 12-lsa-one-shot -- --nproc 2` (or under
//! `mpirun -np 2` / torchrun-style variables, as in lesson 2). One GPU works too: a team of one.
//!
//! What you should see, on every rank, for each count:
//! `rank 0: one-shot f32 all-reduce of 1000003 elements correct (matches host and ncclAllReduce)`.

use cudarc::driver::{CudaFunction, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use gpucomm_examples::bench::BoxError;
use gpucomm_examples::lsa;
use nccl::device::{DevComm, DevCommRequirements};
use nccl::launch::run_main;
use nccl::{Collectives, MemBuffer, ReduceOp, Window, WindowFlags};

/// The largest message, in floats: every rank's window holds this many.
const MAX_COUNT: usize = 1_000_003;
/// Threads per CTA.
const THREADS: u32 = 512;
/// CTAs of a launch at most: the device communicator has one LSA barrier for each.
const MAX_CTAS: u32 = 16;

fn main() -> std::process::ExitCode {
    run_main(|info| {
        let (stream, comm) = gpucomm_examples::rank_comm(&info)?;
        let (rank, n) = (comm.rank(), comm.size());

        // 1. The kernel loads from every rank, so every rank must be in this rank's LSA team (a
        //    host query: nothing is created yet).
        let team = comm.team_lsa()?;
        if team.size != n {
            return Err(format!(
                "rank {rank}: only {} of the {n} ranks can be reached by loads and stores; the kernel needs one NVLink domain",
                team.size
            )
            .into());
        }

        // 2. Collective, on every rank in the same order: the window that holds the inputs, and
        //    the device communicator.
        let buffer = MemBuffer::<f32>::zeroed(&stream, MAX_COUNT)?;
        let mut window = comm.register_window(buffer, WindowFlags::COLL_SYMMETRIC).map_err(|(_, e)| e)?;
        let dev = DevComm::new(&comm, &DevCommRequirements::default().lsa_barriers(MAX_CTAS))?;

        // 3. The kernel, from the image build.rs embedded.
        let module = nccl::device::load_module(comm.context(), gpucomm_examples::kernels::LSA_ONE_SHOT)?;
        let kernel = module.load_function("one_shot_sum_f32")?;

        for count in [1, 3, 1000, MAX_COUNT] {
            // Rank r's input is (r + 1) × (i mod 13): small integers, so the sums are exact.
            let (input, expected) = lsa::pattern(rank as u32, n as u32, count, |v| v as f32);
            stream.memcpy_htod(&input, &mut window.slice_mut(..count)?)?;
            let mut ours = MemBuffer::<f32>::zeroed(&stream, count)?;
            // SAFETY: every rank runs this loop with the same counts, and registered its window
            // with MAX_COUNT floats above.
            unsafe { one_shot(&kernel, &dev, &window, &mut ours) }?;

            // NCCL's own all-reduce of the same input, to compare with.
            let mut theirs = MemBuffer::<f32>::zeroed(&stream, count)?;
            comm.all_reduce(&window.slice(..count)?, &mut theirs, ReduceOp::SUM)?;
            let (ours, theirs) = (stream.clone_dtoh(&ours)?, stream.clone_dtoh(&theirs)?);
            lsa::compare(rank, "one-shot", &ours, &expected, &theirs)?;
        }
        // Teardown, collective too: the device communicator first (dropping it waits for every
        // kernel on the device), then the window, whose memory comes back.
        drop(dev);
        window.deregister().map_err(|(_, e)| e)?.free().map_err(|(_, e)| e)?;
        comm.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}

/// Launches the kernel on the communicator's stream: `output` gets the sum over every rank of the
/// first `output.len()` floats of `input`.
///
/// # Safety
///
/// Every rank of the communicator makes the same call at the same point, with the same
/// `output.len()`, on a window of the same size: the kernel loads that many floats from every
/// peer's window (whose sizes this rank cannot see), and CTA b of every rank waits for CTA b of
/// the others at its barriers.
unsafe fn one_shot(
    kernel: &CudaFunction,
    dev: &DevComm<'_>,
    input: &Window<'_, f32>,
    output: &mut MemBuffer<f32>,
) -> Result<(), BoxError> {
    let comm = dev.comm();
    if !std::ptr::eq(comm, input.comm()) {
        return Err("the window belongs to another communicator than the device communicator".into());
    }
    // Both die with the communicator: it must not have been aborted.
    comm.live_raw()?;
    let count = output.len();
    let stream = comm.stream();
    // The device pointers, as cudarc hands them out: each guard orders the launch after earlier
    // uses of its memory (the copy into the window) and records the launch as a use, until it is
    // dropped after the launch. The kernel reads this rank's window range, and so do the peers'
    // kernels, whose loads end before this kernel does (its second barrier). `slice` refuses a
    // window smaller than the output.
    let range = input.slice(..count)?;
    let (_, _read) = range.device_ptr(stream);
    let (out, _write) = output.device_ptr_mut(stream);
    let (dev, window) = (dev.arg(), input.arg());

    let ctas = count.div_ceil(THREADS as usize).clamp(1, MAX_CTAS as usize) as u32;
    let cfg = LaunchConfig { grid_dim: (ctas, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    let mut launch = stream.launch_builder(kernel);
    launch.arg(&dev).arg(&window).arg(&out).arg(&count);
    // SAFETY: the kernel is `one_shot_sum_f32(ncclDevComm, ncclWindow_t, float *, size_t)`,
    // matching the arguments pushed: the device communicator (the C layout of ncclDevComm), the
    // window's handle, `out` (a device address) and `count` (a usize, as size_t). `out` holds
    // `count` floats on the communicator's device, and the window `count` floats or more on this
    // rank (checked by `slice`) and, by the caller's contract, on every peer; the device
    // communicator and the window belong to the same communicator, live (both checked), whose
    // stream this is, and are borrowed until the launch is enqueued; the grid has at most MAX_CTAS CTAs,
    // the LSA barriers `dev` was created with, and every rank launches the same grid (same count,
    // the caller's contract). Both memories are ordered on the stream by the guards above.
    unsafe { launch.launch(cfg) }?;
    Ok(())
}
