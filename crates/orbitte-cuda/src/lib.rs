//! CUDA device allocation and synchronized host staging.
//!
//! OrbitTE moves GPU memory over the network by *staging*: bytes are copied
//! between device memory and pinned host bounce buffers by the GPU's copy
//! engines, and the network moves the host copies. This crate provides the
//! pieces; the engine drives them.
//!
//! - [`driver()`] finds `libcuda.so.1` at run time, without panicking when it
//!   is absent (cudarc panics if asked to load a missing library, so every
//!   entry point here checks first), and initializes it once.
//! - [`devices`] / [`CudaDevice`]: discovery (count, names, PCI bus IDs for
//!   NIC affinity, memory) and a handle on a device's primary context.
//! - [`CudaBuffer`]: device memory owned by an RAII handle, or a checked
//!   borrow of device memory someone else allocated.
//! - [`PinnedBuffer`]: page-locked host memory (`cuMemHostAlloc`), a
//!   [`DmaBuffer`](orbitte_memory::DmaBuffer), so NICs can register it.
//! - [`CopyStream`]: one synchronized device-to-host or host-to-device copy.
//! - [`StagingPipeline`]: chunked, double-buffered staging: the copy of the
//!   next chunk overlaps the caller's handling of the previous one.
//! - [`probe()`]: the capability matrix rows for the CUDA paths, as plain
//!   data.
//! - `testing` (feature `testing`, off by default): a fake `libcuda.so.1`
//!   and the harness that runs test entries against it, for this crate's
//!   and the engine's tests.
//!
//! # Scope
//! Allocation and synchronized host staging are real paths. Registering GPU
//! memory with NICs (GPUDirect RDMA), CUDA IPC and NVLink transfers are not
//! implemented and [`probe()`] reports them so. A small CUDA compute probe
//! succeeding proves nothing about any of these transport paths.
//!
//! # Without a driver
//! Nothing here links against CUDA. Without `libcuda.so.1` every operation
//! returns [`DriverError::NotFound`] ("no CUDA driver (libcuda.so.1 not
//! found)"); without a device, [`DeviceError::NoDevice`].
#![warn(missing_docs)]

mod buffer;
mod copy;
mod device;
pub mod driver;
mod error;
mod pinned;
mod pipeline;
pub mod probe;
#[cfg(feature = "testing")]
pub mod testing;

pub use buffer::{AllocError, CudaBuffer, MemoryKind, PointerError, PointerInfo};
pub use copy::{CopyError, CopyStream};
pub use device::{CudaDevice, DeviceError, DeviceInfo, MemoryInfo, devices};
pub use driver::{DriverError, DriverInfo, driver};
pub use error::{CuError, RangeError};
pub use pinned::{PinnedBuffer, PinnedError};
pub use pipeline::{
    DEFAULT_CHUNK_SIZE, PipelineError, StagedChunk, StagingError, StagingFailure, StagingPipeline,
    StagingReport,
};
pub use probe::{COMPUTE_PROBE_CAVEAT, Check, PathCapability, probe, probe_device};
