/* What the real library's enqueue does to its caller's caches, for tools/host-instructions.sh's
   cold-cache counts: built with -DEVICT, evict() runs 64 KiB of code and writes one byte in each
   64-byte line of 256 KiB of data, so that the caller's next instructions and data are no longer
   in a 32 KiB L1 code cache or a 48 KiB L1 data cache (they still are in a 2 MiB L2). NCCL's
   enqueue and the driver's kernel launch behind it run tens of kilobytes of code and touch more
   data than that between two calls. Without -DEVICT it does nothing (the instruction counts). */
#ifdef EVICT
static unsigned char evict_data[256 * 1024];
static void evict(void) {
    __asm__ volatile(".rept 65536\n\tnop\n\t.endr");
    volatile unsigned char *d = evict_data;
    for (unsigned long i = 0; i < sizeof evict_data; i += 64) d[i]++;
}
#else
static void evict(void) {}
#endif
