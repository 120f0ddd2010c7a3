//! The pool of lanes: a lane is one staging pipeline with its two bounce
//! buffers registered with the engine. A request holds a lane from start to
//! end; a lane whose chunk request did not drain is fenced until it does,
//! and one whose copy did not drain is unquiesced for good.

use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use orbitte_cuda::{PinnedBuffer, StagingPipeline};

use super::{CudaStaging, StagedSubmitError, StagingDrain};
use crate::outcome::{DrainStatus, RequestId};
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

/// A lane that may not run: a network request is undrained on one of its
/// bounce buffers, or a copy did not drain (unquiesced, forever).
#[derive(Debug)]
pub(super) struct Fenced {
    pub(super) lane: Lane,
    pub(super) network: Vec<RequestId>,
    pub(super) unquiesced: bool,
    pub(super) reason: String,
}

#[derive(Debug, Default)]
pub(super) struct Pool {
    pub(super) idle: Vec<Lane>,
    pub(super) busy: usize,
    pub(super) fenced: Vec<Fenced>,
}

impl Pool {
    /// Why each fenced lane is fenced, for [`StagedSubmitError::Fenced`].
    fn fenced_reasons(&self) -> String {
        self.fenced
            .iter()
            .map(|f| format!("pipeline {}: {}", f.lane.index, f.reason))
            .collect::<Vec<_>>()
            .join("; ")
    }
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

impl CudaStaging<'_> {
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

    pub(super) fn lock_pool(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes an idle lane, waiting while all are busy.
    pub(super) fn acquire(&self) -> Result<Lane, StagedSubmitError> {
        let mut pool = self.lock_pool();
        loop {
            self.reclaim(&mut pool);
            if let Some(lane) = pool.idle.pop() {
                pool.busy += 1;
                return Ok(lane);
            }
            let pending = pool.fenced.iter().any(|f| !f.unquiesced);
            if pool.busy == 0 && !pending {
                let reasons = pool.fenced_reasons();
                return Err(StagedSubmitError::Fenced { reasons });
            }
            if pool.busy == 0 {
                // Only lanes waiting for a chunk request to drain: give the
                // engine a moment, then look again.
                let reasons = pool.fenced_reasons();
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
    pub(super) fn release(&self, lane: Lane, drain: &StagingDrain, reason: &str) {
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
    pub(super) fn reclaim(&self, pool: &mut Pool) {
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
