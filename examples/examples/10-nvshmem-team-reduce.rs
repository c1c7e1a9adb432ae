//! # Lesson 10 — NVSHMEM: teams, and an all-reduce on a stream
//!
//! What it teaches:
//! * a *team* is a set of PEs that run collectives together; the world team has every PE, and
//!   [`nvshmem::Team::split_strided`] makes sub-teams (here: the PEs with an even number). PE
//!   numbers differ per team ([`nvshmem::Team::my_pe`], [`nvshmem::Team::translate_pe`]);
//! * splitting is collective over the parent, so every PE calls it; PEs outside the new team get
//!   `None`;
//! * an all-reduce over a team, enqueued on a stream like any kernel
//!   ([`nvshmem::Team::reduce_on_stream`], [`nvshmem::Team::reduce_in_place_on_stream`]); the
//!   operation is a type ([`nvshmem::ops::Sum`], [`nvshmem::ops::Max`], …) implemented only for
//!   the element types NVSHMEM defines it on, so `Xor` over `f32` does not compile;
//! * source and destination live on the symmetric heap, as NVSHMEM's collectives require.
//!
//! How to run it (two or more GPUs; one GPU runs too, the world and the even team then being PE 0
//! alone): `cargo run -p examples --example 10-nvshmem-team-reduce -- --nproc 2`, or with
//! torchrun-style variables / `mpirun` as in lesson 2.
//!
//! What you should see, once per PE, e.g. with 2 PEs:
//! `PE 0 of 2: world sum 3 correct; even team (PE 0 of 1): max 1 correct, xor correct`.

use nvshmem::launch::run_main;
use nvshmem::ops::{Max, Sum, Xor};

const COUNT: usize = 1 << 20;

fn main() -> std::process::ExitCode {
    run_main(|info| {
        // The GPU, the rendezvous and NVSHMEM's start, as in lesson 7.
        let (stream, rt) = gpucomm_examples::nvshmem_runtime(&info)?;
        let (me, n) = (rt.my_pe(), rt.n_pes());
        let world = rt.world()?;

        // World all-reduce: PE p contributes p + 1 everywhere; the sum is n (n + 1) / 2.
        let mut src = rt.alloc::<f32>(COUNT)?;
        let mut sum = rt.alloc::<f32>(COUNT)?;
        stream.memcpy_htod(&vec![(me + 1) as f32; COUNT], &mut src)?;
        world.reduce_on_stream(Sum, &mut sum, &src, &stream)?;
        let expected = (n * (n + 1) / 2) as f32;
        let got = stream.clone_dtoh(&sum)?;
        if let Some(i) = got.iter().position(|&v| v != expected) {
            return Err(format!("PE {me}: world sum element {i} is {}, expected {expected}", got[i]).into());
        }
        let mut line = format!("PE {me} of {n}: world sum {expected} correct");

        // The even PEs: 0, 2, 4, … Every PE takes part in the split.
        let evens = world.split_strided(0, 2, n.div_ceil(2))?;
        let mut ints = rt.alloc::<i32>(COUNT)?;
        stream.memcpy_htod(&(0..COUNT).map(|i| (me * 7 + i) as i32).collect::<Vec<_>>(), &mut ints)?;
        if let Some(team) = &evens {
            let members: Vec<usize> = (0..team.n_pes()).map(|t| 2 * t).collect();
            // Team PE numbers translate back to world numbers.
            for (t, &w) in members.iter().enumerate() {
                if team.translate_pe(t, &world)? != Some(w) {
                    return Err(format!("PE {me}: team PE {t} should be world PE {w}").into());
                }
            }
            team.reduce_in_place_on_stream(Max, &mut src, &stream)?;
            // In place, a xor (or a sum) must not meet a PE's value twice. NVSHMEM's segmented
            // algorithm, which teams other than the world team use, and the world team for large
            // messages, would do that over three or more PEs, so the crate reduces such calls in
            // pieces one round sends to every peer: one launch per piece. For a large message,
            // reduce into a second buffer instead (one launch), as the world sum above does.
            team.reduce_in_place_on_stream(Xor, &mut ints, &stream)?;
            let max = (members.last().copied().unwrap_or(0) + 1) as f32;
            if let Some(i) = stream.clone_dtoh(&src)?.iter().position(|&v| v != max) {
                return Err(format!("PE {me}: team max element {i} wrong, expected {max}").into());
            }
            let xors = stream.clone_dtoh(&ints)?;
            if let Some(i) = (0..COUNT).find(|&i| xors[i] != members.iter().fold(0, |x, &w| x ^ (w * 7 + i) as i32)) {
                return Err(format!("PE {me}: team xor element {i} is {}", xors[i]).into());
            }
            line += &format!("; even team (PE {} of {}): max {max} correct, xor correct", team.my_pe(), team.n_pes());
        } else {
            line += "; not in the even team";
        }
        println!("{line}");

        // Collective teardown, in the same order on every PE.
        rt.barrier_all_on_stream(&stream)?;
        evens.map(|team| team.destroy()).transpose().map_err(|(_, e)| e)?;
        ints.free().map_err(|(_, e)| e)?;
        sum.free().map_err(|(_, e)| e)?;
        src.free().map_err(|(_, e)| e)?;
        drop(world);
        rt.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}
