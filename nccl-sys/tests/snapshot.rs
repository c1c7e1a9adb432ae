//! The committed bindings (used on docs.rs, where no NVIDIA library exists) must be exactly what
//! bindgen generates from the pinned headers. `UPDATE_SNAPSHOTS=1 cargo test --test snapshot`
//! refreshes them.

#[test]
fn snapshot_matches_generated_bindings() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    let snapshot = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("snapshot/bindings.rs");
    build_support::build::check_snapshot(generated, &snapshot).unwrap_or_else(|e| panic!("{e}"));
}
