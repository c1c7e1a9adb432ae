// The compute and epilogue kernels of lesson 15's training-step-like graph (plain CUDA).

#include <stddef.h>

// "Compute": x[i] = (rank + 1) * (i mod 7) + *step, a stand-in for producing gradients. The step
// number lives on the device, so every replay of a captured graph computes new values.
extern "C" __global__ void produce(float* x, size_t n, float rank, const float* step) {
  const float s = *step;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = (rank + 1.0f) * (float)(i % 7) + s;
}

// "Epilogue": y[i] = sum[i] * scale (e.g. 1/N: the mean); then the step number advances. Only one
// thread writes it, after the grid's last read of it in `produce` (an earlier kernel).
extern "C" __global__ void epilogue(const float* sum, float* y, size_t n, float scale, float* step) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] = sum[i] * scale;
  if (blockIdx.x == 0 && threadIdx.x == 0) *step += 1.0f;
}
