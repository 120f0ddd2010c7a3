//! The cuda-staging path: READ and WRITE whose local side is GPU memory.
//!
//! GPU memory is never registered with NICs here (that would be
//! `gpudirect-rdma`, which is not implemented:
//! [`CudaStaging::register_direct`] says so with a typed error). Instead the
//! GPU's copy engines move bytes between device memory and pinned host
//! *bounce buffers*, and the engine moves the bounce buffers over the
//! network like any Host Direct range.
//!
//! # Shape
//! A [`CudaStaging`] is a pool of `depth` lanes on one CUDA device. A lane
//! is one [`StagingPipeline`] (two pinned bounce buffers of `chunk` bytes,
//! two copy streams) whose bounce buffers are registered with the engine
//! once, as local-only Host Direct registrations, when the pool is made.
//! Each staged request takes a lane for its whole length (one request per
//! lane at a time; `depth` requests run concurrently from as many threads).
//!
//! - **WRITE** (GPU → remote): the pipeline's download issues the device
//!   copies of chunks 0 and 1; for each chunk k, once its copy is
//!   synchronized, the chunk's bounce buffer is sent with one engine WRITE
//!   (sliced and striped over rails like any request) and waited for,
//!   while the device copy of chunk k + 1 runs into the other bounce
//!   buffer.
//! - **READ** (remote → GPU): for each chunk k, one engine READ fills a
//!   bounce buffer while the device copy of chunk k − 1 runs from the
//!   other; the request ends when the last copy has landed.
//!
//! So the device copy of one chunk overlaps the network transfer of the
//! next (or previous), with one chunk on the wire per lane.
//!
//! # Outcome contract
//! A [`StagedOutcome`] has the engine's fields, end to end:
//! - the **completed prefix** counts bytes known done including the device
//!   copy: for a WRITE, copied off the GPU and written remotely (the failed
//!   chunk's own engine prefix included); for a READ, landed in GPU memory;
//! - **failure information**: the chunk, its engine request, status and
//!   [`FailureInfo`](crate::FailureInfo) (slice, rail, NIC), or the device
//!   copy error;
//! - the **remote effect** of a WRITE: `None` when nothing was posted,
//!   `Possible` with the uncertain bytes otherwise, `Complete`;
//! - **drain**: the pipeline's streams idle *and* no engine request
//!   outstanding on its bounce buffers. A chunk request that does not drain
//!   keeps its bounce buffer: the lane is fenced until
//!   [`CudaStaging::wait_drain`] sees it drained. A copy that cannot be
//!   drained leaves the lane unquiesced for good: the bounce buffers and
//!   the device buffer stay retained and the lane never runs again.
//!
//! Before a chunk's bounce buffer is reused, the chunk's engine request has
//! drained: a logical timeout never lets a NIC and the copy engine share a
//! bounce buffer.
//!
//! # Bounce buffers and the NIC
//! The engine registers `Arc<HostMemory>`; each pinned bounce buffer is
//! wrapped as one with `HostMemory::from_dma_buffer` (which keeps the pinned
//! buffer alive), so the NIC reads and writes the bounce buffer itself: no
//! host memcpy between the device copy and the network.

mod capability;
mod finish;
mod lanes;
mod outcome;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use orbitte_cuda::{CudaDevice, StagedChunk, StagingPipeline};
use orbitte_memory::{DmaBuffer, HostMemory};
use orbitte_topology::{MemoryLocation, PciAddress};
use orbitte_wire as wire;

use crate::engine::{TransferEngine, TransferRequest};
use crate::error::WaitError;
use crate::outcome::{DrainStatus, Outcome, RequestId};
use crate::registration::{Access, Registration};
use crate::transport::{Op, PathKind};

pub use capability::{
    CudaCapability, LOOPBACK_BYTES, LOOPBACK_CHUNK, LoopbackTarget, contribute_cuda_rows,
    cuda_rows, evaluate_cuda_staging,
};
pub use lanes::LaneCounts;
pub use orbitte_cuda::{COMPUTE_PROBE_CAVEAT, CudaBuffer, DEFAULT_CHUNK_SIZE};
pub use outcome::{
    CudaRegisterError, CudaRegistration, CudaRegistrationId, StagedFailure, StagedOutcome,
    StagedRequest, StagedSubmitError, StagingDrain, StagingSetupError,
};

use finish::{ChunkError, Net};
use lanes::{Bounce, Lane, Pool};

/// How long a chunk's outcome is waited for before the chunk is cancelled
/// (a backstop: the engine's own request timeout normally ends it first).
pub const DEFAULT_CHUNK_WAIT: Duration = Duration::from_secs(60);
/// How long a failed chunk's engine request is given to drain before its
/// lane is fenced.
pub const DEFAULT_DRAIN_WAIT: Duration = Duration::from_secs(5);

/// The cuda-staging path of one engine on one CUDA device (see the module
/// docs).
pub struct CudaStaging<'e> {
    engine: &'e TransferEngine,
    device: CudaDevice,
    chunk: usize,
    depth: usize,
    chunk_wait: Duration,
    drain_wait: Duration,
    pool: Mutex<Pool>,
    cond: Condvar,
    regs: Mutex<HashMap<u64, Arc<CudaBuffer>>>,
    next_reg: AtomicU64,
}

impl std::fmt::Debug for CudaStaging<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaStaging")
            .field("device", &self.device.index())
            .field("chunk", &self.chunk)
            .field("depth", &self.depth)
            .finish_non_exhaustive()
    }
}

/// How the bounce buffers are registered with the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BounceRegistration {
    /// Host Direct: MRs on every NIC context (rdma rails).
    HostDirect,
    /// No MR: tcp and local rails only.
    WithoutRdma,
}

/// Where the bounce buffers sit for NIC ranking: near the GPU.
fn location(device: &CudaDevice) -> MemoryLocation {
    device
        .info()
        .ok()
        .and_then(|i| i.pci_bus_id.parse::<PciAddress>().ok())
        .map_or(
            MemoryLocation::Host { numa_node: None },
            MemoryLocation::GpuAt,
        )
}

impl<'e> CudaStaging<'e> {
    /// Makes `depth` staging pipelines on `device` with two pinned bounce
    /// buffers of `chunk` bytes each, and registers every bounce buffer with
    /// `engine` once (local-only Host Direct registrations, ranked for NICs
    /// near the GPU). On error everything registered so far is unregistered.
    pub fn new(
        engine: &'e TransferEngine,
        device: &CudaDevice,
        chunk: usize,
        depth: usize,
    ) -> Result<Self, StagingSetupError> {
        Self::setup(engine, device, chunk, depth, BounceRegistration::HostDirect)
    }

    /// Like [`new`](Self::new), but for an engine whose peers are reached
    /// over tcp or local rails only: the bounce buffers are registered with
    /// [`TransferEngine::register_host_without_rdma`] (no MR, nothing
    /// charged), so requests on them can use no rdma rail. An explicit
    /// choice: [`new`](Self::new) never falls back to it.
    pub fn new_without_rdma(
        engine: &'e TransferEngine,
        device: &CudaDevice,
        chunk: usize,
        depth: usize,
    ) -> Result<Self, StagingSetupError> {
        Self::setup(
            engine,
            device,
            chunk,
            depth,
            BounceRegistration::WithoutRdma,
        )
    }

    fn setup(
        engine: &'e TransferEngine,
        device: &CudaDevice,
        chunk: usize,
        depth: usize,
        how: BounceRegistration,
    ) -> Result<Self, StagingSetupError> {
        if depth == 0 || chunk == 0 {
            return Err(StagingSetupError::Zero { depth, chunk });
        }
        let at = location(device);
        let mut lanes: Vec<Lane> = Vec::with_capacity(depth);
        let undo = |lanes: &[Lane]| {
            for b in lanes.iter().flat_map(|l| &l.bounces) {
                if let Err(e) = engine.unregister(b.registration) {
                    tracing::warn!(error = %e, "unregistering a bounce buffer during setup cleanup failed");
                }
            }
        };
        for index in 0..depth {
            let pipeline = match StagingPipeline::new(device, chunk) {
                Ok(p) => p,
                Err(source) => {
                    undo(&lanes);
                    return Err(StagingSetupError::Pipeline {
                        lane: index,
                        device: device.index(),
                        source,
                    });
                }
            };
            let mut lane = Lane {
                index,
                pipeline,
                bounces: Vec::with_capacity(2),
            };
            for (slot, pinned) in lane.pipeline.bounce_buffers().into_iter().enumerate() {
                // The engine's view of the pinned buffer itself: the NIC
                // reads and writes the bounce buffer directly.
                let view = pinned.clone() as Arc<dyn DmaBuffer>;
                let host = match HostMemory::from_dma_buffer(view) {
                    Ok(h) => h,
                    Err(source) => {
                        lanes.push(lane);
                        undo(&lanes);
                        return Err(StagingSetupError::View {
                            lane: index,
                            slot,
                            source,
                        });
                    }
                };
                let registered = match how {
                    BounceRegistration::HostDirect => {
                        engine.register_host_at(host, Access::LocalOnly, at)
                    }
                    BounceRegistration::WithoutRdma => {
                        engine.register_host_without_rdma(host, Access::LocalOnly)
                    }
                };
                match registered {
                    Ok(Registration { id, .. }) => lane.bounces.push(Bounce {
                        pinned,
                        registration: id,
                    }),
                    Err(source) => {
                        lanes.push(lane);
                        undo(&lanes);
                        return Err(StagingSetupError::Register {
                            lane: index,
                            slot,
                            bytes: chunk,
                            source,
                        });
                    }
                }
            }
            lanes.push(lane);
        }
        tracing::debug!(
            device = device.index(),
            chunk,
            depth,
            ?how,
            "cuda-staging pool ready"
        );
        lanes.reverse(); // pop() hands out lane 0 first
        Ok(Self {
            engine,
            device: device.clone(),
            chunk,
            depth,
            chunk_wait: DEFAULT_CHUNK_WAIT,
            drain_wait: DEFAULT_DRAIN_WAIT,
            pool: Mutex::new(Pool {
                idle: lanes,
                busy: 0,
                fenced: Vec::new(),
            }),
            cond: Condvar::new(),
            regs: Mutex::new(HashMap::new()),
            next_reg: AtomicU64::new(1),
        })
    }

    /// Sets how long a chunk's outcome is waited for before the chunk is
    /// cancelled ([`DEFAULT_CHUNK_WAIT`]) and how long a failed chunk's
    /// request is given to drain before its lane is fenced
    /// ([`DEFAULT_DRAIN_WAIT`]).
    pub fn with_waits(mut self, chunk_wait: Duration, drain_wait: Duration) -> Self {
        self.chunk_wait = chunk_wait;
        self.drain_wait = drain_wait;
        self
    }

    /// The CUDA device.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Bytes per chunk.
    pub fn chunk_size(&self) -> usize {
        self.chunk
    }

    /// Registers a CUDA buffer of this pool's device for staged requests.
    /// Nothing is registered with NICs and nothing is published: GPU memory
    /// is only ever the local side of a staged request.
    pub fn register_cuda(
        &self,
        buffer: Arc<CudaBuffer>,
    ) -> Result<CudaRegistration, CudaRegisterError> {
        if buffer.device().index() != self.device.index() {
            return Err(CudaRegisterError::WrongDevice {
                buffer_device: buffer.device().index(),
                staging_device: self.device.index(),
            });
        }
        let id = CudaRegistrationId(self.next_reg.fetch_add(1, Ordering::Relaxed));
        let len = buffer.len() as u64;
        self.regs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.0, buffer);
        Ok(CudaRegistration {
            id,
            device: self.device.index(),
            len,
        })
    }

    /// Forgets a CUDA registration and returns its buffer. Requests running
    /// on it keep their own reference until they end.
    pub fn unregister_cuda(
        &self,
        id: CudaRegistrationId,
    ) -> Result<Arc<CudaBuffer>, CudaRegisterError> {
        self.regs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id.0)
            .ok_or(CudaRegisterError::Unknown(id))
    }

    /// Direct registration of GPU memory with the NICs (GPUDirect RDMA):
    /// not implemented, always
    /// [`CudaRegisterError::NotImplemented`] naming `gpudirect-rdma`. Use
    /// [`register_cuda`](Self::register_cuda) (staging) instead; nothing
    /// falls back silently.
    pub fn register_direct(
        &self,
        buffer: Arc<CudaBuffer>,
        access: Access,
    ) -> Result<Registration, CudaRegisterError> {
        tracing::debug!(
            len = buffer.len(),
            ?access,
            "gpudirect-rdma registration refused"
        );
        Err(CudaRegisterError::NotImplemented {
            path: PathKind::GpudirectRdma,
        })
    }

    /// Runs one staged READ or WRITE on the caller's thread and returns its
    /// outcome. Blocks while every lane is busy. Refused (`Err`) only when
    /// nothing was posted.
    pub fn run(&self, req: &StagedRequest) -> Result<StagedOutcome, StagedSubmitError> {
        let buffer = self.validate(req)?;
        let mut lane = self.acquire()?;
        let span = tracing::debug_span!(
            "cuda_staging",
            op = %req.op,
            lane = lane.index,
            len = req.len,
            label = req.label
        );
        let _entered = span.enter();
        let mut net = Net::default();
        // Validated: both fit usize (the GPU range lies in an allocation).
        let (offset, len) = (req.gpu_offset as usize, req.len as usize);
        let Lane {
            pipeline, bounces, ..
        } = &mut lane;
        let result = match req.op {
            Op::Write => pipeline.download(&buffer, offset, len, |c| {
                self.chunk(req, bounces, c, &mut net)
            }),
            Op::Read => pipeline.upload(&buffer, offset, len, |c| {
                self.chunk(req, bounces, c, &mut net)
            }),
        };
        let outcome = self.outcome(req, lane.index, result, net);
        if let Some(StagedFailure::Refused {
            chunk: 0, error, ..
        }) = &outcome.failure
            && outcome.drain.is_drained()
        {
            let error = error.clone();
            self.release(lane, &outcome.drain, "");
            return Err(StagedSubmitError::Refused(error));
        }
        let reason = outcome
            .failure
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        self.release(lane, &outcome.drain, &reason);
        tracing::debug!(status = ?outcome.status, prefix = outcome.completed_prefix, "staged request finished");
        Ok(outcome)
    }

    /// Checks the request against the registration and the peer's
    /// published ranges.
    fn validate(&self, req: &StagedRequest) -> Result<Arc<CudaBuffer>, StagedSubmitError> {
        let buffer = self
            .regs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&req.registration.0)
            .cloned()
            .ok_or(StagedSubmitError::UnknownRegistration(req.registration))?;
        if req.len == 0 {
            return Err(StagedSubmitError::ZeroLength);
        }
        let end = |offset: u64| {
            offset
                .checked_add(req.len)
                .ok_or(StagedSubmitError::Overflow {
                    offset,
                    len: req.len,
                })
        };
        let size = buffer.len() as u64;
        if end(req.gpu_offset)? > size {
            return Err(StagedSubmitError::OutOfRange {
                side: "gpu",
                offset: req.gpu_offset,
                len: req.len,
                size,
            });
        }
        let rend = end(req.remote_offset)?;
        let peer = self
            .engine
            .peers()
            .into_iter()
            .find(|p| p.id == req.peer)
            .ok_or(StagedSubmitError::UnknownPeer(req.peer.0))?;
        let &crate::RemoteRange {
            len: rsize, access, ..
        } = peer.ranges.iter().find(|r| r.range == req.range).ok_or(
            StagedSubmitError::UnpublishedRemote {
                peer: req.peer.0,
                range: req.range.0,
            },
        )?;
        if rend > rsize {
            return Err(StagedSubmitError::OutOfRange {
                side: "remote",
                offset: req.remote_offset,
                len: req.len,
                size: rsize,
            });
        }
        let need = match req.op {
            Op::Read => wire::AccessFlags::REMOTE_READ,
            Op::Write => wire::AccessFlags::REMOTE_WRITE,
        };
        if !access.contains(need) {
            return Err(StagedSubmitError::WrongAccess {
                peer: req.peer.0,
                range: req.range.0,
                op: req.op,
            });
        }
        Ok(buffer)
    }

    /// One chunk: for a WRITE its bytes are in the bounce buffer (copy
    /// synchronized); for a READ the bounce buffer must hold them on return.
    fn chunk(
        &self,
        req: &StagedRequest,
        bounces: &[Bounce],
        c: &StagedChunk<'_>,
        net: &mut Net,
    ) -> Result<(), ChunkError> {
        let Some(b) = bounces.iter().find(|b| Arc::ptr_eq(&b.pinned, c.buffer())) else {
            return Err(ChunkError::Internal(
                "a staged chunk is in a buffer this lane did not register".into(),
            ));
        };
        let len = c.len() as u64;
        let at = c.buffer_offset() as u64;
        let remote_offset = req.remote_offset + c.offset() as u64;
        // The engine registered the pinned buffer itself: for a WRITE the
        // synchronized device copy is already where the NIC reads; for a
        // READ the NIC writes where the copy to the device reads.
        let tr = match req.op {
            Op::Write => {
                TransferRequest::write(b.registration, at, req.peer, req.range, remote_offset, len)
            }
            Op::Read => {
                TransferRequest::read(b.registration, at, req.peer, req.range, remote_offset, len)
            }
        };
        let o = self.transfer(tr.label(req.label), net)?;
        tracing::trace!(chunk = c.index(), request = %o.request, "chunk moved");
        Ok(())
    }

    /// Submits one chunk request and waits for its outcome and its drain.
    fn transfer(&self, tr: TransferRequest, net: &mut Net) -> Result<Outcome, ChunkError> {
        let id = match self.engine.submit(&[tr]).map(|ids| ids.first().copied()) {
            Ok(Some(id)) => id,
            Ok(None) => {
                return Err(ChunkError::Internal(
                    "the engine accepted the chunk request but returned no request id".into(),
                ));
            }
            Err(e) => return Err(ChunkError::Refused(e)),
        };
        let o = match self.engine.wait(id, self.chunk_wait) {
            Ok(o) => o,
            Err(WaitError::TimedOut(_)) => {
                self.engine.cancel(id);
                match self.engine.wait(id, Duration::from_secs(1)) {
                    Ok(o) => o,
                    Err(e) => return Err(self.lost(id, e, net)),
                }
            }
            Err(e) => return Err(self.lost(id, e, net)),
        };
        let drained =
            o.drain == DrainStatus::Drained || self.engine.wait_drain(id, self.drain_wait).is_ok();
        if !drained {
            net.undrained.push(id);
        }
        if o.is_complete() && drained {
            Ok(o)
        } else {
            Err(ChunkError::Network {
                outcome: Box::new(o),
                drained,
            })
        }
    }

    /// A request whose outcome cannot be had: treated as undrained.
    fn lost(&self, id: RequestId, e: WaitError, net: &mut Net) -> ChunkError {
        tracing::warn!(error = %e, "lost a chunk request's outcome");
        if self.engine.wait_drain(id, self.drain_wait).is_err() {
            net.undrained.push(id);
        }
        ChunkError::Internal(e.to_string())
    }
}
