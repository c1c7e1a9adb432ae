//! # Lesson 11 — NVSHMEM: your own kernel, putting to the next PE from the GPU
//!
//! What it teaches:
//! * kernels can call NVSHMEM themselves (`nvshmem_int_p`, `nvshmem_barrier_all`, …): see
//!   `examples/kernels/nvshmem_ring.cu`. Such code is compiled with relocatable device code and
//!   device-linked against NVSHMEM's `libnvshmem_device.a` into one cubin — this package's
//!   `build.rs` does it with `build_support`'s `nvcc` helper, for `CUDA_ARCHS` (default
//!   sm_90) — and embedded as `gpucomm_examples::kernels::NVSHMEM_RING`;
//! * [`nvshmem::Runtime::load_module`] loads the cubin and registers it with NVSHMEM
//!   (`nvshmemx_cumodule_init`); a cubin for another GPU, or one not linked with NVSHMEM, is
//!   refused with a clear error;
//! * a kernel whose blocks wait for each other (a grid-wide sync) and for other PEs (a device-side
//!   barrier) needs all its blocks on the GPU at once: [`nvshmem::Kernel::launch_collective`]
//!   checks the grid fits ([`nvshmem::Kernel::max_collective_blocks`]) and launches it
//!   cooperatively;
//! * kernel arguments are pushed in order; buffers go through the same stream ordering as every
//!   other use.
//!
//! How to run it (two or more GPUs; one GPU runs too, PE 0's kernel putting to itself):
//! `cargo run -p examples --example 11-nvshmem-kernel -- --nproc 2`.
//!
//! What you should see, once per PE (the block count is as many as the GPU holds at once, 264 on
//! an H200 or H100 with its 132 SMs):
//! `PE 0 of 2: kernel of 264 blocks × 256 threads put 1048576 values to PE 1; received PE 1's, all correct`.

use cudarc::driver::LaunchConfig;
use nvshmem::launch::run_main;

/// The device-linked cubin that build.rs made from `kernels/nvshmem_ring.cu`.
const RING: &[u8] = gpucomm_examples::kernels::NVSHMEM_RING;
const COUNT: usize = 1 << 20;
const THREADS: u32 = 256;

/// What PE `pe` puts at index `i` (the kernel checks the same formula).
fn value(pe: usize, i: usize) -> i32 {
    (pe as i32 + 1) * 1_000_000 + i as i32
}

fn main() -> std::process::ExitCode {
    run_main(|info| {
        // The GPU, the rendezvous and NVSHMEM's start, as in lesson 7.
        let (stream, rt) = gpucomm_examples::nvshmem_runtime(&info)?;
        let (me, n) = (rt.my_pe(), rt.n_pes());

        let module = rt.load_module(RING)?;
        let ring = module.kernel("ring_put")?;
        let mut inbox = rt.alloc_zeroed::<i32>(COUNT)?;
        let mine = stream.clone_htod(&(0..COUNT).map(|i| value(me, i)).collect::<Vec<_>>())?;
        let mut errors = stream.alloc_zeros::<i32>(1)?;

        // As many blocks as fit on the GPU at once (the same number on every PE's identical GPU).
        let blocks = ring.max_collective_blocks(THREADS, 0)?.min((COUNT as u64).div_ceil(THREADS as u64)) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match `ring_put(int *inbox, const int *mine, int n, int *errors)`;
        // the kernel touches `n` elements of `inbox` (on every PE, symmetric) and of `mine`, and one
        // of `errors`.
        unsafe {
            ring.launch_collective(cfg, &stream, |args| {
                args.buffer_mut(&mut inbox)?.buffer(&mine)?.value(COUNT as i32)?.buffer_mut(&mut errors)?;
                Ok(())
            })
        }?;

        let wrong = stream.clone_dtoh(&errors)?[0];
        let prev = (me + n - 1) % n;
        let got = stream.clone_dtoh(&inbox)?;
        if wrong != 0 || (0..COUNT).any(|i| got[i] != value(prev, i)) {
            return Err(format!(
                "PE {me}: {wrong} wrong values seen by the kernel; host check of PE {prev}'s values failed"
            )
            .into());
        }
        println!(
            "PE {me} of {n}: kernel of {blocks} blocks × {THREADS} threads put {COUNT} values to PE {}; received PE {prev}'s, all correct",
            (me + 1) % n
        );

        // Everyone has read its inbox before anyone frees.
        rt.barrier_all_on_stream(&stream)?;
        inbox.free().map_err(|(_, e)| e)?;
        drop(module);
        rt.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}
