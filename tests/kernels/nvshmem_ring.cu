// NVSHMEM kernels for the nvshmem GPU suites: a ring put with a plain launch (the host orders and
// completes it with a barrier on the stream), and one that synchronises the grid and the PEs on
// the device, which needs a collective launch.
#include <cooperative_groups.h>
#include <nvshmem.h>
#include <nvshmemx.h>

namespace cg = cooperative_groups;

__device__ int ring_value(int pe, int i, int round) { return (pe + 1) * 1000000 + round * 100000 + i; }

extern "C" __global__ void ring_put_plain(int *dst, int n, int round) {
    int me = nvshmem_my_pe();
    int next = (me + 1) % nvshmem_n_pes();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        nvshmem_int_p(dst + i, ring_value(me, i, round), next);
    }
}

extern "C" __global__ void ring_put_synced(int *dst, int n, int round, int *errors) {
    cg::grid_group grid = cg::this_grid();
    int me = nvshmem_my_pe();
    int npes = nvshmem_n_pes();
    int next = (me + 1) % npes;
    int prev = (me + npes - 1) % npes;
    for (int i = grid.thread_rank(); i < n; i += grid.size()) {
        nvshmem_int_p(dst + i, ring_value(me, i, round), next);
    }
    grid.sync();
    if (grid.thread_rank() == 0) {
        nvshmem_barrier_all();
    }
    grid.sync();
    int wrong = 0;
    for (int i = grid.thread_rank(); i < n; i += grid.size()) {
        wrong += dst[i] != ring_value(prev, i, round);
    }
    if (wrong) {
        atomicAdd(errors, wrong);
    }
}
