//! Candle tensors as the buffers NCCL takes, and back.
//!
//! A candle CUDA tensor is a `Storage::Cuda(CudaStorage)` holding a cudarc `CudaSlice` — of the
//! same cudarc the `nccl` crate takes — plus a `Layout` (shape, strides, start offset). So:
//!
//! * reading: [`with_slice`] takes the storage's read lock (`Tensor::storage_and_layout`) and hands
//!   out a view of exactly the tensor's elements, e.g. as the send buffer of an all-reduce;
//! * writing in place: candle keeps `&mut` storage to itself, except through a custom
//!   in-place operator (`InplaceOp1`, `Tensor::inplace_op1`), which [`with_slice_mut`] wraps;
//! * making a tensor from a buffer NCCL filled: [`from_slice`] (`CudaStorage::wrap_cuda_slice`,
//!   `Tensor::from_storage`), no copy.
//!
//! Every view goes through cudarc's ordering protocol when NCCL (or a copy) takes its pointer:
//! the stream waits for the buffer's last recorded write (and, to write, its last recorded read)
//! on any other stream, and the buffer records this use. One gap: candle passes its kernels'
//! outputs to cudarc as shared references, so cudarc records a *read* event for them and never a
//! *write* event — a tensor candle wrote looks unwritten to another stream. Before the
//! communication stream reads a tensor candle computed, a lesson makes it wait for an event
//! recorded on candle's stream after the kernels that wrote it (`stream.wait(&event)`, no
//! `synchronize()`). The other way round is covered: what the lessons write here (NCCL, copies)
//! records its write event, and candle's kernels wait for it.
//!
//! Two more gaps, which the lessons' order of operations avoids, and which code built on these
//! helpers must mind (session 20 audit):
//!
//! * cudarc keeps one read event per buffer: once candle reads a tensor on its stream after the
//!   communication stream did (NCCL's send buffer), a free or in-place write of it waits for
//!   candle's read only. Keep the tensor (a clone) until candle's stream has waited for an event
//!   recorded on the communication stream after the NCCL call, or send from a copy the
//!   communication owns (lesson 17's buckets).
//! * candle assumes a storage's buffer belongs to candle's stream: some of its kernels (`cat`,
//!   `slice_set`, the index arguments of gather, index-select, scatter, where) record their read
//!   on the buffer's own stream. On a tensor from [`from_slice`] of a buffer allocated on the
//!   communication stream, such a read is recorded there and a later NCCL write into the buffer,
//!   or its free, does not wait for it. The lessons use only matmuls and elementwise operations
//!   on such tensors; allocate NCCL receive buffers on candle's stream when others follow.

use std::sync::Arc;

use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, CudaDevice, CudaStorage, InplaceOp1, Layout, Shape, Storage, Tensor};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};

use crate::BoxError;

/// The `[start, end)` element range of a contiguous tensor in its storage.
fn range(layout: &Layout, name: &str) -> Result<(usize, usize), BoxError> {
    layout.contiguous_offsets().ok_or_else(|| format!("{name}: the tensor is not contiguous").into())
}

/// Runs `f` with a view of the f32 elements of `t` (contiguous, on a CUDA device), while holding
/// the tensor's storage lock.
pub fn with_slice<R>(t: &Tensor, f: impl FnOnce(CudaView<'_, f32>) -> Result<R, BoxError>) -> Result<R, BoxError> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else { return Err("with_slice: not a CUDA tensor".into()) };
    let (start, end) = range(layout, "with_slice")?;
    f(cuda.as_cuda_slice::<f32>()?.slice(start..end))
}

/// An in-place candle operator that hands the tensor's elements to a closure.
struct OnSlice<F>(F);

impl<F: Fn(&mut CudaViewMut<'_, f32>) -> Result<(), BoxError>> InplaceOp1 for OnSlice<F> {
    fn name(&self) -> &'static str {
        "gpucomm-on-slice"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("the candle lessons work on CUDA tensors only")
    }

    fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> candle_core::Result<()> {
        let (start, end) = range(layout, "with_slice_mut").map_err(candle_core::Error::msg)?;
        let mut view = storage.as_cuda_slice_mut::<f32>()?.slice_mut(start..end);
        (self.0)(&mut view).map_err(candle_core::Error::msg)
    }
}

/// Runs `f` with a mutable view of the f32 elements of `t` (contiguous, on a CUDA device): candle's
/// `InplaceOp1`, the one public way to write into a tensor's storage. `t` must not be part of an
/// autograd graph that still needs its old values.
pub fn with_slice_mut(
    t: &Tensor,
    f: impl Fn(&mut CudaViewMut<'_, f32>) -> Result<(), BoxError>,
) -> Result<(), BoxError> {
    Ok(t.inplace_op1(&OnSlice(f))?)
}

/// A 1-D f32 tensor over `slice` (no copy). `variable`: the tensor is a leaf that `backward()`
/// computes a gradient for (a candle `Var`).
pub fn from_slice(slice: CudaSlice<f32>, device: &CudaDevice, variable: bool) -> Tensor {
    let len = slice.len();
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, device.clone()));
    Tensor::from_storage(storage, Shape::from(len), BackpropOp::none(), variable)
}

/// Copies the elements of `src` into `dst` on `stream` (equal lengths), in place.
pub fn copy_into(stream: &Arc<CudaStream>, src: &CudaView<'_, f32>, dst: &Tensor) -> Result<(), BoxError> {
    with_slice_mut(dst, |d| {
        if d.len() != src.len() {
            return Err(format!("copy_into: {} elements into {}", src.len(), d.len()).into());
        }
        Ok(stream.memcpy_dtod(src, d)?)
    })
}

/// A copy of `t`'s elements on the host, as bit patterns (for exact comparisons).
pub fn bits(t: &Tensor) -> Result<Vec<u32>, BoxError> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?.into_iter().map(f32::to_bits).collect())
}
