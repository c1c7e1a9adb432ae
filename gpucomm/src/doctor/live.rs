//! Layer 3: what NCCL and NVSHMEM really do. Starts one worker per GPU through the project's
//! spawner (twice: an NCCL phase with NCCL's log captured, an NVSHMEM phase), then reads the
//! results and NCCL's logs back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::envvars;
use super::report::{Check, Layer, Status};
use super::source::{normalize_bus_id, Machine};
use super::topo::{self, Link};
use super::worker::{result_path, NcclPhase, NvshmemPhase, Point, PUT_BYTES};
use crate::cli::Phase;
use crate::ncclog::{NcclLog, Transport};
use crate::units::human_bytes;

const L: Layer = Layer::Live;

/// NCCL's log settings for the NCCL phase: INIT and NET print transports and the network, GRAPH
/// the channel search, TUNING the algorithm and protocol of each call, ENV the variables NCCL read.
const NCCL_LOG_ENV: [(&str, &str); 2] = [("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,ENV,GRAPH,TUNING,NET")];

/// Below this share of the link's raw rate, bandwidth is flagged.
const LOW_SHARE: f64 = 0.5;

/// What the live run produced.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LiveFacts {
    /// Ranks started.
    pub nproc: usize,
    /// Per-rank NCCL results.
    pub nccl: Vec<NcclPhase>,
    /// Per-PE NVSHMEM results.
    pub nvshmem: Vec<NvshmemPhase>,
    /// NCCL's log of the NCCL phase.
    pub log: NcclLog,
    /// NCCL's log of the NVSHMEM phase (written by the NCCL NVSHMEM loaded, if any).
    pub nvshmem_log: NcclLog,
    /// The environment the workers ran with, as far as it concerns NCCL's path.
    pub reasons: Vec<String>,
    /// Phases that failed to run.
    pub errors: Vec<String>,
}

/// Runs both phases with `nproc` ranks, keeping logs in `dir`.
pub fn gather(nproc: usize, dir: &Path) -> LiveFacts {
    gather_with(nproc, dir, &spawn)
}

/// What starts a phase's ranks: `spawn(nproc, phase, dir, env)`.
type Spawn<'a> = dyn Fn(usize, Phase, &Path, &[(String, String)]) -> Result<(), String> + 'a;

/// [`gather`] with the ranks started by `spawn(nproc, phase, dir, env)`. Each phase first removes
/// the files it will read (`--logs DIR` may hold an earlier run's), so that only this run's
/// results and logs are read back.
fn gather_with(nproc: usize, dir: &Path, spawn: &Spawn) -> LiveFacts {
    let mut facts = LiveFacts { nproc, ..LiveFacts::default() };
    facts.reasons = envvars::transport_reasons(|n| std::env::var(n).ok());
    for phase in Phase::ALL {
        let name = phase.name();
        let log_file = dir.join(format!("{name}-nccl.%h.%p.log"));
        let mut env: Vec<(String, String)> = NCCL_LOG_ENV.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        env.push(("NCCL_DEBUG_FILE".into(), log_file.to_string_lossy().into_owned()));
        if phase == Phase::Nvshmem {
            env[1].1 = "INIT".into();
        }
        if let Err(e) = remove_earlier(dir, phase, nproc) {
            facts.errors.push(format!("{name} phase not run: {e}"));
            continue;
        }
        if let Err(e) = spawn(nproc, phase, dir, &env) {
            facts.errors.push(format!("{name} phase: {e}"));
        }
        for rank in 0..nproc {
            let Ok(text) = std::fs::read_to_string(result_path(dir, phase, rank)) else { continue };
            let parsed = match phase {
                Phase::Nccl => serde_json::from_str(&text).map(|r| facts.nccl.push(r)),
                Phase::Nvshmem => serde_json::from_str(&text).map(|r| facts.nvshmem.push(r)),
            };
            if let Err(e) = parsed {
                facts.errors.push(format!("{name} phase, rank {rank}: unreadable result: {e}"));
            }
        }
        let log = match phase {
            Phase::Nccl => &mut facts.log,
            Phase::Nvshmem => &mut facts.nvshmem_log,
        };
        for file in logs(dir, &format!("{name}-nccl.")) {
            if let Ok(text) = std::fs::read_to_string(&file) {
                log.read(&text);
            }
        }
    }
    facts
}

/// Removes what a phase reads back, as an earlier run left it in `dir`: the ranks' results and
/// NCCL's logs.
fn remove_earlier(dir: &Path, phase: Phase, nproc: usize) -> Result<(), String> {
    let results = (0..nproc).map(|rank| result_path(dir, phase, rank));
    for file in results.chain(logs(dir, &format!("{}-nccl.", phase.name()))) {
        match std::fs::remove_file(&file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("cannot remove {} of an earlier run: {e}", file.display()))
            }
            _ => {}
        }
    }
    Ok(())
}

fn spawn(nproc: usize, phase: Phase, dir: &Path, env: &[(String, String)]) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let args: Vec<std::ffi::OsString> =
        vec!["__doctor-worker".into(), "--phase".into(), phase.name().into(), "--out".into(), dir.into()];
    let outcome =
        gpucomm_launch::spawn_local(nproc, &exe, &args, env, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    if outcome.success() {
        Ok(())
    } else {
        Err(outcome.to_string())
    }
}

fn logs(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// NVML index of the GPU at PCI address `bus`, if NVML saw it.
fn nvml_index(machine: Option<&Machine>, bus: &str) -> Option<usize> {
    let bus = normalize_bus_id(bus);
    machine?.gpus.iter().find(|g| normalize_bus_id(&g.bus_id) == bus).map(|g| g.index)
}

fn transport_list(t: &[(Transport, String)]) -> String {
    t.iter().map(|(_, d)| d.as_str()).collect::<Vec<_>>().join(", ")
}

/// The checks of this layer. `peer_ok(a, b)` says whether CUDA allows peer access between the
/// NVML GPUs `a` and `b` (`None`: unknown).
pub fn checks(f: &LiveFacts, machine: Option<&Machine>, peer_ok: &dyn Fn(usize, usize) -> Option<bool>) -> Vec<Check> {
    let mut out = Vec::new();
    for e in &f.errors {
        out.push(Check::fail(L, format!("live run failed: {e}"), "run `gpucomm bench all_reduce -b 8 -e 8 --nproc 2` to see the ranks' errors; check that every GPU is free and visible"));
    }
    for r in f.nccl.iter().filter(|r| r.error.is_some()) {
        out.push(Check::fail(
            L,
            format!("rank {}: NCCL failed: {}", r.rank, r.error.as_deref().unwrap_or("")),
            "see the NCCL log lines above; rerun with NCCL_DEBUG=WARN",
        ));
    }
    // The communicator stands only if every rank started reports it, without an error.
    let ok = f.nccl.iter().filter(|r| r.error.is_none()).count();
    let failed: Vec<String> = f.nccl.iter().filter(|r| r.error.is_some()).map(|r| r.rank.to_string()).collect();
    let silent: Vec<String> =
        (0..f.nproc).filter(|rank| !f.nccl.iter().any(|r| r.rank == *rank)).map(|r| r.to_string()).collect();
    let stands = ok == f.nproc && failed.is_empty() && silent.is_empty();
    if !stands {
        let mut why = Vec::new();
        if !failed.is_empty() {
            why.push(format!("NCCL failed on rank(s) {}", failed.join(", ")));
        }
        if !silent.is_empty() {
            why.push(format!("rank(s) {} wrote no result", silent.join(", ")));
        }
        out.push(Check::fail(
            L,
            format!(
                "no communicator of {} ranks: {ok} of {} ranks reported one ({})",
                f.nproc,
                f.nproc,
                why.join("; ")
            ),
            format!(
                "see the failures above; run `gpucomm bench all_reduce -b 8 -e 8 --nproc {}` to see the ranks' errors",
                f.nproc
            ),
        ));
    }
    let Some(first) = f.nccl.first() else { return out };
    let version = first.nccl_version.as_deref().unwrap_or("?");
    if stands {
        out.push(Check::new(
            L,
            Status::Pass,
            format!("communicator of {ok} ranks, NCCL {version}, one process per GPU"),
        ));
    }
    if f.log.versions.len() > 1 {
        out.push(Check::fail(
            L,
            format!(
                "NCCL's log shows {} libraries in one job: {}",
                f.log.versions.len(),
                f.log.versions.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
            "make every process load the same libnccl.so.2 (LD_LIBRARY_PATH or NCCL_LIB_DIR)",
        ));
    }
    // The ranks whose device NVML located (NCCL's log numbers devices as NVML does).
    let located = f.nccl.iter().filter(|r| nvml_index(machine, &r.bus_id).is_some()).count();
    out.extend(pair_checks(f, machine, located, peer_ok));
    out.extend(algorithm_checks(&f.log));
    let (nccl_bw, nvshmem_bw): (Vec<Verdict>, Vec<Verdict>) =
        verdicts(f, machine, peer_ok).into_iter().partition(|v| v.what.starts_with("NCCL"));
    out.extend(nccl_bw.iter().map(|v| v.check("check the transport above; other jobs on these GPUs (nvidia-smi); a longer run: gpucomm bench all_reduce -b 1M -e 8G -f 4")));
    out.extend(nvshmem_checks(f));
    out.extend(nvshmem_bw.iter().map(|v| v.check("check the reachability lines above and other jobs on these GPUs (nvidia-smi); NVSHMEM_DEBUG=INFO shows the transports NVSHMEM chose")));
    out.extend(gin_nvls_checks(&f.log, version));
    let mut warnings = f.log.warnings.clone();
    warnings.sort();
    warnings.dedup();
    for w in warnings.iter().take(5) {
        out.push(Check::warn(L, format!("NCCL warned: {w}"), "read NCCL's log (gpucomm doctor --logs DIR keeps it)"));
    }
    out
}

/// Transport per pair of GPUs NCCL connected, against the physical link. `located`: how many
/// ranks' GPUs NVML located (with more than one, NCCL's log should name connections).
fn pair_checks(
    f: &LiveFacts,
    machine: Option<&Machine>,
    located: usize,
    peer_ok: &dyn Fn(usize, usize) -> Option<bool>,
) -> Vec<Check> {
    let mut out = Vec::new();
    let mut pairs: Vec<(usize, usize)> = f
        .log
        .connections
        .iter()
        .map(|c| (c.from_dev.min(c.to_dev), c.from_dev.max(c.to_dev)))
        .filter(|(a, b)| a != b)
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    if pairs.is_empty() && located > 1 {
        out.push(Check::warn(
            L,
            "NCCL's log names no channel connections",
            "NCCL_DEBUG=INFO output was not captured; rerun with --logs DIR and look at the files",
        ));
    }
    for (a, b) in pairs {
        let t = f.log.transports_between(a, b);
        let link = machine.map_or(Link::Unknown, |m| topo::link(m, a, b));
        let pair = format!("GPU{a}↔GPU{b} {}", link.notation());
        let uses_p2p = t.iter().all(|(k, _)| *k == Transport::P2p);
        let kinds: Vec<&str> = {
            let mut k: Vec<&str> = t.iter().map(|(k, _)| k.name()).collect();
            k.dedup();
            k
        };
        if uses_p2p {
            out.push(Check::new(L, Status::Pass, format!("{pair}: NCCL uses P2P ({})", transport_list(&t))));
        } else if matches!(link, Link::Nvlink(_)) {
            out.push(Check::fail(
                L,
                format!("{pair}: NVLink present but NCCL uses {} ({}) — because {}", kinds.join("+"), transport_list(&t), because(f, a, b, peer_ok)),
                "unset NCCL_P2P_DISABLE / NCCL_P2P_LEVEL / NCCL_SHM_DISABLE / NCCL_HOSTID for jobs on one node, and make sure CUDA peer access works (physical layer)",
            ));
        } else {
            out.push(Check::new(
                L,
                Status::Info,
                format!("{pair}: NCCL uses {} ({})", kinds.join("+"), transport_list(&t)),
            ));
        }
    }
    out
}

/// Why NCCL did not take P2P between GPUs `a` and `b`: the variables that steer it, CUDA's peer
/// access, NCCL's own notes.
fn because(f: &LiveFacts, a: usize, b: usize, peer_ok: &dyn Fn(usize, usize) -> Option<bool>) -> String {
    let mut why = f.reasons.clone();
    if peer_ok(a, b) == Some(false) {
        why.push("CUDA refuses peer access between them".into());
    }
    why.extend(f.log.p2p_notes.iter().cloned());
    if why.is_empty() {
        "no variable or peer-access problem explains it (see NCCL's log)".to_string()
    } else {
        why.join("; ")
    }
}

/// Algorithms and protocols per size from the TUNING lines.
fn algorithm_checks(log: &NcclLog) -> Vec<Check> {
    let choices = log.choices("AllReduce");
    if choices.is_empty() {
        return vec![];
    }
    let parts: Vec<String> = choices
        .iter()
        .map(|(a, p, lo, hi)| {
            let range =
                if lo == hi { human_bytes(*lo) } else { format!("{}–{}", human_bytes(*lo), human_bytes(*hi)) };
            if p.is_empty() {
                format!("{a} {range}")
            } else {
                format!("{a}/{p} {range}")
            }
        })
        .collect();
    let channels =
        log.channels.map_or(String::new(), |c| format!("; {} coll, {} p2p, {} NVLS channels", c.coll, c.p2p, c.nvls));
    vec![Check::new(L, Status::Info, format!("all-reduce algorithm/protocol: {}{channels}", parts.join(", ")))]
}

/// The largest size of a sweep.
fn peak(points: &[Point]) -> Option<&Point> {
    points.iter().max_by_key(|p| p.bytes)
}

/// A measured bandwidth against the link's limit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// What was measured (`NCCL all-reduce bus bandwidth`, `NVSHMEM PE 0 → PE 1 put rate`).
    pub what: String,
    /// The GPUs and their link (`GPU0↔GPU1 NV18`), when known.
    pub pair: Option<String>,
    /// Message size, bytes.
    pub bytes: u64,
    /// Measured GB/s (1e9 B/s): bus bandwidth for NCCL, bytes put per second for NVSHMEM.
    pub gbps: f64,
    /// The link's raw rate per direction, GB/s.
    pub limit_gbps: Option<f64>,
    /// How the limit was derived (`18 links × 26.56 GB/s`).
    pub limit_how: Option<String>,
    /// `gbps / limit_gbps`.
    pub share: Option<f64>,
    /// Below half the limit.
    pub low: bool,
    /// For a low one: the cause, as far as the doctor can tell.
    pub cause: Option<String>,
}

impl Verdict {
    fn new(what: String, pair: Option<String>, bytes: u64, gbps: f64, limit: Option<(f64, String)>) -> Verdict {
        let share = limit.as_ref().map(|(l, _)| gbps / l);
        let (limit_gbps, limit_how) = limit.map_or((None, None), |(l, how)| (Some(l), Some(how)));
        Verdict {
            what,
            pair,
            bytes,
            gbps,
            limit_gbps,
            limit_how,
            share,
            low: share.is_some_and(|s| s < LOW_SHARE),
            cause: None,
        }
    }

    /// `GPU0↔GPU1 NV18: NCCL all-reduce bus bandwidth 350 GB/s at 1 GiB = 73 % of 478 GB/s (18
    /// links × 26.56 GB/s)`, and for a low one `— below 50 % of the link: <cause>`.
    fn text(&self) -> String {
        let pair = self.pair.as_ref().map_or(String::new(), |p| format!("{p}: "));
        let mut t = format!("{pair}{} {:.0} GB/s at {}", self.what, self.gbps, human_bytes(self.bytes));
        match (self.share, self.limit_gbps, &self.limit_how) {
            (Some(s), Some(l), Some(how)) => t += &format!(" = {:.0} % of {l:.0} GB/s ({how})", s * 100.0),
            _ => t += " (no limit to compare with: the link's speed is unknown)",
        }
        if self.low {
            t += &format!(" — below {:.0} % of the link", LOW_SHARE * 100.0);
            if let Some(c) = &self.cause {
                t += &format!(": {c}");
            }
        }
        t
    }

    fn check(&self, fix: &str) -> Check {
        match (self.low, self.share) {
            (true, _) => Check::fail(L, self.text(), fix),
            (false, Some(_)) => Check::new(L, Status::Pass, self.text()),
            (false, None) => Check::new(L, Status::Info, self.text()),
        }
    }
}

/// Every bandwidth the live run measured, against the link's limit: NCCL's all-reduce and
/// send/recv bus bandwidth at the largest size against the slowest link of the ring, and each
/// PE's NVSHMEM put rate against the link to the PE it put to.
pub fn verdicts(
    f: &LiveFacts,
    machine: Option<&Machine>,
    peer_ok: &dyn Fn(usize, usize) -> Option<bool>,
) -> Vec<Verdict> {
    let mut out = Vec::new();
    // Each rank's device as NVML numbers it, in rank order.
    let gpus: Vec<usize> = f.nccl.iter().filter_map(|r| nvml_index(machine, &r.bus_id)).collect();
    // The ring's links: each rank's GPU to the next rank's; the slowest sets the limit.
    let mut limit: Option<(f64, String, usize, usize)> = None;
    if let Some(m) = machine {
        for (i, &a) in gpus.iter().enumerate() {
            let Some(&b) = gpus.get((i + 1) % gpus.len()) else { continue };
            if let Some((rate, how)) = topo::link_rate(m, a, b).filter(|_| a != b) {
                if limit.as_ref().is_none_or(|l| rate < l.0) {
                    limit = Some((rate, how, a, b));
                }
            }
        }
    }
    let pair = |a: usize, b: usize| {
        machine.map(|m| format!("GPU{}↔GPU{} {}", a.min(b), a.max(b), topo::link(m, a, b).notation()))
    };
    // Without a known limit, the first pair of the ring still names the GPUs.
    let ends = limit.as_ref().map(|l| (l.2, l.3)).or_else(|| Some((*gpus.first()?, *gpus.get(1)?)));
    if let Some(first) = f.nccl.iter().find(|r| r.error.is_none()) {
        for (name, points) in
            [("NCCL all-reduce bus bandwidth", &first.all_reduce), ("NCCL send/recv bus bandwidth", &first.sendrecv)]
        {
            let Some(p) = peak(points) else { continue };
            let lim = limit.as_ref().map(|l| (l.0, l.1.clone()));
            let mut v = Verdict::new(name.into(), ends.and_then(|(a, b)| pair(a, b)), p.bytes, p.busbw, lim);
            if v.low {
                v.cause = ends.map(|(a, b)| nccl_cause(f, a, b, peer_ok));
            }
            out.push(v);
        }
    }
    for pe in f.nvshmem.iter().filter(|pe| pe.error.is_none()) {
        let Some(gbps) = pe.put_gbps else { continue };
        // The worker puts to the next PE.
        let peer = (pe.rank + 1) % f.nproc.max(1);
        let gpu = |rank: usize| nvml_index(machine, &f.nccl.iter().find(|r| r.rank == rank)?.bus_id);
        let ab = gpu(pe.rank).zip(gpu(peer));
        let lim = machine.zip(ab).and_then(|(m, (a, b))| topo::link_rate(m, a, b));
        let what = format!("NVSHMEM PE {} → PE {peer} put rate", pe.rank);
        let mut v = Verdict::new(what, ab.and_then(|(a, b)| pair(a, b)), PUT_BYTES as u64, gbps, lim);
        if v.low {
            let reachable = pe.reachable.iter().find(|(p, _)| *p == peer).map(|r| r.1);
            v.cause = Some(if reachable == Some(false) {
                format!("PE {peer} is not load/store reachable, so the puts go through NVSHMEM's proxy thread")
            } else {
                "the peer is reachable over P2P: other work on these GPUs (nvidia-smi)?".into()
            });
        }
        out.push(v);
    }
    out
}

/// Why NCCL's bandwidth between GPUs `a` and `b` is low: the transport it took and why.
fn nccl_cause(f: &LiveFacts, a: usize, b: usize, peer_ok: &dyn Fn(usize, usize) -> Option<bool>) -> String {
    let t = f.log.transports_between(a, b);
    if t.is_empty() {
        return "NCCL's log names no transport between these GPUs (rerun with --logs DIR and read it)".into();
    }
    if t.iter().all(|(k, _)| *k == Transport::P2p) {
        return format!("NCCL uses P2P ({}): other work on these GPUs (nvidia-smi)?", transport_list(&t));
    }
    let mut kinds: Vec<&str> = t.iter().filter(|(k, _)| *k != Transport::P2p).map(|(k, _)| k.name()).collect();
    kinds.dedup();
    format!("NCCL uses {} ({}) because {}", kinds.join("+"), transport_list(&t), because(f, a, b, peer_ok))
}

fn nvshmem_checks(f: &LiveFacts) -> Vec<Check> {
    let mut out = Vec::new();
    for pe in &f.nvshmem {
        if let Some(e) = &pe.error {
            out.push(Check::warn(
                L,
                format!("PE {}: NVSHMEM failed: {e}", pe.rank),
                "check the software layer's NVSHMEM line; NVSHMEM_DEBUG=INFO shows more",
            ));
            continue;
        }
        for (peer, reachable) in &pe.reachable {
            let title = format!(
                "NVSHMEM PE {} → PE {peer}: {}",
                pe.rank,
                if *reachable { "load/store reachable (nvshmem_ptr non-NULL)" } else { "not load/store reachable" }
            );
            out.push(if *reachable { Check::new(L, Status::Pass, title) } else { Check::warn(L, title, "NVSHMEM needs CUDA P2P between the GPUs for direct loads and stores; see the physical layer and NVSHMEM_DISABLE_P2P") });
        }
    }
    let mut mapped: Vec<&PathBuf> = f.nvshmem.iter().flat_map(|p| p.nccl_mapped.iter()).collect();
    mapped.sort();
    mapped.dedup();
    let real: Vec<PathBuf> = {
        let mut r: Vec<PathBuf> =
            mapped.iter().map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())).collect();
        r.sort();
        r.dedup();
        r
    };
    let nvshmem_nccl = f.nvshmem_log.versions.iter().cloned().collect::<Vec<_>>().join(", ");
    if real.len() > 1 {
        out.push(Check::fail(
            L,
            format!("two NCCLs in one process once NVSHMEM started: {}", real.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" and ")),
            "NVSHMEM opens libnccl.so.2 by name: put the directory of the NCCL you use first in LD_LIBRARY_PATH, or set NVSHMEM_DISABLE_NCCL=1",
        ));
    } else if let Some(p) = real.first() {
        let v = if nvshmem_nccl.is_empty() { String::new() } else { format!(" (NCCL {nvshmem_nccl})") };
        out.push(Check::new(L, Status::Pass, format!("NVSHMEM uses the same NCCL as the process: {}{v}", p.display())));
    }
    out
}

fn gin_nvls_checks(log: &NcclLog, version: &str) -> Vec<Check> {
    let mut out = Vec::new();
    match &log.gin_plugin {
        Some(p) => out.push(Check::new(
            L,
            Status::Pass,
            format!("GIN (GPU-initiated networking) available through the {p} plugin"),
        )),
        None => {
            let mut why = Vec::new();
            if log.ib_absent {
                why.push("NET/IB found no device".to_string());
            }
            if let Some(n) = &log.network {
                why.push(format!("network {n}"));
            }
            let why = if why.is_empty() { String::new() } else { format!(" ({})", why.join(", ")) };
            out.push(Check::new(
                L,
                Status::Info,
                format!("GIN not available: NCCL {version} assigned no GIN plugin — GIN needs an RDMA NIC (InfiniBand/RoCE) that NCCL's IB plugin drives{why}"),
            ));
        }
    }
    let nvls_channels = log.channels.map(|c| c.nvls);
    match (log.nvls_available, nvls_channels) {
        (_, Some(n)) if n > 0 => out.push(Check::fail(
            L,
            format!("NCCL set up {n} NVLS (multicast) channels"),
            "export NCCL_NVLS_ENABLE=0: NVLink multicast can take shared GPUs out of service",
        )),
        (_, Some(_)) | (Some(false), _) => {
            out.push(Check::new(L, Status::Pass, "NVLS (NVLink multicast) off: 0 NVLS channels"))
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::source::fixtures::h200_pair;
    use super::*;

    fn point(bytes: u64, busbw: f64) -> Point {
        Point { bytes, time_us: 1.0, busbw }
    }

    fn facts(log: &str, reasons: &[&str], busbw: f64) -> LiveFacts {
        let mut f =
            LiveFacts { nproc: 2, reasons: reasons.iter().map(|s| s.to_string()).collect(), ..LiveFacts::default() };
        for (rank, bus) in [(0, "0000:00:06.0"), (1, "0000:00:07.0")] {
            f.nccl.push(NcclPhase {
                rank,
                pid: 100 + rank as u32,
                device: rank,
                bus_id: bus.into(),
                nccl_version: Some("2.28.9".into()),
                all_reduce: vec![point(8, 0.0), point(1 << 30, busbw)],
                sendrecv: vec![point(1 << 30, busbw + 20.0)],
                error: None,
            });
        }
        f.log.read(log);
        f
    }

    const P2P: &str = "\
vm:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:1:2 [0] NCCL INFO Using network Socket
vm:1:2 [0] NCCL INFO NET/IB : No device found.
vm:1:2 [0] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer
vm:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
vm:2:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
vm:1:1 [0] NCCL INFO AllReduce: 8 Bytes -> Algo Ring proto LL channel{Lo..Hi}={0..0}
vm:1:1 [0] NCCL INFO AllReduce: 1073741824 Bytes -> Algo Ring proto Simple channel{Lo..Hi}={0..23}
";

    const SOCKETS: &str = "\
vm:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:1:1 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1.
vm:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0
vm:1:2 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [receive] via NET/Socket/0
";

    fn status_of<'a>(c: &'a [Check], start: &str) -> &'a Check {
        c.iter().find(|c| c.title.starts_with(start)).unwrap_or_else(|| panic!("no check starting {start:?} in {c:#?}"))
    }

    #[test]
    fn nvlink_and_p2p_at_good_bandwidth() {
        let m = Machine::read(&h200_pair()).unwrap();
        let c = checks(&facts(P2P, &[], 346.0), Some(&m), &|_, _| Some(true));
        assert_eq!(status_of(&c, "communicator of 2 ranks").status, Status::Pass);
        assert_eq!(
            status_of(&c, "GPU0↔GPU1 NV18: NCCL uses P2P").title,
            "GPU0↔GPU1 NV18: NCCL uses P2P (P2P/CUMEM/read)"
        );
        let bw = status_of(&c, "GPU0↔GPU1 NV18: NCCL all-reduce bus bandwidth");
        assert_eq!(bw.status, Status::Pass);
        assert_eq!(
            bw.title,
            "GPU0↔GPU1 NV18: NCCL all-reduce bus bandwidth 346 GB/s at 1 GiB = 72 % of 478 GB/s (18 links × 26.56 GB/s)"
        );
        assert_eq!(
            status_of(&c, "GPU0↔GPU1 NV18: NCCL send/recv").title,
            "GPU0↔GPU1 NV18: NCCL send/recv bus bandwidth 366 GB/s at 1 GiB = 77 % of 478 GB/s (18 links × 26.56 GB/s)"
        );
        assert_eq!(
            status_of(&c, "all-reduce algorithm/protocol").title,
            "all-reduce algorithm/protocol: Ring/LL 8 B, Ring/Simple 1 GiB; 24 coll, 32 p2p, 0 NVLS channels"
        );
        let gin = status_of(&c, "GIN not available");
        assert!(gin.title.ends_with("(NET/IB found no device, network Socket)"), "{}", gin.title);
        assert_eq!(status_of(&c, "NVLS").status, Status::Pass);
        assert!(c.iter().all(|c| c.status != Status::Fail), "{c:#?}");
    }

    #[test]
    fn nvlink_present_but_sockets_says_why() {
        let m = Machine::read(&h200_pair()).unwrap();
        let reasons = ["NCCL_P2P_DISABLE=1 (CUDA P2P … is off)", "NCCL_SHM_DISABLE=1 (shared-memory transport off)"];
        let c = checks(&facts(SOCKETS, &reasons, 9.0), Some(&m), &|_, _| Some(true));
        let t = status_of(&c, "GPU0↔GPU1 NV18: NVLink present but NCCL uses NET");
        assert_eq!(t.status, Status::Fail);
        assert_eq!(
            t.title,
            "GPU0↔GPU1 NV18: NVLink present but NCCL uses NET (NET/Socket/0) — because NCCL_P2P_DISABLE=1 (CUDA P2P … is off); NCCL_SHM_DISABLE=1 (shared-memory transport off)"
        );
        let bw = status_of(&c, "GPU0↔GPU1 NV18: NCCL all-reduce bus bandwidth 9 GB/s");
        assert_eq!(bw.status, Status::Fail);
        assert_eq!(
            bw.title,
            "GPU0↔GPU1 NV18: NCCL all-reduce bus bandwidth 9 GB/s at 1 GiB = 2 % of 478 GB/s (18 links × 26.56 GB/s) \
             — below 50 % of the link: NCCL uses NET (NET/Socket/0) because NCCL_P2P_DISABLE=1 (CUDA P2P … is off); \
             NCCL_SHM_DISABLE=1 (shared-memory transport off)"
        );
        let v = verdicts(&facts(SOCKETS, &reasons, 9.0), Some(&m), &|_, _| Some(true));
        assert_eq!(v.len(), 2);
        assert!(v.iter().all(|v| v.low && v.limit_gbps.is_some_and(|l| (l - 478.116).abs() < 1e-9)));
        assert_eq!(v[1].what, "NCCL send/recv bus bandwidth");
        assert!(v[1].cause.as_deref().unwrap().starts_with("NCCL uses NET (NET/Socket/0) because NCCL_P2P_DISABLE=1"));
        let json = serde_json::to_value(&v[0]).unwrap();
        assert_eq!(json["pair"], "GPU0↔GPU1 NV18");
        assert_eq!(json["bytes"], 1u64 << 30);
        assert_eq!(json["limit_how"], "18 links × 26.56 GB/s");
        assert_eq!(json["low"], true);
        let unexplained = checks(&facts(SOCKETS, &[], 9.0), Some(&m), &|_, _| Some(false));
        assert!(status_of(&unexplained, "GPU0↔GPU1 NV18: NVLink present")
            .title
            .ends_with("because CUDA refuses peer access between them"));
    }

    #[test]
    fn failed_runs_two_nccls_and_nvshmem() {
        let mut f = facts(P2P, &[], 346.0);
        f.errors.push("nccl phase: rank 1 exited with code 1; the ranks still running were stopped".into());
        f.log.read("vm:1:1 [0] NCCL INFO NCCL version 2.28.3+cuda13.0\n");
        f.nvshmem = vec![NvshmemPhase {
            rank: 0,
            nvshmem_version: Some("3.4.5".into()),
            reachable: vec![(1, true)],
            put_gbps: Some(390.3),
            nccl_mapped: vec![
                PathBuf::from("/wheel/libnccl.so.2"),
                PathBuf::from("/lib/x86_64-linux-gnu/libnccl.so.2"),
            ],
            error: None,
        }];
        let m = Machine::read(&h200_pair()).unwrap();
        let c = checks(&f, Some(&m), &|_, _| Some(true));
        assert_eq!(status_of(&c, "live run failed: nccl phase: rank 1").status, Status::Fail);
        assert_eq!(status_of(&c, "NCCL's log shows 2 libraries").status, Status::Fail);
        assert_eq!(
            status_of(&c, "NVSHMEM PE 0 → PE 1").title,
            "NVSHMEM PE 0 → PE 1: load/store reachable (nvshmem_ptr non-NULL)"
        );
        let put = status_of(&c, "GPU0↔GPU1 NV18: NVSHMEM PE 0 → PE 1 put rate");
        assert_eq!(put.status, Status::Pass);
        assert_eq!(
            put.title,
            "GPU0↔GPU1 NV18: NVSHMEM PE 0 → PE 1 put rate 390 GB/s at 64 MiB = 82 % of 478 GB/s (18 links × 26.56 GB/s)"
        );
        let two = status_of(&c, "two NCCLs in one process");
        assert_eq!(two.status, Status::Fail);
        assert!(two.fix.as_deref().unwrap().contains("NVSHMEM_DISABLE_NCCL=1"));
        let nothing = checks(&LiveFacts::default(), None, &|_, _| None);
        assert!(nothing.is_empty());
    }

    #[test]
    fn no_communicator_when_a_rank_failed_or_wrote_nothing() {
        let communicator = |c: &[Check]| -> Vec<(Status, String)> {
            c.iter().filter(|c| c.title.contains("communicator")).map(|c| (c.status, c.title.clone())).collect()
        };
        // Every rank's init failed: each still wrote its result, with the error.
        let mut f = facts(P2P, &[], 346.0);
        for r in &mut f.nccl {
            r.error = Some("ncclCommInitRank: unhandled system error".into());
        }
        let c = checks(&f, None, &|_, _| None);
        assert_eq!(
            communicator(&c),
            [(
                Status::Fail,
                "no communicator of 2 ranks: 0 of 2 ranks reported one (NCCL failed on rank(s) 0, 1)".to_string()
            )]
        );
        // Rank 1 wrote nothing (killed), rank 0 is fine.
        let mut f = facts(P2P, &[], 346.0);
        f.nccl.truncate(1);
        let c = checks(&f, None, &|_, _| None);
        assert_eq!(
            communicator(&c),
            [(
                Status::Fail,
                "no communicator of 2 ranks: 1 of 2 ranks reported one (rank(s) 1 wrote no result)".to_string()
            )]
        );
        // No rank wrote anything.
        f.nccl.clear();
        let c = checks(&f, None, &|_, _| None);
        assert_eq!(communicator(&c)[0].0, Status::Fail);
        assert!(communicator(&c)[0].1.ends_with("(rank(s) 0, 1 wrote no result)"), "{c:#?}");
    }

    #[test]
    fn the_vms_hidden_switches_still_give_the_limit_and_a_slow_put_names_its_cause() {
        let m = Machine::read(&super::super::source::fixtures::h200_vm()).unwrap();
        let mut f = facts(P2P, &[], 346.0);
        f.nvshmem = (0..2)
            .map(|rank| NvshmemPhase {
                rank,
                reachable: vec![(1 - rank, rank == 0)],
                put_gbps: Some(if rank == 0 { 379.0 } else { 12.0 }),
                ..NvshmemPhase::default()
            })
            .collect();
        let c = checks(&f, Some(&m), &|_, _| Some(true));
        assert_eq!(status_of(&c, "GPU0↔GPU1 NV18: NCCL all-reduce bus bandwidth 346 GB/s").status, Status::Pass);
        let slow = status_of(&c, "GPU0↔GPU1 NV18: NVSHMEM PE 1 → PE 0 put rate 12 GB/s");
        assert_eq!(slow.status, Status::Fail);
        assert!(
            slow.title.ends_with("— below 50 % of the link: PE 0 is not load/store reachable, so the puts go through NVSHMEM's proxy thread"),
            "{}",
            slow.title
        );
    }

    #[test]
    fn an_earlier_runs_results_and_logs_in_the_logs_folder_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let earlier = facts(P2P, &[], 346.0);
        for r in &earlier.nccl {
            let path = result_path(dir.path(), Phase::Nccl, r.rank);
            std::fs::write(path, serde_json::to_string(r).unwrap()).unwrap();
        }
        std::fs::write(dir.path().join("nccl-nccl.vm.1.log"), P2P).unwrap();
        std::fs::write(dir.path().join("nvshmem-nccl.vm.1.log"), P2P).unwrap();
        // This run's ranks all die before writing anything.
        let died = |_: usize, _: Phase, _: &Path, _: &[(String, String)]| Err("rank 0 was killed by signal 9".into());
        let f = gather_with(2, dir.path(), &died);
        assert!(f.nccl.is_empty(), "{:?}", f.nccl);
        assert!(f.log.versions.is_empty() && f.log.connections.is_empty(), "{:?}", f.log);
        assert!(f.nvshmem_log.versions.is_empty());
        assert_eq!(f.errors.len(), 2, "{:?}", f.errors);
        // What this run writes is read.
        let wrote = |n: usize, phase: Phase, d: &Path, _: &[(String, String)]| {
            if phase == Phase::Nccl {
                for r in earlier.nccl.iter().take(n) {
                    std::fs::write(result_path(d, phase, r.rank), serde_json::to_string(r).unwrap()).unwrap();
                }
                std::fs::write(d.join("nccl-nccl.vm.2.log"), P2P).unwrap();
            }
            Ok(())
        };
        let f = gather_with(2, dir.path(), &wrote);
        assert_eq!(f.nccl, earlier.nccl);
        assert_eq!(f.log.connections.len(), 2);
        assert!(f.errors.is_empty(), "{:?}", f.errors);
    }

    #[test]
    fn without_a_known_speed_the_bandwidth_is_still_reported() {
        let mut fake = super::super::source::fixtures::h200_pair();
        for g in &mut fake.gpus {
            for l in &mut g.links {
                l.speed_mbps = None;
            }
        }
        let m = Machine::read(&fake).unwrap();
        let c = checks(&facts(P2P, &[], 346.0), Some(&m), &|_, _| Some(true));
        let bw = status_of(&c, "GPU0↔GPU1 NV18: NCCL all-reduce bus bandwidth");
        assert_eq!(bw.status, Status::Info);
        assert_eq!(
            bw.title,
            "GPU0↔GPU1 NV18: NCCL all-reduce bus bandwidth 346 GB/s at 1 GiB (no limit to compare with: the link's speed is unknown)"
        );
        // No NVML at all: the figure alone.
        let c = checks(&facts(P2P, &[], 346.0), None, &|_, _| None);
        assert_eq!(
            status_of(&c, "NCCL all-reduce").title,
            "NCCL all-reduce bus bandwidth 346 GB/s at 1 GiB (no limit to compare with: the link's speed is unknown)"
        );
    }
}
