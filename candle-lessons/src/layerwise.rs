//! The model's training pass cut at every layer boundary, so that the backward pass is enqueued
//! one layer at a time and a lesson can act between two layers (lesson 17).
//!
//! Why: a data-parallel step starts each bucket's all-reduce on the communication stream as soon
//! as candle's stream has written the bucket's gradients, and not earlier. candle has no autograd
//! hooks, and `backward()` enqueues the whole backward pass before it returns, so nothing marks
//! where on candle's stream a given gradient is written. cudarc's per-buffer events do not
//! either: candle hands each kernel its output as a shared reference (`builder.arg(&out)`), so
//! cudarc records the output's *read* event and never its *write* event, and a copy on another
//! stream that reads the gradient waits for nothing — it can copy the gradient before candle
//! wrote it, and its copy back can land before candle's write and be overwritten. Enqueued layer
//! by layer, the backward pass has points between layers where an event recorded on candle's
//! stream means "this layer's gradients are written", which is what PyTorch's DDP gets from its
//! autograd hooks.
//!
//! How: in [`forward`], each layer after the first takes as its input a leaf (a `Var` copy of the
//! previous layer's output), so that `backward()` from the loss stops at that leaf; the gradient
//! it leaves there is fed back into the previous layer's output through `Seed`, a custom candle
//! operator whose backward returns exactly that gradient. The gradients are bitwise those of one
//! `backward()` over the whole model (`tests/layerwise.rs` checks it on the CPU); the cost is one
//! copy of each layer boundary's activations.

use candle_core::backend::BackendStorage;
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, CudaStorage, CustomOp1, Layout, Shape, Tensor, Var};

use crate::model;
use crate::BoxError;

/// A custom operator with a one-element output, whose backward pass hands its input a given
/// gradient: `t.apply_op1(Seed(g))?.backward()` runs candle's backward pass from `t` as if `g`
/// were the loss's gradient with respect to `t`.
struct Seed(Tensor);

impl Seed {
    fn shape() -> Shape {
        Shape::from(())
    }
}

impl CustomOp1 for Seed {
    fn name(&self) -> &'static str {
        "gpucomm-seed-gradient"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        Ok((CpuStorage::F32(vec![0.0]), Self::shape()))
    }

    fn cuda_fwd(&self, storage: &CudaStorage, _: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let device = storage.device().clone();
        let zero = device.alloc_zeros::<f32>(1)?;
        Ok((CudaStorage::wrap_cuda_slice(zero, device), Self::shape()))
    }

    fn bwd(&self, _: &Tensor, _: &Tensor, _: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(self.0.clone()))
    }
}

/// A forward pass of the model (`params`: `w0, b0, w1, b1, …`) cut at every layer boundary.
pub struct Pass {
    params: Vec<Var>,
    /// Layer `l`'s input leaf (`None` for layer 0, whose input is the data) and its output.
    layers: Vec<(Option<Var>, Tensor)>,
    loss: Tensor,
}

/// Enqueues the forward pass of the model on the rows `x` with targets `y`, as one `backward()`
/// would see it, except that every layer after the first reads a leaf copy of its input.
pub fn forward(x: &Tensor, y: &Tensor, params: &[Var]) -> Result<Pass, BoxError> {
    if params.is_empty() || params.len() % 2 != 0 {
        return Err(format!("layerwise::forward: {} parameters, not weight and bias pairs", params.len()).into());
    }
    let count = params.len() / 2;
    let mut layers: Vec<(Option<Var>, Tensor)> = Vec::with_capacity(count);
    for l in 0..count {
        let input = match layers.last() {
            None => None,
            Some((_, previous)) => Some(Var::from_tensor(previous)?),
        };
        let h = input.as_ref().map_or(x, |v| v.as_tensor());
        let out = model::layer(h, params[2 * l].as_tensor(), params[2 * l + 1].as_tensor(), l + 1 == count)?;
        layers.push((input, out));
    }
    let loss = model::loss(&layers[count - 1].1, y)?;
    Ok(Pass { params: params.to_vec(), layers, loss })
}

impl Pass {
    /// The loss (a one-element tensor).
    pub fn loss(&self) -> &Tensor {
        &self.loss
    }

    /// Enqueues the backward pass one layer at a time, last layer first. After layer `l`'s part
    /// is enqueued, calls `after_layer(l, grads)`, with `grads` holding the gradients of the
    /// parameters of layers `l` and above. Returns the gradients of every parameter.
    pub fn backward(
        &self,
        mut after_layer: impl FnMut(usize, &GradStore) -> Result<(), BoxError>,
    ) -> Result<GradStore, BoxError> {
        let mut layer = self.layers.len() - 1;
        let mut grads = self.loss.backward()?;
        let mut input_grad = self.take_input_grad(layer, &mut grads)?;
        loop {
            after_layer(layer, &grads)?;
            let Some(seed) = input_grad else { return Ok(grads) };
            layer -= 1;
            let mut more = self.layers[layer].1.apply_op1(Seed(seed))?.backward()?;
            for p in &self.params[2 * layer..2 * layer + 2] {
                grads.insert(p, more.remove(p).ok_or("layerwise: no gradient for a parameter")?);
            }
            input_grad = self.take_input_grad(layer, &mut more)?;
        }
    }

    /// Takes the gradient of layer `layer`'s input leaf out of `grads` (`None` for layer 0).
    fn take_input_grad(&self, layer: usize, grads: &mut GradStore) -> Result<Option<Tensor>, BoxError> {
        match &self.layers[layer].0 {
            Some(input) => Ok(Some(grads.remove(input).ok_or("layerwise: no gradient for a layer's input")?)),
            None => Ok(None),
        }
    }
}
