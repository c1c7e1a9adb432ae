//! Compiles the GPU suites' kernels with build-support's `.cu` builder — `kernels::PLAIN` (plain
//! CUDA, launched through cudarc) and `kernels::NVSHMEM_KERNELS` (lesson 11's kernel and a plain
//! ring put, device-linked against `libnvshmem_device.a`) — and, with nvcc directly,
//! `other_arch.fatbin`: the plain kernels for sm_80 and sm_100 only (no sm_90 code, no PTX), which
//! an H100/H200 must refuse to load.

use std::process::ExitCode;

use build_support::build::cu::{CuError, Kernels};
use build_support::build::nvcc::Nvcc;
use build_support::emit::Emitter;
use build_support::env::Env;
use build_support::locate::{Locator, CUDA};

const OTHER_ARCHS: &str = "80,100";

fn main() -> ExitCode {
    let mut out = Emitter::stdout();
    let env = Env::process();
    let built = Kernels::new()
        .cuda("kernels/plain.cu")
        .nvshmem("kernels/nvshmem_kernels.cu")
        .build_with(&env, &mut out)
        .and_then(|_| other_arch(&env));
    match built {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            e.report(&mut out);
            ExitCode::FAILURE
        }
    }
}

/// The same nvcc and host compiler, other architectures.
fn other_arch(env: &Env) -> Result<(), CuError> {
    let out_dir = std::path::PathBuf::from(env.cargo_var("OUT_DIR").ok_or(CuError::NoOutDir)?);
    let cuda = Locator::new(env).find(&CUDA).ok();
    let kept: Vec<(&str, String)> =
        ["NVCC", "NVCC_CCBIN"].into_iter().filter_map(|k| env.get(k).map(|v| (k, v.value))).collect();
    let pairs = kept.iter().map(|(k, v)| (*k, v.as_str())).chain([("CUDA_ARCHS", OTHER_ARCHS)]);
    let nvcc = Nvcc::locate(&Env::from_pairs(None, pairs), cuda.as_ref())?;
    nvcc.module("kernels/plain.cu".as_ref(), &out_dir.join("other_arch.fatbin")).map(|_| ())
}
