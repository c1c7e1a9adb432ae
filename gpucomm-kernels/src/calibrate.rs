//! Measuring the crossovers on the machine: every path at every size, eagerly and from a CUDA
//! graph, the ranks' times averaged, and the fastest path per size made into the table.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaStream;
use nccl::{Collectives, MemBuffer, MemView, MemViewMut, ReduceOp};

use crate::dispatch::AllReduce;
use crate::error::{Error, Result};
use crate::lsa;
use crate::path::Path;
use crate::table::{size_text, Step, Table};

/// How [`AllReduce::calibrate`] measures. Every rank must pass the same settings (compared
/// across the ranks: [`Error::Mismatch`]).
#[derive(Clone, Debug)]
pub struct Calibration {
    /// The largest message measured, in bytes (default 64 MiB); sizes go from 8 bytes up by
    /// `factor`. Above the largest, the table keeps that size's winner.
    pub max_bytes: usize,
    /// Size step (default 4).
    pub factor: usize,
    /// Timed calls per size and path (default 20).
    pub iters: usize,
    /// Untimed calls before each timing (default 3).
    pub warmup: usize,
    /// Also measure calls captured into a CUDA graph, for the table's `[graph]` section (default
    /// `true`; needs a stream other than the legacy default stream). Without it the `[graph]`
    /// section copies `[eager]`.
    pub graph: bool,
    /// Graph replays per timing (default 5).
    pub replays: usize,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration { max_bytes: 64 << 20, factor: 4, iters: 20, warmup: 3, graph: true, replays: 5 }
    }
}

impl Calibration {
    /// The message sizes measured.
    pub fn sizes(&self) -> Vec<usize> {
        let mut out = Vec::new();
        let mut s = 8usize;
        while s <= self.max_bytes {
            out.push(s);
            match s.checked_mul(self.factor) {
                Some(next) if next > s => s = next,
                _ => break,
            }
        }
        out
    }

    /// The settings, as the ranks compare them.
    fn values(&self) -> [u64; 6] {
        let [max_bytes, factor, iters, warmup, replays] =
            [self.max_bytes, self.factor, self.iters, self.warmup, self.replays].map(|v| v as u64);
        [max_bytes, factor, iters, warmup, u64::from(self.graph), replays]
    }

    fn check(&self, stream: &CudaStream) -> Result<()> {
        if self.factor < 2 || self.iters == 0 || self.max_bytes < 8 || (self.graph && self.replays == 0) {
            return Err(Error::Calibration(format!(
                "needs factor ≥ 2, iters ≥ 1, max_bytes ≥ 8 and (with graphs) replays ≥ 1: {self:?}"
            )));
        }
        if self.graph && stream.cu_stream().is_null() {
            return Err(Error::Calibration(
                "graph timing captures the stream, and the legacy default stream cannot be captured: \
                 pass a stream made with new_stream(), or turn `graph` off"
                    .into(),
            ));
        }
        Ok(())
    }
}

impl<'c> AllReduce<'c> {
    /// Collective (every rank, same settings, outside any capture): measures every path that can
    /// take each size — f32 sums, eagerly and (with [`Calibration::graph`]) replayed from a CUDA
    /// graph on `stream` — averages the ranks' times, and makes the fastest path per size the
    /// crossover table, which replaces the current one and is returned (its text form can be
    /// saved and passed back through [`crate::Options::table`]). Without the kernels the table
    /// is NCCL only. Buffers of `max_bytes` are allocated for the measurement and freed after.
    pub fn calibrate(&mut self, stream: &Arc<CudaStream>, how: &Calibration) -> Result<&Table> {
        // Compared before anything else, with whether each rank's settings are usable: a rank
        // that stopped alone would leave the others waiting in the measurement.
        let usable = how.check(stream);
        let values = [&how.values()[..], &[u64::from(usable.is_ok())]].concat();
        let agreed =
            lsa::agree(self.comm(), "calibration settings (or whether they are usable on every rank)", &values);
        usable?;
        agreed?;
        if let Some(why) = self.fallback() {
            let all = vec![Step { upto: None, path: Path::Nccl }];
            self.set_table(Table::new(all.clone(), all, format!("NCCL only: {why}"))?)?;
            return Ok(self.table());
        }
        let forced = self.forced();
        let measured = self.measure_all(stream, how);
        // Restored on this rank alone: a rank whose measurement failed may not reach another
        // collective call.
        self.restore_force(forced);
        let (eager, graph) = measured?;
        let source = format!(
            "calibrated on this machine: {} ranks, f32 sum, 8 B–{} ×{}, {} calls per timing{}",
            self.comm().size(),
            size_text(how.max_bytes as u64),
            how.factor,
            how.iters,
            if how.graph { ", eager and from a graph" } else { ", eager only" }
        );
        let graph = if how.graph { graph } else { eager.clone() };
        let table = Table::from_measurements(&eager, &graph, source);
        let gpu = self.comm().context().name().unwrap_or_default();
        // The same on every rank (the times are averaged over the ranks): compared all the same.
        self.set_table(table.for_machine(gpu, self.comm().size()))?;
        Ok(self.table())
    }

    /// `(bytes, path, µs)` for every size and path, eager and graph, averaged over the ranks.
    #[allow(clippy::type_complexity)]
    fn measure_all(
        &mut self,
        stream: &Arc<CudaStream>,
        how: &Calibration,
    ) -> Result<(Vec<(u64, Path, f64)>, Vec<(u64, Path, f64)>)> {
        let len = how.max_bytes / size_of::<f32>();
        // Whether every rank could allocate its buffers is compared before anything is measured:
        // a rank out of memory alone would leave the others waiting in the first measurement.
        let buffers = (|| -> Result<_> {
            let send = MemBuffer::<f32>::zeroed(stream, len.max(1))?;
            Ok((send, MemBuffer::<f32>::zeroed(stream, len.max(1))?, MemBuffer::<f32>::zeroed(stream, 1)?))
        })();
        let agreed =
            lsa::agree(self.comm(), "calibration buffers (allocated on every rank)", &[u64::from(buffers.is_ok())]);
        let (send, mut recv, mut scratch) = buffers?;
        agreed?;
        let mut runs = Vec::new();
        for bytes in how.sizes() {
            let count = (bytes / size_of::<f32>()).max(1);
            for path in Path::ALL {
                self.force(Some(path))?;
                if self.plan::<f32>(count, ReduceOp::SUM, crate::Mode::Eager).is_err() {
                    continue; // this path cannot take this size
                }
                let src = send.slice(..count)?;
                let mut dst = recv.slice_mut(..count)?;
                for _ in 0..how.warmup {
                    self.all_reduce(stream, &src, &mut dst, ReduceOp::SUM)?;
                }
                barrier(self, stream, &mut scratch)?;
                let start = Instant::now();
                for _ in 0..how.iters {
                    self.all_reduce(stream, &src, &mut dst, ReduceOp::SUM)?;
                }
                stream.synchronize()?;
                let eager = start.elapsed().as_secs_f64() * 1e6 / how.iters as f64;
                let graph =
                    if how.graph { graph_time(self, stream, &mut scratch, how, &src, &mut dst)? } else { f64::NAN };
                runs.push((bytes as u64, path, eager, graph));
            }
        }
        // The ranks' mean, then rank 0's copy to everyone, so that every rank builds the same table.
        let mut times = Vec::with_capacity(2 * runs.len());
        runs.iter().for_each(|r| times.extend([r.2, r.3]));
        let n = self.comm().size() as f64;
        let mut dev = stream.clone_htod(&times)?;
        self.comm().on(stream).all_reduce_in_place(&mut dev, ReduceOp::SUM)?;
        self.comm().on(stream).broadcast_in_place(&mut dev, 0)?;
        let times = stream.clone_dtoh(&dev)?;
        let eager = runs.iter().zip(times.chunks(2)).map(|(r, t)| (r.0, r.1, t[0] / n)).collect();
        let graph = runs.iter().zip(times.chunks(2)).map(|(r, t)| (r.0, r.1, t[1] / n)).collect();
        Ok((eager, graph))
    }
}

/// Every rank got here: a one-element all-reduce on `stream`, waited for.
fn barrier(ar: &AllReduce<'_>, stream: &Arc<CudaStream>, scratch: &mut MemBuffer<f32>) -> Result<()> {
    ar.comm().on(stream).all_reduce_in_place(scratch, ReduceOp::SUM)?;
    stream.synchronize()?;
    Ok(())
}

/// µs per call of `iters` all-reduces of `src` into `dst` captured into one graph (which keeps
/// the dispatcher and both views) and replayed `replays` times.
fn graph_time(
    ar: &AllReduce<'_>,
    stream: &Arc<CudaStream>,
    scratch: &mut MemBuffer<f32>,
    how: &Calibration,
    src: &MemView<'_, f32>,
    dst: &mut MemViewMut<'_, f32>,
) -> Result<f64> {
    let mut graph = crate::capture(stream, (ar, src, dst), |(ar, src, dst)| {
        (0..how.iters).try_for_each(|_| ar.all_reduce(stream, *src, *dst, ReduceOp::SUM).map(drop))
    })
    .map_err(|(_, e)| e)?;
    graph.launch()?;
    stream.synchronize()?;
    barrier(ar, stream, scratch)?;
    let start = Instant::now();
    for _ in 0..how.replays {
        graph.launch()?;
    }
    stream.synchronize()?;
    Ok(start.elapsed().as_secs_f64() * 1e6 / (how.iters * how.replays) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_sizes_step_by_the_factor() {
        let c = Calibration { max_bytes: 1 << 10, factor: 4, ..Calibration::default() };
        assert_eq!(c.sizes(), [8, 32, 128, 512]);
        assert_eq!(Calibration::default().sizes().last(), Some(&(32 << 20)));
    }
}
