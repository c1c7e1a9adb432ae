//! Finds NCCL and the CUDA headers, publishes the NCCL version, and generates the bindings.
//! The shared flow (search, version cfgs, docs.rs snapshot, `link` feature) is in
//! `build_support::build::SysBuild`; this file only says what to bind.

use build_support::build::{bindgen_builder, SysBuild};
use build_support::locate::NCCL;
use build_support::version::{nccl_header_version, Version, NCCL_SUPPORT};

fn main() -> std::process::ExitCode {
    SysBuild {
        spec: &NCCL,
        support: &NCCL_SUPPORT,
        read_version: nccl_header_version,
        snapshot: "snapshot/bindings.rs",
    }
    .run(|ctx| {
        // The device API's host side (ncclDevCommCreate, barrier requirements, teams) and the
        // layout of ncclDevComm come with nccl_device.h, which exists from 2.28.
        let device_api = ctx.version >= Version::new(2, 28, 0);
        let wrapper = if device_api { "#include <nccl.h>\n#include <nccl_device.h>\n" } else { "#include <nccl.h>\n" };
        bindgen_builder(ctx, wrapper, "Nccl")
            .allowlist_function("nccl.*")
            .allowlist_type("nccl.*")
            .allowlist_var("NCCL_.*")
            .must_use_type("ncclResult_t")
            .generate()
            .map(|b| b.to_string())
            .map_err(|e| format!("bindgen failed on nccl.h: {e}"))
    })
}
