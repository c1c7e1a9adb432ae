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

/// An NVLink version as NVML reports it (`nvmlDeviceGetNvLinkVersion`): a value of the enum
/// `nvmlNvlinkVersion_t`, not the version number — 6 is NVLink 4.0 (Hopper: H100, H200).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NvlinkVersion(pub u32);

impl NvlinkVersion {
    /// NVIDIA's name for it (`"4.0"`), after the NVML API reference's `nvmlNvlinkVersion_t`
    /// (`NVML_NVLINK_VERSION_1_0` = 1 … `NVML_NVLINK_VERSION_5_0` = 7); `None` for 0
    /// (`NVML_NVLINK_VERSION_INVALID`) and for values newer than this table.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            1 => "1.0",
            2 => "2.0",
            3 => "2.2",
            4 => "3.0",
            5 => "3.1",
            6 => "4.0",
            7 => "5.0",
            _ => return None,
        })
    }
}

impl std::fmt::Display for NvlinkVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(name) => write!(f, "NVLink {name}"),
            None => write!(f, "NVLink of unknown version (NVML's enum value {})", self.0),
        }
    }
}

impl Serialize for NvlinkVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("NvlinkVersion", 2)?;
        st.serialize_field("nvml_enum", &self.0)?;
        st.serialize_field("name", &self.name())?;
        st.end()
    }
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
    /// NVLink version.
    pub version: Option<NvlinkVersion>,
    /// Signalling rate per direction, MB/s (1e6 B/s): NVML's per-link speed field.
    pub speed_mbps: Option<u64>,
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

    /// The speed of link `l`, MB/s: its own, else the GPU's common speed.
    pub fn link_speed_mbps(&self, l: &LinkFacts) -> Option<u64> {
        l.speed_mbps.or(self.nvlink_speed_mbps)
    }

    /// The NVLink limit of this GPU per direction, GB/s (1e9 B/s): the sum of its active links'
    /// speeds. `None` without active links or when a link's speed is unknown.
    pub fn nvlink_gbps(&self) -> Option<f64> {
        let speeds: Option<Vec<u64>> = self.active_links().map(|l| self.link_speed_mbps(l)).collect();
        speeds.filter(|s| !s.is_empty()).map(|s| s.iter().sum::<u64>() as f64 / 1000.0)
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
    /// Whether the driver allows P2P over NVLink between GPUs `a` and `b`
    /// (`nvmlDeviceGetP2PStatus` with `NVML_P2P_CAPS_INDEX_NVLINK`, what `nvidia-smi topo -p2p n`
    /// shows): it names the GPU at the far end where the links' own far end is a switch or unknown.
    fn nvlink_p2p(&self, a: usize, b: usize) -> Result<bool, SourceError>;
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
    /// `nvlink_p2p[a][b]`: whether the driver allows P2P over NVLink between them (None on the
    /// diagonal or where NVML does not say).
    pub nvlink_p2p: Vec<Vec<Option<bool>>>,
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
        // Not knowing is normal here (GPUs without NVLink, old drivers): no error recorded.
        let nvlink_p2p = (0..count)
            .map(|a| (0..count).map(|b| if a == b { None } else { source.nvlink_p2p(a, b).ok() }).collect())
            .collect();
        Ok(Machine { driver, gpus, paths, nvlink_p2p, errors })
    }

    /// The GPU with NVML index `index`.
    pub fn gpu(&self, index: usize) -> Option<&GpuFacts> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// Whether the driver allows P2P over NVLink between GPUs `a` and `b`, if NVML said.
    pub fn nvlink_p2p(&self, a: usize, b: usize) -> Option<bool> {
        self.nvlink_p2p.get(a)?.get(b).copied().flatten()
    }

    /// The GPU of this machine at PCI address `bus`.
    pub fn gpu_at(&self, bus: &str) -> Option<&GpuFacts> {
        let bus = normalize_bus_id(bus);
        self.gpus.iter().find(|g| normalize_bus_id(&g.bus_id) == bus)
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
    /// NVLink P2P status of every pair (None: "not supported" by NVML).
    pub nvlink_p2p: Option<bool>,
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

    fn nvlink_p2p(&self, _a: usize, _b: usize) -> Result<bool, SourceError> {
        self.nvlink_p2p.ok_or_else(|| SourceError("Not supported".into()))
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Machines the tests share.
    use super::*;

    /// A GPU with `links` NVLink 4.0 links at 26.562 GB/s (H100/H200), each to a GPU bus id or a
    /// switch, up or down.
    pub fn gpu(index: usize, bus: &str, links: &[(Remote, &str, bool)]) -> GpuFacts {
        GpuFacts {
            index,
            name: "NVIDIA H200".into(),
            bus_id: bus.into(),
            compute_capability: Some((9, 0)),
            numa_node: Some(0),
            pcie: Some((5, 16)),
            nvlink_speed_mbps: None,
            links: links
                .iter()
                .enumerate()
                .map(|(i, (remote, id, active))| LinkFacts {
                    link: i as u32,
                    active: *active,
                    version: Some(NvlinkVersion(6)),
                    speed_mbps: Some(26562),
                    remote_bus_id: Some(id.to_string()),
                    remote: Some(*remote),
                    errors: LinkErrors { crc: Some(0), replay: Some(0), recovery: Some(0) },
                })
                .collect(),
        }
    }

    /// Two H200 whose 18 links each go to NVSwitches.
    pub fn h200_pair() -> FakeSource {
        let links: Vec<(Remote, &str, bool)> = (0..18).map(|_| (Remote::Switch, "0000:c0:00.0", true)).collect();
        FakeSource {
            driver: Some("580.65.06".into()),
            gpus: vec![gpu(0, "0000:00:06.0", &links), gpu(1, "0000:00:07.0", &links)],
            default_path: Some(PathLevel::HostBridge),
            paths: vec![],
            nvlink_p2p: Some(true),
        }
    }

    /// The GPU machine as its VM's driver describes it (2026-11): the NVSwitches are hidden, so
    /// every link's far end is `ffffffff:ff:ff.0` of unknown type; NVML's P2P status says NVLink.
    pub fn h200_vm() -> FakeSource {
        let mut fake = h200_pair();
        for g in &mut fake.gpus {
            for l in &mut g.links {
                l.remote = Some(Remote::Other);
                l.remote_bus_id = Some("ffffffff:ff:ff.0".into());
            }
        }
        fake
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
