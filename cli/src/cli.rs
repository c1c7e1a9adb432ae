//! The command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::bench::coll::Collective;

/// Is NVLink really used, and at what speed? Layer-by-layer checks (`doctor`) and the Rust twin of
/// NVIDIA's nccl-tests (`bench`) for NCCL and NVSHMEM jobs.
///
/// NVLink multicast (NVLS) is never used: every process this tool starts runs with
/// NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1.
#[derive(Debug, Parser)]
#[command(name = "gpucomm", version, propagate_version = true, max_term_width = 100)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check GPUs, NVLink, libraries and what NCCL really does; ✓/✗ with a fix for each ✗.
    ///
    /// Three layers: physical (NVML: GPUs, NVLink links and error counters, topology, peer
    /// access), software (which NCCL and NVSHMEM were loaded, other copies a process could pick
    /// up, the environment variables that change NCCL's path), live (one process per GPU: a
    /// communicator, a short all-reduce and send/recv sweep, NCCL's own log read back for
    /// transports and algorithms, NVSHMEM reachability and put bandwidth).
    ///
    /// Exit status: 0 when nothing is ✗, 1 when something is, 2 for usage errors, 3 when the
    /// doctor itself could not run.
    Doctor(DoctorArgs),
    /// Measure collectives like nccl-tests does, with its table layout and formulas.
    ///
    /// Time is host wall clock around -n back-to-back calls followed by a stream sync, averaged
    /// over ranks; algbw = S / time with S per collective as nccl-tests defines it (1 GB = 1e9 B);
    /// busbw = algbw × 2(n−1)/n for all_reduce, (n−1)/n for all_gather, reduce_scatter and alltoall,
    /// 1 otherwise.
    ///
    /// Ranks: one process per GPU through the built-in spawner (default: every GPU; --nproc N),
    /// or under torchrun / mpirun / srun (their variables are read), or one process driving N
    /// GPUs (-g N).
    ///
    /// Exit status: 0 when all went well, 1 when validation (-c 1) found wrong elements, 2 for
    /// usage errors, 3 when a run failed.
    Bench(BenchArgs),
    /// Side-by-side table (and plot) of gpucomm bench results and nccl-tests logs: median over
    /// repeated runs, spread, busbw ratio Rust/C and time difference per size.
    Compare(CompareArgs),
    /// (internal) One rank of `doctor`'s live layer.
    #[command(name = "__doctor-worker", hide = true)]
    DoctorWorker(DoctorWorkerArgs),
    /// (internal) Loads one NCCL library in a fresh process and prints where it is and its version.
    #[command(name = "__probe-nccl", hide = true)]
    ProbeNccl {
        /// A path or a soname (`libnccl.so.2`) to open as the dynamic loader would.
        library: String,
    },
}

/// `gpucomm doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Skip the live layer (no processes are started, no GPU work is done).
    #[arg(long)]
    pub skip_live: bool,
    /// Processes (GPUs) for the live layer; default: every GPU.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..))]
    pub nproc: Option<u32>,
    /// Keep NCCL's logs and the ranks' results in DIR (default: a temporary directory, removed).
    #[arg(long, value_name = "DIR")]
    pub logs: Option<PathBuf>,
}

/// `gpucomm bench`.
#[derive(Debug, Args, Clone)]
pub struct BenchArgs {
    /// The collective.
    #[arg(value_enum, default_value_t = Collective::AllReduce)]
    pub collective: Collective,
    /// Smallest size in bytes (8, 8K, 8M, 8G).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_name = "SIZE")]
    pub min_bytes: String,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_name = "SIZE")]
    pub max_bytes: String,
    /// Multiply the size by this factor from one line to the next.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..))]
    pub factor: u64,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: u32,
    /// Warm-up iterations per size (before any timing, over every size).
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    pub warmup: u32,
    /// Data type: int8, uint8, int32, uint32, int64, uint64, half, bfloat16, float, double.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub dtype: String,
    /// Reduction: sum, prod, max, min, avg.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: String,
    /// Root rank of broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: usize,
    /// Check results (1) and count wrong elements in the #wrong column, or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=1))]
    pub check: u32,
    /// Drive N GPUs from this one process (ncclCommInitAll and groups) instead of one process per GPU.
    #[arg(short = 'g', long = "ngpus", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub ngpus: Option<u32>,
    /// Start N processes, one per GPU (default when no launcher variables and no -g: every GPU).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..), conflicts_with = "ngpus")]
    pub nproc: Option<u32>,
    /// Print the run as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Draw bus bandwidth against size into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// An nccl-tests log of the same collective to compare with: side-by-side table (and both
    /// curves plus their ratio in --plot).
    #[arg(long, value_name = "LOG")]
    pub compare: Option<PathBuf>,
}

/// `gpucomm compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// gpucomm bench results: `--json` output or the table it prints (repeat the option or name
    /// several files; several runs are reduced to their median).
    #[arg(long = "rust", value_name = "FILE", num_args = 1.., required = true)]
    pub rust: Vec<PathBuf>,
    /// nccl-tests logs of the same collective (one file may hold several runs).
    #[arg(long = "nccl-tests", value_name = "LOG", num_args = 1.., required = true)]
    pub c: Vec<PathBuf>,
    /// Draw both curves and their ratio into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Print the comparison as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `gpucomm __doctor-worker`.
#[derive(Debug, Args)]
pub struct DoctorWorkerArgs {
    /// `nccl` or `nvshmem`.
    #[arg(long)]
    pub phase: String,
    /// Where to write this rank's results.
    #[arg(long)]
    pub out: PathBuf,
}
