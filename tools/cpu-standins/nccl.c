/* The CPU stand-in for NCCL (libnccl.so.2) that tools/host-instructions.sh counts the crates' host
   instructions against: one rank; ncclAllReduce copies its send buffer into its receive buffer (the
   one-rank sum) at once, on the host; groups only count their depth. Built with -DEVICT, each
   ncclAllReduce outside a group, and the end of each group, evicts the caller's caches (evict.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "evict.h"
typedef int ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
struct comm { int rank, n; };
static const int sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
ncclResult_t ncclGetVersion(int *v) { *v = 22809; return 0; }
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) { memset(id, 1, sizeof *id); return 0; }
ncclResult_t ncclCommInitRank(struct comm **c, int n, ncclUniqueId id, int rank) { (void)id; *c = malloc(sizeof **c); (*c)->rank = rank; (*c)->n = n; return 0; }
ncclResult_t ncclCommInitRankConfig(struct comm **c, int n, ncclUniqueId id, int rank, void *cfg) { (void)cfg; return ncclCommInitRank(c, n, id, rank); }
ncclResult_t ncclCommCount(const struct comm *c, int *n) { *n = c->n; return 0; }
ncclResult_t ncclCommUserRank(const struct comm *c, int *r) { *r = c->rank; return 0; }
ncclResult_t ncclCommCuDevice(const struct comm *c, int *d) { (void)c; *d = 0; return 0; }
ncclResult_t ncclCommGetAsyncError(struct comm *c, ncclResult_t *e) { (void)c; *e = 0; return 0; }
ncclResult_t ncclCommFinalize(struct comm *c) { (void)c; return 0; }
ncclResult_t ncclCommDestroy(struct comm *c) { free(c); return 0; }
ncclResult_t ncclCommAbort(struct comm *c) { free(c); return 0; }
const char *ncclGetErrorString(ncclResult_t r) { (void)r; return "stand-in"; }
const char *ncclGetLastError(struct comm *c) { (void)c; return ""; }
static int group_depth;
ncclResult_t ncclGroupStart(void) { group_depth++; return 0; }
ncclResult_t ncclGroupEnd(void) { if (--group_depth == 0) evict(); return 0; }
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int t, int op, struct comm *c, void *st) { (void)op; (void)c; (void)st; if (!group_depth) evict(); if (s != r) memmove(r, s, n * sizes[t]); return 0; }
ncclResult_t ncclMemAlloc(void **p, size_t b) { *p = calloc(1, b ? b : 1); return 0; }
ncclResult_t ncclMemFree(void *p) { free(p); return 0; }
