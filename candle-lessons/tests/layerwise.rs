//! The layer-by-layer backward pass of `src/layerwise.rs` gives bitwise the gradients of one
//! `backward()` (on the CPU).
//!
//! Not among the library's unit tests: a program that runs candle operations links
//! `libcuda.so.1` (candle turns on cudarc's `dynamic-linking`), so this binary loads only where
//! the loader finds one — on a machine with the NVIDIA driver (`cargo test --test layerwise` in
//! `candle-lessons/`), or on a build machine with `.deps/candle/lib/libcuda.so` (the link stub)
//! on `LD_LIBRARY_PATH` under the name `libcuda.so.1`; the test calls no CUDA function.

use candle_core::{Device, Tensor, Var};
use gpucomm_candle_lessons::layerwise::forward;
use gpucomm_candle_lessons::model;

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap().into_iter().map(f32::to_bits).collect()
}

#[test]
fn layer_by_layer_gradients_equal_one_backward_bit_for_bit() {
    let device = Device::Cpu;
    let (dim, rows, count) = (8, 5, 3);
    let mut params = Vec::new();
    for l in 0..count {
        let w = Tensor::randn(0f32, 0.5, (dim, dim), &device).unwrap();
        let b = Tensor::randn(0f32, 0.1, dim, &device).unwrap().affine(1.0, l as f64).unwrap();
        params.push(Var::from_tensor(&w).unwrap());
        params.push(Var::from_tensor(&b).unwrap());
    }
    let x = Tensor::randn(0f32, 1.0, (rows, dim), &device).unwrap();
    let y = Tensor::randn(0f32, 1.0, (rows, dim), &device).unwrap();

    // One backward() over the whole model, as the reference run does.
    let mut h = x.clone();
    for l in 0..count {
        h = model::layer(&h, params[2 * l].as_tensor(), params[2 * l + 1].as_tensor(), l + 1 == count).unwrap();
    }
    let whole_loss = model::loss(&h, &y).unwrap();
    let whole = whole_loss.backward().unwrap();

    let pass = forward(&x, &y, &params).unwrap();
    assert_eq!(bits(pass.loss()), bits(&whole_loss));
    let mut seen = Vec::new();
    let grads = pass
        .backward(|l, grads| {
            // Layers l and above have their gradients; the layers below do not yet.
            for (i, p) in params.iter().enumerate() {
                assert_eq!(grads.get(p).is_some(), i / 2 >= l, "layer {l}, parameter {i}");
            }
            seen.push(l);
            Ok(())
        })
        .unwrap();
    assert_eq!(seen, vec![2, 1, 0]);
    for (i, p) in params.iter().enumerate() {
        assert_eq!(bits(grads.get(p).unwrap()), bits(whole.get(p).unwrap()), "parameter {i}");
    }
    // Not weight and bias pairs.
    assert!(forward(&x, &y, &params[..3]).is_err());
}
