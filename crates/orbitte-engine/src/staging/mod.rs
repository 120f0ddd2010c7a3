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
//! The engine registers `Arc<HostMemory>`. Until orbitte-memory can wrap a
//! pinned [`DmaBuffer`](orbitte_memory::DmaBuffer) safely, each bounce
//! buffer has a same-sized `HostMemory` twin that the engine registers, and
//! one host memcpy per chunk moves bytes between the pinned buffer and its
//! twin (see `docs/cuda.md`).

mod capability;
mod outcome;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use orbitte_cuda::{
    CudaDevice, PinnedBuffer, StagedChunk, StagingError, StagingFailure, StagingPipeline,
};
use orbitte_memory::HostMemory;
use orbitte_topology::{MemoryLocation, PciAddress};
use orbitte_wire as wire;

use crate::engine::{TransferEngine, TransferRequest};
use crate::error::WaitError;
use crate::outcome::{DrainStatus, Outcome, RemoteEffect, RequestId, Status, SubmitError};
use crate::registration::{Access, Registration};
use crate::transport::{Op, PathKind, RegistrationId};

pub use capability::{
    CudaCapability, LOOPBACK_BYTES, LOOPBACK_CHUNK, LoopbackTarget, contribute_cuda_rows,
    cuda_rows, evaluate_cuda_staging,
};
pub use orbitte_cuda::{COMPUTE_PROBE_CAVEAT, CudaBuffer, DEFAULT_CHUNK_SIZE};
pub use outcome::{
    CudaRegisterError, CudaRegistration, CudaRegistrationId, StagedFailure, StagedOutcome,
    StagedRequest, StagedSubmitError, StagingDrain, StagingSetupError,
};

/// How long a chunk's outcome is waited for before the chunk is cancelled
/// (a backstop: the engine's own request timeout normally ends it first).
pub const DEFAULT_CHUNK_WAIT: Duration = Duration::from_secs(60);
/// How long a failed chunk's engine request is given to drain before its
/// lane is fenced.
pub const DEFAULT_DRAIN_WAIT: Duration = Duration::from_secs(5);

/// One bounce buffer and the engine registration the NIC uses for it.
#[derive(Debug)]
struct Bounce {
    pinned: Arc<PinnedBuffer>,
    /// What the engine registered: the pinned buffer's host twin.
    host: Arc<HostMemory>,
    registration: RegistrationId,
}

/// A pipeline with its registered bounce buffers.
#[derive(Debug)]
struct Lane {
    index: usize,
    pipeline: StagingPipeline,
    bounces: Vec<Bounce>,
}

/// A lane that may not run: a network request is undrained on one of its
/// bounce buffers, or a copy did not drain (unquiesced, forever).
#[derive(Debug)]
struct Fenced {
    lane: Lane,
    network: Vec<RequestId>,
    unquiesced: bool,
    reason: String,
}

#[derive(Debug, Default)]
struct Pool {
    idle: Vec<Lane>,
    busy: usize,
    fenced: Vec<Fenced>,
}

/// Counts of the pool's lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneCounts {
    /// Lanes in the pool.
    pub lanes: usize,
    /// Ready for a request.
    pub idle: usize,
    /// Running a request.
    pub busy: usize,
    /// Fenced until a chunk request drains.
    pub fenced_network: usize,
    /// Unquiesced for good (a copy did not drain).
    pub unquiesced: usize,
}

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

/// Where the bounce buffers sit for NIC ranking: near the GPU.
fn location(device: &CudaDevice) -> MemoryLocation {
    device
        .info()
        .ok()
        .and_then(|i| i.pci_bus_id.parse::<PciAddress>().ok())
        .map_or(MemoryLocation::Host { numa_node: None }, MemoryLocation::GpuAt)
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
                let host = match HostMemory::alloc(pinned.len()) {
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
                match engine.register_host_at(host.clone(), Access::LocalOnly, at) {
                    Ok(Registration { id, .. }) => lane.bounces.push(Bounce {
                        pinned,
                        host,
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
        tracing::debug!(device = device.index(), chunk, depth, "cuda-staging pool ready");
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

    /// The engine registrations of the bounce buffers (two per lane), for
    /// diagnostics (charges, topology).
    pub fn bounce_registrations(&self) -> Vec<RegistrationId> {
        let pool = self.lock_pool();
        pool.idle
            .iter()
            .chain(pool.fenced.iter().map(|f| &f.lane))
            .flat_map(|l| l.bounces.iter().map(|b| b.registration))
            .collect()
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
        tracing::debug!(len = buffer.len(), ?access, "gpudirect-rdma registration refused");
        Err(CudaRegisterError::NotImplemented {
            path: PathKind::GpudirectRdma,
        })
    }

    /// Counts of the pool's lanes (fenced lanes whose chunk requests have
    /// drained since are returned to the pool first).
    pub fn lanes(&self) -> LaneCounts {
        let mut pool = self.lock_pool();
        self.reclaim(&mut pool);
        LaneCounts {
            lanes: self.depth,
            idle: pool.idle.len(),
            busy: pool.busy,
            fenced_network: pool.fenced.iter().filter(|f| !f.unquiesced).count(),
            unquiesced: pool.fenced.iter().filter(|f| f.unquiesced).count(),
        }
    }

    /// The drain check of the pool: every idle lane's copy streams idle
    /// (`cuStreamQuery`), no lane fenced and none busy. Errors name the
    /// lane and the driver status.
    pub fn is_drained(&self) -> Result<bool, String> {
        let mut pool = self.lock_pool();
        self.reclaim(&mut pool);
        if pool.busy > 0 || !pool.fenced.is_empty() {
            return Ok(false);
        }
        for lane in &pool.idle {
            match lane.pipeline.is_drained() {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(e) => return Err(format!("pipeline {}: {e}", lane.index)),
            }
        }
        Ok(true)
    }

    /// Waits until no lane is fenced by an undrained chunk request (and none
    /// is busy). Lanes unquiesced by a copy never drain: the error names
    /// them.
    pub fn wait_drain(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut pool = self.lock_pool();
        loop {
            self.reclaim(&mut pool);
            let waiting = pool.busy + pool.fenced.iter().filter(|f| !f.unquiesced).count();
            let dead: Vec<String> = pool
                .fenced
                .iter()
                .filter(|f| f.unquiesced)
                .map(|f| format!("pipeline {}: {}", f.lane.index, f.reason))
                .collect();
            if waiting == 0 {
                return if dead.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "unquiesced (retained for good): {}",
                        dead.join("; ")
                    ))
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "{waiting} cuda-staging pipeline(s) still busy or holding undrained chunk \
                     requests after {timeout:?}"
                ));
            }
            let step = (deadline - now).min(Duration::from_millis(10));
            pool = self
                .cond
                .wait_timeout(pool, step)
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
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
        if let Some(StagedFailure::Refused { chunk: 0, error, .. }) = &outcome.failure
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
        let &(_, rsize, access) = peer
            .ranges
            .iter()
            .find(|r| r.0 == req.range)
            .ok_or(StagedSubmitError::UnpublishedRemote {
                peer: req.peer.0,
                range: req.range.0,
            })?;
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
        let len = c.len();
        let at = c.buffer_offset();
        net.scratch.resize(len, 0);
        let remote_offset = req.remote_offset + c.offset() as u64;
        let tr = match req.op {
            Op::Write => {
                c.read_into(&mut net.scratch[..len])
                    .map_err(|e| ChunkError::Internal(e.to_string()))?;
                b.host
                    .write_at(at, &net.scratch[..len])
                    .map_err(|e| ChunkError::Internal(e.to_string()))?;
                TransferRequest::write(
                    b.registration,
                    at as u64,
                    req.peer,
                    req.range,
                    remote_offset,
                    len as u64,
                )
            }
            Op::Read => TransferRequest::read(
                b.registration,
                at as u64,
                req.peer,
                req.range,
                remote_offset,
                len as u64,
            ),
        };
        let o = self.transfer(tr.label(req.label), net)?;
        if req.op == Op::Read {
            b.host
                .read_at(at, &mut net.scratch[..len])
                .map_err(|e| ChunkError::Internal(e.to_string()))?;
            c.write_from(&net.scratch[..len])
                .map_err(|e| ChunkError::Internal(e.to_string()))?;
        }
        net.chunks_done += 1;
        tracing::trace!(chunk = c.index(), request = %o.request, "chunk moved");
        Ok(())
    }

    /// Submits one chunk request and waits for its outcome and its drain.
    fn transfer(&self, tr: TransferRequest, net: &mut Net) -> Result<Outcome, ChunkError> {
        let id = match self.engine.submit(&[tr]) {
            Ok(ids) => ids[0],
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
        let drained = o.drain == DrainStatus::Drained
            || self.engine.wait_drain(id, self.drain_wait).is_ok();
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

    /// Builds the outcome of a staged request from the pipeline's result.
    fn outcome(
        &self,
        req: &StagedRequest,
        lane: usize,
        result: Result<orbitte_cuda::StagingReport, StagingError<ChunkError>>,
        net: Net,
    ) -> StagedOutcome {
        let chunk = self.chunk as u64;
        let chunks = u32::try_from(req.len.div_ceil(chunk)).unwrap_or(u32::MAX);
        let mut o = StagedOutcome {
            label: req.label,
            op: req.op,
            len: req.len,
            status: Status::Complete,
            completed_prefix: req.len,
            chunk_size: chunk,
            chunks,
            completed_chunks: chunks,
            failure: None,
            uncertain: req.len..req.len,
            remote_effect: match req.op {
                Op::Write => RemoteEffect::Complete,
                Op::Read => RemoteEffect::None,
            },
            drain: StagingDrain::Drained,
            lane,
        };
        let e = match result {
            Ok(_) if net.undrained.is_empty() => return o,
            Ok(_) => {
                // Cannot happen (a chunk that did not drain fails its
                // handler), but never claim a drain that was not seen.
                o.drain = StagingDrain::Pending {
                    copies_drained: true,
                    network: net.undrained,
                };
                return o;
            }
            Err(e) => e,
        };
        let copies_drained = e.drained;
        let landed = e.completed as u64;
        // For a WRITE: (prefix, end of uncertain bytes, anything posted for
        // the failed chunk); for a READ the destination is the GPU.
        let (prefix, uncertain_end, posted, status, failure) = match e.failure {
            StagingFailure::Handler { offset, source } => {
                let offset = offset as u64;
                let index = u32::try_from(offset / chunk).unwrap_or(u32::MAX);
                match source {
                    ChunkError::Network { outcome, drained } => {
                        let (prefix, end) = match req.op {
                            Op::Write => (
                                offset + outcome.completed_prefix,
                                offset + outcome.uncertain.end.max(outcome.completed_prefix),
                            ),
                            Op::Read => (landed, landed),
                        };
                        let status = match outcome.status {
                            Status::TimedOut | Status::Cancelled => Status::TimedOut,
                            _ => Status::Failed,
                        };
                        let posted = outcome.remote_effect != RemoteEffect::None
                            || outcome.status == Status::Complete;
                        let f = StagedFailure::Network {
                            chunk: index,
                            offset,
                            request: outcome.request,
                            status: outcome.status,
                            // Request-relative, like every offset here.
                            info: outcome.failure.map(|mut i| {
                                i.offset += offset;
                                i
                            }),
                            drained,
                        };
                        (prefix, end, posted, status, f)
                    }
                    ChunkError::Refused(error) => (
                        landed,
                        landed,
                        false,
                        Status::Failed,
                        StagedFailure::Refused {
                            chunk: index,
                            offset,
                            error,
                        },
                    ),
                    ChunkError::Internal(reason) => {
                        tracing::error!(%reason, "cuda-staging chunk failed");
                        // Unknown whether the chunk was posted: uncertain.
                        let end = match req.op {
                            Op::Write => (offset + chunk).min(req.len),
                            Op::Read => landed,
                        };
                        (
                            landed,
                            end,
                            true,
                            Status::Failed,
                            StagedFailure::Internal {
                                chunk: index,
                                offset,
                                reason,
                            },
                        )
                    }
                }
            }
            StagingFailure::Copy(error) => (
                landed,
                landed,
                false,
                Status::Failed,
                StagedFailure::Copy { error },
            ),
            StagingFailure::Unquiesced(error) => (
                landed,
                landed,
                false,
                Status::Failed,
                StagedFailure::Unquiesced { error },
            ),
            other => (
                landed,
                (landed + chunk).min(req.len),
                true,
                Status::Failed,
                StagedFailure::Internal {
                    chunk: u32::try_from(landed / chunk).unwrap_or(u32::MAX),
                    offset: landed,
                    reason: other.to_string(),
                },
            ),
        };
        o.status = status;
        o.completed_prefix = prefix.min(req.len);
        o.completed_chunks = if o.completed_prefix == req.len {
            chunks
        } else {
            u32::try_from(o.completed_prefix / chunk).unwrap_or(u32::MAX)
        };
        o.failure = Some(failure);
        o.uncertain = match req.op {
            // A READ whose copies did not drain may have written GPU bytes
            // past the prefix (an issued copy may still land).
            Op::Read if !copies_drained => o.completed_prefix..req.len,
            _ => o.completed_prefix..uncertain_end.clamp(o.completed_prefix, req.len),
        };
        o.remote_effect = match req.op {
            Op::Read => RemoteEffect::None,
            Op::Write if o.completed_prefix == 0 && !posted => RemoteEffect::None,
            Op::Write => RemoteEffect::Possible {
                bytes: o.uncertain.clone(),
            },
        };
        if !copies_drained || !net.undrained.is_empty() {
            o.drain = StagingDrain::Pending {
                copies_drained,
                network: net.undrained,
            };
        }
        o
    }

    fn lock_pool(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes an idle lane, waiting while all are busy.
    fn acquire(&self) -> Result<Lane, StagedSubmitError> {
        let mut pool = self.lock_pool();
        loop {
            self.reclaim(&mut pool);
            if let Some(lane) = pool.idle.pop() {
                pool.busy += 1;
                return Ok(lane);
            }
            let pending = pool.fenced.iter().any(|f| !f.unquiesced);
            if pool.busy == 0 && !pending {
                let reasons = pool
                    .fenced
                    .iter()
                    .map(|f| format!("pipeline {}: {}", f.lane.index, f.reason))
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(StagedSubmitError::Fenced { reasons });
            }
            if pool.busy == 0 {
                // Only lanes waiting for a chunk request to drain: give the
                // engine a moment, then look again.
                let reasons = pool
                    .fenced
                    .iter()
                    .map(|f| format!("pipeline {}: {}", f.lane.index, f.reason))
                    .collect::<Vec<_>>()
                    .join("; ");
                pool = self
                    .cond
                    .wait_timeout(pool, Duration::from_millis(10))
                    .map_or_else(|e| e.into_inner().0, |(g, _)| g);
                self.reclaim(&mut pool);
                if pool.idle.is_empty() && pool.busy == 0 {
                    return Err(StagedSubmitError::Fenced { reasons });
                }
                continue;
            }
            pool = self
                .cond
                .wait_timeout(pool, Duration::from_millis(50))
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
    }

    /// Returns a lane to the pool, or fences it.
    fn release(&self, lane: Lane, drain: &StagingDrain, reason: &str) {
        let mut pool = self.lock_pool();
        pool.busy -= 1;
        match drain {
            StagingDrain::Drained => pool.idle.push(lane),
            StagingDrain::Pending {
                copies_drained,
                network,
            } => {
                tracing::warn!(
                    lane = lane.index,
                    copies_drained,
                    undrained_requests = network.len(),
                    "cuda-staging pipeline fenced: its bounce buffers stay retained"
                );
                pool.fenced.push(Fenced {
                    unquiesced: !copies_drained || lane.pipeline.is_unquiesced(),
                    network: network.clone(),
                    reason: reason.to_owned(),
                    lane,
                });
            }
        }
        drop(pool);
        self.cond.notify_all();
    }

    /// Moves fenced lanes whose chunk requests have all drained back to
    /// the idle list.
    fn reclaim(&self, pool: &mut Pool) {
        let mut i = 0;
        while i < pool.fenced.len() {
            let f = &pool.fenced[i];
            let ready = !f.unquiesced
                && f.network
                    .iter()
                    .all(|id| self.engine.drain_status(*id) == DrainStatus::Drained)
                && matches!(f.lane.pipeline.is_drained(), Ok(true));
            if ready {
                let f = pool.fenced.swap_remove(i);
                tracing::debug!(lane = f.lane.index, "fenced cuda-staging pipeline drained");
                pool.idle.push(f.lane);
            } else {
                i += 1;
            }
        }
    }
}

impl Drop for CudaStaging<'_> {
    /// Unregisters the bounce buffers of drained lanes. Fenced lanes keep
    /// their registrations (retained: something may still touch them).
    fn drop(&mut self) {
        let mut pool = self.lock_pool();
        self.reclaim(&mut pool);
        for lane in pool.idle.drain(..) {
            for b in &lane.bounces {
                if let Err(e) = self.engine.unregister(b.registration) {
                    tracing::warn!(error = %e, lane = lane.index, "unregistering a bounce buffer failed; it stays retained");
                }
            }
        }
        for f in pool.fenced.drain(..) {
            tracing::warn!(
                lane = f.lane.index,
                reason = %f.reason,
                "cuda-staging pipeline still fenced at drop: its bounce buffers stay registered and retained"
            );
            // Retained for the life of the process: an undrained request or
            // copy may still reach these buffers.
            std::mem::forget(f);
        }
    }
}

/// Per-request state of the chunk handler.
#[derive(Debug, Default)]
struct Net {
    scratch: Vec<u8>,
    chunks_done: u32,
    undrained: Vec<RequestId>,
}

/// Why a chunk's network part failed.
#[derive(Debug, thiserror::Error)]
enum ChunkError {
    #[error("chunk request ended {:?}", outcome.status)]
    Network { outcome: Box<Outcome>, drained: bool },
    #[error("chunk request refused: {0}")]
    Refused(SubmitError),
    #[error("{0}")]
    Internal(String),
}
