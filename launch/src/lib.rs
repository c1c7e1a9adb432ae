//! Starting multi-GPU jobs: which rank am I, and how do all ranks get rank 0's unique id?
//!
//! * [`RankInfo::from_env`] reads the rank, world size, local rank and rendezvous address from the
//!   variables a launcher sets (torchrun, Slurm, Open MPI, MPICH/Hydra PMI).
//! * [`Rendezvous`] connects the ranks over TCP; [`Rendezvous::broadcast`] hands rank 0's bytes
//!   (an NCCL or NVSHMEM unique id) to everyone.
//! * [`spawn_local`] starts N copies of a program on this machine with torchrun-style variables,
//!   and [`run_main`] wires it into a program's `main` behind a `--nproc N` flag.
//!
//! # Running a program
//!
//! With the built-in spawner (any program whose `main` uses [`run_main`]):
//!
//! ```text
//! cargo run --example 02-all-reduce -- --nproc 2
//! ```
//!
//! With torchrun-style variables set by hand, in two shells:
//!
//! ```text
//! RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./prog
//! RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./prog
//! ```
//!
//! With MPI or Slurm (set `MASTER_ADDR`, and `MASTER_PORT` if you like, when the job spans several
//! nodes under `mpirun`; under `srun` the first node of the allocation is the default):
//!
//! ```text
//! mpirun -np 2 ./prog
//! srun -n 2 ./prog
//! ```
//!
//! # Variables
//!
//! | Launcher | Sets |
//! |---|---|
//! | `torchrun`, [`spawn_local`], by hand | `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (`TORCHELASTIC_RUN_ID`, `GPUCOMM_JOB_TOKEN`) |
//! | Open MPI `mpirun` | `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE` (`PMIX_NAMESPACE`) |
//! | MPICH / Hydra `mpiexec` | `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`, `MPI_LOCALNRANKS` |
//! | Slurm `srun` | `SLURM_PROCID`, `SLURM_NTASKS` / `SLURM_STEP_NUM_TASKS`, `SLURM_LOCALID`, `SLURM_STEP_TASKS_PER_NODE` / `SLURM_NTASKS_PER_NODE`, `SLURM_NODEID`, `SLURM_STEP_NODELIST` / `SLURM_JOB_NODELIST`, `SLURM_JOB_ID`, `SLURM_STEP_ID` |
//!
//! When several are present, torchrun-style variables win over Open MPI, which wins over PMI,
//! which wins over Slurm (torchrun or `mpirun` inside a Slurm allocation is normal); two complete
//! sets that report the same world size but different ranks are an error. `MASTER_ADDR` and
//! `MASTER_PORT` are read whatever the launcher. The full rules are in [`RankInfo`]'s
//! documentation.
//!
//! Other variables: `GPUCOMM_RENDEZVOUS_TIMEOUT` (seconds, default 60) bounds every rendezvous
//! wait; `GPUCOMM_JOB_TOKEN` overrides the job token that keeps stray processes of other jobs out.
//!
//! # Example
//!
//! ```no_run
//! use gpucomm_launch::{run_main, Options, Rendezvous};
//!
//! fn main() -> std::process::ExitCode {
//!     run_main(|info| {
//!         let mut rendezvous = Rendezvous::connect(&info, &Options::from_env()?)?;
//!         // Rank 0 creates the id; everyone gets the same bytes.
//!         let id = rendezvous.broadcast(|| Ok(vec![7u8; 128]))?;
//!         println!("{info}: got {} bytes", id.len());
//!         rendezvous.barrier()?;
//!         Ok(())
//!     })
//! }
//! ```

mod deadline;
mod entry;
mod env;
mod random;
mod rendezvous;
mod spawn;
pub mod store;

pub use entry::{run_main, NPROC_FLAG};
pub use env::{EnvError, JobIdentity, Launcher, Master, RankInfo, Torchelastic, DEFAULT_PORT, JOB_TOKEN_VAR};
pub use rendezvous::{
    JobKey, Options, Rendezvous, RendezvousError, StoreMode, DEFAULT_TIMEOUT, JOB_KEY_VAR, MAX_BROADCAST, MAX_TIMEOUT,
    MIN_KEY_LEN, MIN_TIMEOUT, STORE_VAR, TIMEOUT_VAR,
};
pub use spawn::{spawn_local, Outcome, SpawnError, SAFETY_VARS, SPAWNED_VAR};
