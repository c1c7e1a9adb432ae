//! Waiting outside NCCL, abortable: [`Comm::parked`], and the bounded waits of teardown
//! ([`Comm::wait_parked`]).

#[cfg(nccl_2_19)]
use std::time::{Duration, Instant};

use super::health::Health;
use super::Comm;
use crate::error::Result;

/// Parks a communicator for as long as it lives; unparks when left or dropped (a panic in the
/// parked code included).
struct Parked<'a>(Option<&'a Health>);

impl<'a> Parked<'a> {
    fn enter(health: &'a Health) -> Result<Self> {
        health.park()?;
        Ok(Parked(Some(health)))
    }

    fn leave(mut self) -> Result<()> {
        self.0.take().map_or(Ok(()), Health::unpark)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        if let Some(health) = self.0.take() {
            // Nothing to report to while unwinding; an abort meanwhile shows at the next call.
            let _ = health.unpark();
        }
    }
}

impl Comm {
    /// Runs `wait` — host code that blocks on the GPU: a stream synchronize, a copy to the host,
    /// a framework reading a loss (`tensor.to_scalar()`) — with the communicator *parked*: known
    /// to be outside NCCL, so that an [`AbortHandle`](crate::AbortHandle) or a
    /// [`Watchdog`](crate::Watchdog) may abort it at once, which frees the stream a hung
    /// collective blocks, and `wait` returns. Without it a thread blocked there is out of every
    /// watchdog's reach (NCCL forbids aborting a communicator while a thread may be inside another
    /// NCCL call on it, and outside this crate that cannot be known).
    ///
    /// `&mut self`: `wait` cannot use this communicator. `Ok` with what `wait` returned, or
    /// [`Error::Aborted`](crate::Error::Aborted) when the communicator was aborted before or
    /// while it waited (whatever `wait` returned then is dropped).
    pub fn parked<R>(&mut self, wait: impl FnOnce() -> R) -> Result<R> {
        let parked = Parked::enter(&self.health)?;
        let value = wait();
        parked.leave()?;
        Ok(value)
    }

    /// Waits parked, as [`Comm::parked`] does, for work that this communicator does not track as
    /// a whole — a buffer's uses before it is deregistered — bounded like the communicator's own
    /// waits. `wait(bound)` waits at most `bound` (`None`: until done) and says whether the work
    /// has finished; it runs parked, so an [`AbortHandle`](crate::AbortHandle) or a
    /// [`Watchdog`](crate::Watchdog) may abort the communicator meanwhile (which stops its
    /// kernels, and so ends a wait for work stuck behind a dead peer), and calls on this
    /// communicator from inside it are refused with [`Error::Aborted`](crate::Error::Aborted)
    /// before reaching NCCL. It is called again until the work has finished or a bound is
    /// reached: `timeout` from now, or the time at which this communicator's oldest unfinished
    /// call becomes overdue ([`Config::timeout`](crate::Config::timeout), counted from its
    /// enqueue).
    ///
    /// `Ok(true)` once the work has finished, `Ok(false)` when `timeout` expired first;
    /// [`Error::Timeout`](crate::Error::Timeout) when one of this communicator's calls is overdue,
    /// which aborts it (as in [`Comm::wait`]); [`Error::Aborted`](crate::Error::Aborted) when it
    /// was aborted before or meanwhile (what `wait` returned then is dropped).
    #[cfg(nccl_2_19)]
    pub(crate) fn wait_parked(
        &self,
        timeout: Option<Duration>,
        mut wait: impl FnMut(Option<Duration>) -> Result<bool>,
    ) -> Result<bool> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            let next = self.watch.borrow_mut().next_due()?;
            let due = match next {
                Some((due, late)) if Instant::now() >= due => return Err(self.time_out(late.call, late.after)),
                next => next.map(|(due, _)| due),
            };
            let until = deadline.into_iter().chain(due).min();
            let parked = Parked::enter(&self.health)?;
            let done = wait(until.map(|at| at.saturating_duration_since(Instant::now())));
            parked.leave()?;
            if done? {
                return Ok(true);
            }
            if deadline.is_some_and(|at| Instant::now() >= at) {
                return Ok(false);
            }
        }
    }
}
