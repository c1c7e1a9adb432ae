//! One rank's start: flags, the candle device, the communication stream, the communicator.

use std::sync::Arc;

use candle_core::{CudaDevice, Device};
use cudarc::driver::CudaStream;
use nccl::launch::{Options, RankInfo, Rendezvous};
use nccl::Comm;

use crate::BoxError;

/// The command line after the launcher's own flags: `--name value` pairs and bare `--switch`es.
#[derive(Debug, Clone)]
pub struct Flags(Vec<String>);

impl Flags {
    /// This process's arguments.
    pub fn from_env() -> Self {
        Flags(std::env::args().skip(1).collect())
    }

    /// True when `--name` was given.
    pub fn has(&self, name: &str) -> bool {
        self.0.iter().any(|a| a == name)
    }

    /// The value after `--name`, parsed, or `default`.
    pub fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, BoxError>
    where
        T::Err: std::fmt::Display,
    {
        match self.0.iter().position(|a| a == name) {
            None => Ok(default),
            Some(i) => {
                let value = self.0.get(i + 1).ok_or_else(|| format!("{name} needs a value"))?;
                value.parse().map_err(|e| format!("{name} {value}: {e}").into())
            }
        }
    }
}

/// A rank's GPU as candle sees it, and the second stream the lessons communicate on.
pub struct Gpu {
    /// The candle device: its stream (`CudaDevice::cuda_stream`, the context's per-thread stream)
    /// runs every candle kernel.
    pub device: Device,
    /// The same device, CUDA side.
    pub cuda: CudaDevice,
    /// Candle's stream.
    pub compute: Arc<CudaStream>,
    /// The communication stream: NCCL's work, and the copies into and out of its buffers.
    pub comm: Arc<CudaStream>,
}

impl Gpu {
    /// Opens `ordinal` for candle and creates the communication stream on candle's own CUDA context.
    ///
    /// The order matters: cudarc gives a buffer its ordering events (the "last written here / read
    /// there" marks that make one stream wait for another) only once its context has a second
    /// stream. The communication stream is therefore created before any tensor exists, and on the
    /// very `CudaContext` object candle uses (another `CudaContext::new` of the same GPU would be a
    /// separate object, whose streams candle's buffers know nothing about).
    pub fn open(ordinal: usize) -> Result<Self, BoxError> {
        let device = Device::new_cuda(ordinal)?;
        let Device::Cuda(cuda) = &device else { return Err("candle did not open a CUDA device".into()) };
        let cuda = cuda.clone();
        let compute = cuda.cuda_stream();
        let comm = compute.context().new_stream()?;
        // Plain f32 GEMMs (no TF32): the lessons compare results with a single-GPU run.
        candle_core::cuda::set_gemm_reduced_precision_f32(false);
        Ok(Gpu { device, cuda, compute, comm })
    }
}

/// With `--split-hosts`, each rank sets `NCCL_HOSTID` to a value of its own before NCCL starts:
/// NCCL then takes the ranks for separate machines and connects them over sockets, which lets two
/// ranks share one GPU (NCCL refuses two ranks of one communicator on one GPU of one host). Setting
/// `NCCL_HOSTID=a` / `NCCL_HOSTID=b` by hand in two shells does the same.
pub fn split_hosts(flags: &Flags, info: &RankInfo) {
    if flags.has("--split-hosts") {
        // The lessons call this first thing, before any thread that could read the environment.
        std::env::set_var("NCCL_HOSTID", format!("gpucomm-lesson-rank-{}", info.rank));
    }
}

/// This rank's GPU, then a communicator over every rank of the job with the communication stream
/// as its default stream (rank 0 creates the id, the rendezvous hands it out). More ranks on a node
/// than GPUs are refused first, unless each has its own `NCCL_HOSTID` ([`split_hosts`]).
pub fn rank_gpu_comm(info: &RankInfo) -> Result<(Gpu, Comm), BoxError> {
    gpucomm_examples::require_gpu_per_rank(info)?;
    let ordinal = info.device_ordinal(gpucomm_examples::cuda_devices()?)?;
    let gpu = Gpu::open(ordinal)?;
    let mut rendezvous = Rendezvous::connect(info, &Options::from_env()?)?;
    let comm = Comm::from_rendezvous(gpu.comm.clone(), &mut rendezvous)?;
    Ok((gpu, comm))
}

/// The NCCL version line every lesson starts with (rank 0).
pub fn banner(lesson: &str, comm: &Comm) -> Result<(), BoxError> {
    if comm.rank() == 0 {
        println!("{lesson}: {} ranks, NCCL {} (loaded), candle 0.11 on CUDA", comm.size(), nccl::version()?);
    }
    Ok(())
}
