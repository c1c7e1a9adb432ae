//! CUDA graphs of NVSHMEM operations: [`capture`], this crate's entry point to the capture scope
//! of `gpucomm-ordering`. What a graph keeps of this crate's (the runtime, teams, modules,
//! symmetric buffers, registrations) implements [`Keep`] where it is defined.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use gpucomm_ordering::{Captured, Keep};

use crate::error::{Error, Result};

/// Captures the NVSHMEM operations (and NCCL calls, and cudarc work) `f` makes on `stream` into
/// a CUDA graph that keeps `keep` — the runtime, teams, modules and buffers those operations
/// use — for as long as the graph lives, and whose launches are ordered like calls
/// (`gpucomm_ordering::capture` with this crate's error type; see `nccl::capture` for a
/// step-by-step example and [`gpucomm_ordering::graph`] for the rules).
///
/// `keep` holds `&Runtime`, `&Team`, `&Module`, symmetric buffers (by value or borrowed), local
/// buffers, and registered local buffers (`&Registration`, `&mut Registration`, or
/// `reg.buffer_mut()`: the graph then borrows the [`crate::Registration`], which cannot be
/// unregistered while the graph lives); an operation inside `f` that uses anything else makes the
/// capture fail. A
/// non-blocking operation is completed inside `f` by [`crate::Pending::quiet`] (or the handle's
/// drop); if its handle is forgotten, the capture enqueues the quiet before the next captured use
/// of the operation's local buffer, or else at its end, so every launch completes the operation.
/// Until the capture ends, a captured non-blocking operation holds NVSHMEM's internal copy
/// streams: other NVSHMEM calls that use them (on other streams, allocations, frees, team splits,
/// the host barrier) are refused with [`Error::CopyStreamsCaptured`].
///
/// Every failure hands `keep` back with the error, `Err((keep, error))`: members given by value
/// (symmetric buffers) are never lost to a refused capture.
///
/// ```no_run
/// # fn demo(rt: &nvshmem::Runtime, side: &std::sync::Arc<cudarc::driver::CudaStream>) -> nvshmem::Result<()> {
/// let dst = rt.alloc_zeroed::<f32>(256)?;
/// let src = side.clone_htod(&[1.0f32; 256])?;
/// let next = (rt.my_pe() + 1) % rt.n_pes();
/// let mut graph = nvshmem::capture(side, (rt, dst, src), |(rt, dst, src)| {
///     rt.put_on_stream(dst, src, next, side)?;
///     rt.barrier_all_on_stream(side)
/// })
/// .map_err(|(_kept, e)| e)?;
/// graph.launch()?;
/// let received = side.clone_dtoh(&graph.kept().1)?;
/// # let _ = received;
/// let (_, dst, _) = graph.into_kept();
/// dst.free().map_err(|(_, e)| e)?;
/// # Ok(()) }
/// ```
#[doc(alias = "cuStreamBeginCapture")]
#[doc(alias = "cuStreamEndCapture")]
pub fn capture<K: Keep>(stream: &Arc<CudaStream>, keep: K, f: impl FnOnce(&mut K) -> Result<()>) -> Captured<K, Error> {
    // A captured non-blocking operation's hold on NVSHMEM's internal streams ends with the
    // capture itself (`quiesce::nonblocking` puts that off until the scope closes).
    gpucomm_ordering::capture(stream, keep, f)
}
