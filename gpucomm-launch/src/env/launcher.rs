//! Which launcher's variables gave the rank.

use std::fmt;

/// The launcher family whose variables gave the rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// `RANK`, `WORLD_SIZE`, … as set by `torchrun` (or by hand).
    Torchrun,
    /// `SLURM_PROCID`, … as set by `srun`.
    Slurm,
    /// `OMPI_COMM_WORLD_*` as set by Open MPI's `mpirun`.
    OpenMpi,
    /// `PMI_RANK`, `PMI_SIZE` as set by MPICH's Hydra `mpiexec` and other PMI launchers.
    Pmi,
    /// No launcher: a single process.
    Single,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Torchrun => "torchrun-style variables",
            Launcher::Slurm => "Slurm (srun) variables",
            Launcher::OpenMpi => "Open MPI (mpirun) variables",
            Launcher::Pmi => "PMI (MPICH / Hydra mpiexec) variables",
            Launcher::Single => "no launcher (single process)",
        })
    }
}
