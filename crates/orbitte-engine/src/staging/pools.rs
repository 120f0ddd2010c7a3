//! The staging lanes' data: each device's [`Pool`] of lanes (the queued
//! requests, the lanes' counts and why a lane is fenced), the lanes
//! themselves with their bounce buffers, a staged request as a lane takes
//! it ([`Job`]), and what the engine reports about them
//! ([`StagingStatus`]). The lanes' threads are in `lanes`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use orbitte_cuda::{CudaBuffer, PinnedBuffer, StagingPipeline};

use super::StagingConfig;
use crate::outcome::RequestId;
use crate::transport::RegistrationId;
use orbitte_proto::TransferRequest;

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
/// ([`TransferEngine::cuda_staging`](crate::TransferEngine::cuda_staging)).
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
pub(super) struct PoolState {
    pub(super) jobs: VecDeque<Job>,
    pub(super) idle: usize,
    pub(super) busy: usize,
    pub(super) fenced_network: usize,
    pub(super) unquiesced: usize,
    /// Per lane: why it is fenced or unquiesced.
    pub(super) reasons: HashMap<usize, String>,
    /// Per lane: the last stream check.
    pub(super) streams: HashMap<usize, Result<bool, String>>,
    pub(super) closing: bool,
}

/// The lanes of one device.
#[derive(Debug)]
pub(crate) struct Pool {
    pub(super) device: usize,
    pub(super) config: StagingConfig,
    pub(super) state: Mutex<PoolState>,
    pub(super) cond: Condvar,
    pub(super) bounces: Vec<RegistrationId>,
    pub(super) workers: Mutex<Vec<JoinHandle<()>>>,
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

    pub(super) fn map(&self) -> MutexGuard<'_, HashMap<usize, Arc<Pool>>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pools now (a copy of the map, so no lock is held after).
    pub(crate) fn snapshot(&self) -> HashMap<usize, Arc<Pool>> {
        self.map().clone()
    }

    /// Stops every lane (the engine stops).
    pub(crate) fn stop_all(&self) {
        let pools: Vec<_> = self.map().drain().map(|(_, p)| p).collect();
        for p in pools {
            p.stop();
        }
    }
}

impl Pool {
    pub(super) fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn workers_lock(&self) -> MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why a request cannot run here: every lane is unquiesced.
    pub(crate) fn refusal(&self) -> Option<String> {
        let st = self.lock();
        (st.unquiesced >= self.config.depth).then(|| reasons(&st))
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
    pub(super) fn stop(&self) {
        self.lock().closing = true;
        self.cond.notify_all();
        let workers = std::mem::take(&mut *self.workers_lock());
        for w in workers {
            let _ = w.join();
        }
    }
}

pub(super) fn reasons(st: &PoolState) -> String {
    let mut v: Vec<_> = st.reasons.iter().collect();
    v.sort();
    v.into_iter()
        .map(|(lane, why)| format!("pipeline {lane}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}
