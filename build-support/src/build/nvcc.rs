//! Compiling CUDA C++ (`.cu`) into loadable module images with `nvcc`.
//!
//! `nvcc` is taken from `NVCC`, else `<CUDA root>/bin/nvcc` (the CUDA install that
//! [`crate::locate::CUDA`] found, which for the pip wheels is `nvidia/cu13/bin/nvcc`), else `nvcc`
//! on `PATH`. Target architectures come from `CUDA_ARCHS` (comma-separated compute capabilities such
//! as `80,90`; default `90`), never from the build machine's GPU. `NVCC_CCBIN` picks the host
//! compiler. Every failure reports the full command line with nvcc's stdout and stderr.
//!
//! One architecture gives a `.cubin`, several a `.fatbin`; both load with `cuModuleLoadData`.
//! NVSHMEM kernels need relocatable device code and a device link against `libnvshmem_device.a`:
//! see [`Nvcc::device_linked_module`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::env::Env;
use crate::locate::Install;

/// Default `CUDA_ARCHS`: Hopper (H100/H200).
pub const DEFAULT_ARCHS: &str = "90";

/// An `nvcc` invocation template.
#[derive(Debug, Clone)]
pub struct Nvcc {
    program: PathBuf,
    archs: Vec<u32>,
    common: Vec<OsString>,
}

impl Nvcc {
    /// Finds `nvcc` and reads `CUDA_ARCHS` / `NVCC_CCBIN` from `env`. `cuda` is the CUDA install
    /// found by the locator, if any.
    pub fn locate(env: &Env, cuda: Option<&Install>) -> Result<Nvcc, String> {
        let program = match env.get("NVCC") {
            Some(v) => v.path(),
            None => cuda
                .and_then(|c| c.include_dir.parent().map(|root| root.join("bin/nvcc")))
                .filter(|p| p.is_file())
                .unwrap_or_else(|| PathBuf::from("nvcc")),
        };
        let archs_text = env.get("CUDA_ARCHS").map(|v| v.value).unwrap_or_else(|| DEFAULT_ARCHS.to_string());
        let archs = parse_archs(&archs_text)?;
        let mut common: Vec<OsString> = vec!["-std=c++17".into()];
        if let Some(ccbin) = env.get("NVCC_CCBIN") {
            common.push("-ccbin".into());
            common.push(ccbin.value.into());
        }
        Ok(Nvcc { program, archs, common })
    }

    /// The `nvcc` that will run.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Adds an include directory.
    pub fn include(&mut self, dir: &Path) -> &mut Self {
        self.common.push(format!("-I{}", dir.display()).into());
        self
    }

    /// Adds a raw flag.
    pub fn flag(&mut self, flag: &str) -> &mut Self {
        self.common.push(flag.into());
        self
    }

    fn gencode(&self) -> Vec<OsString> {
        self.archs.iter().map(|a| format!("-gencode=arch=compute_{a},code=sm_{a}").into()).collect()
    }

    fn image_kind(&self) -> &'static str {
        if self.archs.len() == 1 {
            "-cubin"
        } else {
            "-fatbin"
        }
    }

    /// Compiles `src` into a module image (`out`), no relocatable device code.
    pub fn module(&self, src: &Path, out: &Path) -> Result<(), String> {
        let mut args = self.common.clone();
        args.extend(self.gencode());
        args.extend([self.image_kind().into(), src.into(), "-o".into(), out.into()]);
        self.run(&args)
    }

    /// Only checks that `src` compiles (`-c` to a throw-away object): for static assertions.
    pub fn check(&self, src: &Path, scratch_obj: &Path) -> Result<(), String> {
        let mut args = self.common.clone();
        args.extend(self.gencode());
        args.extend(["-c".into(), src.into(), "-o".into(), scratch_obj.into()]);
        self.run(&args)
    }

    /// Compiles `src` with `-rdc=true` and device-links it with `libs` (e.g. `libnvshmem_device.a`)
    /// into one self-contained module image (`out`); `obj` is the intermediate object.
    pub fn device_linked_module(&self, src: &Path, libs: &[&Path], obj: &Path, out: &Path) -> Result<(), String> {
        let mut compile = self.common.clone();
        compile.extend(self.gencode());
        compile.extend(["-rdc=true".into(), "-c".into(), src.into(), "-o".into(), obj.into()]);
        self.run(&compile)?;
        let mut link: Vec<OsString> = self.gencode();
        link.extend(["-dlink".into(), self.image_kind().into(), obj.into()]);
        link.extend(libs.iter().map(|l| OsString::from(l.as_os_str())));
        link.extend(["-o".into(), out.into()]);
        self.run(&link)
    }

    fn run(&self, args: &[OsString]) -> Result<(), String> {
        let shown = std::iter::once(self.program.display().to_string())
            .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(" ");
        let output = Command::new(&self.program).args(args).output().map_err(|e| {
            format!("could not run `{shown}`: {e}\nSet NVCC to an nvcc binary or CUDA_HOME to a CUDA toolkit.")
        })?;
        if output.status.success() {
            return Ok(());
        }
        Err(format!(
            "`{shown}` failed with {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// `"80, 90"` → `[80, 90]`.
fn parse_archs(text: &str) -> Result<Vec<u32>, String> {
    let archs: Result<Vec<u32>, _> = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_start_matches("sm_").parse::<u32>())
        .collect();
    match archs {
        Ok(a) if !a.is_empty() => Ok(a),
        _ => Err(format!("CUDA_ARCHS={text:?} is not a list of compute capabilities such as `80,90`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archs_parse() {
        assert_eq!(parse_archs("90").unwrap(), [90]);
        assert_eq!(parse_archs(" 80, sm_90 ,").unwrap(), [80, 90]);
        assert!(parse_archs("hopper").unwrap_err().contains("CUDA_ARCHS"));
        assert!(parse_archs("").is_err());
    }

    #[test]
    fn explicit_nvcc_and_options_are_used() {
        let env = Env::from_pairs(None, [("NVCC", "/opt/x/nvcc"), ("CUDA_ARCHS", "80,90"), ("NVCC_CCBIN", "g++-12")]);
        let nvcc = Nvcc::locate(&env, None).unwrap();
        assert_eq!(nvcc.program(), Path::new("/opt/x/nvcc"));
        assert_eq!(nvcc.image_kind(), "-fatbin");
        assert_eq!(nvcc.common, ["-std=c++17", "-ccbin", "g++-12"]);
        let err = nvcc.module(Path::new("a.cu"), Path::new("a.fatbin")).unwrap_err();
        assert!(
            err.starts_with("could not run `/opt/x/nvcc -std=c++17 -ccbin g++-12 -gencode=arch=compute_80,code=sm_80"),
            "{err}"
        );
    }
}
