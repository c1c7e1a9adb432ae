//! # Lesson 13 — two-shot all-reduce over LSA windows: each byte crosses NVLink once each way
//!
//! What it teaches:
//! * one-shot (lesson 12) makes every rank load the *whole* message from every peer: N − 1 times
//!   the message crosses NVLink into each GPU. Fine for a few KiB, wasteful for MiBs.
//! * two-shot splits the work: rank r loads only its 1/N share from every peer and sums it
//!   (a reduce-scatter), then stores the result into every peer's output (an all-gather). Each
//!   byte crosses NVLink once in each direction, like NCCL's ring, at the price of a second LSA
//!   barrier (the stores must land before anyone reads the output).
//! * the input and the output are symmetric windows ([`nccl::Window`]): peers write into this
//!   rank's output directly. Kernel in `gpucomm-kernels/cu/lsa_allreduce.cu` (the gpucomm-kernels crate),
//!   used through `examples/src/lsa.rs` (`LsaAllReduce::two_shot`). Since the kernel writes into
//!   the peers' windows, whose sizes this rank cannot see, the call is `unsafe`: every rank must
//!   allocate its windows alike (gpucomm-kernels' `AllReduce::alloc` checks that for you).
//! * the result is checked against a host reference and against `ncclAllReduce`, for f32 and
//!   bf16, odd counts and an input at an odd offset inside the window included.
//!
//! Where two-shot overtakes one-shot is a measurement, not part of this lesson: the custom-kernels
//! bench times both, and NCCL, from 8 B to 64 MiB (`cargo bench -p examples --bench
//! custom-kernels -- --nproc 2`; on 2×H200 two-shot is the faster from 1 MiB up, see
//! `docs/custom-kernels/`).
//!
//! How to run it (GPUs in one NVLink domain, one process each): `cargo run -p examples
//! --example 13-lsa-two-shot -- --nproc 2`.
//!
//! What you should see: `two-shot … correct` lines for f32 and bf16 and odd counts on every rank.

use gpucomm_examples::bench::BoxError;
use gpucomm_examples::lsa::{self, Element, LsaAllReduce};
use nccl::launch::run_main;
use nccl::{Collectives, Comm, MemBuffer, ReduceOp, Window, WindowFlags};

fn main() -> std::process::ExitCode {
    run_main(|info| {
        let (_, comm) = gpucomm_examples::rank_comm(&info)?;
        // The two-shot kernel works in the windows it is given: no one-shot staging area (0 bytes).
        let lsa = LsaAllReduce::new(&comm, 0)?;
        for count in [1usize, 3, 1000, 1_000_003] {
            check::<f32>(&lsa, count, |v| v as f32)?;
            check::<half::bf16>(&lsa, count, |v| half::bf16::from_f32(v as f32))?;
        }
        // Collective teardown, checked: the kernels' window and device communicator, then the
        // communicator (dropping would hide a failure).
        drop(lsa);
        comm.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}

/// A window of `count` elements of `T` on every rank (collective).
fn window<'c, T: Element + cudarc::driver::ValidAsZeroBits>(
    comm: &'c Comm,
    count: usize,
) -> Result<Window<'c, T>, BoxError> {
    Ok(comm
        .register_window(MemBuffer::<T>::zeroed(comm.stream(), count)?, WindowFlags::COLL_SYMMETRIC)
        .map_err(|(_, e)| e)?)
}

fn check<T: Element + PartialEq + std::fmt::Debug + cudarc::driver::ValidAsZeroBits>(
    lsa: &LsaAllReduce<'_>,
    count: usize,
    from: impl Fn(u32) -> T,
) -> Result<(), BoxError> {
    let comm = lsa.comm();
    let (stream, rank, n) = (comm.stream(), comm.rank() as u32, comm.size() as u32);
    let (host, expected) = lsa::pattern(rank, n, count, from);
    // Inputs at an odd element offset (1) inside the window, to exercise unaligned heads.
    let mut send = window::<T>(comm, count + 1)?;
    let mut recv = window::<T>(comm, count + 1)?;
    stream.memcpy_htod(&host, &mut send.slice_mut(1..)?)?;
    for _ in 0..2 {
        // SAFETY: every rank allocates both windows with `count + 1` elements (this function, the
        // same `count` on every rank), so elements 1..=count exist in every peer's windows.
        unsafe { lsa.two_shot(stream, &send, 1, &mut recv, 1, count) }?;
    }
    let ours = stream.clone_dtoh(&recv.slice(1..)?)?;
    let mut theirs = MemBuffer::<T>::zeroed(stream, count)?;
    comm.all_reduce(&send.slice(1..)?, &mut theirs, ReduceOp::SUM)?;
    let theirs = stream.clone_dtoh(&theirs)?;
    lsa::compare(rank as usize, "two-shot", &ours, &expected, &theirs)?;
    // Deregistered explicitly, so that a failure is an error here rather than a log line.
    send.deregister().map_err(|(_, e)| e)?;
    recv.deregister().map_err(|(_, e)| e)?;
    Ok(())
}
