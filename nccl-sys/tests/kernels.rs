//! NCCL device-API kernels built by `build_support::build::cu` against the headers this
//! crate was built with, passed the way a dependent's build script gets them
//! (`DEP_NCCL_INCLUDE`). Real nvcc from the pinned wheels; no GPU.

use std::path::Path;

use build_support::build::cu::{Flavour, Kernels};
use build_support::emit::Emitter;
use build_support::env::Env;

/// A one-shot LSA all-reduce for NCCL 2.28's device API, the pattern the issue's lessons build on:
/// one LSA barrier per CTA (the host asks for `lsaBarrierCount` ≥ the grid), every rank sums an
/// interleaved slice over all peers' windows with `ncclGetLsaPointer` and stores the sum into each.
/// No multimem: the barrier session is opened with `multimem = false`.
const LSA_ALL_REDUCE: &str = r#"#include <nccl_device.h>

extern "C" __global__ void lsa_all_reduce(ncclWindow_t win, size_t offset, size_t count, ncclDevComm dev) {
  ncclCoopCta cta;
  ncclLsaBarrierSession<ncclCoopCta> bar(cta, dev, ncclTeamTagLsa(), blockIdx.x, /*multimem=*/false);
  bar.sync(cta, cuda::memory_order_relaxed);
  const int peers = dev.lsaSize;
  const size_t stride = size_t(gridDim.x) * blockDim.x * peers;
  for (size_t i = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) * peers + dev.lsaRank; i < count; i += stride) {
    float sum = 0.0f;
    for (int p = 0; p < peers; p++) sum += static_cast<const float *>(ncclGetLsaPointer(win, offset, p))[i];
    for (int p = 0; p < peers; p++) static_cast<float *>(ncclGetLsaPointer(win, offset, p))[i] = sum;
  }
  bar.sync(cta, cuda::memory_order_release);
}
"#;

/// The kernel compiles into a cubin that exports it; the headers are this crate's
/// (`nccl_sys::INCLUDE_DIR`), and Cargo is told to rerun when one of them changes.
#[test]
fn lsa_all_reduce_builds_against_the_headers_of_this_build() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("lsa_all_reduce.cu");
    std::fs::write(&source, LSA_ALL_REDUCE).unwrap();
    let prefix = std::env::var("GPUCOMM_PREFIX").expect("GPUCOMM_PREFIX (set by .cargo/config.toml)");
    let env = Env::from_pairs(
        None,
        [
            ("OUT_DIR", dir.path().to_str().unwrap()),
            ("GPUCOMM_PREFIX", prefix.as_str()),
            ("DEP_NCCL_INCLUDE", nccl_sys::INCLUDE_DIR),
            // Must not be consulted: DEP_NCCL_INCLUDE names the install.
            ("NCCL_HOME", "/nonexistent/nccl"),
        ],
    );
    let mut out = Emitter::new(Vec::new());
    let built = Kernels::new().nccl(&source).build_with(&env, &mut out).unwrap_or_else(|e| panic!("{e}"));
    let image = &built.images[0];
    assert_eq!((image.name.as_str(), image.flavour), ("LSA_ALL_REDUCE", Flavour::Nccl));
    let bytes = std::fs::read(image.image.as_ref().unwrap()).unwrap();
    assert!(bytes.starts_with(b"\x7fELF"));
    assert!(bytes.windows(b"lsa_all_reduce\0".len()).any(|w| w == b"lsa_all_reduce\0"), "kernel symbol missing");

    let include = std::fs::canonicalize(nccl_sys::INCLUDE_DIR).unwrap();
    let cargo = String::from_utf8(out.into_inner()).unwrap();
    for header in ["nccl_device.h", "nccl_device/lsa_barrier.h", "nccl_device/impl/lsa_barrier__funcs.h", "nccl.h"] {
        let path = include.join(header);
        assert!(image.inputs.contains(&path), "{header} missing from {:?}", image.inputs);
        assert!(cargo.contains(&format!("cargo::rerun-if-changed={}\n", path.display())), "{header}: {cargo}");
    }
    assert!(!cargo.contains("NCCL_HOME"), "the search ran although DEP_NCCL_INCLUDE was given:\n{cargo}");
    assert!(Path::new(&built.rust_file).is_file());
}
