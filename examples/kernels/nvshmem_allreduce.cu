// NVSHMEM device code for lesson 14 and the custom-kernels bench (benches/custom-kernels.rs).
// Compiled with relocatable device code and device-linked with libnvshmem_device.a into one cubin
// (build.rs), loaded with nvshmemx_cumodule_init, launched collectively (every CTA of every PE
// resident at once: the CTAs wait for each other).
//
// * ring_put_signal: PE p puts `n` ints to PE p+1 together with a signal (one call per CTA,
//   nvshmemx_int_put_signal_nbi_block), then waits for the signal from PE p-1: a ring step with no
//   host involvement and no barrier.
// * oneshot_sum_f32: a one-shot all-reduce over nvshmem_ptr loads, the NVSHMEM twin of the LSA
//   one-shot kernel: each CTA stages its share of the input in one of two symmetric slots,
//   announces it to every peer with a signal carrying the call number, waits for every peer's
//   signal, then loads the peers' staged shares directly over NVLink (nvshmem_ptr) and sums.

#include <nvshmem.h>
#include <nvshmemx.h>
#include <stdint.h>
#include <cuda_bf16.h>

extern "C" __global__ void ring_put_signal(int* dst, const int* src, size_t n, uint64_t* signal, uint64_t round) {
  const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
  const int next = (me + 1) % npes;
  // Each CTA sends its share; the signal counts CTAs (one add per CTA).
  const size_t per = (n + gridDim.x - 1) / gridDim.x;
  const size_t begin = min(n, per * blockIdx.x), end = min(n, begin + per);
  nvshmemx_int_put_signal_nbi_block(dst + begin, src + begin, end - begin, signal, 1, NVSHMEM_SIGNAL_ADD, next);
  if (threadIdx.x == 0) nvshmem_signal_wait_until(signal, NVSHMEM_CMP_GE, round * gridDim.x);
  __syncthreads();
}

// `staging`: symmetric, 2 slots of `slot_elems` elements. `flags`: symmetric, gridDim.x × npes
// uint64 signals. `calls`: local, ONESHOT_MAX_CTAS uint64 call counters kept equal to the number
// of launches so far (64 bits: the signals compare call numbers with "≥", which a 32-bit number
// wrapping to 0 after 2^32 launches would pass at once), as in the LSA kernels (gpucomm-kernels/cu/lsa_allreduce.cu): CTA b reads counter b,
// and at the end advances counters b, b + gridDim.x, b + 2·gridDim.x, ..., so every counter moves
// once per launch whatever grid each call uses and all CTAs of a launch agree on the call number.
// No atomic and no fence: each counter has one writer per launch, and launches on one stream do
// not overlap (the fence the previous version needed waited for the CTA's stores to complete).
// At most 8 PEs and ONESHOT_MAX_CTAS CTAs.
constexpr unsigned ONESHOT_MAX_CTAS = 32;

template <typename T>
__device__ void oneshot_sum(const T* send, T* recv, size_t n, T* staging, size_t slot_elems, uint64_t* flags,
                            uint64_t* calls) {
  const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
  __shared__ uint64_t call;
  if (threadIdx.x == 0) call = ((volatile uint64_t*)calls)[blockIdx.x] + 1;
  __syncthreads();
  const size_t per = ((n + gridDim.x - 1) / gridDim.x + 7) / 8 * 8;
  const size_t begin = min(n, per * blockIdx.x), end = min(n, begin + per);
  T* slot = staging + (call & 1) * slot_elems;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) slot[i] = send[i];
  __syncthreads();
  uint64_t* mine = flags + (size_t)blockIdx.x * npes;
  if (threadIdx.x < npes && threadIdx.x != me) {
    __threadfence_system();  // the staged share is visible before the signal
    nvshmemx_signal_op(mine + me, call, NVSHMEM_SIGNAL_SET, threadIdx.x);
    nvshmem_signal_wait_until(mine + threadIdx.x, NVSHMEM_CMP_GE, call);
  }
  __syncthreads();
  const T* peer[8];
  for (int p = 0; p < npes && p < 8; p++) peer[p] = (const T*)nvshmem_ptr(slot, p);
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float acc = 0.0f;
    for (int p = 0; p < npes && p < 8; p++) acc += (float)peer[p][i];
    recv[i] = (T)acc;
  }
  // Every thread has read `call` (the barrier above), so the counters may move.
  for (unsigned c = blockIdx.x + threadIdx.x * gridDim.x; c < ONESHOT_MAX_CTAS; c += blockDim.x * gridDim.x)
    ((volatile uint64_t*)calls)[c] = call;
}

extern "C" __global__ void __launch_bounds__(512)
    oneshot_sum_f32(const float* send, float* recv, size_t n, float* staging, size_t slot_elems, uint64_t* flags,
                    uint64_t* calls) {
  oneshot_sum<float>(send, recv, n, staging, slot_elems, flags, calls);
}

extern "C" __global__ void __launch_bounds__(512)
    oneshot_sum_bf16(const __nv_bfloat16* send, __nv_bfloat16* recv, size_t n, __nv_bfloat16* staging,
                     size_t slot_elems, uint64_t* flags, uint64_t* calls) {
  oneshot_sum<__nv_bfloat16>(send, recv, n, staging, slot_elems, flags, calls);
}
