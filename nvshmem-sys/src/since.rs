//! The NVSHMEM release that added functions newer than the oldest supported one (3.3.9), so that a
//! function missing from an older library is reported with the version it needs.

const SINCE: &[(&str, &str)] = &[("nvshmemx_flush", "3.7.0"), ("nvshmemx_flush_on_stream", "3.7.0")];

/// The first NVSHMEM version that exports `function`, for functions newer than 3.3.9.
/// `None` for functions present in every supported version (and for unknown names).
pub fn since(function: &str) -> Option<&'static str> {
    SINCE.iter().find(|(name, _)| *name == function).map(|&(_, v)| v)
}
