//! `gpucomm doctor`: physical, software and live checks, each ✓/✗ with a fix for every ✗.

pub mod counters;
pub mod envvars;
pub mod libs;
pub mod live;
pub mod nvml;
pub mod physical;
pub mod report;
pub mod software;
pub mod source;
pub mod topo;
pub mod worker;

use serde::Serialize;

use self::report::{Check, Layer, Report, Status};
use self::source::{normalize_bus_id, Machine};
use crate::cli::DoctorArgs;
use crate::cuda::{self, PeerAccess};
use crate::error::{CliError, Result};
use crate::json_stdout::JsonStdout;
use crate::progress::Progress;
use gpucomm_launch::safety::Overridden;

/// Everything the doctor saw, for `--json`.
#[derive(Serialize)]
struct Facts<'a> {
    machine: Option<&'a Machine>,
    /// Each GPU's and each pair's NVLink/PCIe limit, derived from `machine`.
    limits: Option<topo::Limits>,
    peer_access: Option<&'a [PeerAccess]>,
    software: &'a software::SoftwareFacts,
    live: Option<&'a live::LiveFacts>,
    /// The live run's bandwidths against the limits.
    bandwidth: &'a [live::Verdict],
    /// How much each link's error counters grew during the live run, on the live ranks' GPUs.
    nvlink_error_growth: Option<&'a [counters::LinkGrowth]>,
    /// What each GPU's active NVLink links reach (GPUs named from the topology where the driver's
    /// far end is none).
    nvlink_far_ends: Vec<physical::FarEnd>,
}

/// Runs `gpucomm doctor`.
pub fn run(args: &DoctorArgs, overridden: &[Overridden]) -> Result<()> {
    // Before NCCL is loaded (the software layer loads it), whose log may go to standard output.
    let json = args.json.then(JsonStdout::reserve).transpose()?;
    let mut report = Report::default();
    let mut progress = Progress::new("doctor", if args.skip_live { 2 } else { 3 });
    progress.note("physical layer (NVML, CUDA)");
    let nvml = nvml::NvmlSource::open();
    let machine = match nvml.as_ref().map_err(Clone::clone).and_then(|s| Machine::read(s)) {
        Ok(m) => Some(m),
        Err(e) => {
            report.push(Check::fail(
                Layer::Physical,
                format!("NVML unavailable: {e} (no NVIDIA driver on this machine?)"),
                physical::NVML_FIX,
            ));
            None
        }
    };
    let peers = if cuda::driver_present() {
        cuda::peer_matrix().map_err(|e| e.to_string())
    } else {
        Err("no CUDA driver (libcuda.so.1)".to_string())
    };
    if let Some(m) = &machine {
        report.checks.extend(physical::checks(m, cuda::driver_version(), peers.as_deref().map_err(Clone::clone)));
    }
    progress.step("software layer (libraries, environment)");
    let sw = software::gather(overridden);
    report.checks.extend(software::checks(&sw));
    let mut live_facts = None;
    let mut bandwidth = Vec::new();
    let mut growth = None;
    if !args.skip_live {
        progress.step("live layer (one process per GPU)");
        let n = args.nproc.map_or_else(cuda::device_count, |n| n as usize);
        if n < 2 {
            report.push(Check::new(
                Layer::Live,
                Status::Info,
                format!("live layer skipped: it needs 2 GPUs, CUDA sees {n}"),
            ));
        } else if sw.nccl.is_err() {
            report.push(Check::new(
                Layer::Live,
                Status::Info,
                "live layer skipped: NCCL could not be loaded (see above)",
            ));
        } else {
            let facts = with_log_dir(args, |dir| live::gather(n, dir))?;
            let peer_ok = |a: usize, b: usize| peer_between(machine.as_ref(), peers.as_deref().ok(), a, b);
            report.checks.extend(live::checks(&facts, machine.as_ref(), &peer_ok));
            bandwidth = live::verdicts(&facts, machine.as_ref(), &peer_ok);
            // The counters again, after the load: their growth on the GPUs that carried it is the
            // verdict.
            if let (Ok(source), Some(before)) = (&nvml, &machine) {
                if let Ok(after) = Machine::read(source) {
                    let loaded: Vec<String> = facts.nccl.iter().map(|r| r.bus_id.clone()).collect();
                    let g = counters::growth(before, &after, &loaded);
                    report.checks.extend(counters::checks(&g));
                    growth = Some(g);
                }
            }
            live_facts = Some(facts);
        }
    }
    progress.finish();
    let facts = Facts {
        machine: machine.as_ref(),
        limits: machine.as_ref().map(topo::limits),
        peer_access: peers.as_deref().ok(),
        software: &sw,
        live: live_facts.as_ref(),
        bandwidth: &bandwidth,
        nvlink_error_growth: growth.as_deref(),
        nvlink_far_ends: machine.as_ref().map_or_else(Vec::new, |m| {
            m.gpus.iter().filter(|g| g.active_links().next().is_some()).map(|g| physical::far_end(m, g)).collect()
        }),
    };
    let doc = || serde_json::json!({ "checks": report.checks, "failures": report.failures(), "facts": facts });
    match json {
        Some(out) => out.write(&doc())?,
        None => print!("{}", report.render()),
    }
    // After the report, so that a file that cannot be written loses nothing of the run.
    if let Some(path) = &args.json_out {
        std::fs::write(path, format!("{:#}\n", doc())).map_err(|e| CliError::WriteOutput {
            what: "the JSON report (--json-out)",
            path: path.clone(),
            why: e.to_string(),
        })?;
    }
    match report.failures() {
        0 => Ok(()),
        n => Err(CliError::DoctorFailed(n)),
    }
}

/// Runs `f` with the directory for logs: `--logs DIR` (created, kept) or a temporary one.
fn with_log_dir<T>(args: &DoctorArgs, f: impl FnOnce(&std::path::Path) -> T) -> Result<T> {
    match &args.logs {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|source| CliError::Io {
                what: "creating",
                path: dir.clone(),
                source,
            })?;
            Ok(f(dir))
        }
        None => {
            let tmp = tempfile::tempdir().map_err(|source| CliError::Io {
                what: "creating a temporary directory in",
                path: std::env::temp_dir(),
                source,
            })?;
            Ok(f(tmp.path()))
        }
    }
}

/// Whether CUDA allows peer access both ways between the NVML GPUs `a` and `b`.
fn peer_between(machine: Option<&Machine>, peers: Option<&[PeerAccess]>, a: usize, b: usize) -> Option<bool> {
    let m = machine?;
    let (ia, ib) = (normalize_bus_id(&m.gpu(a)?.bus_id), normalize_bus_id(&m.gpu(b)?.bus_id));
    let one = |x: &str, y: &str| {
        peers?.iter().find(|p| normalize_bus_id(&p.from) == x && normalize_bus_id(&p.to) == y).map(|p| p.possible)
    };
    Some(one(&ia, &ib)? && one(&ib, &ia)?)
}
