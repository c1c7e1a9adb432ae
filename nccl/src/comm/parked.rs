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
        within(
            deadline,
            || self.watch.borrow_mut().next_due(),
            |late| self.time_out(late.call, late.after),
            |bound| {
                let parked = Parked::enter(&self.health)?;
                let done = wait(bound);
                parked.leave()?;
                done
            },
        )
    }
}

/// The loop of [`Comm::wait_parked`]: calls `wait(bound)` until it says the work has finished,
/// each time bounded by `deadline` and by the due time of the oldest unfinished call
/// (`next_due`). An overdue call wins over the deadline — `overdue` turns it into the error —
/// whenever both have passed by the time a wait returns: the deadline is taken when the wait
/// begins, a call enqueued just before it is due a few microseconds earlier, and a wait bounded
/// by that due time returns after both. The deadline is looked at only after one wait, so that a
/// zero timeout still asks once whether the work has finished.
#[cfg(nccl_2_19)]
fn within<L>(
    deadline: Option<Instant>,
    mut next_due: impl FnMut() -> Result<Option<(Instant, L)>>,
    overdue: impl FnOnce(L) -> crate::Error,
    mut wait: impl FnMut(Option<Duration>) -> Result<bool>,
) -> Result<bool> {
    let mut waited = false;
    loop {
        let due = match next_due()? {
            Some((due, late)) if Instant::now() >= due => return Err(overdue(late)),
            next => next.map(|(due, _)| due),
        };
        if waited && deadline.is_some_and(|at| Instant::now() >= at) {
            return Ok(false);
        }
        let until = deadline.into_iter().chain(due).min();
        if wait(until.map(|at| at.saturating_duration_since(Instant::now())))? {
            return Ok(true);
        }
        waited = true;
    }
}

#[cfg(all(test, nccl_2_19))]
mod tests {
    use super::*;
    use crate::Error;

    fn timed_out(call: &'static str) -> Error {
        Error::Timeout { what: call, after: Duration::from_millis(20) }
    }

    /// The teardown of a registration behind a dead peer: the hung call is due a little before
    /// the wait's own deadline, and the wait bounded by it returns after both. Before, the
    /// deadline was looked at first: `Ok(false)` (the buffer still in use, the communicator left
    /// running) instead of the timeout that aborts it.
    #[test]
    fn an_overdue_call_wins_over_the_deadline() {
        // Due in a second, so that the call is not overdue before the one wait starts (due in
        // 20 ms, a thread preempted that long returned the timeout at once, without waiting).
        let start = Instant::now();
        let due = start + Duration::from_secs(1);
        let deadline = Some(due + Duration::from_micros(5));
        let mut bounds = Vec::new();
        let got = within(
            deadline,
            || Ok(Some((due, "ncclAllReduce"))),
            timed_out,
            |bound| {
                bounds.push(bound);
                std::thread::sleep(bound.unwrap_or_default() + Duration::from_millis(1));
                Ok(false)
            },
        );
        assert!(matches!(got, Err(Error::Timeout { what: "ncclAllReduce", .. })), "{got:?}");
        assert_eq!(bounds.len(), 1, "one wait, bounded by the due time: {bounds:?}");
        assert!(bounds[0].is_some_and(|b| b <= Duration::from_secs(1)), "{bounds:?}");
    }

    #[test]
    fn the_deadline_ends_a_wait_with_nothing_overdue() {
        let deadline = Some(Instant::now() + Duration::from_millis(10));
        let mut waits = 0;
        let got = within(
            deadline,
            || Ok(None::<(Instant, &str)>),
            timed_out,
            |bound| {
                waits += 1;
                std::thread::sleep(bound.unwrap_or_default());
                Ok(false)
            },
        );
        assert!(matches!(got, Ok(false)), "{got:?}");
        assert!(waits >= 1);
    }

    #[test]
    fn a_zero_timeout_still_asks_once() {
        let mut waits = 0;
        let got = within(
            Some(Instant::now()),
            || Ok(None::<(Instant, &str)>),
            timed_out,
            |_| {
                waits += 1;
                Ok(true)
            },
        );
        assert!(matches!(got, Ok(true)) && waits == 1, "{got:?} after {waits} waits");
    }

    #[test]
    fn finished_work_ends_the_wait() {
        let mut left = 3;
        let got = within(
            None,
            || Ok(None::<(Instant, &str)>),
            timed_out,
            |bound| {
                assert_eq!(bound, None, "no deadline, nothing due: unbounded");
                left -= 1;
                Ok(left == 0)
            },
        );
        assert!(matches!(got, Ok(true)) && left == 0, "{got:?}");
    }
}
