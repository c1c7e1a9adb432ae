//! NVSHMEM's process state: never started, running, or finished. NVSHMEM keeps process-global
//! state and does not reset its bootstrap on finalize (NVIDIA/nvshmem#68), so one process gets
//! one runtime. The [`Runtime`](crate::Runtime) moves it along; the unique id reads it.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{Error, Result};

static STATE: AtomicU8 = AtomicU8::new(NEVER);
const NEVER: u8 = 0;
const RUNNING: u8 = 1;
const FINISHED: u8 = 2;

fn state_error(state: u8) -> Error {
    match state {
        RUNNING => Error::AlreadyInitialized,
        _ => Error::Finalized,
    }
}

/// True while NVSHMEM runs in this process (started by a [`Runtime`](crate::Runtime), neither
/// finalised nor left running by a dropped one). Stable while the lock of
/// [`unique_id::plugin`](crate::unique_id) is held: a start sets it under that lock.
pub(crate) fn running() -> bool {
    STATE.load(Ordering::Acquire) == RUNNING
}

/// Makes the process look as if a runtime runs (`true`) or never started (`false`), for unit tests
/// of what is refused meanwhile, which need no GPU.
#[cfg(test)]
pub(crate) fn pretend_running(running: bool) {
    STATE.store(if running { RUNNING } else { NEVER }, Ordering::Release);
}

/// `Ok` when NVSHMEM was never started in this process; otherwise [`Error::AlreadyInitialized`]
/// or [`Error::Finalized`].
pub(crate) fn never_started() -> Result<()> {
    match STATE.load(Ordering::Acquire) {
        NEVER => Ok(()),
        state => Err(state_error(state)),
    }
}

/// Marks NVSHMEM running, if it was never started (else the error of [`never_started`]): one
/// start wins when several race.
pub(crate) fn start() -> Result<()> {
    STATE.compare_exchange(NEVER, RUNNING, Ordering::AcqRel, Ordering::Acquire).map(drop).map_err(state_error)
}

/// After a start that failed: never started again when NVSHMEM was not entered (`entered`
/// false), else finished (NVSHMEM's state is no longer pristine).
pub(crate) fn failed_start(entered: bool) {
    STATE.store(if entered { FINISHED } else { NEVER }, Ordering::Release);
}

/// Marks NVSHMEM finished: finalised, or left running for good; it cannot start again.
pub(crate) fn finish() {
    STATE.store(FINISHED, Ordering::Release);
}
