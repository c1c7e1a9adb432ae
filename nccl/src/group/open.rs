//! Whether a [`group`](crate::group) is open on this thread, and the one precondition every call
//! that a group would only record makes: [`refuse_inside`].

use std::cell::Cell;

use crate::error::{Error, Result};

thread_local! {
    static OPEN: Cell<bool> = const { Cell::new(false) };
    /// Direct calls refused because a group was open, since the group opened.
    static REFUSED_INSIDE: Cell<usize> = const { Cell::new(0) };
}

/// True while this thread runs the closure of a [`group`](crate::group).
#[inline]
pub(crate) fn is_open() -> bool {
    OPEN.with(Cell::get)
}

/// `Ok` outside a group; inside one, [`Error::InsideGroup`], counted as a refused call of the open
/// group (so that it launches nothing, even if the closure ignores the error). For every call that
/// a group would only record instead of carrying out, while this crate needs it done (or its
/// result) at once: direct collectives, communicator creation, window registration, capture, a
/// nested group. (Teardown that hands its communicator back uses [`refuse_teardown_inside`].)
#[inline]
pub(crate) fn refuse_inside() -> Result<()> {
    if !is_open() {
        return Ok(());
    }
    REFUSED_INSIDE.with(|r| r.set(r.get() + 1));
    Err(Error::InsideGroup)
}

/// `Ok` outside a group; inside one, [`Error::InsideGroup`] *without* counting against the open
/// group: for teardown that consumes its object and hands it back with the error
/// ([`Comm::finalize`](crate::Comm::finalize), [`Comm::start_finalize`](crate::Comm::start_finalize)).
/// Nothing is lost that way: the caller gets the communicator back, the group's recorded calls are
/// untouched, and the closure decides (its value carries the communicator out of the group).
/// Counted, the refusal would make the group fail with [`Error::GroupRefused`] and drop the
/// closure's value — the very communicator handed back.
pub(crate) fn refuse_teardown_inside() -> Result<()> {
    if is_open() {
        Err(Error::InsideGroup)
    } else {
        Ok(())
    }
}

/// Marks the group open for the closure's run, and closed again on every path out (panics too).
pub(super) struct Open;

impl Open {
    pub(super) fn enter() -> Self {
        OPEN.with(|o| o.set(true));
        REFUSED_INSIDE.with(|r| r.set(0));
        Open
    }

    /// Direct calls refused while the group was open.
    pub(super) fn refused(&self) -> usize {
        REFUSED_INSIDE.with(Cell::get)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        OPEN.with(|o| o.set(false));
    }
}
