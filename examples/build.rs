//! Compiles the lessons' NVSHMEM kernels (`kernels/*.cu`) into device-linked cubins in `OUT_DIR`
//! (`nvcc -rdc=true`, then `nvcc -dlink` against `libnvshmem_device.a`), which the lessons embed
//! with `include_bytes!`. The NVSHMEM headers and device library are the ones `nvshmem-sys` found
//! (`DEP_NVSHMEM_INCLUDE`, `DEP_NVSHMEM_LIB_DIR`); the architecture comes from `CUDA_ARCHS`
//! (default sm_90), never from the build machine.

use std::path::{Path, PathBuf};

use gpucomm_build_support::build::nvcc::Nvcc;
use gpucomm_build_support::emit::Emitter;
use gpucomm_build_support::env::Env;
use gpucomm_build_support::locate::{Locator, CUDA};

const KERNELS: &[&str] = &["nvshmem_ring", "nvshmem_bench"];

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
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let dep = |key: &str| std::env::var(key).map_err(|_| format!("{key} is not set (nvshmem-sys publishes it)"));
    let include = PathBuf::from(dep("DEP_NVSHMEM_INCLUDE")?);
    let device_lib = Path::new(&dep("DEP_NVSHMEM_LIB_DIR")?).join("libnvshmem_device.a");
    let cuda = Locator::new(env).find(&CUDA).map_err(|e| e.to_string())?;
    let mut nvcc = Nvcc::locate(env, Some(&cuda))?;
    nvcc.include(&include);
    for name in KERNELS {
        let src = Path::new("kernels").join(format!("{name}.cu"));
        out.rerun_if_changed(&src);
        let obj = out_dir.join(format!("{name}.o"));
        nvcc.device_linked_module(&src, &[&device_lib], &obj, &out_dir.join(format!("{name}.cubin")))?;
    }
    Ok(())
}
