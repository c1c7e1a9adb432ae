//! Small helpers the lessons (`examples/*.rs`) and the measuring programs (`benches/*.rs`) share,
//! so that each file shows only its lesson or its measurement.

pub mod bench;
pub mod lsa;

/// The lessons' CUDA kernels, compiled by `build.rs` into module images for `cuModuleLoadData`:
/// `STEP` (plain CUDA, `kernels/step.cu`), `LSA_ONE_SHOT` (NCCL's device API, lesson 12's own
/// `examples/12-lsa-one-shot.cu`), `NVSHMEM_RING`, `NVSHMEM_BENCH`, `NVSHMEM_ALLREDUCE` (NVSHMEM,
/// device-linked, `kernels/*.cu`). The LSA all-reduce kernels of lessons 13 and 15 and the
/// custom-kernels bench are gpucomm-kernels' ([`lsa`]).
pub mod kernels {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use nccl::launch::{Options, RankInfo, Rendezvous};

/// Why there is no GPU to run on.
#[derive(Debug)]
pub enum NoGpu {
    /// `libcuda.so.1` (the NVIDIA driver's library) could not be loaded.
    NoDriver,
    /// The driver loaded but reports no device (or failed to initialise).
    NoDevice(String),
}

impl fmt::Display for NoGpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoGpu::NoDriver => write!(
                f,
                "no CUDA driver: libcuda.so.1 could not be loaded, so this machine has no usable NVIDIA GPU; \
                 run the GPU parts on a GPU machine"
            ),
            NoGpu::NoDevice(why) => {
                write!(f, "no GPU: the CUDA driver is installed but reports no usable device ({why})")
            }
        }
    }
}

impl Error for NoGpu {}

/// Number of CUDA devices, or why there are none. Fast on machines without a driver: it only
/// tries to load `libcuda.so.1`. Works whichever way cudarc reaches the driver: loaded at run time
/// (these lessons) or linked (the candle lessons, where the program cannot start without it).
pub fn cuda_devices() -> Result<usize, NoGpu> {
    // SAFETY: loading the NVIDIA driver library runs no initialisation code with preconditions
    // (cudarc loads the same library by the same name on first use); the handle is dropped at once.
    if unsafe { libloading::Library::new("libcuda.so.1") }.is_err() {
        return Err(NoGpu::NoDriver);
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(n as usize),
        Ok(_) => Err(NoGpu::NoDevice("device count is 0".into())),
        Err(e) => Err(NoGpu::NoDevice(e.to_string())),
    }
}

/// Refuses, before touching a GPU, a lesson that needs at least `n` ranks and was started with
/// fewer (one process without `--nproc`, or a one-GPU machine), saying how to run it.
pub fn require_ranks(info: &RankInfo, n: usize) -> Result<(), Box<dyn Error>> {
    if info.world_size >= n {
        return Ok(());
    }
    Err(format!(
        "this lesson needs at least {n} ranks, one per GPU, and was started with {}: run it with --nproc {n} \
         (or a launcher with {n} processes) on a machine with {n} GPUs",
        info.world_size
    )
    .into())
}

/// Refuses, before NCCL sees them, more ranks on this node than it has GPUs. Every rank would then
/// open GPU 0 ([`RankInfo::device_ordinal`] gives the one visible GPU to every rank), and NCCL
/// refuses two ranks of one communicator on one GPU of one host (`ncclInvalidUsage`, "Duplicate
/// GPU detected" in its log). Let through are ranks that NCCL takes for separate hosts
/// (`NCCL_HOSTID` set, a value of its own on each rank, as the candle lessons' `--split-hosts`
/// sets it and the GPU bundle's `torchrun-2nodes` mode does) and ranks that may each see a GPU of
/// their own (`CUDA_VISIBLE_DEVICES` set per rank, or Slurm's `--gpus-per-task`).
pub fn require_gpu_per_rank(info: &RankInfo) -> Result<(), Box<dyn Error>> {
    let gpus = cuda_devices()?;
    let own_gpus = info.gpus_per_task == Some(gpus) || std::env::var_os("CUDA_VISIBLE_DEVICES").is_some();
    if info.local_world_size <= gpus || own_gpus || std::env::var_os("NCCL_HOSTID").is_some() {
        return Ok(());
    }
    Err(format!(
        "{} ranks on this node but {gpus} GPU(s): NCCL needs one GPU per rank on a node (run with --nproc {gpus}, \
         or give each rank its own NCCL_HOSTID as the candle lessons' --split-hosts does)",
        info.local_world_size
    )
    .into())
}

/// Opens the GPU this rank should use (its local rank, see [`RankInfo::device_ordinal`]) and
/// returns its default stream.
pub fn rank_stream(info: &RankInfo) -> Result<Arc<CudaStream>, Box<dyn Error>> {
    let ordinal = info.device_ordinal(cuda_devices()?)?;
    Ok(CudaContext::new(ordinal)?.default_stream())
}

/// The start of every one-process-per-GPU NCCL lesson after lesson 2 (which shows it step by
/// step): this rank's GPU, a stream of its own on it, the rendezvous, and a communicator over
/// every rank on that stream. The stream is not the GPU's legacy default stream, which a CUDA
/// graph cannot capture (lesson 15 captures one). More ranks on a node than GPUs are refused first
/// ([`require_gpu_per_rank`]).
pub fn rank_comm(info: &RankInfo) -> Result<(Arc<CudaStream>, nccl::Comm), Box<dyn Error>> {
    require_gpu_per_rank(info)?;
    let stream = rank_stream(info)?.context().new_stream()?;
    let mut rendezvous = Rendezvous::connect(info, &Options::from_env()?)?;
    let comm = nccl::Comm::from_rendezvous(stream.clone(), &mut rendezvous)?;
    Ok((stream, comm))
}

/// Starts NVSHMEM on this rank the way lesson 7 shows step by step: the rank's GPU, the
/// rendezvous, and a runtime started from the unique id that rank 0 creates. Returns the GPU's
/// default stream and the runtime.
pub fn nvshmem_runtime(info: &RankInfo) -> Result<(Arc<CudaStream>, nvshmem::Runtime), Box<dyn Error>> {
    let stream = rank_stream(info)?;
    let mut rendezvous = Rendezvous::connect(info, &Options::from_env()?)?;
    let rt = nvshmem::Runtime::from_rendezvous(stream.clone(), &mut rendezvous)?;
    Ok((stream, rt))
}
