// Plain kernels (no NVSHMEM device calls) that the nvshmem GPU suites launch through cudarc.

// out[i] = src[i]: reads another PE's copy through a peer view (nvshmem_ptr).
extern "C" __global__ void copy_ints(const int *src, int *out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = src[i];
    }
}

// buf[i] = base + i, after spinning for `spin` clock cycles: slow enough that work on another
// stream that was not ordered after it would see the old contents.
extern "C" __global__ void fill_slowly(int *buf, int n, int base, long long spin) {
    long long start = clock64();
    while (clock64() - start < spin) {
    }
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        buf[i] = base + i;
    }
}

// Keeps its stream busy for `ns` nanoseconds of wall time (the GPU's global timer), in one thread:
// stands in for work that is stuck on a stream (an NCCL kernel waiting for a dead peer).
extern "C" __global__ void busy_for(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
