// NVSHMEM kernels for the nvshmem GPU suites, in one device-linked module: lesson 11's `ring_put`
// (which synchronises the grid and the PEs on the device, so it needs a collective launch), and a
// ring put for plain launches (the host completes it with a barrier on the stream).
#include "../../examples/kernels/nvshmem_ring.cu"

extern "C" __global__ void ring_put_plain(int *dst, const int *src, int n) {
    int next = (nvshmem_my_pe() + 1) % nvshmem_n_pes();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        nvshmem_int_p(dst + i, src[i], next);
    }
}
