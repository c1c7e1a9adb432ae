//! The GPU×GPU matrix in `nvidia-smi topo -m` notation (X, NV#, PIX, PXB, PHB, NODE, SYS), and the
//! raw per-direction rate of the link between two GPUs.

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
fn direct_links(from: &GpuFacts, to: &GpuFacts) -> u32 {
    let target = normalize_bus_id(&to.bus_id);
    from.active_links()
        .filter(|l| l.remote != Some(Remote::Switch))
        .filter(|l| l.remote_bus_id.as_deref().map(normalize_bus_id).as_deref() == Some(target.as_str()))
        .count() as u32
}

/// Active links from `g` into an NVSwitch (links whose far end is a switch, or no GPU of `m`).
fn switch_links(m: &Machine, g: &GpuFacts) -> u32 {
    let gpu_ids: Vec<String> = m.gpus.iter().map(|x| normalize_bus_id(&x.bus_id)).collect();
    g.active_links()
        .filter(|l| match l.remote {
            Some(Remote::Switch) => true,
            Some(Remote::Gpu) => false,
            _ => l.remote_bus_id.as_deref().is_some_and(|id| !gpu_ids.contains(&normalize_bus_id(id))),
        })
        .count() as u32
}

/// How GPUs `a` and `b` (NVML indexes) are connected.
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
    if through_switch > 0 {
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

/// The raw per-direction rate between `a` and `b` in GB/s (1e9 B/s), and how it was derived:
/// links × per-link speed for NVLink (`18 × 26.56 GB/s`), lanes × lane rate for PCIe.
pub fn link_rate(m: &Machine, a: usize, b: usize) -> Option<(f64, String)> {
    let (ga, gb) = (m.gpu(a)?, m.gpu(b)?);
    match link(m, a, b) {
        Link::Nvlink(n) => {
            let speed = ga.nvlink_speed_mbps.or(gb.nvlink_speed_mbps)? as f64 / 1000.0;
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

#[cfg(test)]
mod tests {
    use super::super::source::fixtures::{gpu, h200_pair};
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
            };
            let m = Machine::read(&fake).unwrap();
            assert_eq!(link(&m, 0, 1).notation(), text);
        }
    }
}
