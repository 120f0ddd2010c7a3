//! The staging lanes of each CUDA device: a lane is one staging pipeline
//! with its two bounce buffers registered with the engine, run by its own
//! thread that takes one request at a time from the device's queue. A lane
//! whose chunk request did not drain takes no request until it drains; one
//! whose copy did not drain is unquiesced for good (its buffers retained,
//! its thread gone).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use orbitte_cuda::{CudaDevice, StagingPipeline};
use orbitte_memory::{DmaBuffer, HostMemory};
use orbitte_topology::{MemoryLocation, PciAddress};

use super::pools::{Bounce, Job, Lane, Pool, PoolState, Pools, reasons};
use super::{StagingConfig, StagingSetupError};
use crate::engine::{Shared, TransferEngine};
use crate::error::RegisterError;
use crate::outcome::{DrainStatus, RequestId};
use crate::registration::Access;

impl Pools {
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
