//! The overlaps NVSHMEM leaves undefined (OpenSHMEM 1.5): a reduction's source and destination
//! must be the same range or disjoint; the other collectives', a put's or get's source and
//! destination, and a signal and the data it announces, must be disjoint.
//!
//! Two views of one symmetric buffer (`buf.slice(..)`, taken through `&self`) can name
//! overlapping ranges, so every call checks its ranges here before NVSHMEM sees them. A put or get
//! that reaches the other PE's memory through a load/store mapping (its own PE, or a peer over
//! NVLink) is checked against that mapping (`nvshmem_ptr`), since a local source there can be
//! the very memory the put writes. One that does not, reaching the other PE over a network
//! transport, asks instead whether its local buffer lies on this PE's heap ([`on_my_heap`]).

use std::ffi::c_void;

use cudarc::driver::sys::CUdeviceptr;
use gpucomm_ordering::range::{self, Meeting};

use crate::error::{Error, Result};
use crate::ffi::call;

/// A range of device memory: its address and length in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) what: &'static str,
    pub(crate) addr: CUdeviceptr,
    pub(crate) bytes: usize,
}

impl Span {
    pub(crate) fn new(what: &'static str, addr: CUdeviceptr, bytes: usize) -> Self {
        Span { what, addr, bytes }
    }

    fn meet(&self, other: &Span) -> Meeting {
        range::meet((self.addr, self.bytes), (other.addr, other.bytes))
    }

    /// True when every byte of the range lies in `outer` (and neither runs past the end of the
    /// address space).
    pub(crate) fn lies_in(&self, outer: &Span) -> bool {
        let end = |s: &Span| s.addr.checked_add(s.bytes as CUdeviceptr);
        matches!((end(self), end(outer)), (Some(e), Some(o)) if outer.addr <= self.addr && e <= o)
    }
}

/// `Ok` when the ranges share no byte.
pub(crate) fn disjoint(a: Span, b: Span) -> Result<()> {
    if range::share_a_byte((a.addr, a.bytes), (b.addr, b.bytes)) {
        Err(Error::Overlap { first: a.what, second: b.what, needed: "disjoint" })
    } else {
        Ok(())
    }
}

/// `Ok` when the ranges share no byte or are the same range (what reductions allow).
pub(crate) fn disjoint_or_identical(a: Span, b: Span) -> Result<()> {
    if a.meet(&b) == Meeting::Partly {
        Err(Error::Overlap { first: a.what, second: b.what, needed: "disjoint or identical" })
    } else {
        Ok(())
    }
}

/// The range `span` of symmetric memory names on PE `pe`, as this PE addresses it through a
/// load/store mapping (`nvshmem_ptr`): `None` when `pe`'s memory is not mapped here (then no
/// local range can be part of it, nor can an empty range).
#[inline]
pub(crate) fn on_pe(span: Span, pe: i32) -> Result<Option<Span>> {
    if span.bytes == 0 {
        // Zero-element calls are allowed; an empty range overlaps nothing, and its address need
        // not lie inside an allocation.
        return Ok(None);
    }
    // SAFETY: `span.addr` lies inside a live symmetric allocation (the callers pass their
    // symmetric argument) and `pe` was checked in range; nvshmem_ptr only computes an address.
    let mapped = unsafe { call!(nvshmem_ptr(span.addr as *const c_void, pe)) }?;
    Ok((!mapped.is_null()).then_some(Span { addr: mapped as CUdeviceptr, ..span }))
}

/// True when every byte of `span` lies on the symmetric heap of this PE, `my_pe`: on its own PE
/// `nvshmem_ptr` gives back an address of the heap and null for any other, and the heap is one
/// range, so its first and last byte tell.
pub(crate) fn on_my_heap(span: Span, my_pe: i32) -> Result<bool> {
    let last = span.addr.saturating_add(span.bytes.saturating_sub(1) as CUdeviceptr);
    for addr in [span.addr, last] {
        // SAFETY: nvshmem_ptr only computes an address (null for one outside the heap, which may
        // be any address); `my_pe` is this PE's number.
        let mapped = unsafe { call!(nvshmem_ptr(addr as *const c_void, my_pe)) }?;
        if mapped.is_null() {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_overlap_when_they_share_a_byte() {
        let s = |addr, bytes| Span::new("x", addr, bytes);
        assert!(disjoint(s(0, 8), s(8, 8)).is_ok(), "adjacent");
        assert!(disjoint(s(16, 8), s(0, 16)).is_ok(), "adjacent, other order");
        assert!(disjoint(s(0, 0), s(0, 8)).is_ok(), "empty");
        let err = disjoint(Span::new("destination", 0, 16), Span::new("source", 8, 16)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the destination and the source overlap, which NVSHMEM leaves undefined: they must be disjoint"
        );
        assert!(disjoint(s(0, 16), s(4, 4)).is_err(), "inside");
        assert!(disjoint(s(0, 16), s(0, 16)).is_err(), "identical");
        assert!(disjoint_or_identical(s(0, 16), s(0, 16)).is_ok());
        assert!(disjoint_or_identical(s(0, 16), s(16, 16)).is_ok());
        let err = disjoint_or_identical(s(0, 16), s(4, 16)).unwrap_err();
        assert!(err.to_string().ends_with("they must be disjoint or identical"), "{err}");
        assert!(disjoint(s(u64::MAX - 4, 8), s(0, 8)).is_ok(), "no wrap-around");
    }

    #[test]
    fn a_range_lies_in_another_when_every_byte_does() {
        let s = |addr, bytes| Span::new("x", addr, bytes);
        assert!(s(16, 8).lies_in(&s(16, 8)), "itself");
        assert!(s(20, 4).lies_in(&s(16, 8)), "its tail");
        assert!(!s(20, 8).lies_in(&s(16, 8)), "past the end");
        assert!(!s(12, 8).lies_in(&s(16, 8)), "before the start");
        assert!(!s(u64::MAX - 4, 8).lies_in(&s(u64::MAX - 8, 8)), "past the address space");
    }
}
