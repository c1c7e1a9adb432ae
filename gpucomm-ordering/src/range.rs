//! Element ranges of views into the buffers both safe crates own (`MemBuffer`, `Symmetric`), and
//! how two byte ranges of device memory meet.

use std::ops::{Bound, RangeBounds};

use cudarc::driver::sys::CUdeviceptr;

/// How two byte ranges of device memory meet ([`meet`]): views taken through `&self` (NVSHMEM's
/// `Symmetric::slice`, a peer view of this PE) can hand a call's source and destination the same
/// bytes, which Rust's borrows cannot see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Meeting {
    /// No byte in common (or one range is empty).
    Apart,
    /// The same address and length: what NCCL and NVSHMEM call in place.
    Same,
    /// Some bytes in common, but not the same range.
    Partly,
}

/// True when the ranges `(address, bytes)` `a` and `b` share a byte (they do not meet
/// [`Apart`](Meeting::Apart)). Ends past the address space saturate.
#[inline]
pub fn share_a_byte(a: (CUdeviceptr, usize), b: (CUdeviceptr, usize)) -> bool {
    let end = |(addr, bytes): (CUdeviceptr, usize)| addr.saturating_add(bytes as CUdeviceptr);
    a.1 != 0 && b.1 != 0 && a.0 < end(b) && b.0 < end(a)
}

/// How the ranges `(address, bytes)` `a` and `b` meet. Ends past the address space saturate.
#[inline]
pub fn meet(a: (CUdeviceptr, usize), b: (CUdeviceptr, usize)) -> Meeting {
    if !share_a_byte(a, b) {
        Meeting::Apart
    } else if a == b {
        Meeting::Same
    } else {
        Meeting::Partly
    }
}

/// Resolves `range` against a buffer of `len` elements to `(start, end)`.
///
/// `Err` carries the resolved `(start, end)` when the range is reversed or ends past `len`, for
/// the caller's error message. Inclusive ends saturate, so `..=usize::MAX` is refused, not wrapped.
pub fn resolve(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize), (usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start <= end && end <= len {
        Ok((start, end))
    } else {
        Err((start, end))
    }
}

#[cfg(test)]
mod tests {
    use super::{meet, resolve, share_a_byte, Meeting};

    #[test]
    fn ranges_meet_apart_the_same_or_partly() {
        assert_eq!(meet((0, 8), (8, 8)), Meeting::Apart, "adjacent");
        assert_eq!(meet((16, 8), (0, 16)), Meeting::Apart, "adjacent, other order");
        assert_eq!(meet((0, 0), (0, 8)), Meeting::Apart, "empty");
        assert_eq!(meet((4, 8), (4, 0)), Meeting::Apart, "empty at the same address");
        assert_eq!(meet((64, 32), (64, 32)), Meeting::Same);
        assert_eq!(meet((64, 32), (64, 16)), Meeting::Partly, "same start, shorter");
        assert_eq!(meet((0, 16), (8, 16)), Meeting::Partly);
        assert_eq!(meet((8, 16), (0, 16)), Meeting::Partly, "other order");
        assert_eq!(meet((0, 64), (16, 8)), Meeting::Partly, "inside");
        assert_eq!(meet((u64::MAX - 4, 16), (u64::MAX - 1, 1)), Meeting::Partly, "saturated end");
        assert!(share_a_byte((0, 16), (15, 1)) && !share_a_byte((0, 16), (16, 1)) && !share_a_byte((0, 0), (0, 0)));
    }

    #[test]
    fn ranges_resolve_or_name_their_bounds() {
        assert_eq!(resolve(.., 8), Ok((0, 8)));
        assert_eq!(resolve(2..5, 8), Ok((2, 5)));
        assert_eq!(resolve(2..=7, 8), Ok((2, 8)));
        assert_eq!(resolve(8.., 8), Ok((8, 8)));
        assert_eq!(resolve(5..20, 16), Err((5, 20)));
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 6..4;
        assert_eq!(resolve(reversed, 16), Err((6, 4)));
        assert_eq!(resolve(..=usize::MAX, 16), Err((0, usize::MAX)));
    }
}
