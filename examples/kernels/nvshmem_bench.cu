// The nvshmem bench (benches/nvshmem.rs): the device-side ping-pong, as in the C baseline it is
// compared with (docs/host-cost.md).
//
// One thread on PE 0 and one on PE 1 bounce a counter: PE 0 writes i into PE 1's `flag`
// (nvshmem_int_p) and waits until its own `flag` is i; PE 1 waits for i and writes it back.
// `iters` round trips in one kernel; the host divides the kernel's wall time by iters and by 2.
// Other PEs pass `active = 0` and return at once. The kernel also returns at once where PE 1 - me
// does not exist (one PE, or a PE above 1): a put to a PE that is not there reads past NVSHMEM's
// table of peer addresses.
#include <nvshmem.h>
#include <nvshmemx.h>

extern "C" __global__ void ping_pong(int *flag, int iters, int active) {
    int me = nvshmem_my_pe();
    if (!active || me > 1 || nvshmem_n_pes() < 2) {
        return;
    }
    int peer = 1 - me;
    for (int i = 1; i <= iters; i++) {
        if (me == 0) {
            nvshmem_int_p(flag, i, peer);
            nvshmem_int_wait_until(flag, NVSHMEM_CMP_EQ, i);
        } else {
            nvshmem_int_wait_until(flag, NVSHMEM_CMP_EQ, i);
            nvshmem_int_p(flag, i, peer);
        }
    }
}
