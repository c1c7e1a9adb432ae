//! Where the physical facts come from: a [`GpuSource`] (NVML on a real machine, a
//! `FakeSource` in tests), read into one [`Machine`] snapshot.

use serde::Serialize;

/// How far apart two GPUs are on PCIe (NVML's `nvmlGpuTopologyLevel_t`), nearest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum PathLevel {
    /// On the same board (`NVML_TOPOLOGY_INTERNAL`).
    Internal,
    /// Through at most one PCIe switch (`SINGLE`).
    Single,
    /// Through several PCIe switches, no host bridge (`MULTIPLE`).
    Multiple,
    /// Through a PCIe host bridge (`HOSTBRIDGE`).
    HostBridge,
    /// Through the interconnect between host bridges of one NUMA node (`NODE`).
    Node,
    /// Across NUMA nodes (`SYSTEM`).
    System,
}

impl PathLevel {
    /// The `nvidia-smi topo -m` notation.
    pub fn notation(self) -> &'static str {
        match self {
            PathLevel::Internal | PathLevel::Single => "PIX",
            PathLevel::Multiple => "PXB",
            PathLevel::HostBridge => "PHB",
            PathLevel::Node => "NODE",
            PathLevel::System => "SYS",
        }
    }
}

/// What the far end of an NVLink link is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Remote {
    /// Another GPU.
    Gpu,
    /// An NVSwitch.
    Switch,
    /// Something else (an IBM NPU, or unknown).
    Other,
}

/// NVLink error counters of one link (`nvmlDeviceGetNvLinkErrorCounter`); `None` where the driver
/// does not say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LinkErrors {
    /// Data-link receive CRC errors (flit + data).
    pub crc: Option<u64>,
    /// Data-link transmit replays.
    pub replay: Option<u64>,
    /// Data-link recoveries.
    pub recovery: Option<u64>,
}

/// One NVLink link.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LinkFacts {
    /// Link number.
    pub link: u32,
    /// Up.
    pub active: bool,
    /// NVLink version (4 for Hopper).
    pub version: Option<u32>,
    /// PCI bus id of the far end.
    pub remote_bus_id: Option<String>,
    /// What the far end is.
    pub remote: Option<Remote>,
    /// Error counters.
    pub errors: LinkErrors,
}

/// One GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuFacts {
    /// NVML index (the order of `nvidia-smi`).
    pub index: usize,
    /// Product name.
    pub name: String,
    /// PCI bus id, normalised (`0000:00:06.0`).
    pub bus_id: String,
    /// Compute capability.
    pub compute_capability: Option<(i32, i32)>,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// PCIe generation and width the link can run at (idle links train down).
    pub pcie: Option<(u32, u32)>,
    /// Common speed of the active NVLink links, MB/s (`NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON`).
    pub nvlink_speed_mbps: Option<u64>,
    /// Its NVLink links (empty without NVLink).
    pub links: Vec<LinkFacts>,
}

impl GpuFacts {
    /// Active links.
    pub fn active_links(&self) -> impl Iterator<Item = &LinkFacts> {
        self.links.iter().filter(|l| l.active)
    }
}

/// A failed query, with the reason as the source said it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

/// Read access to GPUs, links and PCIe topology. [`crate::doctor::nvml::NvmlSource`] is the real one.
pub trait GpuSource {
    /// The driver's version string (`580.65.06`).
    fn driver_version(&self) -> Result<String, SourceError>;
    /// Number of GPUs.
    fn gpu_count(&self) -> Result<usize, SourceError>;
    /// Facts about GPU `index`, its links included.
    fn gpu(&self, index: usize) -> Result<GpuFacts, SourceError>;
    /// How GPUs `a` and `b` are connected on PCIe.
    fn path(&self, a: usize, b: usize) -> Result<PathLevel, SourceError>;
}

/// Everything read from a source.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// Driver version.
    pub driver: Option<String>,
    /// The GPUs that could be read.
    pub gpus: Vec<GpuFacts>,
    /// `paths[a][b]`: PCIe path between GPUs (None on the diagonal or where unknown).
    pub paths: Vec<Vec<Option<PathLevel>>>,
    /// Queries that failed, as `what: why`.
    pub errors: Vec<String>,
}

impl Machine {
    /// Reads everything `source` can tell; failures are recorded, not fatal.
    pub fn read(source: &dyn GpuSource) -> Result<Machine, SourceError> {
        let count = source.gpu_count()?;
        let mut errors = Vec::new();
        let driver = source.driver_version().map_err(|e| errors.push(format!("driver version: {e}"))).ok();
        let mut gpus = Vec::new();
        for i in 0..count {
            match source.gpu(i) {
                Ok(g) => gpus.push(g),
                Err(e) => errors.push(format!("GPU {i}: {e}")),
            }
        }
        let paths = (0..count)
            .map(|a| {
                (0..count)
                    .map(|b| {
                        if a == b {
                            return None;
                        }
                        source.path(a, b).map_err(|e| errors.push(format!("PCIe path GPU{a}-GPU{b}: {e}"))).ok()
                    })
                    .collect()
            })
            .collect();
        Ok(Machine { driver, gpus, paths, errors })
    }

    /// The GPU with NVML index `index`.
    pub fn gpu(&self, index: usize) -> Option<&GpuFacts> {
        self.gpus.iter().find(|g| g.index == index)
    }
}

/// `00000000:00:06.0` and `0000:00:06.0` → `0000:00:06.0` (lower case, four-digit domain).
pub fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().trim_end_matches('\0').to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 && domain[..domain.len() - 4].bytes().all(|b| b == b'0') => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => id,
    }
}

/// A source whose answers are given up front (tests).
#[cfg(test)]
#[derive(Clone, Debug, Default)]
pub struct FakeSource {
    /// Driver version, or the error to give.
    pub driver: Option<String>,
    /// The GPUs.
    pub gpus: Vec<GpuFacts>,
    /// PCIe path for every pair not listed in `paths`.
    pub default_path: Option<PathLevel>,
    /// Explicit paths, `(a, b, level)` (symmetric).
    pub paths: Vec<(usize, usize, PathLevel)>,
}

#[cfg(test)]
impl GpuSource for FakeSource {
    fn driver_version(&self) -> Result<String, SourceError> {
        self.driver.clone().ok_or_else(|| SourceError("Not supported".into()))
    }

    fn gpu_count(&self) -> Result<usize, SourceError> {
        Ok(self.gpus.len())
    }

    fn gpu(&self, index: usize) -> Result<GpuFacts, SourceError> {
        self.gpus.get(index).cloned().ok_or_else(|| SourceError(format!("no GPU {index}")))
    }

    fn path(&self, a: usize, b: usize) -> Result<PathLevel, SourceError> {
        self.paths
            .iter()
            .find(|(x, y, _)| (*x, *y) == (a, b) || (*x, *y) == (b, a))
            .map(|p| p.2)
            .or(self.default_path)
            .ok_or_else(|| SourceError("Not supported".into()))
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Machines the tests share.
    use super::*;

    /// A GPU with `links` active NVLink 4 links, all to `remote` (a GPU bus id or a switch).
    pub fn gpu(index: usize, bus: &str, links: &[(Remote, &str, bool)]) -> GpuFacts {
        GpuFacts {
            index,
            name: "NVIDIA H200".into(),
            bus_id: bus.into(),
            compute_capability: Some((9, 0)),
            numa_node: Some(0),
            pcie: Some((5, 16)),
            nvlink_speed_mbps: (!links.is_empty()).then_some(26562),
            links: links
                .iter()
                .enumerate()
                .map(|(i, (remote, id, active))| LinkFacts {
                    link: i as u32,
                    active: *active,
                    version: Some(4),
                    remote_bus_id: Some(id.to_string()),
                    remote: Some(*remote),
                    errors: LinkErrors { crc: Some(0), replay: Some(0), recovery: Some(0) },
                })
                .collect(),
        }
    }

    /// The GPU machine: two H200 whose 18 links each go to NVSwitches.
    pub fn h200_pair() -> FakeSource {
        let links: Vec<(Remote, &str, bool)> = (0..18).map(|_| (Remote::Switch, "0000:c0:00.0", true)).collect();
        FakeSource {
            driver: Some("580.65.06".into()),
            gpus: vec![gpu(0, "0000:00:06.0", &links), gpu(1, "0000:00:07.0", &links)],
            default_path: Some(PathLevel::HostBridge),
            paths: vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_normalise() {
        assert_eq!(normalize_bus_id("00000000:00:06.0"), "0000:00:06.0");
        assert_eq!(normalize_bus_id("0000:C0:00.0"), "0000:c0:00.0");
        assert_eq!(normalize_bus_id("00000001:00:06.0"), "0001:00:06.0");
        assert_eq!(normalize_bus_id("10000:00:06.0"), "10000:00:06.0");
    }

    #[test]
    fn reading_keeps_going_past_failures() {
        let mut fake = fixtures::h200_pair();
        fake.driver = None;
        fake.default_path = None;
        let m = Machine::read(&fake).unwrap();
        assert_eq!(m.gpus.len(), 2);
        assert_eq!(m.driver, None);
        assert_eq!(m.paths[0][1], None);
        assert_eq!(
            m.errors,
            [
                "driver version: Not supported",
                "PCIe path GPU0-GPU1: Not supported",
                "PCIe path GPU1-GPU0: Not supported"
            ]
        );
    }
}
