//! Step time, communication time, and the share of communication hidden behind computation,
//! measured with CUDA events.
//!
//! A [`Timeline`] records a timing event on a stream at the start and the end of each span of
//! work: computation on candle's stream, communication on the communication stream (one span
//! open per stream at a time; spans on the two streams may be open together). An event's
//! time is when its stream reached it, so a span covers exactly the GPU time of what was enqueued
//! between its two events. Spans that start right after a cross-stream wait start when the wait
//! is satisfied: the lessons make the wait explicit (`CudaStream::wait` on an event) before opening
//! a span. Once the step is over ([`Timeline::finish`] waits for its last events), the spans
//! become intervals in milliseconds since the step began, and:
//!
//! * step time: from the first event to the last, on either stream;
//! * communication time: the length of the union of the communication spans;
//! * hidden: the part of that union during which some computation span was running too — the
//!   communication the step did not have to wait for.

use std::sync::Arc;

use cudarc::driver::{sys::CUevent_flags, CudaEvent, CudaStream};

use crate::BoxError;

/// What a span of work is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Candle's kernels.
    Compute,
    /// NCCL (or the LSA kernel).
    Comm,
}

/// One step's events.
pub struct Timeline {
    start: CudaEvent,
    spans: Vec<(Kind, CudaEvent, CudaEvent)>,
    /// The open spans: kind, start event, stream.
    open: Vec<(Kind, CudaEvent, Arc<CudaStream>)>,
}

fn timing_event(stream: &Arc<CudaStream>) -> Result<CudaEvent, BoxError> {
    let event = stream.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    event.record(stream)?;
    Ok(event)
}

impl Timeline {
    /// Starts a step: an event on `stream` (candle's, where every step begins).
    pub fn start(stream: &Arc<CudaStream>) -> Result<Self, BoxError> {
        Ok(Timeline { start: timing_event(stream)?, spans: Vec::new(), open: Vec::new() })
    }

    /// Opens a span of `kind` on `stream`: what is enqueued there until [`Timeline::close`] on the
    /// same stream.
    pub fn open(&mut self, kind: Kind, stream: &Arc<CudaStream>) -> Result<(), BoxError> {
        if self.open.iter().any(|(_, _, s)| Arc::ptr_eq(s, stream)) {
            return Err("a span is already open on this stream".into());
        }
        self.open.push((kind, timing_event(stream)?, stream.clone()));
        Ok(())
    }

    /// Closes the span open on `stream`.
    pub fn close(&mut self, stream: &Arc<CudaStream>) -> Result<(), BoxError> {
        let at =
            self.open.iter().position(|(_, _, s)| Arc::ptr_eq(s, stream)).ok_or("no span is open on this stream")?;
        let (kind, begin, _) = self.open.swap_remove(at);
        self.spans.push((kind, begin, timing_event(stream)?));
        Ok(())
    }

    /// Runs `enqueue` inside a span of `kind` on `stream`.
    pub fn span<R>(
        &mut self,
        kind: Kind,
        stream: &Arc<CudaStream>,
        enqueue: impl FnOnce() -> Result<R, BoxError>,
    ) -> Result<R, BoxError> {
        self.open(kind, stream)?;
        let value = enqueue()?;
        self.close(stream)?;
        Ok(value)
    }

    /// Ends the step on `streams` (events on each), waits for those events — a measurement, not
    /// part of the training's ordering — and computes the figures.
    pub fn finish(self, streams: &[&Arc<CudaStream>]) -> Result<StepTimes, BoxError> {
        let ends = streams.iter().map(|s| timing_event(s)).collect::<Result<Vec<_>, _>>()?;
        for end in &ends {
            end.synchronize()?;
        }
        let at = |e: &CudaEvent| -> Result<f64, BoxError> { Ok(f64::from(self.start.elapsed_ms(e)?)) };
        let mut step_ms = 0f64;
        for end in &ends {
            step_ms = step_ms.max(at(end)?);
        }
        let (mut comm, mut compute) = (Vec::new(), Vec::new());
        for (kind, begin, end) in &self.spans {
            let interval = (at(begin)?, at(end)?);
            match kind {
                Kind::Comm => comm.push(interval),
                Kind::Compute => compute.push(interval),
            }
        }
        let comm = union(comm);
        let comm_ms = comm.iter().map(|(a, b)| b - a).sum();
        let hidden_ms = overlap(&comm, &union(compute));
        Ok(StepTimes { step_ms, comm_ms, hidden_ms })
    }
}

/// Sorted, disjoint intervals covering the same time as `intervals`.
fn union(mut intervals: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    intervals.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut merged: Vec<(f64, f64)> = Vec::new();
    for (a, b) in intervals {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// Total length of the intersection of two unions (sorted, disjoint).
fn overlap(x: &[(f64, f64)], y: &[(f64, f64)]) -> f64 {
    let (mut i, mut j, mut total) = (0, 0, 0.0);
    while i < x.len() && j < y.len() {
        let (a, b) = (x[i].0.max(y[j].0), x[i].1.min(y[j].1));
        if b > a {
            total += b - a;
        }
        if x[i].1 < y[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    total
}

/// One step's figures, in milliseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepTimes {
    /// From the step's first event to its last.
    pub step_ms: f64,
    /// Communication (union of the communication spans).
    pub comm_ms: f64,
    /// Communication while computation ran.
    pub hidden_ms: f64,
}

impl StepTimes {
    /// Hidden communication as a share of all communication (0 without communication).
    pub fn hidden_share(&self) -> f64 {
        if self.comm_ms > 0.0 {
            self.hidden_ms / self.comm_ms
        } else {
            0.0
        }
    }

    /// The medians of each figure over `steps` (robust to the first steps' warm-up).
    pub fn median(steps: &[StepTimes]) -> StepTimes {
        let med = |f: fn(&StepTimes) -> f64| {
            let mut v: Vec<f64> = steps.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        StepTimes { step_ms: med(|s| s.step_ms), comm_ms: med(|s| s.comm_ms), hidden_ms: med(|s| s.hidden_ms) }
    }
}

impl std::fmt::Display for StepTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {:.3} ms, communication {:.3} ms, {:.0} % of it hidden behind compute",
            self.step_ms,
            self.comm_ms,
            100.0 * self.hidden_share()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unions_and_overlaps_count_each_millisecond_once() {
        assert_eq!(union(vec![(3.0, 4.0), (0.0, 2.0), (1.0, 2.5)]), vec![(0.0, 2.5), (3.0, 4.0)]);
        let comm = union(vec![(1.0, 3.0), (5.0, 8.0)]);
        let compute = union(vec![(0.0, 2.0), (2.5, 6.0)]);
        // [1,2] + [2.5,3] + [5,6]
        assert_eq!(overlap(&comm, &compute), 2.5);
        assert_eq!(overlap(&comm, &[]), 0.0);
        let t = StepTimes { step_ms: 10.0, comm_ms: 4.0, hidden_ms: 3.0 };
        assert_eq!(t.hidden_share(), 0.75);
        let m = StepTimes::median(&[t, StepTimes { step_ms: 30.0, ..t }, StepTimes { step_ms: 20.0, ..t }]);
        assert_eq!(m.step_ms, 20.0);
    }
}
