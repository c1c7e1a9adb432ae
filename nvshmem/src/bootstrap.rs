//! How the PEs of a job find each other when NVSHMEM starts.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::{config, UniqueId};

/// How the PEs of a job find each other when NVSHMEM starts ([`crate::Runtime::with_bootstrap`]).
/// Every variant goes through `nvshmemx_hostlib_init_attr`.
///
/// | Variant | Flags | Launcher |
/// |---|---|---|
/// | [`Bootstrap::UniqueId`] | `NVSHMEMX_INIT_WITH_UNIQUEID` | any: PE 0's id reaches the others by any channel (e.g. [`crate::launch::Rendezvous`]) |
/// | [`Bootstrap::Mpi`] | `NVSHMEMX_INIT_WITH_MPI_COMM`, no communicator | `mpirun`: the plugin `nvshmem_bootstrap_mpi.so.3` (needs Open MPI's `libmpi.so.40`) uses `MPI_COMM_WORLD`, initialising MPI if the program has not |
/// | [`Bootstrap::Pmi`] | 0 | a PMI launcher (Slurm, Hydra, PMIx): `NVSHMEM_BOOTSTRAP_PMI` picks PMI, PMI-2 or PMIX |
/// | [`Bootstrap::Environment`] | 0 | whatever `NVSHMEM_BOOTSTRAP` says (`PMI` by default, `MPI`, `SHMEM`, `plugin` with `NVSHMEM_BOOTSTRAP_PLUGIN`) |
///
/// The plugins are found next to `libnvshmem_host.so.3` (or where `NVSHMEM_BOOTSTRAP_*_PLUGIN`
/// points). For [`Bootstrap::Mpi`] the plugin is opened before NVSHMEM starts, so that a plugin
/// the machine's MPI cannot satisfy is a precise [`Error::BootstrapPlugin`] with the loader's
/// reason.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Bootstrap<'a> {
    /// The unique-id bootstrap: `id` made by PE 0 ([`UniqueId::new`]) and shared with all PEs.
    UniqueId {
        /// The job's id.
        id: &'a UniqueId,
        /// This process's PE.
        pe: usize,
        /// Number of PEs.
        n_pes: usize,
    },
    /// NVSHMEM's MPI plugin over `MPI_COMM_WORLD`.
    Mpi,
    /// NVSHMEM's PMI plugin. Refused when `NVSHMEM_BOOTSTRAP` names another bootstrap.
    Pmi,
    /// The bootstrap `NVSHMEM_BOOTSTRAP` selects (flags 0, no attributes).
    Environment,
}

/// The MPI plugin's default file name, as NVSHMEM 3.4 looks it up.
const MPI_PLUGIN: &str = "nvshmem_bootstrap_mpi.so.3";

impl Bootstrap<'_> {
    /// The PE and PE count the caller expects, when the bootstrap names them; checks them.
    pub(crate) fn expected_pes(&self) -> Result<Option<(usize, usize)>> {
        let Bootstrap::UniqueId { pe, n_pes, .. } = *self else { return Ok(None) };
        if n_pes == 0 || i32::try_from(n_pes).is_err() {
            return Err(Error::InvalidPeCount { got: n_pes });
        }
        if pe >= n_pes {
            return Err(Error::InvalidPe { what: "pe", pe, n_pes });
        }
        Ok(Some((pe, n_pes)))
    }

    /// The variant's name, for messages.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Bootstrap::UniqueId { .. } => "Bootstrap::UniqueId",
            Bootstrap::Mpi => "Bootstrap::Mpi",
            Bootstrap::Pmi => "Bootstrap::Pmi",
            Bootstrap::Environment => "Bootstrap::Environment",
        }
    }

    /// Refuses a request that the environment contradicts, and opens the MPI plugin ahead of
    /// NVSHMEM so that its failure has a reason.
    pub(crate) fn check_environment(&self) -> Result<()> {
        if !matches!(self, Bootstrap::UniqueId { .. }) {
            if let Some((variable, value)) = unique_id_plugin_named(config::string) {
                return Err(Error::UniqueIdPluginElsewhere { variable, value });
            }
        }
        match self {
            Bootstrap::Pmi => match config::string("NVSHMEM_BOOTSTRAP") {
                Some(value) if !value.eq_ignore_ascii_case("PMI") => {
                    Err(Error::BootstrapConflict { requested: "PMI", value })
                }
                _ => Ok(()),
            },
            Bootstrap::Mpi => open_plugin(config::string("NVSHMEM_BOOTSTRAP_MPI_PLUGIN"), MPI_PLUGIN),
            // The unique-id bootstrap without an id: NVSHMEM's plugin would read the arguments
            // through a null pointer.
            Bootstrap::Environment => match config::string("NVSHMEM_BOOTSTRAP") {
                Some(value) if value.eq_ignore_ascii_case("UID") => Err(Error::UniqueIdNeeded { value }),
                _ => Ok(()),
            },
            Bootstrap::UniqueId { .. } => Ok(()),
        }
    }
}

/// The variables that name the plugin of a bootstrap other than the unique-id one.
const PLUGIN_VARIABLES: [&str; 4] = [
    "NVSHMEM_BOOTSTRAP_PLUGIN",
    "NVSHMEM_BOOTSTRAP_PMI_PLUGIN",
    "NVSHMEM_BOOTSTRAP_MPI_PLUGIN",
    "NVSHMEM_BOOTSTRAP_SHMEM_PLUGIN",
];

/// The first of [`PLUGIN_VARIABLES`] (read through `lookup`) that names NVSHMEM's unique-id
/// plugin (`nvshmem_bootstrap_uid.so…`), with its value. NVSHMEM would load that plugin for
/// another bootstrap and hand it no unique-id arguments, which it reads through a null pointer.
fn unique_id_plugin_named(lookup: impl Fn(&str) -> Option<String>) -> Option<(&'static str, String)> {
    PLUGIN_VARIABLES.into_iter().find_map(|variable| {
        let value = lookup(variable)?;
        let file = value.rsplit('/').next().unwrap_or(&value);
        file.starts_with("nvshmem_bootstrap_uid").then_some((variable, value))
    })
}

/// Opens a bootstrap plugin (`RTLD_NOW`, as NVSHMEM does) and keeps it loaded for NVSHMEM. A
/// bare file name is looked for next to the host library; when it is not there, NVSHMEM's own
/// search decides and nothing is checked here.
fn open_plugin(named: Option<String>, default: &str) -> Result<()> {
    let name = named.unwrap_or_else(|| default.to_string());
    let plugin = if name.contains('/') {
        PathBuf::from(&name)
    } else {
        match host_library_dir().map(|d| d.join(&name)) {
            Some(path) if path.is_file() => path,
            _ => return Ok(()),
        }
    };
    // SAFETY: NVSHMEM loads the same file during initialisation; its initialisers (and those of
    // the MPI library it needs) run here instead, on the thread that is about to start NVSHMEM.
    match unsafe { libloading::os::unix::Library::open(Some(&plugin), libc::RTLD_NOW | libc::RTLD_LOCAL) } {
        Ok(lib) => {
            // Unloading MPI again is not something MPI libraries support well; NVSHMEM reopens it
            // anyway, so keep it.
            std::mem::forget(lib);
            Ok(())
        }
        Err(e) => Err(Error::BootstrapPlugin { plugin, reason: e.to_string() }),
    }
}

/// The directory of the loaded host library: the file of one of its functions (`dladdr`).
fn host_library_dir() -> Option<PathBuf> {
    let f = crate::ffi::resolve!(nvshmemx_init_status).ok()?;
    let path = crate::nccl::object_path(f as *const std::ffi::c_void)?;
    path.parent().map(|d| d.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unique_id_plugin_named_for_another_bootstrap_is_found() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
        };
        assert_eq!(unique_id_plugin_named(env(&[])), None);
        assert_eq!(
            unique_id_plugin_named(env(&[("NVSHMEM_BOOTSTRAP_PMI_PLUGIN", "nvshmem_bootstrap_pmi2.so.3")])),
            None
        );
        assert_eq!(
            unique_id_plugin_named(env(&[("NVSHMEM_BOOTSTRAP_PLUGIN", "nvshmem_bootstrap_uid.so.3")])),
            Some(("NVSHMEM_BOOTSTRAP_PLUGIN", "nvshmem_bootstrap_uid.so.3".to_string()))
        );
        assert_eq!(
            unique_id_plugin_named(env(&[(
                "NVSHMEM_BOOTSTRAP_MPI_PLUGIN",
                "/opt/nvshmem/lib/nvshmem_bootstrap_uid.so"
            )])),
            Some(("NVSHMEM_BOOTSTRAP_MPI_PLUGIN", "/opt/nvshmem/lib/nvshmem_bootstrap_uid.so".to_string()))
        );
    }

    #[test]
    fn unique_id_bootstraps_check_their_numbers() {
        let id = UniqueId(nvshmem_sys::nvshmemx_uniqueid_t::initializer());
        let b = |pe, n_pes| Bootstrap::UniqueId { id: &id, pe, n_pes };
        assert_eq!(b(1, 2).expected_pes().unwrap(), Some((1, 2)));
        assert!(matches!(b(0, 0).expected_pes(), Err(Error::InvalidPeCount { got: 0 })));
        assert!(matches!(b(2, 2).expected_pes(), Err(Error::InvalidPe { pe: 2, n_pes: 2, .. })));
        let huge = i32::MAX as usize + 1;
        assert!(matches!(b(0, huge).expected_pes(), Err(Error::InvalidPeCount { got }) if got == huge));
        assert_eq!(Bootstrap::Mpi.expected_pes().unwrap(), None);
    }

    /// On a machine without Open MPI (CI), the MPI plugin next to the host library cannot load,
    /// and the error says exactly why; with Open MPI it loads.
    #[test]
    fn the_mpi_plugin_is_checked_before_nvshmem_starts() {
        match Bootstrap::Mpi.check_environment() {
            Ok(()) => eprintln!("the MPI plugin loads here (or no NVSHMEM library was found)"),
            Err(Error::BootstrapPlugin { plugin, reason }) => {
                assert!(plugin.ends_with(MPI_PLUGIN), "{}", plugin.display());
                assert!(reason.contains("libmpi.so.40"), "{reason}");
            }
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_missing_plugin_file_named_by_path_is_refused_with_the_loaders_reason() {
        let err = open_plugin(Some("/nonexistent/nvshmem_bootstrap_mpi.so.3".into()), MPI_PLUGIN).unwrap_err();
        match err {
            Error::BootstrapPlugin { plugin, reason } => {
                assert_eq!(plugin, PathBuf::from("/nonexistent/nvshmem_bootstrap_mpi.so.3"));
                assert!(reason.contains("No such file"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}
