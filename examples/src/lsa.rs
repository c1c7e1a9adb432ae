//! The LSA all-reduce kernels of gpucomm-kernels (`gpucomm-kernels/cu/lsa_allreduce.cu`) as lessons 13,
//! 15 and 19 and the custom-kernels bench use them: [`LsaAllReduce`] creates the device
//! communicator and the staging window once and launches the LL, one-shot and two-shot kernels;
//! [`pattern`] and [`compare`] are the test input and three-way result check of lessons 12 and 13
//! (lesson 12 launches a kernel of its own). The dispatching all-reduce built on the same kernels is
//! `gpucomm_kernels::AllReduce`.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use gpucomm_kernels::lsa::{LsaKernels, Sizes};
use nccl::{Comm, DeviceBuffer, DeviceBufferMut, Window};

pub use gpucomm_kernels::lsa::{Element, LL_MAX_BYTES, MAX_CTAS};

use crate::bench::BoxError;

/// The test pattern of lessons 12 and 13: rank `rank` of `n` contributes (rank + 1) × (i mod 13),
/// small integers exact in every element type, so the sum is n(n + 1)/2 × (i mod 13) bit for bit.
/// Returns this rank's input and the expected sum, `count` elements each.
pub fn pattern<T>(rank: u32, n: u32, count: usize, from: impl Fn(u32) -> T) -> (Vec<T>, Vec<T>) {
    let input = (0..count as u32).map(|i| from((rank + 1) * (i % 13))).collect();
    let expected = (0..count as u32).map(|i| from(n * (n + 1) / 2 * (i % 13))).collect();
    (input, expected)
}

/// Checks a kernel's all-reduce (`ours`) against the host reference and against `ncclAllReduce`
/// (`theirs`) on the same input, naming the first wrong element; prints the verdict.
pub fn compare<T: Element + PartialEq + std::fmt::Debug>(
    rank: usize,
    algorithm: &str,
    ours: &[T],
    expected: &[T],
    theirs: &[T],
) -> Result<(), BoxError> {
    let count = ours.len();
    if let Some(i) = (0..count).find(|&i| ours.get(i) != expected.get(i)) {
        return Err(format!(
            "rank {rank}: {} × {count}: element {i} is {:?}, expected {:?}",
            T::SUFFIX,
            ours[i],
            expected.get(i)
        )
        .into());
    }
    if ours != theirs {
        return Err(format!("rank {rank}: {} × {count}: differs from ncclAllReduce", T::SUFFIX).into());
    }
    println!(
        "rank {rank}: {algorithm} {} all-reduce of {count} elements correct (matches host and ncclAllReduce)",
        T::SUFFIX
    );
    Ok(())
}

/// The kernels and what they need on one rank: a device communicator with one LSA barrier per
/// CTA, and a window with the kernels' call counters and a double-buffered one-shot staging area.
pub struct LsaAllReduce<'c> {
    kernels: LsaKernels<'c>,
}

impl<'c> LsaAllReduce<'c> {
    /// Collective over `comm`: creates the device communicator and a staging window for one-shot
    /// messages of up to `max_bytes` bytes (every rank passes the same), and loads the kernels.
    pub fn new(comm: &'c Comm, max_bytes: usize) -> Result<Self, BoxError> {
        Ok(LsaAllReduce { kernels: LsaKernels::new(comm, Sizes { one_shot: max_bytes, staged: 0 })? })
    }

    /// The communicator.
    pub fn comm(&self) -> &'c Comm {
        self.kernels.comm()
    }

    /// What a graph that captures these launches must keep: the kernels, whose device
    /// communicator and window every launch uses (`(lsa.staging(), &send, &mut recv)` is the keep
    /// set of a capture of `lsa.one_shot(stream, send, recv)`, see `nccl::capture`).
    pub fn staging(&self) -> &LsaKernels<'c> {
        &self.kernels
    }

    /// One-shot all-reduce (sum) of `send` into `recv` on `stream`: any device buffers of the
    /// communicator's device, the same length on every rank, at most `max_bytes`.
    pub fn one_shot<T: Element>(
        &self,
        stream: &Arc<CudaStream>,
        send: &impl DeviceBuffer<T>,
        recv: &mut impl DeviceBufferMut<T>,
    ) -> Result<(), BoxError> {
        Ok(self.kernels.one_shot(stream, send, recv)?)
    }

    /// LL one-shot all-reduce (sum) of `send` into `recv` on `stream`, for messages of at most
    /// [`LL_MAX_BYTES`]: no barrier, data and flags in 8-byte words.
    pub fn ll<T: Element>(
        &self,
        stream: &Arc<CudaStream>,
        send: &impl DeviceBuffer<T>,
        recv: &mut impl DeviceBufferMut<T>,
    ) -> Result<(), BoxError> {
        Ok(self.kernels.ll(stream, send, recv)?)
    }

    /// Two-shot all-reduce (sum) of `count` elements from `send` (window, element offset
    /// `send_at`) into `recv` (window, element offset `recv_at`) on `stream`.
    ///
    /// # Safety
    ///
    /// Every rank's windows hold the elements at these offsets (the kernel writes into the peers'
    /// windows, whose sizes this rank cannot see): allocate them alike on every rank.
    pub unsafe fn two_shot<T: Element>(
        &self,
        stream: &Arc<CudaStream>,
        send: &Window<'c, T>,
        send_at: usize,
        recv: &mut Window<'c, T>,
        recv_at: usize,
        count: usize,
    ) -> Result<(), BoxError> {
        // SAFETY: the caller's contract is the kernel's.
        Ok(unsafe { self.kernels.two_shot(stream, send, send_at, recv, recv_at, count) }?)
    }
}
