//! One rank of the doctor's live layer (`gpucomm __doctor-worker`), started by the spawner.
//!
//! Phase `nccl`: a communicator, an all-reduce and a send/recv sweep (the bench engine, a few
//! sizes), NCCL logging to a file the parent reads. Phase `nvshmem`: NCCL loaded first (as a
//! program using both would), NVSHMEM started, peer reachability (`nvshmem_ptr`), put bandwidth,
//! and which NCCL files ended up mapped into the process.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpucomm_launch::{Options, RankInfo, Rendezvous};
use serde::{Deserialize, Serialize};

use super::libs::{self, NCCL_STEM};
use crate::bench::coll::Collective;
use crate::bench::elem::{DType, Op};
use crate::bench::engine::{self, Ranks, Spec};
use crate::bench::nccl_ops;
use crate::cli::{DoctorWorkerArgs, Init, Knobs, Phase};
use crate::cuda;
use crate::error::{CliError, Result};

/// A worker that has not finished by then gives up (a hung NCCL must not hang the doctor).
const DEADLINE: Duration = Duration::from_secs(180);

/// Sizes of the doctor's sweeps: 8 B to 1 GiB, ×8.
const SIZES: (u64, u64, u64) = (8, 1 << 30, 8);

/// Bytes NVSHMEM puts per call.
pub const PUT_BYTES: usize = 64 << 20;

/// One point of a sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Size, bytes.
    pub bytes: u64,
    /// Mean time, µs (averaged over ranks).
    pub time_us: f64,
    /// Bus bandwidth, GB/s.
    pub busbw: f64,
}

/// What the `nccl` phase found on one rank.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NcclPhase {
    /// Rank.
    pub rank: usize,
    /// Process id (names the NCCL log file).
    pub pid: u32,
    /// CUDA ordinal.
    pub device: usize,
    /// PCI address of the device.
    pub bus_id: String,
    /// Loaded NCCL version.
    pub nccl_version: Option<String>,
    /// All-reduce sweep.
    pub all_reduce: Vec<Point>,
    /// Send/recv sweep (send to rank+1, receive from rank−1).
    pub sendrecv: Vec<Point>,
    /// What failed.
    pub error: Option<String>,
}

/// What the `nvshmem` phase found on one PE.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NvshmemPhase {
    /// PE (= rank).
    pub rank: usize,
    /// NVSHMEM version.
    pub nvshmem_version: Option<String>,
    /// `(pe, reachable by load/store)` for every other PE.
    pub reachable: Vec<(usize, bool)>,
    /// `putmem_on_stream` bandwidth to the next PE, GB/s.
    pub put_gbps: Option<f64>,
    /// NCCL files mapped into this process after NVSHMEM started.
    pub nccl_mapped: Vec<PathBuf>,
    /// What failed.
    pub error: Option<String>,
}

/// Points this process's standard output at its standard error, so that nothing NCCL or NVSHMEM
/// prints mixes into the parent's stdout (tables, JSON).
pub fn stdout_to_stderr() {
    // SAFETY: dup2 on the standard descriptors; both stay open for the life of the process.
    unsafe { libc::dup2(2, 1) };
}

/// The file a phase's result goes to.
pub fn result_path(dir: &Path, phase: Phase, rank: usize) -> PathBuf {
    dir.join(format!("{}-rank{rank}.json", phase.name()))
}

/// `gpucomm __doctor-worker --phase P --out DIR`.
pub fn run(args: &DoctorWorkerArgs) -> Result<()> {
    stdout_to_stderr();
    std::thread::spawn(|| {
        std::thread::sleep(DEADLINE);
        eprintln!("doctor worker: no result after {} s, giving up", DEADLINE.as_secs());
        // `_exit`, not `exit`: exit handlers (CUDA's and NCCL's teardown) could block behind the
        // main thread, which is stuck in the GPU work this deadline gives up on.
        // SAFETY: `_exit` ends the process at once; it has no preconditions.
        unsafe { libc::_exit(124) }
    });
    let info = RankInfo::from_env()?;
    let ordinal = info.device_ordinal(cuda::device_count())?;
    let mut rendezvous = Rendezvous::connect(&info, &Options::from_env()?)?;
    let json = match args.phase {
        Phase::Nccl => to_json(&nccl_phase(&info, ordinal, rendezvous))?,
        Phase::Nvshmem => to_json(&nvshmem_phase(&info, ordinal, &mut rendezvous))?,
    };
    let path = result_path(&args.out, args.phase, info.rank);
    std::fs::write(&path, json).map_err(|source| CliError::Io { what: "writing", path, source })
}

fn to_json<T: Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|source| CliError::Json { what: "a doctor result".into(), source })
}

/// The NCCL part of the live layer. The rendezvous stays with the communicator: the sweeps use it
/// as their barrier, as `gpucomm bench` does.
fn nccl_phase(info: &RankInfo, ordinal: usize, mut rendezvous: Rendezvous) -> NcclPhase {
    let mut out = NcclPhase {
        rank: info.rank,
        pid: std::process::id(),
        device: ordinal,
        bus_id: cuda::pci_address(ordinal).unwrap_or_default(),
        ..NcclPhase::default()
    };
    out.nccl_version = nccl::version().ok().map(|v| v.to_string());
    let result = (|| -> Result<()> {
        let stream = nccl_ops::rank_stream(ordinal, false)?;
        let comm = nccl_ops::join(stream, &mut rendezvous, Init::Rank)?;
        let ranks = Ranks::Process(comm, Box::new(std::cell::RefCell::new(rendezvous)));
        let sweep = |coll| -> Result<Vec<Point>> {
            let spec = Spec {
                coll,
                dtype: DType::F32,
                op: Op::Sum,
                root: 0,
                min: SIZES.0,
                max: SIZES.1,
                factor: SIZES.2,
                warmup: 2,
                iters: 10,
                check: false,
                knobs: Knobs::default(),
            };
            let run = engine::run(&ranks, &spec, &mut |_| {})?;
            Ok(run
                .rows
                .iter()
                .filter_map(|r| {
                    r.out_of_place.as_ref().map(|m| Point { bytes: r.size, time_us: m.time_us, busbw: m.busbw })
                })
                .collect())
        };
        let swept = sweep(Collective::AllReduce).and_then(|ar| Ok((ar, sweep(Collective::SendRecv)?)));
        let finalized = nccl_ops::finalize(ranks.into_comms());
        (out.all_reduce, out.sendrecv) = swept?;
        Ok(finalized?)
    })();
    out.error = result.err().map(|e| chain(&e));
    out
}

fn nvshmem_phase(info: &RankInfo, ordinal: usize, rendezvous: &mut Rendezvous) -> NvshmemPhase {
    let mut out = NvshmemPhase { rank: info.rank, ..NvshmemPhase::default() };
    // A program that uses both loads NCCL first when it creates its communicator.
    let _ = nccl::version();
    out.nvshmem_version = nvshmem::version().ok().map(|v| v.to_string());
    let result = (|| -> std::result::Result<(), String> {
        let stream = cudarc::driver::CudaContext::new(ordinal).map_err(|e| e.to_string())?.default_stream();
        let rt = nvshmem::Runtime::from_rendezvous(stream.clone(), rendezvous).map_err(|e| chain(&e))?;
        out.nccl_mapped = libs::mapped(NCCL_STEM).into_iter().map(libs::json_safe).collect();
        let (me, n) = (rt.my_pe(), rt.n_pes());
        let buf = rt.alloc::<u8>(PUT_BYTES).map_err(|e| chain(&e))?;
        let measured = (|| -> std::result::Result<(), String> {
            for pe in (0..n).filter(|&p| p != me) {
                out.reachable.push((pe, buf.peer(pe).map_err(|e| chain(&e))?.is_some()));
            }
            if n > 1 {
                let src = stream.alloc_zeros::<u8>(PUT_BYTES).map_err(|e| e.to_string())?;
                let peer = (me + 1) % n;
                let round = |count: usize| -> std::result::Result<f64, String> {
                    rt.barrier_all().map_err(|e| chain(&e))?;
                    let t = Instant::now();
                    for _ in 0..count {
                        rt.put_on_stream(&buf, &src, peer, &stream).map_err(|e| chain(&e))?;
                    }
                    rt.barrier_all_on_stream(&stream).map_err(|e| chain(&e))?;
                    stream.synchronize().map_err(|e| e.to_string())?;
                    Ok(t.elapsed().as_secs_f64())
                };
                round(3)?;
                let iters = 10;
                let secs = round(iters)?;
                out.put_gbps = Some((PUT_BYTES * iters) as f64 / secs / 1e9);
            }
            Ok(())
        })();
        let freed = buf.free().map_err(|(_, e)| chain(&e));
        measured?;
        freed?;
        rt.finalize().map_err(|(_, e)| chain(&e))
    })();
    out.error = result.err();
    out
}

/// An error with its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    s
}
