/* The CPU stand-in for the driver (libcuda.so.1) that tools/host-instructions.sh counts the crates'
   host instructions against: device memory is host memory, streams are small structs whose capture
   is the stream that began it (a stream waiting for an event recorded inside a capture joins it,
   as on the GPU; ending the capture on its origin frees every stream of it), events remember
   that capture and graphs do nothing. Enough for one rank's communicator, MemBuffers, eager,
   captured and grouped calls; no kernel ever runs. tools/libcuda-stub.py adds every other function
   of cuda.h, returning CUDA_ERROR_NOT_SUPPORTED and naming itself on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
struct stream { int capturing; int id; struct stream *origin; };
static int ctx_dummy;
static __thread void *current_ctx;
CUresult cuInit(unsigned f) { (void)f; return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int o) { if (o != 0) return 101; *d = 0; return 0; }
CUresult cuDeviceGetAttribute(int *v, int a, int d) { (void)a; (void)d; *v = 1; return 0; }
CUresult cuDeviceGetName(char *n, int len, int d) { (void)d; strncpy(n, "CPU stand-in", len); return 0; }
CUresult cuDeviceGetUuid(char *u, int d) { (void)d; memset(u, 7, 16); return 0; }
CUresult cuDeviceGetUuid_v2(char *u, int d) { return cuDeviceGetUuid(u, d); }
CUresult cuDeviceTotalMem_v2(size_t *b, int d) { (void)d; *b = 1ull << 34; return 0; }
CUresult cuDeviceGetPCIBusId(char *s, int len, int d) { (void)d; strncpy(s, "0000:00:00.0", len); return 0; }
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = &ctx_dummy; return 0; }
CUresult cuDevicePrimaryCtxRelease(int d) { (void)d; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return 0; }
CUresult cuCtxSetCurrent(void *c) { current_ctx = c; return 0; }
CUresult cuCtxGetCurrent(void **c) { *c = current_ctx; return 0; }
CUresult cuCtxPushCurrent(void *c) { current_ctx = c; return 0; }
CUresult cuCtxPushCurrent_v2(void *c) { current_ctx = c; return 0; }
CUresult cuCtxPopCurrent(void **c) { if (c) *c = current_ctx; return 0; }
CUresult cuCtxPopCurrent_v2(void **c) { if (c) *c = current_ctx; return 0; }
CUresult cuCtxGetDevice(int *d) { *d = 0; return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuCtxGetFlags(unsigned *f) { *f = 0; return 0; }
CUresult cuCtxGetApiVersion(void *c, unsigned *v) { (void)c; *v = 13000; return 0; }
static int next_stream = 10;
CUresult cuStreamCreate(struct stream **s, unsigned f) { (void)f; *s = calloc(1, sizeof **s); (*s)->id = next_stream++; return 0; }
CUresult cuStreamCreateWithPriority(struct stream **s, unsigned f, int p) { (void)p; return cuStreamCreate(s, f); }
CUresult cuStreamDestroy(struct stream *s) { free(s); return 0; }
CUresult cuStreamDestroy_v2(struct stream *s) { free(s); return 0; }
CUresult cuStreamSynchronize(struct stream *s) { (void)s; return 0; }
/* The NVSHMEM heap agreement's flush of remote writes: nothing to flush on the host. */
CUresult cuFlushGPUDirectRDMAWrites(int target, int scope) { (void)target; (void)scope; return 0; }
CUresult cuStreamQuery(struct stream *s) { (void)s; return 0; }
static int live(struct stream *s) { return (uintptr_t)s > 16; }
CUresult cuStreamIsCapturing(struct stream *s, int *st) { *st = live(s) ? s->capturing : 0; return 0; }
CUresult cuStreamGetCaptureInfo(struct stream *s, int *st, unsigned long long *id) { *st = live(s) ? s->capturing : 0; if (id) *id = 1; return 0; }
CUresult cuStreamGetCaptureInfo_v2(struct stream *s, int *st, unsigned long long *id, void **g, void **d, size_t *n) { (void)g; (void)d; if (n) *n = 0; return cuStreamGetCaptureInfo(s, st, id); }
CUresult cuStreamGetCaptureInfo_v3(struct stream *s, int *st, unsigned long long *id, void **g, void **d, void **e, size_t *n) { (void)e; return cuStreamGetCaptureInfo_v2(s, st, id, g, d, n); }
CUresult cuStreamBeginCapture(struct stream *s, int mode) { (void)mode; if (!live(s)) return 1; s->capturing = 1; s->origin = s; return 0; }
CUresult cuStreamBeginCapture_v2(struct stream *s, int mode) { return cuStreamBeginCapture(s, mode); }
static int graph_dummy, exec_dummy;
#define MAX_JOINED 64
static struct stream *joined[MAX_JOINED];
CUresult cuStreamEndCapture(struct stream *s, void **g) {
    if (!live(s) || s->origin != s) return 903; /* CUDA_ERROR_STREAM_CAPTURE_UNMATCHED */
    for (int i = 0; i < MAX_JOINED; i++)
        if (joined[i] && joined[i]->origin == s) { joined[i]->capturing = 0; joined[i]->origin = 0; joined[i] = 0; }
    s->capturing = 0; s->origin = 0; *g = &graph_dummy; return 0;
}
CUresult cuThreadExchangeStreamCaptureMode(int *m) { (void)m; return 0; }
CUresult cuGraphInstantiateWithFlags(void **e, void *g, unsigned long long f) { (void)g; (void)f; *e = &exec_dummy; return 0; }
CUresult cuGraphLaunch(void *e, void *s) { (void)e; (void)s; return 0; }
CUresult cuGraphExecDestroy(void *e) { (void)e; return 0; }
CUresult cuGraphDestroy(void *g) { (void)g; return 0; }
/* The capture's check for allocations it left: a stand-in graph has no nodes. */
CUresult cuGraphGetNodes(void *g, void **nodes, size_t *n) { (void)g; (void)nodes; *n = 0; return 0; }
static int events;
CUresult cuEventCreate(void **e, unsigned f) { (void)f; *e = calloc(1, sizeof(struct stream *)); events++; return 0; }
CUresult cuEventDestroy(void *e) { free(e); return 0; }
CUresult cuEventDestroy_v2(void *e) { free(e); return 0; }
CUresult cuEventRecord(void *e, struct stream *s) { *(struct stream **)e = live(s) && s->capturing ? s->origin : 0; return 0; }
CUresult cuEventRecordWithFlags(void *e, struct stream *s, unsigned f) { (void)f; return cuEventRecord(e, s); }
CUresult cuEventQuery(void *e) { (void)e; return 0; }
CUresult cuEventSynchronize(void *e) { (void)e; return 0; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) { (void)a; (void)b; *ms = 0; return 0; }
CUresult cuStreamWaitEvent(struct stream *s, void *e, unsigned f) {
    (void)f;
    struct stream *origin = *(struct stream **)e;
    if (!origin || !live(s) || s->capturing) return 0;
    for (int i = 0; i < MAX_JOINED; i++)
        if (!joined[i]) { joined[i] = s; s->capturing = 1; s->origin = origin; return 0; }
    return 999; /* CUDA_ERROR_UNKNOWN: more joined streams than the stand-in keeps */
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t b) { *p = (CUdeviceptr)calloc(1, b ? b : 1); return 0; }
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t b, void *s) { (void)s; return cuMemAlloc_v2(p, b); }
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)p); return 0; }
CUresult cuMemFreeAsync(CUdeviceptr p, void *s) { (void)s; free((void *)p); return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t b) { memcpy((void *)d, h, b); return 0; }
CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t b) { memcpy(h, (void *)d, b); return 0; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t b, void *s) { (void)s; return cuMemcpyHtoD_v2(d, h, b); }
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t b, void *s) { (void)s; return cuMemcpyDtoH_v2(h, d, b); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t b, void *st) { (void)st; memmove((void *)d, (void *)s, b); return 0; }
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { memset((void *)d, v, n); return 0; }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *s) { (void)s; memset((void *)d, v, n); return 0; }
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, void *s) { (void)s; for (size_t i = 0; i < n; i++) ((unsigned *)d)[i] = v; return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = *t = 1ull << 34; return 0; }
CUresult cuGetErrorString(int e, const char **s) { (void)e; *s = "stand-in error"; return 0; }
CUresult cuGetErrorName(int e, const char **s) { (void)e; *s = "CUDA_ERROR_STANDIN"; return 0; }
CUresult cuPointerGetAttribute(void *d, int a, CUdeviceptr p) { (void)a; (void)p; *(int *)d = 0; return 0; }
