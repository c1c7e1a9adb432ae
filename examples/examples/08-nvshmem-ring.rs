//! # Lesson 8 — NVSHMEM: a ring with put-with-signal
//!
//! What it teaches:
//! * a *signal* is a `u64` on the symmetric heap that other PEs update; a put with a signal
//!   ([`nvshmem::Runtime::put_signal_on_stream`]) delivers the data first and then updates the
//!   signal, so whoever sees the signal change also sees the data;
//! * the receiver does not block its host thread: [`nvshmem::Runtime::signal_wait_until_on_stream`]
//!   makes its *stream* wait, and everything enqueued after the wait on that stream runs once the
//!   data is there;
//! * a token passed around a ring: in round `r` every PE sends what it holds to the next PE, into
//!   slot `r` of the next PE's inbox, and adds 1 to the next PE's signal; it waits until its own
//!   signal reaches `r + 1`, then copies slot `r` into what it sends next (a cudarc copy, which
//!   accepts symmetric buffers). One slot per round means no slot is overwritten while a PE still
//!   reads it. Slot `r` is [`nvshmem::Symmetric::slice`] of the inbox: a sub-range of a symmetric
//!   buffer is symmetric too (lesson 9 says more).
//!
//! How to run it (two or more GPUs; one GPU runs too, a ring of one PE passing the token to
//! itself): `cargo run -p examples --example 08-nvshmem-ring -- --nproc 2`, or with
//! torchrun-style variables / `mpirun` as in lesson 2.
//!
//! What you should see, once per PE:
//! `PE 0 of 2: 8 rounds of the ring, every slot held the token of the right PE`.

use nvshmem::launch::run_main;
use nvshmem::{Cmp, SignalOp};

const COUNT: usize = 1 << 16;
const ROUNDS: usize = 8;

/// The token PE `origin` starts with.
fn value(origin: usize, i: usize) -> u64 {
    (origin as u64) << 32 | i as u64
}

fn main() -> std::process::ExitCode {
    run_main(|info| {
        // The GPU, the rendezvous and NVSHMEM's start, as in lesson 7.
        let (stream, rt) = gpucomm_examples::nvshmem_runtime(&info)?;
        let (me, n) = (rt.my_pe(), rt.n_pes());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);

        // Collective allocations: one inbox slot per round, and one signal word (zeroed).
        let inbox = rt.alloc::<u64>(ROUNDS * COUNT)?;
        let arrived = rt.alloc_zeroed::<u64>(1)?;
        let mut token = stream.clone_htod(&(0..COUNT).map(|i| value(me, i)).collect::<Vec<_>>())?;
        // Nobody may put into a peer's signal before the peer has it zeroed: calloc ends with a
        // barrier, so it is.
        for r in 0..ROUNDS {
            let slot = inbox.slice(r * COUNT..(r + 1) * COUNT)?;
            rt.put_signal_on_stream(&slot, &token, &arrived, 1, SignalOp::Add, next, &stream)?;
            rt.signal_wait_until_on_stream(&arrived, Cmp::Ge, r as u64 + 1, &stream)?;
            // Enqueued after the wait: runs once slot r has arrived.
            stream.memcpy_dtod(&slot, &mut token)?;
        }

        let got = stream.clone_dtoh(&inbox)?;
        for r in 0..ROUNDS {
            // After r + 1 hops, the token in slot r started at the PE r + 1 places back.
            let origin = (me + n * ROUNDS - (r + 1)) % n;
            let slot = &got[r * COUNT..(r + 1) * COUNT];
            if let Some(i) = (0..COUNT).find(|&i| slot[i] != value(origin, i)) {
                return Err(format!(
                    "PE {me}: round {r}, element {i} is {:#x}, expected {:#x} (from PE {origin} via PE {prev})",
                    slot[i],
                    value(origin, i)
                )
                .into());
            }
        }
        println!("PE {me} of {n}: {ROUNDS} rounds of the ring, every slot held the token of the right PE");

        // Nobody frees while a neighbour may still put: the barrier completes every round first.
        rt.barrier_all_on_stream(&stream)?;
        arrived.free().map_err(|(_, e)| e)?;
        inbox.free().map_err(|(_, e)| e)?;
        rt.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}
