//! What each kind of `.cu` file ([`Flavour`]) needs from the NCCL / NVSHMEM install.
//!
//! The install is the one the `-sys` crate found, passed on through its `links` metadata:
//! `DEP_NCCL_INCLUDE` (nccl-sys), `DEP_NVSHMEM_INCLUDE` and `DEP_NVSHMEM_LIB_DIR` (nvshmem-sys).
//! Cargo gives `DEP_*` only to the build scripts of **direct** dependents; without them the same
//! search runs here ([`crate::locate`], same variables, same order), which finds the same install
//! as long as both build scripts see the same environment.

use std::path::{Path, PathBuf};

use crate::build::error::CuError;
use crate::build::flavour::Flavour;
use crate::env::Env;
use crate::locate::{Locator, NCCL, NVSHMEM};

/// The include directory and device library of each flavour in use.
#[derive(Debug, Default)]
pub(super) struct Installs {
    nccl_include: Option<PathBuf>,
    nvshmem: Option<(PathBuf, PathBuf)>,
}

/// What a flavour adds to the compilation.
pub(super) struct FlavourInputs<'a> {
    pub include: Option<&'a Path>,
    pub device_lib: Option<&'a Path>,
}

impl Installs {
    /// Finds what the flavours in `used` need (nothing is looked up for flavours not used).
    pub fn resolve(env: &Env, locator: &Locator<'_>, used: &[Flavour]) -> Result<Installs, CuError> {
        let mut installs = Installs::default();
        if used.contains(&Flavour::Nccl) {
            let (include, origin) = match env.cargo_var("DEP_NCCL_INCLUDE") {
                Some(dir) => (PathBuf::from(dir), "DEP_NCCL_INCLUDE, from nccl-sys".to_string()),
                None => {
                    let found = locator.find(&NCCL).map_err(|r| not_found(Flavour::Nccl, r))?;
                    (found.include_dir, format!("the NCCL search: {}", found.origin))
                }
            };
            require(
                Flavour::Nccl,
                &include.join("nccl_device.h"),
                &origin,
                " (NCCL's device API needs NCCL 2.28 or newer)",
            )?;
            installs.nccl_include = Some(include);
        }
        if used.contains(&Flavour::Nvshmem) {
            let dep = env.cargo_var("DEP_NVSHMEM_INCLUDE").zip(env.cargo_var("DEP_NVSHMEM_LIB_DIR"));
            let (include, lib_dir, origin) = match dep {
                Some((inc, lib)) => (
                    PathBuf::from(inc),
                    PathBuf::from(lib),
                    "DEP_NVSHMEM_INCLUDE / DEP_NVSHMEM_LIB_DIR, from nvshmem-sys".to_string(),
                ),
                None => {
                    let found = locator.find(&NVSHMEM).map_err(|r| not_found(Flavour::Nvshmem, r))?;
                    let lib_dir = found.lib_dir.unwrap_or_default();
                    (found.include_dir, lib_dir, format!("the NVSHMEM search: {}", found.origin))
                }
            };
            require(Flavour::Nvshmem, &include.join("nvshmem.h"), &origin, "")?;
            let device_lib = lib_dir.join("libnvshmem_device.a");
            require(
                Flavour::Nvshmem,
                &device_lib,
                &origin,
                " (the device library ships with NVSHMEM's headers: the nvidia-nvshmem wheels, the NVSHMEM \
                 tarball, the libnvshmem3-dev packages)",
            )?;
            installs.nvshmem = Some((include, device_lib));
        }
        Ok(installs)
    }

    /// The include directory and device library for `flavour` (resolved for the flavours used).
    pub fn inputs(&self, flavour: Flavour) -> FlavourInputs<'_> {
        match flavour {
            Flavour::Cuda => FlavourInputs { include: None, device_lib: None },
            Flavour::Nccl => FlavourInputs { include: self.nccl_include.as_deref(), device_lib: None },
            Flavour::Nvshmem => FlavourInputs {
                include: self.nvshmem.as_ref().map(|(i, _)| i.as_path()),
                device_lib: self.nvshmem.as_ref().map(|(_, l)| l.as_path()),
            },
        }
    }
}

fn not_found(flavour: Flavour, report: crate::locate::NotFound) -> CuError {
    CuError::InstallNotFound { flavour, report: Box::new(report) }
}

fn require(flavour: Flavour, file: &Path, origin: &str, hint: &'static str) -> Result<(), CuError> {
    if file.is_file() {
        return Ok(());
    }
    Err(CuError::InstallIncomplete { flavour, missing: file.to_path_buf(), origin: origin.to_string(), hint })
}
