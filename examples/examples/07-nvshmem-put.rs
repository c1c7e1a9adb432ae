//! # Lesson 7 — NVSHMEM: a symmetric heap and a put to the next PE
//!
//! What it teaches:
//! * NVSHMEM gives every process (PE) a *symmetric heap*: [`nvshmem::Runtime::alloc`] returns a
//!   buffer that exists at the same offset on every PE, so "my buffer on PE p" names remote memory;
//! * allocation and free are collective (every PE, same order, same size);
//! * a put writes into another PE's copy, ordered on a CUDA stream; a barrier on the stream makes
//!   it complete and visible everywhere;
//! * the same launchers and rendezvous as lesson 2 start NVSHMEM ([`nvshmem::Runtime::from_rendezvous`]).
//!
//! How to run it (two GPUs; one GPU runs too, PE 0 putting to itself):
//! `cargo run -p examples --example 07-nvshmem-put -- --nproc 2`, or under
//! `torchrun --nproc-per-node 2 --no-python …`, with torchrun-style variables or `mpirun -np 2` as
//! in lesson 2.
//!
//! What you should see, once per PE:
//! `PE 1 of 2: received 65536 values from PE 0, all correct`.

use nvshmem::launch::{run_main, Options, Rendezvous};
use nvshmem::Runtime;

const COUNT: usize = 1 << 16;

fn value(pe: usize, i: usize) -> u64 {
    (pe as u64) << 32 | i as u64
}

fn main() -> std::process::ExitCode {
    run_main(|info| {
        let stream = gpucomm_examples::rank_stream(&info)?;
        let mut rendezvous = Rendezvous::connect(&info, &Options::from_env()?)?;
        let rt = Runtime::from_rendezvous(stream.clone(), &mut rendezvous)?;
        let (me, n) = (rt.my_pe(), rt.n_pes());

        // Collective: every PE allocates the same buffer.
        let inbox = rt.alloc::<u64>(COUNT)?;
        let mine = stream.clone_htod(&(0..COUNT).map(|i| value(me, i)).collect::<Vec<_>>())?;
        let next = (me + 1) % n;
        rt.put_on_stream(&inbox, &mine, next, &stream)?;
        rt.barrier_all_on_stream(&stream)?;

        let prev = (me + n - 1) % n;
        let got = stream.clone_dtoh(&inbox)?;
        if let Some(i) = (0..COUNT).find(|&i| got[i] != value(prev, i)) {
            return Err(format!("PE {me}: element {i} is {:#x}, expected {:#x}", got[i], value(prev, i)).into());
        }
        println!("PE {me} of {n}: received {COUNT} values from PE {prev}, all correct");
        // Teardown hands the object back with the error when it fails; here we just report it.
        inbox.free().map_err(|(_, e)| e)?;
        rt.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}
