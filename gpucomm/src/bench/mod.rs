//! `gpucomm bench`: the Rust twin of nccl-tests.
//!
//! Three ways to run the ranks: this process spawns one process per GPU (the default, and
//! `--nproc N`); this process is one rank of a job started by torchrun, mpirun or srun (their
//! variables are read); this process drives N GPUs (`-g N`). The table is printed by whoever sees
//! every row: the spawning parent, rank 0, or the `-g` process.

pub mod coll;
pub mod compare;
pub mod elem;
pub mod engine;
pub mod nccl_ops;
pub mod nccltests;
mod output;
pub mod plot;
pub mod results;
pub mod table;

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use gpucomm_launch::{Launcher, Options, RankInfo, Rendezvous, SPAWNED_VAR};

use self::engine::{Ranks, Spec};
use self::output::{Event, EventFile, Follower, Printer, Sink, EVENTS_VAR};
use self::results::Run;
use self::table::{DeviceLine, Header};
use crate::cli::BenchArgs;
use crate::cuda;
use crate::error::{CliError, Result};
use crate::json_stdout::JsonStdout;
use crate::units::parse_size;

/// How long ranks get to stop after one of them failed.
const GRACE: Duration = Duration::from_secs(5);

/// Runs `gpucomm bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    // Before anything loads NCCL, whose log (NCCL_DEBUG=INFO) goes to standard output.
    let json = args.json.then(JsonStdout::reserve).transpose()?;
    let spec = spec_of(args)?;
    let reference = args.compare.as_deref().map(|p| compare::read_nccl_tests(p, spec.coll)).transpose()?;
    if let Some(p) = &args.plot {
        plot::check_writable(p)?;
    }
    let spawned = std::env::var_os(SPAWNED_VAR).is_some();
    let info = RankInfo::from_env()?;
    if let Some(n) = args.ngpus {
        if info.world_size > 1 {
            return Err(CliError::Usage(format!(
                "-g {n} drives every GPU from one process, but this is rank {} of {} ({}): drop -g, or start one process",
                info.rank, info.world_size, info.launcher
            )));
        }
        check_plan(&spec, reference.as_deref(), n as usize)?;
        return present(args, &spec, reference.as_deref(), run_group(args, &spec, n as usize)?, json);
    }
    if spawned || info.launcher != Launcher::Single {
        if let (Some(n), false) = (args.nproc, spawned) {
            return Err(CliError::Usage(format!(
                "--nproc {n} starts its own ranks, but this process is already rank {} of a job ({})",
                info.rank, info.launcher
            )));
        }
        check_plan(&spec, reference.as_deref(), info.world_size)?;
        return match run_rank(args, &spec, &info)? {
            Some(done) => present(args, &spec, reference.as_deref(), done, json),
            None => Ok(()),
        };
    }
    let nproc = match args.nproc {
        Some(n) => n as usize,
        None => match cuda::devices()? {
            0 => return Err(CliError::Usage("no GPU found (CUDA reports 0 devices): nothing to benchmark".into())),
            n => n,
        },
    };
    check_plan(&spec, reference.as_deref(), nproc)?;
    // The ranks need the driver: said once here rather than by every rank.
    cuda::devices()?;
    present(args, &spec, reference.as_deref(), spawn_ranks(args, nproc)?, json)
}

/// The checks that need the rank count, made before any GPU work: a root (`-r`) of a rooted
/// collective that is no rank, a size range that gives no rank an element, and an nccl-tests log
/// (`--compare`) measured with another rank count, data type, operator or root.
fn check_plan(spec: &Spec, reference: Option<&[Run]>, nranks: usize) -> Result<()> {
    if spec.coll.rooted() && spec.root >= nranks {
        return Err(CliError::Usage(format!(
            "-r {}: {} needs a root among the {nranks} ranks (0 to {})",
            spec.root,
            spec.coll,
            nranks.saturating_sub(1)
        )));
    }
    spec.check_sizes(nranks)?;
    if let Some(c) = reference {
        compare::Setup::planned(spec, nranks).check(&compare::Setup::of(c), spec.coll)?;
    }
    Ok(())
}

fn spec_of(args: &BenchArgs) -> Result<Spec> {
    let dtype = elem::DType::parse(&args.dtype)?;
    let op = elem::Op::parse(&args.op)?;
    let spec = Spec {
        coll: args.collective,
        dtype,
        op,
        root: args.root,
        min: parse_size("-b", &args.min_bytes)?,
        max: parse_size("-e", &args.max_bytes)?,
        factor: args.factor,
        warmup: args.warmup,
        iters: args.iters,
        check: args.check == 1,
        knobs: args.knobs.clone(),
    };
    spec.validate()?;
    if args.ngpus.is_some() && spec.knobs.graph > 0 {
        return Err(CliError::Usage(engine::one_stream_per_capture()));
    }
    Ok(spec)
}

/// What the finished run hands to [`present`].
struct Done {
    printer: Printer,
}

fn header(
    args: &BenchArgs,
    spec: &Spec,
    gpus_per_process: usize,
    mode: String,
    devices: Vec<DeviceLine>,
) -> Result<Header> {
    Ok(Header {
        collective: spec.coll,
        nccl_headers: nccl::header_version().code(),
        nccl_library: nccl::version()?.code(),
        threads: 1,
        gpus_per_process,
        min_bytes: spec.min,
        max_bytes: spec.max,
        factor: spec.factor,
        warmup: spec.warmup,
        iters: spec.iters,
        validation: args.check,
        graph: spec.knobs.graph,
        mode,
        variant: Some(spec.knobs.describe()),
        nvls: nvls_state(),
        devices,
    })
}

/// NVLS as this process runs it (the safety variables are in force).
fn nvls_state() -> String {
    let v = std::env::var("NCCL_NVLS_ENABLE").unwrap_or_default();
    if v == "0" {
        "off (NCCL_NVLS_ENABLE=0)".into()
    } else {
        format!("NCCL_NVLS_ENABLE={v:?}")
    }
}

/// This machine's name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn device_line(rank: usize, ordinal: usize) -> DeviceLine {
    DeviceLine {
        rank,
        pid: std::process::id(),
        host: hostname(),
        device: ordinal,
        pci: cuda::pci_address(ordinal).map(|a| a.trim_end_matches(".0").to_string()).unwrap_or_else(|_| "?".into()),
        name: cuda::device_name(ordinal).unwrap_or_else(|_| "?".into()),
    }
}

/// `-g N`: one process, N communicators, groups.
fn run_group(args: &BenchArgs, spec: &Spec, n: usize) -> Result<Done> {
    let have = cuda::devices()?;
    if n > have {
        return Err(CliError::Usage(format!("-g {n} needs {n} GPUs, CUDA sees {have}")));
    }
    let null = spec.knobs.stream_null == 1;
    let streams = (0..n).map(|i| nccl_ops::rank_stream(i, null)).collect::<Result<Vec<_>, _>>()?;
    let ranks = Ranks::Group(nccl_ops::init_all(&streams)?);
    let devices = (0..n).map(|i| device_line(i, i)).collect();
    let mut printer = Printer::new(args.json);
    printer.event(Event::Header(header(args, spec, n, format!("1 process driving {n} GPUs (-g {n})"), devices)?))?;
    let run = measure(&ranks, spec, &mut printer);
    let finalized = nccl_ops::finalize(ranks.into_comms());
    let mut run = run?;
    finalized?;
    run.mode = Some(format!("-g {n}"));
    printer.event(Event::Done(run))?;
    Ok(Done { printer })
}

/// Runs the engine, sending each row to `sink`.
fn measure(ranks: &Ranks, spec: &Spec, sink: &mut dyn Sink) -> Result<Run> {
    let mut failed = None;
    let run = engine::run(ranks, spec, &mut |row| {
        if failed.is_none() {
            failed = sink.event(Event::Row(row.clone())).err();
        }
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok(run),
    }
}

/// Where one rank of a multi-process job sends its rows.
enum RankSink {
    /// Rank 0 under gpucomm's own spawner: events for the parent.
    Parent(EventFile),
    /// Rank 0 under an outside launcher: it prints.
    Print(Printer),
    /// Every other rank.
    Silent(Printer),
}

impl RankSink {
    fn sink(&mut self) -> &mut dyn Sink {
        match self {
            RankSink::Parent(f) => f,
            RankSink::Print(p) | RankSink::Silent(p) => p,
        }
    }
}

/// One rank of a multi-process job; returns the run on the rank that prints it.
fn run_rank(args: &BenchArgs, spec: &Spec, info: &RankInfo) -> Result<Option<Done>> {
    let events = std::env::var_os(EVENTS_VAR);
    if events.is_some() {
        // The parent prints; NCCL's or NVSHMEM's own stdout output must not mix into it.
        crate::doctor::worker::stdout_to_stderr();
    }
    let ordinal = info.device_ordinal(cuda::devices()?)?;
    let stream = nccl_ops::rank_stream(ordinal, spec.knobs.stream_null == 1)?;
    let mut rendezvous = Rendezvous::connect(info, &Options::from_env()?)?;
    let comm = nccl_ops::join(stream, &mut rendezvous, spec.knobs.init)?;
    let lines = nccl_ops::gather_json(&comm, &device_line(comm.rank(), ordinal))?;
    let ranks = Ranks::Process(comm, Box::new(std::cell::RefCell::new(rendezvous)));
    let mut sink = match (info.rank, &events) {
        (0, Some(path)) => RankSink::Parent(EventFile::create(Path::new(path))?),
        (0, None) => RankSink::Print(Printer::new(args.json)),
        _ => RankSink::Silent(Printer::new(true)),
    };
    let mode = format!("1 process per GPU, {} ranks ({})", info.world_size, info.launcher);
    if !matches!(sink, RankSink::Silent(_)) {
        sink.sink().event(Event::Header(header(args, spec, 1, mode.clone(), lines)?))?;
    }
    let run = measure(&ranks, spec, sink.sink());
    let finalized = nccl_ops::finalize(ranks.into_comms());
    let mut run = run?;
    finalized?;
    run.mode = Some(mode);
    let wrong = run.out_of_bounds.unwrap_or(0);
    match sink {
        RankSink::Print(mut printer) => {
            printer.event(Event::Done(run))?;
            Ok(Some(Done { printer }))
        }
        RankSink::Parent(mut file) => {
            // The parent reports wrong elements.
            file.event(Event::Done(run))?;
            Ok(None)
        }
        RankSink::Silent(_) if wrong > 0 && events.is_none() => Err(CliError::WrongResults(wrong)),
        RankSink::Silent(_) => Ok(None),
    }
}

/// The arguments for the ranks: the same, minus `--nproc N` / `--nproc=N`.
fn child_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip_next = false;
    for a in args {
        if skip_next {
            skip_next = false;
        } else if a == "--nproc" {
            skip_next = true;
        } else if !a.to_string_lossy().starts_with("--nproc=") {
            out.push(a);
        }
    }
    out
}

/// Starts `nproc` ranks of this command and prints what rank 0 reports as it comes.
fn spawn_ranks(args: &BenchArgs, nproc: usize) -> Result<Done> {
    let dir = tempfile::tempdir().map_err(|source| CliError::Io {
        what: "creating a temporary directory in",
        path: std::env::temp_dir(),
        source,
    })?;
    let events = dir.path().join("events.jsonl");
    let exe = std::env::current_exe().map_err(|error| gpucomm_launch::SpawnError::CurrentExe { error })?;
    let child_args = child_args(std::env::args_os().skip(1));
    let env = vec![(EVENTS_VAR.to_string(), events.to_string_lossy().into_owned())];
    let ranks = std::thread::spawn(move || gpucomm_launch::spawn_local(nproc, &exe, &child_args, &env, GRACE));
    let mut printer = Printer::new(args.json);
    let mut follower = Follower::new(&events);
    while !ranks.is_finished() {
        follower.poll(&mut printer)?;
        std::thread::sleep(Duration::from_millis(50));
    }
    follower.poll(&mut printer)?;
    let outcome = ranks.join().map_err(|_| CliError::RunFailed("the spawner thread panicked".into()))??;
    if !outcome.success() {
        return Err(CliError::RanksFailed(outcome));
    }
    Ok(Done { printer })
}

/// The end of a run: JSON (to the standard output `json` kept), comparison, plot, and the exit
/// status for wrong elements.
fn present(
    args: &BenchArgs,
    spec: &Spec,
    reference: Option<&[Run]>,
    done: Done,
    json: Option<JsonStdout>,
) -> Result<()> {
    let Done { printer } = done;
    let (Some(header), Some(run)) = (printer.header, printer.run) else {
        return Err(CliError::RunFailed("the ranks finished without reporting a result".into()));
    };
    let comparison =
        reference.map(|c| compare::Comparison::new(spec.coll, std::slice::from_ref(&run), c)).transpose()?;
    if let Some(w) = comparison.as_ref().and_then(|c| c.warning.as_ref()) {
        eprintln!("warning: {w}");
    }
    if let Some(out) = json {
        out.write(&serde_json::json!({ "header": header, "run": run, "comparison": comparison }))?;
    } else if let Some(c) = &comparison {
        println!();
        print!("{}", c.markdown());
    }
    if let Some(path) = &args.plot {
        match &comparison {
            Some(c) => c.plot(path)?,
            None => plot::draw_run(path, &run)?,
        }
    }
    match run.out_of_bounds {
        Some(w) if w > 0 => Err(CliError::WrongResults(w)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nproc_is_taken_out_for_the_ranks() {
        let args: Vec<OsString> =
            ["all_reduce", "--nproc", "2", "-b", "8", "--nproc=4", "--json"].iter().map(OsString::from).collect();
        let got: Vec<String> = child_args(args).into_iter().map(|a| a.into_string().unwrap()).collect();
        assert_eq!(got, ["all_reduce", "-b", "8", "--json"]);
    }

    #[test]
    fn a_root_that_is_no_rank_is_a_usage_error() {
        let mut spec = Spec {
            coll: coll::Collective::Broadcast,
            dtype: elem::DType::F32,
            op: elem::Op::Sum,
            root: 5,
            min: 1 << 20,
            max: 1 << 20,
            factor: 2,
            warmup: 1,
            iters: 1,
            check: true,
            knobs: Default::default(),
        };
        let e = check_plan(&spec, None, 2).unwrap_err();
        assert_eq!(e.to_string(), "-r 5: broadcast needs a root among the 2 ranks (0 to 1)");
        assert_eq!(e.exit_code(), crate::error::EXIT_USAGE);
        spec.root = 2;
        assert!(check_plan(&spec, None, 2).is_err());
        assert!(check_plan(&spec, None, 3).is_ok());
        // Collectives without a root ignore -r, as nccl-tests does.
        spec.coll = coll::Collective::AllReduce;
        assert!(check_plan(&spec, None, 2).is_ok());
    }
}
