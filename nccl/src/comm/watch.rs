//! The opt-in timeout's view of enqueued work: one CUDA event per enqueued call, recorded on the
//! call's stream right after NCCL enqueued it, with the time of the enqueue.
//!
//! A peer that dies after its connections were made leaves a collective's kernel spinning on the
//! survivor's stream while NCCL still reports success (measured on the GPU machine: 30 s and
//! more), so only the stream's progress can tell: a call whose event has not completed `timeout`
//! after its enqueue is overdue, and the communicator is aborted. Calls are kept oldest first, so
//! checking the oldest unfinished one is enough; finished ones are dropped from the front as they
//! are seen, and their events reused. Nothing is recorded without a timeout.
//!
//! With or without a timeout, the watch also remembers the streams other than the communicator's
//! own that received work ([`Comm::on`](crate::Comm::on), a group member on another stream), so
//! that [`Comm::wait`](crate::Comm::wait) waits for them too.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream};

use crate::error::Result;

/// Side streams remembered before the idle ones are dropped.
const SIDES_KEPT: usize = 8;

/// True when everything enqueued on `stream` has finished (`cuStreamQuery`); any failure (a stream
/// being captured, say) counts as busy.
fn is_idle(stream: &CudaStream) -> bool {
    // A stream being captured is never asked: CUDA answers a query of one by invalidating its
    // capture (a capture scope's own stream, listed by a captured call, would break).
    if !matches!(gpucomm_ordering::is_capturing(stream), Ok(false)) {
        return false;
    }
    // Asked in relaxed capture mode: while this thread captures (a `capture` scope), the default
    // mode forbids querying any stream, and CUDA invalidates the capture for it (on one H100,
    // eager calls on nine streams inside a capture broke it so).
    gpucomm_ordering::relaxed(|| {
        // SAFETY: the stream is alive (borrowed); the call only reads its state.
        let status = unsafe { cudarc::driver::sys::cuStreamQuery(stream.cu_stream()) };
        Ok::<_, cudarc::driver::DriverError>(status == cudarc::driver::sys::CUresult::CUDA_SUCCESS)
    })
    .unwrap_or(false)
}

/// A call whose work is still running after its timeout.
pub(crate) struct Overdue {
    /// The NCCL call.
    pub(crate) call: &'static str,
    /// The timeout it exceeded.
    pub(crate) after: Duration,
}

struct Enqueued {
    event: CudaEvent,
    at: Instant,
    call: &'static str,
}

#[repr(C)]
pub(crate) struct Watch {
    /// First: every call reads it (see [`Comm`]'s layout).
    timeout: Option<Duration>,
    /// Oldest first.
    running: VecDeque<Enqueued>,
    spare: Vec<CudaEvent>,
    /// Streams other than the communicator's own that received work since the last complete
    /// [`Comm::wait`](crate::Comm::wait), kept alive (so that no other stream can take a handle
    /// while it is listed).
    sides: Vec<Arc<CudaStream>>,
}

impl Watch {
    pub(crate) fn new(timeout: Option<Duration>) -> Self {
        Watch { timeout, running: VecDeque::new(), spare: Vec::new(), sides: Vec::new() }
    }

    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// A new timeout; clearing it forgets the work recorded so far.
    pub(crate) fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
        if timeout.is_none() {
            let events = self.running.drain(..).map(|e| e.event);
            self.spare.extend(events);
        }
    }

    /// Remembers `stream`, which is not the communicator's own, as one that received work. Past a
    /// few streams, the idle ones are forgotten (nothing to wait for there), so that a caller who
    /// never waits does not keep every stream it ever used alive.
    pub(crate) fn side_stream(&mut self, stream: &Arc<CudaStream>) {
        if self.sides.iter().any(|s| s.cu_stream() == stream.cu_stream()) {
            return;
        }
        if self.sides.len() >= SIDES_KEPT {
            self.sides.retain(|s| !is_idle(s));
        }
        self.sides.push(stream.clone());
    }

    /// The streams [`Watch::side_stream`] remembered; the list starts again empty.
    pub(crate) fn take_sides(&mut self) -> Vec<Arc<CudaStream>> {
        std::mem::take(&mut self.sides)
    }

    /// After NCCL enqueued `call` on `stream`: records it (with a timeout set, and unless the
    /// stream is being captured into a graph, whose work runs only when the graph is launched).
    /// `captured` is whether it is, when the caller already knows (its `Access` asked the driver);
    /// `None` asks here. Reports an older call that is overdue instead, if there is one.
    #[inline]
    pub(crate) fn enqueued(
        &mut self,
        call: &'static str,
        stream: &CudaStream,
        captured: Option<bool>,
    ) -> Result<Option<Overdue>> {
        if self.timeout.is_none() {
            return Ok(None);
        }
        self.enqueued_timed(call, stream, captured)
    }

    /// [`Watch::enqueued`] with a timeout set (out of line: most communicators have none).
    fn enqueued_timed(
        &mut self,
        call: &'static str,
        stream: &CudaStream,
        captured: Option<bool>,
    ) -> Result<Option<Overdue>> {
        let captured = match captured {
            Some(known) => known,
            None => gpucomm_ordering::is_capturing(stream)?,
        };
        if captured {
            return Ok(None);
        }
        if let Some(late) = self.overdue()? {
            return Ok(Some(late));
        }
        let event = match self.spare.pop() {
            Some(event) if event.context() == stream.context() => event,
            _ => stream.context().new_event(None)?,
        };
        event.record(stream)?;
        self.running.push_back(Enqueued { event, at: Instant::now(), call });
        Ok(None)
    }

    /// Drops finished calls from the front; the oldest unfinished one once it is overdue.
    pub(crate) fn overdue(&mut self) -> Result<Option<Overdue>> {
        Ok(self.next_due()?.and_then(|(due, late)| (Instant::now() >= due).then_some(late)))
    }

    /// Drops finished calls from the front; the oldest unfinished one, with the time it becomes
    /// overdue. `None` without a timeout, with nothing unfinished, or when that time is beyond
    /// what an `Instant` can hold (never, then).
    pub(crate) fn next_due(&mut self) -> Result<Option<(Instant, Overdue)>> {
        let Some(timeout) = self.timeout else { return Ok(None) };
        while let Some(oldest) = self.running.front() {
            if !oldest.event.try_is_complete()? {
                let due = oldest.at.checked_add(timeout);
                return Ok(due.map(|due| (due, Overdue { call: oldest.call, after: timeout })));
            }
            if let Some(done) = self.running.pop_front() {
                self.spare.push(done.event);
            }
        }
        Ok(None)
    }

    /// True when every recorded call has finished (on whatever stream it ran).
    pub(crate) fn all_done(&mut self) -> Result<bool> {
        let mut i = 0;
        while i < self.running.len() {
            if !self.running[i].event.try_is_complete()? {
                i += 1;
            } else if let Some(done) = self.running.remove(i) {
                self.spare.push(done.event);
            }
        }
        Ok(self.running.is_empty())
    }
}
