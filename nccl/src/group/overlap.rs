//! The calls of one group run together, so no call of a group may write bytes that another of
//! its calls reads or writes. The group's borrows keep one buffer from being passed as `&` to one
//! call and `&mut` to another, but views taken through `&self` (`nvshmem`'s `Symmetric::slice`, a
//! framework's tensors) can name the same memory in two calls: [`clash`] finds such a pair before
//! anything is issued.

use cudarc::driver::sys::CUdeviceptr;
use gpucomm_ordering::range::{self, Meeting};

/// Bytes that one call of a group reads, or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    addr: CUdeviceptr,
    bytes: usize,
    writes: bool,
    /// The call's index in the group.
    call: usize,
}

impl Span {
    fn end(&self) -> CUdeviceptr {
        self.addr.saturating_add(self.bytes as CUdeviceptr)
    }
}

/// Adds the ranges (address, bytes) that call `call` reads and writes, either possibly empty. The
/// two ranges of a call may meet only in NCCL's in-place form (each call checked that): they are
/// then one written range, so that no two spans of one call overlap.
pub(crate) fn add(spans: &mut Vec<Span>, call: usize, read: (CUdeviceptr, usize), write: (CUdeviceptr, usize)) {
    let span = |(addr, bytes): (CUdeviceptr, usize), writes| Span { addr, bytes, writes, call };
    match range::meet(read, write) {
        Meeting::Apart => {
            spans.extend([span(read, false), span(write, true)].into_iter().filter(|s| s.bytes > 0));
        }
        Meeting::Same | Meeting::Partly => {
            let addr = read.0.min(write.0);
            let end = span(read, false).end().max(span(write, true).end());
            spans.push(span((addr, (end - addr) as usize), true));
        }
    }
}

/// Two calls (their indices, the lower first) of which one writes bytes the other reads or writes,
/// if the group has such a pair. Sorts `spans` by address: the spans before each one in that order
/// that reach past its start are the ones it overlaps, so the furthest end of the written ones, and
/// of all, tell whether it clashes (no two spans of one call overlap: see [`add`]).
pub(crate) fn clash(spans: &mut [Span]) -> Option<(usize, usize)> {
    spans.sort_unstable_by_key(|s| s.addr);
    let mut written: Option<Span> = None;
    let mut any: Option<Span> = None;
    for s in spans.iter() {
        let reaches = |p: &Option<Span>| p.filter(|p| p.end() > s.addr);
        if let Some(p) = reaches(&written).or_else(|| reaches(&any).filter(|_| s.writes)) {
            return Some((p.call.min(s.call), p.call.max(s.call)));
        }
        let further = |p: Option<Span>| p.filter(|p| p.end() >= s.end()).or(Some(*s));
        if s.writes {
            written = further(written);
        }
        any = further(any);
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
