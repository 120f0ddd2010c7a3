//! Pinned (page-locked) host memory: the bounce buffers of staging.

use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::sys;
use orbitte_memory::{DmaBuffer, dma};

use crate::device::{CudaDevice, DeviceError};
use crate::error::{CuError, RangeError, check, check_range};

/// Why a pinned allocation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PinnedError {
    /// The driver or device is unusable.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A zero-length allocation.
    #[error("zero-length pinned allocation: ask for at least one byte")]
    ZeroLength,
    /// `cuMemHostAlloc` failed.
    #[error(
        "pinning {len} bytes of host memory for CUDA device {index} failed: {source}; check free \
         host memory and the locked-memory limit (`ulimit -l`)"
    )]
    Call {
        /// The device whose context allocated.
        index: usize,
        /// Bytes asked for.
        len: usize,
        /// The failed call.
        #[source]
        source: CuError,
    },
}

/// Page-locked host memory from `cuMemHostAlloc` (portable: every context
/// can copy to and from it).
///
/// Like [`orbitte_memory::HostMemory`] it never hands out Rust references
/// into its bytes: GPU copy engines and NICs write them by address, so
/// access goes through raw, bounds-checked copies. It implements
/// [`DmaBuffer`], so NICs can register it (a staging pipeline's bounce
/// buffers can be MRs, and the network then reads and writes them
/// directly).
///
/// Invariant: `ptr..ptr+len` is pinned host memory, mapped for the life of
/// the value; `len > 0`.
pub struct PinnedBuffer {
    device: CudaDevice,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns a plain page-locked mapping and hands out no
// references into it; all access is through raw copies, so it can move
// between threads. The context handle inside is Send.
unsafe impl Send for PinnedBuffer {}
// SAFETY: `&PinnedBuffer` allows only raw, bounds-checked copies, which are
// sound under concurrent DMA by design (see the type docs).
unsafe impl Sync for PinnedBuffer {}

// SAFETY: the mapping stays valid at the same address until drop (type
// invariant) and no Rust references into it are handed out.
unsafe impl DmaBuffer for PinnedBuffer {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl PinnedBuffer {
    /// Allocates `len` bytes of pinned host memory through `device`'s
    /// context, zeroed.
    pub fn alloc(device: &CudaDevice, len: usize) -> Result<Arc<Self>, PinnedError> {
        if len == 0 {
            return Err(PinnedError::ZeroLength);
        }
        device.bind()?;
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: the device's context is current; the out-pointer is a live local.
        let status = unsafe { sys::cuMemHostAlloc(&mut raw, len, sys::CU_MEMHOSTALLOC_PORTABLE) };
        check("cuMemHostAlloc", status).map_err(|source| PinnedError::Call {
            index: device.index(),
            len,
            source,
        })?;
        let Some(ptr) = NonNull::new(raw.cast::<u8>()) else {
            return Err(PinnedError::Call {
                index: device.index(),
                len,
                source: CuError::new("cuMemHostAlloc", sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
            });
        };
        // SAFETY: a fresh allocation of `len` bytes that nothing else uses yet.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        tracing::debug!(device = device.index(), len, "cuMemHostAlloc");
        Ok(Arc::new(Self {
            device: device.clone(),
            ptr,
            len,
        }))
    }

    /// Length in bytes (never zero).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (zero-length buffers cannot be made).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// First byte, for NIC registration and copies.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The device whose context allocated the buffer.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Checks that `offset..offset+len` lies inside the buffer.
    pub fn check(&self, offset: usize, len: usize) -> Result<(), RangeError> {
        check_range("pinned buffer", offset, len, self.len)
    }

    /// Copies bytes out of the buffer.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), RangeError> {
        dma::read_at(self, offset, dst).map_err(|_| self.out_of_range(offset, dst.len()))
    }

    /// Copies bytes into the buffer.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<(), RangeError> {
        dma::write_at(self, offset, src).map_err(|_| self.out_of_range(offset, src.len()))
    }

    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), RangeError> {
        dma::fill(self, offset, len, byte).map_err(|_| self.out_of_range(offset, len))
    }

    /// The error of orbitte-memory's bounds-checked copies, in this crate's
    /// terms. Pinned memory is always writable, so being out of range is
    /// the only way those copies fail here.
    fn out_of_range(&self, offset: usize, len: usize) -> RangeError {
        RangeError {
            what: "pinned buffer",
            offset,
            len,
            size: self.len,
        }
    }

    /// Copies `len` bytes at `offset` into a new vector.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, RangeError> {
        let mut v = vec![0; len];
        self.read_at(offset, &mut v)?;
        Ok(v)
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.device.bind() {
            tracing::error!(error = %e, len = self.len,
                "cannot bind the CUDA context to free pinned memory; leaking it");
            return;
        }
        // SAFETY: `ptr` came from cuMemHostAlloc and nothing refers to it:
        // copies and NIC registrations hold an Arc to us until they are done.
        let status = unsafe { sys::cuMemFreeHost(self.ptr.as_ptr().cast()) };
        if let Err(e) = check("cuMemFreeHost", status) {
            // Never panic in Drop; a leak is the safe outcome.
            tracing::error!(error = %e, len = self.len, "freeing pinned memory failed; leaking it");
        }
    }
}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("device", &self.device.index())
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_buffers_are_dma_buffers_and_thread_safe() {
        fn assert_dma<T: DmaBuffer + Send + Sync>() {}
        assert_dma::<PinnedBuffer>();
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Arc<PinnedBuffer>>();
        assert_send_sync::<Arc<crate::CudaBuffer>>();
        assert_send_sync::<CudaDevice>();
        assert_send_sync::<crate::CopyStream>();
        assert_send_sync::<crate::StagingPipeline>();
        // A bounce buffer can be handed to the verbs layer as an MR target.
        fn as_dma(b: Arc<PinnedBuffer>) -> Arc<dyn DmaBuffer> {
            b
        }
        let _ = as_dma;
    }

    #[test]
    fn pinned_error_names_the_fix() {
        let e = PinnedError::Call {
            index: 0,
            len: 4096,
            source: CuError::new("cuMemHostAlloc", sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
        };
        assert!(e.to_string().contains("ulimit -l"), "{e}");
    }
}
