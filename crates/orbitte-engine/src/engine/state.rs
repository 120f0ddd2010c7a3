//! The driver's state behind the engine lock: the core, the transports, the
//! tables, and the pump that posts and flushes what the core asks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use orbitte_verbs as verbs;
use orbitte_wire::Epoch;

use crate::error::Unquiesced;
use crate::nic::Initialized;
use crate::registration::Charges;
use crate::state::EngineState;
use crate::transport::rdma::RdmaTransport;
use crate::transport::{MarkerFate, RailId, RailSpec, Transport, TransportEvent, WorkItem};

/// Which transport owns a rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Rdma,
    Other(usize),
}

/// The driver's state: the sans-IO [`EngineState`] (reached through
/// `Deref`: `st.core`, `st.tables`, `st.ledger`) and what only the driver
/// holds: transports, NIC contexts, outcomes with their waiters, cleanup
/// evidence.
pub(crate) struct State {
    /// The tables, the ledger, the core and the rules of admission.
    pub(crate) engine: EngineState,
    pub(crate) rdma: RdmaTransport,
    pub(crate) others: Vec<Box<dyn Transport>>,
    pub(crate) owner: Vec<Owner>,
    pub(crate) qpn_rail: HashMap<(u32, u32), RailId>,
    pub(crate) next_connect: u64,
    pub(crate) listed: Vec<verbs::DeviceInfo>,
    pub(crate) listing_error: Option<Arc<verbs::DeviceListError>>,
    pub(crate) init: Option<Initialized>,
    /// NIC IDs in affinity order (best first) for host memory.
    pub(crate) nic_order: Vec<u32>,
    /// The threads waiting for outcomes (`engine.outcomes`) and drain.
    pub(crate) waiters: super::waiters::Waiters,
    /// This engine's source id and epoch (for `Unquiesced` evidence).
    pub(crate) who: (String, Epoch),
    /// When to re-establish each rdma rail (see `crate::recovery`).
    pub(crate) recovery: crate::recovery::Recoveries,
    /// CUDA registrations and cuda-staging requests.
    pub(crate) staged: crate::staging::Staged,
    pub(super) work: Vec<WorkItem>,
    /// Events of work the transports executed while it was posted.
    pub(super) done: Vec<TransportEvent>,
    /// Undrained slices at the end of the last pump (drain waiters wake
    /// when it changes).
    pub(super) last_outstanding: u64,
}

impl std::ops::Deref for State {
    type Target = EngineState;
    fn deref(&self) -> &EngineState {
        &self.engine
    }
}

impl std::ops::DerefMut for State {
    fn deref_mut(&mut self) -> &mut EngineState {
        &mut self.engine
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl State {
    /// Posts what the core has, reports post errors, flushes what the core
    /// asks, collects outcomes.
    pub(crate) fn pump(&mut self, now: Instant) {
        let mut work = std::mem::take(&mut self.work);
        let mut done = std::mem::take(&mut self.done);
        loop {
            work.clear();
            self.core.poll_work(&mut work);
            self.post(now, &work, &mut done);
            if done.is_empty() {
                break;
            }
            // Work the transports executed while posting; its completions
            // may free rail slots for more work.
            for ev in done.drain(..) {
                self.core.handle_event(now, ev);
            }
        }
        self.work = work;
        self.done = done;
        self.flush_and_reap(now);
        crate::notify::collect_outcomes(self);
        let outstanding = self.core.outstanding_slices();
        if outstanding != self.last_outstanding {
            self.last_outstanding = outstanding;
            self.waiters.slices_released();
        }
    }

    /// Handles every event queued on the intake, then pumps once.
    pub(super) fn intake(&mut self, queue: &super::shared::Intake, now: Instant) {
        while let Some(ev) = queue.pop() {
            self.core.handle_event(now, ev);
        }
        self.pump(now);
    }

    /// Posts `work` rail by rail; events of work executed while posting go
    /// into `done`.
    fn post(&mut self, now: Instant, work: &[WorkItem], done: &mut Vec<TransportEvent>) {
        let mut start = 0;
        while start < work.len() {
            let rail = work[start].rail;
            let end = work[start..]
                .iter()
                .position(|w| w.rail != rail)
                .map_or(work.len(), |p| start + p);
            let run = &work[start..end];
            let res = match self.owner.get(rail.0 as usize) {
                Some(Owner::Rdma) => self.rdma.post(rail, run, &self.engine.tables),
                Some(Owner::Other(i)) => match self.others.get_mut(*i) {
                    Some(t) => t.post_inline(rail, run, &self.engine.tables, done),
                    None => Err(crate::transport::PostError {
                        rail,
                        posted: 0,
                        reason: "no transport".into(),
                    }),
                },
                None => Err(crate::transport::PostError {
                    rail,
                    posted: 0,
                    reason: "no transport".into(),
                }),
            };
            if let Err(e) = res {
                tracing::debug!(error = %e, "post failed");
                self.core.handle_post_error(now, &e, run);
            }
            start = end;
        }
    }

    /// Flushes what the core asks, destroys reaped rdma rails that drained.
    fn flush_and_reap(&mut self, now: Instant) {
        while let Some((rail, marker)) = self.core.poll_flush(now) {
            let res = match self.owner.get(rail.0 as usize) {
                Some(Owner::Rdma) => match self.rdma.flush_with_marker(rail, marker) {
                    Ok(fate) => Ok(fate),
                    Err(u) => {
                        // The queue pair could be neither flushed nor
                        // destroyed: its slices stay undrained, verbs
                        // retains it, and the engine is Unquiesced.
                        self.record_rail_unquiesced(format!("flushing rail {}", rail.0), *u);
                        self.core.marker_dropped(rail, marker);
                        continue;
                    }
                },
                Some(Owner::Other(i)) => self
                    .others
                    .get_mut(*i)
                    .map_or(Ok(MarkerFate::Dropped), |t| t.flush_marked(rail, marker)),
                None => Ok(MarkerFate::Dropped),
            };
            match res {
                Ok(MarkerFate::Posted) => {}
                Ok(MarkerFate::Dropped) => self.core.marker_dropped(rail, marker),
                Ok(MarkerFate::Released) => self.core.release_rail(now, rail),
                Err(e) => {
                    tracing::error!(error = %e, "flushing a rail failed; its slices stay undrained");
                    self.core.marker_dropped(rail, marker);
                }
            }
        }
        let mut ready = Vec::new();
        self.engine.take_reapable(&mut ready);
        for rail in ready {
            self.destroy_rdma_rail(rail);
        }
    }

    pub(crate) fn handle_events(&mut self, now: Instant, events: &mut Vec<TransportEvent>) {
        for ev in events.drain(..) {
            self.core.handle_event(now, ev);
        }
        self.core.handle_timeout(now);
        self.pump(now);
    }

    /// Closes a rail for good: no new work; a busy rail is flushed (by the
    /// next pump) and, for rdma, its queue pair destroyed once its work
    /// drained; an idle one is destroyed now.
    pub(crate) fn retire_rail(&mut self, rail: RailId, now: Instant) {
        self.recovery.untrack(rail);
        let rdma = self.owner.get(rail.0 as usize) == Some(&Owner::Rdma);
        let busy = self.engine.close_rail(rail, now, rdma);
        match self.owner.get(rail.0 as usize) {
            Some(Owner::Rdma) if busy => {}
            Some(Owner::Rdma) => self.destroy_rdma_rail(rail),
            Some(Owner::Other(t)) if !busy => {
                if let Some(tr) = self.others.get_mut(*t)
                    && let Err(e) = tr.close_rail(rail)
                {
                    tracing::warn!(error = %e, "closing a rail failed");
                }
            }
            _ => {}
        }
    }

    /// Destroys an rdma rail's queue pair; a failure is `Unquiesced`.
    fn destroy_rdma_rail(&mut self, rail: RailId) {
        if let Err(u) = self.rdma.destroy(rail) {
            self.record_rail_unquiesced(format!("closing rail {}", rail.0), *u);
        }
    }

    /// Records a failed queue pair destroy of a rail as `Unquiesced` (the
    /// QP is retained by verbs; a QP carries no budget charge) and fences
    /// new admission with the reason.
    pub(crate) fn record_rail_unquiesced(&mut self, during: String, failure: verbs::Unquiesced) {
        let u = Unquiesced {
            source_id: self.who.0.clone(),
            epoch: self.who.1,
            during,
            failures: vec![failure],
            retained: Charges::default(),
        };
        self.engine.record_unquiesced(u);
    }

    pub(crate) fn fence(&mut self, reason: impl Into<Arc<str>>) {
        self.engine.fence(reason);
    }

    /// Adds a rail to the core and to its peer's rails, owned by `owner`.
    pub(crate) fn add_rail(&mut self, owner: Owner, spec: RailSpec) -> RailId {
        let rail = self.engine.add_rail(spec);
        let i = rail.0 as usize;
        if self.owner.len() <= i {
            self.owner.resize(i + 1, Owner::Rdma);
        }
        self.owner[i] = owner;
        rail
    }

    pub(crate) fn nic_info(&self) -> Vec<(u32, u16, verbs::Gid)> {
        self.init.as_ref().map_or_else(Vec::new, |i| {
            i.nics.iter().map(|n| (n.id.0, n.lid, n.gid)).collect()
        })
    }
}
