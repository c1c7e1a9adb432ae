//! Asking a Python interpreter where its NVIDIA wheels live.
//!
//! NVIDIA ships NCCL, NVSHMEM and the CUDA toolkit pieces as pip wheels that all install under the
//! `nvidia` namespace package (`site-packages/nvidia/{nccl,nvshmem,cu13,...}`). Rather than guessing
//! site-packages paths, the interpreter is asked for `nvidia.__path__`; every answer line carries a
//! sentinel prefix so that anything else the interpreter prints (warnings, banners) is ignored.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

const SENTINEL: &str = "GPUCOMM_NVIDIA_DIR=";
const ERROR_SENTINEL: &str = "GPUCOMM_PY_ERROR=";

const SCRIPT: &str = "\
try:
    import nvidia
    for p in nvidia.__path__:
        print('GPUCOMM_NVIDIA_DIR=' + str(p))
except Exception as e:
    print('GPUCOMM_PY_ERROR=' + type(e).__name__ + ': ' + str(e))
";

/// What an interpreter said about its `nvidia` packages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvidiaDirs {
    /// The `nvidia` namespace package's directories (usually one per site-packages that has wheels).
    Found(Vec<PathBuf>),
    /// The interpreter ran but has no `nvidia` package (the text says why).
    NoPackage(String),
    /// The interpreter could not be run.
    NoInterpreter(String),
}

/// Runs `python` (a program name or path) and asks for `nvidia.__path__`.
pub fn nvidia_dirs(python: &OsStr) -> NvidiaDirs {
    let output = match Command::new(python).arg("-c").arg(SCRIPT).output() {
        Ok(o) => o,
        Err(e) => return NvidiaDirs::NoInterpreter(format!("could not run `{}`: {e}", python.display())),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    parse(&stdout).unwrap_or_else(|| {
        let stderr = String::from_utf8_lossy(&output.stderr);
        NvidiaDirs::NoInterpreter(format!("`{}` exited with {}: {}", python.display(), output.status, stderr.trim()))
    })
}

/// Parses the sentinel lines; `None` when there are none at all.
fn parse(stdout: &str) -> Option<NvidiaDirs> {
    let mut dirs = Vec::new();
    for line in stdout.lines() {
        if let Some(p) = line.strip_prefix(SENTINEL) {
            dirs.push(PathBuf::from(p.trim_end()));
        } else if let Some(e) = line.strip_prefix(ERROR_SENTINEL) {
            return Some(NvidiaDirs::NoPackage(e.trim_end().to_string()));
        }
    }
    (!dirs.is_empty()).then_some(NvidiaDirs::Found(dirs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sentinel_lines_and_ignores_noise() {
        let out = "Warning: something\nGPUCOMM_NVIDIA_DIR=/a/site/nvidia\nGPUCOMM_NVIDIA_DIR=/b/nvidia\n";
        assert_eq!(
            parse(out),
            Some(NvidiaDirs::Found(vec![PathBuf::from("/a/site/nvidia"), PathBuf::from("/b/nvidia")]))
        );
        assert_eq!(
            parse("GPUCOMM_PY_ERROR=ModuleNotFoundError: No module named 'nvidia'\n"),
            Some(NvidiaDirs::NoPackage("ModuleNotFoundError: No module named 'nvidia'".into()))
        );
        assert_eq!(parse("garbage"), None);
    }

    #[test]
    fn missing_interpreter_is_reported() {
        match nvidia_dirs(OsStr::new("/nonexistent/python-for-test")) {
            NvidiaDirs::NoInterpreter(msg) => assert!(msg.contains("/nonexistent/python-for-test"), "{msg}"),
            other => panic!("unexpected {other:?}"),
        }
    }
}
