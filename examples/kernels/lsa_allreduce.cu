// All-reduce kernels over NCCL's device API (LSA: load/store access to every peer's memory over
// NVLink), for the custom-kernel lessons 14-18. Compiled by build.rs into a cubin; launched from
// Rust through cudarc with an `nccl::DevComm` and an `nccl::Window` as arguments.
//
// Two algorithms, both summing elements of type T:
//
// * one-shot (small messages): every rank stages its input in a symmetric window, one LSA barrier
//   says "everyone's input is staged", then every rank loads all peers' staged inputs over NVLink
//   and writes the sum to its own output. The staging area has two slots used alternately (by a
//   per-CTA call counter kept in the window), so a rank may start the next call while a slower
//   peer still reads the previous slot: one barrier per call instead of two.
// * two-shot (larger messages): input and output both live in symmetric windows. After a barrier,
//   rank r reduces its 1/N share of the elements by loading it from every peer (reduce-scatter)
//   and stores the result into every peer's output (all-gather); a second barrier makes the stores
//   visible and frees the inputs for reuse. Each byte crosses NVLink once each way, as in a ring.
//
// Work is split across CTAs; CTA i only ever synchronises with CTA i of the peers (LSA barrier
// index i), so the devComm needs `lsaBarrierCount >= gridDim.x`. The LSA team may have at most
// MAX_PEERS ranks (the host side checks). Nothing here uses NVLink multicast.

#include <nccl.h>
#include <nccl_device.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

// Sum of two values of T, accumulated in float for 16-bit types.
template <typename T> struct Acc { using Type = T; };
template <> struct Acc<__nv_bfloat16> { using Type = float; };
template <> struct Acc<__half> { using Type = float; };

template <typename T> __device__ __forceinline__ typename Acc<T>::Type widen(T v) { return v; }
template <> __device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float widen(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T narrow(typename Acc<T>::Type v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 narrow(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half narrow(float v) { return __float2half(v); }

// 16 bytes of T: the unit of the vectorised loops.
constexpr int VEC_BYTES = 16;
template <typename T> __host__ __device__ constexpr int lanes() { return VEC_BYTES / sizeof(T); }

template <typename T>
__device__ __forceinline__ uint4 add_vec(uint4 a, uint4 b) {
  const T* x = reinterpret_cast<const T*>(&a);
  const T* y = reinterpret_cast<const T*>(&b);
  uint4 out;
  T* z = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int i = 0; i < lanes<T>(); i++) z[i] = narrow<T>(widen(x[i]) + widen(y[i]));
  return out;
}

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

constexpr int MAX_PEERS = 8;

// Every LSA peer's address of byte `offset` of `win`, looked up once (the window descriptor lives
// in device memory, and the compiler cannot keep it in registers across the stores that follow).
template <typename T>
struct Peers {
  T* at[MAX_PEERS];
  int n;
  __device__ __forceinline__ Peers(ncclWindow_t win, size_t offset, int n) : n(n) {
#pragma unroll
    for (int p = 0; p < MAX_PEERS; p++) at[p] = p < n ? (T*)ncclGetLsaPointer(win, offset, p) : nullptr;
  }
  __device__ __forceinline__ bool aligned(size_t elem) const {
    bool ok = true;
#pragma unroll
    for (int p = 0; p < MAX_PEERS; p++) ok = ok && (p >= n || aligned16(at[p] + elem));
    return ok;
  }
};

// This CTA's share [begin, end) of `count` elements: contiguous chunks rounded to whole vectors.
template <typename T>
__device__ __forceinline__ void cta_share(size_t count, size_t* begin, size_t* end) {
  const size_t per = ((count + gridDim.x - 1) / gridDim.x + lanes<T>() - 1) / lanes<T>() * lanes<T>();
  *begin = min(count, per * blockIdx.x);
  *end = min(count, *begin + per);
}

// Loads element range [begin, end) from every peer and writes the sum to `out`.
template <typename T>
__device__ __forceinline__ void sum_from_peers(const Peers<T>& in, T* out, size_t begin, size_t end) {
  size_t i = begin;
  if (aligned16(out + begin) && in.aligned(begin)) {
    const size_t nvec = (end - begin) / lanes<T>();
    for (size_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      uint4 acc = reinterpret_cast<const uint4*>(in.at[0] + begin)[v];
#pragma unroll
      for (int p = 1; p < MAX_PEERS; p++)
        if (p < in.n) acc = add_vec<T>(acc, reinterpret_cast<const uint4*>(in.at[p] + begin)[v]);
      reinterpret_cast<uint4*>(out + begin)[v] = acc;
    }
    i = begin + nvec * lanes<T>();
  }
  for (size_t e = i + threadIdx.x; e < end; e += blockDim.x) {
    typename Acc<T>::Type acc = widen(in.at[0][e]);
#pragma unroll
    for (int p = 1; p < MAX_PEERS; p++)
      if (p < in.n) acc += widen(in.at[p][e]);
    out[e] = narrow<T>(acc);
  }
}

// Window layout of the one-shot kernel: [call counters: one u32 per CTA, 4 KiB][slot 0][slot 1],
// starting at `base`; a slot holds `count` elements.
constexpr size_t CTRL_BYTES = 4096;

template <typename T>
__device__ void oneshot(ncclDevComm comm, ncclWindow_t win, size_t base, size_t slot_bytes,
                        const T* send, T* recv, size_t count) {
  __shared__ uint32_t call;
  uint32_t* counter = (uint32_t*)ncclGetLocalPointer(win, base) + blockIdx.x;
  if (threadIdx.x == 0) call = *counter;
  __syncthreads();
  const size_t slot = base + CTRL_BYTES + (call & 1) * slot_bytes;
  size_t begin, end;
  cta_share<T>(count, &begin, &end);

  // Stage this CTA's share of the input in the current slot of this rank's window.
  T* mine = (T*)ncclGetLocalPointer(win, slot);
  if (aligned16(send) && aligned16(mine)) {
    const size_t nvec = (end - begin) / lanes<T>();
    for (size_t v = threadIdx.x; v < nvec; v += blockDim.x)
      reinterpret_cast<uint4*>(mine + begin)[v] = reinterpret_cast<const uint4*>(send + begin)[v];
    for (size_t e = begin + nvec * lanes<T>() + threadIdx.x; e < end; e += blockDim.x) mine[e] = send[e];
  } else {
    for (size_t e = begin + threadIdx.x; e < end; e += blockDim.x) mine[e] = send[e];
  }

  // Everyone's share is staged (release our stores, acquire the peers').
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), comm, ncclTeamLsa(comm), comm.lsaBarrier, blockIdx.x};
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);

  sum_from_peers<T>(Peers<T>(win, slot, comm.lsaSize), recv, begin, end);
  if (threadIdx.x == 0) *counter = call + 1;
}

// Two-shot over `send` and `recv` windows (byte offsets `send_off`, `recv_off`): rank r reduces
// the elements of its share of each CTA chunk and stores the result on every rank.
template <typename T>
__device__ void twoshot(ncclDevComm comm, ncclWindow_t send_win, size_t send_off, ncclWindow_t recv_win,
                        size_t recv_off, size_t count) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), comm, ncclTeamLsa(comm), comm.lsaBarrier, blockIdx.x};
  bar.sync(ncclCoopCta(), cuda::memory_order_acquire);

  const int n = comm.lsaSize, r = comm.lsaRank;
  size_t begin, end;
  cta_share<T>(count, &begin, &end);
  // This rank's slice of the CTA's chunk, in whole vectors.
  const size_t span = end - begin;
  const size_t per = ((span + n - 1) / n + lanes<T>() - 1) / lanes<T>() * lanes<T>();
  const size_t lo = min(end, begin + per * r), hi = min(end, lo + per);
  const Peers<T> in(send_win, send_off, n), out(recv_win, recv_off, n);

  size_t i = lo;
  if (in.aligned(lo) && out.aligned(lo)) {
    constexpr int UNROLL = 4;
    const size_t nvec = (hi - lo) / lanes<T>();
    size_t v = threadIdx.x;
    for (; v + (UNROLL - 1) * blockDim.x < nvec; v += UNROLL * blockDim.x) {
      uint4 acc[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; u++) acc[u] = reinterpret_cast<const uint4*>(in.at[0] + lo)[v + u * blockDim.x];
#pragma unroll
      for (int p = 1; p < MAX_PEERS; p++) {
        if (p >= n) break;
        const uint4* src = reinterpret_cast<const uint4*>(in.at[p] + lo);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) acc[u] = add_vec<T>(acc[u], src[v + u * blockDim.x]);
      }
#pragma unroll
      for (int p = 0; p < MAX_PEERS; p++) {
        if (p >= n) break;
        uint4* dst = reinterpret_cast<uint4*>(out.at[p] + lo);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) dst[v + u * blockDim.x] = acc[u];
      }
    }
    for (; v < nvec; v += blockDim.x) {
      uint4 acc = reinterpret_cast<const uint4*>(in.at[0] + lo)[v];
#pragma unroll
      for (int p = 1; p < MAX_PEERS; p++)
        if (p < n) acc = add_vec<T>(acc, reinterpret_cast<const uint4*>(in.at[p] + lo)[v]);
#pragma unroll
      for (int p = 0; p < MAX_PEERS; p++)
        if (p < n) reinterpret_cast<uint4*>(out.at[p] + lo)[v] = acc;
    }
    i = lo + nvec * lanes<T>();
  }
  for (size_t e = i + threadIdx.x; e < hi; e += blockDim.x) {
    typename Acc<T>::Type acc = widen(in.at[0][e]);
#pragma unroll
    for (int p = 1; p < MAX_PEERS; p++)
      if (p < n) acc += widen(in.at[p][e]);
#pragma unroll
    for (int p = 0; p < MAX_PEERS; p++)
      if (p < n) out.at[p][e] = narrow<T>(acc);
  }

  // Every rank's stores are visible, and nobody reads the inputs any more.
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

}  // namespace

#define ALLREDUCE_KERNELS(SUFFIX, T)                                                                   \
  extern "C" __global__ void __launch_bounds__(512)                                                  \
      lsa_oneshot_sum_##SUFFIX(ncclDevComm comm, ncclWindow_t win, size_t base, size_t slot_bytes,     \
                               const T* send, T* recv, size_t count) {                                \
    oneshot<T>(comm, win, base, slot_bytes, send, recv, count);                                        \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(512)                                                  \
      lsa_twoshot_sum_##SUFFIX(ncclDevComm comm, ncclWindow_t send_win, size_t send_off,               \
                               ncclWindow_t recv_win, size_t recv_off, size_t count) {                 \
    twoshot<T>(comm, send_win, send_off, recv_win, recv_off, count);                                   \
  }

ALLREDUCE_KERNELS(f32, float)
ALLREDUCE_KERNELS(bf16, __nv_bfloat16)
ALLREDUCE_KERNELS(f16, __half)
