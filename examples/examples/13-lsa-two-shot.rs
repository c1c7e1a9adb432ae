//! # Lesson 13 — two-shot all-reduce over LSA, and where it overtakes one-shot
//!
//! What it teaches:
//! * one-shot (lesson 12) makes every rank load the *whole* message from every peer: N − 1 times
//!   the message crosses NVLink into each GPU. Fine for a few KiB, wasteful for MiBs.
//! * two-shot splits the work: rank r loads only its 1/N share from every peer and sums it
//!   (a reduce-scatter), then stores the result into every peer's output (an all-gather). Each
//!   byte crosses NVLink once in each direction, like NCCL's ring, at the price of a second LSA
//!   barrier (the stores must land before anyone reads the output).
//! * the input and the output are symmetric windows ([`nccl::Window`]): peers write into this
//!   rank's output directly. Kernel in `kernels/cu/lsa_allreduce.cu` (the gpucomm-kernels crate),
//!   used through `examples/src/lsa.rs` (`LsaAllReduce::two_shot`). Since the kernel writes into
//!   the peers' windows, whose sizes this rank cannot see, the call is `unsafe`: every rank must
//!   allocate its windows alike (gpucomm-kernels' `AllReduce::alloc` checks that for you).
//! * measuring the crossover: both kernels and `ncclAllReduce` on the same windows from 4 KiB to
//!   64 MiB, as µs per call and nccl-tests' bus bandwidth.
//!
//! How to run it (2 or more GPUs): `cargo run --release -p gpucomm-examples --example
//! 13-lsa-two-shot -- --nproc 2`.
//!
//! What you should see: `two-shot … correct` lines for f32 and bf16 and odd counts on every rank,
//! then on rank 0 a table with one row per size and a line naming the crossover size above which
//! two-shot is faster than one-shot.

use gpucomm_examples::bench::{self, BoxError};
use gpucomm_examples::lsa::{self, Element, LsaAllReduce};
use nccl::launch::run_main;
use nccl::{Collectives, Comm, MemBuffer, ReduceOp, Window, WindowFlags};

/// The largest message, in bytes.
const MAX_BYTES: usize = 64 << 20;

fn main() -> std::process::ExitCode {
    run_main(|info| {
        let (_, comm) = gpucomm_examples::rank_comm(&info)?;
        let lsa = LsaAllReduce::new(&comm, MAX_BYTES)?;
        for count in [1usize, 3, 1000, 1_000_003] {
            check::<f32>(&lsa, count, |v| v as f32)?;
            check::<half::bf16>(&lsa, count, |v| half::bf16::from_f32(v as f32))?;
        }
        crossover(&lsa)?;
        Ok(())
    })
}

/// A window of `count` elements of `T` on every rank (collective).
fn window<'c, T: Element + cudarc::driver::ValidAsZeroBits>(
    comm: &'c Comm,
    count: usize,
) -> Result<Window<'c, T>, BoxError> {
    Ok(comm.register_window(MemBuffer::<T>::zeroed(comm.stream(), count)?, WindowFlags::COLL_SYMMETRIC)?)
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
    lsa::compare(rank as usize, "two-shot", &ours, &expected, &theirs)
}

fn crossover(lsa: &LsaAllReduce<'_>) -> Result<(), BoxError> {
    let comm = lsa.comm();
    let (stream, n) = (comm.stream(), comm.size());
    let mut scratch = MemBuffer::<f32>::zeroed(stream, 1)?;
    let send = window::<f32>(comm, MAX_BYTES / 4)?;
    let mut recv = window::<f32>(comm, MAX_BYTES / 4)?;
    if comm.rank() == 0 {
        println!("\n| size | one-shot (µs) | two-shot (µs) | ncclAllReduce (µs) | one-shot busbw | two-shot busbw | NCCL busbw |");
        println!("|---:|---:|---:|---:|---:|---:|---:|");
    }
    let mut crossover = None;
    let mut bytes = 4usize << 10;
    while bytes <= MAX_BYTES {
        let count = bytes / 4;
        let iters = if bytes >= 8 << 20 { 20 } else { 100 };
        let src = send.slice(..count)?;
        let mut dst = MemBuffer::<f32>::zeroed(stream, count)?;
        let one = bench::eager(comm, &mut scratch, 5, iters, || lsa.one_shot(stream, &src, &mut dst))?;
        // SAFETY: every rank allocates both windows with MAX_BYTES / 4 ≥ `count` elements.
        let two = bench::eager(comm, &mut scratch, 5, iters, || unsafe {
            lsa.two_shot(stream, &send, 0, &mut recv, 0, count)
        })?;
        let theirs =
            bench::eager(comm, &mut scratch, 5, iters, || Ok(comm.all_reduce(&src, &mut dst, ReduceOp::SUM)?))?;
        if crossover.is_none() && two < one {
            crossover = Some(bytes);
        }
        if comm.rank() == 0 {
            let bw = |us| bench::all_reduce_busbw(bytes, n, us);
            println!(
                "| {} | {one:.2} | {two:.2} | {theirs:.2} | {:.1} | {:.1} | {:.1} |",
                bench::size_label(bytes),
                bw(one),
                bw(two),
                bw(theirs)
            );
        }
        bytes *= 4;
    }
    if comm.rank() == 0 {
        match crossover {
            Some(b) => println!("\ntwo-shot is faster than one-shot from {} up", bench::size_label(b)),
            None => println!("\none-shot stayed faster up to {}", bench::size_label(MAX_BYTES)),
        }
    }
    Ok(())
}
