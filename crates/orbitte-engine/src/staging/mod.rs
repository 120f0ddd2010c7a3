//! The cuda-staging path: READ and WRITE whose local side is GPU memory.
//!
//! CUDA device memory registers through the same call as host memory,
//! `engine.register(gpu_buffer, Access::LocalOnly)`, and the
//! [`Registration`](crate::Registration) says
//! [`MemoryPath::CudaStaging`](crate::MemoryPath::CudaStaging). Requests on
//! it are built with the same [`Request`](crate::Request) builders, go
//! through the same `submit`, `poll`, `wait`, `wait_drain` and `cancel`,
//! and end in the same [`Outcome`](crate::Outcome). `submit` returns at
//! once: the request runs on a *staging lane*.
//!
//! GPU memory is never registered with NICs (that would be
//! `gpudirect-rdma`, which is not implemented: a CUDA registration with
//! remote access is refused with
//! [`RegisterError::NotImplemented`](crate::RegisterError::NotImplemented)).
//! Instead the GPU's copy engines move bytes between device memory and
//! pinned host *bounce buffers*, and the engine moves the bounce buffers
//! over the peer's path (rdma, tcp or local) like any host range.
//!
//! # Lanes
//! The first CUDA registration on a device makes that device's lanes
//! ([`StagingConfig`]: `depth` lanes of two pinned bounce buffers of
//! `chunk` bytes and two copy streams each). Each bounce buffer is
//! registered with the engine once, local-only: Host Direct (MRs on every
//! usable NIC context, charged like any range), or without MRs when the
//! engine was built with
//! [`host_memory_without_rdma`](crate::EngineBuilder::host_memory_without_rdma).
//! A Host Direct failure refuses the CUDA registration; it never switches
//! to the other form. Every lane runs on its own thread and takes one
//! request at a time from the device's queue; unregistering the last CUDA
//! registration of the device stops its lanes and unregisters their bounce
//! buffers.
//!
//! - **WRITE** (GPU → remote): the device copies of chunks 0 and 1 are
//!   issued; for each chunk k, once its copy is synchronized, its bounce
//!   buffer is sent with one engine WRITE (sliced and striped over rails
//!   like any request) and waited for, while the device copy of chunk
//!   k + 1 runs into the other bounce buffer.
//! - **READ** (remote → GPU): for each chunk k, one engine READ fills a
//!   bounce buffer while the device copy of chunk k − 1 runs from the
//!   other; the request ends when the last copy has landed.
//!
//! # Outcome contract
//! The [`Outcome`](crate::Outcome) of a cuda-staging request counts
//! *chunks* as its slices, and holds end to end:
//! - the **completed prefix** counts bytes known done including the device
//!   copy: for a WRITE, copied off the GPU and written remotely (the failed
//!   chunk's own completed prefix included); for a READ, landed in GPU
//!   memory;
//! - **failure information** names the chunk
//!   ([`ChunkFailure`](crate::ChunkFailure)) and either the chunk
//!   request's failure (slice, rail, NIC, status) or the device copy's
//!   CUDA error ([`SliceFailure::DeviceCopy`](crate::transport::SliceFailure::DeviceCopy),
//!   no rail, path `cuda-staging`);
//! - the **remote effect** of a WRITE: `None` when nothing was posted,
//!   `Possible` with the uncertain bytes otherwise, `Complete`;
//! - **drain**: the lane's copies drained *and* no chunk request is
//!   outstanding on its bounce buffers. A chunk request that did not drain
//!   keeps its bounce buffer: the lane takes no request until it drains. A
//!   copy that cannot be drained leaves the lane unquiesced for good: the
//!   bounce buffers and the device buffer stay retained, the lane never
//!   runs again, and the request never reports drained.
//!
//! Before a chunk's bounce buffer is reused, the chunk's engine request has
//! drained: a logical timeout never lets a NIC and the copy engine share a
//! bounce buffer. Cancellation is logical as for every request: the
//! chunk request in flight is cancelled at once and no further chunk
//! starts; the outcome (`Cancelled`) comes when the lane has stopped.
//!
//! # Bounce buffers and the NIC
//! The engine registers `Arc<HostMemory>`; each pinned bounce buffer is
//! wrapped as one with `HostMemory::from_dma_buffer` (which keeps the pinned
//! buffer alive), so the NIC reads and writes the bounce buffer itself: no
//! host memcpy between the device copy and the network.

mod capability;
mod finish;
pub(crate) mod lanes;
pub(crate) mod pools;
mod run;
pub(crate) mod table;

use std::time::Duration;

pub use crate::error::StagingSetupError;
pub use capability::{
    CudaCapability, LOOPBACK_BYTES, LOOPBACK_CHUNK, LoopbackTarget, contribute_cuda_rows,
    cuda_rows, evaluate_cuda_staging,
};
pub use orbitte_cuda::{COMPUTE_PROBE_CAVEAT, CudaBuffer, DEFAULT_CHUNK_SIZE};
pub use pools::{LaneCounts, StagingStatus};

pub(crate) use pools::Pools;
pub(crate) use table::Staged;

/// How long a chunk's outcome is waited for before the chunk is cancelled
/// (a backstop: the engine's own request timeout normally ends it first).
pub const DEFAULT_CHUNK_WAIT: Duration = Duration::from_secs(60);
/// How long a failed chunk's engine request is given to drain before its
/// lane is fenced.
pub const DEFAULT_DRAIN_WAIT: Duration = Duration::from_secs(5);
/// Lanes per CUDA device when none is given.
pub const DEFAULT_DEPTH: usize = 2;

/// The staging lanes the engine makes on each CUDA device
/// ([`EngineBuilder::cuda_staging`](crate::EngineBuilder::cuda_staging)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingConfig {
    /// Bytes per chunk (and per bounce buffer).
    pub chunk: usize,
    /// Lanes per device: requests that run at the same time.
    pub depth: usize,
    /// How long a chunk's outcome is waited for before the chunk is
    /// cancelled.
    pub chunk_wait: Duration,
    /// How long a failed chunk's request is given to drain before its lane
    /// is fenced (it returns once the request drains).
    pub drain_wait: Duration,
}

impl Default for StagingConfig {
    fn default() -> Self {
        Self {
            chunk: DEFAULT_CHUNK_SIZE,
            depth: DEFAULT_DEPTH,
            chunk_wait: DEFAULT_CHUNK_WAIT,
            drain_wait: DEFAULT_DRAIN_WAIT,
        }
    }
}
