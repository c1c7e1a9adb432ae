//! [`Deadline`]: one time limit for a whole message or operation, however its bytes arrive.

use std::time::{Duration, Instant};

/// A point in time and the limit it was made from (for error messages). Every read and write
/// recomputes the time left from it, so a peer that trickles bytes cannot stretch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadline {
    at: Instant,
    limit: Duration,
}

impl Deadline {
    /// `limit` from now. A limit beyond what an `Instant` holds (`Duration::MAX`: wait for ever)
    /// is taken as [`FOREVER`] (over a century), never as now.
    pub(crate) fn after(limit: Duration) -> Deadline {
        let now = Instant::now();
        Deadline { at: later(now, limit).unwrap_or_else(|| later(now, FOREVER).unwrap_or(now)), limit }
    }

    /// The time left, or `None` once it has passed.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        let left = self.at.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    /// True once the deadline has passed.
    pub(crate) fn passed(&self) -> bool {
        self.remaining().is_none()
    }

    /// The limit this deadline was made from.
    pub(crate) fn limit(&self) -> Duration {
        self.limit
    }

    /// Whichever of the two comes first.
    pub(crate) fn min(self, other: Deadline) -> Deadline {
        if other.at < self.at {
            other
        } else {
            self
        }
    }

    /// At most `slice` from now, and never after this deadline.
    pub(crate) fn slice(self, slice: Duration) -> Deadline {
        self.min(Deadline::after(slice))
    }
}

/// What a deadline of a longer limit than an `Instant` holds waits: 2^32 s, about 136 years.
const FOREVER: Duration = Duration::from_secs(1 << 32);

/// `limit` after `t`, or `None` (never) where an `Instant` cannot hold it.
pub(crate) fn later(t: Instant, limit: Duration) -> Option<Instant> {
    t.checked_add(limit)
}

/// A duration for messages: `3s`, `2.5s`, `0.25s`.
pub(crate) fn secs(d: Duration) -> String {
    format!("{}s", (d.as_secs_f64() * 1000.0).round() / 1000.0)
}
