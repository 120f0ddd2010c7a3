//! The rdma path: rails are RC queue pairs; work items become RDMA READ and
//! WRITE work requests, one doorbell per run, selectively signaled.
//!
//! Completion side (the per-context poller in the engine) turns verbs work
//! completions into [`TransportEvent`]s: a completion's `wr_id` is the
//! slice token; success of a signaled request implies the unsignaled ones
//! before it on the same QP (RC ordering); any error completion means the
//! QP is in the error state, so the rail is reported down and every later
//! request flushes individually (verbs flush semantics).

pub(crate) mod notify;
pub(crate) mod qp;
pub(crate) mod slots;

use std::sync::{Arc, Mutex, MutexGuard};

use orbitte_verbs::qp_state::{Errored, Rts};
use orbitte_verbs::{self as verbs, QueuePair, RemoteAddr, SendOp, SendWr, Sge, WcStatus};

use crate::transport::{
    CleanupError, MarkerFate, Op, PathKind, PeerId, PostContext, PostError, RailId, RangeId,
    RegistrationId, SliceFailure, SliceStatus, SliceToken, Transport, TransportEvent, WorkItem,
};

/// A rail's queue pair in whatever state it is.
#[derive(Debug)]
pub(crate) enum RailQp {
    Rts(QueuePair<Rts>),
    Errored(QueuePair<Errored>),
    Closed,
}

#[derive(Debug)]
pub(crate) struct RdmaRail {
    pub(crate) nic: u32,
    pub(crate) remote_nic: u16,
    pub(crate) qp: RailQp,
    pub(crate) device: String,
    /// The device reported the QP in the error state (an error or flush
    /// completion, a fatal event): it never carries work again.
    pub(crate) failed: bool,
    /// Notification receive and send slots (`None`: the rail carries no
    /// notifications; preparing them failed).
    pub(crate) notify: Option<slots::RailNotify>,
}

impl RdmaRail {
    /// The queue pair number, unless destroyed.
    pub(crate) fn qpn(&self) -> Option<u32> {
        match &self.qp {
            RailQp::Rts(q) => Some(q.qp_num()),
            RailQp::Errored(q) => Some(q.qp_num()),
            RailQp::Closed => None,
        }
    }
}

/// A rail behind its own lock, with the buffers posting to it reuses.
#[derive(Debug)]
pub(crate) struct RailCell {
    rail: RdmaRail,
    sges: Vec<Sge>,
    wrs: Vec<SendWr<'static>>,
    remotes: Vec<RemoteAddr>,
}

/// A locked rail.
pub(crate) struct RailGuard<'a>(MutexGuard<'a, RailCell>);

impl std::ops::Deref for RailGuard<'_> {
    type Target = RdmaRail;
    fn deref(&self) -> &RdmaRail {
        &self.0.rail
    }
}

impl std::ops::DerefMut for RailGuard<'_> {
    fn deref_mut(&mut self) -> &mut RdmaRail {
        &mut self.0.rail
    }
}

/// Locks a rail's cell (a poisoned lock is taken as is: the queue pair's
/// state is still whatever verbs says it is).
pub(crate) fn lock_cell(cell: &Mutex<RailCell>) -> MutexGuard<'_, RailCell> {
    cell.lock().unwrap_or_else(|e| e.into_inner())
}

/// The rdma transport: every rdma rail owns its queue pair behind its own
/// lock, so a thread posts to one rail while others post to other rails
/// or use the engine's state.
#[derive(Debug, Default)]
pub(crate) struct RdmaTransport {
    rails: Vec<Option<Arc<Mutex<RailCell>>>>,
    /// Destroys that failed (the QP is retained by verbs).
    pub(crate) unquiesced: Mutex<Vec<verbs::Unquiesced>>,
}

/// Reuses a vector's allocation for another lifetime (in-place collect of
/// an empty vector; no unsafe, no allocation).
#[allow(clippy::unnecessary_filter_map)] // the closure changes the lifetime; `filter` cannot
fn recycle<'b>(mut v: Vec<SendWr<'_>>) -> Vec<SendWr<'b>> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

fn flush_failure(device: &str, rail: RailId, e: impl std::fmt::Display) -> CleanupError {
    CleanupError {
        object: format!("qp of rail {}", rail.0),
        device: device.to_owned(),
        error: e.to_string(),
    }
}

impl RdmaTransport {
    /// Adds the rail, or replaces what the rail holds (under its lock, so
    /// after any post still running on it).
    pub(crate) fn insert(&mut self, rail: RailId, r: RdmaRail) {
        let i = rail.0 as usize;
        if self.rails.len() <= i {
            self.rails.resize_with(i + 1, || None);
        }
        match &self.rails[i] {
            Some(cell) => lock_cell(cell).rail = r,
            None => {
                self.rails[i] = Some(Arc::new(Mutex::new(RailCell {
                    rail: r,
                    sges: Vec::new(),
                    wrs: Vec::new(),
                    remotes: Vec::new(),
                })));
            }
        }
    }

    /// The rail's cell, for posting to it without the engine's state.
    pub(crate) fn cell(&self, rail: RailId) -> Option<Arc<Mutex<RailCell>>> {
        self.rails.get(rail.0 as usize).and_then(Option::clone)
    }

    /// The rail, locked.
    pub(crate) fn rail(&self, rail: RailId) -> Option<RailGuard<'_>> {
        self.rails
            .get(rail.0 as usize)
            .and_then(Option::as_ref)
            .map(|c| RailGuard(lock_cell(c)))
    }

    /// The rail, locked, to change it.
    pub(crate) fn rail_mut(&mut self, rail: RailId) -> Option<RailGuard<'_>> {
        self.rail(rail)
    }

    /// Rails on a NIC.
    pub(crate) fn rails_on(&self, nic: u32) -> Vec<RailId> {
        self.rails
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                r.as_ref()
                    .filter(|c| lock_cell(c).rail.nic == nic)
                    .map(|_| RailId(i as u32))
            })
            .collect()
    }

    /// Whether the rail's QP is still ready to send.
    pub(crate) fn is_rts(&self, rail: RailId) -> bool {
        self.rail(rail)
            .is_some_and(|r| !r.failed && matches!(r.qp, RailQp::Rts(_)))
    }

    /// Records that the device put the rail's QP in the error state.
    pub(crate) fn mark_failed(&mut self, rail: RailId) {
        if let Some(mut r) = self.rail(rail) {
            r.failed = true;
        }
    }

    /// Keeps a failed destroy as evidence (`unquiesced`).
    fn record_unquiesced(&self, e: &verbs::Unquiesced) {
        self.unquiesced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e.clone());
    }

    /// Destroys the rail's QP; a failure is kept as evidence and returned.
    pub(crate) fn destroy(&self, rail: RailId) -> Result<(), Box<verbs::Unquiesced>> {
        let Some(mut r) = self.rail(rail) else {
            return Ok(());
        };
        let res = r.destroy();
        drop(r);
        if let Err(e) = &res {
            self.record_unquiesced(e);
        }
        res
    }

    /// Every rail id with a QP not yet destroyed.
    pub(crate) fn live_rails(&self) -> Vec<RailId> {
        self.rails
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                r.as_ref()
                    .filter(|c| !matches!(lock_cell(c).rail.qp, RailQp::Closed))
                    .map(|_| RailId(i as u32))
            })
            .collect()
    }
}

impl RdmaRail {
    /// Destroys the queue pair, then the notification buffer.
    fn destroy(&mut self) -> Result<(), Box<verbs::Unquiesced>> {
        let mut res = match std::mem::replace(&mut self.qp, RailQp::Closed) {
            RailQp::Rts(qp) => qp.close(),
            RailQp::Errored(qp) => qp.close(),
            RailQp::Closed => Ok(()),
        };
        // The notification buffer goes after its queue pair (which may
        // still write into it until it is destroyed).
        if res.is_ok()
            && let Some(n) = self.notify.as_mut()
        {
            res = n.close().map_err(|e| *e);
        }
        res.map_err(Box::new)
    }

    /// Moves the queue pair to the error state (see [`Transport::flush`]).
    fn flush(&mut self, rail: RailId) -> Result<(), CleanupError> {
        match std::mem::replace(&mut self.qp, RailQp::Closed) {
            RailQp::Rts(qp) => match qp.into_error() {
                Ok(e) => {
                    self.qp = RailQp::Errored(e);
                    Ok(())
                }
                Err(t) => {
                    let err = flush_failure(&self.device, rail, &t.error);
                    self.qp = RailQp::Rts(t.qp);
                    Err(err)
                }
            },
            other => {
                self.qp = other;
                Ok(())
            }
        }
    }
}

/// Converts one work completion of a rail into events. Returns whether the
/// completion shows the QP in the error state.
pub(crate) fn completion_events(
    rail: RailId,
    c: &verbs::Completion,
    out: &mut Vec<TransportEvent>,
) -> bool {
    let status = match c.status {
        WcStatus::Success => SliceStatus::Success,
        WcStatus::WrFlush => SliceStatus::Failed(SliceFailure::Flushed),
        other => SliceStatus::Failed(SliceFailure::Completion {
            status: format!("{other:?} (vendor error {:#x})", c.vendor_err).into(),
            code: other.as_raw(),
        }),
    };
    let error = !matches!(c.status, WcStatus::Success | WcStatus::WrFlush);
    out.push(TransportEvent::Completed {
        rail,
        token: SliceToken(c.wr_id),
        status,
        released: true,
    });
    if error {
        let reason: Arc<str> =
            format!("qp {} in error after a {:?} completion", c.qp_num, c.status).into();
        out.push(TransportEvent::RailDown { rail, reason });
    }
    error
}

impl RailCell {
    /// Posts `items` to the rail's queue pair as one batch (see
    /// [`Transport::post`]).
    pub(crate) fn post(
        &mut self,
        rail: RailId,
        items: &[WorkItem],
        ctx: &dyn PostContext,
    ) -> Result<(), PostError> {
        let fail = |posted: usize, reason: String| PostError {
            rail,
            posted,
            reason: reason.into(),
        };
        let Self {
            rail: r,
            sges,
            wrs,
            remotes,
        } = self;
        let RailQp::Rts(qp) = &mut r.qp else {
            return Err(fail(
                0,
                format!(
                    "queue pair of rail {} is in the error state or closed",
                    rail.0
                ),
            ));
        };
        sges.clear();
        // Resolve keys; runs usually share registration and range, so cache
        // the last lookup of each.
        let mut last_local: Option<(RegistrationId, u64, u32)> = None;
        let mut last_remote: Option<(PeerId, RangeId, u64, u32)> = None;
        let mut resolved = items.len();
        remotes.clear();
        for (i, w) in items.iter().enumerate() {
            let (laddr, lkey) = match last_local {
                Some((reg, a, k)) if reg == w.registration => (a, k),
                _ => match ctx.local_key(w.registration, r.nic) {
                    Some((a, k)) => {
                        last_local = Some((w.registration, a, k));
                        (a, k)
                    }
                    None => {
                        resolved = i;
                        break;
                    }
                },
            };
            let (raddr, rkey) = match last_remote {
                Some((p, g, a, k)) if p == w.peer && g == w.range => (a, k),
                _ => {
                    let found = ctx.remote_range(w.peer, w.range).and_then(|d| {
                        d.rkeys
                            .iter()
                            .find(|k| k.nic_id.0 == r.remote_nic)
                            .map(|k| (d.address, k.rkey))
                    });
                    match found {
                        Some((a, k)) => {
                            last_remote = Some((w.peer, w.range, a, k));
                            (a, k)
                        }
                        None => {
                            resolved = i;
                            break;
                        }
                    }
                }
            };
            sges.push(Sge::new(laddr + w.local_offset, w.len, lkey));
            remotes.push(RemoteAddr {
                addr: raddr + w.remote_offset,
                rkey,
            });
        }
        let mut batch = recycle(std::mem::take(wrs));
        for (i, w) in items[..resolved].iter().enumerate() {
            let remote = remotes[i];
            let op = match w.op {
                Op::Write => SendOp::Write { remote, imm: None },
                Op::Read => SendOp::Read { remote },
            };
            batch.push(SendWr {
                wr_id: w.token.0,
                op,
                sges: &sges[i..i + 1],
                signaled: w.signaled,
            });
        }
        let res = if batch.is_empty() {
            Ok(())
        } else {
            qp.post_send(&batch)
        };
        *wrs = recycle(batch);
        match res {
            Err(e) => Err(fail(e.index.min(resolved), e.to_string())),
            Ok(()) if resolved < items.len() => Err(fail(
                resolved,
                "local or remote keys not found (registration retired or peer replaced)".into(),
            )),
            Ok(()) => Ok(()),
        }
    }

    /// [`RdmaTransport::flush_with_marker`] on the locked rail.
    pub(crate) fn flush_with_marker(
        &mut self,
        rail: RailId,
        marker: SliceToken,
    ) -> Result<MarkerFate, Box<verbs::Unquiesced>> {
        let r = &mut self.rail;
        // The queue pair goes to the error state first, then the marker (a
        // signaled zero-length WRITE) is posted to it: work posted to a QP
        // in the error state completes with a flush after every earlier
        // work request and never executes (as the kernel's ib_drain_sq), so
        // a healthy peer never sees the marker. A QP that cannot be moved
        // to error gets no marker: it is destroyed below.
        if let Err(e) = r.flush(rail) {
            tracing::warn!(
                error = %e,
                "moving a rail's queue pair to error failed; destroying it"
            );
        }
        let posted = match &mut r.qp {
            RailQp::Errored(qp) => {
                let wr = SendWr {
                    wr_id: marker.0,
                    op: SendOp::Write {
                        remote: RemoteAddr { addr: 0, rkey: 0 },
                        imm: None,
                    },
                    sges: &[],
                    signaled: true,
                };
                match qp.post_send(&[wr]) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(
                            error = %e,
                            "posting a rail's flush marker failed; destroying its queue pair"
                        );
                        false
                    }
                }
            }
            _ => false,
        };
        if posted {
            return Ok(MarkerFate::Posted);
        }
        // No marker possible: destroy the queue pair, after which the NIC
        // touches none of its buffers; everything outstanding is released.
        r.destroy().map(|()| MarkerFate::Released)
    }
}

impl Transport for RdmaTransport {
    fn path(&self) -> PathKind {
        PathKind::Rdma
    }

    fn post(
        &self,
        rail: RailId,
        items: &[WorkItem],
        ctx: &dyn PostContext,
    ) -> Result<(), PostError> {
        match self.rails.get(rail.0 as usize).and_then(Option::as_ref) {
            Some(c) => lock_cell(c).post(rail, items, ctx),
            None => Err(PostError {
                rail,
                posted: 0,
                reason: "no such rdma rail".into(),
            }),
        }
    }

    fn flush(&self, rail: RailId) -> Result<(), CleanupError> {
        self.rail(rail).map_or(Ok(()), |mut r| r.flush(rail))
    }

    fn flush_marked(&self, rail: RailId, marker: SliceToken) -> Result<MarkerFate, CleanupError> {
        let device = self
            .rail(rail)
            .map(|r| r.device.clone())
            .unwrap_or_default();
        self.flush_with_marker(rail, marker)
            .map_err(|e| flush_failure(&device, rail, e))
    }

    fn close_rail(&self, rail: RailId) -> Result<(), CleanupError> {
        let device = self
            .rail(rail)
            .map(|r| r.device.clone())
            .unwrap_or_default();
        self.destroy(rail)
            .map_err(|e| flush_failure(&device, rail, e))
    }
}

impl RdmaTransport {
    /// [`Transport::flush_marked`] keeping the native evidence: when the
    /// queue pair has to be destroyed and that fails, the error is the
    /// verbs `Unquiesced` (the QP is retained by verbs), which the engine
    /// records as its own `Unquiesced` and fences on.
    pub(crate) fn flush_with_marker(
        &self,
        rail: RailId,
        marker: SliceToken,
    ) -> Result<MarkerFate, Box<verbs::Unquiesced>> {
        let Some(c) = self.rails.get(rail.0 as usize).and_then(Option::as_ref) else {
            return Ok(MarkerFate::Released);
        };
        let res = lock_cell(c).flush_with_marker(rail, marker);
        if let Err(e) = &res {
            self.record_unquiesced(e);
        }
        res
    }
}
