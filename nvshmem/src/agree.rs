//! Making sure every PE makes the same collective allocation before NVSHMEM allocates.
//!
//! `nvshmem_malloc` and its variants trust every PE to ask for the same size (and alignment): a
//! PE that asks for another one leaves the symmetric heaps out of step, so that every later
//! buffer sits at another offset on that PE and puts land in the wrong place — silently. And a PE
//! that refuses its part locally (its heap limit, a zero size) while the others call NVSHMEM
//! leaves them waiting in its barrier. So before each allocation the PEs combine what they ask for
//! — size, alignment, and whether they refused — with one max-reduction (`nvshmemx_uint64_max_
//! reduce_on_stream`, each value also negated to get the minimum), and every PE decides the same.
//!
//! The reduction runs on a team of all PEs made for it alone (so it never shares NVSHMEM's
//! per-team synchronisation state with a collective the caller has in flight on the world team),
//! on a private stream, in a small symmetric scratch buffer allocated when the runtime starts.
//! NVSHMEM frees the scratch and the team when it is finalised.

use std::ffi::c_void;
use std::ptr::NonNull;

use cudarc::driver::{result, sys::CUdeviceptr, sys::CUstream};
use nvshmem_sys::{nvshmem_team_id_t, nvshmem_team_t};

use crate::error::{Error, Result, Status};
use crate::ffi::call;
use crate::ops::{Max, ReduceOp};

/// Values exchanged per allocation: bytes, !bytes, alignment, !alignment, refused.
const WORDS: usize = 5;

/// What one PE asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ask {
    /// Bytes (ignored when refused).
    pub(crate) bytes: u64,
    /// Alignment in bytes, 0 for NVSHMEM's default.
    pub(crate) align: u64,
    /// This PE refused the allocation before asking NVSHMEM.
    pub(crate) refused: bool,
}

/// What the PEs asked for together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Agreed {
    pub(crate) min_bytes: u64,
    pub(crate) max_bytes: u64,
    pub(crate) min_align: u64,
    pub(crate) max_align: u64,
    /// Some PE refused.
    pub(crate) refused: bool,
}

impl Ask {
    fn words(self) -> [u64; WORDS] {
        let bytes = if self.refused { 0 } else { self.bytes };
        [bytes, !bytes, self.align, !self.align, u64::from(self.refused)]
    }
}

impl Agreed {
    fn from_max(max: [u64; WORDS]) -> Self {
        Agreed { max_bytes: max[0], min_bytes: !max[1], max_align: max[2], min_align: !max[3], refused: max[4] != 0 }
    }

    /// `Ok` when every PE asked for the same allocation; `local` is this PE's own refusal, if any.
    pub(crate) fn check(self, local: Option<Error>) -> Result<()> {
        if self.refused {
            return Err(local.unwrap_or(Error::PeerRefusedAlloc));
        }
        if self.min_bytes != self.max_bytes || self.min_align != self.max_align {
            return Err(Error::AsymmetricAlloc {
                min_bytes: self.min_bytes,
                max_bytes: self.max_bytes,
                min_align: self.min_align,
                max_align: self.max_align,
            });
        }
        Ok(())
    }
}

/// The team, stream and scratch buffer of the allocation checks.
pub(crate) struct Agreement {
    team: nvshmem_team_t,
    scratch: NonNull<c_void>,
    stream: CUstream,
}

// SAFETY: the scratch pointer is device memory that NVSHMEM owns, with no tie to a thread, and
// the stream handle can be used from any thread whose current context is the PE's (`agree`'s
// callers bind it). The runtime that holds the agreement is `Send` but not `Sync`: one thread at a
// time uses it, which is NVSHMEM's `NVSHMEM_THREAD_SERIALIZED`.
unsafe impl Send for Agreement {}

impl Agreement {
    /// Sets up the checks. Collective over all `n_pes` PEs (a team split and a symmetric
    /// allocation, the same on every PE); NVSHMEM must be running and the PE's context current.
    pub(crate) fn new(n_pes: usize) -> Result<Self> {
        let world = nvshmem_team_id_t::NVSHMEM_TEAM_WORLD.0;
        let mut team = nvshmem_team_id_t::NVSHMEM_TEAM_INVALID.0;
        let n = i32::try_from(n_pes).map_err(|_| Error::InvalidPeCount { got: n_pes })?;
        // SAFETY: NVSHMEM is running (the caller's contract); start 0, stride 1 and `n` PEs
        // describe the whole world team; no configuration (mask 0); `team` is a live local.
        unsafe { call!(nvshmem_team_split_strided(world, 0, 1, n, std::ptr::null(), 0, &mut team)) }?;
        if team == nvshmem_team_id_t::NVSHMEM_TEAM_INVALID.0 {
            // Every PE is a member, so NVSHMEM hands every PE the new team or fails.
            return Err(Error::Status { call: "nvshmem_team_split_strided", status: Status(7) });
        }
        let bytes = 2 * WORDS * size_of::<u64>();
        // SAFETY: NVSHMEM is running and the PE's context current (the caller's contract); every
        // PE allocates the same size here, at the same point of its start-up.
        let scratch = unsafe { call!(nvshmem_malloc(bytes)) }?;
        let scratch = NonNull::new(scratch).ok_or(Error::OutOfMemory { bytes })?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)?;
        Ok(Agreement { team, scratch, stream })
    }

    /// What all PEs ask for, given what this one asks for. Collective over all PEs, in the order
    /// of their allocations; blocks until every PE has asked. The PE's context must be current.
    pub(crate) fn agree(&self, ask: Ask) -> Result<Agreed> {
        let src = self.scratch.as_ptr() as CUdeviceptr;
        let dst = src + (WORDS * size_of::<u64>()) as CUdeviceptr;
        let words = ask.words();
        let mut max = [0u64; WORDS];
        // SAFETY: `src` and `dst` are two disjoint ranges of WORDS u64 in the symmetric scratch
        // buffer, which only this function uses, one call at a time (`Runtime` is not `Sync`, and
        // the stream is synchronised before returning, so no earlier copy or reduction is still
        // running); `words` and `max` outlive the synchronisation; the stream is this context's;
        // every PE reduces over the same team in the same order (allocation is collective).
        unsafe {
            result::memcpy_htod_async(src, &words, self.stream)?;
            <Max as ReduceOp<u64>>::reduce(Max, self.team, dst, src, WORDS, self.stream as nvshmem_sys::cudaStream_t)?;
            result::memcpy_dtoh_async(&mut max, dst, self.stream)?;
            result::stream::synchronize(self.stream)?;
        }
        Ok(Agreed::from_max(max))
    }

    /// Destroys the private stream (idle: every use is synchronised). The team and the scratch
    /// buffer are NVSHMEM's to free when it finalises.
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

    fn combine(asks: &[Ask]) -> Agreed {
        let mut max = [0u64; WORDS];
        for ask in asks {
            for (m, w) in max.iter_mut().zip(ask.words()) {
                *m = (*m).max(w);
            }
        }
        Agreed::from_max(max)
    }

    #[test]
    fn every_pe_reaches_the_same_verdict() {
        let ask = |bytes, align, refused| Ask { bytes, align, refused };
        assert!(combine(&[ask(4096, 0, false), ask(4096, 0, false)]).check(None).is_ok());
        let err = combine(&[ask(4096, 0, false), ask(8192, 0, false)]).check(None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the PEs asked for different symmetric allocations (4096…8192 bytes, alignment 0…0); nothing was allocated on any PE"
        );
        let err = combine(&[ask(4096, 0, false), ask(4096, 256, false)]).check(None).unwrap_err();
        assert!(matches!(err, Error::AsymmetricAlloc { min_align: 0, max_align: 256, .. }), "{err}");
        // A PE that refused keeps its own error; the others learn that a peer refused.
        let refused = combine(&[ask(4096, 0, false), ask(0, 0, true)]);
        assert!(matches!(refused.check(None), Err(Error::PeerRefusedAlloc)));
        let own = Error::ZeroSize { len: 0, elem_size: 4 };
        assert!(matches!(refused.check(Some(own)), Err(Error::ZeroSize { .. })));
    }
}
