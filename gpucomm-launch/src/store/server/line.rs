//! The line of one address's connections reading requests longer than their allowance, oldest
//! first: a connection sets its address's share of the budget aside for its request only while
//! what the connections ahead of it may still need fits beside it, so the first in line can
//! finish its request within the share.

use std::collections::BTreeMap;

/// A connection's place in the [`Line`], for one of its requests.
#[derive(Clone, Copy)]
pub(super) struct Place {
    seq: u64,
    request: u64,
}

impl Place {
    /// Which of its connection's requests it is for ([`Conn::served`](super::Conn) when taken).
    pub(super) fn request(self) -> u64 {
        self.request
    }
}

/// The connections reading beyond their allowance, in the order they began to.
#[derive(Default)]
pub(super) struct Line {
    order: BTreeMap<u64, u64>,
    next: u64,
}

impl Line {
    /// Puts connection `id`, for its request `request`, at the back.
    pub(super) fn join(&mut self, id: u64, request: u64) -> Place {
        let place = Place { seq: self.next, request };
        self.next += 1;
        self.order.insert(place.seq, id);
        place
    }

    /// Takes a place out of the line.
    pub(super) fn leave(&mut self, place: Place) {
        self.order.remove(&place.seq);
    }

    /// True when no connection is in line.
    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The connections ahead of `place` (every one in line for `None`).
    pub(super) fn ahead(&self, place: Option<Place>) -> impl Iterator<Item = u64> + '_ {
        self.order.range(..place.map_or(u64::MAX, |p| p.seq)).map(|(_, &id)| id)
    }
}
