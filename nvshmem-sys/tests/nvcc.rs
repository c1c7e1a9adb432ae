//! NVSHMEM kernels built by `build_support::build::cu` with nothing but the pinned wheels,
//! against the headers and `libnvshmem_device.a` of the install this crate was built with, passed
//! the way a dependent's build script gets them (`DEP_NVSHMEM_INCLUDE`, `DEP_NVSHMEM_LIB_DIR`).

use std::path::Path;

use build_support::build::cu::{Flavour, Kernels};
use build_support::emit::Emitter;
use build_support::env::Env;

/// The NVSHMEM flavour compiles with relocatable device code and device-links against the wheel's
/// `libnvshmem_device.a` into one self-contained cubin (the recipe NVSHMEM needs): it exports the
/// kernel and the device library's version symbol, which `nvshmemx_cumodule_init` looks for after
/// loading. The device library and headers are inputs Cargo is told about.
#[test]
fn nvshmem_kernel_is_device_linked_into_one_image() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("ring.cu");
    std::fs::write(
        &source,
        "#include <nvshmem.h>\n#include <nvshmemx.h>\n\
         extern \"C\" __global__ void ring_put(int *dst, int value) {\n\
             int me = nvshmem_my_pe();\n\
             nvshmem_int_p(dst, value + me, (me + 1) % nvshmem_n_pes());\n\
         }\n",
    )
    .unwrap();
    let prefix = std::env::var("GPUCOMM_PREFIX").expect("GPUCOMM_PREFIX (set by .cargo/config.toml)");
    let env = Env::from_pairs(
        None,
        [
            ("OUT_DIR", dir.path().to_str().unwrap()),
            ("GPUCOMM_PREFIX", prefix.as_str()),
            ("DEP_NVSHMEM_INCLUDE", nvshmem_sys::INCLUDE_DIR),
            ("DEP_NVSHMEM_LIB_DIR", nvshmem_sys::BUILD_LIB_DIR),
        ],
    );
    let mut out = Emitter::new(Vec::new());
    let built = Kernels::new().nvshmem(&source).build_with(&env, &mut out).unwrap_or_else(|e| panic!("{e}"));
    let image = &built.images[0];
    assert_eq!((image.name.as_str(), image.flavour), ("RING", Flavour::Nvshmem));
    let bytes = std::fs::read(image.image.as_ref().unwrap()).unwrap();
    assert!(bytes.starts_with(b"\x7fELF"));
    assert!(contains(&bytes, b"ring_put\0"), "kernel symbol missing");
    assert!(contains(&bytes, b"nvshmemi_device_lib_version_d\0"), "not device-linked with libnvshmem_device.a");

    let device_lib = std::fs::canonicalize(Path::new(nvshmem_sys::BUILD_LIB_DIR).join("libnvshmem_device.a")).unwrap();
    let nvshmem_h = std::fs::canonicalize(Path::new(nvshmem_sys::INCLUDE_DIR).join("nvshmem.h")).unwrap();
    let cargo = String::from_utf8(out.into_inner()).unwrap();
    for input in [&device_lib, &nvshmem_h] {
        assert!(image.inputs.contains(input), "{} missing from {:?}", input.display(), image.inputs);
        assert!(cargo.contains(&format!("cargo::rerun-if-changed={}\n", input.display())), "{cargo}");
    }
    let rust = std::fs::read_to_string(&built.rust_file).unwrap();
    assert!(rust.contains("for `cuModuleLoadData`, then `nvshmemx_cumodule_init` before any launch."), "{rust}");
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
