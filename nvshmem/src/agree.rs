//! Making sure every PE makes the same collective allocation, or frees the same buffer, before
//! NVSHMEM allocates or frees.
//!
//! `nvshmem_malloc` and its variants trust every PE to ask for the same size (and alignment): a
//! PE that asks for another one leaves the symmetric heaps out of step, so that every later
//! buffer sits at another offset on that PE and puts land in the wrong place — silently. The same
//! goes for `nvshmem_free`: a PE that frees another buffer than the others (or frees while they
//! allocate) leaves a hole at another offset, which the next allocation fills. And a PE that
//! refuses its part locally (its heap limit, a zero size) while the others call NVSHMEM leaves
//! them waiting in its barrier. So before each allocation and each free every PE tells every
//! other what it does — allocate or free, size, alignment or the buffer's offset, and whether it
//! refused — and each PE decides from the same list.
//!
//! The exchange uses only what NVSHMEM supports in every mode, "limited MPG" included (several
//! PEs on one GPU without MPS, where NVSHMEM refuses team splits, reductions, team collectives
//! and stream waits, and exits the process), and no collective at all: each PE puts its words
//! into its own slot of every PE's copy of a small symmetric scratch buffer with a signal
//! (`nvshmemx_putmem_signal_on_stream`, the signal setting the slot's last word, the check's
//! number, after the other words have landed), then reads its own copy of the list on the host
//! until every slot holds this check's number. A barrier would pair with whatever barrier the
//! other PEs make next: PEs that make their collectives in different orders (one frees while
//! another first makes a barrier) then read each other's words at different times, one finding
//! them stale and refusing while another agrees and frees, and the heaps part for good. Waiting
//! for the words themselves pairs a check only with the same check on every PE; PEs whose
//! collectives are in different orders wait for each other, as in any collective, instead of
//! parting. It runs on a private stream, which is synchronised before the verdict.
//!
//! Consecutive checks alternate between two lists, so that a PE that is one check ahead never
//! overwrites a list another PE is still reading: it can only write the list of check `r + 2`
//! after finishing check `r + 1`, which needs every PE's words of check `r + 1`, which each PE
//! puts only after reading check `r`'s list. So a slot of check `r`'s list holds words of check
//! `r` or of check `r - 2` (zeros before a list's first check): never of a later one.
//!
//! The same scratch buffer serves collectives over a team (team splits, which NVSHMEM computes
//! from each member's own arguments), in two more lists with one slot per world PE:
//! [`Agreement::team_exchange`] puts each member's words, with a signal, into its slot on every
//! member, and each member waits on the host until every member's words have arrived, as for
//! allocations. Members make different exchanges (a PE belongs to several teams), so an
//! exchange is not numbered for the whole job: each PE counts the exchanges it made with each
//! other PE (every exchange over a team that holds both), and its words for PE `q` carry their
//! count and go to the list of that count's parity. Two PEs that split their common teams in
//! the same order count alike; a PE can write its words of count `c + 2` for `q` only once it
//! has `q`'s words of count `c + 1`, which `q` sends after reading count `c`'s. Splits must come in
//! the same order on every member of the teams involved, as for any collective: two members that
//! split in different orders read each other's words of another split (which the callers'
//! comparison refuses on both) or wait for each other, never a barrier of something else; with
//! three or more PEs a third member may still find every member's words alike and enter
//! NVSHMEM's split alone, where it waits.
//!
//! The check before [`crate::Runtime::alloc_zeroed`] returns a buffer uses the private stream
//! too ([`Agreement::zero`]): every PE zeroes its copy there, then a barrier over all PEs.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::ptr::NonNull;

use cudarc::driver::{result, sys, sys::CUdeviceptr, sys::CUstream};

use crate::error::{Error, Result};
use crate::ffi::call;
use crate::quiesce;

/// Values each PE sends per check: operation, bytes, alignment, offset, refused, and the check's
/// number (counted from 1 on each PE: words left in a slot by an earlier check, or never
/// written, are told apart). A team exchange sends as many words of its caller's.
pub(crate) const WORDS: usize = 6;
/// Values a team exchange carries for its caller: a slot's words but the last, which is the
/// exchange's number (module docs).
pub(crate) const DATA_WORDS: usize = WORDS - 1;
/// Bytes of one PE's words.
const WORD_BYTES: usize = WORDS * size_of::<u64>();
/// Offset in a slot of its last word, the check's number, which the put's signal sets once the
/// words before it have landed.
const SIGNAL_OFFSET: usize = (WORDS - 1) * size_of::<u64>();

/// What a PE's copy of a check's list shows of the other PEs' words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arrival {
    /// Every slot holds the check's words.
    All,
    /// Some slot still holds an earlier check's words (or zeros).
    Waiting,
    /// A slot holds words of a later check, the number given.
    Later(u64),
}

/// How far the words of check `check` have arrived in `all` (`WORDS` per PE, in PE order).
fn arrived(all: &[u64], check: u64) -> Arrival {
    let mut arrival = Arrival::All;
    for slot in all.chunks_exact(WORDS) {
        match slot[WORDS - 1] {
            c if c == check => {}
            c if c > check => return Arrival::Later(c),
            _ => arrival = Arrival::Waiting,
        }
    }
    arrival
}

/// Where world PE `pe`'s words of its exchange count `count` with this PE start, in words, in a
/// copy of both team lists of a job of `n_pes` PEs.
fn team_word(n_pes: usize, pe: usize, count: u64) -> usize {
    ((count % 2) as usize * n_pes + pe) * WORDS
}

/// Whether every member's words of this exchange (`counts[i]` with `members[i]`) are in `all`, a
/// copy of both team lists; [`Error::TeamCheckFailed`] for words of a later exchange, which the
/// protocol rules out (module docs).
fn team_arrived(all: &[u64], n_pes: usize, members: &[usize], counts: &[u64]) -> Result<bool> {
    let mut every = true;
    for (&pe, &count) in members.iter().zip(counts) {
        match all[team_word(n_pes, pe, count) + WORDS - 1] {
            c if c == count => {}
            c if c > count => return Err(Error::TeamCheckFailed),
            _ => every = false,
        }
    }
    Ok(every)
}

/// Makes the words that remote peers put into this PE's memory through GPUDirect RDMA visible to
/// its next read: they may become visible after the signal that announced them (relaxed
/// ordering), and NVSHMEM's own waits flush them the same way. Not every platform has or needs
/// the flush; a failure only means there is nothing to flush. The PE's context must be current.
fn flush_remote_writes() {
    // SAFETY: no pointers; the current context is the PE's (the callers' contract).
    let flushed = unsafe {
        sys::cuFlushGPUDirectRDMAWrites(
            sys::CUflushGPUDirectRDMAWritesTarget::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
            sys::CUflushGPUDirectRDMAWritesScope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER,
        )
    };
    if flushed != sys::CUresult::CUDA_SUCCESS {
        log::debug!("nvshmem: cuFlushGPUDirectRDMAWrites: {flushed:?}");
    }
}

/// The host's pauses between two looks at a list: a yield for the first looks (the words of
/// PEs that check at the same time arrive within microseconds), then sleeps growing to 1 ms (a PE
/// that is late, or busy with other collectives first, may take seconds).
#[derive(Default)]
struct Backoff {
    looks: u32,
}

impl Backoff {
    fn pause(&mut self) {
        self.looks = self.looks.saturating_add(1);
        if self.looks <= 64 {
            std::thread::yield_now();
        } else {
            let micros = 10u64 << (self.looks - 64).min(7);
            std::thread::sleep(std::time::Duration::from_micros(micros.min(1000)));
        }
    }
}

/// The collective heap operation a PE is about to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// `nvshmem_malloc` or `nvshmem_align`.
    Alloc = 1,
    /// `nvshmem_free`.
    Free = 2,
    /// `nvshmem_malloc` then zeroed, with a barrier over every PE that a plain allocation does
    /// not make: a PE zeroing while another does not would pair that barrier with the other's
    /// next one.
    AllocZeroed = 3,
}

/// What one PE asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ask {
    /// Allocating or freeing.
    pub(crate) op: Op,
    /// Bytes (ignored when refused).
    pub(crate) bytes: u64,
    /// Alignment in bytes, 0 for NVSHMEM's default (allocations; 0 for a free).
    pub(crate) align: u64,
    /// The freed buffer's offset from the scratch buffer ([`Agreement::offset`]; 0 for an
    /// allocation).
    pub(crate) offset: u64,
    /// This PE refused its part before calling NVSHMEM.
    pub(crate) refused: bool,
}

/// What the PEs asked for together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Agreed {
    /// The lowest and highest check number in the list: different when a PE's words are from
    /// another check than this PE's (its slot is stale: the PEs are out of step).
    pub(crate) min_check: u64,
    pub(crate) max_check: u64,
    /// Not every PE makes the same operation.
    pub(crate) mixed: bool,
    pub(crate) min_bytes: u64,
    pub(crate) max_bytes: u64,
    pub(crate) min_align: u64,
    pub(crate) max_align: u64,
    pub(crate) min_offset: u64,
    pub(crate) max_offset: u64,
    /// Some PE refused.
    pub(crate) refused: bool,
}

impl Ask {
    /// The words this PE sends in its check number `check`.
    fn words(self, check: u64) -> [u64; WORDS] {
        let bytes = if self.refused { 0 } else { self.bytes };
        [self.op as u64, bytes, self.align, self.offset, u64::from(self.refused), check]
    }
}

impl Agreed {
    /// The verdict from every PE's words (`WORDS` per PE, in PE order): the same on every PE as
    /// long as the PEs are in step (the check numbers tell).
    fn from_words(all: &[u64]) -> Self {
        let mut agreed = Agreed {
            min_check: u64::MAX,
            max_check: 0,
            mixed: false,
            min_bytes: u64::MAX,
            max_bytes: 0,
            min_align: u64::MAX,
            max_align: 0,
            min_offset: u64::MAX,
            max_offset: 0,
            refused: false,
        };
        let first_op = all.first().copied();
        for pe in all.chunks_exact(WORDS) {
            agreed.mixed |= Some(pe[0]) != first_op;
            agreed.min_bytes = agreed.min_bytes.min(pe[1]);
            agreed.max_bytes = agreed.max_bytes.max(pe[1]);
            agreed.min_align = agreed.min_align.min(pe[2]);
            agreed.max_align = agreed.max_align.max(pe[2]);
            agreed.min_offset = agreed.min_offset.min(pe[3]);
            agreed.max_offset = agreed.max_offset.max(pe[3]);
            agreed.refused |= pe[4] != 0;
            agreed.min_check = agreed.min_check.min(pe[5]);
            agreed.max_check = agreed.max_check.max(pe[5]);
        }
        agreed
    }

    /// `Ok` when every PE makes the same operation `op` — the same allocation, or the same
    /// buffer's free; `local` is this PE's own refusal, if any.
    pub(crate) fn check(self, op: Op, local: Option<Error>) -> Result<()> {
        if let Some(local) = local {
            return Err(local);
        }
        if self.min_check != self.max_check {
            return Err(Error::HeapCollectivesOutOfStep { min_check: self.min_check, max_check: self.max_check });
        }
        if self.mixed {
            return Err(Error::MixedHeapCollectives);
        }
        if self.refused {
            return Err(match op {
                Op::Alloc | Op::AllocZeroed => Error::PeerRefusedAlloc,
                Op::Free => Error::PeerRefusedFree,
            });
        }
        match op {
            Op::Alloc | Op::AllocZeroed if self.min_bytes != self.max_bytes || self.min_align != self.max_align => {
                Err(Error::AsymmetricAlloc {
                    min_bytes: self.min_bytes,
                    max_bytes: self.max_bytes,
                    min_align: self.min_align,
                    max_align: self.max_align,
                })
            }
            Op::Free if self.min_bytes != self.max_bytes || self.min_offset != self.max_offset => {
                Err(Error::AsymmetricFree {
                    min_offset: self.min_offset,
                    max_offset: self.max_offset,
                    min_bytes: self.min_bytes,
                    max_bytes: self.max_bytes,
                })
            }
            Op::Alloc | Op::AllocZeroed | Op::Free => Ok(()),
        }
    }
}

/// Where things sit in the scratch buffer: this PE's outgoing words, then two lists of every PE's
/// words for allocations and frees, then two for team exchanges (one slot of `WORDS` per PE
/// each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    my_pe: usize,
    n_pes: usize,
}

impl Layout {
    /// Size of the scratch buffer in bytes.
    fn bytes(self) -> usize {
        (1 + 4 * self.n_pes) * WORD_BYTES
    }

    /// Offset of this PE's outgoing words.
    fn outbox(self) -> usize {
        0
    }

    /// Offset of list `parity` (0 or 1; 2 and 3 are the team exchanges').
    fn list(self, parity: u64) -> usize {
        WORD_BYTES + parity as usize * self.n_pes * WORD_BYTES
    }

    /// Offset of this PE's slot in list `parity`, on every PE.
    fn my_slot(self, parity: u64) -> usize {
        self.list(parity) + self.my_pe * WORD_BYTES
    }

    /// Offset of the team exchanges' list `parity` (0 or 1).
    fn team_list(self, parity: u64) -> usize {
        self.list(2 + parity)
    }

    /// Offset of world PE `pe`'s slot in the team exchanges' list `parity`, on every PE.
    fn team_slot(self, parity: u64, pe: usize) -> usize {
        self.team_list(parity) + pe * WORD_BYTES
    }
}

/// Size in bytes of the scratch buffer of a job of `n_pes` PEs, which every PE allocates when it
/// starts (counted against the heap's limit as NVSHMEM's own buffers are).
pub(crate) fn scratch_bytes(n_pes: usize) -> usize {
    Layout { my_pe: 0, n_pes }.bytes()
}

/// The stream and scratch buffer of the allocation checks.
pub(crate) struct Agreement {
    layout: Layout,
    scratch: NonNull<c_void>,
    stream: CUstream,
    /// Checks made so far: the parity picks the list.
    rounds: Cell<u64>,
    /// The check numbers a check read when it found the PEs out of step: every later check is
    /// refused with them.
    out_of_step: Cell<Option<(u64, u64)>>,
    /// The number of a check that failed on this PE after the other PEs could count it as made
    /// (a CUDA error): every later check is refused with it.
    failed: Cell<Option<u64>>,
    /// The team exchanges made with each world PE so far (module docs).
    pairs: RefCell<Vec<u64>>,
    /// A team exchange failed after this PE had sent its words: every later one is refused.
    team_failed: Cell<bool>,
}

// SAFETY: the scratch pointer is device memory that NVSHMEM owns, with no tie to a thread, and
// the stream handle can be used from any thread whose current context is the PE's (`agree`'s
// callers bind it). The runtime that holds the agreement is `Send` but not `Sync` (as is this
// type, through its `Cell`): one thread at a time uses it, which is NVSHMEM's
// `NVSHMEM_THREAD_SERIALIZED`.
unsafe impl Send for Agreement {}

impl Agreement {
    /// Sets up the checks for PE `my_pe` of `n_pes`. Collective over all PEs (a symmetric
    /// allocation of a size that depends only on `n_pes`, the same on every PE); NVSHMEM must be
    /// running and the PE's context current.
    pub(crate) fn new(my_pe: usize, n_pes: usize) -> Result<Self> {
        if my_pe >= n_pes {
            return Err(Error::InvalidPe { what: "the PE NVSHMEM reports", pe: my_pe, n_pes });
        }
        let layout = Layout { my_pe, n_pes };
        let bytes = layout.bytes();
        // SAFETY: NVSHMEM is running and the PE's context current (the caller's contract); every
        // PE allocates the same size here, at the same point of its start-up.
        let scratch = unsafe { call!(nvshmem_malloc(bytes)) }?;
        let scratch = NonNull::new(scratch).ok_or(Error::OutOfMemory { bytes })?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)?;
        let agreement = Agreement {
            layout,
            scratch,
            stream,
            rounds: Cell::new(0),
            out_of_step: Cell::new(None),
            failed: Cell::new(None),
            pairs: RefCell::new(vec![0; n_pes]),
            team_failed: Cell::new(false),
        };
        // The four lists start zeroed on every PE, before any PE can write to them (the first
        // check and exchange follow this barrier): a slot nobody wrote reads as zeros, never as
        // words of a check or exchange (a heap's memory may hold anything).
        let lists = agreement.at(layout.list(0));
        match agreement.zero(lists, 4 * n_pes * WORD_BYTES) {
            Ok(()) => Ok(agreement),
            Err(e) => {
                agreement.close();
                Err(e)
            }
        }
    }

    /// The address of `offset` in the scratch buffer.
    fn at(&self, offset: usize) -> CUdeviceptr {
        self.scratch.as_ptr() as CUdeviceptr + offset as CUdeviceptr
    }

    /// The offset of symmetric address `addr` from the scratch buffer, the first allocation of the
    /// heap's user: the same on every PE for the same buffer as long as the heaps are in step
    /// (whatever address each PE's heap starts at).
    pub(crate) fn offset(&self, addr: CUdeviceptr) -> u64 {
        addr.wrapping_sub(self.scratch.as_ptr() as CUdeviceptr)
    }

    /// What all PEs ask for, given what this one asks for. Collective over all PEs, in the order
    /// of their allocations and frees; blocks until every PE has asked (for ever if a PE never
    /// does, as any collective). The PE's context must be current. Refused, before anything is
    /// enqueued, while a capture holds NVSHMEM's copy streams or this thread captures, and for
    /// good once a check found the PEs out of step ([`Error::HeapCollectivesOutOfStep`]) or failed
    /// after this PE had sent its words ([`Error::HeapCheckFailed`]).
    pub(crate) fn agree(&self, ask: Ask) -> Result<Agreed> {
        if let Some((min_check, max_check)) = self.out_of_step.get() {
            return Err(Error::HeapCollectivesOutOfStep { min_check, max_check });
        }
        quiesce::host_call("a symmetric allocation or free")?;
        if let Some(check) = self.failed.get() {
            return Err(Error::HeapCheckFailed { check });
        }
        let parity = self.rounds.get() % 2;
        self.rounds.set(self.rounds.get() + 1);
        let check = self.rounds.get();
        // Past this point the other PEs count this check as made: a failure leaves them waiting
        // in it (or inside NVSHMEM's allocation), and this PE can no longer tell where they are.
        match self.exchange(parity, check, ask) {
            Ok(all) => Ok(Agreed::from_words(&all)),
            Err(e) => {
                if !matches!(e, Error::HeapCollectivesOutOfStep { .. }) {
                    self.failed.set(Some(check));
                }
                Err(e)
            }
        }
    }

    /// Check number `check`'s exchange on list `parity` (see [`Agreement::agree`] and the module
    /// docs): every PE's words, in PE order, once every PE has sent them.
    fn exchange(&self, parity: u64, check: u64, ask: Ask) -> Result<Vec<u64>> {
        let slot = self.at(self.layout.my_slot(parity));
        self.send(ask.words(check), (0..self.layout.n_pes).map(|pe| (pe, slot, check)))?;
        let mut all = vec![0u64; self.layout.n_pes * WORDS];
        self.read_until(&mut all, self.at(self.layout.list(parity)), |all| match arrived(all, check) {
            Arrival::All => Ok(true),
            Arrival::Waiting => Ok(false),
            Arrival::Later(later) => {
                // Never seen while every PE runs this protocol (module docs): kept as a check on it.
                self.out_of_step.set(Some((check, later)));
                Err(Error::HeapCollectivesOutOfStep { min_check: check, max_check: later })
            }
        })?;
        // The allocation or free that follows makes a barrier over all PEs inside NVSHMEM, which
        // must not run beside a collective this PE enqueued on a stream before (the same team
        // state). Waited for only now: that collective may pair with a peer's barrier inside the
        // same allocation or free, which the peer makes only once this PE's words have reached it.
        quiesce::collectives_finished()?;
        Ok(all)
    }

    /// Copies `words` into the outbox, then, for each `(pe, slot, number)` of `to`, puts all of
    /// them but the last into `slot` on PE `pe` and sets the slot's last word to `number` once they
    /// have landed there (`nvshmemx_putmem_signal_on_stream` on the private stream). `slot` is one
    /// of this PE's own slots of a list (the same address on every PE).
    fn send(&self, words: [u64; WORDS], to: impl Iterator<Item = (usize, CUdeviceptr, u64)>) -> Result<()> {
        let outbox = self.at(self.layout.outbox());
        let stream = self.stream as nvshmem_sys::cudaStream_t;
        let set = nvshmem_sys::nvshmemx_signal_op_t::NVSHMEM_SIGNAL_SET.0 as i32;
        // SAFETY: the outbox and every slot given are ranges of the symmetric scratch buffer
        // (`Layout::bytes` covers them; the callers pass this PE's own slots), which only this
        // type's functions use, one call at a time on the private stream (`Runtime` is not `Sync`;
        // each call's copies and puts are enqueued behind the earlier ones on that stream, so the
        // outbox is not overwritten before the earlier puts have read it); the outbox and the slots
        // are disjoint, and a slot's data words and its last word (the signal, one aligned u64) are
        // too; each slot exists on every PE (symmetric, same layout), and no PE reads it for this
        // number before the signal says the words have landed (module docs); every `pe` is below
        // `n_pes` (the callers'); `words` is staged by the copy before it returns; the stream is
        // this context's and never captured (nothing but this type has its handle).
        unsafe {
            result::memcpy_htod_async(outbox, &words, self.stream)?;
            for (pe, slot, number) in to {
                let signal = (slot + SIGNAL_OFFSET as CUdeviceptr) as *mut u64;
                // World PEs came from NVSHMEM's `int`s.
                let pe = pe as i32;
                let (slot, outbox) = (slot as *mut c_void, outbox as *const c_void);
                call!(nvshmemx_putmem_signal_on_stream(slot, outbox, SIGNAL_OFFSET, signal, number, set, pe, stream))?;
            }
        }
        Ok(())
    }

    /// Copies `all.len()` words from `from` (a range of this PE's scratch buffer) into `all` until
    /// `done` finds every number it waits for in (pausing between looks), then once more, after
    /// flushing remote writes: one copy may read a slot's words before they landed and its number
    /// after, and the numbers a caller waits for cannot change before its next exchange (module
    /// docs). What the caller decides from is the second copy.
    fn read_until(&self, all: &mut [u64], from: CUdeviceptr, done: impl Fn(&[u64]) -> Result<bool>) -> Result<()> {
        let mut wait = Backoff::default();
        let copy = |all: &mut [u64]| -> Result<()> {
            // SAFETY: `from` and `all.len()` words after it lie in the scratch buffer (the
            // callers'); `all` is pageable host memory, so the copy has finished when it returns,
            // and the synchronisation waits for the puts enqueued before it; the stream is this
            // context's and never captured.
            unsafe {
                result::memcpy_dtoh_async(all, from, self.stream)?;
                result::stream::synchronize(self.stream)?;
            }
            Ok(())
        };
        loop {
            copy(all)?;
            if done(all)? {
                break;
            }
            wait.pause();
        }
        flush_remote_writes();
        copy(all)
    }

    /// Zeroes `bytes` at `ptr` (this PE's copy of a symmetric buffer just allocated) on the private
    /// stream, then makes a barrier over all PEs there, and waits for both: when it returns, every
    /// PE has zeroed its copy, so that no write to the buffer, from any PE, can land before the
    /// zeros. Collective over all PEs, right after a collective allocation; the barrier is
    /// enqueued even when the zeroing cannot be, so that no PE waits for this one in it. The PE's
    /// context must be current.
    pub(crate) fn zero(&self, ptr: CUdeviceptr, bytes: usize) -> Result<()> {
        let stream = self.stream as nvshmem_sys::cudaStream_t;
        // SAFETY: `ptr` is the start of `bytes` of this PE's symmetric heap that the caller just
        // allocated and that nothing else uses yet; the stream is this context's and idle (every use
        // is synchronised before returning).
        let zeroed = unsafe { result::memset_d8_async(ptr, 0, bytes, self.stream) };
        // SAFETY: NVSHMEM is running and the PE's context current (the caller's contract); every
        // PE makes this barrier at the same step (allocation is collective). The private stream is
        // never captured: nothing but this type has its handle.
        let barrier =
            quiesce::collective(self.stream, None, true, || unsafe { call!(nvshmemx_barrier_all_on_stream(stream)) });
        // SAFETY: the stream is alive and this context's.
        let waited = unsafe { result::stream::synchronize(self.stream) };
        zeroed?;
        barrier?;
        Ok(waited?)
    }

    /// Every member's words for a team split, given this PE's (`words`): collective over the
    /// members of the team, whose world PE numbers `members` lists in team order (this PE among
    /// them), at the same step of their splits. Blocks until every member has sent its words (for
    /// ever if one never does, as any collective), and returns them in team order. The PE's
    /// context must be current. Refused, before anything is enqueued, while a capture holds
    /// NVSHMEM's copy streams or this thread captures, and for good once an exchange failed
    /// after this PE had sent its words ([`Error::TeamCheckFailed`]).
    pub(crate) fn team_exchange(&self, members: &[usize], words: [u64; DATA_WORDS]) -> Result<Vec<[u64; DATA_WORDS]>> {
        let n_pes = self.layout.n_pes;
        if let Some(&pe) = members.iter().find(|&&pe| pe >= n_pes) {
            return Err(Error::InvalidPe { what: "a team member's world PE", pe, n_pes });
        }
        quiesce::host_call("a team split")?;
        if self.team_failed.get() {
            return Err(Error::TeamCheckFailed);
        }
        let counts: Vec<u64> = {
            let pairs = self.pairs.borrow();
            members.iter().map(|&pe| pairs[pe] + 1).collect()
        };
        match self.team_round(members, &counts, words) {
            Ok(all) => {
                let mut pairs = self.pairs.borrow_mut();
                for (&pe, &count) in members.iter().zip(&counts) {
                    pairs[pe] = count;
                }
                Ok(all)
            }
            // The members count this exchange as made with this PE, or wait for its words.
            Err(e) => {
                self.team_failed.set(true);
                Err(e)
            }
        }
    }

    /// [`Agreement::team_exchange`]'s puts and wait: `counts[i]` is the count of this exchange
    /// between this PE and `members[i]`.
    fn team_round(
        &self,
        members: &[usize],
        counts: &[u64],
        words: [u64; DATA_WORDS],
    ) -> Result<Vec<[u64; DATA_WORDS]>> {
        let Layout { my_pe, n_pes } = self.layout;
        let mut out = [0u64; WORDS];
        out[..DATA_WORDS].copy_from_slice(&words);
        let slot = |count: u64| self.at(self.layout.team_slot(count % 2, my_pe));
        self.send(out, members.iter().zip(counts).map(|(&pe, &count)| (pe, slot(count), count)))?;
        // Both team lists, read at once.
        let mut all = vec![0u64; 2 * n_pes * WORDS];
        self.read_until(&mut all, self.at(self.layout.team_list(0)), |all| team_arrived(all, n_pes, members, counts))?;
        // NVSHMEM's split makes collectives over the parent team, which must not run beside one
        // this PE enqueued on a stream before (see `exchange`).
        quiesce::collectives_finished()?;
        Ok(members
            .iter()
            .zip(counts)
            .map(|(&pe, &count)| {
                let at = team_word(n_pes, pe, count);
                let mut slot = [0; DATA_WORDS];
                slot.copy_from_slice(&all[at..at + DATA_WORDS]);
                slot
            })
            .collect())
    }

    /// Destroys the private stream (idle: every use is synchronised). The scratch buffer is
    /// NVSHMEM's to free when it finalises.
    pub(crate) fn close(self) {
        // SAFETY: the stream was created in `new`, is idle, and is not used after this.
        if let Err(e) = unsafe { result::stream::destroy(self.stream) } {
            log::warn!("nvshmem: destroying the allocation checks' stream failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What every PE reads after the exchange: each PE's words in its slot, in PE order.
    fn combine(asks: &[Ask]) -> Agreed {
        let all: Vec<u64> = asks.iter().flat_map(|a| a.words(7)).collect();
        Agreed::from_words(&all)
    }

    fn ask(bytes: u64, align: u64, refused: bool) -> Ask {
        Ask { op: Op::Alloc, bytes, align, offset: 0, refused }
    }

    fn free(bytes: u64, offset: u64, refused: bool) -> Ask {
        Ask { op: Op::Free, bytes, align: 0, offset, refused }
    }

    #[test]
    fn every_pe_reaches_the_same_verdict() {
        let check = |asks: &[Ask]| combine(asks).check(Op::Alloc, None);
        assert!(check(&[ask(4096, 0, false), ask(4096, 0, false)]).is_ok());
        let err = check(&[ask(4096, 0, false), ask(8192, 0, false)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the PEs asked for different symmetric allocations (4096…8192 bytes, alignment 0…0); nothing was allocated on any PE"
        );
        let err = check(&[ask(4096, 0, false), ask(4096, 256, false)]).unwrap_err();
        assert!(matches!(err, Error::AsymmetricAlloc { min_align: 0, max_align: 256, .. }), "{err}");
        // A PE that refused keeps its own error; the others learn that a peer refused.
        let refused = combine(&[ask(4096, 0, false), ask(0, 0, true)]);
        assert!(matches!(refused.check(Op::Alloc, None), Err(Error::PeerRefusedAlloc)));
        let own = Error::ZeroSize { len: 0, elem_size: 4 };
        assert!(matches!(refused.check(Op::Alloc, Some(own)), Err(Error::ZeroSize { .. })));
    }

    #[test]
    fn every_pe_frees_the_same_buffer() {
        let check = |asks: &[Ask]| combine(asks).check(Op::Free, None);
        assert!(check(&[free(4096, 512, false), free(4096, 512, false)]).is_ok());
        // Two buffers of one size, or two sizes at one offset: refused on every PE.
        let err = check(&[free(4096, 512, false), free(4096, 8704, false)]).unwrap_err();
        assert!(matches!(err, Error::AsymmetricFree { min_offset: 512, max_offset: 8704, .. }), "{err}");
        let err = check(&[free(4096, 512, false), free(8192, 512, false)]).unwrap_err();
        assert!(matches!(err, Error::AsymmetricFree { min_bytes: 4096, max_bytes: 8192, .. }), "{err}");
        // A PE that could not free (its streams could not be waited for) keeps its error.
        let refused = combine(&[free(4096, 512, false), free(0, 512, true)]);
        assert!(matches!(refused.check(Op::Free, None), Err(Error::PeerRefusedFree)));
        // One PE frees while another allocates, even with equal sizes: refused on both.
        let mixed = combine(&[free(4096, 0, false), ask(4096, 0, false)]);
        assert!(matches!(mixed.check(Op::Free, None), Err(Error::MixedHeapCollectives)));
        assert!(matches!(mixed.check(Op::Alloc, None), Err(Error::MixedHeapCollectives)));
        // One PE zeroing its allocation while another does not: the zeroing PE's extra barrier
        // would pair with the other's next one.
        let zeroed = Ask { op: Op::AllocZeroed, ..ask(4096, 0, false) };
        let mixed = combine(&[ask(4096, 0, false), zeroed]);
        assert!(matches!(mixed.check(Op::AllocZeroed, None), Err(Error::MixedHeapCollectives)));
        assert!(matches!(mixed.check(Op::Alloc, None), Err(Error::MixedHeapCollectives)));
        assert!(combine(&[zeroed, zeroed]).check(Op::AllocZeroed, None).is_ok());
    }

    #[test]
    fn a_check_waits_for_every_pes_words_of_that_check() {
        let words = |check| ask(4096, 0, false).words(check);
        let list = |checks: &[u64]| checks.iter().flat_map(|&c| words(c)).collect::<Vec<u64>>();
        assert_eq!(arrived(&list(&[7, 7, 7]), 7), Arrival::All);
        // A slot of the list's earlier check (two before), or never written (zeros): not yet.
        assert_eq!(arrived(&list(&[7, 5, 7]), 7), Arrival::Waiting);
        let mut fresh = list(&[1]);
        fresh.extend([0; WORDS]);
        assert_eq!(arrived(&fresh, 1), Arrival::Waiting);
        // Words of a later check: a PE allocated or freed without this one.
        assert_eq!(arrived(&list(&[7, 9, 5]), 7), Arrival::Later(9));
        // The signal is the slot's last word, apart from the data the put carries.
        assert_eq!(SIGNAL_OFFSET + size_of::<u64>(), WORD_BYTES);
        assert_eq!(words(7)[SIGNAL_OFFSET / size_of::<u64>()], 7);
    }

    #[test]
    fn a_team_exchange_waits_for_each_members_words_of_its_own_count() {
        // Three PEs; this one (PE 1) exchanges with PEs 0 and 1 (count 3 with PE 0, 5 with
        // itself) and PE 2 is not a member: its slots are never looked at.
        let n_pes = 3;
        let (members, counts) = ([0, 1], [3, 5]);
        let mut all = vec![0u64; 2 * n_pes * WORDS];
        let put = |all: &mut Vec<u64>, pe: usize, count: u64| {
            let at = team_word(n_pes, pe, count);
            all[at..at + WORDS].copy_from_slice(&[7, 7, 7, 7, 7, count]);
        };
        assert!(!team_arrived(&all, n_pes, &members, &counts).unwrap());
        // Counts of the other parity, and earlier counts of the same parity, are not this exchange.
        put(&mut all, 0, 4);
        put(&mut all, 0, 1);
        put(&mut all, 1, 5);
        put(&mut all, 2, 9);
        assert!(!team_arrived(&all, n_pes, &members, &counts).unwrap());
        put(&mut all, 0, 3);
        assert!(team_arrived(&all, n_pes, &members, &counts).unwrap());
        // Each count has its own list: count 3 (odd) with PE 0, count 5 (odd) with PE 1.
        assert_eq!(team_word(n_pes, 0, 3), n_pes * WORDS);
        assert_eq!(team_word(n_pes, 1, 4), WORDS);
        // A member's words of a later count of the same parity: refused, not awaited.
        put(&mut all, 0, 5);
        assert!(matches!(team_arrived(&all, n_pes, &members, &counts), Err(Error::TeamCheckFailed)));
    }

    #[test]
    fn the_host_looks_often_at_first_then_at_most_every_millisecond() {
        let mut wait = Backoff::default();
        let start = std::time::Instant::now();
        for _ in 0..64 {
            wait.pause();
        }
        assert!(start.elapsed() < std::time::Duration::from_millis(500), "64 yields took {:?}", start.elapsed());
        let start = std::time::Instant::now();
        for _ in 0..20 {
            wait.pause();
        }
        // 20, 40, ... µs, then 1 ms each: at least 14 ms in all.
        assert!(start.elapsed() >= std::time::Duration::from_millis(14), "{:?}", start.elapsed());
    }

    #[test]
    fn words_of_another_check_are_refused() {
        // PE 1's slot still holds its words of check 5 (or zeros: never written), although both
        // ask alike: the PEs are out of step, whatever the words say.
        let stale: Vec<u64> = ask(4096, 0, false).words(7).into_iter().chain(ask(4096, 0, false).words(5)).collect();
        let err = Agreed::from_words(&stale).check(Op::Alloc, None).unwrap_err();
        assert!(matches!(err, Error::HeapCollectivesOutOfStep { min_check: 5, max_check: 7 }), "{err}");
        let never: Vec<u64> = ask(4096, 0, false).words(1).into_iter().chain([0; WORDS]).collect();
        let err = Agreed::from_words(&never).check(Op::Free, None).unwrap_err();
        assert!(matches!(err, Error::HeapCollectivesOutOfStep { min_check: 0, max_check: 1 }), "{err}");
    }

    #[test]
    fn one_pe_agrees_with_itself() {
        let one = combine(&[ask(4096, 256, false)]);
        assert_eq!(
            one,
            Agreed {
                min_check: 7,
                max_check: 7,
                mixed: false,
                min_bytes: 4096,
                max_bytes: 4096,
                min_align: 256,
                max_align: 256,
                min_offset: 0,
                max_offset: 0,
                refused: false
            }
        );
        assert!(one.check(Op::Alloc, None).is_ok());
        assert!(combine(&[free(64, 1 << 20, false)]).check(Op::Free, None).is_ok());
    }

    #[test]
    fn every_pe_writes_its_own_slot_of_each_list_and_nothing_else() {
        for n_pes in [1, 2, 3, 8] {
            let layouts: Vec<Layout> = (0..n_pes).map(|my_pe| Layout { my_pe, n_pes }).collect();
            let bytes = layouts[0].bytes();
            for parity in [0, 1] {
                let mut slots: Vec<usize> = layouts.iter().map(|l| l.my_slot(parity)).collect();
                // Every layout is the same buffer: sizes and lists agree across PEs.
                assert!(layouts.iter().all(|l| l.bytes() == bytes && l.list(parity) == layouts[0].list(parity)));
                // A slot per PE, in PE order, inside its list, after the outbox.
                let list = layouts[0].list(parity);
                assert_eq!(slots, (0..n_pes).map(|pe| list + pe * WORD_BYTES).collect::<Vec<_>>());
                assert!(slots.iter().all(|&s| s >= layouts[0].outbox() + WORD_BYTES && s + WORD_BYTES <= bytes));
                slots.dedup();
                assert_eq!(slots.len(), n_pes);
            }
            // The two lists do not overlap: a PE one check ahead writes the other one.
            assert_eq!(layouts[0].list(1), layouts[0].list(0) + n_pes * WORD_BYTES);
            // The team exchanges' two lists follow, with one slot per world PE, up to the end.
            for parity in [0, 1] {
                let team = layouts[0].team_list(parity);
                assert_eq!(team, layouts[0].list(1) + (1 + parity as usize) * n_pes * WORD_BYTES);
                assert!(layouts.iter().all(|l| l.team_list(parity) == team));
                assert_eq!(
                    (0..n_pes).map(|pe| layouts[0].team_slot(parity, pe)).collect::<Vec<_>>(),
                    (0..n_pes).map(|pe| team + pe * WORD_BYTES).collect::<Vec<_>>()
                );
            }
            assert_eq!(layouts[0].team_slot(1, n_pes - 1) + WORD_BYTES, bytes);
            assert_eq!(scratch_bytes(n_pes), bytes);
        }
    }
}
