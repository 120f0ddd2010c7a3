//! The staging lanes of each CUDA device: a lane is one staging pipeline
//! with its two bounce buffers registered with the engine, run by its own
//! thread that takes one request at a time from the device's queue. A lane
//! whose chunk request did not drain takes no request until it drains; one
//! whose copy did not drain is unquiesced for good (its buffers retained,
//! its thread gone).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use orbitte_cuda::{CudaBuffer, CudaDevice, PinnedBuffer, StagingPipeline};
use orbitte_memory::{DmaBuffer, HostMemory};
use orbitte_topology::{MemoryLocation, PciAddress};

use super::{StagingConfig, StagingSetupError};
use crate::engine::{Shared, TransferEngine, TransferRequest};
use crate::error::RegisterError;
use crate::outcome::{DrainStatus, RequestId};
use crate::registration::Access;
use crate::transport::RegistrationId;

/// One bounce buffer and the engine registration the NIC uses for it (of
/// the pinned buffer itself, through `HostMemory::from_dma_buffer`).
#[derive(Debug)]
pub(super) struct Bounce {
    pub(super) pinned: Arc<PinnedBuffer>,
    pub(super) registration: RegistrationId,
}

/// A pipeline with its registered bounce buffers.
#[derive(Debug)]
pub(super) struct Lane {
    pub(super) index: usize,
    pub(super) pipeline: StagingPipeline,
    pub(super) bounces: Vec<Bounce>,
}

/// A staged request waiting for (or running on) a lane.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) id: RequestId,
    /// The request; `registration` is the CUDA registration and
    /// `local_offset` the offset in the GPU buffer.
    pub(crate) req: TransferRequest,
    pub(crate) buffer: Arc<CudaBuffer>,
    /// The registration's pin, held until what the request used drained.
    #[allow(dead_code)] // held for its Drop: the buffer-ownership rule
    pub(crate) pin: Arc<()>,
    pub(crate) cancel: Arc<AtomicBool>,
}

/// Counts of a device's lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneCounts {
    /// Lanes made.
    pub lanes: usize,
    /// Ready for a request.
    pub idle: usize,
    /// Running a request.
    pub busy: usize,
    /// Waiting for a chunk request to drain before taking another request.
    pub fenced_network: usize,
    /// Unquiesced for good (a copy did not drain).
    pub unquiesced: usize,
}

/// The state of a device's staging lanes
/// ([`TransferEngine::cuda_staging`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagingStatus {
    /// The CUDA device.
    pub device: usize,
    /// Bytes per chunk.
    pub chunk_size: usize,
    /// The lanes.
    pub lanes: LaneCounts,
    /// Requests queued for a lane.
    pub queued: usize,
    /// The engine registrations of the bounce buffers (two per lane).
    pub bounce_registrations: Vec<RegistrationId>,
    /// Why a lane is fenced or unquiesced, one line per lane.
    pub fenced: Vec<String>,
    /// Whether every idle lane's copy streams were idle when it last
    /// finished a request (`cuStreamQuery`), or the driver's error.
    pub streams_idle: Result<bool, String>,
}

impl StagingStatus {
    /// The drain check of the lanes: none busy, fenced or unquiesced,
    /// nothing queued, and the copy streams idle.
    pub fn is_drained(&self) -> Result<bool, String> {
        let l = &self.lanes;
        if l.busy > 0 || l.fenced_network > 0 || l.unquiesced > 0 || self.queued > 0 {
            return Ok(false);
        }
        self.streams_idle.clone()
    }
}

#[derive(Debug, Default)]
struct PoolState {
    jobs: VecDeque<Job>,
    idle: usize,
    busy: usize,
    fenced_network: usize,
    unquiesced: usize,
    /// Per lane: why it is fenced or unquiesced.
    reasons: HashMap<usize, String>,
    /// Per lane: the last stream check.
    streams: HashMap<usize, Result<bool, String>>,
    closing: bool,
}

/// The lanes of one device.
#[derive(Debug)]
pub(crate) struct Pool {
    device: usize,
    config: StagingConfig,
    state: Mutex<PoolState>,
    cond: Condvar,
    bounces: Vec<RegistrationId>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

/// Every device's lanes, made on the first CUDA registration there. Lock
/// order: `pools` before the engine state, the engine state before a
/// pool's state; a lane's thread never holds its pool's state while it
/// takes the engine state.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    pub(crate) config: StagingConfig,
    pools: Mutex<HashMap<usize, Arc<Pool>>>,
}

impl Pools {
    pub(crate) fn new(config: StagingConfig) -> Self {
        Self {
            config,
            pools: Mutex::default(),
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<usize, Arc<Pool>>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pools now (a copy of the map, so no lock is held after).
    pub(crate) fn snapshot(&self) -> HashMap<usize, Arc<Pool>> {
        self.map().clone()
    }

    /// The lanes of `device`, made now if it has none.
    pub(crate) fn pool_for(
        &self,
        engine: &TransferEngine,
        device: &CudaDevice,
    ) -> Result<(), RegisterError> {
        let mut map = self.map();
        if map.contains_key(&device.index()) {
            return Ok(());
        }
        let pool =
            Pool::new(engine, device, self.config).map_err(|source| RegisterError::Staging {
                device: device.index(),
                source: Box::new(source),
            })?;
        map.insert(device.index(), pool);
        Ok(())
    }

    /// Stops the lanes of `device` (its last CUDA registration is gone)
    /// and unregisters their bounce buffers.
    pub(crate) fn close(&self, engine: &TransferEngine, device: usize) {
        let Some(pool) = self.map().remove(&device) else {
            return;
        };
        pool.stop();
        let unquiesced = pool.lock().unquiesced;
        if unquiesced > 0 {
            tracing::warn!(
                device,
                unquiesced,
                "cuda-staging lanes unquiesced: their bounce buffers stay registered and retained"
            );
        }
        for id in &pool.bounces {
            match engine.unregister(*id) {
                Ok(()) | Err(crate::error::UnregisterError::Unknown(_)) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "unregistering a bounce buffer failed; it stays retained");
                }
            }
        }
    }

    /// Stops every lane (the engine stops).
    pub(crate) fn stop_all(&self) {
        let pools: Vec<_> = self.map().drain().map(|(_, p)| p).collect();
        for p in pools {
            p.stop();
        }
    }
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

impl Pool {
    /// Makes `config.depth` lanes on `device`, registers every bounce
    /// buffer with `engine` once (local-only; Host Direct ranked for NICs
    /// near the GPU, or without MRs when the engine keeps host memory off
    /// RDMA) and starts the lanes' threads. On error everything registered
    /// so far is unregistered.
    fn new(
        engine: &TransferEngine,
        device: &CudaDevice,
        config: StagingConfig,
    ) -> Result<Arc<Self>, StagingSetupError> {
        let (chunk, depth) = (config.chunk, config.depth);
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
                let registered = HostMemory::from_dma_buffer(view)
                    .map_err(|source| StagingSetupError::View {
                        lane: index,
                        slot,
                        source,
                    })
                    .and_then(|host| {
                        let r = if engine.shared.host_without_rdma {
                            engine.register_host_without_rdma(host, Access::LocalOnly)
                        } else {
                            engine.register_host_at(host, Access::LocalOnly, at)
                        };
                        r.map_err(|source| StagingSetupError::Register {
                            lane: index,
                            slot,
                            bytes: chunk,
                            source,
                        })
                    });
                match registered {
                    Ok(r) => lane.bounces.push(Bounce {
                        pinned,
                        registration: r.id,
                    }),
                    Err(e) => {
                        lanes.push(lane);
                        undo(&lanes);
                        return Err(e);
                    }
                }
            }
            lanes.push(lane);
        }
        let pool = Arc::new(Self {
            device: device.index(),
            config,
            state: Mutex::new(PoolState::default()),
            cond: Condvar::new(),
            bounces: lanes
                .iter()
                .flat_map(|l| l.bounces.iter().map(|b| b.registration))
                .collect(),
            workers: Mutex::new(Vec::with_capacity(depth)),
        });
        for lane in lanes {
            let index = lane.index;
            let (shared, p) = (engine.shared.clone(), pool.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("orbitte-staging-{}-{index}", device.index()))
                .spawn(move || p.lane_loop(&shared, lane));
            match spawned {
                Ok(h) => {
                    pool.lock().idle += 1;
                    pool.workers_lock().push(h);
                }
                Err(source) => {
                    pool.stop();
                    for id in &pool.bounces {
                        let _ = engine.unregister(*id);
                    }
                    return Err(StagingSetupError::Thread {
                        lane: index,
                        source,
                    });
                }
            }
        }
        tracing::debug!(
            device = device.index(),
            chunk,
            depth,
            "cuda-staging lanes ready"
        );
        Ok(pool)
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn workers_lock(&self) -> MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why a request cannot run here: every lane is unquiesced.
    pub(crate) fn refusal(&self) -> Option<String> {
        let st = self.lock();
        (st.unquiesced >= self.config.depth).then(|| reasons(&st))
    }

    /// Queues a staged request for the next free lane.
    pub(crate) fn enqueue(&self, shared: &Arc<Shared>, job: Job) {
        let mut st = self.lock();
        if st.unquiesced >= self.config.depth || st.closing {
            let why = reasons(&st);
            drop(st);
            fail_unrun(shared, job, &why);
            return;
        }
        st.jobs.push_back(job);
        drop(st);
        self.cond.notify_one();
    }

    pub(crate) fn status(&self) -> StagingStatus {
        let st = self.lock();
        let streams_idle = st
            .streams
            .values()
            .try_fold(true, |all, s| s.clone().map(|idle| all && idle));
        StagingStatus {
            device: self.device,
            chunk_size: self.config.chunk,
            lanes: LaneCounts {
                lanes: self.config.depth,
                idle: st.idle,
                busy: st.busy,
                fenced_network: st.fenced_network,
                unquiesced: st.unquiesced,
            },
            queued: st.jobs.len(),
            bounce_registrations: self.bounces.clone(),
            fenced: {
                let mut v: Vec<_> = st.reasons.iter().collect();
                v.sort();
                v.into_iter()
                    .map(|(lane, why)| format!("pipeline {lane}: {why}"))
                    .collect()
            },
            streams_idle,
        }
    }

    /// Stops the lanes' threads and waits for them.
    fn stop(&self) {
        self.lock().closing = true;
        self.cond.notify_all();
        let workers = std::mem::take(&mut *self.workers_lock());
        for w in workers {
            let _ = w.join();
        }
    }

    /// A lane's thread: takes requests until the pool closes or the engine
    /// stops, or until a copy leaves the lane unquiesced.
    fn lane_loop(self: &Arc<Self>, shared: &Arc<Shared>, mut lane: Lane) {
        let engine = TransferEngine::view(shared.clone());
        loop {
            let job = {
                let mut st = self.lock();
                loop {
                    if st.closing || shared.stop.load(Ordering::Acquire) {
                        let left: Vec<Job> = st.jobs.drain(..).collect();
                        drop(st);
                        for job in left {
                            fail_unrun(shared, job, "the engine stopped its cuda-staging lanes");
                        }
                        return;
                    }
                    if let Some(job) = st.jobs.pop_front() {
                        st.idle -= 1;
                        st.busy += 1;
                        break job;
                    }
                    st = self
                        .cond
                        .wait_timeout(st, Duration::from_millis(50))
                        .map_or_else(|e| e.into_inner().0, |(g, _)| g);
                }
            };
            let done = super::run::run(&engine, &self.config, &mut lane, &job);
            let unquiesced = !done.copies_drained || lane.pipeline.is_unquiesced();
            let network = done.network.clone();
            let reason = done
                .outcome
                .failure
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            // The lane's counts change before the outcome is published, so
            // a caller who has the outcome sees the lane as it is now.
            let mut st = self.lock();
            st.busy -= 1;
            if unquiesced {
                st.unquiesced += 1;
                st.reasons.insert(
                    lane.index,
                    format!("unquiesced (retained for good): {reason}"),
                );
                let dead = st.unquiesced >= self.config.depth;
                let left: Vec<Job> = if dead {
                    st.jobs.drain(..).collect()
                } else {
                    Vec::new()
                };
                let why = reasons(&st);
                drop(st);
                tracing::error!(
                    device = self.device,
                    lane = lane.index,
                    "cuda-staging lane unquiesced: its buffers stay retained"
                );
                super::run::publish(shared, job.id, done);
                for job in left {
                    fail_unrun(shared, job, &why);
                }
                // Something may still touch these buffers: retained for
                // the life of the process, with the request's pin.
                std::mem::forget(lane);
                std::mem::forget(job);
                return;
            }
            if network.is_empty() {
                let streams = lane.pipeline.is_drained().map_err(|e| e.to_string());
                st.streams.insert(lane.index, streams);
                st.idle += 1;
                drop(st);
                let id = job.id;
                drop(job);
                super::run::publish(shared, id, done);
                continue;
            }
            st.fenced_network += 1;
            st.reasons
                .insert(lane.index, format!("chunk requests undrained: {reason}"));
            drop(st);
            tracing::warn!(
                device = self.device,
                lane = lane.index,
                undrained = network.len(),
                "cuda-staging lane fenced until its chunk requests drain"
            );
            super::run::publish(shared, job.id, done);
            if !wait_network_drain(&engine, shared, &network) {
                // The engine stops with the lane fenced: retained.
                std::mem::forget(lane);
                std::mem::forget(job);
                return;
            }
            let streams = lane.pipeline.is_drained().map_err(|e| e.to_string());
            let mut st = self.lock();
            st.fenced_network -= 1;
            st.reasons.remove(&lane.index);
            st.streams.insert(lane.index, streams);
            st.idle += 1;
            drop(st);
            drop(job);
            // Let drain waiters see the lane back.
            shared.lock().waiters.slices_released();
        }
    }
}

fn reasons(st: &PoolState) -> String {
    let mut v: Vec<_> = st.reasons.iter().collect();
    v.sort();
    v.into_iter()
        .map(|(lane, why)| format!("pipeline {lane}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Waits until every chunk request in `network` drained (the engine's
/// drain timeout flushes their rails); false if the engine stopped first.
fn wait_network_drain(engine: &TransferEngine, shared: &Shared, network: &[RequestId]) -> bool {
    loop {
        if network
            .iter()
            .all(|id| engine.drain_status(*id) == DrainStatus::Drained)
        {
            return true;
        }
        if shared.stop.load(Ordering::Acquire) {
            return false;
        }
        for id in network {
            let _ = engine.wait_drain(*id, Duration::from_millis(50));
        }
    }
}

/// Gives a staged request that no lane ran its outcome (failed, nothing
/// posted, drained).
pub(crate) fn fail_unrun(shared: &Shared, job: Job, why: &str) {
    let done = super::finish::unrun(&job, why);
    super::run::publish(shared, job.id, done);
}
