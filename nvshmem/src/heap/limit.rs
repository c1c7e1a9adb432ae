//! The symmetric heap's limit, which allocations are checked against before NVSHMEM sees them.

use cudarc::driver::CudaContext;

use crate::config;
use crate::error::Result;

/// Which symmetric heap NVSHMEM uses, and the limit allocations are checked against.
///
/// NVSHMEM's own failure modes on an oversized request are harsh: on the static heap a failing
/// `nvshmem_calloc` exits the process, and on the dynamic heap a request the GPU cannot back
/// tears the heap down. This crate therefore refuses, before calling NVSHMEM, any allocation that
/// would take the bytes of this process's live symmetric buffers past [`HeapLimit::limit`]
/// ([`Error::HeapExhausted`](crate::Error::HeapExhausted)). The check cannot see fragmentation,
/// NVSHMEM's internal allocations, or memory that other allocators hold on the GPU; a request that
/// passes it can still fail in NVSHMEM ([`Error::OutOfMemory`](crate::Error::OutOfMemory) for
/// `nvshmem_malloc`). Every PE makes the same decision as long as the PEs have the same
/// configuration and GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeapLimit {
    /// True for the dynamic CUDA-VMM heap (the default on x86), false for the static heap
    /// (`NVSHMEM_DISABLE_CUDA_VMM`).
    pub dynamic: bool,
    /// The most bytes of symmetric buffers this crate lets the process hold at once.
    pub limit: usize,
    /// Where the limit comes from.
    pub limit_from: &'static str,
}

/// NVSHMEM's default `NVSHMEM_SYMMETRIC_SIZE`.
const DEFAULT_SYMMETRIC_SIZE: usize = 1 << 30;
/// NVSHMEM's default `NVSHMEM_MAX_MEMORY_PER_GPU`.
const DEFAULT_MAX_MEMORY_PER_GPU: usize = 256 << 30;

impl HeapLimit {
    /// Reads the heap variables the way NVSHMEM does; the dynamic heap is also bounded by the
    /// device's memory.
    pub(crate) fn from_environment(ctx: &CudaContext) -> Result<Self> {
        let sized = |name: &'static str, default: usize| match config::size(name) {
            Some(Some(v)) => (v, name),
            // An unreadable value makes NVSHMEM's own initialisation fail; the default is moot.
            Some(None) | None => (default, name),
        };
        if config::flag("NVSHMEM_DISABLE_CUDA_VMM") {
            let (limit, limit_from) = sized("NVSHMEM_SYMMETRIC_SIZE", DEFAULT_SYMMETRIC_SIZE);
            return Ok(HeapLimit { dynamic: false, limit, limit_from });
        }
        let (limit, limit_from) = sized("NVSHMEM_MAX_MEMORY_PER_GPU", DEFAULT_MAX_MEMORY_PER_GPU);
        let device = ctx.total_mem()?;
        Ok(if device < limit {
            HeapLimit { dynamic: true, limit: device, limit_from: "the device's memory" }
        } else {
            HeapLimit { dynamic: true, limit, limit_from }
        })
    }
}
