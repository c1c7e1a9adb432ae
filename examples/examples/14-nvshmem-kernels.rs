//! # Lesson 14 — NVSHMEM kernels: a put-with-signal ring and a one-shot all-reduce over `nvshmem_ptr`
//!
//! What it teaches:
//! * the NVSHMEM side of custom communication kernels (lessons 12–13 did it with NCCL's device
//!   API): device code in `examples/kernels/nvshmem_allreduce.cu`, device-linked with
//!   `libnvshmem_device.a` by `build.rs`, loaded with [`nvshmem::Runtime::load_module`] (which runs
//!   `nvshmemx_cumodule_init`);
//! * **put-with-signal**: each CTA of PE p sends its share of a buffer to PE p+1 together with a
//!   signal (`nvshmemx_int_put_signal_nbi_block`), then waits for the signal from PE p−1 — a ring
//!   step with no barrier and no host in the loop;
//! * **a one-shot all-reduce over `nvshmem_ptr` loads**: each CTA stages its share of the input in
//!   the symmetric heap, tells every peer with a signal carrying the call number, waits for theirs,
//!   and loads the peers' shares directly over NVLink;
//! * why both kernels are launched **collectively** ([`nvshmem::Kernel::launch_collective`]): their
//!   CTAs wait for the peers' CTAs, so every CTA of every PE must be resident at once.
//!
//! How to run it (2 to 8 GPUs of one machine that reach each other's memory by loads and stores:
//! NVLink or PCIe P2P; one GPU runs too, PE 0 sending to and loading from itself):
//! `cargo run --release -p examples --example 14-nvshmem-kernels -- --nproc 2`. Where a
//! peer is not reachable that way, or there are more than 8 PEs, the lesson says so and stops.
//!
//! What you should see, on every PE: `ring: 3 rounds … correct`, then one `one-shot … correct`
//! line per (type, count), for f32 and bf16 and counts 1, 3, 1000 and 1000003.

use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig, ValidAsZeroBits};
use gpucomm_examples::bench::BoxError;
use gpucomm_examples::kernels;
use nvshmem::launch::run_main;
use nvshmem::{Kernel, Runtime};

const RING_COUNT: usize = 1 << 20;
const THREADS: u32 = 512;
/// CTAs of the one-shot kernel at most (its flags are sized for them).
const MAX_CTAS: u32 = 32;
/// The largest one-shot message, in elements.
const MAX_COUNT: usize = 1_000_003;
/// PEs the one-shot kernel sums at most (checked in `main`).
const MAX_PES: usize = 8;

fn main() -> std::process::ExitCode {
    run_main(|info| {
        let (_, rt) = gpucomm_examples::nvshmem_runtime(&info)?;
        // The one-shot kernel sums at most 8 PEs: a larger job is refused before the ring runs.
        let pes = rt.n_pes();
        if pes > MAX_PES {
            return Err(format!("the one-shot kernel sums at most {MAX_PES} PEs, and this job has {pes}").into());
        }
        // A stream of our own for the kernels.
        let stream = rt.context().new_stream()?;
        let module = rt.load_module(kernels::NVSHMEM_ALLREDUCE)?;
        ring(&rt, &stream, &module.kernel("ring_put_signal")?)?;
        let mut one_shot = OneShot::new(&rt, &stream)?;
        for count in [1usize, 3, 1000, MAX_COUNT] {
            one_shot.check::<f32>(&stream, &module.kernel("oneshot_sum_f32")?, count, |v| v as f32)?;
            one_shot.check::<half::bf16>(&stream, &module.kernel("oneshot_sum_bf16")?, count, |v| {
                half::bf16::from_f32(v as f32)
            })?;
        }
        one_shot.free()?;
        // Collective teardown, checked (dropping would hide a failure).
        drop(module);
        rt.finalize().map_err(|(_, e)| e)?;
        Ok(())
    })
}

/// Three ring rounds: PE p's values land in PE p+1's inbox, announced by a signal.
fn ring(rt: &Runtime, stream: &Arc<CudaStream>, kernel: &Kernel<'_, '_>) -> Result<(), BoxError> {
    let (me, n) = (rt.my_pe(), rt.n_pes());
    let value = |pe: usize, i: usize| (pe * 1_000_000 + i) as i32;
    let mut inbox = rt.alloc_zeroed::<i32>(RING_COUNT)?;
    let mut signal = rt.alloc_zeroed::<u64>(1)?;
    let mine = stream.clone_htod(&(0..RING_COUNT).map(|i| value(me, i)).collect::<Vec<_>>())?;
    let ctas = kernel.max_collective_blocks(THREADS, 0)?.min(64) as u32;
    let cfg = LaunchConfig { grid_dim: (ctas, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    for round in 1..=3u64 {
        // SAFETY: the arguments match `ring_put_signal(int *dst, const int *src, size_t n,
        // uint64_t *signal, uint64_t round)`; `inbox` (symmetric) and `mine` hold RING_COUNT ints,
        // `signal` (symmetric) one; every PE launches the same grid, as the signal counts require.
        unsafe {
            kernel.launch_collective(cfg, stream, |a| {
                a.buffer_mut(&mut inbox)?.buffer(&mine)?.value(RING_COUNT)?.buffer_mut(&mut signal)?.value(round)?;
                Ok(())
            })
        }?;
    }
    let got = stream.clone_dtoh(&inbox)?;
    let from = (me + n - 1) % n;
    if let Some(i) = (0..RING_COUNT).find(|&i| got[i] != value(from, i)) {
        return Err(format!("PE {me}: ring element {i} is {}, expected {}", got[i], value(from, i)).into());
    }
    println!("PE {me} of {n}: ring: 3 rounds of {RING_COUNT} ints from PE {from} with put-with-signal, correct");
    signal.free().map_err(|(_, e)| e)?;
    inbox.free().map_err(|(_, e)| e)?;
    Ok(())
}

/// What the one-shot kernel keeps across calls: on the symmetric heap two staging slots and one
/// signal per (CTA, PE); locally one call counter per possible CTA (MAX_CTAS), which every launch
/// advances. Signals carry call numbers and are waited for with "≥", so the counters must only
/// grow: they live as long as the signals.
struct OneShot<'rt> {
    rt: &'rt Runtime,
    staging: nvshmem::Symmetric<'rt, u8>,
    flags: nvshmem::Symmetric<'rt, u64>,
    calls: cudarc::driver::CudaSlice<u64>,
}

impl<'rt> OneShot<'rt> {
    fn new(rt: &'rt Runtime, stream: &Arc<CudaStream>) -> Result<Self, BoxError> {
        let staging = rt.alloc_zeroed::<u8>(2 * MAX_COUNT * 4)?;
        // The kernel loads every peer's staged share through `nvshmem_ptr` (and sums at most
        // MAX_PES PEs, which `main` checked): a peer it cannot load from is refused here, before
        // the kernel would dereference a null pointer.
        let (me, n) = (rt.my_pe(), rt.n_pes());
        for pe in 0..n {
            if staging.peer(pe)?.is_none() {
                return Err(format!(
                    "PE {pe}'s memory is not reachable by loads and stores from PE {me} (nvshmem_ptr gives \
                     null: no NVLink or PCIe P2P path, or another machine); the one-shot kernel needs every peer's"
                )
                .into());
            }
        }
        let flags = rt.alloc_zeroed::<u64>(MAX_CTAS as usize * rt.n_pes())?;
        let calls = stream.alloc_zeros::<u64>(MAX_CTAS as usize)?;
        Ok(OneShot { rt, staging, flags, calls })
    }

    /// PE r contributes (r + 1) × (i mod 13); the sum must equal the host reference exactly.
    fn check<T: nccl::NcclType + ValidAsZeroBits + PartialEq + std::fmt::Debug>(
        &mut self,
        stream: &Arc<CudaStream>,
        kernel: &Kernel<'_, '_>,
        count: usize,
        from: impl Fn(u32) -> T,
    ) -> Result<(), BoxError> {
        let (me, n) = (self.rt.my_pe() as u32, self.rt.n_pes() as u32);
        let host: Vec<T> = (0..count as u32).map(|i| from((me + 1) * (i % 13))).collect();
        let expected: Vec<T> = (0..count as u32).map(|i| from(n * (n + 1) / 2 * (i % 13))).collect();
        let send = stream.clone_htod(&host)?;
        let mut recv = stream.alloc_zeros::<T>(count)?;
        let ctas = (count * size_of::<T>()).div_ceil(8 << 10).clamp(1, MAX_CTAS as usize) as u32;
        let cfg = LaunchConfig { grid_dim: (ctas, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let slot = MAX_COUNT * 4 / size_of::<T>();
        let mut staging = self.staging.slice(..)?;
        let mut flags = self.flags.slice(..)?;
        let calls = &mut self.calls;
        // Twice, so that both staging slots and increasing call numbers are used.
        for _ in 0..2 {
            // SAFETY: the arguments match `oneshot_sum_<T>(const T *send, T *recv, size_t n, T
            // *staging, size_t slot_elems, uint64_t *flags, uint64_t *calls)`; `send` and `recv`
            // hold `count` ≤ `slot` elements, `staging` 2 × `slot` (symmetric), `flags` MAX_CTAS ×
            // n_pes signals (symmetric), `calls` MAX_CTAS call counters; `ctas` ≤ MAX_CTAS; every PE
            // launches the same grid with the same count; at most MAX_PES PEs (checked in `main`),
            // each of whose staging the kernel can load through `nvshmem_ptr` (checked in
            // `OneShot::new`).
            unsafe {
                kernel.launch_collective(cfg, stream, |a| {
                    a.buffer(&send)?.buffer_mut(&mut recv)?.value(count)?;
                    a.buffer_mut(&mut staging)?.value(slot)?.buffer_mut(&mut flags)?.buffer_mut(&mut *calls)?;
                    Ok(())
                })
            }?;
        }
        let got = stream.clone_dtoh(&recv)?;
        if let Some(i) = (0..count).find(|&i| got[i] != expected[i]) {
            return Err(format!(
                "PE {me}: one-shot {} × {count}: element {i} is {:?}, expected {:?}",
                short_name::<T>(),
                got[i],
                expected[i]
            )
            .into());
        }
        println!("PE {me}: one-shot all-reduce over nvshmem_ptr of {count} {} correct", short_name::<T>());
        Ok(())
    }

    fn free(self) -> Result<(), BoxError> {
        self.flags.free().map_err(|(_, e)| e)?;
        self.staging.free().map_err(|(_, e)| e)?;
        Ok(())
    }
}

/// `f32`, `bf16`: the element type's name without its module path.
fn short_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}
