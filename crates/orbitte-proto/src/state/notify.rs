//! Notifying batches: whose outcomes are held, whether the notification
//! goes out, and on which rails the driver tries to send it.
//!
//! The order a driver follows: after admitting a batch that carries a
//! notification, [`EngineState::track_notification`]; after each pump,
//! [`EngineState::collect_outcomes`], then every
//! [`EngineState::poll_transmit`] handed to a transport (the first of its
//! rails that takes it) and answered with
//! [`EngineState::notification_sent`]. A rail that took it waits for the
//! target's `notification-answer` (a
//! [`TransportEvent::NotificationAnswered`](crate::TransportEvent::NotificationAnswered)
//! fed to `handle_event`): queued (`Sent`) or refused (`Refused`); a rail
//! that goes down or is closed first makes it `Unconfirmed`. The batch's
//! outcomes come out only then, stamped with what happened.

use std::sync::Arc;

use orbitte_wire as wire;

use super::EngineState;
use super::notifications::{Sending, Transmit};
use crate::RailId;
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

    /// What became of [`Transmit`] `id`: `Ok` with the rail that took it
    /// (the batch then waits for the target's answer on that rail), else
    /// why each rail refused (the batch's outcomes are released, stamped
    /// `NotSent`).
    pub fn notification_sent(&mut self, id: u64, result: Result<RailId, Vec<String>>) {
        match result {
            Ok(rail) => {
                if let Some(s) = self.notifications.sending.get_mut(&id) {
                    s.awaiting = Some(rail);
                }
            }
            Err(refused) => {
                let Some(s) = self.notifications.sending.remove(&id) else {
                    return;
                };
                let status = not_sent(s.skipped.into_iter().chain(refused).collect());
                self.release_batch(s.outcomes, status);
            }
        }
    }

    /// The target's answer to a notification, on `rail`: releases its
    /// batch's outcomes, `Sent` or `Refused`. An answer that names no
    /// notification waiting on that rail is ignored.
    pub(super) fn notification_answered(&mut self, rail: RailId, answer: wire::NotificationAnswer) {
        let id = answer.notification_id;
        let waits = self
            .notifications
            .sending
            .get(&id)
            .is_some_and(|s| s.awaiting == Some(rail));
        let Some(s) = waits
            .then(|| self.notifications.sending.remove(&id))
            .flatten()
        else {
            tracing::debug!(
                rail = rail.0,
                notification = id,
                "answer to no notification waiting on this rail ignored"
            );
            return;
        };
        let status = if answer.verdict.is_queued() {
            NotificationStatus::Sent
        } else {
            NotificationStatus::Refused {
                why: refusal(answer).into(),
            }
        };
        self.release_batch(s.outcomes, status);
    }

    /// `rail` went down or was closed: the notifications waiting for an
    /// answer on it are `Unconfirmed`.
    pub(super) fn unanswered_on(&mut self, rail: RailId, reason: &str) {
        let gone: Vec<u64> = self
            .notifications
            .sending
            .iter()
            .filter(|(_, s)| s.awaiting == Some(rail))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some(s) = self.notifications.sending.remove(&id) {
                let why = format!(
                    "rail {} went down before the target answered ({reason}): the notification \
                     may or may not have been queued",
                    rail.0
                );
                self.release_batch(
                    s.outcomes,
                    NotificationStatus::Unconfirmed { why: why.into() },
                );
            }
        }
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
                awaiting: None,
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

/// What a refusal says: the bound the target named, and the fix.
fn refusal(a: wire::NotificationAnswer) -> String {
    let held = match a.verdict {
        wire::NotificationVerdict::INBOX_FULL => format!(
            "it holds {} unread notifications from this engine, as many as it keeps",
            a.limit
        ),
        wire::NotificationVerdict::BYTES_FULL => format!(
            "the unread notifications it holds from this engine, with this one, pass its budget \
             of {} bytes",
            a.limit
        ),
        wire::NotificationVerdict::TOTAL_FULL => format!(
            "the unread notifications it holds from all its senders, with this one, pass its \
             budget of {} bytes",
            a.limit
        ),
        wire::NotificationVerdict::NOT_KEPT => {
            return "the target refused the notification: it keeps no notifications (it serves \
                    memory only); send notifications to an engine that reads them"
                .into();
        }
        other => format!("its answer was {other}"),
    };
    format!(
        "the target refused the notification: {held}; the target's application must read its \
         notifications (notifications(), get_new_notifs(), get_notifies()), then send again"
    )
}
