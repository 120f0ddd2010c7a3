//! Requests, outcomes and errors of the cuda-staging path.

use std::fmt;
use std::ops::Range;

use orbitte_cuda::{CopyError, PipelineError};
use orbitte_memory::MemoryError;

use crate::error::RegisterError;
use crate::outcome::{FailureInfo, RemoteEffect, RequestId, Status, SubmitError};
use crate::transport::{Op, PathKind, PeerId, RangeId};

/// A CUDA buffer registered for the cuda-staging path (never published to
/// peers: GPU memory is only ever the *local* side of a staged request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CudaRegistrationId(pub u64);

/// What [`CudaStaging::register_cuda`](super::CudaStaging::register_cuda)
/// returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaRegistration {
    /// Handle for staged requests.
    pub id: CudaRegistrationId,
    /// The CUDA device index of the buffer.
    pub device: usize,
    /// Bytes.
    pub len: u64,
}

/// One staged READ or WRITE: the local side is GPU memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedRequest {
    /// READ (remote → GPU) or WRITE (GPU → remote).
    pub op: Op,
    /// The GPU buffer.
    pub registration: CudaRegistrationId,
    /// Offset in the GPU buffer.
    pub gpu_offset: u64,
    /// The peer.
    pub peer: PeerId,
    /// The peer's published range.
    pub range: RangeId,
    /// Offset in it.
    pub remote_offset: u64,
    /// Bytes.
    pub len: u64,
    /// Caller's label, echoed in the outcome (and on every chunk request).
    pub label: u64,
}

impl StagedRequest {
    /// A WRITE of `len` bytes of GPU memory at `gpu_offset` to the peer's
    /// `range` at `remote_offset`.
    pub fn write(
        local: CudaRegistrationId,
        gpu_offset: u64,
        peer: PeerId,
        range: RangeId,
        remote_offset: u64,
        len: u64,
    ) -> Self {
        Self {
            op: Op::Write,
            registration: local,
            gpu_offset,
            peer,
            range,
            remote_offset,
            len,
            label: 0,
        }
    }

    /// A READ of `len` bytes of the peer's `range` at `remote_offset` into
    /// GPU memory at `gpu_offset`.
    pub fn read(
        local: CudaRegistrationId,
        gpu_offset: u64,
        peer: PeerId,
        range: RangeId,
        remote_offset: u64,
        len: u64,
    ) -> Self {
        Self {
            op: Op::Read,
            ..Self::write(local, gpu_offset, peer, range, remote_offset, len)
        }
    }

    /// Same request with a label.
    pub fn label(mut self, label: u64) -> Self {
        self.label = label;
        self
    }
}

/// Whether a staged request still holds its local resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StagingDrain {
    /// Both copy streams of the pipeline are idle and no network request is
    /// outstanding on its bounce buffers: the GPU range is the caller's
    /// again and the bounce buffers went back to the pool.
    Drained,
    /// Something may still touch the bounce buffers (and, for a copy that
    /// did not drain, the GPU range): the pipeline is fenced and its
    /// buffers stay retained.
    Pending {
        /// Whether the pipeline's copy streams drained. When false the
        /// pipeline is unquiesced for good (the device buffer and bounce
        /// buffers are retained for the life of the process).
        copies_drained: bool,
        /// Chunk requests of the engine still undrained on a bounce
        /// buffer; the pipeline returns to the pool once they drain (see
        /// [`CudaStaging::wait_drain`](super::CudaStaging::wait_drain)).
        network: Vec<RequestId>,
    },
}

impl StagingDrain {
    /// Whether nothing is outstanding.
    pub fn is_drained(&self) -> bool {
        matches!(self, Self::Drained)
    }
}

/// Where and why a staged request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StagedFailure {
    /// The engine request of one chunk did not complete (or did not drain).
    Network {
        /// Chunk index.
        chunk: u32,
        /// Request-relative offset of the chunk.
        offset: u64,
        /// The chunk's engine request.
        request: RequestId,
        /// How that request ended.
        status: Status,
        /// Its failure information (slice, rail, NIC, status), when a
        /// slice failed. `slice` counts within the chunk; `offset` is
        /// relative to the staged request.
        info: Option<FailureInfo>,
        /// Whether that request drained (false: its bounce buffer is held
        /// and the pipeline is fenced).
        drained: bool,
    },
    /// The engine refused the chunk's request (fenced engine, no usable
    /// rail, ...); nothing of that chunk was posted.
    Refused {
        /// Chunk index.
        chunk: u32,
        /// Request-relative offset of the chunk.
        offset: u64,
        /// The engine's refusal.
        error: SubmitError,
    },
    /// The chunk could not be handled (it sat in a bounce buffer this lane
    /// did not register, or the chunk request's outcome was lost); whether
    /// it was posted is unknown, so its bytes count as uncertain.
    Internal {
        /// Chunk index.
        chunk: u32,
        /// Request-relative offset of the chunk.
        offset: u64,
        /// What happened.
        reason: String,
    },
    /// A device copy failed (or could not be waited for).
    Copy {
        /// What the driver said.
        error: CopyError,
    },
    /// The pipeline was unquiesced by an earlier request.
    Unquiesced {
        /// The original cause.
        error: CopyError,
    },
}

impl fmt::Display for StagedFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Network {
                chunk,
                offset,
                request,
                status,
                info,
                drained,
            } => {
                write!(f, "chunk {chunk} (offset {offset}), {request}: {status:?}")?;
                if let Some(i) = info {
                    write!(f, ", {i}")?;
                }
                if !drained {
                    f.write_str(", not drained")?;
                }
                Ok(())
            }
            Self::Refused {
                chunk,
                offset,
                error,
            } => write!(f, "chunk {chunk} (offset {offset}) refused: {error}"),
            Self::Internal {
                chunk,
                offset,
                reason,
            } => write!(f, "chunk {chunk} (offset {offset}): {reason}"),
            Self::Copy { error } => write!(f, "device copy failed: {error}"),
            Self::Unquiesced { error } => write!(f, "staging pipeline unquiesced: {error}"),
        }
    }
}

/// The end of one staged request: the engine's outcome contract, end to
/// end (device copy included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedOutcome {
    /// Caller's label.
    pub label: u64,
    /// READ or WRITE.
    pub op: Op,
    /// Requested bytes.
    pub len: u64,
    /// How it ended.
    pub status: Status,
    /// Leading bytes known done end to end: for a WRITE, in remote memory
    /// (copied off the GPU, then written by the engine); for a READ, landed
    /// in GPU memory (read by the engine, then copied to the device).
    pub completed_prefix: u64,
    /// Bytes per chunk.
    pub chunk_size: u64,
    /// Chunks the request was cut into.
    pub chunks: u32,
    /// Leading chunks fully done end to end.
    pub completed_chunks: u32,
    /// The failure, when the request did not complete.
    pub failure: Option<StagedFailure>,
    /// Request-relative bytes of the destination (remote for a WRITE, GPU
    /// for a READ) beyond the completed prefix that may have changed.
    pub uncertain: Range<u64>,
    /// What a WRITE may have done remotely (always `None` for a READ).
    pub remote_effect: RemoteEffect,
    /// Local drain status.
    pub drain: StagingDrain,
    /// Which pipeline of the pool ran it.
    pub lane: usize,
}

impl StagedOutcome {
    /// Whether every byte arrived.
    pub fn is_complete(&self) -> bool {
        self.status == Status::Complete
    }
}

/// Why a [`CudaStaging`](super::CudaStaging) could not be made. Nothing is
/// left registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StagingSetupError {
    /// Depth or chunk size zero.
    #[error(
        "cuda-staging needs at least one pipeline and a chunk of at least one byte (asked depth \
         {depth}, chunk {chunk}); the default chunk is 4 MiB"
    )]
    Zero {
        /// Pipelines asked for.
        depth: usize,
        /// Chunk size asked for.
        chunk: usize,
    },
    /// A staging pipeline (streams, pinned bounce buffers) could not be made.
    #[error("cuda-staging pipeline {lane} on CUDA device {device}: {source}")]
    Pipeline {
        /// Pipeline index.
        lane: usize,
        /// CUDA device index.
        device: usize,
        /// Why.
        #[source]
        source: PipelineError,
    },
    /// The engine's view of a pinned bounce buffer
    /// (`HostMemory::from_dma_buffer`) could not be made.
    #[error("host view of bounce buffer {slot} of cuda-staging pipeline {lane}: {source}")]
    View {
        /// Pipeline index.
        lane: usize,
        /// Bounce buffer (0 or 1).
        slot: usize,
        /// Why.
        #[source]
        source: MemoryError,
    },
    /// Registering a bounce buffer with the engine failed. A registration
    /// error never switches silently to another path.
    #[error(
        "registering bounce buffer {slot} of cuda-staging pipeline {lane} ({bytes} bytes) with \
         the engine failed: {source}"
    )]
    Register {
        /// Pipeline index.
        lane: usize,
        /// Bounce buffer (0 or 1).
        slot: usize,
        /// Its size.
        bytes: usize,
        /// The engine's error.
        #[source]
        source: RegisterError,
    },
}

/// Why a CUDA buffer could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaRegisterError {
    /// Direct registration of GPU memory with NICs does not exist.
    #[error(
        "{path}: not implemented: registering GPU memory directly with RDMA NICs needs \
         peer-memory or dma-buf support and hardware qualification; register the buffer for \
         cuda-staging with CudaStaging::register_cuda instead"
    )]
    NotImplemented {
        /// The path asked for (`gpudirect-rdma`).
        path: PathKind,
    },
    /// The buffer lives on another device than the staging pipelines.
    #[error(
        "the buffer is on CUDA device {buffer_device} but this cuda-staging pool copies on device \
         {staging_device}; make a CudaStaging on device {buffer_device}"
    )]
    WrongDevice {
        /// The buffer's device.
        buffer_device: usize,
        /// The pool's device.
        staging_device: usize,
    },
    /// Not a live CUDA registration of this pool.
    #[error("unknown cuda-staging registration {0:?}: register the buffer first")]
    Unknown(CudaRegistrationId),
}

/// Why a staged request was refused before anything moved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StagedSubmitError {
    /// Not a live CUDA registration of this pool.
    #[error("unknown cuda-staging registration {0:?}: register the buffer first")]
    UnknownRegistration(CudaRegistrationId),
    /// Zero bytes asked for.
    #[error("zero-length staged request: ask for at least one byte")]
    ZeroLength,
    /// `offset + len` overflows.
    #[error("staged request length overflows (offset {offset} + {len}): split it")]
    Overflow {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
    },
    /// `offset + len` goes past the end of a range.
    #[error("{side} range: offset {offset} + {len} bytes is past its end ({size} bytes)")]
    OutOfRange {
        /// `gpu` or `remote`.
        side: &'static str,
        /// Offset asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// Range size.
        size: u64,
    },
    /// The peer is not open in the engine.
    #[error("unknown peer {0}: open the peer first (or reopen it after a restart)")]
    UnknownPeer(u32),
    /// The peer never published this range, or retired it.
    #[error("remote range {range} of peer {peer} is not published: refresh the peer's descriptors")]
    UnpublishedRemote {
        /// Peer.
        peer: u32,
        /// Range id.
        range: u64,
    },
    /// The remote range does not allow the operation.
    #[error("remote range {range} of peer {peer} does not allow {op}")]
    WrongAccess {
        /// Peer.
        peer: u32,
        /// Range id.
        range: u64,
        /// The operation.
        op: Op,
    },
    /// The engine refused the first chunk; nothing was posted.
    #[error("the engine refused the staged request: {0}")]
    Refused(SubmitError),
    /// Every pipeline of the pool is fenced (a copy or a network request
    /// did not drain).
    #[error(
        "every cuda-staging pipeline is fenced ({reasons}); wait for drain with \
         CudaStaging::wait_drain, or make a new CudaStaging"
    )]
    Fenced {
        /// Why, per pipeline.
        reasons: String,
    },
}
