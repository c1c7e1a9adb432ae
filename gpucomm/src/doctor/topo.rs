//! The GPU×GPU matrix in `nvidia-smi topo -m` notation (X, NV#, PIX, PXB, PHB, NODE, SYS), and the
//! raw per-direction rate of each GPU's NVLink links and of the link between two GPUs: the limits
//! the live layer's bandwidth is measured against.

use serde::Serialize;

use super::source::{normalize_bus_id, GpuFacts, Machine, PathLevel, Remote};

/// How two GPUs are connected.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Link {
    /// The same GPU.
    Same,
    /// `n` NVLink links (direct, or each GPU's links into the same NVSwitch fabric).
    Nvlink(u32),
    /// PCIe only, through this path.
    Pcie(PathLevel),
    /// Not known.
    Unknown,
}

impl Link {
    /// The notation (`X`, `NV18`, `PHB`, `?`).
    pub fn notation(self) -> String {
        match self {
            Link::Same => "X".into(),
            Link::Nvlink(n) => format!("NV{n}"),
            Link::Pcie(p) => p.notation().into(),
            Link::Unknown => "?".into(),
        }
    }
}

/// Active links from `from` whose far end is `to`.
pub fn direct_links(from: &GpuFacts, to: &GpuFacts) -> u32 {
    let target = normalize_bus_id(&to.bus_id);
    from.active_links()
        .filter(|l| l.remote != Some(Remote::Switch))
        .filter(|l| l.remote_bus_id.as_deref().map(normalize_bus_id).as_deref() == Some(target.as_str()))
        .count() as u32
}

/// Active links from `g` into an NVSwitch: links whose far end is a switch, or whose far end's
/// address names no GPU of `m` (whatever type the driver gives it: a VM that hides the switches
/// answers `ffffffff:ff:ff.0`), or no address at all — except a link to a GPU at a real PCI
/// address that `m` does not show (a GPU hidden from this container): a bridge to it reaches no
/// GPU of `m`.
fn switch_links(m: &Machine, g: &GpuFacts) -> u32 {
    g.active_links()
        .filter(|l| match (l.remote, l.remote_bus_id.as_deref()) {
            (Some(Remote::Switch), _) => true,
            (_, None) => true,
            (Some(Remote::Gpu), Some(id)) if real_address(id) => false,
            (_, Some(id)) => m.gpu_at(id).is_none(),
        })
        .count() as u32
}

/// Whether `id` is a PCI address a device can have: a 16-bit domain, where the driver's answer
/// for a far end it does not name has all 32 bits set (`ffffffff:ff:ff.0`).
fn real_address(id: &str) -> bool {
    normalize_bus_id(id).split_once(':').is_some_and(|(domain, _)| domain.len() <= 4)
}

/// How GPUs `a` and `b` (NVML indexes) are connected. Links into a switch, or to a far end the
/// driver does not name, count as reaching every GPU that has such links too, unless NVML's
/// NVLink P2P status says that this pair has no NVLink path.
pub fn link(m: &Machine, a: usize, b: usize) -> Link {
    if a == b {
        return Link::Same;
    }
    let (Some(ga), Some(gb)) = (m.gpu(a), m.gpu(b)) else { return Link::Unknown };
    let direct = direct_links(ga, gb).max(direct_links(gb, ga));
    if direct > 0 {
        return Link::Nvlink(direct);
    }
    let through_switch = switch_links(m, ga).min(switch_links(m, gb));
    if through_switch > 0 && m.nvlink_p2p(a, b) != Some(false) {
        return Link::Nvlink(through_switch);
    }
    match m.paths.get(a).and_then(|row| row.get(b)).copied().flatten() {
        Some(p) => Link::Pcie(p),
        None => Link::Unknown,
    }
}

/// The matrix as text lines, `nvidia-smi topo -m` style.
pub fn matrix(m: &Machine) -> Vec<String> {
    let ids: Vec<usize> = m.gpus.iter().map(|g| g.index).collect();
    let mut lines = Vec::new();
    let mut head = format!("{:<6}", "");
    for i in &ids {
        head.push_str(&format!("{:<7}", format!("GPU{i}")));
    }
    head.push_str("NUMA");
    lines.push(head.trim_end().to_string());
    for &a in &ids {
        let mut line = format!("{:<6}", format!("GPU{a}"));
        for &b in &ids {
            line.push_str(&format!("{:<7}", link(m, a, b).notation()));
        }
        let numa = m.gpu(a).and_then(|g| g.numa_node).map_or("N/A".to_string(), |n| n.to_string());
        line.push_str(&numa);
        lines.push(line);
    }
    lines
}

/// GB/s one PCIe lane carries per direction after encoding, per generation.
fn pcie_lane_gbps(generation: u32) -> Option<f64> {
    Some(match generation {
        1 => 0.25,
        2 => 0.5,
        3 => 0.985,
        4 => 1.969,
        5 => 3.938,
        6 => 7.563,
        _ => return None,
    })
}

/// The slowest active link of `g`, MB/s; `None` when a link's speed is unknown.
fn slowest_link_mbps(g: &GpuFacts) -> Option<u64> {
    g.active_links().map(|l| g.link_speed_mbps(l)).collect::<Option<Vec<u64>>>()?.into_iter().min()
}

/// The raw per-direction rate between `a` and `b` in GB/s (1e9 B/s), and how it was derived:
/// links × the slower end's per-link speed for NVLink (`18 links × 26.56 GB/s`), lanes × lane
/// rate for PCIe.
pub fn link_rate(m: &Machine, a: usize, b: usize) -> Option<(f64, String)> {
    let (ga, gb) = (m.gpu(a)?, m.gpu(b)?);
    match link(m, a, b) {
        Link::Nvlink(n) => {
            let speed = slowest_link_mbps(ga)?.min(slowest_link_mbps(gb)?) as f64 / 1000.0;
            Some((n as f64 * speed, format!("{n} links × {speed:.2} GB/s")))
        }
        Link::Pcie(_) => {
            let rate =
                |g: &GpuFacts| g.pcie.and_then(|(generation, width)| Some(pcie_lane_gbps(generation)? * width as f64));
            let (ra, rb) = (rate(ga)?, rate(gb)?);
            let (g, w) = if ra <= rb { ga.pcie? } else { gb.pcie? };
            Some((ra.min(rb), format!("PCIe gen{g} x{w}")))
        }
        Link::Same | Link::Unknown => None,
    }
}

/// One GPU's NVLink limit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuLimit {
    /// NVML index.
    pub gpu: usize,
    /// Active NVLink links.
    pub links_up: usize,
    /// Sum of their speeds, GB/s per direction (`None`: no link, or a speed unknown).
    pub nvlink_gbps: Option<f64>,
}

/// The limit between two GPUs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PairLimit {
    /// NVML indexes.
    pub gpus: (usize, usize),
    /// The link (`NV18`, `PHB`).
    pub link: String,
    /// Raw rate per direction, GB/s.
    pub gbps: Option<f64>,
    /// How it was derived (`18 links × 26.56 GB/s`).
    pub how: Option<String>,
}

/// Every GPU's and every pair's limit, for `--json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Limits {
    /// Per GPU.
    pub gpus: Vec<GpuLimit>,
    /// Per pair of GPUs.
    pub pairs: Vec<PairLimit>,
}

/// The limits of machine `m`.
pub fn limits(m: &Machine) -> Limits {
    let gpus = m
        .gpus
        .iter()
        .map(|g| GpuLimit { gpu: g.index, links_up: g.active_links().count(), nvlink_gbps: g.nvlink_gbps() })
        .collect();
    let mut pairs = Vec::new();
    for (i, a) in m.gpus.iter().enumerate() {
        for b in &m.gpus[i + 1..] {
            let rate = link_rate(m, a.index, b.index);
            pairs.push(PairLimit {
                gpus: (a.index, b.index),
                link: link(m, a.index, b.index).notation(),
                gbps: rate.as_ref().map(|r| r.0),
                how: rate.map(|r| r.1),
            });
        }
    }
    Limits { gpus, pairs }
}

#[cfg(test)]
mod tests {
    use super::super::source::fixtures::{gpu, h200_pair, h200_vm};
    use super::super::source::{FakeSource, Machine, PathLevel, Remote};
    use super::*;

    #[test]
    fn nvswitch_pair_is_nv18_at_478() {
        let m = Machine::read(&h200_pair()).unwrap();
        assert_eq!(link(&m, 0, 1), Link::Nvlink(18));
        assert_eq!(link(&m, 1, 1), Link::Same);
        assert_eq!(matrix(&m), ["      GPU0   GPU1   NUMA", "GPU0  X      NV18   0", "GPU1  NV18   X      0"]);
        let (rate, how) = link_rate(&m, 0, 1).unwrap();
        assert!((rate - 478.1).abs() < 0.1, "{rate}");
        assert_eq!(how, "18 links × 26.56 GB/s");
    }

    #[test]
    fn hidden_switches_still_make_nv18_unless_nvml_says_no_nvlink_p2p() {
        let m = Machine::read(&h200_vm()).unwrap();
        assert_eq!(link(&m, 0, 1), Link::Nvlink(18));
        let l = limits(&m);
        assert_eq!(l.gpus.len(), 2);
        assert_eq!((l.gpus[1].gpu, l.gpus[1].links_up), (1, 18));
        assert!((l.gpus[0].nvlink_gbps.unwrap() - 478.116).abs() < 1e-9);
        assert_eq!(l.pairs[0].gpus, (0, 1));
        assert_eq!(l.pairs[0].link, "NV18");
        assert_eq!(l.pairs[0].how.as_deref(), Some("18 links × 26.56 GB/s"));
        // The same when the driver calls the far end a GPU but gives no GPU's address.
        let mut gpu_typed = h200_vm();
        gpu_typed.gpus.iter_mut().flat_map(|g| g.links.iter_mut()).for_each(|l| l.remote = Some(Remote::Gpu));
        assert_eq!(link(&Machine::read(&gpu_typed).unwrap(), 0, 1), Link::Nvlink(18));
        // But bridges to GPUs at real addresses that this machine (a container given GPU0 and
        // GPU2 of bridged pairs) does not show reach no GPU it has: the pair is on PCIe.
        let hidden = FakeSource {
            gpus: vec![
                gpu(0, "0000:00:06.0", &[(Remote::Gpu, "0000:00:09.0", true); 4]),
                gpu(1, "0000:00:07.0", &[(Remote::Gpu, "0000:00:0a.0", true); 4]),
            ],
            default_path: Some(PathLevel::System),
            paths: vec![],
            nvlink_p2p: None,
            driver: h200_vm().driver,
        };
        assert_eq!(link(&Machine::read(&hidden).unwrap(), 0, 1), Link::Pcie(PathLevel::System));
        let mut no_p2p = h200_vm();
        no_p2p.nvlink_p2p = Some(false);
        let m = Machine::read(&no_p2p).unwrap();
        assert_eq!(link(&m, 0, 1), Link::Pcie(PathLevel::HostBridge));
    }

    #[test]
    fn the_slowest_link_and_unknown_speeds_set_the_limit() {
        let mut fake = h200_pair();
        fake.gpus[1].links[4].speed_mbps = Some(20000);
        let m = Machine::read(&fake).unwrap();
        assert_eq!(link_rate(&m, 0, 1).unwrap().1, "18 links × 20.00 GB/s");
        assert!((m.gpus[1].nvlink_gbps().unwrap() - (17.0 * 26.562 + 20.0)).abs() < 1e-9);
        fake.gpus[0].links[2].speed_mbps = None;
        let m = Machine::read(&fake).unwrap();
        assert_eq!(link_rate(&m, 0, 1), None);
        assert_eq!(m.gpus[0].nvlink_gbps(), None);
        // The GPU's common speed stands in for a link's own.
        fake.gpus[0].nvlink_speed_mbps = Some(25000);
        let m = Machine::read(&fake).unwrap();
        assert_eq!(link_rate(&m, 0, 1).unwrap().1, "18 links × 20.00 GB/s");
    }

    #[test]
    fn direct_links_pcie_levels_and_down_links() {
        // GPU0-GPU1 bridged by 4 links (one down), GPU2 PCIe only: PXB to GPU0, SYS to GPU1.
        let g0 = gpu(
            0,
            "00000000:1A:00.0",
            &[
                (Remote::Gpu, "0000:1b:00.0", true),
                (Remote::Gpu, "0000:1b:00.0", true),
                (Remote::Gpu, "0000:1b:00.0", true),
                (Remote::Gpu, "0000:1b:00.0", false),
            ],
        );
        let g1 = gpu(1, "0000:1b:00.0", &[(Remote::Gpu, "0000:1a:00.0", true); 3]);
        let mut g2 = gpu(2, "0000:3d:00.0", &[]);
        g2.pcie = Some((4, 16));
        g2.numa_node = Some(1);
        let fake = FakeSource {
            driver: Some("580".into()),
            gpus: vec![g0, g1, g2],
            default_path: Some(PathLevel::System),
            paths: vec![(0, 2, PathLevel::Multiple), (0, 1, PathLevel::Single)],
            nvlink_p2p: None,
        };
        let m = Machine::read(&fake).unwrap();
        assert_eq!(link(&m, 0, 1), Link::Nvlink(3));
        assert_eq!(link(&m, 0, 2), Link::Pcie(PathLevel::Multiple));
        assert_eq!(link(&m, 2, 1), Link::Pcie(PathLevel::System));
        assert_eq!(
            matrix(&m),
            [
                "      GPU0   GPU1   GPU2   NUMA",
                "GPU0  X      NV3    PXB    0",
                "GPU1  NV3    X      SYS    0",
                "GPU2  PXB    SYS    X      1"
            ]
        );
        let (rate, how) = link_rate(&m, 0, 2).unwrap();
        assert!((rate - 31.5).abs() < 0.01, "{rate}");
        assert_eq!(how, "PCIe gen4 x16");
    }

    #[test]
    fn every_pcie_level_has_its_notation() {
        let all = [
            (PathLevel::Internal, "PIX"),
            (PathLevel::Single, "PIX"),
            (PathLevel::Multiple, "PXB"),
            (PathLevel::HostBridge, "PHB"),
            (PathLevel::Node, "NODE"),
            (PathLevel::System, "SYS"),
        ];
        for (level, text) in all {
            let fake = FakeSource {
                driver: None,
                gpus: vec![gpu(0, "0000:01:00.0", &[]), gpu(1, "0000:02:00.0", &[])],
                default_path: Some(level),
                paths: vec![],
                nvlink_p2p: None,
            };
            let m = Machine::read(&fake).unwrap();
            assert_eq!(link(&m, 0, 1).notation(), text);
        }
    }
}
