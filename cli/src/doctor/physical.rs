//! Layer 1: GPUs, NVLink links and their error counters, the topology matrix, peer access.

use super::report::{Check, Layer, Status};
use super::source::{normalize_bus_id, GpuFacts, Machine};
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
        out.extend(link_checks(g));
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
fn link_checks(g: &GpuFacts) -> Vec<Check> {
    let mut out = Vec::new();
    let active: Vec<_> = g.active_links().collect();
    if active.is_empty() {
        out.push(Check::new(
            L,
            Status::Info,
            format!("GPU{}: no active NVLink links ({} present)", g.index, g.links.len()),
        ));
        return out;
    }
    let versions: Vec<String> = {
        let mut v: Vec<u32> = active.iter().filter_map(|l| l.version).collect();
        v.sort_unstable();
        v.dedup();
        v.iter().map(|v| v.to_string()).collect()
    };
    let speed = g.nvlink_speed_mbps.map_or("speed unknown".to_string(), |s| {
        format!("{:.2} GB/s each, {:.0} GB/s per direction", s as f64 / 1000.0, s as f64 / 1000.0 * active.len() as f64)
    });
    let mut ends: Vec<String> = active
        .iter()
        .map(|l| match (l.remote, &l.remote_bus_id) {
            (Some(super::source::Remote::Switch), _) => "NVSwitch".to_string(),
            (_, Some(id)) => id.clone(),
            _ => "unknown".to_string(),
        })
        .collect();
    ends.sort();
    ends.dedup();
    let title = format!(
        "GPU{}: {}/{} NVLink links up, NVLink {}, {speed}; far end {}",
        g.index,
        active.len(),
        g.links.len(),
        if versions.is_empty() { "version unknown".to_string() } else { versions.join("/") },
        ends.join(", ")
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
    let sum = |f: fn(&super::source::LinkErrors) -> Option<u64>| -> Option<u64> {
        let v: Vec<u64> = g.links.iter().filter_map(|l| f(&l.errors)).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    };
    let (crc, replay, recovery) = (sum(|e| e.crc), sum(|e| e.replay), sum(|e| e.recovery));
    let show = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
    let counters = format!(
        "GPU{}: NVLink errors since boot: CRC {}, replay {}, recovery {}",
        g.index,
        show(crc),
        show(replay),
        show(recovery)
    );
    if [crc, replay, recovery].iter().any(|v| v.unwrap_or(0) > 0) {
        let per_link = g
            .links
            .iter()
            .filter(|l| [l.errors.crc, l.errors.replay, l.errors.recovery].iter().any(|v| v.unwrap_or(0) > 0))
            .map(|l| {
                format!(
                    "link {}: CRC {}, replay {}, recovery {}",
                    l.link,
                    show(l.errors.crc),
                    show(l.errors.replay),
                    show(l.errors.recovery)
                )
            })
            .collect::<Vec<_>>();
        out.push(
            Check::warn(L, counters, "run `nvidia-smi nvlink -e` before and after a load; counters that grow under load mean a degrading link (reseat, or replace the bridge/board)")
                .with_detail(per_link),
        );
    } else {
        out.push(Check::new(L, Status::Pass, counters));
    }
    out
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
            let pair = format!("GPU{}↔GPU{} ({})", a.index, b.index, link.notation());
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
    use super::super::source::fixtures::{gpu, h200_pair};
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
            "GPU0: 18/18 NVLink links up, NVLink 4, 26.56 GB/s each, 478 GB/s per direction; far end NVSwitch"
                .to_string()
        )));
        assert!(t.contains(&(Status::Pass, "GPU1: NVLink errors since boot: CRC 0, replay 0, recovery 0".to_string())));
        assert!(t.contains(&(Status::Pass, "GPU0↔GPU1 (NV18): CUDA peer access both ways".to_string())));
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
        assert_eq!(fails[1].title, "GPU0↔GPU1 (NV17): CUDA peer access impossible although NVLink connects them");
        let warn = c.iter().find(|c| c.status == Status::Warn).unwrap();
        assert_eq!(warn.title, "GPU1: NVLink errors since boot: CRC 0, replay 7, recovery 0");
        assert_eq!(warn.detail, ["link 5: CRC 0, replay 7, recovery 0"]);
        assert!(c[0].title.ends_with("CUDA driver not loaded"));
    }

    #[test]
    fn pcie_only_and_no_gpu() {
        let fake = FakeSource {
            driver: Some("580".into()),
            gpus: vec![gpu(0, "0000:00:06.0", &[]), gpu(1, "0000:00:07.0", &[(Remote::Gpu, "0000:00:06.0", false)])],
            default_path: Some(PathLevel::System),
            paths: vec![],
        };
        let m = Machine::read(&fake).unwrap();
        let p = peers(false);
        let c = checks(&m, Some(13000), Ok(&p));
        assert!(c.iter().any(|c| c.status == Status::Warn
            && c.title == "GPU0↔GPU1 (SYS): CUDA peer access impossible: NCCL will go through host memory (SHM)"));
        assert!(c.iter().any(|c| c.title == "GPU1: no active NVLink links (1 present)"));
        let none = Machine::read(&FakeSource::default()).unwrap();
        let c = checks(&none, None, Err("no driver".into()));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].status, Status::Fail);
        assert!(c[0].title.starts_with("no GPU found"));
    }
}
