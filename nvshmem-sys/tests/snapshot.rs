//! The committed bindings (used on docs.rs, where no NVIDIA library exists) must be exactly what
//! bindgen generates from the pinned headers. `UPDATE_SNAPSHOTS=1 cargo test --test snapshot`
//! refreshes them.

#[test]
fn snapshot_matches_generated_bindings() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    let snapshot = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("snapshot/bindings.rs");
    build_support::build::check_snapshot(generated, &snapshot).unwrap_or_else(|e| panic!("{e}"));
}

/// NVLink multicast can take shared GPUs out of service: no multicast function (`_mc_` in the
/// name) may be reachable through the bindings.
#[test]
fn no_multicast_function_is_bound() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    let bound: Vec<&str> =
        generated.lines().map(str::trim).filter(|l| l.starts_with("pub nvshmem") && l.contains("_mc_")).collect();
    assert!(bound.is_empty(), "{bound:?}");
    assert!(generated.contains("pub nvshmemx_putmem_on_stream:"), "the filter must not hide everything");
}
