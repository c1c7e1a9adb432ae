//! The real [`GpuSource`]: NVML through `nvml-wrapper` (never by parsing `nvidia-smi`).

use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::enum_wrappers::nv_link::{ErrorCounter, IntDeviceType};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{NVML_FI_DEV_NVLINK_LINK_COUNT, NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON};
use nvml_wrapper::{Device, Nvml};

use super::source::{normalize_bus_id, GpuFacts, GpuSource, LinkErrors, LinkFacts, PathLevel, Remote, SourceError};

/// The most NVLink links a GPU has (`NVML_NVLINK_MAX_LINKS`).
const MAX_LINKS: u32 = 18;

/// NVML, initialised.
pub struct NvmlSource {
    nvml: Nvml,
}

fn err(e: NvmlError) -> SourceError {
    SourceError(e.to_string())
}

impl NvmlSource {
    /// Loads `libnvidia-ml.so.1` and initialises NVML.
    pub fn open() -> Result<Self, SourceError> {
        Nvml::init().map(|nvml| NvmlSource { nvml }).map_err(err)
    }

    fn device(&self, index: usize) -> Result<Device<'_>, SourceError> {
        self.nvml.device_by_index(index as u32).map_err(err)
    }
}

/// An integer field value (`nvmlDeviceGetFieldValues`).
fn field(device: &Device<'_>, id: u32) -> Option<u64> {
    use nvml_wrapper::enums::device::SampleValue;
    let sample = device.field_values_for(&[FieldId(id)]).ok()?.into_iter().next()?.ok()?;
    match sample.value.ok()? {
        SampleValue::U32(v) => Some(v.into()),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        SampleValue::F64(v) => Some(v as u64),
    }
}

fn link_facts(device: &Device<'_>, link: u32) -> Result<LinkFacts, NvmlError> {
    let l = device.link_wrapper_for(link);
    let active = l.is_active()?;
    let remote_pci = l.remote_pci_info().ok();
    let remote = l.remote_device_type(link).ok().map(|t| match t {
        IntDeviceType::Gpu => Remote::Gpu,
        IntDeviceType::Switch => Remote::Switch,
        _ => Remote::Other,
    });
    let count = |c| l.error_counter(c).ok();
    let crc = match (count(ErrorCounter::DlCrcFlit), count(ErrorCounter::DlCrcData)) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
    Ok(LinkFacts {
        link,
        active,
        version: l.version().ok(),
        remote_bus_id: remote_pci.map(|p| normalize_bus_id(&p.bus_id)),
        remote,
        errors: LinkErrors { crc, replay: count(ErrorCounter::DlReplay), recovery: count(ErrorCounter::DlRecovery) },
    })
}

impl GpuSource for NvmlSource {
    fn driver_version(&self) -> Result<String, SourceError> {
        self.nvml.sys_driver_version().map_err(err)
    }

    fn gpu_count(&self) -> Result<usize, SourceError> {
        self.nvml.device_count().map(|n| n as usize).map_err(err)
    }

    fn gpu(&self, index: usize) -> Result<GpuFacts, SourceError> {
        let d = self.device(index)?;
        // The maximum, not the current link: idle GPUs train their link down to save power.
        let pcie = match (d.max_pcie_link_gen(), d.max_pcie_link_width()) {
            (Ok(g), Ok(w)) => Some((g, w)),
            _ => None,
        };
        let max_links = field(&d, NVML_FI_DEV_NVLINK_LINK_COUNT).map_or(MAX_LINKS, |n| n.min(MAX_LINKS as u64) as u32);
        // Links the GPU does not have answer "invalid argument" or "not supported": stop there.
        let links: Vec<LinkFacts> = (0..max_links).map_while(|l| link_facts(&d, l).ok()).collect();
        let speed = if links.iter().any(|l| l.active) { field(&d, NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON) } else { None };
        Ok(GpuFacts {
            index,
            name: d.name().map_err(err)?,
            bus_id: normalize_bus_id(&d.pci_info().map_err(err)?.bus_id),
            compute_capability: d.cuda_compute_capability().ok().map(|c| (c.major, c.minor)),
            numa_node: d.numa_node_id().ok(),
            pcie,
            nvlink_speed_mbps: speed.filter(|&s| s > 0),
            links,
        })
    }

    fn path(&self, a: usize, b: usize) -> Result<PathLevel, SourceError> {
        let (da, db) = (self.device(a)?, self.device(b)?);
        Ok(match da.topology_common_ancestor(db).map_err(err)? {
            TopologyLevel::Internal => PathLevel::Internal,
            TopologyLevel::Single => PathLevel::Single,
            TopologyLevel::Multiple => PathLevel::Multiple,
            TopologyLevel::HostBridge => PathLevel::HostBridge,
            TopologyLevel::Node => PathLevel::Node,
            TopologyLevel::System => PathLevel::System,
        })
    }
}
