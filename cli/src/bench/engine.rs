//! The measurement loop, step for step as nccl-tests 2.19.6 `TimeTest` / `BenchTime` do it:
//! warm-up over every size (doubling), then per size and variant one synchronising call, a host
//! timer around `iters` calls enqueued back to back with a shifting buffer window, a stream sync,
//! the time averaged over ranks, and (with `-c 1`) one more call on fresh inputs, checked.

use std::time::Instant;

use nccl::Comm;

use super::coll::{Collective, Counts};
use super::elem::{reduced, DType, Elem, Op};
use super::nccl_ops::{self, Buffers, Call};
use super::results::{Measure, Row, Run, Tool};
use crate::error::{CliError, Result};

/// What to measure.
#[derive(Clone, Debug)]
pub struct Spec {
    /// The collective.
    pub coll: Collective,
    /// Element type.
    pub dtype: DType,
    /// Reduction.
    pub op: Op,
    /// Root of rooted collectives.
    pub root: usize,
    /// Smallest size (bytes).
    pub min: u64,
    /// Largest size (bytes).
    pub max: u64,
    /// Size factor.
    pub factor: u64,
    /// Warm-up calls per size.
    pub warmup: u32,
    /// Timed calls per size.
    pub iters: u32,
    /// Validate.
    pub check: bool,
}

impl Spec {
    /// The sizes of the table: `min`, `min × factor`, … up to `max`.
    pub fn sizes(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut s = self.min;
        while s <= self.max {
            out.push(s);
            match s.checked_mul(self.factor) {
                Some(next) if next > s => s = next,
                _ => break,
            }
        }
        out
    }

    /// Checks the sizes, and that this collective and its variants can run.
    pub fn validate(&self) -> Result<()> {
        if self.min == 0 {
            return Err(CliError::SizeRange("-b must be at least 1 byte".into()));
        }
        if self.min > self.max {
            return Err(CliError::SizeRange(format!("-b {} is larger than -e {}", self.min, self.max)));
        }
        if let Some(why) = nccl_ops::missing(self.coll) {
            return Err(CliError::Collective { name: self.coll.name().into(), why });
        }
        Ok(())
    }
}

/// The communicators of this process: one (a process per GPU) or several (`-g N`).
pub enum Ranks {
    /// This process is one rank of a job.
    Process(Comm),
    /// This process drives every rank.
    Group(Vec<Comm>),
}

impl Ranks {
    fn comms(&self) -> &[Comm] {
        match self {
            Ranks::Process(c) => std::slice::from_ref(c),
            Ranks::Group(cs) => cs,
        }
    }

    /// The number of ranks in the job.
    pub fn world(&self) -> usize {
        self.comms().first().map_or(0, Comm::size)
    }

    /// Gives the communicators back, for finalizing.
    pub fn into_comms(self) -> Vec<Comm> {
        match self {
            Ranks::Process(c) => vec![c],
            Ranks::Group(cs) => cs,
        }
    }
}

/// Runs `spec` and reports each row to `emit` as soon as it is measured.
pub fn run(ranks: &Ranks, spec: &Spec, emit: &mut dyn FnMut(&Row)) -> Result<Run> {
    spec.validate()?;
    match spec.dtype {
        DType::I8 => run_typed::<i8>(ranks, spec, emit),
        DType::U8 => run_typed::<u8>(ranks, spec, emit),
        DType::I32 => run_typed::<i32>(ranks, spec, emit),
        DType::U32 => run_typed::<u32>(ranks, spec, emit),
        DType::I64 => run_typed::<i64>(ranks, spec, emit),
        DType::U64 => run_typed::<u64>(ranks, spec, emit),
        DType::F16 => run_typed::<half::f16>(ranks, spec, emit),
        DType::Bf16 => run_typed::<half::bf16>(ranks, spec, emit),
        DType::F32 => run_typed::<f32>(ranks, spec, emit),
        DType::F64 => run_typed::<f64>(ranks, spec, emit),
    }
}

/// One rank's buffers and the loop state.
struct Bench<'r, T: Elem> {
    ranks: &'r Ranks,
    spec: &'r Spec,
    bufs: Vec<Buffers<T>>,
    /// Buffer length in elements (the largest size, as nccl-tests allocates).
    len: usize,
    /// The one-element buffer of the cross-rank sums (one process per GPU), allocated once: a
    /// buffer allocated and freed around every measurement makes the stream's next
    /// synchronisation return the memory to the driver inside the timed loop.
    scratch: std::cell::RefCell<Option<cudarc::driver::CudaSlice<f64>>>,
}

fn run_typed<T: Elem>(ranks: &Ranks, spec: &Spec, emit: &mut dyn FnMut(&Row)) -> Result<Run> {
    let elem = size_of::<T>();
    let len = (spec.max / elem as u64) as usize;
    let bufs =
        ranks.comms().iter().map(|c| Buffers::<T>::new(c.stream(), len.max(1))).collect::<Result<Vec<_>, _>>()?;
    let scratch = match ranks {
        Ranks::Process(comm) => Some(comm.stream().alloc_zeros::<f64>(1)?),
        Ranks::Group(_) => None,
    };
    let mut b = Bench { ranks, spec, bufs, len, scratch: std::cell::RefCell::new(scratch) };
    let world = ranks.world();
    let (out_ok, in_ok) = nccl_ops::variants(spec.coll);
    b.barrier()?;
    // Warm-up over every size, doubling, as nccl-tests does.
    let mut size = spec.min;
    while size <= spec.max {
        let counts = spec.coll.counts(size, elem, world);
        for iter in 0..spec.warmup * u32::from(counts.param > 0) {
            b.start(counts, !out_ok, iter)?;
        }
        b.complete()?;
        size = match size.checked_mul(2) {
            Some(s) => s,
            None => break,
        };
    }
    let mut rows = Vec::new();
    let mut wrong_total = 0;
    for size in spec.sizes() {
        let counts = spec.coll.counts(size, elem, world);
        // Too small for one element per rank (nccl-tests starts such collectives higher up too).
        if counts.param == 0 {
            continue;
        }
        let mut row = Row {
            size: counts.printed_bytes(elem),
            count: counts.param as u64,
            dtype: T::NAME.to_string(),
            redop: if spec.coll.reduces() { spec.op.name().to_string() } else { "none".to_string() },
            root: if spec.coll.rooted() { spec.root as i64 } else { -1 },
            out_of_place: None,
            in_place: None,
        };
        for in_place in [false, true] {
            if (in_place && !in_ok) || (!in_place && !out_ok) {
                continue;
            }
            let m = b.measure(counts, in_place)?;
            wrong_total += m.wrong.unwrap_or(0);
            *(if in_place { &mut row.in_place } else { &mut row.out_of_place }) = Some(m);
        }
        emit(&row);
        rows.push(row);
    }
    Ok(Run {
        tool: Tool::Gpucomm,
        collective: spec.coll,
        nranks: world,
        nccl_version: nccl::version().ok().map(|v| v.to_string()),
        mode: None,
        warmup: Some(spec.warmup),
        iters: Some(spec.iters),
        avg_busbw: Some(Run::mean_busbw(&rows)),
        rows,
        out_of_bounds: spec.check.then_some(wrong_total),
    })
}

impl<T: Elem> Bench<'_, T> {
    fn call(&self, counts: Counts, in_place: bool, iter: u32) -> Call {
        // nccl-tests moves the window through the buffers from one call to the next.
        let total = counts.send.max(counts.recv);
        let steps = self.len.checked_div(total).unwrap_or(1).max(1);
        let shift = total * (iter as usize % steps);
        Call { coll: self.spec.coll, op: self.spec.op.nccl(), root: self.spec.root, counts, shift, in_place }
    }

    fn start(&mut self, counts: Counts, in_place: bool, iter: u32) -> Result<()> {
        let call = self.call(counts, in_place, iter);
        match self.ranks {
            Ranks::Process(comm) => nccl_ops::issue(comm, &call, &mut self.bufs[0])?,
            Ranks::Group(comms) => nccl_ops::issue_group(comms, &call, &mut self.bufs)?,
        }
        Ok(())
    }

    fn complete(&self) -> Result<()> {
        for c in self.ranks.comms() {
            c.stream().synchronize()?;
        }
        Ok(())
    }

    /// Sums over the ranks of the job (and waits for all of them).
    fn sum(&self, values: &[f64]) -> Result<Vec<f64>> {
        match self.ranks {
            Ranks::Process(comm) => {
                let mut scratch = self.scratch.borrow_mut();
                let scratch = scratch.as_mut().expect("allocated for one process per GPU");
                Ok(nccl_ops::sum_over_ranks(comm, values, scratch)?)
            }
            Ranks::Group(_) => Ok(values.to_vec()),
        }
    }

    fn barrier(&self) -> Result<()> {
        self.sum(&[0.0]).map(drop)
    }

    fn measure(&mut self, counts: Counts, in_place: bool) -> Result<Measure> {
        let spec = self.spec;
        let world = self.ranks.world();
        self.start(counts, in_place, 0)?;
        self.complete()?;
        self.barrier()?;
        let timer = Instant::now();
        for iter in 0..spec.iters {
            self.start(counts, in_place, iter)?;
        }
        self.complete()?;
        let local = timer.elapsed().as_secs_f64() / spec.iters as f64;
        // nccl-tests averages the time over processes (the threads of one process share it).
        let procs = match self.ranks {
            Ranks::Process(_) => world,
            Ranks::Group(_) => 1,
        };
        let seconds = self.sum(&[local])?[0] / procs as f64;
        let algbw = spec.coll.algbw(counts.param, size_of::<T>(), seconds, world);
        let busbw = algbw * spec.coll.bus_factor(world);
        let wrong = if spec.check { Some(self.check(counts, in_place)?) } else { None };
        Ok(Measure { time_us: seconds * 1e6, algbw, busbw, wrong })
    }

    /// Runs one call on fresh inputs and counts wrong output elements over all ranks.
    fn check(&mut self, counts: Counts, in_place: bool) -> Result<u64> {
        let comms = self.ranks.comms();
        for (comm, bufs) in comms.iter().zip(self.bufs.iter_mut()) {
            fill::<T>(comm, bufs, self.spec, counts, in_place)?;
        }
        self.start(counts, in_place, 0)?;
        self.complete()?;
        let mut wrong = 0u64;
        for (comm, bufs) in comms.iter().zip(self.bufs.iter_mut()) {
            wrong += count_wrong::<T>(comm, bufs, self.spec, counts, in_place)?;
        }
        Ok(self.sum(&[wrong as f64])?[0] as u64)
    }
}

/// Writes this rank's pattern into the input window (at shift 0) and zeroes the output. In place,
/// the one buffer holds the input as NCCL expects it: all-gather's input is this rank's block of
/// the output (so block `rank` holds the rank's `count` input elements), the others use the whole
/// buffer as input.
fn fill<T: Elem>(comm: &Comm, bufs: &mut Buffers<T>, spec: &Spec, counts: Counts, in_place: bool) -> Result<()> {
    let stream = comm.stream();
    let rank = comm.rank();
    let c = counts.param.max(1);
    let (_, mut recv) = bufs.views(counts, 0, in_place)?;
    stream.memset_zeros(&mut recv)?;
    if in_place {
        let gather = spec.coll == Collective::AllGather;
        let input: Vec<T> = (0..recv.len()).map(|i| T::pattern(rank, if gather { i % c } else { i })).collect();
        stream.memcpy_htod(&input, &mut recv)?;
    } else {
        let input: Vec<T> = (0..counts.send).map(|i| T::pattern(rank, i)).collect();
        let mut send = bufs
            .send
            .try_slice_mut(0..counts.send)
            .ok_or_else(|| CliError::Usage("input window outside the bench buffers".into()))?;
        stream.memcpy_htod(&input, &mut send)?;
    }
    Ok(())
}

/// The output elements of this rank that differ from the prediction. Elements NCCL does not
/// define (a non-root's output of reduce, the other blocks of an in-place reduce-scatter) are not
/// checked.
fn count_wrong<T: Elem>(
    comm: &Comm,
    bufs: &mut Buffers<T>,
    spec: &Spec,
    counts: Counts,
    in_place: bool,
) -> Result<u64> {
    let (rank, n) = (comm.rank(), comm.size());
    let (_, recv) = bufs.views(counts, 0, in_place)?;
    let got = comm.stream().clone_dtoh(&recv)?;
    let c = counts.param.max(1);
    let root = rank == spec.root;
    let want = |i: usize| -> Option<T> {
        match spec.coll {
            Collective::AllReduce => Some(reduced(spec.op, n, i)),
            Collective::AllGather => Some(T::pattern(i / c, i % c)),
            Collective::ReduceScatter if in_place => (i / c == rank).then(|| reduced(spec.op, n, i)),
            Collective::ReduceScatter => Some(reduced(spec.op, n, rank * c + i)),
            Collective::Broadcast => Some(T::pattern(spec.root, i)),
            Collective::Reduce if root => Some(reduced(spec.op, n, i)),
            Collective::Reduce => in_place.then(|| T::pattern(rank, i)),
            Collective::AllToAll => Some(T::pattern(i / c, rank * c + i % c)),
            Collective::SendRecv => Some(T::pattern((rank + n - 1) % n, i)),
        }
    };
    Ok(got.iter().enumerate().filter(|(i, g)| want(*i).is_some_and(|w| !T::close(**g, w))).count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(min: u64, max: u64, factor: u64) -> Spec {
        Spec {
            coll: Collective::AllReduce,
            dtype: DType::F32,
            op: Op::Sum,
            root: 0,
            min,
            max,
            factor,
            warmup: 1,
            iters: 1,
            check: false,
        }
    }

    #[test]
    fn sizes_step_by_the_factor() {
        assert_eq!(spec(8, 128, 4).sizes(), [8, 32, 128]);
        assert_eq!(spec(8, 100, 4).sizes(), [8, 32]);
        assert_eq!(spec(8 << 30, 8 << 30, 2).sizes(), [8 << 30]);
        assert_eq!(spec(1 << 62, u64::MAX, 4).sizes(), [1 << 62], "stops before overflowing");
    }

    #[test]
    fn bad_ranges_are_refused_and_every_collective_is_wired() {
        let e = spec(0, 8, 2).validate().unwrap_err();
        assert_eq!(e.to_string(), "invalid size range: -b must be at least 1 byte");
        let e = spec(16, 8, 2).validate().unwrap_err();
        assert_eq!(e.to_string(), "invalid size range: -b 16 is larger than -e 8");
        let mut s = spec(8, 8, 2);
        s.coll = Collective::Reduce;
        s.validate().unwrap();
        // The pinned NCCL (2.28.9) has ncclAlltoAll.
        s.coll = Collective::AllToAll;
        s.validate().unwrap();
    }
}
