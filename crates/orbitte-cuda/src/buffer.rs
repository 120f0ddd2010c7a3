//! Device memory: allocated and owned here, or a checked borrow of memory
//! another library allocated.

use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUpointer_attribute, CUresult};

use crate::device::{CudaDevice, DeviceError, check_index};
use crate::driver::{DriverError, driver};
use crate::error::{CuError, RangeError, check, check_range};

/// What kind of memory an address is, according to the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Device memory (`cuMemAlloc`, `cudaMalloc`, ...).
    Device,
    /// Host memory known to CUDA (pinned or registered).
    Host,
    /// A CUDA array.
    Array,
    /// Unified memory reported as such.
    Unified,
    /// Not known to CUDA at all (ordinary host memory, or a bad address).
    Unknown,
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Device => "device memory",
            Self::Host => "host memory known to CUDA (pinned or registered)",
            Self::Array => "a CUDA array",
            Self::Unified => "unified memory",
            Self::Unknown => "memory unknown to CUDA",
        })
    }
}

/// What the driver says about a device address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerInfo {
    /// The address asked about.
    pub ptr: u64,
    /// The kind of memory.
    pub kind: MemoryKind,
    /// The device that owns it (device memory only).
    pub device: Option<usize>,
    /// Whether it is managed (`cudaMallocManaged`) memory.
    pub managed: bool,
    /// Start of the allocation that contains `ptr` (device memory only).
    pub allocation_base: u64,
    /// Size of that allocation in bytes (device memory only).
    pub allocation_size: u64,
}

/// Why a device address cannot be used as a device buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PointerError {
    /// The driver or device is unusable.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A zero-length range.
    #[error("zero-length device range: pass at least one byte")]
    ZeroLength,
    /// The address is not device memory.
    #[error(
        "address {ptr:#x} is not CUDA device memory (it is {kind}); pass memory from \
         cuMemAlloc/cudaMalloc, or register host memory as host memory instead"
    )]
    NotDeviceMemory {
        /// The address.
        ptr: u64,
        /// What it is instead.
        kind: MemoryKind,
    },
    /// The range runs past the end of the allocation that holds its start.
    #[error(
        "range at {ptr:#x} of {len} bytes runs past its CUDA allocation ({size} bytes at \
         {base:#x}); shorten the range to the allocation"
    )]
    OutsideAllocation {
        /// Start of the range.
        ptr: u64,
        /// Length of the range.
        len: usize,
        /// Start of the allocation.
        base: u64,
        /// Size of the allocation.
        size: u64,
    },
    /// A driver query failed.
    #[error("inspecting address {ptr:#x}: {source}")]
    Call {
        /// The address.
        ptr: u64,
        /// The failed call.
        #[source]
        source: CuError,
    },
}

impl From<DriverError> for PointerError {
    fn from(e: DriverError) -> Self {
        Self::Device(e.into())
    }
}

/// Why a device allocation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// The driver or device is unusable.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A zero-length allocation.
    #[error("zero-length device allocation: ask for at least one byte")]
    ZeroLength,
    /// More than the device has free.
    #[error(
        "CUDA device {index} ({name}) has {free} bytes free of {total}: cannot allocate \
         {requested} bytes; free device memory or allocate less"
    )]
    InsufficientMemory {
        /// The device.
        index: usize,
        /// Its name.
        name: String,
        /// Bytes asked for.
        requested: usize,
        /// Bytes free when asked.
        free: u64,
        /// Bytes on the device.
        total: u64,
    },
    /// `cuMemAlloc` failed for another reason.
    #[error("allocating {requested} bytes on CUDA device {index}: {source}")]
    Call {
        /// The device.
        index: usize,
        /// Bytes asked for.
        requested: usize,
        /// The failed call.
        #[source]
        source: CuError,
    },
}

enum Owner {
    /// We allocated it with `cuMemAlloc` and free it on drop.
    Allocated,
    /// Someone else allocated it; `keepalive` keeps it allocated.
    Borrowed {
        _keepalive: Box<dyn Any + Send + Sync>,
    },
}

/// A range of device memory.
///
/// Held in an [`Arc`]: the engine's registration, every in-flight staging
/// operation and every retained (unquiesced) copy keep a clone, so the
/// memory is freed only after the last copy touching it has completed.
///
/// Invariant: `ptr..ptr+len` is device memory of `device`, allocated for
/// the life of the value; `len > 0`.
pub struct CudaBuffer {
    device: CudaDevice,
    ptr: u64,
    len: usize,
    owner: Owner,
}

impl CudaBuffer {
    /// Allocates `len` bytes on `device` (`cuMemAlloc`; contents undefined).
    ///
    /// Asking for more than the device has free is a typed error naming the
    /// device and the numbers, checked before the driver is asked.
    pub fn alloc(device: &CudaDevice, len: usize) -> Result<Arc<Self>, AllocError> {
        if len == 0 {
            return Err(AllocError::ZeroLength);
        }
        let mem = device.memory_info()?;
        let too_large = |mem: crate::MemoryInfo| -> AllocError {
            AllocError::InsufficientMemory {
                index: device.index(),
                name: device
                    .info()
                    .map(|i| i.name)
                    .unwrap_or_else(|_| "unknown".to_owned()),
                requested: len,
                free: mem.free,
                total: mem.total,
            }
        };
        if len as u64 > mem.free {
            return Err(too_large(mem));
        }
        device.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the device's context is current and the out-pointer is a live local.
        let status = unsafe { sys::cuMemAlloc_v2(&mut ptr, len) };
        if let Err(source) = check("cuMemAlloc_v2", status) {
            if source.is_out_of_memory() {
                return Err(too_large(device.memory_info().unwrap_or(mem)));
            }
            return Err(AllocError::Call {
                index: device.index(),
                requested: len,
                source,
            });
        }
        tracing::debug!(
            device = device.index(),
            len,
            ptr = format_args!("{ptr:#x}"),
            "cuMemAlloc"
        );
        Ok(Arc::new(Self {
            device: device.clone(),
            ptr,
            len,
            owner: Owner::Allocated,
        }))
    }

    /// Opens device `index` and allocates `len` bytes on it.
    pub fn alloc_on(index: usize, len: usize) -> Result<Arc<Self>, AllocError> {
        Self::alloc(&CudaDevice::open(index)?, len)
    }

    /// Asks the driver what `ptr` is.
    pub fn inspect(ptr: u64) -> Result<PointerInfo, PointerError> {
        let info = driver()?;
        if info.device_count == 0 {
            check_index(0)?;
        }
        let kind =
            match pointer_attribute(ptr, CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)? {
                None => MemoryKind::Unknown,
                Some(1) => MemoryKind::Host,
                Some(2) => MemoryKind::Device,
                Some(3) => MemoryKind::Array,
                Some(4) => MemoryKind::Unified,
                Some(_) => MemoryKind::Unknown,
            };
        let mut out = PointerInfo {
            ptr,
            kind,
            device: None,
            managed: false,
            allocation_base: 0,
            allocation_size: 0,
        };
        if kind != MemoryKind::Device {
            return Ok(out);
        }
        out.device = pointer_attribute(
            ptr,
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        )?
        .map(|v| v as u32 as usize);
        out.managed = pointer_attribute(ptr, CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED)?
            .is_some_and(|v| v as u8 != 0);
        let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: both out-pointers are live locals; the driver only reads `ptr` as a number.
        let status = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) };
        check("cuMemGetAddressRange_v2", status)
            .map_err(|source| PointerError::Call { ptr, source })?;
        out.allocation_base = base;
        out.allocation_size = size as u64;
        Ok(out)
    }

    /// Wraps device memory that something else allocated (a framework's
    /// tensor, say), after checking with the driver that
    /// `device_ptr..device_ptr+len` is device memory inside one allocation.
    ///
    /// # Safety
    /// The memory must stay allocated for as long as `keepalive` lives, and
    /// nothing may free it while the returned value (or any clone of the
    /// `Arc`) is alive. The driver checks cannot prove that.
    pub unsafe fn from_raw_parts(
        device_ptr: u64,
        len: usize,
        keepalive: Box<dyn Any + Send + Sync>,
    ) -> Result<Arc<Self>, PointerError> {
        if len == 0 {
            return Err(PointerError::ZeroLength);
        }
        let info = Self::inspect(device_ptr)?;
        if info.kind != MemoryKind::Device {
            return Err(PointerError::NotDeviceMemory {
                ptr: device_ptr,
                kind: info.kind,
            });
        }
        // Device memory always has an owning device; a driver that will not
        // say which is reported as the failed query.
        let index = info.device.ok_or_else(|| PointerError::Call {
            ptr: device_ptr,
            source: CuError::new("cuPointerGetAttribute", CUresult::CUDA_ERROR_INVALID_VALUE),
        })?;
        let end = device_ptr.checked_add(len as u64);
        let alloc_end = info.allocation_base.saturating_add(info.allocation_size);
        if end.is_none_or(|end| end > alloc_end) {
            return Err(PointerError::OutsideAllocation {
                ptr: device_ptr,
                len,
                base: info.allocation_base,
                size: info.allocation_size,
            });
        }
        let device = CudaDevice::open(index)?;
        Ok(Arc::new(Self {
            device,
            ptr: device_ptr,
            len,
            owner: Owner::Borrowed {
                _keepalive: keepalive,
            },
        }))
    }

    /// The device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes (never zero).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (zero-length buffers cannot be made).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device that holds the memory.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Whether this crate allocated the memory (and frees it on drop).
    pub fn is_owned(&self) -> bool {
        matches!(self.owner, Owner::Allocated)
    }

    /// Checks that `offset..offset+len` lies inside the buffer.
    pub fn check(&self, offset: usize, len: usize) -> Result<(), RangeError> {
        check_range("device buffer", offset, len, self.len)
    }

    /// Sets `len` bytes at `offset` to `byte` and waits until it is done.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), crate::CopyError> {
        self.check(offset, len)?;
        let index = self.device.index();
        self.device.bind().map_err(crate::CopyError::Device)?;
        let call = |source| crate::CopyError::Call { index, source };
        // SAFETY: the range is inside the allocation (checked) and the
        // device's context is current.
        check("cuMemsetD8_v2", unsafe {
            sys::cuMemsetD8_v2(self.ptr + offset as u64, byte, len)
        })
        .map_err(call)?;
        // The memset runs on the legacy stream, which the staging streams
        // (non-blocking) do not wait for: finish it before returning.
        // SAFETY: plain synchronization of the current context.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() }).map_err(call)
    }
}

/// Reads one pointer attribute; `None` when the driver does not know the
/// address (`CUDA_ERROR_INVALID_VALUE`).
fn pointer_attribute(ptr: u64, attr: CUpointer_attribute) -> Result<Option<u64>, PointerError> {
    let query = || {
        // Every attribute read here is at most 8 bytes; a zeroed u64 read
        // back little-endian gives the value whatever its width.
        let mut value: u64 = 0;
        // SAFETY: `value` is a live, 8-byte, zeroed local; the driver writes
        // at most the attribute's size into it and reads `ptr` as a number.
        let status = unsafe {
            sys::cuPointerGetAttribute((&mut value as *mut u64).cast::<c_void>(), attr, ptr)
        };
        (status, value)
    };
    let (mut status, mut value) = query();
    if status == CUresult::CUDA_ERROR_INVALID_CONTEXT {
        // The calling thread has no context: any one will do, since all
        // devices share the unified address space.
        inspection_device()?.bind()?;
        (status, value) = query();
    }
    match status {
        CUresult::CUDA_SUCCESS => Ok(Some(value)),
        CUresult::CUDA_ERROR_INVALID_VALUE => Ok(None),
        other => Err(PointerError::Call {
            ptr,
            source: CuError::new("cuPointerGetAttribute", other),
        }),
    }
}

/// Device 0, opened once and kept for the process, for pointer queries from
/// threads that have no context current.
fn inspection_device() -> Result<&'static CudaDevice, DeviceError> {
    static DEVICE: OnceLock<CudaDevice> = OnceLock::new();
    if let Some(d) = DEVICE.get() {
        return Ok(d);
    }
    let d = CudaDevice::open(0)?;
    Ok(DEVICE.get_or_init(|| d))
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if !matches!(self.owner, Owner::Allocated) {
            return;
        }
        if let Err(e) = self.device.bind() {
            tracing::error!(error = %e, ptr = format_args!("{:#x}", self.ptr), len = self.len,
                "cannot bind the CUDA context to free device memory; leaking it");
            return;
        }
        // SAFETY: we allocated `ptr` with cuMemAlloc and nothing refers to
        // it any more: every copy holds an Arc to us and synchronizes (or
        // retains the Arc forever) before letting go.
        let status = unsafe { sys::cuMemFree_v2(self.ptr) };
        if let Err(e) = check("cuMemFree_v2", status) {
            // Never panic in Drop; a leak is the safe outcome.
            tracing::error!(error = %e, ptr = format_args!("{:#x}", self.ptr), len = self.len,
                "freeing device memory failed; leaking it");
        }
    }
}

impl fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBuffer")
            .field("device", &self.device.index())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("owned", &self.is_owned())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_errors_name_the_device_and_the_numbers() {
        let e = AllocError::InsufficientMemory {
            index: 1,
            name: "NVIDIA H200".into(),
            requested: 300,
            free: 200,
            total: 1000,
        };
        assert_eq!(
            e.to_string(),
            "CUDA device 1 (NVIDIA H200) has 200 bytes free of 1000: cannot allocate 300 bytes; \
             free device memory or allocate less"
        );
        let e = PointerError::NotDeviceMemory {
            ptr: 0x1000,
            kind: MemoryKind::Unknown,
        };
        assert!(e.to_string().starts_with(
            "address 0x1000 is not CUDA device memory (it is memory unknown to CUDA)"
        ));
    }

    #[test]
    fn host_memory_is_never_device_memory() {
        let v = [0u8; 64];
        // SAFETY: the keepalive owns nothing; the call must fail before it matters.
        let r = unsafe { CudaBuffer::from_raw_parts(v.as_ptr() as u64, v.len(), Box::new(())) };
        match r {
            Err(PointerError::NotDeviceMemory { kind, .. }) => {
                assert_eq!(kind, MemoryKind::Unknown)
            }
            Err(PointerError::Device(e)) => println!("skipped: {}", e.reason()),
            other => panic!("host memory accepted as device memory: {other:?}"),
        }
        // SAFETY: as above.
        let zero = unsafe { CudaBuffer::from_raw_parts(0x1000, 0, Box::new(())) };
        assert!(matches!(zero, Err(PointerError::ZeroLength)));
    }

    #[test]
    fn allocations_without_a_device_are_typed_errors() {
        match CudaBuffer::alloc_on(0, 0) {
            Err(AllocError::ZeroLength) => {}
            Err(AllocError::Device(e)) => println!("skipped: {}", e.reason()),
            other => panic!("unexpected: {other:?}"),
        }
    }
}
