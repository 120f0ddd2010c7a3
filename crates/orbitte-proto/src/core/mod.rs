//! The sans-IO transfer core.
//!
//! [`Core`] knows requests, slices, rails and time, and nothing else: no
//! clock, no threads, no syscalls, no verbs. Time is an argument. The
//! engine's driver (and the tests, with virtual time) pump it in this order:
//!
//! 1. [`Core::submit`] a batch (already validated against registrations and
//!    peers by the engine, which also chose the rails of each request);
//! 2. [`Core::poll_work`] into a reusable buffer and hand each rail's run of
//!    [`WorkItem`]s to its transport as one post; report a refused post with
//!    [`Core::handle_post_error`];
//! 3. feed every [`TransportEvent`] to [`Core::handle_event`];
//! 4. call [`Core::handle_timeout`] when [`Core::poll_timeout`] says so;
//! 5. take finished requests with [`Core::poll_outcome`], rails that must be
//!    flushed (a drain deadline passed) with [`Core::poll_flush`];
//! 6. repeat from 2 (completions return send-queue credits).
//!
//! The hot path (`poll_work`, `handle_event`) allocates nothing per slice:
//! slices live in a slab reused through a free list and each rail keeps a
//! ring of posted tokens sized by its in-flight bound.

mod rail;
mod rail_list;
mod request;
mod timers;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::outcome::{
    DrainStatus, FailureInfo, Outcome, RailRefusal, RemoteEffect, RequestError, RequestId, Status,
    SubmitError,
};
use crate::{
    Op, PathKind, PostError, RailId, RailSpec, SliceFailure, SliceStatus, SliceToken,
    TransportEvent, WorkItem,
};

use rail::Rail;
pub use rail_list::RailList;
pub use request::CoreRequest;
use request::Req;
use timers::{Deadline, TimerKind, Timers};

/// The largest slice a tcp rail carries: a slice is one request frame,
/// whose payload the protocol bounds (`orbitte_wire::MAX_PAYLOAD_LEN`).
/// A larger configured slice size is cut down to it on tcp, so the
/// completed prefix of a tcp request grows in steps of at most this.
pub const TCP_MAX_SLICE: u32 = orbitte_wire::MAX_PAYLOAD_LEN;

/// Settings of the core.
#[derive(Debug, Clone, Copy)]
pub struct CoreConfig {
    /// Bytes per slice (the last slice of a request may be shorter).
    pub slice_size: u32,
    /// Bytes per slice of a request whose rails are all tcp, if more than
    /// `slice_size`: a tcp rail sends each slice as a request frame and an
    /// answer (system calls and wakeups on both sides), and it has no
    /// work-request or MTU bound that small slices serve. Either size is
    /// cut down to [`TCP_MAX_SLICE`] on a request with a tcp rail.
    pub tcp_slice_size: u32,
    /// From submission to a logical timeout.
    pub request_timeout: Duration,
    /// From an undrained outcome to flushing the rails that hold its
    /// slices.
    pub drain_timeout: Duration,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            slice_size: 64 * 1024,
            tcp_slice_size: 1024 * 1024,
            request_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum SliceState {
    Free,
    /// Posted, not yet reported.
    Posted,
    /// Reported, transport still holds the local bytes.
    AwaitRelease,
    /// A flush marker: belongs to no request (see [`Core::poll_flush`]).
    Marker,
}

#[derive(Debug, Clone, Copy)]
struct SliceSlot {
    generation: u32,
    state: SliceState,
    req: u32,
    req_gen: u32,
    index: u32,
    rail: u32,
    len: u32,
}

/// The sans-IO transfer core. See the module docs for the calling order.
pub struct Core {
    config: CoreConfig,
    rails: Vec<Rail>,
    requests: Vec<Req>,
    free_requests: Vec<u32>,
    slices: Vec<SliceSlot>,
    free_slices: Vec<u32>,
    /// Rails that may have work to post (deduplicated by `Rail::queued`).
    ready: Vec<u32>,
    timers: Timers,
    outcomes: VecDeque<Outcome>,
    flush: VecDeque<RailId>,
    fence: Option<Arc<str>>,
    /// Undrained slices over all requests.
    outstanding: u64,
    live: usize,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("rails", &self.rails.len())
            .field("live_requests", &self.live)
            .field("outstanding_slices", &self.outstanding)
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

fn token_of(slot: u32, generation: u32) -> SliceToken {
    SliceToken(u64::from(generation) << 32 | u64::from(slot))
}

fn id_of(slot: u32, generation: u32) -> RequestId {
    RequestId(u64::from(generation) << 32 | u64::from(slot))
}

fn split(v: u64) -> (u32, u32) {
    ((v & 0xffff_ffff) as u32, (v >> 32) as u32)
}

impl Core {
    /// A core with no rails.
    pub fn new(config: CoreConfig) -> Self {
        let config = CoreConfig {
            slice_size: config.slice_size.max(1),
            ..config
        };
        Self {
            config,
            rails: Vec::new(),
            requests: Vec::new(),
            free_requests: Vec::new(),
            slices: Vec::new(),
            free_slices: Vec::new(),
            ready: Vec::new(),
            timers: Timers::default(),
            outcomes: VecDeque::new(),
            flush: VecDeque::new(),
            fence: None,
            outstanding: 0,
            live: 0,
        }
    }

    /// The settings.
    pub fn config(&self) -> CoreConfig {
        self.config
    }

    /// Adds a rail (up). Its id is its index and is never reused.
    pub fn add_rail(&mut self, spec: RailSpec) -> RailId {
        let id = RailId(self.rails.len() as u32);
        self.rails.push(Rail::new(spec));
        id
    }

    /// The rail's description.
    pub fn rail_spec(&self, rail: RailId) -> Option<&RailSpec> {
        self.rails.get(rail.0 as usize).map(|r| &r.spec)
    }

    /// Whether the rail takes new work.
    pub fn rail_is_up(&self, rail: RailId) -> bool {
        self.rails
            .get(rail.0 as usize)
            .is_some_and(|r| r.down.is_none() && !r.closed)
    }

    /// Why the rail is down, if it is.
    pub fn rail_down_reason(&self, rail: RailId) -> Option<Arc<str>> {
        self.rails.get(rail.0 as usize).and_then(|r| r.down.clone())
    }

    /// Whether the rail was closed for good.
    pub fn rail_is_closed(&self, rail: RailId) -> bool {
        self.rails.get(rail.0 as usize).is_none_or(|r| r.closed)
    }

    /// The rail's transport re-established it (rdma: a new queue pair on
    /// the same NIC pair): it takes new work again. Only a rail that is not
    /// closed and holds no posted work is restored; returns whether it was.
    pub fn restore_rail(&mut self, rail: RailId) -> bool {
        let Some(r) = self.rails.get_mut(rail.0 as usize) else {
            return false;
        };
        if r.closed || !r.fifo.is_empty() {
            return false;
        }
        r.down = None;
        r.errored = false;
        r.flush_requested = false;
        r.since_signal = 0;
        true
    }

    /// Posted, unreported work items on the rail.
    pub fn rail_in_flight(&self, rail: RailId) -> usize {
        self.rails.get(rail.0 as usize).map_or(0, |r| r.fifo.len())
    }

    /// Marks the rail closed (no new work, ever). A rail with unreported
    /// work items is queued for a flush ([`poll_flush`](Self::poll_flush)).
    /// Returns whether it still has unreported work items.
    pub fn close_rail(&mut self, rail: RailId, now: Instant) -> bool {
        self.rail_down(rail, "rail closed".into(), now);
        let Some(r) = self.rails.get_mut(rail.0 as usize) else {
            return false;
        };
        r.closed = true;
        let busy = !r.fifo.is_empty();
        if busy && !r.flush_requested {
            r.flush_requested = true;
            self.flush.push_back(rail);
        }
        busy
    }

    /// Stops all new admission with `reason` (cleanup failed: Unquiesced,
    /// or shutdown).
    pub fn fence(&mut self, reason: Arc<str>) {
        if self.fence.is_none() {
            tracing::debug!(%reason, "transfer core fenced");
            self.fence = Some(reason);
        }
    }

    /// Why the core is fenced.
    pub fn fenced(&self) -> Option<&Arc<str>> {
        self.fence.as_ref()
    }

    /// Undrained slices of all requests.
    pub fn outstanding_slices(&self) -> u64 {
        self.outstanding
    }

    /// Requests not yet drained (with or without an outcome).
    pub fn live_requests(&self) -> usize {
        self.live
    }

    /// Bytes per slice of a request on `rails`: the tcp slice size when
    /// every rail is tcp, the engine's otherwise; at most
    /// [`TCP_MAX_SLICE`] when any rail is tcp.
    fn slice_for(&self, rails: &[RailId]) -> u64 {
        let is_tcp = |r: &RailId| {
            self.rails
                .get(r.0 as usize)
                .is_some_and(|rl| rl.spec.path == PathKind::Tcp)
        };
        let size = if !rails.is_empty() && rails.iter().all(is_tcp) {
            self.config.tcp_slice_size.max(self.config.slice_size)
        } else {
            self.config.slice_size
        };
        let size = if rails.iter().any(is_tcp) {
            size.min(TCP_MAX_SLICE)
        } else {
            size
        };
        u64::from(size.max(1))
    }

    /// The ends (offset + length) of a request's local and remote extents,
    /// or why it cannot be taken: zero length, or an end past u64.
    pub fn extent_ends(
        local_offset: u64,
        remote_offset: u64,
        len: u64,
    ) -> Result<(u64, u64), RequestError> {
        if len == 0 {
            return Err(RequestError::ZeroLength);
        }
        match (
            local_offset.checked_add(len),
            remote_offset.checked_add(len),
        ) {
            (Some(lend), Some(rend)) => Ok((lend, rend)),
            _ => Err(RequestError::Overflow {
                offset: local_offset.max(remote_offset),
                len,
            }),
        }
    }

    /// The longest request on `rails` whose slices the core can count
    /// (more is refused as an overflow).
    pub fn max_request_len(&self, rails: &[RailId]) -> u64 {
        self.slice_for(rails).saturating_mul(u64::from(u32::MAX))
    }

    /// Admits a batch: all or nothing. The engine validated ranges and
    /// peers; the core checks lengths, rails and the fence.
    pub fn submit(
        &mut self,
        now: Instant,
        batch: Vec<CoreRequest>,
    ) -> Result<Vec<RequestId>, SubmitError> {
        self.check(&batch)?;
        let mut ids = Vec::with_capacity(batch.len());
        self.insert(now, batch, &mut ids);
        Ok(ids)
    }

    /// What [`submit`](Self::submit) checks before it takes a batch in:
    /// lengths, rails and the fence.
    pub fn check(&self, batch: &[CoreRequest]) -> Result<(), SubmitError> {
        if batch.is_empty() {
            return Err(SubmitError::Empty);
        }
        if let Some(reason) = &self.fence {
            return Err(SubmitError::Fenced {
                index: 0,
                label: batch[0].label,
                reason: reason.clone(),
            });
        }
        for (index, r) in batch.iter().enumerate() {
            let slice = self.slice_for(&r.rails);
            let bad = |error| SubmitError::Invalid {
                index,
                label: r.label,
                error,
            };
            Self::extent_ends(r.local_offset, r.remote_offset, r.len).map_err(bad)?;
            if r.len.div_ceil(slice) > u64::from(u32::MAX) {
                return Err(bad(RequestError::Overflow {
                    offset: r.local_offset,
                    len: r.len,
                }));
            }
            if r.rails.is_empty() {
                return Err(bad(RequestError::NoRail {
                    peer: r.peer,
                    why: vec![RailRefusal::NoRails],
                }));
            }
            for rail in &r.rails {
                if !self.rail_is_up(*rail) {
                    let refusal = match self.rail_down_reason(*rail) {
                        Some(reason) => RailRefusal::Down {
                            rail: *rail,
                            reason,
                        },
                        None => RailRefusal::Unknown { rail: *rail },
                    };
                    return Err(bad(RequestError::NoRail {
                        peer: r.peer,
                        why: vec![refusal],
                    }));
                }
            }
        }
        Ok(())
    }

    /// Takes in requests that passed [`check`](Self::check), or the
    /// engine's admission, which checks the same (the fence raised since
    /// does not turn them away), appending their ids to
    /// `ids`. A request with a rail that went down since its check fails
    /// at once, as one waiting for that rail would: nothing of it is
    /// posted.
    pub fn insert(
        &mut self,
        now: Instant,
        batch: impl IntoIterator<Item = CoreRequest>,
        ids: &mut Vec<RequestId>,
    ) {
        let deadline = now + self.config.request_timeout;
        for r in batch {
            let slice = self.slice_for(&r.rails);
            let slices = r.len.div_ceil(slice) as u32;
            let slot = match self.free_requests.pop() {
                Some(s) => s,
                None => {
                    self.requests.push(Req::vacant());
                    (self.requests.len() - 1) as u32
                }
            };
            let req = &mut self.requests[slot as usize];
            req.fill(r, slices, slice);
            let generation = req.generation;
            let mut down = None;
            for (pos, rail) in req.rails.iter().enumerate() {
                if (pos as u32) < slices {
                    let rl = &mut self.rails[rail.0 as usize];
                    if let Some(reason) = &rl.down {
                        down.get_or_insert((*rail, reason.clone()));
                        continue;
                    }
                    rl.waiting.push_back((slot, generation, pos as u32));
                    if !rl.queued {
                        rl.queued = true;
                        self.ready.push(rail.0);
                    }
                }
            }
            self.timers
                .push(TimerKind::Request, deadline, slot, generation);
            self.live += 1;
            let id = id_of(slot, generation);
            tracing::trace!(%id, slices, "request admitted");
            ids.push(id);
            if let Some((rail, reason)) = down {
                let pos = req.rails.iter().position(|r| *r == rail).unwrap_or(0);
                self.fail_unposted(now, slot, pos, rail, &reason);
            }
        }
    }

    /// Appends the work items that can be posted now, grouped by rail (one
    /// post per run), each run ending with a signaled item.
    pub fn poll_work(&mut self, out: &mut Vec<WorkItem>) {
        while let Some(rail_idx) = self.ready.pop() {
            let rail = &mut self.rails[rail_idx as usize];
            rail.queued = false;
            if rail.down.is_some() {
                continue;
            }
            let run_start = out.len();
            while rail.fifo.len() < rail.capacity() {
                let Some(&(slot, generation, pos)) = rail.waiting.front() else {
                    break;
                };
                let req = &mut self.requests[slot as usize];
                if req.generation != generation || req.abandoned {
                    rail.waiting.pop_front();
                    continue;
                }
                let k = req.rails.len() as u32;
                let index = req.next[pos as usize];
                if index >= req.slices {
                    rail.waiting.pop_front();
                    continue;
                }
                req.next[pos as usize] = index + k;
                if index + k >= req.slices {
                    rail.waiting.pop_front();
                }
                let offset = u64::from(index) * req.slice;
                let len = (req.len - offset).min(req.slice) as u32;
                req.posted += 1;
                req.unanswered += 1;
                req.outstanding += 1;
                req.hull_end = req.hull_end.max(offset + u64::from(len));
                // Take a slice slot (reused; allocation only while the
                // slab grows to its high-water mark).
                let sidx = take_slice_slot(&mut self.slices, &mut self.free_slices);
                let s = &mut self.slices[sidx as usize];
                s.generation = s.generation.wrapping_add(1);
                s.state = SliceState::Posted;
                s.req = slot;
                s.req_gen = generation;
                s.index = index;
                s.rail = rail_idx;
                s.len = len;
                let token = token_of(sidx, s.generation);
                rail.fifo.push_back(token.0);
                self.outstanding += 1;
                let signaled = rail.since_signal + 1 >= rail.spec.signal_interval;
                rail.since_signal = if signaled { 0 } else { rail.since_signal + 1 };
                out.push(WorkItem {
                    token,
                    rail: RailId(rail_idx),
                    op: req.op,
                    registration: req.registration,
                    local_offset: req.local_offset + offset,
                    peer: req.peer,
                    range: req.range,
                    remote_offset: req.remote_offset + offset,
                    len,
                    signaled,
                });
            }
            if out.len() > run_start {
                let last = out.len() - 1;
                if !out[last].signaled {
                    out[last].signaled = true;
                    rail.since_signal = 0;
                }
            }
        }
    }

    /// Records that a post stopped early: the items after `err.posted` of
    /// `items` (the run given to the transport) were never posted: they
    /// fail with `PostFailed`, the first of them is the request's failure,
    /// and they count neither as posted nor in the uncertain range. The
    /// rail is marked down, and if it still holds posted items it is queued
    /// for a flush ([`poll_flush`](Self::poll_flush)) at once: items that
    /// ran unsignaled before the failure have no signaled item after them,
    /// and only the flush's marker reports them.
    ///
    /// The driver may learn of the failure after it handed out more items
    /// on the rail (it posts without holding the core): those stay in
    /// flight, and a request's later slices handed out to the rail keep
    /// the uncertain range where it was (they may still be posted).
    pub fn handle_post_error(&mut self, now: Instant, err: &PostError, items: &[WorkItem]) {
        let failed = &items[err.posted.min(items.len())..];
        let rail_idx = err.rail.0 as usize;
        if rail_idx >= self.rails.len() {
            return;
        }
        // The failed items are the newest entries of the rail's ring
        // (unless more were handed out since): take them out newest first.
        let rail = &mut self.rails[rail_idx];
        for item in failed.iter().rev() {
            if let Some(pos) = rail.fifo.iter().rposition(|t| *t == item.token.0) {
                rail.fifo.remove(pos);
            }
        }
        // Never posted: no remote effect, not in the hull. Newest first, so
        // that the hull shrinks only over slices handed out last.
        for item in failed.iter().rev() {
            let (sidx, sgeneration) = split(item.token.0);
            if let Some(slot) = self.slices.get(sidx as usize).copied()
                && slot.generation == sgeneration
                && matches!(slot.state, SliceState::Posted)
                && let Some(req) = self.requests.get_mut(slot.req as usize)
                && req.generation == slot.req_gen
            {
                req.posted -= 1;
                let slice = req.slice;
                req.unpost(err.rail, slot.index, slice);
            }
        }
        // Then fail them in posting order, so the failure names the first
        // slice that was not posted.
        for item in failed {
            let (sidx, sgeneration) = split(item.token.0);
            if let Some(slot) = self.slices.get(sidx as usize).copied()
                && slot.generation == sgeneration
                && matches!(slot.state, SliceState::Posted)
            {
                self.finish_slice(
                    now,
                    sidx,
                    SliceStatus::Failed(SliceFailure::PostFailed(err.reason.clone())),
                    true,
                );
            }
        }
        // Earlier unsignaled items of the accepted part need a signaled
        // cover; the transport reports them when it flushes the rail.
        self.rail_down(err.rail, err.reason.clone(), now);
        let r = &mut self.rails[rail_idx];
        if !r.fifo.is_empty() && !r.flush_requested {
            r.flush_requested = true;
            self.flush.push_back(err.rail);
        }
    }

    /// Feeds one transport event.
    pub fn handle_event(&mut self, now: Instant, event: TransportEvent) {
        match event {
            TransportEvent::Completed {
                rail,
                token,
                status,
                released,
            } => {
                self.handle_completion(now, rail, token, status, released);
            }
            TransportEvent::Released { rail, token } => {
                let (sidx, sgeneration) = split(token.0);
                match self.slices.get(sidx as usize).copied() {
                    Some(s)
                        if s.generation == sgeneration
                            && s.rail == rail.0
                            && matches!(s.state, SliceState::AwaitRelease) =>
                    {
                        self.release_slice(now, sidx);
                    }
                    _ => tracing::debug!(?rail, ?token, "release for an unknown slice ignored"),
                }
            }
            TransportEvent::RailDown { rail, reason } => self.rail_down(rail, reason, now),
            TransportEvent::RailUp { rail } => {
                if let Some(r) = self.rails.get_mut(rail.0 as usize)
                    && !r.closed
                {
                    r.down = None;
                    r.errored = false;
                }
            }
            // The engine state takes notification answers before the core.
            TransportEvent::NotificationAnswered { .. } => {}
        }
    }

    fn handle_completion(
        &mut self,
        now: Instant,
        rail: RailId,
        token: SliceToken,
        status: SliceStatus,
        released: bool,
    ) {
        let Some(r) = self.rails.get_mut(rail.0 as usize) else {
            tracing::debug!(?rail, "completion on an unknown rail ignored");
            return;
        };
        // A live posted slice (or marker) of this rail is in its ring
        // (invariant), so the slab answers in O(1) what a ring scan would.
        let (tidx, tgen) = split(token.0);
        let known = self.slices.get(tidx as usize).is_some_and(|s| {
            s.generation == tgen
                && s.rail == rail.0
                && matches!(s.state, SliceState::Posted | SliceState::Marker)
        });
        if !known || r.fifo.is_empty() {
            tracing::debug!(?rail, ?token, "completion for an unknown slice ignored");
            return;
        }
        let failed = matches!(status, SliceStatus::Failed(_));
        // A rail that reports every item (signal interval 1: tcp and local,
        // whose peers may answer in any order) finishes exactly the item
        // reported; the items posted before it stay in flight until they
        // are reported themselves.
        if self.rails[rail.0 as usize].spec.signal_interval == 1 {
            let r = &mut self.rails[rail.0 as usize];
            if let Some(pos) = r.fifo.iter().position(|t| *t == token.0) {
                // In order, the usual case, it is the oldest item.
                if pos == 0 {
                    r.fifo.pop_front();
                } else {
                    r.fifo.remove(pos);
                }
                if failed {
                    r.errored = true;
                }
                self.finish_slice(now, tidx, status, released);
            }
            if self.rails[rail.0 as usize].down.is_none() {
                self.mark_ready(rail.0);
            }
            return;
        }
        // Under selective signaling everything posted before `token` on
        // this rail is implied (verbs RC order): done if the rail had no
        // error yet, flushed otherwise.
        loop {
            let r = &mut self.rails[rail.0 as usize];
            let Some(front) = r.fifo.pop_front() else {
                break;
            };
            let (sidx, _) = split(front);
            if front == token.0 {
                if failed {
                    r.errored = true;
                }
                self.finish_slice(now, sidx, status, released);
                break;
            }
            let implied = if r.errored {
                SliceStatus::Failed(SliceFailure::Flushed)
            } else {
                SliceStatus::Success
            };
            self.finish_slice(now, sidx, implied, released);
        }
        if self.rails[rail.0 as usize].down.is_none() {
            self.mark_ready(rail.0);
        }
    }

    fn mark_ready(&mut self, rail: u32) {
        let r = &mut self.rails[rail as usize];
        if !r.queued && !r.waiting.is_empty() {
            r.queued = true;
            self.ready.push(rail);
        }
    }

    /// A slice was reported (it left the rail's ring already).
    fn finish_slice(&mut self, now: Instant, sidx: u32, status: SliceStatus, released: bool) {
        let slot = self.slices[sidx as usize];
        if matches!(slot.state, SliceState::Marker) {
            self.free_slice(sidx);
            return;
        }
        let req = &mut self.requests[slot.req as usize];
        if req.generation != slot.req_gen || !req.live {
            // Cannot happen while the slab is consistent; never panic.
            tracing::error!(slice = sidx, "slice of a freed request");
            self.free_slice(sidx);
            return;
        }
        req.unanswered -= 1;
        match status {
            SliceStatus::Success => req.mark_done(slot.index),
            SliceStatus::Failed(failure) => {
                if req.failure.is_none() {
                    let spec = &self.rails[slot.rail as usize].spec;
                    req.failure = Some(Box::new(FailureInfo {
                        slice: slot.index,
                        offset: u64::from(slot.index) * req.slice,
                        rail: Some(RailId(slot.rail)),
                        path: spec.path,
                        nic: spec.nic.map(orbitte_topology::NicId),
                        status: failure,
                        chunk: None,
                    }));
                }
                req.abandoned = true;
            }
        }
        if released {
            self.release_slice(now, sidx);
        } else {
            self.slices[sidx as usize].state = SliceState::AwaitRelease;
            self.check_finished(now, slot.req);
        }
    }

    fn release_slice(&mut self, now: Instant, sidx: u32) {
        let slot = self.slices[sidx as usize];
        self.free_slice(sidx);
        self.outstanding -= 1;
        let req = &mut self.requests[slot.req as usize];
        if req.generation == slot.req_gen && req.live {
            req.outstanding -= 1;
            self.check_finished(now, slot.req);
        }
    }

    fn free_slice(&mut self, sidx: u32) {
        self.slices[sidx as usize].state = SliceState::Free;
        self.free_slices.push(sidx);
    }

    /// Emits the outcome when the request is settled, frees it when it is
    /// also drained.
    fn check_finished(&mut self, now: Instant, slot: u32) {
        let req = &mut self.requests[slot as usize];
        if !req.live {
            return;
        }
        if !req.finished {
            let status = if req.prefix == req.slices {
                Some(Status::Complete)
            } else if req.abandoned && req.unanswered == 0 {
                Some(Status::Failed)
            } else {
                None
            };
            if let Some(status) = status {
                self.finish(now, slot, status);
            }
        }
        let req = &mut self.requests[slot as usize];
        if req.finished && req.outstanding == 0 {
            tracing::trace!(id = %id_of(slot, req.generation), "request drained");
            req.clear();
            self.free_requests.push(slot);
            self.live -= 1;
        }
    }

    fn finish(&mut self, now: Instant, slot: u32, status: Status) {
        let req = &mut self.requests[slot as usize];
        req.finished = true;
        req.abandoned = true;
        let prefix = (u64::from(req.prefix) * req.slice).min(req.len);
        let uncertain = if status == Status::Complete {
            req.len..req.len
        } else {
            prefix..req.hull_end.max(prefix)
        };
        let remote_effect = match (req.op, status) {
            (Op::Read, _) => RemoteEffect::None,
            (Op::Write, Status::Complete) => RemoteEffect::Complete,
            (Op::Write, _) if req.posted == 0 => RemoteEffect::None,
            (Op::Write, _) => RemoteEffect::Possible {
                bytes: uncertain.clone(),
            },
        };
        let drain = if req.outstanding == 0 {
            DrainStatus::Drained
        } else {
            DrainStatus::Pending {
                slices: req.outstanding,
            }
        };
        let failure = if status == Status::Complete {
            None
        } else {
            req.failure.clone()
        };
        let outcome = Outcome {
            request: id_of(slot, req.generation),
            label: req.label,
            op: req.op,
            len: req.len,
            status,
            completed_prefix: prefix,
            completed_slices: req.prefix,
            slices: req.slices,
            failure,
            uncertain,
            remote_effect,
            drain,
            notification: crate::notification::NotificationStatus::NotRequested,
        };
        tracing::debug!(id = %outcome.request, ?status, prefix, "request finished");
        if req.outstanding > 0 {
            let at = now + self.config.drain_timeout;
            self.timers.push(TimerKind::Drain, at, slot, req.generation);
        }
        self.outcomes.push_back(outcome);
    }

    fn rail_down(&mut self, rail: RailId, reason: Arc<str>, now: Instant) {
        let Some(r) = self.rails.get_mut(rail.0 as usize) else {
            return;
        };
        if r.down.is_none() {
            tracing::debug!(?rail, %reason, "rail down");
            r.down = Some(reason.clone());
        }
        // Requests that still need this rail cannot finish: their unposted
        // slices fail here (never moved to another rail).
        let waiting = std::mem::take(&mut r.waiting);
        for (slot, generation, pos) in waiting {
            let req = &self.requests[slot as usize];
            if req.generation != generation || req.abandoned {
                continue;
            }
            self.fail_unposted(now, slot, pos as usize, rail, &reason);
        }
    }

    /// The request in `slot` cannot post the slices of its rail position
    /// `pos` (on `rail`, down for `reason`): unless it has them all
    /// posted, it fails (its first failure, if it has none, is the first
    /// of those slices) and posts nothing more.
    fn fail_unposted(
        &mut self,
        now: Instant,
        slot: u32,
        pos: usize,
        rail: RailId,
        reason: &Arc<str>,
    ) {
        let req = &mut self.requests[slot as usize];
        let index = req.next[pos];
        if index >= req.slices {
            return;
        }
        if req.failure.is_none() {
            let spec = &self.rails[rail.0 as usize].spec;
            req.failure = Some(Box::new(FailureInfo {
                slice: index,
                offset: u64::from(index) * req.slice,
                rail: Some(rail),
                path: spec.path,
                nic: spec.nic.map(orbitte_topology::NicId),
                status: SliceFailure::RailDown(reason.clone()),
                chunk: None,
            }));
        }
        req.abandoned = true;
        self.check_finished(now, slot);
    }

    /// Logically cancels a request: its outcome (status `Cancelled`) is
    /// made now, unposted slices are never posted, posted ones stay
    /// undrained until reported. Returns false when the request already
    /// had its outcome (or is unknown).
    pub fn cancel(&mut self, now: Instant, id: RequestId) -> bool {
        let (slot, generation) = split(id.0);
        match self.requests.get(slot as usize) {
            Some(r) if r.generation == generation && r.live && !r.finished => {}
            _ => return false,
        }
        self.finish(now, slot, Status::Cancelled);
        self.check_finished(now, slot);
        true
    }

    /// The earliest instant at which [`handle_timeout`](Self::handle_timeout)
    /// has something to do.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(d) = self.timers.peek() {
            let req = &self.requests[d.slot as usize];
            let stale = req.generation != d.generation
                || !req.live
                || match d.kind {
                    TimerKind::Request => req.finished,
                    TimerKind::Drain => req.outstanding == 0,
                };
            if stale {
                self.timers.pop(d.kind);
                continue;
            }
            return Some(d.at);
        }
        None
    }

    /// Expires request and drain deadlines up to `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(Deadline {
            at,
            kind,
            slot,
            generation,
        }) = self.timers.peek()
        {
            if at > now {
                break;
            }
            self.timers.pop(kind);
            let req = &self.requests[slot as usize];
            if req.generation != generation || !req.live {
                continue;
            }
            match kind {
                TimerKind::Request if !req.finished => {
                    self.finish(now, slot, Status::TimedOut);
                    self.check_finished(now, slot);
                }
                TimerKind::Drain if req.outstanding > 0 => {
                    // Flush every rail that holds one of its slices.
                    let rails = req.rails.clone();
                    for &rail in &rails {
                        let holds = self.rails[rail.0 as usize].fifo.iter().any(|t| {
                            let (s, _) = split(*t);
                            let sl = &self.slices[s as usize];
                            sl.req == slot && sl.req_gen == generation
                        });
                        let r = &mut self.rails[rail.0 as usize];
                        if holds && !r.flush_requested {
                            r.flush_requested = true;
                            self.flush.push_back(rail);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// Next finished request.
    pub fn poll_outcome(&mut self) -> Option<Outcome> {
        self.outcomes.pop_front()
    }

    /// Next rail the driver must flush (a drain deadline passed, or a busy
    /// rail was closed), with a *marker* token the core appended to the
    /// rail's ring. The rail is marked down: it takes no new work.
    ///
    /// The driver hands both to its transport's `flush_marked`: rdma moves the
    /// queue pair to the error state and then posts the marker as a
    /// signaled work request, which the NIC flushes (it never executes at
    /// the peer), so the marker's completion arrives after every earlier
    /// one and covers work requests that ran unsignaled without a later
    /// signaled one (a post that failed half way). Then report the marker's
    /// fate back: `Dropped` with
    /// [`marker_dropped`](Self::marker_dropped), `Released` with
    /// [`release_rail`](Self::release_rail).
    pub fn poll_flush(&mut self, now: Instant) -> Option<(RailId, SliceToken)> {
        let rail = self.flush.pop_front()?;
        self.rail_down(
            rail,
            "flushed: a request stayed undrained past the drain timeout, or the rail was closed"
                .into(),
            now,
        );
        let sidx = take_slice_slot(&mut self.slices, &mut self.free_slices);
        let s = &mut self.slices[sidx as usize];
        s.generation = s.generation.wrapping_add(1);
        s.state = SliceState::Marker;
        s.rail = rail.0;
        let token = token_of(sidx, s.generation);
        self.rails[rail.0 as usize].fifo.push_back(token.0);
        Some((rail, token))
    }

    /// The transport did not post the flush marker (it reports every item
    /// individually): forget it.
    pub fn marker_dropped(&mut self, rail: RailId, marker: SliceToken) {
        let Some(r) = self.rails.get_mut(rail.0 as usize) else {
            return;
        };
        if let Some(pos) = r.fifo.iter().position(|t| *t == marker.0) {
            r.fifo.remove(pos);
            let (sidx, _) = split(marker.0);
            self.free_slice(sidx);
        }
    }

    /// The transport released everything still outstanding on the rail
    /// (rdma: the queue pair was destroyed, so the NIC no longer touches
    /// the buffers). Unreported slices count as flushed and drained.
    pub fn release_rail(&mut self, now: Instant, rail: RailId) {
        let Some(r) = self.rails.get_mut(rail.0 as usize) else {
            return;
        };
        let fifo = std::mem::take(&mut r.fifo);
        for t in fifo {
            let (sidx, _) = split(t);
            self.finish_slice(now, sidx, SliceStatus::Failed(SliceFailure::Flushed), true);
        }
    }

    /// Whether the request's local bytes are free again. Unknown or freed
    /// ids are drained.
    pub fn drain_status(&self, id: RequestId) -> DrainStatus {
        let (slot, generation) = split(id.0);
        match self.requests.get(slot as usize) {
            Some(r) if r.generation == generation && r.live && r.outstanding > 0 => {
                DrainStatus::Pending {
                    slices: r.outstanding,
                }
            }
            _ => DrainStatus::Drained,
        }
    }

    /// The rails of a request that has no outcome yet.
    pub fn pending_rails(&self, id: RequestId) -> Option<&[RailId]> {
        let (slot, generation) = split(id.0);
        self.requests
            .get(slot as usize)
            .filter(|r| r.generation == generation && r.live && !r.finished)
            .map(|r| &r.rails[..])
    }

    /// Whether the request still has no outcome.
    pub fn is_pending(&self, id: RequestId) -> bool {
        let (slot, generation) = split(id.0);
        self.requests
            .get(slot as usize)
            .is_some_and(|r| r.generation == generation && r.live && !r.finished)
    }
}

/// A free slice slot: a reused one, or a new one while the slab grows to
/// its high-water mark. (Takes the two fields, not the core, so that
/// `poll_work` can call it while it holds a rail and a request.)
fn take_slice_slot(slices: &mut Vec<SliceSlot>, free: &mut Vec<u32>) -> u32 {
    match free.pop() {
        Some(s) => s,
        None => {
            slices.push(SliceSlot {
                generation: 0,
                state: SliceState::Free,
                req: 0,
                req_gen: 0,
                index: 0,
                rail: 0,
                len: 0,
            });
            (slices.len() - 1) as u32
        }
    }
}

#[cfg(test)]
mod tests;
