// Lesson 12's kernel: a one-shot all-reduce (sum of floats) over NCCL's device API.
//
// Every rank holds its input in a symmetric window: memory registered on every rank, which every
// rank of the LSA team (the GPUs one NVLink domain connects) can load from directly. Each thread
// sums its elements over every rank's window — its own and, through ncclGetLsaPointer, the
// peers' — and writes the sums to this rank's output. One-shot: every rank loads the whole message
// from every rank, once.
//
// Two LSA barriers bracket the loads. CTA b of each rank meets CTA b of every other rank at LSA
// barrier b (the device communicator has one barrier per CTA; every rank launches the same grid
// for the same count):
//   1. before the loads: every rank has started this kernel, so its input, copied into its window
//      before the launch, is in place;
//   2. after the loads: every rank has finished loading, so this kernel ends only once no peer
//      reads this rank's window any more, and the next input may be copied into it.
// Both synchronise with acquire-release order: what a rank wrote before a barrier is visible to
// the loads its peers make after it.
//
// Compiled by examples/build.rs (build-support's NCCL flavour: nvcc with NCCL's headers, no device
// library) into gpucomm_examples::kernels::LSA_ONE_SHOT. Nothing here uses NVLink multicast.

#include <nccl.h>
#include <nccl_device.h>

extern "C" __global__ void one_shot_sum_f32(ncclDevComm comm, ncclWindow_t input, float* output, size_t count) {
  ncclLsaBarrierSession<ncclCoopCta> barrier{ncclCoopCta(), comm, ncclTeamLsa(comm), comm.lsaBarrier, blockIdx.x};
  barrier.sync(ncclCoopCta(), cuda::memory_order_acq_rel);

  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += stride) {
    float sum = 0.0f;
    for (int peer = 0; peer < comm.lsaSize; peer++) {
      const float* theirs = (const float*)ncclGetLsaPointer(input, 0, peer);
      sum += theirs[i];
    }
    output[i] = sum;
  }

  barrier.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}
