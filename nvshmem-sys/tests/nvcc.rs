//! The `.cu` helper of build-support, with nothing but the pinned wheels: a plain module and an
//! NVSHMEM module device-linked against the wheel's `libnvshmem_device.a`.

use std::path::Path;

use gpucomm_build_support::build::nvcc::Nvcc;
use gpucomm_build_support::env::Env;
use gpucomm_build_support::locate::{Locator, CUDA};

/// The `.cu` helper builds loadable modules with nothing but the pinned wheels: a plain kernel,
/// and an NVSHMEM kernel compiled with relocatable device code and device-linked against the
/// wheel's `libnvshmem_device.a` into one self-contained cubin (the recipe NVSHMEM needs).
#[test]
fn nvcc_builds_plain_and_nvshmem_modules() {
    let env = Env::process();
    let cuda = Locator::new(&env).find(&CUDA).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let mut nvcc = Nvcc::locate(&env, Some(&cuda)).unwrap();

    let plain = dir.path().join("scale.cu");
    std::fs::write(&plain, "extern \"C\" __global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }\n").unwrap();
    let cubin = dir.path().join("scale.cubin");
    nvcc.module(&plain, &cubin).unwrap_or_else(|e| panic!("{e}"));
    let image = std::fs::read(&cubin).unwrap();
    assert!(image.starts_with(b"\x7fELF") && contains(&image, b"scale"));

    let shmem = dir.path().join("ring.cu");
    std::fs::write(
        &shmem,
        "#include <nvshmem.h>\n#include <nvshmemx.h>\n\
         extern \"C\" __global__ void ring_put(int *dst, int value) {\n\
             int me = nvshmem_my_pe();\n\
             nvshmem_int_p(dst, value + me, (me + 1) % nvshmem_n_pes());\n\
         }\n",
    )
    .unwrap();
    nvcc.include(Path::new(nvshmem_sys::INCLUDE_DIR));
    let device_lib = Path::new(nvshmem_sys::BUILD_LIB_DIR).join("libnvshmem_device.a");
    let linked = dir.path().join("ring.cubin");
    nvcc.device_linked_module(&shmem, &[&device_lib], &dir.path().join("ring.o"), &linked)
        .unwrap_or_else(|e| panic!("{e}"));
    let image = std::fs::read(&linked).unwrap();
    assert!(image.starts_with(b"\x7fELF") && contains(&image, b"ring_put"));
    // The device library's state is linked in: nvshmemx_cumodule_init looks for it after loading.
    assert!(contains(&image, b"nvshmemi_device_lib_version_d"), "not device-linked with libnvshmem_device.a");
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
