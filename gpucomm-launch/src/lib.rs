//! Starting multi-GPU jobs: which rank am I, and how do all ranks get rank 0's unique id?
//!
//! * [`RankInfo::from_env`] reads the rank, world size, local rank, rendezvous address and job
//!   identity from the variables a launcher sets (torchrun, Slurm, Open MPI, MPICH/Hydra PMI).
//! * [`Rendezvous`] meets the ranks at a TCPStore — PyTorch's key-value store protocol, see
//!   [`store`] — and [`Rendezvous::broadcast`] hands rank 0's bytes (an NCCL or NVSHMEM unique
//!   id) to everyone.
//! * [`spawn_local`] starts N copies of a program on this machine with torchrun-style variables,
//!   and [`run_main`] wires it into a program's `main` behind a `--nproc N` flag.
//!
//! # Running a program
//!
//! With the built-in spawner (any program whose `main` uses [`run_main`]), which also gives the
//! ranks a random job key:
//!
//! ```text
//! cargo run --example 02-all-reduce -- --nproc 2
//! ```
//!
//! Under `torchrun` (any rendezvous backend; `--no-python` runs a binary directly). Every rank,
//! rank 0 included, is a client of the store torchrun's agent already hosts at
//! `MASTER_ADDR:MASTER_PORT` (`TORCHELASTIC_USE_AGENT_STORE=True`), under keys scoped by the run
//! id; rank 0 opens a new generation of them at each start, so a restarted job (and each program
//! a worker runs, `./a && ./b`) never reads an earlier one's values:
//!
//! ```text
//! torchrun --nproc-per-node 2 --no-python ./prog
//! torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 --no-python ./prog
//! torchrun --standalone --nproc-per-node 2 --no-python ./prog
//! # two nodes (here two agents on one machine; NCCL_HOSTID makes NCCL treat them as two hosts):
//! NCCL_HOSTID=node0 torchrun --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 29500 --nproc-per-node 1 --no-python ./prog &
//! NCCL_HOSTID=node1 torchrun --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29500 --nproc-per-node 1 --no-python ./prog
//! ```
//!
//! With torchrun-style variables set by hand, in two shells (rank 0 hosts the store):
//!
//! ```text
//! RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 GPUCOMM_JOB_TOKEN=my-job ./prog
//! RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 GPUCOMM_JOB_TOKEN=my-job ./prog
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
//! | `torchrun`, [`spawn_local`], by hand | `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`; torchrun also `TORCHELASTIC_RUN_ID`, `TORCHELASTIC_RESTART_COUNT`, `TORCHELASTIC_USE_AGENT_STORE`, `GROUP_RANK`, `ROLE_RANK` ([`Torchelastic`]) |
//! | Open MPI `mpirun` | `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE` (`PMIX_NAMESPACE`) |
//! | MPICH / Hydra `mpiexec` | `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`, `MPI_LOCALNRANKS` |
//! | Slurm `srun` | `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`, `SLURM_LOCALID`, `SLURM_STEP_TASKS_PER_NODE`, `SLURM_NODEID`, `SLURM_STEP_NODELIST` / `SLURM_JOB_NODELIST`, `SLURM_JOB_ID`, `SLURM_STEP_ID` (the batch script of `sbatch` sets `SLURM_PROCID` too, but is no `srun` task: it and what it starts without `srun` are not taken for Slurm ranks) |
//!
//! When several are present, torchrun-style variables win over Open MPI, which wins over PMI,
//! which wins over Slurm (torchrun or `mpirun` inside a Slurm allocation is normal); two complete
//! sets that report the same world size but different ranks are an error (stale variables of an
//! outer launcher or a batch script), except when torchrun set the chosen ones
//! (`TORCHELASTIC_RUN_ID`: it numbers its workers itself, whoever started it) and except
//! Slurm's next to an MPI family (`srun` may have started `mpirun`'s daemons, numbered
//! otherwise). `MASTER_ADDR` and
//! `MASTER_PORT` are read whatever the launcher. The full rules are in [`RankInfo`]'s
//! documentation.
//!
//! This crate's own variables:
//!
//! | Variable | Meaning |
//! |---|---|
//! | `GPUCOMM_RENDEZVOUS_TIMEOUT` | seconds (fractions allowed, 0.001 to 604800; default 60) that bound joining and each broadcast and barrier ([`TIMEOUT_VAR`]) |
//! | `GPUCOMM_JOB_KEY` | the secret that protects the rendezvous, at least 16 bytes, the same on every rank ([`JOB_KEY_VAR`]); see [Security](#security) |
//! | `GPUCOMM_JOB_TOKEN` | the job identity, replacing what the launcher gives ([`JOB_TOKEN_VAR`]); not secret |
//! | `GPUCOMM_STORE` | `auto` (default: torchrun's agent store when torchrun says so, else rank 0 hosts one), `rank0` or `external` (join a store someone else hosts at `MASTER_ADDR:MASTER_PORT`, e.g. a Python `TCPStore(is_master=True)`) ([`STORE_VAR`], [`StoreMode`]) |
//!
//! A malformed value is an error that names the variable (a timeout of `1e-12`, `NaN` or `-1`
//! is refused, not rounded).
//!
//! # Job identity
//!
//! Jobs that meet at one port or one store are kept apart by their identity
//! ([`RankInfo::job_identity`]): `GPUCOMM_JOB_TOKEN`; else torchrun's run id (under its agent
//! store, where the rendezvous also opens a generation per start of rank 0), Open MPI's `PMIX_NAMESPACE`, Slurm's job and step ids; else, inside a
//! Slurm step, the step's ids. Keys live under a hash of the identity, and rank 0's store
//! records it, so a rank of another job that reaches it fails at once ("belongs to another
//! job"). The identity is not a secret and never travels (only its hash). Where the launcher
//! gives none — variables set by hand, MPICH's Hydra, torchrun with its default run id `none`
//! outside the agent store — set `GPUCOMM_JOB_TOKEN` to one value on every rank:
//!
//! ```text
//! mpiexec -n 4 -genv GPUCOMM_JOB_TOKEN "$(uuidgen)" ./prog                   # MPICH
//! mpirun -np 4 -x GPUCOMM_JOB_TOKEN="$(uuidgen)" ./prog                      # Open MPI (has PMIX_NAMESPACE anyway)
//! ```
//!
//! # Security
//!
//! Whoever can reach `MASTER_ADDR:MASTER_PORT` can talk to the store. What that gives them
//! depends on the job key (`GPUCOMM_JOB_KEY`):
//!
//! * **With a key** (the spawner always makes one): every claim of a rank carries an
//!   HMAC-SHA256, broadcast values are encrypted and authenticated (ChaCha20-Poly1305), barrier
//!   releases carry a MAC, all with keys derived by HKDF-SHA256 from the job key and the job's
//!   identity, and bound to the run: every claim's MAC covers a random value that this start of
//!   rank 0 published (a claim kept from another run is ignored until its rank replaces it), and
//!   rank 0's release of the join names the run (a random number) and welcomes each rank's claim
//!   by its random nonce in that run, so values kept from another run with the same key and
//!   identity are refused. A process without the key never
//!   receives a unique id in the clear and cannot take a rank unnoticed: a claim it makes fails
//!   the rendezvous on every rank, naming both claimants. It can still disrupt a job (abort it,
//!   fill the store up to its limits, hold its connections): that is true of any service on an
//!   open port.
//! * **Without a key**, as PyTorch's documentation says of its own `TCPStore`: anyone who can
//!   reach the port can read the unique id and join the communicator. A rank claimed twice still
//!   fails every rank, naming both addresses, and the identity still keeps jobs apart. Use a key,
//!   or a trusted network.
//! * No reply, record or error message contains the key or the identity. The store rank 0
//!   hosts bounds what any client can cost it ([`store::Limits`]): connections that do not
//!   validate in time are closed (a newcomer takes the place of the oldest once their cap is
//!   reached, and one address may hold only 8), one address may hold only so many connections (and its
//!   pending waits, which have no deadline, only so much memory), a connection
//!   left idle without using the store gives its place to a new one once all are taken (a rank's
//!   never does), memory is bounded, accept errors are reported, every request and reply has a
//!   deadline.
//! * Where rank 0 hosts the store it listens on `MASTER_ADDR` when that is one of the machine's
//!   addresses (`127.0.0.1` keeps it on the machine, and so does `localhost`, served on the
//!   loopback address it resolves to), on every interface otherwise (another host name, an
//!   address behind NAT).
//! * A Python peer that talks plain `TCPStore` (lesson 16) has none of this protection: what it
//!   stores, anyone who reaches the port can read or overwrite.
//!
//! Setting a key by launcher (generate it once, give the same value to every rank):
//!
//! ```text
//! export GPUCOMM_JOB_KEY=$(openssl rand -hex 32)
//! torchrun --nproc-per-node 8 --no-python ./prog                          # torchrun passes the environment on
//! mpirun -np 8 -x GPUCOMM_JOB_KEY ./prog                                   # Open MPI
//! mpiexec -n 8 -genv GPUCOMM_JOB_KEY "$GPUCOMM_JOB_KEY" ./prog             # MPICH
//! srun -n 8 --export=ALL ./prog                                            # Slurm (the default exports it)
//! ```
//!
//! Keep it out of shared shell histories and world-readable job scripts (for example, read it
//! from a file only you can read: `GPUCOMM_JOB_KEY=$(cat ~/.job-key)`).
//!
//! # Python peers
//!
//! A [`store::StoreServer`] serves PyTorch's `TCPStore(host, port, is_master=False)`, and a
//! [`store::StoreClient`] uses a store PyTorch hosts; lesson 16
//! (`examples/examples/16-python-weight-sync.rs`) puts a Rust process and a Python process in one
//! NCCL communicator that way.
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
pub mod safety;
mod spawn;
pub mod store;
#[cfg(test)]
mod test_child;

pub use entry::{run_main, NPROC_FLAG};
pub use env::{
    EnvError, JobIdentity, Launcher, Master, RankInfo, Torchelastic, DEFAULT_PORT, JOB_TOKEN_VAR, MAX_WORLD_SIZE,
};
pub use rendezvous::{
    JobKey, Options, Rendezvous, RendezvousError, StoreMode, DEFAULT_TIMEOUT, JOB_KEY_VAR, MAX_BROADCAST, MAX_TIMEOUT,
    MIN_KEY_LEN, MIN_TIMEOUT, STORE_VAR, TIMEOUT_VAR,
};
pub use safety::SAFETY_VARS;
pub use spawn::{spawn_local, Outcome, SpawnError, SPAWNED_VAR};
