//! What the CUDA driver says: whether it is there, its version, each device's PCI address, and
//! peer access between devices (`cuDeviceCanAccessPeer`).

use cudarc::driver::sys::{self, CUdevice_attribute};
use cudarc::driver::{result, DriverError};
use serde::Serialize;

use crate::error::CliError;

/// True when `libcuda.so` can be loaded (cudarc panics on a missing driver library otherwise).
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the driver library with dlopen, which runs its initialisers; the
    // CUDA driver's are sound to run from any thread.
    unsafe { sys::is_culib_present() }
}

/// Why the CUDA driver library cannot be loaded, in the dynamic loader's words; `None` when it
/// can.
pub fn driver_load_error() -> Option<String> {
    if driver_present() {
        return None;
    }
    // SAFETY: as in `driver_present`: dlopen runs the driver library's initialisers, which are
    // sound to run from any thread.
    Some(match unsafe { libloading::Library::new("libcuda.so.1") } {
        Err(e) => e.to_string(),
        Ok(_) => "libcuda.so.1 loads, but cudarc found no usable CUDA driver library".into(),
    })
}

/// Number of CUDA devices, or [`CliError::NoDriver`] when the driver library cannot be loaded
/// (a run needs it; the doctor reports it as one of its checks).
pub fn devices() -> Result<usize, CliError> {
    match driver_load_error() {
        Some(why) => Err(CliError::NoDriver(why)),
        None => Ok(device_count()),
    }
}

/// Number of CUDA devices; 0 without a driver or a device.
pub fn device_count() -> usize {
    if !driver_present() || result::init().is_err() {
        return 0;
    }
    result::device::get_count().map(|n| n.max(0) as usize).unwrap_or(0)
}

/// The CUDA driver's version (`cuDriverGetVersion`, e.g. 13000), if a driver is present.
pub fn driver_version() -> Option<i32> {
    if !driver_present() {
        return None;
    }
    let mut v = 0;
    // SAFETY: the driver library is present (checked); the call writes one int through a live local.
    let rc = unsafe { sys::cuDriverGetVersion(&mut v) };
    (rc == sys::CUresult::CUDA_SUCCESS).then_some(v)
}

/// `13000` → `13.0`.
pub fn version_text(code: i32) -> String {
    format!("{}.{}", code / 1000, code % 1000 / 10)
}

/// The PCI address of CUDA device `ordinal`, as `0000:00:06.0`.
pub fn pci_address(ordinal: usize) -> Result<String, DriverError> {
    let dev = result::device::get(ordinal as i32)?;
    let attr = |a| {
        // SAFETY: `dev` is a valid device handle; the attribute is a plain integer query.
        unsafe { result::device::get_attribute(dev, a) }
    };
    let domain = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
    let bus = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
    let device = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
    Ok(format!("{domain:04x}:{bus:02x}:{device:02x}.0"))
}

/// The name of CUDA device `ordinal`.
pub fn device_name(ordinal: usize) -> Result<String, DriverError> {
    result::device::get_name(result::device::get(ordinal as i32)?)
}

/// Peer access between two CUDA devices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PeerAccess {
    /// PCI address of the accessing device.
    pub from: String,
    /// PCI address of the accessed device.
    pub to: String,
    /// `cuDeviceCanAccessPeer`.
    pub possible: bool,
}

/// Peer access for every ordered pair of CUDA devices, keyed by PCI address (CUDA's device order
/// need not be NVML's).
pub fn peer_matrix() -> Result<Vec<PeerAccess>, DriverError> {
    let n = device_count();
    let addresses = (0..n).map(pci_address).collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::new();
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            let (da, db) = (result::device::get(a as i32)?, result::device::get(b as i32)?);
            let mut can = 0;
            // SAFETY: both handles are valid devices; the call writes one int through a live local.
            unsafe { sys::cuDeviceCanAccessPeer(&mut can, da, db) }.result()?;
            out.push(PeerAccess { from: addresses[a].clone(), to: addresses[b].clone(), possible: can != 0 });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::error::{CliError, EXIT_RUN_FAILED};

    #[test]
    fn a_missing_driver_is_a_failed_run_that_points_at_the_doctor() {
        let e = CliError::NoDriver("libcuda.so.1: cannot open shared object file: No such file or directory".into());
        assert_eq!(
            e.to_string(),
            "no CUDA driver: libcuda.so.1 could not be loaded (libcuda.so.1: cannot open shared object file: No \
             such file or directory); run `gpucomm doctor`"
        );
        assert_eq!(e.exit_code(), EXIT_RUN_FAILED);
    }

    #[test]
    fn version_codes() {
        assert_eq!(super::version_text(13000), "13.0");
        assert_eq!(super::version_text(12090), "12.9");
    }
}
