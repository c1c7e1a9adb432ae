//! [`EnvError`]: what can be wrong with a launcher's variables.

use std::fmt;

use super::launcher::Launcher;

/// A launcher's variables are missing, malformed or contradict each other.
///
/// Every message names the variables involved. Fields holding a `"NAME=value"` string show the
/// variable exactly as it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EnvError {
    /// Some variables of a launcher family are set, and others that it needs are not.
    Incomplete {
        /// The family.
        launcher: Launcher,
        /// The variables that are set.
        set: Vec<String>,
        /// The variables that are missing.
        missing: Vec<String>,
    },
    /// A variable that must be a non-negative integer is not.
    NotANumber {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
    },
    /// A variable has a value of the wrong shape.
    InvalidValue {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What was expected.
        expected: String,
    },
    /// A size (world size, local world size) is 0.
    ZeroSize {
        /// The variable.
        name: String,
    },
    /// The rank is not below the world size.
    RankOutOfRange {
        /// `"NAME=value"` of the rank.
        rank: String,
        /// `"NAME=value"` of the world size.
        world_size: String,
    },
    /// The local rank is not below the local world size.
    LocalRankOutOfRange {
        /// `"NAME=value"` of the local rank.
        local_rank: String,
        /// `"NAME=value"` of the local world size.
        local_world_size: String,
    },
    /// More processes on this node than in the whole job.
    LocalSizeTooLarge {
        /// `"NAME=value"` of the local world size.
        local_world_size: String,
        /// `"NAME=value"` of the world size.
        world_size: String,
    },
    /// Two complete launcher families agree on the world size but not on this process's rank.
    Conflict {
        /// `"NAME=value"` of the rank that takes precedence.
        chosen: String,
        /// `"NAME=value"` of the other family's rank.
        other: String,
        /// The world size both report.
        world_size: usize,
    },
    /// A multi-node job without a rendezvous address.
    NoMaster {
        /// The family that was used.
        launcher: Launcher,
        /// The job's world size.
        world_size: usize,
        /// The number of processes on this node.
        local_world_size: usize,
    },
    /// No CUDA device is visible to this process.
    NoDevice,
    /// The local rank has no GPU of its own.
    NotEnoughDevices {
        /// This process's local rank.
        local_rank: usize,
        /// The number of visible CUDA devices.
        device_count: usize,
    },
}

fn join(names: &[String]) -> String {
    names.join(" and ")
}

fn verb(names: &[String]) -> &'static str {
    if names.len() == 1 {
        "is"
    } else {
        "are"
    }
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvError::Incomplete { launcher, set, missing } => write!(
                f,
                "{} {} set but {} {} not ({launcher}: set the missing variables, or unset the others)",
                join(set),
                verb(set),
                join(missing),
                verb(missing)
            ),
            EnvError::NotANumber { name, value } => {
                let negative = value.trim().strip_prefix('-').is_some_and(|digits| digits.parse::<u64>().is_ok());
                if negative {
                    write!(f, "{name}={value} is negative (expected a non-negative integer)")
                } else {
                    write!(f, "{name}={value} is not a number (expected a non-negative integer)")
                }
            }
            EnvError::InvalidValue { name, value, expected } => {
                write!(f, "{name}={value} is not valid: expected {expected}")
            }
            EnvError::ZeroSize { name } => write!(f, "{name}=0: there must be at least one process"),
            EnvError::RankOutOfRange { rank, world_size } => {
                write!(f, "{rank} is out of range for {world_size} (ranks count from 0)")
            }
            EnvError::LocalRankOutOfRange { local_rank, local_world_size } => {
                write!(f, "{local_rank} is out of range for {local_world_size} (local ranks count from 0)")
            }
            EnvError::LocalSizeTooLarge { local_world_size, world_size } => {
                write!(f, "{local_world_size} is larger than {world_size}: more processes on this node than in the job")
            }
            EnvError::Conflict { chosen, other, world_size } => write!(
                f,
                "{chosen} but {other} (same world size {world_size}): two launchers disagree about this process's \
                 rank; unset the stale variables or start the job with a single launcher"
            ),
            EnvError::NoMaster { launcher, world_size, local_world_size } => write!(
                f,
                "no rendezvous address: MASTER_ADDR is not set and the job spans several nodes ({world_size} \
                 processes, {local_world_size} on this node, started by {launcher}); set MASTER_ADDR (and \
                 MASTER_PORT) to rank 0's host and a free port, the same on every rank"
            ),
            EnvError::NoDevice => {
                write!(f, "no CUDA device visible (is CUDA_VISIBLE_DEVICES empty, or the driver not loaded?)")
            }
            EnvError::NotEnoughDevices { local_rank, device_count } => write!(
                f,
                "local rank {local_rank} has no GPU of its own: only {device_count} CUDA devices are visible; \
                 start at most {device_count} processes per node, or give each process its own GPUs: one through \
                 CUDA_VISIBLE_DEVICES, or with Slurm `srun --gpus-per-task N` (which binds them to each task; \
                 SLURM_GPUS_PER_TASK then tells this process to use the first)"
            ),
        }
    }
}

impl std::error::Error for EnvError {}
