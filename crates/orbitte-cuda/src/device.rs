//! Device discovery and the device handle.

use std::ffi::{c_char, c_int};
use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudarc::driver::sys::{self, CUdevice_attribute};

use crate::driver::{DriverError, driver, guarded};
use crate::error::{CuError, check, from_driver};

/// Why a device could not be found, opened or queried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The driver itself is unusable.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// The driver loaded but reports no device.
    #[error(
        "no CUDA device: {library} reports none ({reason}); check `nvidia-smi`, the /dev/nvidia* \
         nodes visible here and CUDA_VISIBLE_DEVICES"
    )]
    NoDevice {
        /// The driver library.
        library: String,
        /// What the driver said.
        reason: String,
    },
    /// The index is past the last device.
    #[error(
        "CUDA device {index} does not exist: the driver reports {count} device(s), so use an \
         index below {count}"
    )]
    NoSuchDevice {
        /// The index asked for.
        index: usize,
        /// How many devices there are.
        count: usize,
    },
    /// A driver call about the device failed.
    #[error("CUDA device {index}: {source}")]
    Call {
        /// The device.
        index: usize,
        /// The failed call.
        #[source]
        source: CuError,
    },
}

impl DeviceError {
    /// The reason without the fix, e.g. for a `skipped: ...` line.
    pub fn reason(&self) -> String {
        match self {
            Self::Driver(e) => e.reason(),
            Self::NoDevice { reason, .. } => format!("no CUDA device ({reason})"),
            other => other.to_string(),
        }
    }
}

/// One device as discovered (plain data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The CUDA ordinal (as `CUDA_VISIBLE_DEVICES` numbers them here).
    pub index: usize,
    /// The marketing name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// PCI address as sysfs spells it (`0000:3b:00.0`, lower-case), so the
    /// topology layer can rank NICs by PCIe/NUMA distance to the GPU.
    pub pci_bus_id: String,
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
}

/// Free and total device memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes the driver can still allocate.
    pub free: u64,
    /// Bytes on the device.
    pub total: u64,
}

/// Checks the driver and that `index` names a device.
pub(crate) fn check_index(index: usize) -> Result<(), DeviceError> {
    let info = driver()?;
    if info.device_count == 0 {
        return Err(DeviceError::NoDevice {
            library: info.library.clone(),
            reason: info
                .no_device
                .clone()
                .unwrap_or_else(|| "0 devices".to_owned()),
        });
    }
    if index >= info.device_count {
        return Err(DeviceError::NoSuchDevice {
            index,
            count: info.device_count,
        });
    }
    Ok(())
}

/// Lists every device the driver reports.
///
/// Errors with [`DeviceError::NoDevice`] when there are none, so an empty
/// list never hides the reason.
pub fn devices() -> Result<Vec<DeviceInfo>, DeviceError> {
    check_index(0)?;
    let count = driver()?.device_count;
    (0..count).map(device_info).collect()
}

fn attribute(
    index: usize,
    dev: sys::CUdevice,
    attr: CUdevice_attribute,
) -> Result<u32, DeviceError> {
    let mut value: c_int = 0;
    // SAFETY: `dev` came from cuDeviceGet and the out-pointer is a live local.
    let status = unsafe { sys::cuDeviceGetAttribute(&mut value, attr, dev) };
    check("cuDeviceGetAttribute", status).map_err(|source| DeviceError::Call { index, source })?;
    Ok(u32::try_from(value).unwrap_or(0))
}

/// Reads a NUL-terminated string the driver writes into a fixed buffer.
fn driver_string(
    index: usize,
    call: &'static str,
    f: impl FnOnce(*mut c_char, c_int) -> sys::CUresult,
) -> Result<String, DeviceError> {
    let mut buf = [0u8; 256];
    // The last byte stays 0, so the string is terminated whatever the driver does.
    let status = f(buf.as_mut_ptr().cast(), (buf.len() - 1) as c_int);
    check(call, status).map_err(|source| DeviceError::Call { index, source })?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

fn device_info(index: usize) -> Result<DeviceInfo, DeviceError> {
    let call = |source| DeviceError::Call { index, source };
    let ordinal = c_int::try_from(index).map_err(|_| DeviceError::NoSuchDevice {
        index,
        count: driver().map(|d| d.device_count).unwrap_or(0),
    })?;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: the driver is initialized (check_index) and the out-pointer is a live local.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal)
    })
    .map_err(call)?;
    // SAFETY: the buffer pointer and length come from `driver_string`'s own buffer.
    let name = driver_string(index, "cuDeviceGetName", |p, n| unsafe {
        sys::cuDeviceGetName(p, n, dev)
    })?;
    // SAFETY: as above.
    let pci = driver_string(index, "cuDeviceGetPCIBusId", |p, n| unsafe {
        sys::cuDeviceGetPCIBusId(p, n, dev)
    })?;
    let mut total: usize = 0;
    // SAFETY: `dev` came from cuDeviceGet and the out-pointer is a live local.
    check("cuDeviceTotalMem_v2", unsafe {
        sys::cuDeviceTotalMem_v2(&mut total, dev)
    })
    .map_err(call)?;
    let major = attribute(
        index,
        dev,
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    )?;
    let minor = attribute(
        index,
        dev,
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    )?;
    Ok(DeviceInfo {
        index,
        name,
        pci_bus_id: pci.to_ascii_lowercase(),
        total_memory: total as u64,
        compute_capability: (major, minor),
    })
}

/// A handle on one device: its primary context, retained while any clone
/// (or any buffer, stream or pipeline made from it) lives.
#[derive(Debug, Clone)]
pub struct CudaDevice {
    index: usize,
    ctx: Arc<CudaContext>,
}

impl CudaDevice {
    /// Opens device `index`, retaining its primary context.
    pub fn open(index: usize) -> Result<Self, DeviceError> {
        check_index(index)?;
        let ctx = guarded("CudaContext::new", || CudaContext::new(index))?.map_err(|e| {
            DeviceError::Call {
                index,
                source: from_driver("cuDevicePrimaryCtxRetain", e),
            }
        })?;
        tracing::debug!(index, "opened CUDA device");
        Ok(Self { index, ctx })
    }

    /// The CUDA ordinal.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Name, PCI bus ID, memory and compute capability.
    pub fn info(&self) -> Result<DeviceInfo, DeviceError> {
        device_info(self.index)
    }

    /// Free and total memory now.
    pub fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the context is current (bind) and both out-pointers are live locals.
        let status = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
        check("cuMemGetInfo_v2", status).map_err(|source| DeviceError::Call {
            index: self.index,
            source,
        })?;
        Ok(MemoryInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    /// Makes this device's context current on the calling thread.
    ///
    /// Done here rather than through cudarc's `bind_to_thread`, which also
    /// returns (and clears) errors recorded by unrelated drops.
    pub(crate) fn bind(&self) -> Result<(), DeviceError> {
        let call = |source| DeviceError::Call {
            index: self.index,
            source,
        };
        let want = self.ctx.cu_ctx();
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the out-pointer is a live local.
        check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })
        .map_err(call)?;
        if current != want {
            // SAFETY: `want` is the primary context retained by `self.ctx`,
            // alive for as long as this handle.
            check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(want) }).map_err(call)?;
        }
        Ok(())
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_device_and_the_numbers() {
        let e = DeviceError::NoSuchDevice { index: 7, count: 2 };
        assert_eq!(
            e.to_string(),
            "CUDA device 7 does not exist: the driver reports 2 device(s), so use an index below 2"
        );
        let e = DeviceError::NoDevice {
            library: "libcuda.so.1".into(),
            reason: "cuInit returned CUDA_ERROR_NO_DEVICE (100)".into(),
        };
        assert_eq!(
            e.reason(),
            "no CUDA device (cuInit returned CUDA_ERROR_NO_DEVICE (100))"
        );
    }

    #[test]
    fn an_index_past_the_devices_is_a_typed_error() {
        match check_index(usize::MAX) {
            Err(DeviceError::NoSuchDevice { index, count }) => {
                assert_eq!(index, usize::MAX);
                assert!(count > 0);
            }
            Err(e @ (DeviceError::Driver(_) | DeviceError::NoDevice { .. })) => {
                println!("skipped: {}", e.reason());
            }
            other => panic!("unexpected: {other:?}"),
        }
    }
}
