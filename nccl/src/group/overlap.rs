//! The calls of one group run together, so no call of a group may write bytes that another of
//! its calls reads or writes. The group's borrows keep one buffer from being passed as `&` to one
//! call and `&mut` to another, but views taken through `&self` (`nvshmem`'s `Symmetric::slice`, a
//! framework's tensors) can name the same memory in two calls: [`clash`] finds such a pair before
//! anything is issued.

use cudarc::driver::sys::CUdeviceptr;
use gpucomm_ordering::range::{self, Meeting};

/// Bytes that one call of a group reads, or writes: `addr..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    addr: CUdeviceptr,
    end: CUdeviceptr,
    /// The call's index in the group, and whether it writes the bytes.
    call: u32,
    writes: bool,
}

/// Adds the ranges (address, bytes) that call `call` reads and writes, either possibly empty. The
/// two ranges of a call may meet only in NCCL's in-place form (each call checked that): they are
/// then one written range, so that no two spans of one call overlap.
/// A read of the very range an earlier call reads (one buffer sent to several peers) is left out:
/// whatever clashes with it clashes with the earlier one.
pub(crate) fn add(spans: &mut Vec<Span>, call: usize, read: (CUdeviceptr, usize), write: (CUdeviceptr, usize)) {
    // Groups hold far fewer than 2^32 calls (each is a recorded NCCL call and its guards).
    let call = call as u32;
    let span = |(addr, bytes): (CUdeviceptr, usize), writes| Span {
        addr,
        end: addr.saturating_add(bytes as CUdeviceptr),
        call,
        writes,
    };
    match range::meet(read, write) {
        Meeting::Apart => {
            let read = span(read, false);
            let again = |s: &Span| !s.writes && (s.addr, s.end) == (read.addr, read.end);
            if read.end > read.addr && !spans.iter().rev().take(2).any(again) {
                spans.push(read);
            }
            if write.1 > 0 {
                spans.push(span(write, true));
            }
        }
        Meeting::Same | Meeting::Partly => {
            let (read, write) = (span(read, false), span(write, true));
            spans.push(Span { addr: read.addr.min(write.addr), end: read.end.max(write.end), call, writes: true });
        }
    }
}

/// Two calls (their indices, the lower first) of which one writes bytes the other reads or writes,
/// if the group has such a pair. Sorts `spans` by address: the spans before each one in that order
/// that reach past its start are the ones it overlaps, so the furthest end of the written ones, and
/// of all, tell whether it clashes (no two spans of one call overlap: see [`add`]). Sorting costs
/// fewer instructions than comparing every pair even in groups of 16 calls.
pub(crate) fn clash(spans: &mut [Span]) -> Option<(usize, usize)> {
    spans.sort_unstable_by_key(|s| s.addr);
    // The furthest end of the written spans so far and of all, with the call of each (0: none).
    let (mut written, mut any) = ((0, 0), (0, 0));
    for s in spans.iter() {
        let other = if written.0 > s.addr {
            Some(written.1)
        } else if s.writes && any.0 > s.addr {
            Some(any.1)
        } else {
            None
        };
        if let Some(other) = other {
            return Some((other.min(s.call) as usize, other.max(s.call) as usize));
        }
        if s.writes && s.end > written.0 {
            written = (s.end, s.call);
        }
        if s.end > any.0 {
            any = (s.end, s.call);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{add, clash, Span};

    /// A call's read and written ranges, (address, bytes) each.
    type Ranges = ((u64, usize), (u64, usize));

    fn group(calls: &[Ranges]) -> Option<(usize, usize)> {
        let mut spans: Vec<Span> = Vec::new();
        for (i, &(read, write)) in calls.iter().enumerate() {
            add(&mut spans, i, read, write);
        }
        clash(&mut spans)
    }

    #[test]
    fn a_call_that_writes_what_another_uses_clashes() {
        // Sends of one buffer to several peers only read it.
        assert_eq!(group(&[((0, 64), (0, 0)), ((0, 64), (0, 0)), ((0, 0), (64, 64))]), None);
        // …but a receive into them clashes with the first of those sends.
        assert_eq!(group(&[((0, 64), (0, 0)), ((0, 64), (0, 0)), ((0, 0), (32, 8))]), Some((0, 2)));
        // A receive into bytes another call sends.
        assert_eq!(group(&[((0, 64), (0, 0)), ((0, 0), (32, 64))]), Some((0, 1)));
        assert_eq!(group(&[((0, 0), (32, 64)), ((0, 64), (0, 0))]), Some((0, 1)), "the writer first");
        // Two writes of one byte.
        assert_eq!(group(&[((1000, 8), (0, 8)), ((2000, 8), (7, 8))]), Some((0, 1)));
        // Adjacent ranges share nothing.
        assert_eq!(group(&[((0, 0), (0, 64)), ((64, 64), (0, 0)), ((0, 0), (128, 8))]), None);
        // An in-place call's own ranges (an all-gather's block inside its receive buffer) do not
        // clash with each other, but with a third call reading the receive buffer they do.
        assert_eq!(group(&[((16, 16), (0, 64))]), None);
        assert_eq!(group(&[((16, 16), (0, 64)), ((100, 4), (200, 4)), ((60, 4), (0, 0))]), Some((0, 2)));
        // A long read span ahead keeps reaching: a write far past a short one's end still clashes.
        assert_eq!(group(&[((0, 1000), (5000, 8)), ((10, 4), (6000, 8)), ((0, 0), (500, 8))]), Some((0, 2)));
        // A long write ahead: a later read inside it clashes, whichever call came first.
        assert_eq!(group(&[((0, 0), (0, 1000)), ((10, 4), (2000, 4)), ((900, 4), (3000, 4))]), Some((0, 1)));
    }
}
