// All-reduce kernels over NCCL's device API (LSA: load/store access to every peer's memory over
// NVLink), for gpucomm-kernels' dispatching all-reduce, the course's lessons 13, 15 and 19 and
// its custom-kernels bench (lesson 12 shows a minimal one-shot kernel of its own).
// Compiled by gpucomm-kernels/build.rs into a cubin; launched from Rust through cudarc with an
// `nccl::DevComm` and an `nccl::Window` as arguments (gpucomm-kernels/src/lsa.rs).
//
// Four kernels, all summing elements of type T:
//
// * one-shot (small messages): every rank stages its input in a symmetric window, one LSA barrier
//   says "everyone's input is staged", then every rank loads all peers' staged inputs over NVLink
//   and writes the sum to its own output. The staging area has two slots used alternately (by a
//   call counter kept in the window), so a rank may start the next call while a slower peer still
//   reads the previous slot: one barrier per call instead of two.
// * LL one-shot (the smallest messages): no barrier at all. Each rank stores its input straight into
//   every peer's window as 8-byte words carrying 4 bytes of data and a 4-byte flag (the call
//   number); a peer knows a word has arrived when its flag matches, since an aligned 8-byte store
//   lands whole (one 64-bit access, single-copy atomic in PTX's memory model). One NVLink
//   crossing per call, like NCCL's LL protocol. Two slots again, by call parity, so a rank can be
//   one call ahead of a peer. Every 2^31 calls each slot's whole region is written once, so that
//   a stale word never carries the flag of a later call (the flags are 32-bit); LL counts its own
//   calls (counters of its own), so that other kernels' launches cannot take the calls that do it.
// * two-shot over windows (larger messages, zero copy): input and output both live in symmetric
//   windows. After a barrier, rank r reduces its 1/N share of the elements by loading it from
//   every peer (reduce-scatter) and stores the result into every peer's output (all-gather); a
//   second barrier makes the stores visible and frees the inputs for reuse. Each byte crosses
//   NVLink once each way, as in a ring.
// * staged two-shot (larger messages in any device buffers): the same exchange for input and
//   output buffers that are not in a window. Each rank first copies the shares its peers reduce
//   into an input region of its window, and receives the peers' results in an output region, which
//   it copies into its output after the second barrier; its own share goes straight from its input
//   to its output. The regions are single-buffered: a rank passes the second barrier of a call only
//   when every peer has finished with its regions.
//
// Work is split across CTAs; CTA i only ever synchronises with CTA i of the peers (LSA barrier
// index i), so the devComm needs `lsaBarrierCount >= gridDim.x`. The LSA team may have at most
// MAX_PEERS ranks (the host side checks). Nothing here uses NVLink multicast.
//
// Latency: every memory load a kernel must wait for before its first NVLink store is on the
// critical path of a small message. The kernels therefore issue the loads that do not depend on
// the call number (the barrier's epoch, the first vectors of the input) before reading the call
// counter, so that these latencies overlap instead of adding up.

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

// The lane-wise sum of two 16-byte vectors of T, rounded to T: the window two-shot's unrolled loop,
// whose 16-bit sums would spill registers as PackedSum's floats (below). Each share of a two-shot
// is summed by one rank and copied to all, so every rank gets the same bits whatever path summed.
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

// A sum of packed values of T (`P`: a 16-byte vector or a 4-byte word), accumulated lane by lane
// in Acc<T> and rounded to T once, at the end, as the scalar loops do: a sum comes out the same
// bits whichever packing computed it, so ranks that take different paths for one call (the vector
// path depends on each rank's own buffer addresses) agree bit for bit.
template <typename T, typename P>
struct PackedSum {
  static constexpr int N = sizeof(P) / sizeof(T);
  typename Acc<T>::Type lane[N];
  __device__ __forceinline__ void load(P p) {
    const T* x = reinterpret_cast<const T*>(&p);
#pragma unroll
    for (int k = 0; k < N; k++) lane[k] = widen(x[k]);
  }
  __device__ __forceinline__ void add(P p) {
    const T* x = reinterpret_cast<const T*>(&p);
#pragma unroll
    for (int k = 0; k < N; k++) lane[k] += widen(x[k]);
  }
  __device__ __forceinline__ P get() const {
    P out;
    T* z = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int k = 0; k < N; k++) z[k] = narrow<T>(lane[k]);
    return out;
  }
};

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
      PackedSum<T, uint4> acc;
      acc.load(reinterpret_cast<const uint4*>(in.at[0] + begin)[v]);
#pragma unroll
      for (int p = 1; p < MAX_PEERS; p++)
        if (p < in.n) acc.add(reinterpret_cast<const uint4*>(in.at[p] + begin)[v]);
      reinterpret_cast<uint4*>(out + begin)[v] = acc.get();
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

// Window layout of the one-shot kernel: [call counters, 4 KiB][slot 0][slot 1], starting at `base`;
// a slot holds `count` elements.
constexpr size_t CTRL_BYTES = 4096;

// Call counters: one u32 per possible CTA (MAX_CTAS, as in gpucomm-kernels/src/lsa.rs), kept equal to the
// number of launches so far of the kernels that share them (the host passes their offset as
// `base`: the one-shot's at 0, the LL kernel's after them). CTA b reads counter b; at the end CTA b advances counters b,
// b + gridDim.x, b + 2·gridDim.x, ..., so every counter moves once per launch whatever grid each
// call uses, and all CTAs of a launch agree on the call number. No atomics and no fence: each
// counter has one writer per launch, and launches on one stream do not overlap. (A fence here
// would wait for this CTA's stores to peers to complete, a full NVLink round trip per call.)
constexpr unsigned MAX_CTAS = 32;
static_assert(2 * MAX_CTAS * sizeof(uint32_t) <= CTRL_BYTES, "both kernels' call counters fit the control area");

__device__ __forceinline__ uint32_t begin_call(ncclWindow_t win, size_t base) {
  __shared__ uint32_t call;
  if (threadIdx.x == 0) call = ((volatile uint32_t*)ncclGetLocalPointer(win, base))[blockIdx.x];
  __syncthreads();
  return call;
}

__device__ __forceinline__ void end_call(ncclWindow_t win, size_t base, uint32_t call) {
  volatile uint32_t* counters = (volatile uint32_t*)ncclGetLocalPointer(win, base);
  // Every thread has read `call` (begin_call's barrier), so counter blockIdx.x may move.
  for (unsigned c = blockIdx.x + threadIdx.x * gridDim.x; c < MAX_CTAS; c += blockDim.x * gridDim.x)
    counters[c] = call + 1;
}

template <typename T>
__device__ void oneshot(ncclDevComm comm, ncclWindow_t win, size_t base, size_t slot_bytes,
                        const T* send, T* recv, size_t count) {
  // The barrier session loads its epoch, and each thread its first input vector, before the call
  // number arrives: three memory latencies overlap instead of adding up.
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), comm, ncclTeamLsa(comm), comm.lsaBarrier, blockIdx.x};
  size_t begin, end;
  cta_share<T>(count, &begin, &end);
  const size_t nvec = (end - begin) / lanes<T>();
  const bool vec = aligned16(send + begin);
  uint4 first = make_uint4(0, 0, 0, 0);
  if (vec && threadIdx.x < nvec) first = reinterpret_cast<const uint4*>(send + begin)[threadIdx.x];
  const uint32_t call = begin_call(win, base);
  const size_t slot = base + CTRL_BYTES + (call & 1) * slot_bytes;

  // Stage this CTA's share of the input in the current slot of this rank's window (slots start on
  // 16-byte boundaries, so the vector path depends on the input only).
  T* mine = (T*)ncclGetLocalPointer(win, slot);
  if (vec) {
    if (threadIdx.x < nvec) reinterpret_cast<uint4*>(mine + begin)[threadIdx.x] = first;
    for (size_t v = threadIdx.x + blockDim.x; v < nvec; v += blockDim.x)
      reinterpret_cast<uint4*>(mine + begin)[v] = reinterpret_cast<const uint4*>(send + begin)[v];
    for (size_t e = begin + nvec * lanes<T>() + threadIdx.x; e < end; e += blockDim.x) mine[e] = send[e];
  } else {
    for (size_t e = begin + threadIdx.x; e < end; e += blockDim.x) mine[e] = send[e];
  }

  // Everyone's share is staged (release our stores, acquire the peers').
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);

  sum_from_peers<T>(Peers<T>(win, slot, comm.lsaSize), recv, begin, end);
  end_call(win, base, call);
}

// The LL one-shot: call counters of its own (at `base`), then for each (slot, source rank) a
// region of `region` bytes at `ll_off` + (slot × MAX_PEERS + source) × `region`, holding one
// 8-byte (data, flag) pair per 4-byte word of the message.
template <typename T>
__device__ __forceinline__ uint32_t load_word(const T* src, size_t count, size_t w) {
  constexpr size_t per = 4 / sizeof(T);
  uint32_t word = 0;
  T* parts = reinterpret_cast<T*>(&word);
#pragma unroll
  for (size_t k = 0; k < per; k++)
    if (w * per + k < count) parts[k] = src[w * per + k];
  return word;
}

template <typename T>
__device__ __forceinline__ void store_word(T* dst, size_t count, size_t w, uint32_t word) {
  constexpr size_t per = 4 / sizeof(T);
  const T* parts = reinterpret_cast<const T*>(&word);
#pragma unroll
  for (size_t k = 0; k < per; k++)
    if (w * per + k < count) dst[w * per + k] = parts[k];
}

// One (data, flag) pair as a single 64-bit access, so that it is single-copy atomic.
__device__ __forceinline__ void st_pair(uint64_t* at, uint32_t data, uint32_t flag) {
  const uint64_t v = (uint64_t)flag << 32 | data;
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(at), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t ld_pair(const uint64_t* at) {
  uint64_t v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(at) : "memory");
  return v;
}

// Whether the communicator was aborted or revoked, looked at once every 10 000 calls (`steps`
// counts them): a wait for a peer's words ends then, since the peer may be gone. NCCL's device
// communicator has the abort flag from 2.29.7 on (its barriers watch it themselves), but NCCL
// fills it only for its internal device communicators: one from ncclDevCommCreate has it null,
// which testAbort reads as "not aborted" (README, "Known gaps"). Built against older headers the
// LL kernel waits for its peers regardless.
__device__ __forceinline__ bool aborted(const ncclDevComm& comm, uint32_t& steps) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 7)
  return nccl::utility::testAbort(comm.abortFlag, steps);
#else
  (void)comm;
  (void)steps;
  return false;
#endif
}

// Words each thread loads before the call number is known, and keeps for the sum.
constexpr int LL_PREFETCH = 4;

template <typename T>
__device__ void ll_oneshot(ncclDevComm comm, ncclWindow_t win, size_t base, size_t ll_off, size_t region,
                           const T* send, T* recv, size_t count) {
  const int n = comm.lsaSize, me = comm.lsaRank;
  const size_t words = (count * sizeof(T) + 3) / 4;
  const size_t per = (words + gridDim.x - 1) / gridDim.x;
  const size_t wb = min(words, per * blockIdx.x), we = min(words, wb + per);
  // This thread's first words, loaded while the call counter is read (the usual launch gives each
  // thread one word).
  uint32_t pre[LL_PREFETCH];
#pragma unroll
  for (int k = 0; k < LL_PREFETCH; k++) {
    const size_t w = wb + threadIdx.x + (size_t)k * blockDim.x;
    pre[k] = w < we ? load_word(send, count, w) : 0;
  }
  const uint32_t call = begin_call(win, base);
  const uint32_t flag = call + 1;  // 0 only at call 2^32 - 1, after the refreshes (below)
  const size_t slot = ll_off + (size_t)(call & 1) * MAX_PEERS * region;
  // Push this rank's words to every peer, data and flag in one 8-byte store.
  uint64_t* to[MAX_PEERS];
#pragma unroll
  for (int p = 0; p < MAX_PEERS; p++)
    to[p] = (p < n && p != me) ? (uint64_t*)ncclGetLsaPointer(win, slot + (size_t)me * region, p) : nullptr;
  const size_t stride = blockDim.x, rest = wb + threadIdx.x + LL_PREFETCH * stride;
  auto push = [&](size_t w, uint32_t data) {
#pragma unroll
    for (int p = 0; p < MAX_PEERS; p++)
      if (to[p]) st_pair(to[p] + w, data, flag);
  };
#pragma unroll
  for (int k = 0; k < LL_PREFETCH; k++)
    if (wb + threadIdx.x + k * stride < we) push(wb + threadIdx.x + k * stride, pre[k]);
  for (size_t w = rest; w < we; w += stride) push(w, load_word(send, count, w));
  // The flags are call numbers in 32 bits, so a word that no launch had written for 2^32 calls
  // would pass for this call's. Twice every 2^31 calls (one call of each slot) the launch also
  // pushes the rest of its region, (0, flag) past the message, so that no word of a region is
  // ever more than 2^31 + 1 calls old. These are LL calls (its counters count nothing else), so
  // the refreshing calls always come; on shared counters, another kernel's launches could take
  // them. The refresh at calls 0 and 1 also overwrites the window's initial zeros, whose flag 0 is
  // the flag of call 2^32 - 1. The peers read only the message's words of this call.
  if ((call & 0x7ffffffeu) == 0) {
    const size_t all = region / sizeof(uint64_t), threads = (size_t)gridDim.x * blockDim.x;
    for (size_t w = words + (size_t)blockIdx.x * blockDim.x + threadIdx.x; w < all; w += threads) push(w, 0);
  }
  // Pull the peers' words from this rank's own window as they arrive, and sum them with this
  // rank's own in rank order, so that every rank adds the same terms in the same order (floating
  // point addition is not associative: starting from its own word, each rank got other bits).
  const uint64_t* from[MAX_PEERS];
#pragma unroll
  for (int p = 0; p < MAX_PEERS; p++)
    from[p] = (p < n && p != me) ? (const uint64_t*)ncclGetLocalPointer(win, slot + (size_t)p * region) : nullptr;
  uint32_t steps = 0;
  auto pull = [&](size_t w, uint32_t own) {
    PackedSum<T, uint32_t> acc;
#pragma unroll
    for (int p = 0; p < MAX_PEERS; p++) {
      if (p >= n) break;
      uint32_t word = own;
      if (from[p]) {
        uint64_t v;
        do {
          v = ld_pair(from[p] + w);
        } while ((uint32_t)(v >> 32) != flag && !aborted(comm, steps));
        word = (uint32_t)v;
      }
      if (p == 0) acc.load(word);
      else acc.add(word);
    }
    store_word(recv, count, w, acc.get());
  };
#pragma unroll
  for (int k = 0; k < LL_PREFETCH; k++)
    if (wb + threadIdx.x + k * stride < we) pull(wb + threadIdx.x + k * stride, pre[k]);
  for (size_t w = rest; w < we; w += stride) pull(w, load_word(send, count, w));
  end_call(win, base, call);
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

// Copies elements [lo, hi) from `src` to `dst`, 16 bytes at a time where both allow it.
template <typename T>
__device__ __forceinline__ void copy_range(const T* src, T* dst, size_t lo, size_t hi) {
  size_t i = lo;
  if (aligned16(src + lo) && aligned16(dst + lo)) {
    const size_t nvec = (hi - lo) / lanes<T>();
    for (size_t v = threadIdx.x; v < nvec; v += blockDim.x)
      reinterpret_cast<uint4*>(dst + lo)[v] = reinterpret_cast<const uint4*>(src + lo)[v];
    i = lo + nvec * lanes<T>();
  }
  for (size_t e = i + threadIdx.x; e < hi; e += blockDim.x) dst[e] = src[e];
}

// Two-shot for input and output in any device buffers (`send`, `recv`; the same buffer for an
// in-place call), with `count` elements at most the size of the window's input region (byte
// offset `in_off`) and output region (`out_off`). Within each CTA's chunk, share q (of N) is
// reduced by rank q.
template <typename T>
__device__ void twoshot_staged(ncclDevComm comm, ncclWindow_t win, size_t in_off, size_t out_off,
                               const T* send, T* recv, size_t count) {
  ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), comm, ncclTeamLsa(comm), comm.lsaBarrier, blockIdx.x};
  const int n = comm.lsaSize, r = comm.lsaRank;
  size_t begin, end;
  cta_share<T>(count, &begin, &end);
  const size_t per = ((end - begin + n - 1) / n + lanes<T>() - 1) / lanes<T>() * lanes<T>();
  auto lo_of = [&](int q) { return min(end, begin + per * q); };
  auto hi_of = [&](int q) { return min(end, begin + per * (q + 1)); };

  // 1. Stage the shares the peers reduce (this rank's input of them) in the input region.
  T* staged_in = (T*)ncclGetLocalPointer(win, in_off);
  for (int q = 0; q < n; q++)
    if (q != r) copy_range<T>(send, staged_in, lo_of(q), hi_of(q));
  // Every rank's input is staged (release ours, acquire the peers').
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);

  // 2. Reduce this rank's share: its own input from `send`, the peers' from their input regions,
  //    added in rank order like every other kernel's sums (the same bits whichever kernel runs);
  //    the sum goes to `recv` and to every peer's output region. `term(p)` is rank p's input: a
  //    select per unrolled step (indexing `at` with the run-time `r` would move it to local memory).
  const size_t lo = lo_of(r), hi = hi_of(r);
  const Peers<T> in(win, in_off, n), out(win, out_off, n);
  auto term = [&](int p) -> const T* { return p == r ? send : in.at[p]; };
  size_t i = lo;
  if (aligned16(send + lo) && aligned16(recv + lo) && in.aligned(lo) && out.aligned(lo)) {
    const size_t nvec = (hi - lo) / lanes<T>();
    for (size_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      PackedSum<T, uint4> acc;
      acc.load(reinterpret_cast<const uint4*>(term(0) + lo)[v]);
#pragma unroll
      for (int p = 1; p < MAX_PEERS; p++)
        if (p < n) acc.add(reinterpret_cast<const uint4*>(term(p) + lo)[v]);
      const uint4 sum = acc.get();
      reinterpret_cast<uint4*>(recv + lo)[v] = sum;
#pragma unroll
      for (int p = 0; p < MAX_PEERS; p++)
        if (p < n && p != r) reinterpret_cast<uint4*>(out.at[p] + lo)[v] = sum;
    }
    i = lo + nvec * lanes<T>();
  }
  for (size_t e = i + threadIdx.x; e < hi; e += blockDim.x) {
    typename Acc<T>::Type acc = widen(term(0)[e]);
#pragma unroll
    for (int p = 1; p < MAX_PEERS; p++)
      if (p < n) acc += widen(term(p)[e]);
    const T sum = narrow<T>(acc);
    recv[e] = sum;
#pragma unroll
    for (int p = 0; p < MAX_PEERS; p++)
      if (p < n && p != r) out.at[p][e] = sum;
  }

  // Every rank's results are in place, and nobody reads the input regions any more.
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);

  // 3. The peers' shares of the result, from the output region into `recv`.
  const T* staged_out = (const T*)ncclGetLocalPointer(win, out_off);
  for (int q = 0; q < n; q++)
    if (q != r) copy_range<T>(staged_out, recv, lo_of(q), hi_of(q));
}

}  // namespace

#define ALLREDUCE_KERNELS(SUFFIX, T)                                                                   \
  extern "C" __global__ void __launch_bounds__(512)                                                  \
      lsa_oneshot_sum_##SUFFIX(ncclDevComm comm, ncclWindow_t win, size_t base, size_t slot_bytes,     \
                               const T* send, T* recv, size_t count) {                                \
    oneshot<T>(comm, win, base, slot_bytes, send, recv, count);                                        \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(512)                                                  \
      lsa_ll_sum_##SUFFIX(ncclDevComm comm, ncclWindow_t win, size_t base, size_t ll_off, size_t region,  \
                          const T* send, T* recv, size_t count) {                                     \
    ll_oneshot<T>(comm, win, base, ll_off, region, send, recv, count);                                 \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(512)                                                  \
      lsa_twoshot_sum_##SUFFIX(ncclDevComm comm, ncclWindow_t send_win, size_t send_off,               \
                               ncclWindow_t recv_win, size_t recv_off, size_t count) {                 \
    twoshot<T>(comm, send_win, send_off, recv_win, recv_off, count);                                   \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(512)                                                  \
      lsa_staged_sum_##SUFFIX(ncclDevComm comm, ncclWindow_t win, size_t in_off, size_t out_off,       \
                              const T* send, T* recv, size_t count) {                                 \
    twoshot_staged<T>(comm, win, in_off, out_off, send, recv, count);                                  \
  }

ALLREDUCE_KERNELS(f32, float)
ALLREDUCE_KERNELS(bf16, __nv_bfloat16)
ALLREDUCE_KERNELS(f16, __half)
