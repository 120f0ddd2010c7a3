//! Notifications on the rdma path: a SEND on the rail's RC queue pair into
//! a receive the peer posted in advance.
//!
//! Every rdma rail owns one small buffer, registered local-only on its NIC:
//! [`RECV_SLOTS`] receive slots, each posted as a receive work request, and
//! [`SEND_SLOTS`] send slots. A slot holds one encoded `notification` frame
//! (at most [`wire::MAX_NOTIFICATION_FRAME_LEN`] bytes). A received frame is
//! decoded, queued in the engine's inbox tagged with the rail's peer
//! (source id and epoch, from the handshake), and its slot is posted again
//! at once, so a slow reader never stalls the queue pair (the queue
//! refuses instead; see the inbox). A notification sent while every send
//! slot is busy waits in the rail's backlog and goes out when a SEND
//! completes.
//!
//! Work request ids of these SENDs and receives carry [`WR_TAG`] in their
//! upper bits: their slot part is never a slot of the core's slice slab,
//! so the core can never mistake them for a slice.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use orbitte_memory::{DmaBuffer, HostMemory};
use orbitte_verbs::qp_state::Rts;
use orbitte_verbs::{self as verbs, QueuePair, RecvWr, SendOp, SendWr, Sge, WcStatus};
use orbitte_wire as wire;

use super::{RailQp, RdmaRail, RdmaTransport};
use crate::notify::ReceivedNotification;
use crate::notify::inbox::Inbox;
use crate::transport::{NotifyError, PathKind, RailId, TransportEvent};

/// Receive slots posted per rail (the queue pair's receive queue depth).
pub(crate) const RECV_SLOTS: usize = 16;
/// SENDs in flight per rail (added to the send queue depth).
pub(crate) const SEND_SLOTS: usize = 4;
/// Most notifications waiting for a send slot on one rail.
const BACKLOG: usize = 1024;
/// Bytes per slot: one encoded frame, rounded up to a cache line.
const SLOT: usize = wire::MAX_NOTIFICATION_FRAME_LEN.div_ceil(64) * 64;

const WR_TAG: u64 = 0xffff_ffff_ffff_0000;
const RECV: u64 = 0x100;
const SEND: u64 = 0x200;

/// Whether a work completion belongs to a notification SEND or receive.
pub(crate) fn is_notification_wr(wr_id: u64) -> bool {
    wr_id & WR_TAG == WR_TAG
}

/// A rail's notification buffer and send state.
#[derive(Debug)]
pub(crate) struct RailNotify {
    memory: Arc<HostMemory>,
    /// Invariant: `Some` until the rail's queue pair is destroyed.
    mr: Option<verbs::MemoryRegion>,
    send_busy: [bool; SEND_SLOTS],
    backlog: VecDeque<Arc<[u8]>>,
}

impl RailNotify {
    /// Registers the buffer on `pd` and posts every receive slot on `qp`.
    pub(crate) fn prepare(
        pd: &verbs::ProtectionDomain,
        qp: &mut QueuePair<Rts>,
    ) -> Result<Self, String> {
        let len = SLOT * (RECV_SLOTS + SEND_SLOTS);
        let memory = HostMemory::alloc(len).map_err(|e| e.to_string())?;
        let buf: Arc<dyn DmaBuffer> = memory.clone();
        let mr = pd
            .register(buf, 0..len, verbs::Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        let mut n = Self {
            memory,
            mr: Some(mr),
            send_busy: [false; SEND_SLOTS],
            backlog: VecDeque::new(),
        };
        for slot in 0..RECV_SLOTS {
            if let Err(e) = n.post_recv(qp, slot) {
                // The queue pair keeps what was posted; release the rest
                // when the rail is destroyed.
                return Err(format!("posting notification receive {slot} failed: {e}"));
            }
        }
        Ok(n)
    }

    fn sge(&self, slot: usize, len: usize) -> Option<Sge> {
        let mr = self.mr.as_ref()?;
        Some(Sge::new(
            mr.addr() + (slot * SLOT) as u64,
            u32::try_from(len).ok()?,
            mr.lkey(),
        ))
    }

    fn post_recv(&mut self, qp: &mut QueuePair<Rts>, slot: usize) -> Result<(), String> {
        let sge = self.sge(slot, SLOT).ok_or("notification buffer released")?;
        qp.post_recv(&[RecvWr {
            wr_id: WR_TAG | RECV | slot as u64,
            sges: &[sge],
        }])
        .map_err(|e| e.to_string())
    }

    /// Posts `frame` as a SEND in a free slot; `Ok(false)` when none is.
    fn post_send(&mut self, qp: &mut QueuePair<Rts>, frame: &[u8]) -> Result<bool, String> {
        let Some(k) = self.send_busy.iter().position(|b| !b) else {
            return Ok(false);
        };
        let slot = RECV_SLOTS + k;
        self.memory
            .write_at(slot * SLOT, frame)
            .map_err(|e| e.to_string())?;
        let sge = self
            .sge(slot, frame.len())
            .ok_or("notification buffer released")?;
        qp.post_send(&[SendWr {
            wr_id: WR_TAG | SEND | k as u64,
            op: SendOp::Send { imm: None },
            sges: &[sge],
            signaled: true,
        }])
        .map_err(|e| e.to_string())?;
        self.send_busy[k] = true;
        Ok(true)
    }

    /// Deregisters the buffer (after the queue pair was destroyed). A
    /// failure keeps it retained by verbs and is returned as evidence.
    pub(crate) fn close(&mut self) -> Result<(), Box<verbs::Unquiesced>> {
        match self.mr.take() {
            Some(mr) => mr.close().map_err(Box::new),
            None => Ok(()),
        }
    }
}

/// Sends `frame` on the rail (or queues it behind the SENDs in flight).
pub(crate) fn send(
    r: Option<&mut RdmaRail>,
    rail: RailId,
    frame: &Arc<[u8]>,
) -> Result<(), NotifyError> {
    let refuse = |reason: String| NotifyError {
        rail,
        reason: reason.into(),
    };
    let Some(r) = r else {
        return Err(refuse("no such rdma rail".into()));
    };
    let RailQp::Rts(qp) = &mut r.qp else {
        return Err(refuse("queue pair is in the error state or closed".into()));
    };
    if r.failed {
        return Err(refuse("queue pair failed".into()));
    }
    let Some(n) = r.notify.as_mut() else {
        return Err(refuse("the rail has no notification buffer".into()));
    };
    if !n.backlog.is_empty() {
        if n.backlog.len() >= BACKLOG {
            return Err(refuse(format!(
                "{BACKLOG} notifications already wait for this rail"
            )));
        }
        n.backlog.push_back(frame.clone());
        return Ok(());
    }
    match n.post_send(qp, frame) {
        Ok(true) => Ok(()),
        Ok(false) => {
            n.backlog.push_back(frame.clone());
            Ok(())
        }
        Err(e) => Err(refuse(format!("posting the notification SEND failed: {e}"))),
    }
}

/// Handles a completion of a notification SEND or receive on `rail` (the
/// rdma poller calls it for every completion [`is_notification_wr`]
/// accepts); `sender` names the rail's peer (source id and epoch) for a
/// received notification.
pub(crate) fn on_completion(
    rails: &mut RdmaTransport,
    sender: impl FnOnce() -> Option<(String, wire::Epoch)>,
    inbox: &Inbox,
    rail: RailId,
    c: &verbs::Completion,
    events: &mut Vec<TransportEvent>,
) {
    let slot = (c.wr_id & 0xff) as usize;
    let recv = c.wr_id & RECV != 0;
    if !c.is_success() {
        if c.status != WcStatus::WrFlush {
            rails.mark_failed(rail);
            events.push(TransportEvent::RailDown {
                rail,
                reason: format!(
                    "qp {} in error after a {:?} completion of a notification {}",
                    c.qp_num,
                    c.status,
                    if recv { "receive" } else { "SEND" }
                )
                .into(),
            });
        }
        if let Some(mut r) = rails.rail_mut(rail)
            && let Some(n) = r.notify.as_mut()
            && !recv
            && slot < SEND_SLOTS
        {
            n.send_busy[slot] = false;
        }
        return;
    }
    if recv {
        if slot < RECV_SLOTS {
            receive(rails, sender(), inbox, rail, slot, c.byte_len as usize);
        }
        return;
    }
    let Some(mut guard) = rails.rail_mut(rail) else {
        return;
    };
    let r = &mut *guard;
    let (RailQp::Rts(qp), Some(n)) = (&mut r.qp, r.notify.as_mut()) else {
        return;
    };
    if slot < SEND_SLOTS {
        n.send_busy[slot] = false;
    }
    while let Some(frame) = n.backlog.front().cloned() {
        match n.post_send(qp, &frame) {
            Ok(true) => {
                n.backlog.pop_front();
            }
            Ok(false) => break,
            Err(e) => {
                tracing::warn!(rail = rail.0, error = %e, dropped = n.backlog.len(), "notification SEND failed; the waiting ones are dropped");
                n.backlog.clear();
                break;
            }
        }
    }
}

/// Queues the frame received in `slot` from `from` and posts the slot
/// again.
fn receive(
    rails: &mut RdmaTransport,
    from: Option<(String, wire::Epoch)>,
    inbox: &Inbox,
    rail: RailId,
    slot: usize,
    len: usize,
) {
    let Some(mut guard) = rails.rail_mut(rail) else {
        return;
    };
    let r = &mut *guard;
    let Some(n) = r.notify.as_mut() else {
        return;
    };
    let bytes = n.memory.to_vec(slot * SLOT, len.min(SLOT));
    let now = Instant::now();
    match (bytes.as_deref().map(wire::decode_exact), from) {
        (Ok(Ok((wire::Frame::Notification(note), _))), Some((source_id, epoch))) => {
            inbox.push(
                ReceivedNotification {
                    source_id,
                    epoch,
                    path: PathKind::Rdma,
                    payload: note.payload,
                },
                now,
            );
        }
        (Ok(Ok((_, _))), Some(_)) => {
            inbox.count_malformed();
            if let Some(left_out) = inbox.refusal_to_log(now) {
                tracing::warn!(
                    rail = rail.0,
                    left_out,
                    "a peer sent something other than a notification frame into a notification receive; dropped"
                );
            }
        }
        (Ok(Err(e)), _) => {
            inbox.count_malformed();
            if let Some(left_out) = inbox.refusal_to_log(now) {
                tracing::warn!(rail = rail.0, error = %e, left_out, "malformed notification from a peer dropped");
            }
        }
        (Err(e), _) => {
            tracing::error!(rail = rail.0, error = %e, "reading a notification receive slot failed")
        }
        (_, None) => tracing::debug!(
            rail = rail.0,
            "notification on a rail of a peer that is gone dropped"
        ),
    }
    if let RailQp::Rts(qp) = &mut r.qp
        && let Err(e) = n.post_recv(qp, slot)
    {
        tracing::warn!(rail = rail.0, error = %e, "reposting a notification receive failed");
    }
}
