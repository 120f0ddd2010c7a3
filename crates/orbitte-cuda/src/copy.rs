//! Synchronized copies between device memory and pinned host memory.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use cudarc::driver::sys::{self, CUresult};

use crate::buffer::CudaBuffer;
use crate::device::{CudaDevice, DeviceError};
use crate::error::{CuError, RangeError, check, from_driver};
use crate::pinned::PinnedBuffer;

/// Why a staging copy failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    /// The driver or device is unusable.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A range outside a buffer.
    #[error(transparent)]
    OutOfBounds(#[from] RangeError),
    /// The device buffer lives on another device than the stream.
    #[error(
        "the device buffer is on CUDA device {buffer_device} but the copy stream is on device \
         {stream_device}; make the stream (or pipeline) on the buffer's device"
    )]
    WrongDevice {
        /// The buffer's device.
        buffer_device: usize,
        /// The stream's device.
        stream_device: usize,
    },
    /// A copy could not be issued, or completed with an error.
    #[error("copy on CUDA device {index}: {source}")]
    Call {
        /// The device.
        index: usize,
        /// The failed call.
        #[source]
        source: CuError,
    },
    /// Waiting for a copy failed, so it may still be running: the buffers it
    /// touches are retained (leaked) so no DMA can reach freed memory.
    #[error(
        "copy on CUDA device {index} not drained: {source}; its buffers are retained so no DMA \
         can reach freed memory; check `nvidia-smi` and `dmesg` (Xid errors)"
    )]
    NotDrained {
        /// The device.
        index: usize,
        /// The failed wait.
        #[source]
        source: CuError,
    },
}

/// Direction of a staging copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Device to host (download).
    DeviceToHost,
    /// Host to device (upload).
    HostToDevice,
}

/// A CUDA stream (non-blocking) on one device, for staging copies.
///
/// [`download`](Self::download) and [`upload`](Self::upload) return only
/// after the copy has completed, so the bytes can be handed on at once.
#[derive(Debug)]
pub struct CopyStream {
    device: CudaDevice,
    stream: Arc<CudaStream>,
}

impl CopyStream {
    /// Creates a stream on `device`.
    pub fn new(device: &CudaDevice) -> Result<Self, DeviceError> {
        let stream = device
            .context()
            .new_stream()
            .map_err(|e| DeviceError::Call {
                index: device.index(),
                source: from_driver("cuStreamCreate", e),
            })?;
        Ok(Self {
            device: device.clone(),
            stream,
        })
    }

    /// The stream's device.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Copies `len` bytes from `src` at `src_offset` (device) into `dst` at
    /// `dst_offset` (pinned host) and waits for the copy to complete.
    pub fn download(
        &self,
        src: &Arc<CudaBuffer>,
        src_offset: usize,
        dst: &Arc<PinnedBuffer>,
        dst_offset: usize,
        len: usize,
    ) -> Result<(), CopyError> {
        self.copy_and_wait(
            Direction::DeviceToHost,
            src,
            src_offset,
            dst,
            dst_offset,
            len,
        )
    }

    /// Copies `len` bytes from `src` at `src_offset` (pinned host) into `dst`
    /// at `dst_offset` (device) and waits for the copy to complete.
    pub fn upload(
        &self,
        src: &Arc<PinnedBuffer>,
        src_offset: usize,
        dst: &Arc<CudaBuffer>,
        dst_offset: usize,
        len: usize,
    ) -> Result<(), CopyError> {
        self.copy_and_wait(
            Direction::HostToDevice,
            dst,
            dst_offset,
            src,
            src_offset,
            len,
        )
    }

    /// Whether every copy issued on the stream has completed
    /// (`cuStreamQuery`): the drain check.
    pub fn is_idle(&self) -> Result<bool, CopyError> {
        self.device.bind()?;
        // SAFETY: the stream belongs to the current context and is alive.
        match unsafe { sys::cuStreamQuery(self.stream.cu_stream()) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => Err(self.call_error(CuError::new("cuStreamQuery", other))),
        }
    }

    fn copy_and_wait(
        &self,
        dir: Direction,
        device_buf: &Arc<CudaBuffer>,
        device_offset: usize,
        host_buf: &Arc<PinnedBuffer>,
        host_offset: usize,
        len: usize,
    ) -> Result<(), CopyError> {
        // SAFETY: we wait for the copy below before the borrows end, and if
        // the wait fails both buffers are retained forever.
        unsafe { self.enqueue(dir, device_buf, device_offset, host_buf, host_offset, len) }?;
        self.synchronize().inspect_err(|_| {
            retain_forever(device_buf);
            retain_forever(host_buf);
        })
    }

    /// Issues one copy without waiting for it.
    ///
    /// # Safety
    /// Both buffers must stay alive, and the host range must not be read
    /// (download) or changed (upload) by anyone else, until
    /// [`synchronize`](Self::synchronize) has returned `Ok`; if it fails,
    /// the buffers must never be freed.
    pub(crate) unsafe fn enqueue(
        &self,
        dir: Direction,
        device_buf: &CudaBuffer,
        device_offset: usize,
        host_buf: &PinnedBuffer,
        host_offset: usize,
        len: usize,
    ) -> Result<(), CopyError> {
        if device_buf.device().index() != self.device.index() {
            return Err(CopyError::WrongDevice {
                buffer_device: device_buf.device().index(),
                stream_device: self.device.index(),
            });
        }
        device_buf.check(device_offset, len)?;
        host_buf.check(host_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.device.bind()?;
        let dptr = device_buf.device_ptr() + device_offset as u64;
        // SAFETY: in bounds (checked above), so host_offset <= len of the allocation.
        let hptr = unsafe { host_buf.as_ptr().add(host_offset) };
        let stream = self.stream.cu_stream();
        let (call, status) = match dir {
            // SAFETY: both ranges are in bounds and alive until the caller
            // synchronizes (this function's contract); the host range is
            // pinned, so the copy is truly asynchronous.
            Direction::DeviceToHost => ("cuMemcpyDtoHAsync_v2", unsafe {
                sys::cuMemcpyDtoHAsync_v2(hptr.cast(), dptr, len, stream)
            }),
            // SAFETY: as above.
            Direction::HostToDevice => ("cuMemcpyHtoDAsync_v2", unsafe {
                sys::cuMemcpyHtoDAsync_v2(dptr, hptr.cast_const().cast(), len, stream)
            }),
        };
        check(call, status).map_err(|source| self.call_error(source))
    }

    /// Waits for every copy issued on the stream. An error means the copies
    /// may not have drained ([`CopyError::NotDrained`]).
    pub(crate) fn synchronize(&self) -> Result<(), CopyError> {
        let index = self.device.index();
        let not_drained = |source| CopyError::NotDrained { index, source };
        self.device.bind().map_err(|e| match e {
            DeviceError::Call { source, .. } => not_drained(source),
            other => CopyError::Device(other),
        })?;
        // SAFETY: the stream belongs to the current context and is alive
        // (held by `self.stream`).
        let status = unsafe { sys::cuStreamSynchronize(self.stream.cu_stream()) };
        check("cuStreamSynchronize", status).map_err(not_drained)
    }

    fn call_error(&self, source: CuError) -> CopyError {
        CopyError::Call {
            index: self.device.index(),
            source,
        }
    }
}

/// Keeps `buf` alive for the rest of the process: the answer to a copy
/// that may still be running (the `Unquiesced` rule: never free memory DMA
/// may still reach).
pub(crate) fn retain_forever<T: ?Sized>(buf: &Arc<T>) {
    std::mem::forget(Arc::clone(buf));
}
