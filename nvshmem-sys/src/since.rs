//! The NVSHMEM release that added functions newer than the oldest supported one (3.3.9), so that a
//! function missing from an older library is reported with the version it needs.
//!
//! Taken from the symbols (functions, and the globals `nvshmem_error` and
//! `nvshmem_selected_device_transport`) `libnvshmem_host.so.3` exports (`nm -D --defined-only`) in every
//! release of the `nvidia-nvshmem-cu12` wheel from 3.3.9 to 3.8.0 (3.3.9, 3.3.20, 3.3.24, 3.4.5,
//! 3.5.19, 3.5.21, 3.6.5, 3.7.0, 3.7.1, 3.7.2, 3.8.0): each function 3.8.0 exports and 3.3.9 does
//! not, with the first of those releases that exports it. None was removed.

const SINCE: &[(&str, &str)] = &[
    ("nvshmem_error", "3.5.19"),
    ("nvshmemx_qp_create", "3.5.19"),
    ("nvshmem_selected_device_transport", "3.6.5"),
    ("nvshmemx_buffer_register_symmetric_at_preferred_address", "3.6.5"),
    ("nvshmemx_double_atomic_add", "3.7.0"),
    ("nvshmemx_double_atomic_fetch_add", "3.7.0"),
    ("nvshmemx_float_atomic_add", "3.7.0"),
    ("nvshmemx_float_atomic_fetch_add", "3.7.0"),
    ("nvshmemx_half_atomic_add", "3.7.0"),
    ("nvshmemx_half_atomic_fetch_add", "3.7.0"),
    ("nvshmemx_flush", "3.7.0"),
    ("nvshmemx_flush_on_stream", "3.7.0"),
    ("nvshmemx_collective_launch", "3.8.0"),
    ("nvshmemx_collective_launch_attr", "3.8.0"),
    ("nvshmemx_collective_launch_query_gridsize", "3.8.0"),
    ("nvshmemx_region_is_active", "3.8.0"),
    ("nvshmemx_region_start", "3.8.0"),
    ("nvshmemx_region_stop", "3.8.0"),
    ("nvshmemx_signal_counted_reset", "3.8.0"),
];

/// The first NVSHMEM version that exports `function`, for functions newer than 3.3.9.
/// `None` for functions present in every supported version (and for unknown names).
pub fn since(function: &str) -> Option<&'static str> {
    SINCE.iter().find(|(name, _)| *name == function).map(|&(_, v)| v)
}

#[cfg(test)]
mod tests {
    #[test]
    fn lookups() {
        // Session 29 audit: 3.8.0 exports these beyond 3.3.9; only the flushes were listed.
        assert_eq!(super::since("nvshmemx_signal_counted_reset"), Some("3.8.0"));
        assert_eq!(super::since("nvshmemx_buffer_register_symmetric_at_preferred_address"), Some("3.6.5"));
        assert_eq!(super::since("nvshmem_error"), Some("3.5.19"));
        assert_eq!(super::since("nvshmemx_flush"), Some("3.7.0"));
        assert_eq!(super::since("nvshmem_malloc"), None);
    }
}
