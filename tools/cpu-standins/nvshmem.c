/* The CPU stand-in for NVSHMEM's host library (libnvshmem_host.so.3) that tools/host-instructions.sh
   counts the crates' host instructions against: one PE, started through the unique-id bootstrap
   (pe 0 of 1; no bootstrap plugin is loaded, nothing listens); the symmetric heap is host memory
   (malloc), so PE 0's copy is the address itself (nvshmem_ptr); nvshmemx_putmem_on_stream copies
   at once, on the host; barriers and finalize do nothing. Only the functions that starting, a
   symmetric allocation and free (with the PEs' agreement on them), a put and finalizing call through
   the nvshmem crate are here; the
   crate reports any other as missing. Built with -DEVICT, each put first evicts the caller's caches
   (evict.h). */
#include <stdlib.h>
#include <string.h>
#include "evict.h"
typedef struct { int version; char internal[124]; } nvshmemx_uniqueid_t;
enum { SUCCESS = 0, ERROR_NOT_SUPPORTED = 3, WITH_UNIQUEID = 1 << 3, IS_INITIALIZED = 2 };
static int status, uid_pe = -1, uid_n_pes = -1;
void nvshmemx_vendor_get_version_info(int *major, int *minor, int *patch) { *major = 3; *minor = 4; *patch = 5; }
int nvshmemx_init_status(void) { return status; }
int nvshmemx_get_uniqueid(nvshmemx_uniqueid_t *id) { memset(id->internal, 1, sizeof id->internal); return SUCCESS; }
int nvshmemx_set_attr_uniqueid_args(int pe, int n_pes, const nvshmemx_uniqueid_t *id, void *attr) { (void)id; (void)attr; uid_pe = pe; uid_n_pes = n_pes; return SUCCESS; }
/* One PE only: any other bootstrap, or a unique id for more PEs, is refused. */
int nvshmemx_hostlib_init_attr(unsigned flags, void *attr) { (void)attr; if (!(flags & WITH_UNIQUEID) || uid_pe != 0 || uid_n_pes != 1) return ERROR_NOT_SUPPORTED; status = IS_INITIALIZED; return SUCCESS; }
void nvshmemx_hostlib_finalize(void) { status = 0; }
int nvshmem_my_pe(void) { return 0; }
int nvshmem_n_pes(void) { return 1; }
void nvshmem_info_get_name(char *name) { strcpy(name, "NVSHMEM v3.4.5 (CPU stand-in)"); }
void nvshmem_info_get_version(int *major, int *minor) { *major = 1; *minor = 3; }
void *nvshmem_malloc(size_t bytes) { return bytes ? malloc(bytes) : NULL; }
void nvshmem_free(void *p) { free(p); }
void *nvshmem_ptr(const void *p, int pe) { return pe == 0 ? (void *)p : NULL; }
void nvshmemx_putmem_on_stream(void *dst, const void *src, size_t bytes, int pe, void *stream) { (void)pe; (void)stream; evict(); memcpy(dst, src, bytes); }
/* The heap agreement's puts (nvshmem::agree): the words, then the signal word, at once. */
void nvshmemx_putmem_signal_on_stream(void *dst, const void *src, size_t bytes, unsigned long long *sig, unsigned long long value, int op, int pe, void *stream) { (void)op; (void)pe; (void)stream; memcpy(dst, src, bytes); *sig = value; }
void nvshmemx_barrier_all_on_stream(void *stream) { (void)stream; }
