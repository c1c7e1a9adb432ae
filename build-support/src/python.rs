//! Asking a Python interpreter where its NVIDIA wheels live.
//!
//! NVIDIA ships NCCL, NVSHMEM and the CUDA toolkit pieces as pip wheels that all install under the
//! `nvidia` namespace package (`site-packages/nvidia/{nccl,nvshmem,cu13,...}`). Rather than guessing
//! site-packages paths, the interpreter is asked for `nvidia.__path__`; every answer line carries a
//! sentinel prefix so that anything else the interpreter prints (warnings, banners) is ignored.
//! The paths come back as the operating system's bytes (they need not be UTF-8), and the
//! directory the interpreter was started in is not searched (`python -c` would put it first on
//! `sys.path`, and an `nvidia` folder there would be taken for the wheels).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const SENTINEL: &str = "GPUCOMM_NVIDIA_DIR=";
const ERROR_SENTINEL: &str = "GPUCOMM_PY_ERROR=";

const SCRIPT: &str = "\
import os, sys
sys.path[:] = [p for p in sys.path if p != '']
try:
    import nvidia
    for p in nvidia.__path__:
        sys.stdout.flush()
        sys.stdout.buffer.write(b'GPUCOMM_NVIDIA_DIR=' + os.fsencode(p) + b'\\n')
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
    nvidia_dirs_from(python, None)
}

/// [`nvidia_dirs`], with the interpreter started in `dir` when given.
fn nvidia_dirs_from(python: &OsStr, dir: Option<&Path>) -> NvidiaDirs {
    let mut command = Command::new(python);
    command.arg("-c").arg(SCRIPT);
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let output = match command.output() {
        Ok(o) => o,
        Err(e) => return NvidiaDirs::NoInterpreter(format!("could not run `{}`: {e}", python.display())),
    };
    parse(&output.stdout).unwrap_or_else(|| {
        let stderr = String::from_utf8_lossy(&output.stderr);
        NvidiaDirs::NoInterpreter(format!("`{}` exited with {}: {}", python.display(), output.status, stderr.trim()))
    })
}

/// Parses the sentinel lines (a path keeps its bytes); `None` when there are none at all.
fn parse(stdout: &[u8]) -> Option<NvidiaDirs> {
    let mut dirs = Vec::new();
    for line in stdout.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(p) = line.strip_prefix(SENTINEL.as_bytes()) {
            dirs.push(PathBuf::from(OsStr::from_bytes(p)));
        } else if let Some(e) = line.strip_prefix(ERROR_SENTINEL.as_bytes()) {
            return Some(NvidiaDirs::NoPackage(String::from_utf8_lossy(e).trim_end().to_string()));
        }
    }
    (!dirs.is_empty()).then_some(NvidiaDirs::Found(dirs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sentinel_lines_and_ignores_noise() {
        let out = b"Warning: something\nGPUCOMM_NVIDIA_DIR=/a/site/nvidia\nGPUCOMM_NVIDIA_DIR=/b/nvidia\n";
        assert_eq!(
            parse(out),
            Some(NvidiaDirs::Found(vec![PathBuf::from("/a/site/nvidia"), PathBuf::from("/b/nvidia")]))
        );
        assert_eq!(
            parse(b"GPUCOMM_PY_ERROR=ModuleNotFoundError: No module named 'nvidia'\n"),
            Some(NvidiaDirs::NoPackage("ModuleNotFoundError: No module named 'nvidia'".into()))
        );
        assert_eq!(parse(b"garbage"), None);
        // Session 29 audit: a path that is not UTF-8 was read lossily, and so never found.
        let odd = b"GPUCOMM_NVIDIA_DIR=/site\xff/nvidia\n";
        assert_eq!(parse(odd), Some(NvidiaDirs::Found(vec![PathBuf::from(OsStr::from_bytes(b"/site\xff/nvidia"))])));
    }

    /// Session 29 audit: `python -c` puts the directory it starts in first on `sys.path`, so an
    /// `nvidia` folder there was taken for the wheels (and at run time, a `libnccl.so.2` under it
    /// loaded). Started in a directory that has one, the interpreter now does not answer with it.
    #[test]
    fn the_directory_python_starts_in_is_not_searched() {
        let dir = std::env::temp_dir().join(format!("gpucomm-python-cwd-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("nvidia/nccl/lib")).unwrap();
        let planted = dir.join("nvidia");
        let answer = nvidia_dirs_from(OsStr::new("python3"), Some(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
        match answer {
            NvidiaDirs::Found(dirs) => {
                assert!(!dirs.iter().any(|d| d.ends_with(&planted) || d == Path::new("nvidia")), "{dirs:?}")
            }
            NvidiaDirs::NoPackage(_) => {}
            NvidiaDirs::NoInterpreter(why) => panic!("this test needs python3 on PATH: {why}"),
        }
    }

    #[test]
    fn missing_interpreter_is_reported() {
        match nvidia_dirs(OsStr::new("/nonexistent/python-for-test")) {
            NvidiaDirs::NoInterpreter(msg) => assert!(msg.contains("/nonexistent/python-for-test"), "{msg}"),
            other => panic!("unexpected {other:?}"),
        }
    }
}
