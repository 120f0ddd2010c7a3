//! CUDA device memory named by address: recognising a pointer the caller
//! gives as a plain int, and wrapping it for the cuda-staging path.
//!
//! vLLM and SGLang register GPU KV-cache tensors by their `data_ptr()`.
//! Such memory is never handed to a NIC: the engine's staging lanes copy
//! it through pinned host bounce buffers, and the network moves those
//! (`MemoryPath::CudaStaging`). A registration made here says it is
//! staged; a published one is served to peers over tcp by the engine's
//! target, through host memory as well.
//!
//! - [`device_memory`]: `addr..addr+len` as device memory, or why not
//!   (no driver, no device, not device memory, past its allocation);
//!   `orbitte.Engine.register_device` and NIXL's "VRAM" use it.
//! - [`recognise`]: what Mooncake's `register_memory(ptr, len)` needs:
//!   host memory mapped read-write in this process first, else a CUDA
//!   device pointer, else a refusal that names the address and what was
//!   tried (and whether libcuda was found).
//!
//! The driver is asked only when the address is not host memory, so a
//! host registration never loads libcuda.

use std::sync::Arc;

use orbitte::HostMemory;
use orbitte_cuda::{CudaBuffer, DeviceError, PointerError};
use pyo3::prelude::*;

use crate::memory::{RangeError, RawMemoryError, checked_range, wrap_raw};

/// How every report and error message about device memory says how it
/// moves (none claims a direct GPU path).
pub(crate) const STAGED: &str = "staged through host memory (cuda-staging path)";

/// Why an address cannot be registered as CUDA device memory.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DeviceMemoryError {
    #[error(transparent)]
    Range(#[from] RangeError),
    /// There is no usable driver, or no device (the error says which,
    /// and the fix).
    #[error("{addr:#x}+{len} cannot be registered as CUDA device memory: {source}")]
    Unusable {
        addr: u64,
        len: u64,
        #[source]
        source: DeviceError,
    },
    /// The driver answered, and not with device memory this range fits.
    #[error("{addr:#x}+{len} cannot be registered as CUDA device memory: {source}")]
    Pointer {
        addr: u64,
        len: u64,
        #[source]
        source: PointerError,
    },
}

impl DeviceMemoryError {
    /// What the driver said, without the fix (the clause of a refusal that
    /// tried host memory first).
    fn clause(&self) -> String {
        match self {
            Self::Unusable {
                source: DeviceError::NoDevice { library, reason },
                ..
            } => format!("{library} is loaded but reports no CUDA device ({reason})"),
            Self::Unusable { source, .. } => source.reason(),
            Self::Pointer {
                source: PointerError::NotDeviceMemory { kind, .. },
                ..
            } => match orbitte_cuda::driver() {
                Ok(d) => format!("{} is loaded and says it is {kind}", d.library),
                Err(_) => format!("the driver says it is {kind}"),
            },
            Self::Pointer { source, .. } => source.to_string(),
            other => other.to_string(),
        }
    }
}

/// `addr..addr+len` as CUDA device memory, after the driver said it is
/// device memory inside one allocation (`cuPointerGetAttribute`,
/// `cuMemGetAddressRange`); its device is the one the driver names.
/// `keepalive` (the tensor owning it, or `None`) lives as long as the
/// buffer.
pub(crate) fn device_memory(
    addr: u64,
    len: u64,
    keepalive: Py<PyAny>,
) -> Result<Arc<CudaBuffer>, DeviceMemoryError> {
    let (_, n) = checked_range(addr, len)?;
    let unusable = |source: DeviceError| DeviceMemoryError::Unusable { addr, len, source };
    let info = orbitte_cuda::driver().map_err(|e| unusable(e.into()))?;
    if info.device_count == 0 {
        return Err(unusable(DeviceError::NoDevice {
            library: info.library.clone(),
            reason: info.no_device.clone().unwrap_or_default(),
        }));
    }
    // SAFETY: `from_raw_parts` first asks the driver that
    // `addr..addr+len` is device memory inside one live allocation, so a
    // wrong pointer is an error here. That the allocation outlives the
    // registration is the caller's promise, as with Mooncake's and NIXL's
    // register_memory (when `keepalive` is the owning tensor, it is kept
    // alive with the buffer). The memory is only ever touched by the
    // driver's copies (the staging lanes' cuMemcpy*Async), never through a
    // host pointer, so memory freed early fails those copies with a CUDA
    // error instead of faulting this process.
    let buffer = unsafe { CudaBuffer::from_raw_parts(addr, n, Box::new(keepalive)) };
    buffer.map_err(|source| match source {
        PointerError::Device(e) => unusable(e),
        source => DeviceMemoryError::Pointer { addr, len, source },
    })
}

/// Memory named by a plain address, as [`recognise`] found it.
#[derive(Debug)]
pub(crate) enum Recognised {
    /// Host memory mapped read-write here (copied through the kernel).
    Host(Arc<HostMemory>),
    /// CUDA device memory: registered on the cuda-staging path.
    Device(Arc<CudaBuffer>),
}

/// Why an address is neither host memory nor device memory.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UnrecognisedMemory {
    /// Refused before either kind was tried (NULL, zero length, overflow).
    #[error(transparent)]
    Input(RawMemoryError),
    #[error(
        "{addr:#x}+{len} is neither mapped host memory nor a CUDA device pointer (host: {host}; CUDA: {cuda}): pass the address and size of a live, writable host buffer or of CUDA device memory (cuMemAlloc/cudaMalloc, a CUDA tensor's data_ptr())"
    )]
    Neither {
        addr: u64,
        len: u64,
        host: String,
        cuda: String,
    },
}

/// What `addr..addr+len` is: host memory mapped read-write in this process
/// (`/proc/self/maps`), else (when libcuda loads) device memory the driver
/// recognises, else the refusal naming both answers.
pub(crate) fn recognise(
    py: Python<'_>,
    addr: u64,
    len: u64,
) -> Result<Recognised, UnrecognisedMemory> {
    let host = match wrap_raw(addr, len, py.None(), false) {
        Ok(memory) => return Ok(Recognised::Host(memory)),
        Err(RawMemoryError::NotMapped { why, .. }) => why,
        Err(e) => return Err(UnrecognisedMemory::Input(e)),
    };
    let none = py.None();
    match py.detach(move || device_memory(addr, len, none)) {
        Ok(buffer) => Ok(Recognised::Device(buffer)),
        Err(e) => Err(UnrecognisedMemory::Neither {
            addr,
            len,
            host,
            cuda: e.clause(),
        }),
    }
}

/// Appends to the message of `err` (an exception about a batch) that
/// request `index` has local memory on CUDA device `device`, staged.
pub(crate) fn note_staged(py: Python<'_>, err: &PyErr, index: usize, device: usize) {
    let value = err.value(py);
    let message = value.str().map(|s| s.to_string()).unwrap_or_default();
    let noted = format!(
        "{message}; the local memory of request #{index} is CUDA device memory on device {device}, {STAGED}"
    );
    // Setting `args` changes what `str(err)` says; the type and the other
    // attributes (`outcomes`) stay.
    let _ = value.setattr("args", (noted,));
}

/// How a published device registration is served, in words.
pub(crate) const SERVED: &str =
    "published: peers READ and WRITE it over tcp, served through host memory";

/// A device registration in words, for reports (`remote`: published).
pub(crate) fn describe(buffer: &CudaBuffer, remote: bool) -> String {
    format!(
        "CUDA device memory on device {} ({} bytes at {:#x}), {STAGED}, {}",
        buffer.device().index(),
        buffer.len(),
        buffer.device_ptr(),
        if remote {
            SERVED
        } else {
            "local-only (peers cannot address it)"
        }
    )
}
