//! Finding this process's rank from the variables its launcher set.

mod error;
mod launcher;
mod slurm;
#[cfg(test)]
mod tests;

use std::fmt;

pub use error::EnvError;
pub use launcher::Launcher;

/// The variable that sets the job identity, replacing what the launcher's variables give.
pub const JOB_TOKEN_VAR: &str = "GPUCOMM_JOB_TOKEN";

/// The port used when neither `MASTER_PORT` nor a job identity is available (the c10d default).
pub const DEFAULT_PORT: u16 = 29500;

/// A string every rank of one job shares and other jobs do not: it keeps two jobs that meet at
/// one store (or one port) apart. Not a secret — the job key is (see the crate's security
/// section); the rendezvous never sends the identity itself, only a hash of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobIdentity {
    /// The identity, e.g. `slurm-4242.0` or `torchrun-5f3a…`.
    pub value: String,
    /// The variables it came from, for messages (e.g. `SLURM_JOB_ID and SLURM_STEP_ID`).
    pub source: &'static str,
}

/// What `torchrun` (torch.distributed.elastic) tells its workers besides the rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Torchelastic {
    /// `TORCHELASTIC_RUN_ID` (`none` unless `--rdzv-id` or `--standalone` sets one).
    pub run_id: String,
    /// `TORCHELASTIC_RESTART_COUNT`: the restarts of this node's workers so far (0 first). Not
    /// part of the job identity: torchrun counts only the restarts this node's workers caused
    /// (pytorch/pytorch#108158), so the nodes of one attempt may disagree, and a membership
    /// change restarts with it unchanged. The rendezvous tells attempts apart itself (see
    /// [`Rendezvous`](crate::Rendezvous)).
    pub restart_count: u32,
    /// `TORCHELASTIC_USE_AGENT_STORE=True`: the agent hosts a TCPStore at
    /// `MASTER_ADDR:MASTER_PORT` and every worker, rank 0 included, is its client.
    pub use_agent_store: bool,
    /// `GROUP_RANK`: the rank of this worker's agent (node).
    pub group_rank: Option<usize>,
    /// `ROLE_RANK`: the rank among the workers of the same role.
    pub role_rank: Option<usize>,
}

/// Where rank 0 listens for the rendezvous.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Master {
    /// Host name or IP address (`MASTER_ADDR`).
    pub addr: String,
    /// TCP port (`MASTER_PORT`).
    pub port: u16,
}

impl Master {
    /// The port derived from a job identity when `MASTER_PORT` is not set: 64-bit FNV-1a of the
    /// identity's UTF-8 bytes, modulo 10000, plus 20000 (so in `20000..=29999`). Every rank of a
    /// job has the same identity, so every rank derives the same port.
    pub fn port_for_token(token: &str) -> u16 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in token.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // `hash % 10_000` is below 10_000, so the sum fits in a u16.
        20_000 + (hash % 10_000) as u16
    }
}

impl fmt::Display for Master {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.addr.contains(':') && !self.addr.starts_with('[') {
            write!(f, "[{}]:{}", self.addr, self.port)
        } else {
            write!(f, "{}:{}", self.addr, self.port)
        }
    }
}

/// This process's place in the job, as told by its launcher.
///
/// # Rules
///
/// | Family ([`Launcher`]) | Rank, world size | Local rank, local world size | Job identity |
/// |---|---|---|---|
/// | `Torchrun` | `RANK`, `WORLD_SIZE` | `LOCAL_RANK`, `LOCAL_WORLD_SIZE` | `TORCHELASTIC_RUN_ID`¹ |
/// | `OpenMpi` | `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE` | `PMIX_NAMESPACE`, else `OMPI_MCA_ess_base_jobid` |
/// | `Pmi` (MPICH / Hydra) | `PMI_RANK`, `PMI_SIZE` | `MPI_LOCALRANKID`, `MPI_LOCALNRANKS` | none² |
/// | `Slurm` (`srun`) | `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS` | `SLURM_LOCALID`, this node's entry of `SLURM_STEP_TASKS_PER_NODE` (picked with `SLURM_NODEID`) | `SLURM_JOB_ID` + `SLURM_STEP_ID` |
///
/// ¹ torchrun's run id is `none` unless `--rdzv-id` (or `--standalone`) sets one, the same for
/// every job: it counts as an identity only under the agent's store
/// (`TORCHELASTIC_USE_AGENT_STORE=True`, which is the job's own). ² MPICH's Hydra sets only
/// `PMI_RANK`, `PMI_SIZE`, `PMI_FD` (or `PMI_PORT` + `PMI_ID`), `MPI_LOCALRANKID` and
/// `MPI_LOCALNRANKS`, none of which names the job.
///
/// Rules, in order:
///
/// * Empty values count as unset; surrounding whitespace is ignored.
/// * A family is *present* when its rank or world-size variable is set. Slurm's is its step's
///   (`SLURM_STEP_NUM_TASKS`), which only `srun` sets: the batch script of `sbatch` carries
///   `SLURM_PROCID=0` and the job's `SLURM_NTASKS`, as do the processes it starts without `srun`
///   (torchrun, `mpirun`, the program itself), and none of them is one of `srun`'s tasks; an
///   allocation alone does not count either. A present family must be complete and valid, or
///   [`RankInfo::from_vars`] fails naming the variables.
/// * The local pair is required when the world size is above 1 (it picks the GPU); with a world
///   size of 1 a missing local pair means local rank 0 of 1. This holds for PMI too: Hydra sets
///   `MPI_LOCALRANKID` / `MPI_LOCALNRANKS`, and guessing them on a multi-process job could put two
///   ranks on one GPU.
/// * Precedence: torchrun-style > Open MPI > PMI > Slurm (torchrun or `mpirun` inside a Slurm
///   allocation is normal). The other present families are only compared with the chosen one: if a
///   complete one reports the same world size but a different rank, that is an
///   [`EnvError::Conflict`]; if it is incomplete or malformed it is ignored. Which are compared:
///   * none when torchrun set the torchrun-style variables (its agent always sets
///     `TORCHELASTIC_RUN_ID`): torchrun numbers its workers itself (its rendezvous picks the order
///     of the nodes), whether `srun`, `mpirun` or a PMI launcher started it;
///   * otherwise (the torchrun-style variables set by hand or exported by a batch script, or an
///     MPI family chosen) every other family, Slurm only when no MPI family (Open MPI, PMI) is
///     present: `mpirun`'s daemons (and Hydra's proxies) may run as a Slurm step, numbered their
///     own way. So torchrun-style variables exported at batch level, which every `srun` task
///     inherits (`RANK=0 WORLD_SIZE=4` in all four tasks), are a conflict with `SLURM_PROCID`
///     rather than four ranks 0.
///
///   PMI without its local pair under `srun` (Slurm's `pmi2` plugin sets only `PMI_RANK` and
///   `PMI_SIZE`) gives way to Slurm.
/// * A world size above [`MAX_WORLD_SIZE`] (2^20) processes is refused (a rendezvous keeps a few
///   keys per rank).
/// * No family present: [`Launcher::Single`], rank 0 of 1, no master.
/// * GPUs per task: `SLURM_GPUS_PER_TASK` when Slurm gave the rank ([`RankInfo::gpus_per_task`]);
///   a malformed value is an error naming it.
/// * Job identity: `GPUCOMM_JOB_TOKEN` when set; else the family's (table above); else, inside a
///   Slurm step (`SLURM_JOB_ID` and `SLURM_STEP_ID` set, as under `srun` or an `mpirun` that
///   Slurm started), the step's ids; else none (set `GPUCOMM_JOB_TOKEN` to the same value on
///   every rank, e.g. `mpiexec -genv GPUCOMM_JOB_TOKEN $(uuidgen) …`).
/// * torchrun's other variables (`TORCHELASTIC_*`, `GROUP_RANK`, `ROLE_RANK`) are read into
///   [`RankInfo::torchelastic`] when the torchrun-style family is chosen and
///   `TORCHELASTIC_RUN_ID` or `TORCHELASTIC_USE_AGENT_STORE` is set.
/// * Master (every family but `Single`): address `MASTER_ADDR`, else (Slurm) the first host of
///   `SLURM_STEP_NODELIST` / `SLURM_JOB_NODELIST`, else `127.0.0.1` when all ranks are on this node
///   (`local_world_size == world_size`), else none. Port `MASTER_PORT`, else
///   [`Master::port_for_token`] of the job identity, else 29500.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Number of processes in the job.
    pub world_size: usize,
    /// Rank among the processes on this node, `0..local_world_size`; picks the GPU.
    pub local_rank: usize,
    /// Number of processes on this node.
    pub local_world_size: usize,
    /// Where rank 0 listens; `None` for a single process, or a multi-node job without
    /// `MASTER_ADDR` (see [`RankInfo::master_or_err`]).
    pub master: Option<Master>,
    /// The family that gave the rank.
    pub launcher: Launcher,
    /// What keeps this job apart from others at a rendezvous (and derives a port when
    /// `MASTER_PORT` is not set); `None` when nothing names the job.
    pub job_identity: Option<JobIdentity>,
    /// torchrun's other variables, when torchrun started this process.
    pub torchelastic: Option<Torchelastic>,
    /// The GPUs Slurm binds to each task, when Slurm gave the rank and `SLURM_GPUS_PER_TASK` is
    /// set (`srun --gpus-per-task N`; the total of its counts, as in `a100:2,v100:1`): such a task
    /// sees only its own GPUs, unless `--gpu-bind` overrides the binding, so
    /// [`RankInfo::device_ordinal`] picks the first of them when exactly that many are visible.
    pub gpus_per_task: Option<usize>,
}

impl RankInfo {
    /// A lone process: rank 0 of 1, no master.
    pub fn single() -> RankInfo {
        RankInfo {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master: None,
            launcher: Launcher::Single,
            job_identity: None,
            torchelastic: None,
            gpus_per_task: None,
        }
    }

    /// Reads the process environment (see [`RankInfo`] for the rules).
    /// Values that are not valid Unicode are read lossily and then fail to parse.
    pub fn from_env() -> Result<RankInfo, EnvError> {
        RankInfo::from_os_vars(|name| std::env::var_os(name))
    }

    /// Like [`RankInfo::from_env`], with the variables as the operating system gives them, from
    /// `lookup`. A `GPUCOMM_JOB_TOKEN` that is not UTF-8 text is refused: read as text, tokens
    /// that differ only in their invalid bytes would name one job.
    pub fn from_os_vars(lookup: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<RankInfo, EnvError> {
        if let Some(token) = lookup(JOB_TOKEN_VAR).filter(|t| t.to_str().is_none()) {
            return Err(invalid(
                JOB_TOKEN_VAR,
                // Not the token itself: no error message shows a job's identity.
                format!("<{} bytes, not UTF-8>", token.len()),
                "UTF-8 text (tokens that differ only in other bytes would name one job)",
            ));
        }
        RankInfo::from_vars(|name| lookup(name).map(|value| value.to_string_lossy().into_owned()))
    }

    /// Like [`RankInfo::from_env`], with the variables given by `lookup` (for tests and for
    /// programs that keep their configuration elsewhere).
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<RankInfo, EnvError> {
        let vars = Vars { lookup: &lookup };
        let families = [torchrun(&vars), open_mpi(&vars), pmi(&vars), slurm_family(&vars)];
        let mut present = families.into_iter().flatten();
        let Some(chosen) = present.next() else {
            let mut info = RankInfo::single();
            info.job_identity = token_identity(&vars);
            return Ok(info);
        };
        let chosen = chosen?;
        let others: Vec<Found> = present.flatten().collect();
        for other in others.iter().filter(|other| compared(&vars, &chosen, other, &others)) {
            if other.world.value == chosen.world.value && other.rank.value != chosen.rank.value {
                return Err(EnvError::Conflict {
                    chosen: chosen.rank.to_string(),
                    other: other.rank.to_string(),
                    world_size: chosen.world.value,
                });
            }
        }
        let torchelastic = match chosen.launcher {
            Launcher::Torchrun => torchelastic(&vars)?,
            _ => None,
        };
        let gpus_per_task = match chosen.launcher {
            Launcher::Slurm => slurm_gpus_per_task(&vars)?,
            _ => None,
        };
        let family_identity = match (&chosen.launcher, &torchelastic) {
            // The run id is the same (`none`) for every job unless set: an identity only
            // inside the agent's own store.
            (Launcher::Torchrun, Some(t)) if t.run_id != "none" || t.use_agent_store => {
                Some(JobIdentity { value: format!("torchrun-{}", t.run_id), source: "TORCHELASTIC_RUN_ID" })
            }
            _ => chosen.identity,
        };
        let job_identity = token_identity(&vars).or(family_identity).or_else(|| slurm_step(&vars));
        let addr = match vars.get("MASTER_ADDR") {
            Some(addr) => Some(addr),
            None => match chosen.host {
                Some(host) => Some(host),
                None if chosen.local_world == chosen.world.value => Some("127.0.0.1".to_string()),
                None => None,
            },
        };
        let port = match vars.get("MASTER_PORT") {
            Some(value) => parse_port(&value)
                .ok_or_else(|| invalid("MASTER_PORT", value, "a TCP port number between 1 and 65535"))?,
            None => job_identity.as_ref().map_or(DEFAULT_PORT, |id| Master::port_for_token(&id.value)),
        };
        Ok(RankInfo {
            rank: chosen.rank.value,
            world_size: chosen.world.value,
            local_rank: chosen.local_rank,
            local_world_size: chosen.local_world,
            master: addr.map(|addr| Master { addr, port }),
            launcher: chosen.launcher,
            job_identity,
            torchelastic,
            gpus_per_task,
        })
    }

    /// The CUDA device this process should use, given how many are visible: device 0 when they
    /// are this task's own (as many as [`RankInfo::gpus_per_task`], which Slurm binds to each
    /// task); else the local rank when it is below `device_count`; device 0 when exactly one
    /// device is visible (one GPU per process, e.g. `CUDA_VISIBLE_DEVICES` set per rank); an error
    /// otherwise.
    pub fn device_ordinal(&self, device_count: usize) -> Result<usize, EnvError> {
        if device_count == 0 {
            Err(EnvError::NoDevice)
        } else if self.gpus_per_task == Some(device_count) {
            Ok(0)
        } else if self.local_rank < device_count {
            Ok(self.local_rank)
        } else if device_count == 1 {
            Ok(0)
        } else {
            Err(EnvError::NotEnoughDevices { local_rank: self.local_rank, device_count })
        }
    }

    /// The rendezvous address, or [`EnvError::NoMaster`] naming the variables to set.
    pub fn master_or_err(&self) -> Result<&Master, EnvError> {
        self.master.as_ref().ok_or(EnvError::NoMaster {
            launcher: self.launcher,
            world_size: self.world_size,
            local_world_size: self.local_world_size,
        })
    }
}

impl fmt::Display for RankInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} of {} (local {} of {}) from {}",
            self.rank, self.world_size, self.local_rank, self.local_world_size, self.launcher
        )?;
        if let Some(master) = &self.master {
            write!(f, ", rendezvous at {master}")?;
        }
        Ok(())
    }
}

/// Whether the complete family `other` is compared with the chosen one (see [`RankInfo`]'s
/// rules): none when torchrun set the chosen variables, since it numbers the workers itself;
/// Slurm only when no MPI family is present, since `srun` may have started `mpirun`'s daemons
/// (or Hydra's proxies), whose numbering is not the ranks'.
fn compared(vars: &Vars, chosen: &Found, other: &Found, others: &[Found]) -> bool {
    let mpi = |launcher| matches!(launcher, Launcher::OpenMpi | Launcher::Pmi);
    if chosen.launcher == Launcher::Torchrun && vars.get(TORCHRUN_MARK).is_some() {
        false
    } else if other.launcher == Launcher::Slurm {
        !mpi(chosen.launcher) && !others.iter().any(|o| mpi(o.launcher))
    } else {
        true
    }
}

/// The variable torchrun's agent always sets in its workers' environment: torchrun-style
/// variables without it were set by something else (by hand, a batch script, another tool).
const TORCHRUN_MARK: &str = "TORCHELASTIC_RUN_ID";

/// The variable lookup, with empty values treated as unset.
struct Vars<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl Vars<'_> {
    fn get(&self, name: &str) -> Option<String> {
        (self.lookup)(name).map(|value| value.trim().to_string()).filter(|value| !value.is_empty())
    }

    /// The first of `names` that is set.
    fn first(&self, names: &[&'static str]) -> Option<(&'static str, String)> {
        names.iter().find_map(|&name| self.get(name).map(|value| (name, value)))
    }
}

/// A parsed count, remembering where it came from for error messages.
struct Num {
    name: &'static str,
    raw: String,
    value: usize,
}

impl Num {
    fn parse(name: &'static str, raw: String) -> Result<Num, EnvError> {
        match raw.parse::<usize>() {
            Ok(value) => Ok(Num { name, raw, value }),
            Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => {
                Err(invalid(name, raw, "a count that fits in 64 bits"))
            }
            Err(_) => Err(EnvError::NotANumber { name: name.to_string(), value: raw }),
        }
    }
}

/// The most processes a job may have: a rendezvous keeps a few store keys per rank, and rank 0
/// reads them all.
pub const MAX_WORLD_SIZE: usize = 1 << 20;

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.raw)
    }
}

/// What one family says, before the master is resolved.
struct Found {
    launcher: Launcher,
    rank: Num,
    world: Num,
    local_rank: usize,
    local_world: usize,
    identity: Option<JobIdentity>,
    /// A host to use as master when `MASTER_ADDR` is unset (Slurm's first node).
    host: Option<String>,
}

fn invalid(name: &str, value: String, expected: &str) -> EnvError {
    EnvError::InvalidValue { name: name.to_string(), value, expected: expected.to_string() }
}

fn parse_port(value: &str) -> Option<u16> {
    value.parse::<u16>().ok().filter(|&port| port != 0)
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|name| name.to_string()).collect()
}

/// The rank and world-size pair of a family: `None` when neither is set.
fn global_pair(
    vars: &Vars,
    launcher: Launcher,
    rank: &'static str,
    world: &[&'static str],
    world_desc: &str,
) -> Option<Result<(Num, Num), EnvError>> {
    let r = vars.get(rank);
    let w = vars.first(world);
    match (r, w) {
        (None, None) => None,
        (Some(_), None) => {
            Some(Err(EnvError::Incomplete { launcher, set: names(&[rank]), missing: vec![world_desc.to_string()] }))
        }
        (None, Some((name, _))) => {
            Some(Err(EnvError::Incomplete { launcher, set: names(&[name]), missing: names(&[rank]) }))
        }
        (Some(r), Some((name, w))) => Some(Num::parse(rank, r).and_then(|r| Ok((r, Num::parse(name, w)?)))),
    }
}

/// Checks a family's numbers and builds its [`Found`].
fn check(
    launcher: Launcher,
    (rank, world): (Num, Num),
    local: Option<(Num, Num)>,
    missing_local: &[&str],
) -> Result<Found, EnvError> {
    if world.value == 0 {
        return Err(EnvError::ZeroSize { name: world.name.to_string() });
    }
    if world.value > MAX_WORLD_SIZE {
        return Err(invalid(world.name, world.raw, &format!("at most {MAX_WORLD_SIZE} processes")));
    }
    if rank.value >= world.value {
        return Err(EnvError::RankOutOfRange { rank: rank.to_string(), world_size: world.to_string() });
    }
    let (local_rank, local_world) = match local {
        Some((local_rank, local_world)) => {
            if local_world.value == 0 {
                return Err(EnvError::ZeroSize { name: local_world.name.to_string() });
            }
            if local_rank.value >= local_world.value {
                return Err(EnvError::LocalRankOutOfRange {
                    local_rank: local_rank.to_string(),
                    local_world_size: local_world.to_string(),
                });
            }
            if local_world.value > world.value {
                return Err(EnvError::LocalSizeTooLarge {
                    local_world_size: local_world.to_string(),
                    world_size: world.to_string(),
                });
            }
            (local_rank.value, local_world.value)
        }
        None if world.value == 1 => (0, 1),
        None => {
            return Err(EnvError::Incomplete {
                launcher,
                set: vec![rank.name.to_string(), world.name.to_string()],
                missing: names(missing_local),
            })
        }
    };
    Ok(Found { launcher, rank, world, local_rank, local_world, identity: None, host: None })
}

/// The local pair of a family whose two local variables are plain counts.
fn local_pair(
    vars: &Vars,
    launcher: Launcher,
    rank: &'static str,
    size: &'static str,
) -> Result<Option<(Num, Num)>, EnvError> {
    match (vars.get(rank), vars.get(size)) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(EnvError::Incomplete { launcher, set: names(&[rank]), missing: names(&[size]) }),
        (None, Some(_)) => Err(EnvError::Incomplete { launcher, set: names(&[size]), missing: names(&[rank]) }),
        (Some(r), Some(s)) => Ok(Some((Num::parse(rank, r)?, Num::parse(size, s)?))),
    }
}

/// A family made of four plain counts.
fn simple_family(
    vars: &Vars,
    launcher: Launcher,
    [rank, world, local_rank, local_world]: [&'static str; 4],
) -> Option<Result<Found, EnvError>> {
    let global = global_pair(vars, launcher, rank, &[world], world);
    Some(global?.and_then(|global| {
        let local = local_pair(vars, launcher, local_rank, local_world)?;
        check(launcher, global, local, &[local_rank, local_world])
    }))
}

fn torchrun(vars: &Vars) -> Option<Result<Found, EnvError>> {
    simple_family(vars, Launcher::Torchrun, ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"])
}

fn token_identity(vars: &Vars) -> Option<JobIdentity> {
    vars.get(JOB_TOKEN_VAR).map(|value| JobIdentity { value, source: JOB_TOKEN_VAR })
}

/// The Slurm step this process runs in, whatever started it.
fn slurm_step(vars: &Vars) -> Option<JobIdentity> {
    let (job, step) = (vars.get("SLURM_JOB_ID")?, vars.get("SLURM_STEP_ID")?);
    Some(JobIdentity { value: format!("slurm-{job}.{step}"), source: "SLURM_JOB_ID and SLURM_STEP_ID" })
}

/// torchrun's variables beyond the rank, when it set them.
fn torchelastic(vars: &Vars) -> Result<Option<Torchelastic>, EnvError> {
    let run_id = vars.get("TORCHELASTIC_RUN_ID");
    let agent_store = vars.get("TORCHELASTIC_USE_AGENT_STORE");
    if run_id.is_none() && agent_store.is_none() {
        return Ok(None);
    }
    let number = |name: &'static str| -> Result<Option<usize>, EnvError> {
        vars.get(name).map(|raw| Num::parse(name, raw).map(|n| n.value)).transpose()
    };
    let restart_count = match vars.get("TORCHELASTIC_RESTART_COUNT") {
        None => 0,
        Some(raw) => raw
            .parse::<u32>()
            .map_err(|_| EnvError::NotANumber { name: "TORCHELASTIC_RESTART_COUNT".into(), value: raw.clone() })?,
    };
    Ok(Some(Torchelastic {
        run_id: run_id.unwrap_or_else(|| "none".to_string()),
        restart_count,
        // What torch.distributed checks: exactly "True".
        use_agent_store: agent_store.as_deref() == Some("True"),
        group_rank: number("GROUP_RANK")?,
        role_rank: number("ROLE_RANK")?,
    }))
}

fn open_mpi(vars: &Vars) -> Option<Result<Found, EnvError>> {
    let found = simple_family(
        vars,
        Launcher::OpenMpi,
        ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"],
    )?;
    let identity = vars.first(&["PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"]).map(|(name, id)| JobIdentity {
        value: format!("ompi-{id}"),
        source: if name == "PMIX_NAMESPACE" { "PMIX_NAMESPACE" } else { "OMPI_MCA_ess_base_jobid" },
    });
    Some(found.map(|found| Found { identity, ..found }))
}

fn pmi(vars: &Vars) -> Option<Result<Found, EnvError>> {
    let local = ["MPI_LOCALRANKID", "MPI_LOCALNRANKS"];
    if local.iter().all(|name| vars.get(name).is_none()) && vars.get(SLURM_TASKS).is_some() {
        // Slurm's `pmi2` plugin under `srun`: the same task, described in full by Slurm's family.
        return None;
    }
    simple_family(vars, Launcher::Pmi, ["PMI_RANK", "PMI_SIZE", local[0], local[1]])
}

/// The size of the step `srun` started this task in: set by `srun` only (module docs).
const SLURM_TASKS: &str = "SLURM_STEP_NUM_TASKS";
const SLURM_PER_NODE: &str = "SLURM_STEP_TASKS_PER_NODE";

/// `SLURM_GPUS_PER_TASK` (`[type:]count`, comma-separated): the total count.
fn slurm_gpus_per_task(vars: &Vars) -> Result<Option<usize>, EnvError> {
    const NAME: &str = "SLURM_GPUS_PER_TASK";
    let Some(raw) = vars.get(NAME) else { return Ok(None) };
    let count = |item: &str| item.rsplit(':').next().and_then(|n| n.trim().parse::<usize>().ok());
    raw.split(',')
        .try_fold(0usize, |total, item| total.checked_add(count(item)?))
        .filter(|&total| total > 0)
        .map(Some)
        .ok_or_else(|| invalid(NAME, raw.clone(), "a GPU count per task such as 2, a100:2 or a100:2,v100:1"))
}

fn slurm_family(vars: &Vars) -> Option<Result<Found, EnvError>> {
    vars.get(SLURM_TASKS)?;
    Some(slurm(vars))
}

fn slurm(vars: &Vars) -> Result<Found, EnvError> {
    let launcher = Launcher::Slurm;
    let global = global_pair(vars, launcher, "SLURM_PROCID", &[SLURM_TASKS], SLURM_TASKS)
        .unwrap_or_else(|| Err(EnvError::Incomplete { launcher, set: vec![], missing: names(&["SLURM_PROCID"]) }))?;
    let node = match vars.get("SLURM_NODEID") {
        Some(raw) => Some(Num::parse("SLURM_NODEID", raw)?.value),
        None => None,
    };
    let local_rank = vars.get("SLURM_LOCALID");
    let per_node = vars.get(SLURM_PER_NODE);
    let local = match (local_rank, per_node) {
        (None, None) => None,
        (Some(_), None) => {
            return Err(EnvError::Incomplete {
                launcher,
                set: names(&["SLURM_LOCALID"]),
                missing: names(&[SLURM_PER_NODE]),
            })
        }
        (None, Some(_)) => {
            return Err(EnvError::Incomplete {
                launcher,
                set: names(&[SLURM_PER_NODE]),
                missing: names(&["SLURM_LOCALID"]),
            })
        }
        (Some(local_rank), Some(spec)) => {
            let count = slurm::tasks_on_node(&spec, node)
                .map_err(|expected| invalid(SLURM_PER_NODE, spec.clone(), &expected))?;
            Some((Num::parse("SLURM_LOCALID", local_rank)?, Num { name: SLURM_PER_NODE, raw: spec, value: count }))
        }
    };
    let found = check(launcher, global, local, &["SLURM_LOCALID", SLURM_PER_NODE])?;
    let host = match vars.first(&["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"]) {
        Some((name, list)) => Some(
            slurm::first_host(&list).ok_or_else(|| invalid(name, list, "a Slurm hostlist such as gpu[03-07,09]"))?,
        ),
        None => None,
    };
    let identity = vars.get("SLURM_JOB_ID").map(|job| match vars.get("SLURM_STEP_ID") {
        Some(step) => JobIdentity { value: format!("slurm-{job}.{step}"), source: "SLURM_JOB_ID and SLURM_STEP_ID" },
        None => JobIdentity { value: format!("slurm-{job}"), source: "SLURM_JOB_ID" },
    });
    Ok(Found { identity, host, ..found })
}
