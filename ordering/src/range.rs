//! Element ranges of views into the buffers both safe crates own (`MemBuffer`, `Symmetric`).

use std::ops::{Bound, RangeBounds};

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
    use super::resolve;

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
