//! # Lesson 9 — NVSHMEM: a one-sided get from the peers' heaps, and NVSHMEM's own launchers
//!
//! What it teaches:
//! * a *get* reads another PE's copy of a symmetric buffer without that PE doing anything
//!   ([`nvshmem::Runtime::get_on_stream`]): every PE publishes a table on its heap, and each PE
//!   fetches block `q` of PE `q`'s table into ordinary cudarc memory;
//! * sub-ranges of a symmetric buffer ([`nvshmem::Symmetric::slice`]) are symmetric too, and out of
//!   range requests are refused before NVSHMEM sees them;
//! * the data must be there before anyone reads it, and stay until everyone has read it: a
//!   barrier on the stream before and after the gets;
//! * NVSHMEM can start from its own bootstrap plugins: under `mpirun` this lesson uses
//!   [`nvshmem::Bootstrap::Mpi`] (NVSHMEM's `nvshmem_bootstrap_mpi.so.3` over `MPI_COMM_WORLD`,
//!   no rendezvous of ours), otherwise the unique id and our rendezvous;
//! * what [`nvshmem::Runtime::info`] reports: library, OpenSHMEM specification version, the heap
//!   limit, and which NCCL NVSHMEM uses for its collectives.
//!
//! How to run it (two or more GPUs; one GPU runs too, PE 0 getting from its own heap):
//! `cargo run -p examples --example 09-nvshmem-get -- --nproc 2`, or `mpirun -np 2 target/debug/examples/09-nvshmem-get` (NVSHMEM's MPI bootstrap; it
//! needs Open MPI's `libmpi.so.40`, and the error names what the loader missed otherwise).
//!
//! What you should see, once per PE: a line such as
//! `PE 0 of 2 (bootstrap: MPI): NVSHMEM v3.4.5, OpenSHMEM 1.3, heap limit … GiB (from the
//! device's memory), collectives through NCCL 2.28.9 from …`
//! and then `PE 0 of 2: fetched 2 blocks of 65536 values, one from each PE, all correct`.

use nvshmem::launch::{run_main, Launcher, Options, Rendezvous};
use nvshmem::{Bootstrap, Error, Runtime};

const BLOCK: usize = 1 << 16;

fn value(owner: usize, i: usize) -> u32 {
    (owner as u32) << 24 | i as u32
}

fn main() -> std::process::ExitCode {
    run_main(|info| {
        let stream = gpucomm_examples::rank_stream(&info)?;
        let (rt, how) = if info.launcher == Launcher::OpenMpi {
            (Runtime::with_bootstrap(stream.clone(), Bootstrap::Mpi)?, "MPI")
        } else {
            let mut rendezvous = Rendezvous::connect(&info, &Options::from_env()?)?;
            (Runtime::from_rendezvous(stream.clone(), &mut rendezvous)?, "unique id")
        };
        let (me, n) = (rt.my_pe(), rt.n_pes());
        if (me, n) != (info.rank, info.world_size) {
            return Err(format!(
                "NVSHMEM made this PE {me} of {n}, the launcher says rank {} of {}",
                info.rank, info.world_size
            )
            .into());
        }
        let about = rt.info();
        println!(
            "PE {me} of {n} (bootstrap: {how}): {}, OpenSHMEM {}.{}, heap limit {:.1} GiB (from {}), collectives through {}",
            about.name,
            about.spec_version.0,
            about.spec_version.1,
            about.heap.limit as f64 / (1u64 << 30) as f64,
            about.heap.limit_from,
            about.nccl
        );

        // Every PE's table: n blocks, all filled with this PE's values.
        let mut table = rt.alloc::<u32>(n * BLOCK)?;
        stream.memcpy_htod(&(0..n * BLOCK).map(|i| value(me, i)).collect::<Vec<_>>(), &mut table)?;
        rt.barrier_all_on_stream(&stream)?;

        // Block q comes from PE q's table.
        let mut fetched = stream.alloc_zeros::<u32>(n * BLOCK)?;
        for q in 0..n {
            let mut dst = fetched.slice_mut(q * BLOCK..(q + 1) * BLOCK);
            rt.get_on_stream(&mut dst, &table.slice(q * BLOCK..(q + 1) * BLOCK)?, q, &stream)?;
        }
        // A range past the end is refused, and nothing happened.
        match table.slice(n * BLOCK - 1..n * BLOCK + 1) {
            Err(Error::OutOfBounds { .. }) => {}
            other => return Err(format!("expected OutOfBounds, got {other:?}").into()),
        }
        rt.barrier_all_on_stream(&stream)?;

        let got = stream.clone_dtoh(&fetched)?;
        if let Some(i) = (0..n * BLOCK).find(|&i| got[i] != value(i / BLOCK, i)) {
            return Err(format!("PE {me}: element {i} is {:#x}, expected {:#x}", got[i], value(i / BLOCK, i)).into());
        }
        println!("PE {me} of {n}: fetched {n} blocks of {BLOCK} values, one from each PE, all correct");
        table.free().map_err(|(_, e)| e)?;
        rt.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}
