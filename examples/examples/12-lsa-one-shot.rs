//! # Lesson 12 — your own all-reduce kernel over NCCL's device API (one-shot, LSA)
//!
//! What it teaches:
//! * NCCL ≥ 2.28 lets your own CUDA kernels talk to other GPUs: a **symmetric window**
//!   ([`nccl::Window`], memory from [`nccl::MemBuffer`] registered on every rank) can be loaded from
//!   and stored to directly over NVLink from any rank of the **LSA team** ("load/store accessible");
//!   an **LSA barrier** (`ncclLsaBarrierSession` in the kernel) synchronises the ranks' CTAs;
//!   a **device communicator** ([`nccl::device::DevComm`]) carries both to the kernel by value.
//! * the kernel is CUDA C++ in `kernels/cu/lsa_allreduce.cu` (the gpucomm-kernels crate);
//!   `kernels/build.rs` compiles it with build-support (no CUDA install needed: the pinned nvcc
//!   wheels) and embeds the cubin; cudarc launches it with the `DevComm` and `Window` as
//!   arguments — read `kernels/src/lsa.rs` (`LsaKernels::new` and `one_shot`) and
//!   `examples/src/lsa.rs` beside this file: that is the whole host side, shared with lessons
//!   15–18 and with gpucomm-kernels' dispatching all-reduce.
//! * the one-shot algorithm for small messages: each rank copies its input into its half of a
//!   double-buffered staging area in the window, one barrier says "all inputs are staged", then
//!   each rank loads every peer's input and sums it. One barrier and one NVLink hop per call.
//! * the LL ("low latency") variant, NCCL's trick for the smallest messages: no barrier at all —
//!   each rank stores its input into every peer's window as 8-byte words of data plus a flag (the
//!   call number), and a peer knows a word has arrived when its flag matches.
//! * checking a custom collective: against a host reference and against `ncclAllReduce`, for f32
//!   and bf16, odd element counts included (1, 3, 1000, 1000003).
//! * timing it beside `ncclAllReduce`, eagerly and replayed from a CUDA graph.
//!
//! How to run it (2 or more GPUs, one process per GPU):
//! `cargo run --release -p gpucomm-examples --example 12-lsa-one-shot -- --nproc 2`
//! (or under `mpirun -np 2` / torchrun-style variables, like lesson 2).
//!
//! What you should see: one `correct` line per (algorithm, type, count) on every rank, then on rank
//! 0 a table of µs per call for sizes 8 B – 256 KiB: LL (up to 64 KiB), one-shot and
//! `ncclAllReduce`, eager and from a graph. On 2×H200 both kernels beat `ncclAllReduce` on plain
//! buffers at these sizes (lesson 18 compares with NCCL's own symmetric-memory kernels too).

use gpucomm_examples::bench::{self, BoxError};
use gpucomm_examples::lsa::{self, Element, LsaAllReduce, LL_MAX_BYTES};
use nccl::launch::{run_main, Options, Rendezvous};
use nccl::{Collectives, Comm, MemBuffer, ReduceOp};

/// The largest message checked (1000003 f32), which sizes the staging window.
const MAX_BYTES: usize = 1_000_003 * 4;

fn main() -> std::process::ExitCode {
    run_main(|info| {
        let ctx = cudarc::driver::CudaContext::new(info.device_ordinal(gpucomm_examples::cuda_devices()?)?)?;
        // A stream of our own: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream()?;
        let mut rendezvous = Rendezvous::connect(&info, &Options::from_env()?)?;
        let comm = Comm::from_rendezvous(stream, &mut rendezvous)?;
        // Collective: every rank creates the device communicator and registers the staging window.
        let lsa = LsaAllReduce::new(&comm, MAX_BYTES)?;
        for count in [1usize, 3, 1000, 1_000_003] {
            check::<f32>(&lsa, count, |v| v as f32)?;
            check::<half::bf16>(&lsa, count, |v| half::bf16::from_f32(v as f32))?;
        }
        time(&lsa)?;
        Ok(())
    })
}

/// Rank r contributes (r + 1) × (i mod 13): small integers, exact in both types, so the sums must
/// equal the host reference and `ncclAllReduce` bit for bit. Checks the one-shot kernel (LL's
/// values are checked by lesson 15, which replays it in a graph).
fn check<T: Element + PartialEq + std::fmt::Debug + cudarc::driver::ValidAsZeroBits>(
    lsa: &LsaAllReduce<'_>,
    count: usize,
    from: impl Fn(u32) -> T,
) -> Result<(), BoxError> {
    let comm = lsa.comm();
    let (stream, rank, n) = (comm.stream(), comm.rank() as u32, comm.size() as u32);
    let (host, expected) = lsa::pattern(rank, n, count, from);
    let send = MemBuffer::from_host(stream, &host)?;
    let mut ours = MemBuffer::<T>::zeroed(stream, count)?;
    let mut theirs = MemBuffer::<T>::zeroed(stream, count)?;
    // Twice, so that both staging slots are used.
    lsa.one_shot(stream, &send, &mut ours)?;
    lsa.one_shot(stream, &send, &mut ours)?;
    comm.all_reduce(&send, &mut theirs, ReduceOp::SUM)?;
    let (ours, theirs) = (stream.clone_dtoh(&ours)?, stream.clone_dtoh(&theirs)?);
    lsa::compare(rank as usize, "one-shot", &ours, &expected, &theirs)
}

/// µs per call, LL and one-shot beside `ncclAllReduce` on the same buffers, eager and from a graph
/// (`NaN`: the message is too large for LL).
fn time(lsa: &LsaAllReduce<'_>) -> Result<(), BoxError> {
    let comm = lsa.comm();
    let stream = comm.stream();
    let mut scratch = MemBuffer::<f32>::zeroed(stream, 1)?;
    if comm.rank() == 0 {
        println!("\n| size | LL eager | one-shot eager | ncclAllReduce eager | LL graph | one-shot graph | ncclAllReduce graph |");
        println!("|---:|---:|---:|---:|---:|---:|---:|");
    }
    for bytes in [8usize, 64, 512, 4 << 10, 32 << 10, 256 << 10] {
        let send = MemBuffer::<f32>::zeroed(stream, bytes / 4)?;
        let mut recv = MemBuffer::<f32>::zeroed(stream, bytes / 4)?;
        let (mut ll_eager, mut ll_graph) = (f64::NAN, f64::NAN);
        // The graphs keep what their calls use: the staging window (LSA kernels), the buffers,
        // the communicator (ncclAllReduce).
        if bytes <= LL_MAX_BYTES {
            ll_eager = bench::eager(comm, &mut scratch, 20, 200, || lsa.ll(stream, &send, &mut recv))?;
            let step = |(_, s, r): &mut (_, &_, &mut _)| lsa.ll(stream, *s, *r);
            ll_graph = bench::graph(comm, &mut scratch, stream, 100, 20, (lsa.staging(), &send, &mut recv), step)?.0;
        }
        let ours_eager = bench::eager(comm, &mut scratch, 20, 200, || lsa.one_shot(stream, &send, &mut recv))?;
        let step = |(_, s, r): &mut (_, &_, &mut _)| lsa.one_shot(stream, *s, *r);
        let ours_graph = bench::graph(comm, &mut scratch, stream, 100, 20, (lsa.staging(), &send, &mut recv), step)?.0;
        let nccl_eager =
            bench::eager(comm, &mut scratch, 20, 200, || Ok(comm.all_reduce(&send, &mut recv, ReduceOp::SUM)?))?;
        let step = |(c, s, r): &mut (&Comm, &_, &mut _)| Ok(c.all_reduce(*s, *r, ReduceOp::SUM)?);
        let nccl_graph = bench::graph(comm, &mut scratch, stream, 100, 20, (comm, &send, &mut recv), step)?.0;
        if comm.rank() == 0 {
            let label = bench::size_label(bytes);
            println!("| {label} | {ll_eager:.2} | {ours_eager:.2} | {nccl_eager:.2} | {ll_graph:.2} | {ours_graph:.2} | {nccl_graph:.2} |");
        }
    }
    Ok(())
}
