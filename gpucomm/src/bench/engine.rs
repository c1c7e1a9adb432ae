//! The measurement loop, step for step as nccl-tests 2.19.6 `TimeTest` / `BenchTime` do it:
//! warm-up over every size (doubling), then per size and variant one synchronising call, a barrier,
//! a host timer around `iters` calls enqueued back to back with a shifting buffer window (or,
//! with -G, around the replays of a graph that captured them), a wait for the stream, the time
//! averaged over ranks, and (with `-c 1`) one more call on fresh inputs, checked. The [`Knobs`]
//! choose how each of these steps is done, to find where time goes.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaStream;
use gpucomm_kernels::AllReduce;
use gpucomm_launch::Rendezvous;
use gpucomm_ordering::Graph;
use nccl::Comm;

use super::coll::{Collective, Counts};
use super::elem::{reduced, DType, Elem, Op};
use super::nccl_ops::{self, Buffers, Call, RawAllReduce};
use super::results::{Measure, Row, Run, Tool};
use crate::cli::{Api, Barrier, Impl, Knobs, Memory, Wait};
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
    /// How the run is made.
    pub knobs: Knobs,
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

    /// The "redop" column: the operator's name, or `none` for collectives that do not reduce.
    pub fn redop_column(&self) -> &'static str {
        if self.coll.reduces() {
            self.op.name()
        } else {
            "none"
        }
    }

    /// The "root" column: the root of rooted collectives, -1 for the others.
    pub fn root_column(&self) -> i64 {
        if self.coll.rooted() {
            self.root as i64
        } else {
            -1
        }
    }

    /// Checks that some size gives each of `nranks` ranks at least one element. Sizes too small
    /// for that stay in the table with count 0, as nccl-tests prints and times them (its
    /// `TimeTest` runs every size; the calls move nothing, so their bandwidths are 0 and count
    /// in the average); a range of nothing but such sizes is refused.
    pub fn check_sizes(&self, nranks: usize) -> Result<()> {
        let elem = self.dtype.size();
        let sizes = self.sizes();
        if sizes.iter().any(|&s| self.coll.counts(s, elem, nranks).param > 0) {
            return Ok(());
        }
        let list: Vec<String> = sizes.iter().map(u64::to_string).collect();
        Err(CliError::SizeRange(format!(
            "no size from -b {} to -e {} ({} bytes) gives each of {nranks} ranks one {} element for {}: \
             the smallest that does is {} bytes; raise -e",
            self.min,
            self.max,
            list.join(", "),
            self.dtype.name(),
            self.coll,
            self.coll.min_bytes(elem, nranks)
        )))
    }

    /// Checks the sizes, that this collective and its variants can run, and that the knobs fit
    /// together.
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
        let k = &self.knobs;
        let all_reduce_only = |what: &str| {
            if self.coll == Collective::AllReduce {
                Ok(())
            } else {
                Err(CliError::Usage(format!("{what} runs all_reduce only, not {}", self.coll.name())))
            }
        };
        if k.api == Api::Raw {
            all_reduce_only("--api raw")?;
            if k.implementation != Impl::Nccl {
                return Err(CliError::Usage("--api raw calls ncclAllReduce: it cannot run --impl".into()));
            }
        }
        if k.implementation != Impl::Nccl {
            all_reduce_only("--impl")?;
        }
        if k.graph > 0 && k.stream_null == 1 {
            return Err(CliError::Usage(
                "-G captures the stream, and the legacy default stream (-y 1) cannot be captured".into(),
            ));
        }
        if let Some(cta) = &k.cta_bytes {
            parse_cta_bytes(cta)?;
        }
        if let Some(path) = &k.table {
            read_table(path)?;
        }
        Ok(())
    }
}

/// The communicators of this process: one (a process per GPU) or several (`-g N`).
pub enum Ranks {
    /// This process is one rank of a job; its rendezvous serves as the host barrier.
    Process(Comm, Box<RefCell<Rendezvous>>),
    /// This process drives every rank.
    Group(Vec<Comm>),
}

impl Ranks {
    fn comms(&self) -> &[Comm] {
        match self {
            Ranks::Process(c, _) => std::slice::from_ref(c),
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
            Ranks::Process(c, _) => vec![c],
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

/// How the calls are issued.
enum Issuer<'a> {
    /// Through the nccl crate.
    Safe,
    /// Through nccl-sys (`--api raw`).
    Raw(RawAllReduce),
    /// Through gpucomm-kernels' dispatcher (`--impl`).
    Dispatch(&'a AllReduce<'a>),
}

/// The most values one sum over the ranks carries: a measurement's wall, CPU and GPU times.
const SUMS: usize = 3;

/// One rank's buffers and the loop state.
struct Bench<'a, T: Elem> {
    ranks: &'a Ranks,
    spec: &'a Spec,
    bufs: Vec<Buffers<'a, T>>,
    /// Buffer length in elements (the largest size, as nccl-tests allocates).
    len: usize,
    /// The buffer of the cross-rank sums ([`SUMS`] elements, one process per GPU), allocated
    /// once: a buffer allocated and freed around every measurement makes the stream's next
    /// synchronisation return the memory to the driver inside the timed loop.
    scratch: RefCell<Option<cudarc::driver::CudaSlice<f64>>>,
    issuer: Issuer<'a>,
}

/// The dispatcher `--impl` asks for, set up once per run (one process per GPU).
fn dispatcher<'c>(comm: &'c Comm, knobs: &Knobs, max: u64) -> Result<AllReduce<'c>> {
    let mut options = gpucomm_kernels::Options::default();
    if let Some(path) = &knobs.table {
        options.table = Some(read_table(path)?);
    }
    if let Some(cta) = &knobs.cta_bytes {
        options.cta_bytes = parse_cta_bytes(cta)?;
    }
    let mut ar = AllReduce::new(comm, options)?;
    if knobs.calibrate {
        let how = gpucomm_kernels::Calibration { max_bytes: max as usize, ..Default::default() };
        ar.calibrate(comm.stream(), &how)?;
    }
    if let (Some(path), 0) = (&knobs.save_table, comm.rank()) {
        std::fs::write(path, ar.table().to_text()).map_err(|e| CliError::WriteOutput {
            what: "the crossover table",
            path: path.clone(),
            why: e.to_string(),
        })?;
    }
    ar.force(match knobs.implementation {
        Impl::Ll => Some(gpucomm_kernels::Path::Ll),
        Impl::OneShot => Some(gpucomm_kernels::Path::OneShot),
        Impl::TwoShot => Some(gpucomm_kernels::Path::TwoShot),
        Impl::Nccl | Impl::Dispatch => None,
    })?;
    if let Some(why) = ar.fallback() {
        eprintln!("gpucomm bench: the dispatcher sends every call to NCCL: {why}");
    }
    Ok(ar)
}

/// A crossover table file.
fn read_table(path: &std::path::Path) -> Result<gpucomm_kernels::Table> {
    let text = CliError::read_input("crossover table", path)?;
    gpucomm_kernels::Table::parse(&text)
        .map_err(|e| CliError::BadInput { path: path.to_path_buf(), why: e.to_string() })
}

/// `2K,8K,64K` → the kernels' bytes per CTA.
pub fn parse_cta_bytes(text: &str) -> Result<gpucomm_kernels::lsa::CtaBytes> {
    let parts: Vec<u64> =
        text.split(',').map(|p| crate::units::parse_size("--cta-bytes", p.trim())).collect::<Result<_>>()?;
    match parts[..] {
        [ll, one, two] if ll > 0 && one > 0 && two > 0 => {
            Ok(gpucomm_kernels::lsa::CtaBytes { ll: ll as usize, one_shot: one as usize, two_shot: two as usize })
        }
        _ => Err(CliError::Usage(format!("--cta-bytes {text:?}: three sizes above 0, LL,ONE_SHOT,TWO_SHOT"))),
    }
}

fn run_typed<T: Elem>(ranks: &Ranks, spec: &Spec, emit: &mut dyn FnMut(&Row)) -> Result<Run> {
    let elem = size_of::<T>();
    let len = ((spec.max / elem as u64) as usize).max(1);
    let knobs = &spec.knobs;
    let ar = match (ranks, knobs.implementation) {
        (_, Impl::Nccl) => None,
        (Ranks::Process(comm, _), _) => Some(dispatcher(comm, knobs, spec.max)?),
        (Ranks::Group(_), _) => {
            return Err(CliError::Usage("--impl needs one process per GPU (the kernels' barriers cannot wait for a rank this thread has not launched yet): drop -g".into()))
        }
    };
    let bufs = match (ranks, knobs.buffers, &ar) {
        (Ranks::Process(..), Memory::Window, Some(ar)) => vec![Buffers::<T>::symmetric(ar, len)?],
        (Ranks::Process(comm, _), memory, _) => vec![Buffers::new(memory, comm.stream(), comm, len)?],
        (Ranks::Group(comms), Memory::Window, _) => Buffers::windows(comms, len)?,
        (Ranks::Group(comms), memory, _) => {
            comms.iter().map(|c| Buffers::new(memory, c.stream(), c, len)).collect::<Result<Vec<_>>>()?
        }
    };
    let issuer = match (ranks, knobs.api, &ar) {
        (_, _, Some(ar)) => Issuer::Dispatch(ar),
        (Ranks::Process(comm, _), Api::Raw, None) => Issuer::Raw(RawAllReduce::new(comm.stream(), &bufs[0])?),
        (Ranks::Group(_), Api::Raw, None) => {
            return Err(CliError::Usage(
                "--api raw needs one process per GPU (a raw group is not wired): drop -g".into(),
            ))
        }
        (_, Api::Safe, None) => Issuer::Safe,
    };
    let scratch = match ranks {
        Ranks::Process(comm, _) => Some(comm.stream().alloc_zeros::<f64>(SUMS)?),
        Ranks::Group(_) => None,
    };
    let mut b = Bench { ranks, spec, bufs, len, scratch: RefCell::new(scratch), issuer };
    let world = ranks.world();
    let (out_ok, in_ok) = nccl_ops::variants(spec.coll);
    b.barrier()?;
    // Warm-up over every size, doubling, as nccl-tests does (calls of count 0 included).
    let mut size = spec.min;
    while size <= spec.max {
        let counts = spec.coll.counts(size, elem, world);
        for iter in 0..spec.warmup {
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
    // Every size, those too small for one element per rank too: nccl-tests times their calls of
    // count 0 and prints them (size and count 0, bandwidths 0, counted in the average).
    for size in spec.sizes() {
        let counts = spec.coll.counts(size, elem, world);
        let mut row = Row {
            size: counts.printed_bytes(elem),
            count: counts.param as u64,
            dtype: T::NAME.to_string(),
            redop: spec.redop_column().to_string(),
            root: spec.root_column(),
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
        nranks: Some(world),
        nccl_version: nccl::version().ok().map(|v| v.to_string()),
        mode: None,
        variant: Some(knobs.describe()),
        warmup: Some(spec.warmup),
        iters: Some(spec.iters),
        avg_busbw: Some(Run::mean_busbw(&rows)),
        rows,
        out_of_bounds: spec.check.then_some(wrong_total),
    })
}

/// One timed block's figures, per call, in seconds.
struct Timed {
    /// Host wall clock to the end of the wait (nccl-tests' time).
    wall: f64,
    /// Host time to the return of the last call or launch (nccl-tests' -C 1 "cputime").
    cpu: f64,
    /// CUDA-event time on the stream (`--events`).
    gpu: Option<f64>,
}

impl<'a, T: Elem> Bench<'a, T> {
    fn call(&self, counts: Counts, in_place: bool, iter: u32) -> Call {
        // nccl-tests moves the window through the buffers from one call to the next.
        let total = counts.send.max(counts.recv);
        let steps = self.len.checked_div(total).unwrap_or(1).max(1);
        let shift = total * (iter as usize % steps);
        Call { coll: self.spec.coll, op: self.spec.op.nccl(), root: self.spec.root, counts, shift, in_place }
    }

    fn start(&mut self, counts: Counts, in_place: bool, iter: u32) -> Result<()> {
        let call = self.call(counts, in_place, iter);
        issue(self.ranks, &self.issuer, &call, &mut self.bufs)
    }

    /// Waits for every stream, as the knobs say.
    fn complete(&self) -> Result<()> {
        for c in self.ranks.comms() {
            match self.spec.knobs.wait {
                Wait::Sync => c.stream().synchronize()?,
                Wait::Poll => nccl_ops::wait_polling(c, c.stream())?,
            }
        }
        Ok(())
    }

    /// Sums over the ranks of the job (and waits for all of them).
    fn sum(&self, values: &[f64]) -> Result<Vec<f64>> {
        match self.ranks {
            Ranks::Process(comm, _) => {
                let mut scratch = self.scratch.borrow_mut();
                let scratch = scratch.as_mut().expect("allocated for one process per GPU");
                Ok(nccl_ops::sum_over_ranks(comm, values, scratch)?)
            }
            Ranks::Group(_) => Ok(values.to_vec()),
        }
    }

    /// Every rank gets here before the timing starts: through the launcher's rendezvous (the
    /// default, as nccl-tests' `MPI_Barrier`), or through NCCL (`--barrier nccl`).
    fn barrier(&self) -> Result<()> {
        match (self.ranks, self.spec.knobs.barrier) {
            (Ranks::Process(_, rdzv), Barrier::Host) => Ok(rdzv.borrow_mut().barrier()?),
            _ => self.sum(&[0.0]).map(drop),
        }
    }

    /// The timed block: `iters` calls back to back (or, with -G, the replays of a graph of them).
    fn timed(&mut self, counts: Counts, in_place: bool) -> Result<Timed> {
        let spec = self.spec;
        let streams: Vec<Arc<CudaStream>> = self.ranks.comms().iter().map(|c| c.stream().clone()).collect();
        // nccl-tests' -G: capture, instantiate, a second barrier, then the timer around the replays.
        // The graph owns the buffers meanwhile (it keeps what its calls use), and gives them back.
        let mut graph = if spec.knobs.graph > 0 { Some(self.capture(counts, in_place)?) } else { None };
        if graph.is_some() {
            self.barrier()?;
        }
        let events = if spec.knobs.events {
            let e = |s: &Arc<CudaStream>| s.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
            let start: Vec<_> = streams.iter().map(e).collect::<Result<_, _>>()?;
            for (ev, s) in start.iter().zip(&streams) {
                ev.record(s)?;
            }
            Some((start, streams.iter().map(e).collect::<Result<Vec<_>, _>>()?))
        } else {
            None
        };
        let timer = Instant::now();
        let calls = match &mut graph {
            Some(graph) => {
                for _ in 0..spec.knobs.graph {
                    graph.launch()?;
                }
                spec.iters as f64 * spec.knobs.graph as f64
            }
            None => {
                for iter in 0..spec.iters {
                    self.start(counts, in_place, iter)?;
                }
                spec.iters as f64
            }
        };
        let cpu = timer.elapsed().as_secs_f64();
        if let Some((_, stop)) = &events {
            for (ev, s) in stop.iter().zip(&streams) {
                ev.record(s)?;
            }
        }
        self.complete()?;
        let wall = timer.elapsed().as_secs_f64();
        if let Some(graph) = graph {
            self.bufs = graph.into_kept().2;
        }
        let gpu = match &events {
            Some((start, stop)) => {
                let ms = start.iter().zip(stop).map(|(a, b)| a.elapsed_ms(b)).collect::<Result<Vec<f32>, _>>()?;
                Some(ms.iter().copied().fold(0.0f32, f32::max) as f64 * 1e-3 / calls)
            }
            None => None,
        };
        // The host time as nccl-tests' -C 1 reports it: per iteration, not per call, with -G too
        // (its cputime is the graph launches' time over `iters`).
        Ok(Timed { wall: wall / calls, cpu: cpu / spec.iters as f64, gpu })
    }

    /// Captures `iters` calls on the rank's stream into one graph (nccl-tests' -G), through the
    /// capture scope of `nccl::capture`: the graph keeps the communicator, the dispatcher and the
    /// buffers (moved into it until [`Graph::into_kept`] gives them back; a refused capture gives
    /// them back at once).
    fn capture(&mut self, counts: Counts, in_place: bool) -> Result<Captured<'a, T>> {
        let Ranks::Process(comm, _) = self.ranks else {
            return Err(CliError::Usage(one_stream_per_capture()));
        };
        let calls: Vec<Call> = (0..self.spec.iters).map(|iter| self.call(counts, in_place, iter)).collect();
        let dispatcher = match &self.issuer {
            Issuer::Dispatch(ar) => Some(*ar),
            Issuer::Safe | Issuer::Raw(_) => None,
        };
        let keep = (comm, dispatcher, std::mem::take(&mut self.bufs));
        let (ranks, issuer) = (self.ranks, &self.issuer);
        gpucomm_ordering::capture(comm.stream(), keep, |(_, _, bufs)| {
            calls.iter().try_for_each(|call| issue(ranks, issuer, call, bufs))
        })
        .map_err(|((_, _, bufs), e)| {
            // A refused capture hands the buffers back: the bench goes on with them.
            self.bufs = bufs;
            e
        })
    }

    fn measure(&mut self, counts: Counts, in_place: bool) -> Result<Measure> {
        let spec = self.spec;
        let world = self.ranks.world();
        self.start(counts, in_place, 0)?;
        self.complete()?;
        self.barrier()?;
        let t = self.timed(counts, in_place)?;
        // nccl-tests averages the time over processes (the threads of one process share it).
        let procs = match self.ranks {
            Ranks::Process(..) => world,
            Ranks::Group(_) => 1,
        };
        let sums = self.sum(&[t.wall, t.cpu, t.gpu.unwrap_or(0.0)])?;
        let seconds = sums[0] / procs as f64;
        let algbw = spec.coll.algbw(counts.param, size_of::<T>(), seconds, world);
        let busbw = algbw * spec.coll.bus_factor(world);
        let path = match &self.issuer {
            Issuer::Dispatch(ar) => ar.last().map(|d| d.path.name().to_string()),
            _ => None,
        };
        let wrong = if spec.check { Some(self.check(counts, in_place)?) } else { None };
        Ok(Measure {
            time_us: seconds * 1e6,
            algbw,
            busbw,
            wrong,
            cpu_us: Some(sums[1] / procs as f64 * 1e6),
            gpu_us: t.gpu.map(|_| sums[2] / procs as f64 * 1e6),
            path,
        })
    }

    /// Runs one call on fresh inputs and counts wrong output elements over all ranks. A call that
    /// moves nothing (count 0, the same on every rank) has nothing to check.
    fn check(&mut self, counts: Counts, in_place: bool) -> Result<u64> {
        if counts.send.max(counts.recv) == 0 {
            return Ok(0);
        }
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

/// A graph of `-G`: it keeps the communicator, the dispatcher (if any) and the buffers.
type Captured<'a, T> = Graph<(&'a Comm, Option<&'a AllReduce<'a>>, Vec<Buffers<'a, T>>)>;

/// Why `-G` needs one process per GPU (refused with `-g` before any GPU work).
pub fn one_stream_per_capture() -> String {
    "-G needs one process per GPU: a capture that keeps what its calls use covers one stream of one \
     thread, and -g N issues every GPU's calls from this thread (drop -g, or -G)"
        .into()
}

/// Issues one call as `issuer` says: on this process's rank, or (`-g N`) on every rank in one
/// group.
fn issue<'a, T: Elem>(ranks: &Ranks, issuer: &Issuer<'a>, call: &Call, bufs: &mut [Buffers<'a, T>]) -> Result<()> {
    match (ranks, issuer) {
        (Ranks::Process(comm, _), Issuer::Safe) => nccl_ops::issue(comm, comm.stream(), call, &mut bufs[0]),
        (Ranks::Process(comm, _), Issuer::Raw(raw)) => {
            raw.call::<T>(comm, call.counts.param, call.shift, call.in_place, call.op)
        }
        (Ranks::Process(comm, _), Issuer::Dispatch(ar)) => dispatch(ar, comm.stream(), call, &mut bufs[0]),
        // As nccl-tests, which opens a group only when one thread drives several GPUs (-g N, N > 1).
        (Ranks::Group(comms), _) => match comms.as_slice() {
            [comm] => nccl_ops::issue(comm, comm.stream(), call, &mut bufs[0]),
            _ => nccl_ops::issue_group(comms, call, bufs),
        },
    }
}

/// One all-reduce through the dispatcher: on its symmetric buffers without copies, on any other
/// buffers through its staging window.
fn dispatch<'c, T: Elem>(
    ar: &AllReduce<'c>,
    stream: &Arc<CudaStream>,
    call: &Call,
    bufs: &mut Buffers<'c, T>,
) -> Result<()> {
    let count = call.counts.param;
    if let (nccl_ops::Mem::Symmetric(send), nccl_ops::Mem::Symmetric(recv)) = (&bufs.send, &mut bufs.recv) {
        let op = call.op;
        let d = if call.in_place {
            ar.all_reduce_symmetric_in_place(stream, recv, call.shift, count, op)
        } else {
            ar.all_reduce_symmetric(stream, (send, call.shift), (recv, call.shift), count, op)
        };
        d?;
        return Ok(());
    }
    match bufs.views(call.counts, call.shift, call.in_place)? {
        nccl_ops::Views::Cuda(Some(s), mut r) => ar.all_reduce(stream, &s, &mut r, call.op),
        nccl_ops::Views::Cuda(None, mut r) => ar.all_reduce_in_place(stream, &mut r, call.op),
        nccl_ops::Views::Nccl(Some(s), mut r) => ar.all_reduce(stream, &s, &mut r, call.op),
        nccl_ops::Views::Nccl(None, mut r) => ar.all_reduce_in_place(stream, &mut r, call.op),
    }?;
    Ok(())
}

/// Writes this rank's pattern into the input window (at shift 0) and zeroes the output. In place,
/// the one buffer holds the input as NCCL expects it: all-gather's and gather's input is this
/// rank's block of the output (so block `rank` holds the rank's `count` input elements), the
/// others use the whole buffer as input.
fn fill<T: Elem>(comm: &Comm, bufs: &mut Buffers<T>, spec: &Spec, counts: Counts, in_place: bool) -> Result<()> {
    let stream = comm.stream();
    let rank = comm.rank();
    let c = counts.param.max(1);
    let (_, recv) = bufs.ranges(counts, 0, in_place)?;
    if in_place {
        let gather = matches!(spec.coll, Collective::AllGather | Collective::Gather);
        let input: Vec<T> = (0..recv.len()).map(|i| T::pattern(rank, if gather { i % c } else { i })).collect();
        bufs.write(stream, false, 0, &input)?;
    } else {
        bufs.zero_recv(stream, recv)?;
        let input: Vec<T> = (0..counts.send).map(|i| T::pattern(rank, i)).collect();
        bufs.write(stream, true, 0, &input)?;
    }
    Ok(())
}

/// The output elements of this rank that differ from the prediction. Elements NCCL does not
/// define or write (a non-root's output of reduce and gather, the other blocks of an in-place
/// reduce-scatter and scatter) are not checked.
fn count_wrong<T: Elem>(
    comm: &Comm,
    bufs: &mut Buffers<T>,
    spec: &Spec,
    counts: Counts,
    in_place: bool,
) -> Result<u64> {
    let (rank, n) = (comm.rank(), comm.size());
    let (_, recv) = bufs.ranges(counts, 0, in_place)?;
    let got = bufs.read_recv(comm.stream(), recv)?;
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
            Collective::Gather => root.then(|| T::pattern(i / c, i % c)),
            Collective::Scatter if in_place => (i / c == rank).then(|| T::pattern(spec.root, i)),
            Collective::Scatter => Some(T::pattern(spec.root, rank * c + i)),
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
            knobs: Knobs::default(),
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
    fn sizes_without_an_element_per_rank_stay_unless_all_are() {
        // all_reduce of floats from 1 byte: 1 and 2 bytes give count 0 and stay in the table.
        let s = spec(1, 8, 2);
        assert_eq!(s.sizes(), [1, 2, 4, 8]);
        let counts: Vec<usize> = s.sizes().iter().map(|&b| s.coll.counts(b, 4, 2).param).collect();
        assert_eq!(counts, [0, 0, 1, 2]);
        s.check_sizes(2).unwrap();
        let mut s = spec(8, 32, 2);
        s.coll = Collective::AllGather;
        s.check_sizes(2).unwrap();
        let e = s.check_sizes(4).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid size range: no size from -b 8 to -e 32 (8, 16, 32 bytes) gives each of 4 ranks one float \
             element for all_gather: the smallest that does is 64 bytes; raise -e"
        );
        assert_eq!(e.exit_code(), crate::error::EXIT_USAGE);
    }

    #[test]
    fn columns_follow_nccl_tests() {
        let mut s = spec(8, 8, 2);
        assert_eq!((s.redop_column(), s.root_column()), ("sum", -1));
        s.coll = Collective::Broadcast;
        s.root = 1;
        assert_eq!((s.redop_column(), s.root_column()), ("none", 1));
        s.coll = Collective::Reduce;
        assert_eq!((s.redop_column(), s.root_column()), ("sum", 1));
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
        // The pinned NCCL (2.28.9) has ncclAlltoAll, ncclGather and ncclScatter.
        for coll in [Collective::AllToAll, Collective::Gather, Collective::Scatter] {
            s.coll = coll;
            s.validate().unwrap();
        }
    }
}
