//! # The custom all-reduce kernels against NCCL
//!
//! A measuring program (not a lesson): this project's side of the comparison in
//! `docs/custom-kernels/`. It compares collectives fairly: the same sizes, the same method as
//! nccl-tests (host wall clock around back-to-back calls, then one synchronisation; nccl-tests'
//! bus bandwidth), every rank starting together, eagerly and replayed from a CUDA graph. In one
//! process per GPU, on the same machine, it times gpucomm-kernels' LL, one-shot and two-shot LSA
//! kernels (the production form of lessons 12–13's), lesson 14's NVSHMEM one-shot kernel, and
//! `ncclAllReduce` both on ordinary buffers and on symmetric windows (where NCCL uses its own
//! symmetric-memory kernels).
//!
//! How to run it (2 or more GPUs): `cargo bench -p examples --bench custom-kernels --
//! --nproc 2 [--json FILE] [--max BYTES]`. The GPU bundle runs it beside nccl-tests'
//! `all_reduce_perf` variants (`tools/gpu-custom-bench.sh`, which writes `ours.json` with
//! `--json`), and `tools/custom-vs-nccl-tests.py` draws the side-by-side table and plot committed
//! under `docs/custom-kernels/`.
//!
//! What it prints: on rank 0, one table row per size (8 B – 64 MiB) with µs per call for every
//! algorithm, eager and from a graph, and the best of ours against the best of NCCL's.

use std::io::Write;

use cudarc::driver::{CudaSlice, CudaStream, LaunchConfig};
use gpucomm_examples::bench::{self, BoxError};
use gpucomm_examples::kernels;
use gpucomm_examples::lsa::{LsaAllReduce, LL_MAX_BYTES};
use nccl::launch::{run_main, Options, Rendezvous};
use nccl::{Collectives, Comm, MemBuffer, MemView, MemViewMut, ReduceOp, WindowFlags};
use nvshmem::SymmetricSlice;

/// One-shot and NVSHMEM one-shot run up to this size; two-shot and NCCL up to `--max`.
const ONE_SHOT_MAX: usize = 4 << 20;
const NVSHMEM_CTAS: u32 = 32;

fn main() -> std::process::ExitCode {
    run_main(|info| {
        let json = bench::flag("--json");
        let max: usize = bench::flag("--max").map(|m| m.parse()).transpose()?.unwrap_or(64 << 20);

        gpucomm_examples::require_gpu_per_rank(&info)?;
        let ctx = cudarc::driver::CudaContext::new(info.device_ordinal(gpucomm_examples::cuda_devices()?)?)?;
        let stream = ctx.new_stream()?;
        let mut rendezvous = Rendezvous::connect(&info, &Options::from_env()?)?;
        let comm = Comm::from_rendezvous(stream.clone(), &mut rendezvous)?;
        let rt = nvshmem::Runtime::from_rendezvous(stream.clone(), &mut rendezvous)?;
        let rows = run(&comm, &rt, &stream, max)?;
        if comm.rank() == 0 {
            print_table(&rows, comm.size());
            if let Some(path) = json {
                let mut f = std::fs::File::create(&path)?;
                writeln!(f, "[")?;
                for (i, r) in rows.iter().enumerate() {
                    let sep = if i + 1 < rows.len() { "," } else { "" };
                    writeln!(
                        f,
                        "  {{\"bytes\": {}, \"algorithm\": \"{}\", \"mode\": \"{}\", \"us\": {:.3}, \"busbw\": {:.3}}}{sep}",
                        r.bytes, r.algorithm, r.mode, r.us, r.busbw
                    )?;
                }
                writeln!(f, "]")?;
                println!("results written to {path}");
            }
        }
        Ok(())
    })
}

/// One measurement.
struct Row {
    bytes: usize,
    algorithm: &'static str,
    mode: &'static str,
    us: f64,
    busbw: f64,
}

fn run(
    comm: &Comm,
    rt: &nvshmem::Runtime,
    stream: &std::sync::Arc<CudaStream>,
    max: usize,
) -> Result<Vec<Row>, BoxError> {
    let n = comm.size();
    let lsa = LsaAllReduce::new(comm, ONE_SHOT_MAX)?;
    let count = max / 4;
    let window = |len| -> Result<_, BoxError> {
        Ok(comm
            .register_window(MemBuffer::<f32>::zeroed(stream, len)?, WindowFlags::COLL_SYMMETRIC)
            .map_err(|(_, e)| e)?)
    };
    let send = window(count)?;
    let mut recv = window(count)?;
    let plain_send = MemBuffer::<f32>::zeroed(stream, count)?;
    let mut plain_recv = MemBuffer::<f32>::zeroed(stream, count)?;
    let mut scratch = MemBuffer::<f32>::zeroed(stream, 1)?;

    // NVSHMEM one-shot: its staging and signals on the symmetric heap.
    let module = rt.load_module(kernels::NVSHMEM_ALLREDUCE)?;
    let shmem = module.kernel("oneshot_sum_f32")?;
    let staging = rt.alloc_zeroed::<f32>(2 * ONE_SHOT_MAX / 4)?;
    let flags = rt.alloc_zeroed::<u64>(NVSHMEM_CTAS as usize * rt.n_pes())?;
    let mut calls = stream.alloc_zeros::<u64>(NVSHMEM_CTAS as usize)?;

    let mut rows = Vec::new();
    let mut bytes = 8usize;
    while bytes <= max {
        let c = bytes / 4;
        let (iters, graph_iters) = if bytes >= 8 << 20 { (20, 10) } else { (100, 50) };
        let src = send.slice(..c)?;
        let plain_src = plain_send.slice(..c)?;
        let mut dst = plain_recv.slice_mut(..c)?;
        let mut record = |algorithm: &'static str, eager: f64, graph: f64| {
            for (mode, us) in [("eager", eager), ("graph", graph)] {
                rows.push(Row { bytes, algorithm, mode, us, busbw: bench::all_reduce_busbw(bytes, n, us) });
            }
        };
        // Each graph keeps what its calls use (and gives it back): buffers, the LSA staging window,
        // the NVSHMEM module, the communicator.
        if bytes <= LL_MAX_BYTES {
            let eager = bench::eager(comm, &mut scratch, 5, iters, || lsa.ll(stream, &src, &mut dst))?;
            let kept = (lsa.staging(), &src, &mut dst);
            let graph =
                bench::graph(comm, &mut scratch, stream, graph_iters, 10, kept, |(_, s, d)| lsa.ll(stream, *s, *d))?;
            record("LL", eager, graph.0);
        }
        if bytes <= ONE_SHOT_MAX {
            let eager = bench::eager(comm, &mut scratch, 5, iters, || lsa.one_shot(stream, &src, &mut dst))?;
            let kept = (lsa.staging(), &src, &mut dst);
            let step = |(_, s, d): &mut (_, &_, &mut _)| lsa.one_shot(stream, *s, *d);
            let graph = bench::graph(comm, &mut scratch, stream, graph_iters, 10, kept, step)?;
            record("one-shot", eager, graph.0);
            let ctas = bytes.div_ceil(8 << 10).clamp(1, NVSHMEM_CTAS as usize) as u32;
            let cfg = LaunchConfig { grid_dim: (ctas, 1, 1), block_dim: (512, 1, 1), shared_mem_bytes: 0 };
            let slot = ONE_SHOT_MAX / 4;
            let mut st = staging.slice(..)?;
            let mut fl = flags.slice(..)?;
            let launch = |src: &MemView<'_, f32>,
                          dst: &mut MemViewMut<'_, f32>,
                          st: &mut SymmetricSlice<'_, f32>,
                          fl: &mut SymmetricSlice<'_, u64>,
                          calls: &mut CudaSlice<u64>|
             -> Result<(), BoxError> {
                // SAFETY: the arguments match `oneshot_sum_f32(const float *send, float *recv,
                // size_t n, float *staging, size_t slot_elems, uint64_t *flags, uint64_t *calls)`;
                // `src` and `dst` hold `c` ≤ `slot` floats, the symmetric staging 2 × `slot`, the
                // symmetric flags NVSHMEM_CTAS × n_pes signals, `calls` NVSHMEM_CTAS call counters; every
                // PE launches the same grid with the same count.
                unsafe {
                    shmem.launch_collective(cfg, stream, |a| {
                        a.buffer(src)?.buffer_mut(dst)?.value(c)?;
                        a.buffer_mut(st)?.value(slot)?.buffer_mut(fl)?.buffer_mut(calls)?;
                        Ok(())
                    })
                }?;
                Ok(())
            };
            let eager =
                bench::eager(comm, &mut scratch, 5, iters, || launch(&src, &mut dst, &mut st, &mut fl, &mut calls))?;
            let kept = (&module, &src, &mut dst, &mut st, &mut fl, &mut calls);
            let graph = bench::graph(comm, &mut scratch, stream, graph_iters, 10, kept, |(_, s, d, st, fl, calls)| {
                launch(s, d, st, fl, calls)
            })?;
            record("nvshmem one-shot", eager, graph.0);
        }
        let eager = bench::eager(comm, &mut scratch, 5, iters, || {
            // SAFETY: every rank allocates both windows with `count` ≥ `c` elements (`max` is the
            // same on every rank: every rank is started with the same arguments).
            unsafe { lsa.two_shot(stream, &send, 0, &mut recv, 0, c) }
        })?;
        // The graph keeps the kernels and both windows (the two-shot writes `recv` directly).
        let kept = (lsa.staging(), &send, &mut recv);
        let graph = bench::graph(comm, &mut scratch, stream, graph_iters, 10, kept, |(_, s, r)| {
            // SAFETY: as for the eager calls: the same windows.
            unsafe { lsa.two_shot(stream, s, 0, r, 0, c) }
        })?;
        record("two-shot", eager, graph.0);
        let eager =
            bench::eager(comm, &mut scratch, 5, iters, || Ok(comm.all_reduce(&plain_src, &mut dst, ReduceOp::SUM)?))?;
        let kept = (comm, &plain_src, &mut dst);
        let graph = bench::graph(comm, &mut scratch, stream, graph_iters, 10, kept, |(c, s, d)| {
            Ok(c.all_reduce(*s, *d, ReduceOp::SUM)?)
        })?;
        record("ncclAllReduce", eager, graph.0);
        {
            let mut win_dst = recv.slice_mut(..c)?;
            let eager = bench::eager(comm, &mut scratch, 5, iters, || {
                Ok(comm.all_reduce(&src, &mut win_dst, ReduceOp::SUM)?)
            })?;
            let kept = (comm, &src, &mut win_dst);
            let graph = bench::graph(comm, &mut scratch, stream, graph_iters, 10, kept, |(c, s, d)| {
                Ok(c.all_reduce(*s, *d, ReduceOp::SUM)?)
            })?;
            record("ncclAllReduce (symmetric windows)", eager, graph.0);
        }
        bytes *= 2;
    }
    flags.free().map_err(|(_, e)| e)?;
    staging.free().map_err(|(_, e)| e)?;
    Ok(rows)
}

fn print_table(rows: &[Row], ranks: usize) {
    let ours = ["LL", "one-shot", "nvshmem one-shot", "two-shot"];
    for mode in ["eager", "graph"] {
        println!("\n### {mode}: µs per all-reduce (f32 sum), {ranks} ranks\n");
        println!(
            "| size | LL | one-shot | NVSHMEM one-shot | two-shot | NCCL | NCCL symmetric | best ours / best NCCL |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        let mut sizes: Vec<usize> = rows.iter().map(|r| r.bytes).collect();
        sizes.dedup();
        for bytes in sizes {
            let get =
                |a: &str| rows.iter().find(|r| r.bytes == bytes && r.mode == mode && r.algorithm == a).map(|r| r.us);
            let cell = |a: &str| get(a).map_or("—".to_string(), |v| format!("{v:.2}"));
            let best = |names: &[&str]| names.iter().filter_map(|a| get(a)).fold(f64::INFINITY, f64::min);
            let theirs = best(&["ncclAllReduce", "ncclAllReduce (symmetric windows)"]);
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {:.2} |",
                bench::size_label(bytes),
                cell("LL"),
                cell("one-shot"),
                cell("nvshmem one-shot"),
                cell("two-shot"),
                cell("ncclAllReduce"),
                cell("ncclAllReduce (symmetric windows)"),
                best(&ours) / theirs
            );
        }
    }
}
