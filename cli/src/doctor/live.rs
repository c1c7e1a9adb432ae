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
use super::worker::{result_path, NcclPhase, NvshmemPhase, Point};
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
    let mut facts = LiveFacts { nproc, ..LiveFacts::default() };
    facts.reasons = envvars::transport_reasons(|n| std::env::var(n).ok());
    for phase in ["nccl", "nvshmem"] {
        let log_file = dir.join(format!("{phase}-nccl.%h.%p.log"));
        let mut env: Vec<(String, String)> = NCCL_LOG_ENV.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        env.push(("NCCL_DEBUG_FILE".into(), log_file.to_string_lossy().into_owned()));
        if phase == "nvshmem" {
            env[1].1 = "INIT".into();
        }
        if let Err(e) = spawn(nproc, phase, dir, &env) {
            facts.errors.push(format!("{phase} phase: {e}"));
        }
        for rank in 0..nproc {
            let Ok(text) = std::fs::read_to_string(result_path(dir, phase, rank)) else { continue };
            let parsed = match phase {
                "nccl" => serde_json::from_str(&text).map(|r| facts.nccl.push(r)),
                _ => serde_json::from_str(&text).map(|r| facts.nvshmem.push(r)),
            };
            if let Err(e) = parsed {
                facts.errors.push(format!("{phase} phase, rank {rank}: unreadable result: {e}"));
            }
        }
        let log = if phase == "nccl" { &mut facts.log } else { &mut facts.nvshmem_log };
        for file in logs(dir, &format!("{phase}-nccl.")) {
            if let Ok(text) = std::fs::read_to_string(&file) {
                log.read(&text);
            }
        }
    }
    facts
}

fn spawn(nproc: usize, phase: &str, dir: &Path, env: &[(String, String)]) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let args: Vec<std::ffi::OsString> =
        vec!["__doctor-worker".into(), "--phase".into(), phase.into(), "--out".into(), dir.into()];
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
    let Some(first) = f.nccl.first() else { return out };
    let version = first.nccl_version.as_deref().unwrap_or("?");
    out.push(Check::new(
        L,
        Status::Pass,
        format!("communicator of {} ranks, NCCL {version}, one process per GPU", f.nccl.len()),
    ));
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
    // Each rank's device as NVML numbers it (NCCL's log uses NVML indexes too).
    let gpus: Vec<(usize, usize)> =
        f.nccl.iter().filter_map(|r| Some((r.rank, nvml_index(machine, &r.bus_id)?))).collect();
    out.extend(pair_checks(f, machine, &gpus, peer_ok));
    out.extend(algorithm_checks(&f.log));
    out.extend(bandwidth_checks(f, machine, &gpus));
    out.extend(nvshmem_checks(f, machine));
    out.extend(gin_nvls_checks(&f.log, version));
    let mut warnings = f.log.warnings.clone();
    warnings.sort();
    warnings.dedup();
    for w in warnings.iter().take(5) {
        out.push(Check::warn(L, format!("NCCL warned: {w}"), "read NCCL's log (gpucomm doctor --logs DIR keeps it)"));
    }
    out
}

/// Transport per pair of GPUs NCCL connected, against the physical link.
fn pair_checks(
    f: &LiveFacts,
    machine: Option<&Machine>,
    gpus: &[(usize, usize)],
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
    if pairs.is_empty() && gpus.len() > 1 {
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
            let mut why = f.reasons.clone();
            if peer_ok(a, b) == Some(false) {
                why.push("CUDA refuses peer access between them".into());
            }
            why.extend(f.log.p2p_notes.iter().cloned());
            let because = if why.is_empty() {
                "no variable or peer-access problem explains it (see NCCL's log)".to_string()
            } else {
                why.join("; ")
            };
            out.push(Check::fail(
                L,
                format!("{pair}: NVLink present but NCCL uses {} ({}) — because {because}", kinds.join("+"), transport_list(&t)),
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
    let _ = gpus;
    out
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

/// Bus bandwidth at the largest size against the slowest link NCCL used.
fn bandwidth_checks(f: &LiveFacts, machine: Option<&Machine>, gpus: &[(usize, usize)]) -> Vec<Check> {
    let mut out = Vec::new();
    let Some(m) = machine else { return out };
    // The ring's links: each rank's GPU to the next rank's.
    let mut limit: Option<(f64, String, String)> = None;
    for (i, &(_, a)) in gpus.iter().enumerate() {
        let Some(&(_, b)) = gpus.get((i + 1) % gpus.len()) else { continue };
        if a == b {
            continue;
        }
        if let Some((rate, how)) = topo::link_rate(m, a, b) {
            if limit.as_ref().is_none_or(|l| rate < l.0) {
                limit = Some((rate, how, format!("GPU{a}↔GPU{b} {}", topo::link(m, a, b).notation())));
            }
        }
    }
    let Some((rate, how, pair)) = limit else { return out };
    let first = &f.nccl[0];
    for (name, points) in [("all-reduce", &first.all_reduce), ("send/recv", &first.sendrecv)] {
        let Some(p) = peak(points) else { continue };
        let share = p.busbw / rate;
        let title = format!(
            "{pair}: {name} bus bandwidth {:.0} GB/s at {} = {:.0} % of {rate:.0} GB/s ({how})",
            p.busbw,
            human_bytes(p.bytes),
            share * 100.0
        );
        if share < LOW_SHARE {
            out.push(Check::fail(L, format!("{title}: bandwidth below 50 % of the link"), "check the transport above, other jobs on these GPUs (nvidia-smi), and a longer run: gpucomm bench all_reduce -b 1M -e 8G -f 4"));
        } else {
            out.push(Check::new(L, Status::Pass, title));
        }
    }
    out
}

fn nvshmem_checks(f: &LiveFacts, machine: Option<&Machine>) -> Vec<Check> {
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
        if let Some(gbps) = pe.put_gbps {
            let limit = machine.and_then(|m| {
                let a = nvml_index(Some(m), &f.nccl.get(pe.rank)?.bus_id)?;
                let b = nvml_index(Some(m), &f.nccl.get((pe.rank + 1) % f.nccl.len())?.bus_id)?;
                topo::link_rate(m, a, b)
            });
            let share =
                limit.as_ref().map_or(String::new(), |(r, _)| format!(" = {:.0} % of {r:.0} GB/s", gbps / r * 100.0));
            out.push(Check::new(
                L,
                Status::Info,
                format!("NVSHMEM PE {} put {} to the next PE: {gbps:.0} GB/s{share}", pe.rank, human_bytes(64 << 20)),
            ));
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
        let bw = status_of(&c, "GPU0↔GPU1 NV18: all-reduce bus bandwidth");
        assert_eq!(bw.status, Status::Pass);
        assert_eq!(
            bw.title,
            "GPU0↔GPU1 NV18: all-reduce bus bandwidth 346 GB/s at 1 GiB = 72 % of 478 GB/s (18 links × 26.56 GB/s)"
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
        let bw = status_of(&c, "GPU0↔GPU1 NV18: all-reduce bus bandwidth 9 GB/s");
        assert_eq!(bw.status, Status::Fail);
        assert!(bw.title.ends_with("bandwidth below 50 % of the link"));
        let unexplained = checks(&facts(SOCKETS, &[], 9.0), Some(&m), &|_, _| Some(false));
        assert!(status_of(&unexplained, "GPU0↔GPU1 NV18: NVLink present")
            .title
            .ends_with("because CUDA refuses peer access between them"));
    }

    #[test]
    fn failed_runs_two_nccls_and_nvshmem() {
        let mut f = facts(P2P, &[], 346.0);
        f.errors.push("nccl phase: rank 1 exited with code 1; the other ranks were stopped".into());
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
        assert_eq!(
            status_of(&c, "NVSHMEM PE 0 put").title,
            "NVSHMEM PE 0 put 64 MiB to the next PE: 390 GB/s = 82 % of 478 GB/s"
        );
        let two = status_of(&c, "two NCCLs in one process");
        assert_eq!(two.status, Status::Fail);
        assert!(two.fix.as_deref().unwrap().contains("NVSHMEM_DISABLE_NCCL=1"));
        let nothing = checks(&LiveFacts::default(), None, &|_, _| None);
        assert!(nothing.is_empty());
    }
}
