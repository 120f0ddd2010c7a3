//! Notifying batches: whose outcomes are held, whether the notification
//! goes out, and on which rails the driver tries to send it.
//!
//! The order a driver follows: after admitting a batch that carries a
//! notification, [`EngineState::track_notification`]; after each pump,
//! [`EngineState::collect_outcomes`], then every
//! [`EngineState::poll_transmit`] handed to a transport (the first of its
//! rails that takes it) and answered with
//! [`EngineState::notification_sent`]. The batch's outcomes come out only
//! with that answer, stamped with what happened.

use std::sync::Arc;

use orbitte_wire as wire;

use super::EngineState;
use super::notifications::{Sending, Transmit};
use crate::notification::NotificationStatus;
use crate::notification::tracker::{Resolved, Step, Verdict};
use crate::outcome::RequestId;
use crate::registration::Resources;

impl<R: Resources> EngineState<R> {
    /// Tracks the admitted batch `requests` (in submission order) that
    /// carries `armed`: their outcomes are held until the last one is made.
    pub fn track_notification(
        &mut self,
        requests: &[RequestId],
        armed: crate::notification::Armed,
    ) {
        let n = &mut self.notifications.tracker;
        let id = n.next_id();
        let (peer, bytes, rails) = armed.into_parts();
        let frame = wire::Frame::Notification(wire::Notification {
            notification_id: id,
            payload: bytes,
        });
        // Cannot fail: the payload length was checked against the bound
        // (an empty frame is reported as not sent at resolution).
        let frame: Arc<[u8]> = match frame.to_bytes() {
            Ok(b) => b.into(),
            Err(e) => {
                tracing::error!(error = %e, "encoding a notification failed");
                Arc::from(&[][..])
            }
        };
        n.track(id, requests, peer, rails, frame);
    }

    /// Moves the core's outcomes to those not taken yet
    /// ([`take_outcome`](Self::take_outcome)), holding
    /// those of notifying batches until their batch resolves. A batch
    /// whose every request completed and that still has a usable rail
    /// becomes a [`Transmit`] ([`poll_transmit`](Self::poll_transmit)); any
    /// other resolved batch comes out at once, `NotSent` with the reason.
    pub fn collect_outcomes(&mut self) {
        if !self.notifications.tracker.tracks_any() {
            // No notifying batch in flight (the common case): straight to
            // the table, without moving each outcome through the tracker.
            while let Some(o) = self.core.poll_outcome() {
                self.outcomes.insert(o.request, o);
            }
            return;
        }
        while let Some(o) = self.core.poll_outcome() {
            match self.notifications.tracker.on_outcome(o) {
                Step::Release(o) => self.outcomes.insert(o.request, o),
                Step::Held => {}
                Step::Resolved(r) => self.resolve(r),
            }
        }
    }

    /// The next notification for the driver to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.notifications.transmits.pop_front()
    }

    /// What became of [`Transmit`] `id`: `Ok` when a rail took it, else
    /// why each rail refused. Releases the batch's outcomes, stamped.
    pub fn notification_sent(&mut self, id: u64, result: Result<(), Vec<String>>) {
        let Some(s) = self.notifications.sending.remove(&id) else {
            return;
        };
        let status = match result {
            Ok(()) => NotificationStatus::Sent,
            Err(refused) => not_sent(s.skipped.into_iter().chain(refused).collect()),
        };
        self.release_batch(s.outcomes, status);
    }

    /// Decides a resolved batch: withheld, nowhere to send, or a transmit.
    fn resolve(&mut self, r: Resolved) {
        match &r.verdict {
            Verdict::Withhold(why) => {
                let status = NotificationStatus::NotSent { why: why.clone() };
                return self.release_batch(r, status);
            }
            Verdict::Send if r.frame.is_empty() => {
                let status = NotificationStatus::NotSent {
                    why: "the notification could not be encoded".into(),
                };
                return self.release_batch(r, status);
            }
            Verdict::Send => {}
        }
        let Some(current) = self.tables.peers.get(&r.peer.0).map(|p| &p.rails) else {
            let why = format!(
                "peer {} is gone (closed, or replaced by a newer epoch)",
                r.peer.0
            );
            return self.release_batch(r, NotificationStatus::NotSent { why: why.into() });
        };
        let mut skipped = Vec::new();
        let mut rails = Vec::new();
        for &rail in &r.rails {
            if !current.contains(&rail) {
                skipped.push(format!("rail {} was closed", rail.0));
            } else if !self.core.rail_is_up(rail) {
                let reason = self
                    .core
                    .rail_down_reason(rail)
                    .unwrap_or_else(|| "down".into());
                skipped.push(format!("rail {} down: {reason}", rail.0));
            } else {
                rails.push(rail);
            }
        }
        if rails.is_empty() {
            return self.release_batch(r, not_sent(skipped));
        }
        self.notifications.transmits.push_back(Transmit {
            id: r.id,
            rails,
            frame: r.frame.clone(),
        });
        self.notifications.sending.insert(
            r.id,
            Sending {
                skipped,
                outcomes: r,
            },
        );
    }

    fn release_batch(&mut self, r: Resolved, status: NotificationStatus) {
        tracing::debug!(
            notification = r.id,
            peer = r.peer.0,
            ?status,
            "notifying batch resolved"
        );
        for o in r.stamp(&status) {
            self.outcomes.insert(o.request, o);
        }
    }
}

/// `NotSent` with every reason, in order.
fn not_sent(mut why: Vec<String>) -> NotificationStatus {
    if why.is_empty() {
        why.push("the batch had no rails".into());
    }
    NotificationStatus::NotSent {
        why: why.join("; ").into(),
    }
}
