//! The driver's state behind the engine lock: the core, the transports, the
//! tables, and the pump that takes the work to post, flushes what the core
//! asks and sends the notifications `EngineState` decides on.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use orbitte_verbs as verbs;
use orbitte_wire::Epoch;

use super::arrivals::Arrival;
use super::target::{Target, lock_lane};
use crate::error::Unquiesced;
use crate::nic::Initialized;
use crate::registration::Charges;
use crate::registration::EngineState;
use crate::transport::rdma::RdmaTransport;
use crate::transport::{
    MarkerFate, PathKind, PeerId, RailId, RailSpec, Transport, TransportEvent, WorkItem,
};
use orbitte_proto::state::Transmit;

/// Which transport owns a rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Rdma,
    Other(usize),
}

/// The driver's state: the sans-IO [`EngineState`] (`st.engine`: the
/// core, the tables, the ledger, outcomes, cleanup evidence) and what only
/// the driver holds: transports, NIC contexts, the threads waiting for
/// outcomes.
pub(crate) struct State {
    /// The tables, the ledger, the core and the rules of admission.
    pub(crate) engine: EngineState,
    pub(crate) rdma: RdmaTransport,
    pub(crate) others: Vec<Arc<dyn Transport>>,
    /// Each rail's post lock, by rail id (see `post`).
    pub(super) lanes: Vec<Arc<Mutex<()>>>,
    pub(crate) owner: Vec<Owner>,
    pub(crate) qpn_rail: crate::Map<(u32, u32), RailId>,
    /// The requests whose outcomes arrived, between taking them from the
    /// outcome table and waking their waiters (kept for its capacity).
    pub(super) arrived: Vec<crate::outcome::RequestId>,
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
    /// Work the core handed out in this hold of the lock, posted when the
    /// lock is released (see `post`).
    pub(super) work: Vec<WorkItem>,
    /// How the work handed out in this hold of the lock is posted (set by
    /// a submit for its own batch; back to [`Posting::Inline`] once the
    /// work is taken).
    pub(super) posting: crate::request::Posting,
    /// Events of work a transport executed while it was posted under the
    /// lock.
    pub(super) done: Vec<TransportEvent>,
    /// The intake's receiving end (see `settle_posts`).
    pub(super) arrivals: crossbeam_channel::Receiver<Arrival>,
    /// The tables' current copy (see `snapshot`), lent to posts made
    /// without the lock.
    pub(super) snapshot: Arc<super::snapshot::TablesSnapshot>,
    /// Undrained slices at the end of the last pump (drain waiters wake
    /// when it changes).
    pub(super) last_outstanding: u64,
    /// Each peer's cells, and the start of each request without a counted
    /// outcome (see `metrics`).
    pub(crate) counting: crate::metrics::Counting,
    /// Notifications of this engine's batches a rail took.
    pub(crate) notifications_sent: u64,
    /// Notifications of this engine's batches no rail took.
    pub(crate) notifications_not_sent: u64,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("core", self.engine.core())
            .finish_non_exhaustive()
    }
}

impl State {
    /// Takes the work the core can hand out now (posted when the lock is
    /// released, see `post`), flushes what the core asks, collects
    /// outcomes.
    pub(crate) fn pump(&mut self, now: Instant) {
        loop {
            self.engine.poll_work(&mut self.work);
            self.flush_and_reap(now);
            if self.done.is_empty() {
                break;
            }
            // Work executed while it was posted under the lock (before a
            // flush); its completions may free rail slots for more work.
            let mut done = std::mem::take(&mut self.done);
            for ev in done.drain(..) {
                self.engine.handle_event(now, ev);
            }
            self.done = done;
        }
        self.collect_outcomes();
        self.count_arrived(Some(now));
        let outstanding = self.engine.core().outstanding_slices();
        if outstanding != self.last_outstanding {
            self.last_outstanding = outstanding;
            self.waiters.slices_released();
        }
    }

    /// Moves the core's outcomes to the engine's table (`EngineState` holds
    /// those of notifying batches and decides each notification) and sends
    /// the notifications it asks for. The pump calls it.
    fn collect_outcomes(&mut self) {
        self.engine.collect_outcomes();
        while let Some(t) = self.engine.poll_transmit() {
            let result = self.transmit(&t);
            match result {
                Ok(_) => self.notifications_sent += 1,
                Err(_) => self.notifications_not_sent += 1,
            }
            self.engine.notification_sent(t.id, result);
        }
    }

    /// Counts the outcomes that arrived (in their request's cells, with
    /// the time since its submit), before anyone can take them, and moves
    /// their ids to `arrived`, whose waiters the lock's release wakes.
    /// `now`: when they arrived (`None`: read the clock if any did).
    pub(super) fn count_arrived(&mut self, mut now: Option<Instant>) {
        let from = self.arrived.len();
        self.engine.take_arrived(&mut self.arrived);
        let mut clock = || *now.get_or_insert_with(Instant::now);
        for id in &self.arrived[from..] {
            if let Some(o) = self.engine.outcome(id) {
                self.counting.finish(*id, o, &mut clock);
            }
        }
    }

    /// Records the start of requests just taken in (`ids[i]` made from
    /// `batch[i]`), before the lock is released and their outcomes can be
    /// counted. A request is counted on the path of the first rail of the
    /// first request of its peer in the batch (one path per peer: its
    /// rails; a request that failed at once: the peer's first rail).
    pub(crate) fn record_starts(
        &mut self,
        registry: &crate::metrics::Registry,
        now: Instant,
        batch: &[orbitte_proto::TransferRequest],
        ids: &[crate::outcome::RequestId],
    ) {
        let mut last: Option<(PeerId, u32)> = None;
        for (r, &id) in batch.iter().zip(ids) {
            let cell = match last {
                Some((peer, c)) if peer == r.peer => c,
                _ => {
                    let core = self.engine.core();
                    let rail = core
                        .pending_rails(id)
                        .and_then(|rails| rails.first().copied())
                        .or_else(|| {
                            let p = self.engine.tables().peers.get(&r.peer.0)?;
                            p.rails.first().copied()
                        });
                    let Some(path) = rail.and_then(|rail| core.rail_spec(rail)).map(|s| s.path)
                    else {
                        continue;
                    };
                    let c = self.cell_of(registry, r.peer, path);
                    last = Some((r.peer, c));
                    c
                }
            };
            self.counting.start(id, cell, now);
        }
    }

    /// The index of `peer`'s cells on `path` in `counting`.
    pub(crate) fn cell_of(
        &mut self,
        registry: &crate::metrics::Registry,
        peer: PeerId,
        path: PathKind,
    ) -> u32 {
        let tables = self.engine.tables();
        self.counting.cell(registry, peer, path, || {
            tables
                .peers
                .get(&peer.0)
                .map_or_else(String::new, |p| p.source_id.as_str().to_owned())
        })
    }

    /// Hands the frame to the first of the transmit's rails whose transport
    /// takes it (the rail the answer will come on); else why each refused.
    fn transmit(&mut self, t: &Transmit) -> Result<RailId, Vec<String>> {
        let mut why = Vec::new();
        for &rail in &t.rails {
            let res = match self.owner.get(rail.0 as usize) {
                Some(Owner::Rdma) => crate::transport::rdma::notify::send(
                    self.rdma.rail_mut(rail).as_deref_mut(),
                    rail,
                    &t.frame,
                ),
                Some(Owner::Other(i)) => match self.others.get_mut(*i) {
                    Some(tr) => tr.notify(rail, &t.frame),
                    None => {
                        why.push(format!("rail {} has no transport", rail.0));
                        continue;
                    }
                },
                None => {
                    why.push(format!("rail {} has no transport", rail.0));
                    continue;
                }
            };
            match res {
                Ok(()) => return Ok(rail),
                Err(e) => why.push(e.to_string()),
            }
        }
        Err(why)
    }

    /// Handles everything queued on the intake, then pumps once.
    pub(super) fn intake(&mut self, queue: &super::arrivals::Intake, now: Instant) {
        while let Some(arrival) = queue.pop() {
            if let Some(emptied) = self.arrive(now, arrival) {
                queue.recycle(emptied);
            }
        }
        self.pump(now);
    }

    /// Handles one arrival; returns the emptied buffer of a batch of
    /// events, for reuse.
    fn arrive(&mut self, now: Instant, arrival: Arrival) -> Option<Vec<TransportEvent>> {
        match arrival {
            Arrival::Event(ev) => self.engine.handle_event(now, ev),
            Arrival::Events(mut evs) => {
                for ev in evs.drain(..) {
                    self.engine.handle_event(now, ev);
                }
                return Some(evs);
            }
            Arrival::PostFailed { error, items } => {
                tracing::debug!(error = %error, "post failed");
                self.engine.handle_post_error(now, &error, &items);
            }
        }
        None
    }

    /// Posts what this hold of the lock handed out, waits for the posts
    /// running without the lock (their rails' post locks) and handles
    /// what they found, so that an outcome made next (a cancel, an
    /// expired deadline) knows every post's result: its uncertain range
    /// covers exactly the slices the transports accepted, none that a post
    /// still running would refuse.
    fn settle_posts(&mut self, now: Instant) {
        let mut rails: Vec<RailId> = self.work.iter().map(|w| w.rail).collect();
        rails.sort_unstable();
        rails.dedup();
        for rail in rails {
            let lane = self.lane(rail);
            let _held = lock_lane(&lane);
            self.post_held(now, rail);
        }
        for i in 0..self.lanes.len() {
            let lane = self.lanes[i].clone();
            drop(lock_lane(&lane));
        }
        while let Ok(arrival) = self.arrivals.try_recv() {
            // Rare (a cancel or a deadline): an emptied buffer is dropped.
            drop(self.arrive(now, arrival));
        }
        let mut done = std::mem::take(&mut self.done);
        for ev in done.drain(..) {
            self.engine.handle_event(now, ev);
        }
        self.done = done;
    }

    /// Expires the core's deadlines due at `now`, after settling the posts
    /// (see `settle_posts`).
    pub(crate) fn expire(&mut self, now: Instant) {
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.settle_posts(now);
            self.engine.handle_timeout(now);
        }
    }

    /// Cancels a request (`Core::cancel`) after settling the posts (see
    /// `settle_posts`).
    pub(crate) fn cancel(&mut self, now: Instant, id: crate::outcome::RequestId) -> bool {
        if !self.engine.core().is_pending(id) {
            return false;
        }
        self.settle_posts(now);
        self.engine.cancel(now, id)
    }

    /// Who posts to `rail`.
    pub(super) fn target(&self, rail: RailId) -> Target {
        match self.owner.get(rail.0 as usize) {
            Some(Owner::Rdma) => self.rdma.cell(rail).map_or(Target::Missing, Target::Rdma),
            Some(Owner::Other(i)) => self
                .others
                .get(*i)
                .map_or(Target::Missing, |t| Target::Other(t.clone())),
            None => Target::Missing,
        }
    }

    /// The post lock of `rail`.
    pub(super) fn lane(&self, rail: RailId) -> Arc<Mutex<()>> {
        self.lanes
            .get(rail.0 as usize)
            .cloned()
            .unwrap_or_else(|| Arc::new(Mutex::new(())))
    }

    /// Posts, under the state lock and `rail`'s post lock (which the caller
    /// holds), the items for `rail` the core handed out in this hold of the
    /// lock and not posted yet, so that what follows on the rail (a flush)
    /// comes after them.
    fn post_held(&mut self, now: Instant, rail: RailId) {
        if !self.work.iter().any(|w| w.rail == rail) {
            return;
        }
        let mut mine = Vec::new();
        self.work.retain(|w| {
            if w.rail == rail {
                mine.push(*w);
                false
            } else {
                true
            }
        });
        let target = self.target(rail);
        if let Err(e) = target.post(
            rail,
            &mine,
            self.engine.tables(),
            self.posting,
            &mut self.done,
        ) {
            tracing::debug!(error = %e, "post failed");
            self.engine.handle_post_error(now, &e, &mine);
        }
    }

    /// Flushes what the core asks, destroys reaped rdma rails that drained.
    /// A flush waits for the posts of that rail still running without the
    /// state lock (its post lock), and posts the rail's items still held
    /// here first: the flush (and its marker) follows every item posted.
    fn flush_and_reap(&mut self, now: Instant) {
        while let Some((rail, marker)) = self.engine.poll_flush(now) {
            let lane = self.lane(rail);
            let _held = lock_lane(&lane);
            self.post_held(now, rail);
            let res = match self.owner.get(rail.0 as usize) {
                Some(Owner::Rdma) => match self.rdma.flush_with_marker(rail, marker) {
                    Ok(fate) => Ok(fate),
                    Err(u) => {
                        // The queue pair could be neither flushed nor
                        // destroyed: its slices stay undrained, verbs
                        // retains it, and the engine is Unquiesced.
                        self.record_rail_unquiesced(format!("flushing rail {}", rail.0), *u);
                        self.engine.marker_dropped(rail, marker);
                        continue;
                    }
                },
                Some(Owner::Other(i)) => self
                    .others
                    .get(*i)
                    .map_or(Ok(MarkerFate::Dropped), |t| t.flush_marked(rail, marker)),
                None => Ok(MarkerFate::Dropped),
            };
            match res {
                Ok(MarkerFate::Posted) => {}
                Ok(MarkerFate::Dropped) => self.engine.marker_dropped(rail, marker),
                Ok(MarkerFate::Released) => self.engine.release_rail(now, rail),
                Err(e) => {
                    tracing::error!(error = %e, "flushing a rail failed; its slices stay undrained");
                    self.engine.marker_dropped(rail, marker);
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
            self.engine.handle_event(now, ev);
        }
        self.expire(now);
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
                let lane = self.lane(rail);
                let _held = lock_lane(&lane);
                if let Some(tr) = self.others.get(*t)
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
        if self.lanes.len() <= i {
            self.lanes.resize_with(i + 1, || Arc::new(Mutex::new(())));
        }
        rail
    }

    pub(crate) fn nic_info(&self) -> Vec<(u32, u16, orbitte_wire::Gid)> {
        self.init.as_ref().map_or_else(Vec::new, |i| {
            i.nics
                .iter()
                .map(|n| (n.id.0, n.lid, orbitte_wire::Gid(n.gid.0)))
                .collect()
        })
    }
}
