//! The symmetric heap's limit, which allocations are checked against before NVSHMEM sees them.

use std::cell::Cell;

use cudarc::driver::CudaContext;

use crate::agree;
use crate::config;
use crate::error::Result;

/// Which symmetric heap NVSHMEM uses, and the limit allocations are checked against.
///
/// What NVSHMEM (3.4.5) does with a request it cannot serve depends on the heap:
///
/// - The **dynamic** heap (CUDA VMM, the default on x86) maps device memory as it is needed, in
///   steps of [`HeapLimit::granularity`]: a request that does not fit what is mapped maps its size
///   (plus its alignment) rounded up to that granularity. When the bytes mapped so far (NVSHMEM's
///   own buffers included) plus that step reach the heap's size (`NVSHMEM_MAX_MEMORY_PER_GPU`;
///   the test is `mapped + step >= size`), or the GPU cannot back the step, NVSHMEM tears the
///   whole heap down, every live buffer with it: there is no clean failure to report.
/// - The **static** heap (`NVSHMEM_DISABLE_CUDA_VMM`) is allocated whole at start:
///   `NVSHMEM_SYMMETRIC_SIZE` plus room NVSHMEM adds for its own buffers. A request it cannot
///   place gives no buffer ([`Error::OutOfMemory`](crate::Error::OutOfMemory)).
///
/// So before calling NVSHMEM this crate refuses ([`Error::HeapExhausted`](crate::Error::HeapExhausted))
/// any allocation for which [`HeapLimit::reserved`] plus the bytes that this process's live
/// symmetric buffers hold plus the request rounded up to the granularity is not below
/// [`HeapLimit::limit`] on the dynamic heap, or exceeds it on the static one (whose limit,
/// `NVSHMEM_SYMMETRIC_SIZE`, NVSHMEM sizes the heap beyond). A buffer or a request counts as
/// NVSHMEM's allocator (3.4.5) holds it: its size plus its alignment for an aligned one (that
/// allocator takes both and gives back only the part before the aligned address), rounded up to
/// its 512-byte chunks.
///
/// The check is an estimate of what NVSHMEM has mapped, and on the dynamic heap a request that
/// passes it can still make NVSHMEM tear the heap down: it cannot see memory that other
/// allocators hold on the GPU (its limit is the device's total memory at most), nor mapped heap
/// memory that NVSHMEM holds free but cannot use for the request — holes left by freed buffers,
/// and the unused end of its last step, which NVSHMEM does not count out when it maps the next one.
/// Keep the live buffers well below the limit, and allocate large buffers first. Every PE makes
/// the same decision as long as the PEs have the same configuration, PE count and GPU model; a PE
/// that refuses tells the others, which refuse too
/// ([`Error::PeerRefusedAlloc`](crate::Error::PeerRefusedAlloc)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeapLimit {
    /// True for the dynamic CUDA-VMM heap (the default on x86), false for the static heap
    /// (`NVSHMEM_DISABLE_CUDA_VMM`).
    pub dynamic: bool,
    /// The bytes of heap the check counts against: the dynamic heap's size, or the device's memory
    /// when that is smaller; the static heap's `NVSHMEM_SYMMETRIC_SIZE`.
    pub limit: usize,
    /// Where the limit comes from.
    pub limit_from: &'static str,
    /// Bytes of the limit held back for NVSHMEM's own symmetric buffers on the dynamic heap
    /// (0 on the static heap, which NVSHMEM makes larger for them): what NVSHMEM 3.4.5 sizes them
    /// at for this configuration and PE count (chiefly the team psync pool, about 4 MB per team
    /// of `NVSHMEM_MAX_TEAMS`, 128 by default, and 10 MB of `g` buffers; its "heapextra"), with
    /// this crate's scratch buffer, rounded up to the granularity, plus one granule more: NVSHMEM
    /// maps its buffers one request at a time, and the requests' steps can take one more granule
    /// than their sum rounded up.
    pub reserved: usize,
    /// The steps the dynamic heap grows by: `NVSHMEM_CUMEM_GRANULARITY` (default 512 MiB), at
    /// least the 2 MiB CUDA recommends for VMM allocations and at most NVSHMEM's 2 GiB cap.
    /// Requests are counted rounded up to it. 1 on the static heap.
    pub granularity: usize,
    /// The alignment NVSHMEM gives every `nvshmem_malloc`, which the check counts as for
    /// `nvshmem_align`: 0, unless `NVSHMEM_ENABLE_ALIGNED_MALLOC` (a hidden NVSHMEM option) is
    /// set; then NVSHMEM's memory granularity (`NVSHMEM_CUMEM_GRANULARITY`, at most 2 GiB, on the
    /// static heap too).
    pub malloc_alignment: usize,
}

/// What this process's live symmetric buffers hold of the heap (each one's size plus its
/// alignment, in NVSHMEM's 512-byte chunks; leaked ones included), and the most they have held at
/// once. NVSHMEM's dynamic heap (3.4.5) keeps what it has mapped, so a request that keeps the
/// buffers within that peak finds mapped memory (unless holes left by freed buffers keep it from
/// fitting: see [`HeapLimit`]), and one past it makes the heap grow by the request's step
/// ([`HeapLimit::charge`]), which the GPU must have free.
#[derive(Debug, Default, Clone)]
pub(crate) struct HeapUse {
    in_use: Cell<usize>,
    peak: Cell<usize>,
}

impl HeapUse {
    /// The bytes live buffers hold.
    pub(crate) fn in_use(&self) -> usize {
        self.in_use.get()
    }

    /// A buffer holding `held` bytes was allocated.
    pub(crate) fn add(&self, held: usize) {
        let now = self.in_use.get().saturating_add(held);
        self.in_use.set(now);
        self.peak.set(self.peak.get().max(now));
    }

    /// A buffer holding `held` bytes was freed.
    pub(crate) fn remove(&self, held: usize) {
        self.in_use.set(self.in_use.get().saturating_sub(held));
    }

    /// Whether a request holding `held` bytes takes the buffers past their peak, where the
    /// dynamic heap grows.
    pub(crate) fn grows(&self, held: usize) -> bool {
        self.in_use.get().saturating_add(held) > self.peak.get()
    }
}

/// NVSHMEM's default `NVSHMEM_SYMMETRIC_SIZE`.
const DEFAULT_SYMMETRIC_SIZE: usize = 1 << 30;
/// NVSHMEM's default `NVSHMEM_MAX_MEMORY_PER_GPU`.
const DEFAULT_MAX_MEMORY_PER_GPU: usize = 256 << 30;
/// NVSHMEM's default `NVSHMEM_CUMEM_GRANULARITY`.
const DEFAULT_GRANULARITY: usize = 512 << 20;
/// The granularity CUDA recommends for VMM allocations on current GPUs, which NVSHMEM takes
/// when `NVSHMEM_CUMEM_GRANULARITY` is smaller.
const MIN_GRANULARITY: usize = 2 << 20;
/// NVSHMEM's cap on the granularity (`NVSHMEMI_MAX_HANDLE_LENGTH`).
const MAX_GRANULARITY: usize = 2 << 30;

impl HeapLimit {
    /// Reads the heap variables the way NVSHMEM does, for a job of `n_pes` PEs (NVSHMEM's own
    /// buffers grow with it); the dynamic heap is also bounded by the device's memory.
    pub(crate) fn from_environment(ctx: &CudaContext, n_pes: usize) -> Result<Self> {
        let sized = |name: &'static str, default: usize| match config::size(name) {
            Some(Some(v)) => (v, name),
            // An unreadable value makes NVSHMEM's own initialisation fail; the default is moot.
            Some(None) | None => (default, name),
        };
        let asked = sized("NVSHMEM_CUMEM_GRANULARITY", DEFAULT_GRANULARITY).0;
        let aligned = |granularity: usize| {
            if config::flag("NVSHMEM_ENABLE_ALIGNED_MALLOC") {
                granularity
            } else {
                0
            }
        };
        if config::flag("NVSHMEM_DISABLE_CUDA_VMM") {
            let (limit, limit_from) = sized("NVSHMEM_SYMMETRIC_SIZE", DEFAULT_SYMMETRIC_SIZE);
            let malloc_alignment = aligned(asked.min(MAX_GRANULARITY));
            return Ok(HeapLimit { dynamic: false, limit, limit_from, reserved: 0, granularity: 1, malloc_alignment });
        }
        let granularity = asked.clamp(MIN_GRANULARITY, MAX_GRANULARITY);
        let malloc_alignment = aligned(granularity);
        let (size, size_from) = sized("NVSHMEM_MAX_MEMORY_PER_GPU", DEFAULT_MAX_MEMORY_PER_GPU);
        let own = OwnBuffers::from_environment().bytes(n_pes).saturating_add(agree::scratch_bytes(n_pes));
        let reserved = reserve(own, granularity);
        let device = ctx.total_mem()?;
        let (limit, limit_from) = if device < size { (device, "the device's memory") } else { (size, size_from) };
        Ok(HeapLimit { dynamic: true, limit, limit_from, reserved, granularity, malloc_alignment })
    }

    /// What a request of `bytes` takes of the limit: rounded up to the granularity (saturating).
    pub(crate) fn charge(&self, bytes: usize) -> usize {
        bytes.checked_next_multiple_of(self.granularity).unwrap_or(usize::MAX)
    }

    /// Whether a request that takes `charged` bytes of the limit ([`HeapLimit::charge`]) fits next
    /// to `in_use` bytes of live buffers: strictly below the limit on the dynamic heap (NVSHMEM
    /// fails at `mapped + step >= size`), at most the limit on the static one.
    pub(crate) fn fits(&self, in_use: usize, charged: usize) -> bool {
        let total = self.reserved.checked_add(in_use).and_then(|t| t.checked_add(charged));
        match total {
            Some(total) if self.dynamic => total < self.limit,
            Some(total) => total <= self.limit,
            None => false,
        }
    }
}

#[cfg(test)]
impl HeapLimit {
    /// A static heap of `limit` bytes (`NVSHMEM_SYMMETRIC_SIZE`), for tests.
    pub(crate) const fn static_of(limit: usize) -> Self {
        HeapLimit {
            dynamic: false,
            limit,
            limit_from: "NVSHMEM_SYMMETRIC_SIZE",
            reserved: 0,
            granularity: 1,
            malloc_alignment: 0,
        }
    }
}

/// The bytes NVSHMEM's segmented reduction (`gpu_rdxn_segment_threadgroup`, 3.4.5) exchanges with
/// one peer per round: `NVSHMEM_REDUCE_SCRATCH_SIZE / 2 / sizeof(long)`, as NVSHMEM computes it.
pub(crate) fn reduce_segment_bytes() -> usize {
    OwnBuffers::from_environment().reduce_scratch / 2 / LONG
}

/// Bytes held back for `own` bytes of NVSHMEM's own buffers and this crate's scratch buffer: rounded
/// up to the granularity, plus one granule (see [`HeapLimit::reserved`]).
fn reserve(own: usize, granularity: usize) -> usize {
    own.saturating_add(granularity).checked_next_multiple_of(granularity).unwrap_or(usize::MAX)
}

/// The sizes NVSHMEM 3.4.5 gives its own symmetric buffers, from its variables
/// (`nvshmemi_symmetric_heap::set_heap_size_attr`, `nvshmemi_get_teams_mem_requirement`,
/// `get_psync_len_per_team`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OwnBuffers {
    /// `NVSHMEM_MAX_TEAMS` (at least 6, and 64 on NVLS platforms: counted as at least 64).
    max_teams: usize,
    /// `NVSHMEM_REDUCE_SCRATCH_SIZE`, bytes.
    reduce_scratch: usize,
    /// `NVSHMEM_FCOLLECT_LL_THRESHOLD`, bytes.
    fcollect_ll: usize,
    /// `NVSHMEM_FCOLLECT_LL128_THRESHOLD`, bytes (NVSHMEM sets it to 0 on platforms without LL128;
    /// counted as given).
    fcollect_ll128: usize,
    /// `NVSHMEM_G_BUF_SIZE`, bytes.
    g_buf: usize,
    /// `NVSHMEM_G_COALESCING_BUF_SIZE`, bytes.
    g_coalescing: usize,
}

/// NVSHMEM's `SYNC_SIZE`, in `long`s.
const SYNC_SIZE: usize = 27648;
/// `sizeof(long)`.
const LONG: usize = 8;
/// NVSHMEM's malloc alignment (`NVSHMEMI_MALLOC_ALIGNMENT`).
const MALLOC_ALIGNMENT: usize = 512;

impl OwnBuffers {
    /// NVSHMEM's defaults.
    const DEFAULT: OwnBuffers = OwnBuffers {
        max_teams: 128,
        reduce_scratch: 1 << 19,
        fcollect_ll: 1 << 11,
        fcollect_ll128: 0,
        g_buf: 8 << 20,
        g_coalescing: 128 * 64 * 32 * 8,
    };

    /// The variables as NVSHMEM reads them (unreadable ones make NVSHMEM's start fail).
    fn from_environment() -> Self {
        let d = Self::DEFAULT;
        let get = |name: &str, default: usize| config::size(name).flatten().unwrap_or(default);
        OwnBuffers {
            max_teams: get("NVSHMEM_MAX_TEAMS", d.max_teams),
            reduce_scratch: get("NVSHMEM_REDUCE_SCRATCH_SIZE", d.reduce_scratch),
            fcollect_ll: get("NVSHMEM_FCOLLECT_LL_THRESHOLD", d.fcollect_ll),
            fcollect_ll128: get("NVSHMEM_FCOLLECT_LL128_THRESHOLD", d.fcollect_ll128),
            g_buf: get("NVSHMEM_G_BUF_SIZE", d.g_buf),
            g_coalescing: get("NVSHMEM_G_COALESCING_BUF_SIZE", d.g_coalescing),
        }
    }

    /// Bytes of NVSHMEM's own symmetric buffers in a job of `n_pes` PEs (saturating).
    fn bytes(&self, n_pes: usize) -> usize {
        let n = n_pes;
        let teams = self.max_teams.max(64);
        // `N_PSYNC_BYTES`: 32, or as many as the teams need.
        let psync_bytes = teams.div_ceil(8).max(32);
        // The LL128 fcollect psync of one PE (`NVSHMEMI_FCOLLECT_LL128_CALC_PSYNC_SIZE` for
        // bytes), for two psyncs per PE.
        let ll128 = self.fcollect_ll128.div_ceil(120).saturating_mul(120 + 8);
        let psync_len = [
            2 * 2 * SYNC_SIZE,                                           // sync and split
            self.reduce_scratch / LONG,                                  // reduce pWrk
            10 * SYNC_SIZE,                                              // broadcast
            n.saturating_mul(4).saturating_mul(self.fcollect_ll) / LONG, // fcollect, LL
            2 * SYNC_SIZE,                                               // alltoall
            ll128.saturating_mul(2).saturating_mul(n) / LONG,            // fcollect, LL128
            n,                                                           // p2p sync on stream
        ]
        .into_iter()
        .fold(0usize, usize::saturating_add);
        [
            LONG.saturating_mul(teams).saturating_mul(psync_len), // psync pool
            psync_bytes.saturating_mul(2),                        // psync pool availability
            2 * 4,                                                // team return values
            (2 * LONG).saturating_mul(teams),                     // sync counters
            128,                                                  // NCCL unique id
            16usize.saturating_mul(n),                            // team creation, per PE
            psync_bytes.saturating_mul(n),                        // team creation, per PE
            self.g_buf,
            self.g_coalescing,
            24 * MALLOC_ALIGNMENT, // alignment of NVSHMEM's allocations, and slack
        ]
        .into_iter()
        .fold(0usize, usize::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;
    const GIB: usize = 1 << 30;

    /// Only a request past the most the buffers have held makes the dynamic heap grow, so only
    /// such a request asks the GPU for its free memory (`Error::DeviceMemoryShort`).
    #[test]
    fn only_requests_past_the_peak_grow_the_heap() {
        let heap = HeapUse::default();
        assert!(heap.grows(512), "the first request maps memory beyond NVSHMEM's own buffers");
        heap.add(GIB);
        heap.add(GIB);
        heap.remove(GIB);
        assert_eq!(heap.in_use(), GIB);
        assert!(!heap.grows(GIB), "1 GiB in use, 2 GiB held at the peak: the heap has room");
        assert!(heap.grows(GIB + 512));
        heap.remove(GIB);
        assert!(!heap.grows(2 * GIB));
        assert!(heap.grows(2 * GIB + 1));
    }

    fn dynamic(limit: usize, reserved: usize, granularity: usize) -> HeapLimit {
        HeapLimit {
            dynamic: true,
            limit,
            limit_from: "NVSHMEM_MAX_MEMORY_PER_GPU",
            reserved,
            granularity,
            malloc_alignment: 0,
        }
    }

    /// NVSHMEM 3.4.5's own buffers with its defaults: a psync pool of 128 teams of
    /// 507 904 + 1025 n longs, 8 MiB + 2 MiB of g buffers, and small change.
    #[test]
    fn nvshmems_own_buffers_follow_its_sizes() {
        let own = OwnBuffers::DEFAULT;
        let per_team = |n: usize| (2 * 55296 + 65536 + 276480 + 1024 * n + 55296 + n) * 8;
        let small = |n: usize| 2 * 32 + 8 + 2 * 8 * 128 + 128 + 16 * n + 32 * n + 10 * MIB + 24 * 512;
        for n in [1, 2, 8, 64] {
            assert_eq!(own.bytes(n), 128 * per_team(n) + small(n), "{n} PEs");
        }
        // About 496 MiB for two PEs, and 1 MiB more per PE.
        assert_eq!(own.bytes(2) / MIB, 508);
        assert_eq!(own.bytes(3) - own.bytes(2), 128 * 1025 * 8 + 48);
        // Fewer teams than NVLS platforms force are counted as 64.
        assert_eq!(OwnBuffers { max_teams: 8, ..own }.bytes(2), OwnBuffers { max_teams: 64, ..own }.bytes(2));
        // LL128's psync: 128 bytes per started 120, two per PE, per team.
        let ll128 = OwnBuffers { fcollect_ll128: 240, ..own };
        assert_eq!(ll128.bytes(2) - own.bytes(2), 128 * (2 * 128 * 2 * 2 / 8) * 8);
        assert_eq!(OwnBuffers { max_teams: usize::MAX, ..own }.bytes(2), usize::MAX, "saturates");
    }

    /// The reserve is NVSHMEM's buffers rounded up to the granularity, plus one granule.
    #[test]
    fn the_reserve_is_rounded_up_plus_a_granule() {
        let g = 512 * MIB;
        assert_eq!(reserve(OwnBuffers::DEFAULT.bytes(2), g), 2 * g, "508 MiB: one granule, and one more");
        assert_eq!(reserve(g, g), 2 * g);
        assert_eq!(reserve(g + 1, g), 3 * g);
        assert_eq!(reserve(0, g), g);
        assert_eq!(reserve(usize::MAX - 5, g), usize::MAX);
    }

    /// NVSHMEM fails at `mapped + step >= size`: a request that would fill the heap exactly is
    /// refused on the dynamic heap, and requests count whole granules.
    #[test]
    fn the_dynamic_heap_counts_granules_and_is_strict() {
        let g = 512 * MIB;
        let heap = dynamic(8 * GIB, 2 * g, g);
        assert_eq!(heap.charge(1), g);
        assert_eq!(heap.charge(g), g);
        assert_eq!(heap.charge(g + 1), 2 * g);
        assert_eq!(heap.charge(usize::MAX), usize::MAX, "saturates");
        // 1 GiB reserved: the mapping must stay below the other 7 GiB.
        assert!(heap.fits(0, heap.charge(7 * GIB - g)));
        assert!(!heap.fits(0, heap.charge(7 * GIB)), "exactly full is refused");
        assert!(!heap.fits(0, heap.charge(7 * GIB - g + 1)), "one byte into the last granule");
        // A byte takes a granule: with 6.5 GiB in use it would fill the heap exactly.
        assert!(heap.fits(13 * g - 1, heap.charge(1)));
        assert!(!heap.fits(13 * g, heap.charge(1)));
        assert!(!heap.fits(usize::MAX, heap.charge(1)), "overflow is refused");
    }

    /// The static heap holds `NVSHMEM_SYMMETRIC_SIZE` besides NVSHMEM's own buffers: it may be
    /// filled exactly.
    #[test]
    fn the_static_heap_may_be_filled() {
        let heap = HeapLimit::static_of(GIB);
        assert_eq!(heap.charge(12345), 12345);
        assert!(heap.fits(GIB - 8, heap.charge(8)));
        assert!(!heap.fits(GIB - 8, heap.charge(9)));
    }
}
