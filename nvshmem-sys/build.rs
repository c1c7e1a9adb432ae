//! Finds NVSHMEM and the CUDA headers, publishes the NVSHMEM version, and generates bindings for
//! exactly the functions that `libnvshmem_host.so.3` exports. The shared flow is in
//! `build_support::build::SysBuild`.

use build_support::build::{bindgen_builder, exports::exported_functions, SysBuild};
use build_support::emit::Emitter;
use build_support::locate::NVSHMEM;
use build_support::version::{nvshmem_header_version, NVSHMEM_SUPPORT};

/// Exported, but never bound: the NVLink multicast functions (`_mc_` in the name, such as the
/// multicast pointer query), because multicast can take shared GPUs out of service.
fn is_multicast(name: &str) -> bool {
    name.contains("_mc_")
}

/// Versioned attribute structs whose version word is `(N << 16) + sizeof`, with N the `_vN` suffix
/// of the struct the typedef names. Read from the headers so the initializers follow the release.
const STRUCT_VERSIONS: &[(&str, &str)] = &[
    ("nvshmemx_init_attr_t", "NVSHMEMX_INIT_ATTR_STRUCT_VERSION"),
    ("nvshmemx_init_args_t", "NVSHMEMX_INIT_ARGS_STRUCT_VERSION"),
    ("nvshmemx_uniqueid_args_t", "NVSHMEMX_UNIQUEID_ARGS_STRUCT_VERSION"),
    ("nvshmemx_uniqueid_t", "NVSHMEMX_UNIQUEID_STRUCT_VERSION"),
];

/// Returns the constants to append to the bindings and the version of `nvshmemx_init_args_t`.
fn struct_versions(include: &std::path::Path) -> Result<(String, u32), String> {
    let files = ["device_host/nvshmem_types.h", "bootstrap_device_host/nvshmem_uniqueid.h"];
    let text: String = files.iter().filter_map(|f| std::fs::read_to_string(include.join(f)).ok()).collect();
    let mut out = String::new();
    let mut args_version = 0;
    for (alias, constant) in STRUCT_VERSIONS {
        let suffix = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("typedef ")?.strip_suffix(&format!(" {alias};")))
            .find_map(|target| target.rsplit_once("_v")?.1.parse::<u32>().ok())
            .ok_or_else(|| format!("no `typedef <name>_vN {alias};` in {}", files.join(", ")))?;
        out.push_str(&format!(
            "/// Version number `N` of `{alias}` (`_vN`); its version word is `(N << 16) + sizeof`.\n"
        ));
        out.push_str(&format!("pub const {constant}: i32 = {suffix};\n"));
        if *alias == "nvshmemx_init_args_t" {
            args_version = suffix;
        }
    }
    Ok((out, args_version))
}

fn main() -> std::process::ExitCode {
    // Version 2 of nvshmemx_init_args_t (NVSHMEM 3.8) has a `cuda_device_id` field to initialise.
    Emitter::stdout().check_cfg("nvshmem_init_args_v2");
    SysBuild {
        spec: &NVSHMEM,
        support: &NVSHMEM_SUPPORT,
        read_version: nvshmem_header_version,
        snapshot: "snapshot/bindings.rs",
    }
    .run(|ctx| {
        let library = ctx.install.library.as_ref().ok_or("NVSHMEM install without a library file")?;
        let exports = exported_functions(library)?;
        let mut builder = bindgen_builder(
            ctx,
            "#include <nvshmem_host.h>\n#include <bootstrap_device_host/nvshmem_uniqueid.h>\n",
            "Nvshmem",
        );
        // nvshmemid_* are internal hooks; the public API is nvshmem_* and nvshmemx_*.
        let public = |n: &&String| n.starts_with("nvshmem_") || n.starts_with("nvshmemx_");
        // One alternation rather than one pattern per function: bindgen matches every declaration
        // of the CUDA and NVSHMEM headers against its allowlist, and with hundreds of separate
        // patterns that matching took most of this script's time (~8x slower).
        let bound: Vec<&str> = exports.iter().filter(public).filter(|n| !is_multicast(n)).map(String::as_str).collect();
        builder = builder.allowlist_function(bound.join("|"));
        let bindings = builder
            .allowlist_type("nvshmem.*")
            .allowlist_var("NVSHMEM.*")
            .allowlist_var("UNIQUEID_.*")
            // The init flags live in an anonymous-looking `enum flags`; bind them as plain constants.
            .allowlist_type("flags")
            .constified_enum("flags")
            .prepend_enum_name(false)
            .generate()
            .map_err(|e| format!("bindgen failed on nvshmem_host.h: {e}"))?
            .to_string();
        let (constants, args_version) = struct_versions(&ctx.install.include_dir)?;
        if args_version >= 2 {
            Emitter::stdout().cfg("nvshmem_init_args_v2");
        }
        Ok(format!("{bindings}\n{constants}"))
    })
}
