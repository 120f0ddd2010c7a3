//! The engine's table of the cuda-staging path: CUDA registrations and
//! staged requests as the engine state keeps them, and a staged request's
//! drain status.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::outcome::{DrainStatus, RequestId};
use crate::registration::EngineState;
use crate::session::Published;
use crate::transport::RegistrationId;
use crate::transport::tcp::staged::DeviceBounces;
use orbitte_cuda::CudaBuffer;

/// Invariant: a staged request id has bit 31 set (its slot part); the
/// core's slots stay below it (a core would need 2^31 live requests), so
/// the two never alias in the one [`RequestId`] space.
const STAGED_SLOT: u64 = 1 << 31;

/// CUDA registrations and staged requests, kept in the engine state.
#[derive(Debug, Default)]
pub(crate) struct Staged {
    pub(crate) regs: crate::Map<u64, CudaEntry>,
    pub(crate) requests: crate::Map<RequestId, StagedEntry>,
    pub(crate) next: u64,
    /// A registration was published or unpublished since the tables'
    /// copy was made (`snapshot`).
    pub(crate) changed: bool,
    /// The bounce buffers of each device's published registrations.
    pub(crate) bounces: crate::Map<usize, Arc<DeviceBounces>>,
}

#[derive(Debug)]
pub(crate) struct CudaEntry {
    pub(crate) buffer: Arc<CudaBuffer>,
    pub(crate) device: usize,
    /// Cloned into every job on the registration: a job holds it until
    /// what it used drained (for good when a copy did not drain).
    pub(crate) pin: Arc<()>,
    /// What the tcp target serves of it (`None`: local only).
    pub(crate) published: Option<Published>,
}

/// One staged request as the engine tracks it.
#[derive(Debug)]
pub(crate) struct StagedEntry {
    /// No outcome yet.
    pub(crate) outcome_pending: bool,
    /// Queued or running on a lane.
    pub(crate) running: bool,
    /// The lane's copies drained (false for good once a copy did not).
    pub(crate) copies_drained: bool,
    /// Chunk requests that had not drained when the request ended.
    pub(crate) network: Vec<RequestId>,
    /// The chunk request in flight.
    pub(crate) current: Option<RequestId>,
    pub(crate) cancel: Arc<AtomicBool>,
}

impl Staged {
    pub(crate) fn next_id(&mut self) -> RequestId {
        let n = self.next;
        self.next += 1;
        RequestId(((n >> 31) << 32) | STAGED_SLOT | (n & (STAGED_SLOT - 1)))
    }

    /// Whether the registration is GPU memory.
    pub(crate) fn is_cuda(&self, registration: RegistrationId) -> bool {
        self.regs.contains_key(&registration.0)
    }

    /// Whether the staged request still has no outcome.
    pub(crate) fn is_pending(&self, id: RequestId) -> bool {
        self.requests.get(&id).is_some_and(|e| e.outcome_pending)
    }

    /// Sets the chunk request in flight of a running request.
    pub(crate) fn set_current(&mut self, id: RequestId, chunk: Option<RequestId>) {
        if let Some(e) = self.requests.get_mut(&id) {
            e.current = chunk;
        }
    }

    /// Records how a request ended: what still holds its memory.
    pub(crate) fn ended(&mut self, id: RequestId, copies_drained: bool, network: Vec<RequestId>) {
        if let Some(e) = self.requests.get_mut(&id) {
            e.outcome_pending = false;
            e.running = false;
            e.current = None;
            e.copies_drained = copies_drained;
            e.network = network;
        }
    }

    /// The drain status of a staged request (`None`: not one). Pending
    /// counts one for a lane still working on it or a copy that did not
    /// drain, plus the undrained slices of its chunk requests (`engine`
    /// holds those). A drained entry whose outcome was taken is forgotten.
    pub(crate) fn drain_status(
        &mut self,
        engine: &EngineState,
        id: RequestId,
    ) -> Option<DrainStatus> {
        let e = self.requests.get(&id)?;
        let mut slices = u32::from(e.running || !e.copies_drained);
        for r in e.network.iter().chain(&e.current) {
            if let DrainStatus::Pending { slices: s } = engine.core().drain_status(*r) {
                slices = slices.saturating_add(s);
            }
        }
        if slices > 0 {
            return Some(DrainStatus::Pending { slices });
        }
        if !e.outcome_pending && !engine.has_outcome(&id) {
            self.requests.remove(&id);
        }
        Some(DrainStatus::Drained)
    }
}
