// Lesson 11: a kernel that puts to the next PE with NVSHMEM device calls.
//
// Every thread writes its share of `mine` into the next PE's `inbox` with nvshmem_int_p, then
// the whole grid waits for every PE: a grid-wide sync (which needs all blocks resident at once,
// hence the collective launch), one thread's nvshmem_barrier_all (which also completes the
// puts), and another grid-wide sync so that no thread reads `inbox` before the barrier. Finally
// every thread checks what arrived from the previous PE and counts mismatches in `*errors`.
#include <cooperative_groups.h>
#include <nvshmem.h>
#include <nvshmemx.h>

namespace cg = cooperative_groups;

__device__ int expected_value(int pe, int i) { return (pe + 1) * 1000000 + i; }

extern "C" __global__ void ring_put(int *inbox, const int *mine, int n, int *errors) {
    cg::grid_group grid = cg::this_grid();
    int me = nvshmem_my_pe();
    int npes = nvshmem_n_pes();
    int next = (me + 1) % npes;
    int prev = (me + npes - 1) % npes;
    for (int i = grid.thread_rank(); i < n; i += grid.size()) {
        nvshmem_int_p(inbox + i, mine[i], next);
    }
    grid.sync();
    if (grid.thread_rank() == 0) {
        nvshmem_barrier_all();
    }
    grid.sync();
    int wrong = 0;
    for (int i = grid.thread_rank(); i < n; i += grid.size()) {
        wrong += inbox[i] != expected_value(prev, i);
    }
    if (wrong) {
        atomicAdd(errors, wrong);
    }
}
