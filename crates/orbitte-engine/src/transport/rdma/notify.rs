//! Notifications on the rdma path: a SEND on the rail's RC queue pair into
//! a receive the peer posted in advance, through the rail's slots
//! ([`RailNotify`](super::slots::RailNotify)).
//!
//! A received notification is decoded, queued in the engine's inbox
//! tagged with the rail's peer (source id and epoch, from the handshake),
//! or refused (see the inbox), and answered with a `notification-answer`
//! SEND on the same queue pair; its slot is posted again at once, so a
//! slow reader never stalls the queue pair. A received answer becomes a
//! [`TransportEvent::NotificationAnswered`]. A frame sent while every send
//! slot is busy waits in the rail's backlog and goes out when a SEND
//! completes. Notifications larger than
//! [`RDMA_MAX_NOTIFICATION_LEN`](crate::notify::RDMA_MAX_NOTIFICATION_LEN)
//! are refused here (the slots are posted in advance at that size).

use std::sync::Arc;
use std::time::Instant;

use orbitte_verbs::{self as verbs, WcStatus};
use orbitte_wire as wire;

use super::slots::{BACKLOG, RECV, RECV_SLOTS, SEND_SLOTS, SLOT};
use super::{RailQp, RdmaRail, RdmaTransport};
use crate::notify::ReceivedNotification;
use crate::notify::inbox::Inbox;
use crate::transport::{NotifyError, PathKind, RailId, TransportEvent};

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
    if frame.len() > SLOT {
        return Err(refuse(format!(
            "a notification of {} bytes is larger than the {} bytes the rdma path carries \
             (its receive slots): send it on a tcp or local rail, or put the bulk in registered \
             memory and notify its place",
            frame.len().saturating_sub(wire::NOTIFICATION_OVERHEAD),
            crate::notify::RDMA_MAX_NOTIFICATION_LEN
        )));
    }
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
/// rdma poller calls it for every completion [`is_notification_wr`](super::slots::is_notification_wr)
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
            receive(
                rails,
                sender(),
                inbox,
                rail,
                slot,
                c.byte_len as usize,
                events,
            );
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
    let mut failed = None;
    while let Some(frame) = n.backlog.front().cloned() {
        match n.post_send(qp, &frame) {
            Ok(true) => {
                n.backlog.pop_front();
            }
            Ok(false) => break,
            Err(e) => {
                tracing::warn!(rail = rail.0, error = %e, dropped = n.backlog.len(), "notification SEND failed; the waiting ones are dropped");
                n.backlog.clear();
                failed = Some(e);
                break;
            }
        }
    }
    // The notifications and answers dropped are reported through the rail
    // going down (their senders' batches become unconfirmed).
    if let Some(e) = failed {
        drop(guard);
        rails.mark_failed(rail);
        events.push(TransportEvent::RailDown {
            rail,
            reason: format!("posting a notification SEND failed: {e}").into(),
        });
    }
}

/// Queues the notification received in `slot` from `from` (and answers
/// it) or reports the answer received there, and posts the slot again.
fn receive(
    rails: &mut RdmaTransport,
    from: Option<(String, wire::Epoch)>,
    inbox: &Inbox,
    rail: RailId,
    slot: usize,
    len: usize,
    events: &mut Vec<TransportEvent>,
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
    let mut reply = None;
    match (bytes.as_deref().map(wire::decode_exact), from) {
        (Ok(Ok((wire::Frame::Notification(note), _))), Some((source_id, epoch))) => {
            let notification_id = note.notification_id;
            let (verdict, limit) = inbox.push(
                ReceivedNotification {
                    source_id,
                    epoch,
                    path: PathKind::Rdma,
                    payload: note.payload,
                },
                now,
            );
            reply = wire::Frame::NotificationAnswer(wire::NotificationAnswer {
                notification_id,
                verdict,
                limit,
            })
            .to_bytes()
            .ok()
            .map(Arc::<[u8]>::from);
        }
        (Ok(Ok((wire::Frame::NotificationAnswer(answer), _))), _) => {
            events.push(TransportEvent::NotificationAnswered { rail, answer });
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
    if let Some(frame) = reply
        && let Err(e) = send(Some(r), rail, &frame)
    {
        // The sender would wait for this answer until its rail goes down:
        // take the rail down now.
        drop(guard);
        rails.mark_failed(rail);
        events.push(TransportEvent::RailDown {
            rail,
            reason: format!("answering a notification failed: {e}").into(),
        });
    }
}
