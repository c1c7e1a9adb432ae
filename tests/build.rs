//! Compiles the GPU suites' kernels into `OUT_DIR`: `plain.cubin` (launched through cudarc),
//! `nvshmem_kernels.cubin` (lesson 12's kernel and a plain ring put, device-linked against
//! `libnvshmem_device.a`, loaded by `nvshmem::Runtime::load_module`), and `other_arch.fatbin` (the plain kernels for GPUs other
//! than the default architecture only, to check that loading it is refused). Architectures come
//! from `CUDA_ARCHS` (default sm_90), never from the build machine.

use std::path::{Path, PathBuf};

use gpucomm_build_support::build::nvcc::Nvcc;
use gpucomm_build_support::emit::Emitter;
use gpucomm_build_support::env::Env;
use gpucomm_build_support::locate::{Locator, CUDA};

/// Architectures the "other architecture" module holds: no sm_90 SASS and no PTX, so an H100 or
/// H200 cannot run it.
const OTHER_ARCHS: &str = "80,100";

fn main() {
    let env = Env::process();
    let mut out = Emitter::stdout();
    let result = build(&env, &mut out);
    out.rerun_if_env_changed(&env);
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn build(env: &Env, out: &mut Emitter<std::io::Stdout>) -> Result<(), String> {
    let dir = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let dep = |key: &str| std::env::var(key).map_err(|_| format!("{key} is not set (nvshmem-sys publishes it)"));
    let cuda = Locator::new(env).find(&CUDA).map_err(|e| e.to_string())?;
    let (plain, ring) = (Path::new("kernels/plain.cu"), Path::new("kernels/nvshmem_kernels.cu"));
    for src in [plain, ring, Path::new("../examples/kernels/nvshmem_ring.cu")] {
        out.rerun_if_changed(src);
    }

    let mut nvcc = Nvcc::locate(env, Some(&cuda))?;
    nvcc.module(plain, &dir.join("plain.cubin"))?;
    nvcc.include(Path::new(&dep("DEP_NVSHMEM_INCLUDE")?));
    let device_lib = Path::new(&dep("DEP_NVSHMEM_LIB_DIR")?).join("libnvshmem_device.a");
    nvcc.device_linked_module(
        ring,
        &[&device_lib],
        &dir.join("nvshmem_kernels.o"),
        &dir.join("nvshmem_kernels.cubin"),
    )?;

    // The same nvcc and host compiler, other architectures.
    let kept: Vec<(&str, String)> =
        ["NVCC", "NVCC_CCBIN"].into_iter().filter_map(|k| env.get(k).map(|v| (k, v.value))).collect();
    let pairs = kept.iter().map(|(k, v)| (*k, v.as_str())).chain([("CUDA_ARCHS", OTHER_ARCHS)]);
    Nvcc::locate(&Env::from_pairs(None, pairs), Some(&cuda))?.module(plain, &dir.join("other_arch.fatbin"))
}
