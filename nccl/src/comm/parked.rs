//! Waiting outside this crate, abortable: [`Comm::parked`].

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
}
