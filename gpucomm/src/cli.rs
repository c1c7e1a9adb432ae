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
    /// busbw = algbw × 2(n−1)/n for all_reduce, (n−1)/n for all_gather, reduce_scatter, alltoall,
    /// gather and scatter, 1 otherwise.
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
    /// Print the report as JSON (alone on stdout; anything else goes to stderr). It carries only
    /// the environment variables the doctor reasons about, with secret values (names containing
    /// KEY, TOKEN, SECRET, PASSWORD or CREDENTIAL) redacted.
    #[arg(long)]
    pub json: bool,
    /// Skip the live layer (no processes are started, no GPU work is done).
    #[arg(long)]
    pub skip_live: bool,
    /// Processes (GPUs) for the live layer; default: every GPU.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..))]
    pub nproc: Option<u32>,
    /// Keep NCCL's logs and the ranks' results in DIR (default: a temporary directory, removed); an
    /// earlier run's results and NCCL logs there are removed before the ranks start.
    #[arg(long, value_name = "DIR")]
    pub logs: Option<PathBuf>,
    /// Also write the report as JSON (what `--json` prints) to FILE, from the same run: the text
    /// report and every figure of one live run.
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<PathBuf>,
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
    /// Warm-up iterations at each of -b, 2·-b, 4·-b … up to -e, before any timing (doubling
    /// whatever -f is, as nccl-tests does).
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    pub warmup: u32,
    /// Data type: int8, uint8, int32, uint32, int64, uint64, half, bfloat16, float, double.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub dtype: String,
    /// Reduction: sum, prod, max, min, avg.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: String,
    /// Root rank of broadcast, reduce, gather and scatter.
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
    /// Print the run as JSON instead of the table, alone on stdout: NCCL's log and anything else
    /// written to stdout goes to stderr.
    #[arg(long)]
    pub json: bool,
    /// Draw bus bandwidth against size into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// An nccl-tests log of the same collective to compare with: side-by-side table (and both
    /// curves plus their ratio in --plot).
    #[arg(long, value_name = "LOG")]
    pub compare: Option<PathBuf>,
    /// How the run is made (the variants that tell where time goes).
    #[command(flatten)]
    pub knobs: Knobs,
}

/// The measurement variants of `gpucomm bench`. The stream, buffer and barrier defaults are what
/// nccl-tests 2.19.6 does; communicators are created and blocks waited for the crate's normal way
/// (`ncclCommInitRank`, a stream synchronize), where nccl-tests wraps its init in a group and
/// polls: `--init group --wait poll` measures its way.
#[derive(Debug, Args, Clone, PartialEq, Eq)]
pub struct Knobs {
    /// Capture the -n calls into a CUDA graph and replay it N times (nccl-tests' -G).
    #[arg(short = 'G', long = "cudagraph", default_value_t = 0, value_name = "N")]
    pub graph: u32,
    /// Use the legacy default (null) stream instead of a non-blocking stream of its own (nccl-tests' -y).
    #[arg(short = 'y', long = "stream_null", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1))]
    pub stream_null: u32,
    /// Where the buffers come from: `nccl` (ncclMemAlloc, as nccl-tests ≥ NCCL 2.19), `cudarc`
    /// (cudarc's stream-ordered pool), `window` (ncclMemAlloc registered as symmetric windows, as
    /// nccl-tests' -R 2).
    #[arg(long, value_enum, default_value_t = Memory::Nccl)]
    pub buffers: Memory,
    /// How each process creates its communicator: `rank` (ncclCommInitRank), `config`
    /// (ncclCommInitRankConfig with an empty config), `group` (ncclCommInitRank inside
    /// ncclGroupStart/End, as nccl-tests does with its config).
    #[arg(long, value_enum, default_value_t = Init::Rank)]
    pub init: Init,
    /// The barrier before each timed block: `host` (the launcher's TCP rendezvous, no GPU work:
    /// like nccl-tests' MPI_Barrier; the default), `nccl` (a one-element all-reduce, then a stream
    /// sync). One process driving every GPU (`-g`) needs neither.
    #[arg(long, value_enum, default_value_t = Barrier::Host)]
    pub barrier: Barrier,
    /// How the end of a timed block is waited for: `sync` (cuStreamSynchronize), `poll`
    /// (cuStreamQuery and ncclCommGetAsyncError in a loop with sched_yield, as nccl-tests does).
    #[arg(long, value_enum, default_value_t = Wait::Sync)]
    pub wait: Wait,
    /// Which API issues the calls: `safe` (the nccl crate), `raw` (ncclAllReduce through nccl-sys;
    /// all_reduce only).
    #[arg(long, value_enum, default_value_t = Api::Safe)]
    pub api: Api,
    /// Which all-reduce runs: `nccl`, `dispatch` (gpucomm-kernels' dispatching all-reduce), or one
    /// of its kernels forced (`ll`, `one-shot`, `two-shot`). One process per GPU, all_reduce only.
    #[arg(long = "impl", value_enum, default_value_t = Impl::Nccl)]
    pub implementation: Impl,
    /// The dispatcher's crossover table (text form; default: the committed table for the machine).
    #[arg(long, value_name = "FILE")]
    pub table: Option<PathBuf>,
    /// Calibrate the dispatcher on this machine before measuring (sizes up to -e).
    #[arg(long)]
    pub calibrate: bool,
    /// Write the dispatcher's table (calibrated or not) to FILE (rank 0).
    #[arg(long, value_name = "FILE")]
    pub save_table: Option<PathBuf>,
    /// The kernels' bytes per CTA, `LL,ONE_SHOT,TWO_SHOT` (default 2K,8K,64K).
    #[arg(long, value_name = "LL,ONE,TWO")]
    pub cta_bytes: Option<String>,
    /// Also time each block with CUDA events on the stream (reported as gpu_us in --json).
    #[arg(long)]
    pub events: bool,
}

/// The two runs of `gpucomm doctor`'s live layer, each a `__doctor-worker --phase` job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    /// A communicator, an all-reduce and a send/recv sweep, with NCCL's log captured.
    Nccl,
    /// NVSHMEM's put rate between the PEs (NCCL loaded first, as NVSHMEM does).
    Nvshmem,
}

impl Phase {
    /// Both, in the order the live layer runs them.
    pub const ALL: [Phase; 2] = [Phase::Nccl, Phase::Nvshmem];

    /// The name on the worker's command line and in the files the phase writes.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Nccl => "nccl",
            Phase::Nvshmem => "nvshmem",
        }
    }
}

/// Where the bench's buffers come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Memory {
    /// `ncclMemAlloc` (the nccl crate's `MemBuffer`), as nccl-tests allocates.
    Nccl,
    /// cudarc's `CudaSlice` (the stream-ordered pool).
    Cudarc,
    /// `ncclMemAlloc` memory registered as symmetric windows (nccl-tests' -R 2).
    Window,
}

/// How a process creates its communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Init {
    /// `ncclCommInitRank`.
    Rank,
    /// `ncclCommInitRankConfig` with an empty config.
    Config,
    /// `ncclCommInitRank` between `ncclGroupStart` and `ncclGroupEnd` (NCCL then creates the
    /// communicator in a thread of its own, as for nccl-tests).
    Group,
}

/// The barrier before each timed block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Barrier {
    /// A one-element NCCL all-reduce and a stream sync.
    Nccl,
    /// The launcher's TCP rendezvous (host only), as nccl-tests' `MPI_Barrier`: the default.
    Host,
}

/// How a timed block's end is waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Wait {
    /// `cuStreamSynchronize`.
    Sync,
    /// `cuStreamQuery` and `ncclCommGetAsyncError` in a loop with `sched_yield`.
    Poll,
}

/// Which API issues the calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    /// The safe `nccl` crate.
    Safe,
    /// `ncclAllReduce` through `nccl-sys`.
    Raw,
}

/// Which all-reduce implementation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Impl {
    /// `ncclAllReduce`.
    Nccl,
    /// gpucomm-kernels' dispatching all-reduce (its crossover table decides).
    Dispatch,
    /// The LL kernel, forced.
    Ll,
    /// The one-shot kernel, forced.
    OneShot,
    /// The two-shot kernel, forced.
    TwoShot,
}

impl Default for Knobs {
    /// The command line's defaults (`gpucomm bench` without any knob).
    fn default() -> Self {
        Knobs {
            graph: 0,
            stream_null: 0,
            buffers: Memory::Nccl,
            init: Init::Rank,
            barrier: Barrier::Host,
            wait: Wait::Sync,
            api: Api::Safe,
            implementation: Impl::Nccl,
            table: None,
            calibrate: false,
            save_table: None,
            cta_bytes: None,
            events: false,
        }
    }
}

impl Knobs {
    /// The variant in words, for headers and tables: only what differs from the defaults.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        let name = |v: &dyn std::fmt::Debug| format!("{v:?}").to_lowercase();
        if self.buffers != Memory::Nccl {
            parts.push(format!("buffers={}", name(&self.buffers)));
        }
        if self.init != Init::Rank {
            parts.push(format!("init={}", name(&self.init)));
        }
        if self.barrier != Barrier::Host {
            parts.push(format!("barrier={}", name(&self.barrier)));
        }
        if self.wait != Wait::Sync {
            parts.push(format!("wait={}", name(&self.wait)));
        }
        if self.api != Api::Safe {
            parts.push(format!("api={}", name(&self.api)));
        }
        if self.implementation != Impl::Nccl {
            let i = match self.implementation {
                Impl::OneShot => "one-shot".to_string(),
                Impl::TwoShot => "two-shot".to_string(),
                other => name(&other),
            };
            parts.push(format!("impl={i}"));
        }
        if self.stream_null == 1 {
            parts.push("stream=null".into());
        }
        if self.graph > 0 {
            parts.push(format!("graph={}", self.graph));
        }
        if parts.is_empty() {
            "default".into()
        } else {
            parts.join(" ")
        }
    }
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
    /// Which run of the live layer.
    #[arg(long, value_enum)]
    pub phase: Phase,
    /// Where to write this rank's results.
    #[arg(long)]
    pub out: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_default_as_the_command_line_does() {
        let cli = Cli::try_parse_from(["gpucomm", "bench"]).unwrap();
        let Command::Bench(args) = cli.command else { panic!("bench expected") };
        assert_eq!(args.knobs, Knobs::default());
        assert_eq!(args.knobs.describe(), "default");
    }

    #[test]
    fn a_variant_names_only_what_it_changes() {
        let cli = Cli::try_parse_from([
            "gpucomm",
            "bench",
            "--buffers",
            "cudarc",
            "--barrier",
            "nccl",
            "--wait",
            "poll",
            "--impl",
            "one-shot",
            "-G",
            "10",
            "--init",
            "group",
            "--api",
            "raw",
        ])
        .unwrap();
        let Command::Bench(args) = cli.command else { panic!("bench expected") };
        assert_eq!(
            args.knobs.describe(),
            "buffers=cudarc init=group barrier=nccl wait=poll api=raw impl=one-shot graph=10"
        );
    }
}
