//! The real [`GpuSource`]: NVML through `nvml-wrapper` (never by parsing `nvidia-smi`), and
//! NVML's own functions where the wrapper falls short: per-link field values (the wrapper cannot
//! set a field's `scopeId`, which names the link) and the far end's device type (the wrapper's
//! `remote_device_type` hands NVML a temporary and always answers "unknown").

use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus, TopologyLevel};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_NVLINK_GET_SPEED, NVML_FI_DEV_NVLINK_LINK_COUNT, NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON,
    NVML_FI_DEV_NVLINK_SPEED_MBPS_L0, NVML_FI_DEV_NVLINK_SPEED_MBPS_L6,
};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as raw;

use super::source::{
    normalize_bus_id, GpuFacts, GpuSource, LinkErrors, LinkFacts, NvlinkVersion, PathLevel, Remote, SourceError,
};

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

/// Integer field values (`nvmlDeviceGetFieldValues`), one per `(field id, scope id)`; `None`
/// where NVML has no value (not supported, or the call failed).
fn fields(device: &Device<'_>, ids: &[(u32, u32)]) -> Vec<Option<u64>> {
    let none = vec![None; ids.len()];
    let Ok(get) = device.nvml().lib().nvmlDeviceGetFieldValues.as_ref() else { return none };
    let mut values: Vec<raw::nvmlFieldValue_t> = ids
        .iter()
        .map(|&(id, scope)| {
            // SAFETY: nvmlFieldValue_t is plain C data (integers and a union of numbers), for
            // which all-zero bytes are a valid value.
            let mut v: raw::nvmlFieldValue_t = unsafe { std::mem::zeroed() };
            v.fieldId = id;
            v.scopeId = scope;
            v
        })
        .collect();
    // SAFETY: the handle is live for the borrow of `device` (NVML stays initialised while
    // `Nvml` lives); `values` holds `values.len()` initialised entries that NVML fills in place.
    let rc = unsafe { get(device.handle(), values.len() as i32, values.as_mut_ptr()) };
    if rc != raw::nvmlReturn_enum_NVML_SUCCESS {
        return none;
    }
    values.iter().map(field_value).collect()
}

/// The integer in one answered field value.
fn field_value(v: &raw::nvmlFieldValue_t) -> Option<u64> {
    if v.nvmlReturn != raw::nvmlReturn_enum_NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML wrote the union member that `valueType` names; only that member is read.
    unsafe {
        match v.valueType {
            raw::nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE => Some(v.value.dVal as u64),
            raw::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT => Some(v.value.uiVal.into()),
            raw::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG => Some(v.value.ulVal),
            raw::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG => Some(v.value.ullVal),
            raw::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG => u64::try_from(v.value.sllVal).ok(),
            raw::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_INT => u64::try_from(v.value.siVal).ok(),
            raw::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT => Some(v.value.usVal.into()),
            _ => None,
        }
    }
}

/// The pre-R520 per-link speed fields, which exist for links 0–11 only.
fn legacy_speed_field(link: u32) -> Option<u32> {
    match link {
        0..=5 => Some(NVML_FI_DEV_NVLINK_SPEED_MBPS_L0 + link),
        6..=11 => Some(NVML_FI_DEV_NVLINK_SPEED_MBPS_L6 + link - 6),
        _ => None,
    }
}

/// Speed of each link, MB/s: `NVML_FI_DEV_NVLINK_GET_SPEED` with the link as scope (what
/// `nvidia-smi nvlink -s` shows), else the older per-link field.
fn link_speeds(device: &Device<'_>, links: u32) -> Vec<Option<u64>> {
    let scoped = fields(device, &(0..links).map(|l| (NVML_FI_DEV_NVLINK_GET_SPEED, l)).collect::<Vec<_>>());
    let legacy_ids: Vec<(u32, u32)> = (0..links).filter_map(|l| Some((legacy_speed_field(l)?, 0))).collect();
    let legacy = fields(device, &legacy_ids);
    scoped
        .into_iter()
        .enumerate()
        .map(|(l, s)| s.filter(|&s| s > 0).or_else(|| legacy.get(l).copied().flatten().filter(|&s| s > 0)))
        .collect()
}

/// The far end's device type (`nvmlDeviceGetNvLinkRemoteDeviceType`).
fn remote_type(device: &Device<'_>, link: u32) -> Option<Remote> {
    let get = device.nvml().lib().nvmlDeviceGetNvLinkRemoteDeviceType.as_ref().ok()?;
    let mut t: raw::nvmlIntNvLinkDeviceType_t = raw::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    // SAFETY: a live device handle, a link index below the GPU's link count, and a pointer to
    // a local that NVML writes.
    let rc = unsafe { get(device.handle(), link, &mut t) };
    (rc == raw::nvmlReturn_enum_NVML_SUCCESS).then_some(match t {
        raw::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU => Remote::Gpu,
        raw::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH => Remote::Switch,
        _ => Remote::Other,
    })
}

fn link_facts(device: &Device<'_>, link: u32, speed_mbps: Option<u64>) -> Result<LinkFacts, NvmlError> {
    let l = device.link_wrapper_for(link);
    let active = l.is_active()?;
    let count = |c| l.error_counter(c).ok();
    let crc = match (count(ErrorCounter::DlCrcFlit), count(ErrorCounter::DlCrcData)) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
    Ok(LinkFacts {
        link,
        active,
        version: l.version().ok().map(NvlinkVersion),
        speed_mbps: speed_mbps.filter(|_| active),
        remote_bus_id: l.remote_pci_info().ok().map(|p| normalize_bus_id(&p.bus_id)),
        remote: remote_type(device, link),
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
        let [count, common] =
            fields(&d, &[(NVML_FI_DEV_NVLINK_LINK_COUNT, 0), (NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON, 0)])[..]
        else {
            unreachable!("one answer per field asked")
        };
        let max_links = count.map_or(MAX_LINKS, |n| n.min(MAX_LINKS as u64) as u32);
        let speeds = link_speeds(&d, max_links);
        // Links the GPU does not have answer "invalid argument" or "not supported": stop there.
        let links: Vec<LinkFacts> = (0..max_links).map_while(|l| link_facts(&d, l, speeds[l as usize]).ok()).collect();
        let any_active = links.iter().any(|l| l.active);
        Ok(GpuFacts {
            index,
            name: d.name().map_err(err)?,
            bus_id: normalize_bus_id(&d.pci_info().map_err(err)?.bus_id),
            compute_capability: d.cuda_compute_capability().ok().map(|c| (c.major, c.minor)),
            numa_node: d.numa_node_id().ok(),
            pcie,
            nvlink_speed_mbps: common.filter(|&s| s > 0 && any_active),
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

    fn nvlink_p2p(&self, a: usize, b: usize) -> Result<bool, SourceError> {
        let (da, db) = (self.device(a)?, self.device(b)?);
        match da.p2p_status(&db, P2pCapabilitiesIndex::NvLink).map_err(err)? {
            P2pStatus::Ok => Ok(true),
            // No answer, not a "no": a virtual machine that hides the NVLink switches may say so
            // of links that are up and carry P2P. Undecided, so that the links decide.
            status @ (P2pStatus::NotSupported | P2pStatus::Unknown) => {
                Err(SourceError(format!("NVLink P2P status {status:?}")))
            }
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(return_code: u32, value_type: u32, set: impl FnOnce(&mut raw::nvmlValue_t)) -> raw::nvmlFieldValue_t {
        // SAFETY: plain C data, all-zero bytes are a valid value.
        let mut v: raw::nvmlFieldValue_t = unsafe { std::mem::zeroed() };
        v.fieldId = NVML_FI_DEV_NVLINK_GET_SPEED;
        v.nvmlReturn = return_code;
        v.valueType = value_type;
        set(&mut v.value);
        v
    }

    #[test]
    fn field_values_are_read_by_their_type_and_errors_are_none() {
        let ok = raw::nvmlReturn_enum_NVML_SUCCESS;
        assert_eq!(
            field_value(&value(ok, raw::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT, |u| u.uiVal = 26562)),
            Some(26562)
        );
        assert_eq!(
            field_value(&value(ok, raw::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, |u| u.ullVal = 1 << 40)),
            Some(1 << 40)
        );
        assert_eq!(
            field_value(&value(ok, raw::nvmlValueType_enum_NVML_VALUE_TYPE_SIGNED_LONG_LONG, |u| u.sllVal = -1)),
            None
        );
        assert_eq!(
            field_value(&value(ok, raw::nvmlValueType_enum_NVML_VALUE_TYPE_DOUBLE, |u| u.dVal = 18.0)),
            Some(18)
        );
        assert_eq!(
            field_value(&value(ok, raw::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_SHORT, |u| u.usVal = 7)),
            Some(7)
        );
        let not_supported = raw::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
        assert_eq!(
            field_value(&value(not_supported, raw::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT, |u| u.uiVal = 5)),
            None
        );
    }

    #[test]
    fn the_older_per_link_speed_fields_cover_links_0_to_11() {
        assert_eq!(legacy_speed_field(0), Some(84));
        assert_eq!(legacy_speed_field(5), Some(89));
        assert_eq!(legacy_speed_field(6), Some(132));
        assert_eq!(legacy_speed_field(11), Some(137));
        assert_eq!(legacy_speed_field(12), None);
    }
}
