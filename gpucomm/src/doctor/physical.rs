//! Layer 1: GPUs, NVLink links and their error counters, the topology matrix, peer access.

use super::report::{Check, Layer, Status};
use super::source::{normalize_bus_id, GpuFacts, LinkErrors, LinkFacts, Machine, NvlinkVersion, Remote};
use super::topo::{self, Link};
use crate::cuda::{self, PeerAccess};

const L: Layer = Layer::Physical;

/// The fix when NVML cannot be used at all.
pub const NVML_FIX: &str = "install the NVIDIA driver (it ships libnvidia-ml.so.1), or add the directory that holds \
libnvidia-ml.so.1 to LD_LIBRARY_PATH; in a container, start it with the GPU runtime (--gpus all)";

/// Checks on what NVML said; `cuda_version` is `cuDriverGetVersion`, `peers` the CUDA peer matrix.
pub fn checks(m: &Machine, cuda_version: Option<i32>, peers: Result<&[PeerAccess], String>) -> Vec<Check> {
    let mut out = Vec::new();
    let cuda = cuda_version.map_or("CUDA driver not loaded".to_string(), |v| format!("CUDA {}", cuda::version_text(v)));
    let driver = m.driver.as_deref().unwrap_or("version unknown");
    if m.gpus.is_empty() {
        out.push(Check::fail(
            L,
            format!("no GPU found (driver {driver}, {cuda})"),
            "check `nvidia-smi -L`; in a container, start it with the GPU runtime (--gpus all)",
        ));
        return out;
    }
    out.push(Check::new(L, Status::Info, format!("{} GPU(s), driver {driver}, {cuda}", m.gpus.len())));
    for g in &m.gpus {
        let cc = g.compute_capability.map_or("compute capability unknown".to_string(), |(a, b)| format!("sm_{a}{b}"));
        let numa = g.numa_node.map_or(String::new(), |n| format!(", NUMA {n}"));
        let pcie = g.pcie.map_or(String::new(), |(gen, w)| format!(", PCIe gen{gen} x{w}"));
        out.push(Check::new(
            L,
            Status::Pass,
            format!("GPU{} {} ({cc}, bus {}{pcie}{numa})", g.index, g.name, g.bus_id),
        ));
    }
    for g in &m.gpus {
        out.extend(link_checks(m, g));
    }
    out.push(
        Check::new(L, Status::Info, "topology (nvidia-smi topo -m notation; NV# = NVLink links)")
            .with_detail(topo::matrix(m)),
    );
    out.extend(pair_checks(m, peers));
    for e in &m.errors {
        out.push(Check::new(L, Status::Warn, format!("NVML could not tell: {e}")));
    }
    out
}

/// State, version, speed, far ends and error counters of one GPU's links.
fn link_checks(m: &Machine, g: &GpuFacts) -> Vec<Check> {
    let mut out = Vec::new();
    let active: Vec<&LinkFacts> = g.active_links().collect();
    if active.is_empty() {
        out.push(Check::new(
            L,
            Status::Info,
            format!("GPU{}: no active NVLink links ({} present)", g.index, g.links.len()),
        ));
        return out;
    }
    let mut versions: Vec<NvlinkVersion> = active.iter().filter_map(|l| l.version).collect();
    versions.sort_unstable();
    versions.dedup();
    let version = match &versions[..] {
        [] => "NVLink version unknown".to_string(),
        [v] => v.to_string(),
        many => format!("mixed versions: {}", many.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let title = format!(
        "GPU{}: {}/{} NVLink links up, {version}, {}; far end {}",
        g.index,
        active.len(),
        g.links.len(),
        speed_text(g, &active),
        far_ends(m, g)
    );
    let down: Vec<String> = g.links.iter().filter(|l| !l.active).map(|l| l.link.to_string()).collect();
    if down.is_empty() {
        out.push(Check::new(L, Status::Pass, title));
    } else {
        out.push(Check::fail(
            L,
            format!("{title} — link(s) {} down: degraded", down.join(", ")),
            "read `nvidia-smi nvlink -s`; reset the GPU (`nvidia-smi -r` when idle) or reboot; on NVSwitch systems check the fabric manager; reseat the NVLink bridge or call the vendor if a link stays down",
        ));
    }
    out.push(counters_since_boot(g));
    out
}

/// `26.56 GB/s each, 478 GB/s per direction` from the links' speeds.
fn speed_text(g: &GpuFacts, active: &[&LinkFacts]) -> String {
    let speeds: Option<Vec<u64>> = active.iter().map(|l| g.link_speed_mbps(l)).collect();
    let Some(speeds) = speeds else { return "speed unknown (NVML gives no NVLink speed)".into() };
    let (lo, hi) = (speeds.iter().min().copied().unwrap_or(0), speeds.iter().max().copied().unwrap_or(0));
    let total = g.nvlink_gbps().unwrap_or(0.0);
    if lo == hi {
        format!("{:.2} GB/s each, {total:.0} GB/s per direction", lo as f64 / 1000.0)
    } else {
        format!("{:.2}–{:.2} GB/s per link, {total:.0} GB/s per direction", lo as f64 / 1000.0, hi as f64 / 1000.0)
    }
}

/// What one GPU's active NVLink links reach, for the report and for `--json`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FarEnd {
    /// The GPU whose links these are.
    pub gpu: usize,
    /// GPUs named by a link's own far end (its PCI address is a GPU of this machine).
    pub direct: Vec<usize>,
    /// GPUs reached through an NVSwitch, or through links whose far end the driver does not name
    /// as a GPU of this machine: found from the topology.
    pub through_topology: Vec<usize>,
    /// What told `through_topology`: `"nvml_nvlink_p2p"` (NVML's NVLink P2P status says yes for
    /// each) or `"topology"` (the links alone); `None` when it is empty.
    pub named_by: Option<&'static str>,
    /// Links whose far end is an NVSwitch.
    pub switch_links: usize,
    /// Far-end addresses the driver gives that are no GPU of this machine (`ffffffff:ff:ff.0` on
    /// a VM that hides its NVSwitches).
    pub unnamed: Vec<String>,
}

/// What the active links of `g` reach: GPUs by the far end's PCI address; through a switch, or
/// where the driver's far end is no GPU of this machine (a VM that hides the NVSwitches answers
/// `ffffffff:ff:ff.0`), the GPUs that the topology (NVML's NVLink P2P status) reaches over NVLink.
pub fn far_end(m: &Machine, g: &GpuFacts) -> FarEnd {
    let mut direct = Vec::new();
    let mut switch_links = 0;
    let mut unnamed: Vec<String> = Vec::new();
    for l in g.active_links() {
        match (l.remote, l.remote_bus_id.as_deref().and_then(|id| m.gpu_at(id))) {
            (Some(Remote::Switch), _) => switch_links += 1,
            (_, Some(peer)) => direct.push(peer.index),
            _ => unnamed.push(l.remote_bus_id.clone().unwrap_or_else(|| "unknown".into())),
        }
    }
    direct.sort_unstable();
    direct.dedup();
    unnamed.sort();
    unnamed.dedup();
    let mut through_topology = Vec::new();
    if switch_links + unnamed.len() > 0 {
        through_topology = m
            .gpus
            .iter()
            .filter(|b| b.index != g.index && topo::direct_links(g, b) == 0)
            .filter(|b| matches!(topo::link(m, g.index, b.index), Link::Nvlink(_)))
            .map(|b| b.index)
            .collect();
    }
    let named_by = (!through_topology.is_empty()).then(|| {
        if through_topology.iter().all(|&b| m.nvlink_p2p(g.index, b) == Some(true)) {
            "nvml_nvlink_p2p"
        } else {
            "topology"
        }
    });
    FarEnd { gpu: g.index, direct, through_topology, named_by, switch_links, unnamed }
}

/// [`far_end`] as the report's words.
fn far_ends(m: &Machine, g: &GpuFacts) -> String {
    let end = far_end(m, g);
    let name = |i: &usize| m.gpu(*i).map_or(format!("GPU{i}"), |x| format!("GPU{} ({})", x.index, x.bus_id));
    let mut parts: Vec<String> = end.direct.iter().map(name).collect();
    if end.switch_links + end.unnamed.len() > 0 {
        let names = end.through_topology.iter().map(name).collect::<Vec<_>>().join(", ");
        let by = match end.named_by {
            Some("nvml_nvlink_p2p") => "NVML's NVLink P2P status",
            _ => "the topology",
        };
        parts.push(match (end.through_topology.is_empty(), end.unnamed.is_empty()) {
            (true, true) => "NVSwitch".to_string(),
            (true, false) => format!("{} (no GPU of this machine)", end.unnamed.join(", ")),
            (false, true) => format!("{names} through NVSwitch"),
            (false, false) => format!("{names} (by {by}; the driver names the far end {})", end.unnamed.join(", ")),
        });
    }
    parts.join(", ")
}

/// Error counters since boot: history, not a verdict (the live layer reports their growth under
/// its own load); per link in `--json`.
fn counters_since_boot(g: &GpuFacts) -> Check {
    let sum = |f: fn(&LinkErrors) -> Option<u64>| -> Option<u64> {
        let v: Vec<u64> = g.links.iter().filter_map(|l| f(&l.errors)).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    };
    let show = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
    Check::new(
        L,
        Status::Info,
        format!(
            "GPU{}: NVLink error counters since boot: CRC {}, replay {}, recovery {} (history; their growth under the live load is the verdict)",
            g.index,
            show(sum(|e| e.crc)),
            show(sum(|e| e.replay)),
            show(sum(|e| e.recovery))
        ),
    )
}

/// Per pair: how they connect and whether CUDA lets them access each other.
fn pair_checks(m: &Machine, peers: Result<&[PeerAccess], String>) -> Vec<Check> {
    let mut out = Vec::new();
    let peers = match peers {
        Ok(p) => p,
        Err(e) => {
            out.push(Check::warn(
                L,
                format!("peer access unknown: {e}"),
                "check that the CUDA driver (libcuda.so.1) loads: `nvidia-smi` and a CUDA sample",
            ));
            return out;
        }
    };
    let possible = |a: &GpuFacts, b: &GpuFacts| {
        let (ia, ib) = (normalize_bus_id(&a.bus_id), normalize_bus_id(&b.bus_id));
        peers.iter().find(|p| normalize_bus_id(&p.from) == ia && normalize_bus_id(&p.to) == ib).map(|p| p.possible)
    };
    for (i, a) in m.gpus.iter().enumerate() {
        for b in &m.gpus[i + 1..] {
            let link = topo::link(m, a.index, b.index);
            let limit = topo::link_rate(m, a.index, b.index)
                .map_or(String::new(), |(rate, how)| format!(", {rate:.0} GB/s per direction: {how}"));
            let pair = format!("GPU{}↔GPU{} ({}{limit})", a.index, b.index, link.notation());
            match (possible(a, b), possible(b, a)) {
                (Some(true), Some(true)) => {
                    out.push(Check::new(L, Status::Pass, format!("{pair}: CUDA peer access both ways")))
                }
                (None, _) | (_, None) => out.push(Check::new(
                    L,
                    Status::Info,
                    format!("{pair}: peer access not checked (not visible to CUDA here; see CUDA_VISIBLE_DEVICES)"),
                )),
                (ab, ba) => {
                    let title = format!(
                        "{pair}: CUDA peer access {}",
                        if ab == Some(false) && ba == Some(false) {
                            "impossible".to_string()
                        } else {
                            "only one way".to_string()
                        }
                    );
                    if matches!(link, Link::Nvlink(_)) {
                        out.push(Check::fail(L, format!("{title} although NVLink connects them"), "the driver refuses P2P over a working link: check `nvidia-smi topo -p2p rw`, the fabric manager (NVSwitch systems) and the hypervisor's P2P settings; reboot if the fabric state is not 'Completed'"));
                    } else {
                        out.push(Check::warn(
                            L,
                            format!("{title}: NCCL will go through host memory (SHM)"),
                            "enable P2P in the BIOS/hypervisor (ACS, IOMMU) if the GPUs share a PCIe switch",
                        ));
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::source::fixtures::{gpu, h200_pair, h200_vm};
    use super::super::source::{FakeSource, Machine, PathLevel, Remote};
    use super::*;

    fn peers(possible: bool) -> Vec<PeerAccess> {
        vec![
            PeerAccess { from: "0000:00:06.0".into(), to: "0000:00:07.0".into(), possible },
            PeerAccess { from: "0000:00:07.0".into(), to: "0000:00:06.0".into(), possible },
        ]
    }

    fn titles(c: &[Check]) -> Vec<(Status, String)> {
        c.iter().map(|c| (c.status, c.title.clone())).collect()
    }

    fn t_has(c: &[Check], start: &str) -> bool {
        c.iter().any(|c| c.title.starts_with(start))
    }

    #[test]
    fn nvml_version_enum_is_named_as_nvidia_names_it() {
        let names: Vec<String> = (0..=8).map(|v| NvlinkVersion(v).to_string()).collect();
        assert_eq!(
            names,
            [
                "NVLink of unknown version (NVML's enum value 0)",
                "NVLink 1.0",
                "NVLink 2.0",
                "NVLink 2.2",
                "NVLink 3.0",
                "NVLink 3.1",
                "NVLink 4.0",
                "NVLink 5.0",
                "NVLink of unknown version (NVML's enum value 8)",
            ]
        );
        let json = serde_json::to_value(NvlinkVersion(6)).unwrap();
        assert_eq!(json, serde_json::json!({"nvml_enum": 6, "name": "4.0"}));
    }

    #[test]
    fn the_vms_garbage_far_end_is_named_as_the_gpu_the_topology_reaches() {
        let m = Machine::read(&h200_vm()).unwrap();
        let p = peers(true);
        let c = checks(&m, Some(13000), Ok(&p));
        assert!(
            t_has(
                &c,
                "GPU0: 18/18 NVLink links up, NVLink 4.0, 26.56 GB/s each, 478 GB/s per direction; far end GPU1 \
             (0000:00:07.0) (by NVML's NVLink P2P status; the driver names the far end ffffffff:ff:ff.0)"
            ),
            "{:#?}",
            titles(&c)
        );
        assert!(t_has(&c, "GPU1: 18/18 NVLink links up, NVLink 4.0, 26.56 GB/s each, 478 GB/s per direction; far end GPU0 (0000:00:06.0) (by NVML's"));
        // The same for `--json`.
        let end = far_end(&m, &m.gpus[0]);
        let want = FarEnd {
            gpu: 0,
            direct: vec![],
            through_topology: vec![1],
            named_by: Some("nvml_nvlink_p2p"),
            switch_links: 0,
            unnamed: vec!["ffffffff:ff:ff.0".into()],
        };
        assert_eq!(end, want);
        // Without NVML's P2P answer, the topology alone.
        let mut fake = h200_vm();
        fake.nvlink_p2p = None;
        let c = checks(&Machine::read(&fake).unwrap(), Some(13000), Ok(&p));
        assert!(c.iter().any(|c| c.title.ends_with(
            "far end GPU1 (0000:00:07.0) (by the topology; the driver names the far end ffffffff:ff:ff.0)"
        )));
        // A direct bridge names the GPU from the far end's own address; a lone GPU's dangling end says so.
        let fake = FakeSource {
            driver: None,
            gpus: vec![
                gpu(0, "0000:00:06.0", &[(Remote::Gpu, "00000000:00:07.0", true); 4]),
                gpu(1, "0000:00:07.0", &[(Remote::Gpu, "0000:00:06.0", true); 4]),
                gpu(2, "0000:00:08.0", &[(Remote::Other, "ffffffff:ff:ff.0", true); 2]),
            ],
            default_path: Some(PathLevel::System),
            paths: vec![],
            nvlink_p2p: None,
        };
        let c = checks(&Machine::read(&fake).unwrap(), None, Err("no driver".into()));
        assert!(t_has(&c, "GPU0: 4/4 NVLink links up, NVLink 4.0, 26.56 GB/s each, 106 GB/s per direction; far end GPU1 (0000:00:07.0)"));
        assert!(
            c.iter().any(|c| c.title.ends_with("far end ffffffff:ff:ff.0 (no GPU of this machine)")),
            "{:#?}",
            titles(&c)
        );
    }

    #[test]
    fn speeds_unknown_or_mixed() {
        let mut fake = h200_pair();
        fake.gpus[0].links[0].speed_mbps = None;
        fake.gpus[1].links[17].speed_mbps = Some(25000);
        let c = checks(&Machine::read(&fake).unwrap(), None, Err("no driver".into()));
        assert!(t_has(
            &c,
            "GPU0: 18/18 NVLink links up, NVLink 4.0, speed unknown (NVML gives no NVLink speed); far end"
        ));
        assert!(t_has(
            &c,
            "GPU1: 18/18 NVLink links up, NVLink 4.0, 25.00–26.56 GB/s per link, 477 GB/s per direction;"
        ));
    }

    #[test]
    fn healthy_h200_pair() {
        let m = Machine::read(&h200_pair()).unwrap();
        let p = peers(true);
        let c = checks(&m, Some(13000), Ok(&p));
        let t = titles(&c);
        assert_eq!(t[0], (Status::Info, "2 GPU(s), driver 580.65.06, CUDA 13.0".to_string()));
        assert_eq!(
            t[1],
            (Status::Pass, "GPU0 NVIDIA H200 (sm_90, bus 0000:00:06.0, PCIe gen5 x16, NUMA 0)".to_string())
        );
        assert!(t.contains(&(
            Status::Pass,
            "GPU0: 18/18 NVLink links up, NVLink 4.0, 26.56 GB/s each, 478 GB/s per direction; far end GPU1 (0000:00:07.0) through NVSwitch"
                .to_string()
        )));
        assert!(t.contains(&(
            Status::Info,
            "GPU1: NVLink error counters since boot: CRC 0, replay 0, recovery 0 (history; their growth under the live load is the verdict)"
                .to_string()
        )));
        assert!(t.contains(&(
            Status::Pass,
            "GPU0↔GPU1 (NV18, 478 GB/s per direction: 18 links × 26.56 GB/s): CUDA peer access both ways".to_string()
        )));
        let topo = c.iter().find(|c| c.title.starts_with("topology")).unwrap();
        assert_eq!(topo.detail[1], "GPU0  X      NV18   0");
        assert!(c.iter().all(|c| c.status != Status::Fail));
    }

    #[test]
    fn down_links_errors_and_refused_peer_access_are_flagged() {
        let mut fake = h200_pair();
        fake.gpus[0].links[3].active = false;
        fake.gpus[1].links[5].errors.replay = Some(7);
        let m = Machine::read(&fake).unwrap();
        let p = peers(false);
        let c = checks(&m, None, Ok(&p));
        let fails: Vec<&Check> = c.iter().filter(|c| c.status == Status::Fail).collect();
        assert_eq!(fails.len(), 2, "{:#?}", titles(&c));
        assert!(
            fails[0].title.starts_with("GPU0: 17/18 NVLink links up")
                && fails[0].title.ends_with("link(s) 3 down: degraded"),
            "{}",
            fails[0].title
        );
        assert!(fails[0].fix.as_deref().unwrap().contains("nvidia-smi nvlink -s"));
        assert_eq!(fails[1].title, "GPU0↔GPU1 (NV17, 452 GB/s per direction: 17 links × 26.56 GB/s): CUDA peer access impossible although NVLink connects them");
        // Counters since boot are history: information, never a warning.
        assert!(c.iter().all(|c| c.status != Status::Warn), "{:#?}", titles(&c));
        assert!(t_has(&c, "GPU1: NVLink error counters since boot: CRC 0, replay 7, recovery 0 ("));
        assert!(c[0].title.ends_with("CUDA driver not loaded"));
    }

    #[test]
    fn pcie_only_and_no_gpu() {
        let fake = FakeSource {
            driver: Some("580".into()),
            gpus: vec![gpu(0, "0000:00:06.0", &[]), gpu(1, "0000:00:07.0", &[(Remote::Gpu, "0000:00:06.0", false)])],
            default_path: Some(PathLevel::System),
            paths: vec![],
            nvlink_p2p: None,
        };
        let m = Machine::read(&fake).unwrap();
        let p = peers(false);
        let c = checks(&m, Some(13000), Ok(&p));
        assert!(c.iter().any(|c| c.status == Status::Warn
            && c.title == "GPU0↔GPU1 (SYS, 63 GB/s per direction: PCIe gen5 x16): CUDA peer access impossible: NCCL will go through host memory (SHM)"));
        assert!(c.iter().any(|c| c.title == "GPU1: no active NVLink links (1 present)"));
        let none = Machine::read(&FakeSource::default()).unwrap();
        let c = checks(&none, None, Err("no driver".into()));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].status, Status::Fail);
        assert!(c[0].title.starts_with("no GPU found"));
    }
}
