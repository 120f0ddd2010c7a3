//! Which requests belong to a notifying batch, and what to do when the
//! batch's last request has its outcome: the decision, without I/O.
//!
//! `EngineState` feeds every outcome the core makes to
//! [`Tracker::on_outcome`]. Outcomes of requests outside notifying batches
//! come straight back ([`Step::Release`]); those of a notifying batch are
//! held until every request of the batch has one, and then come back
//! together with the verdict ([`Step::Resolved`]): send the notification
//! when every request is `Complete`, withhold it otherwise. `EngineState`
//! stamps the [`NotificationStatus`] of what happened on each held outcome.

use std::collections::HashMap;
use std::sync::Arc;

use crate::outcome::{Outcome, RequestId, Status};
use crate::{PeerId, RailId};

use super::NotificationStatus;

/// What the batch's resolution asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every request completed: send the notification.
    Send,
    /// A request did not complete: never send it; why.
    Withhold(Arc<str>),
}

/// A notifying batch whose requests all have outcomes.
#[derive(Debug)]
pub struct Resolved {
    /// The engine's number for the notification (the frame's id).
    pub id: u64,
    /// Where the notification goes.
    pub peer: PeerId,
    /// The rails the batch used, in first-use order.
    pub rails: Vec<RailId>,
    /// The encoded `notification` frame.
    pub frame: Arc<[u8]>,
    /// Send or withhold the notification.
    pub verdict: Verdict,
    /// The batch's outcomes, in submission order.
    pub outcomes: Vec<Outcome>,
}

impl Resolved {
    /// The outcomes with `status` stamped on each.
    pub fn stamp(self, status: &NotificationStatus) -> Vec<Outcome> {
        let mut v = self.outcomes;
        for o in &mut v {
            o.notification = status.clone();
        }
        v
    }
}

/// What one outcome leads to.
#[derive(Debug)]
pub enum Step {
    /// Not part of a notifying batch: hand it out as it is.
    Release(Outcome),
    /// Held until the rest of its batch has outcomes.
    Held,
    /// The last outcome of a notifying batch.
    Resolved(Resolved),
}

#[derive(Debug)]
struct Pending {
    peer: PeerId,
    rails: Vec<RailId>,
    frame: Arc<[u8]>,
    /// The batch's requests in submission order.
    requests: Vec<RequestId>,
    outcomes: HashMap<RequestId, Outcome>,
}

/// The notifying batches in flight.
///
/// Invariant: every id in `by_request` names a batch in `batches` that
/// lists it and has no outcome for it yet.
#[derive(Debug, Default)]
pub struct Tracker {
    by_request: HashMap<RequestId, u64>,
    batches: HashMap<u64, Pending>,
    next: u64,
}

impl Tracker {
    /// A number for the next notification (its frame's id).
    pub fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// Tracks the admitted batch `requests` (in submission order, on
    /// `rails`) that carries notification `id` (encoded as `frame`) to
    /// `peer`.
    pub fn track(
        &mut self,
        id: u64,
        requests: &[RequestId],
        peer: PeerId,
        rails: Vec<RailId>,
        frame: Arc<[u8]>,
    ) {
        for r in requests {
            self.by_request.insert(*r, id);
        }
        self.batches.insert(
            id,
            Pending {
                peer,
                rails,
                frame,
                requests: requests.to_vec(),
                outcomes: HashMap::with_capacity(requests.len()),
            },
        );
    }

    /// Whether the request's outcome is made and held here.
    pub fn holds(&self, request: RequestId) -> bool {
        self.batches
            .values()
            .any(|b| b.outcomes.contains_key(&request))
    }

    /// Notifying batches not yet resolved.
    pub fn pending(&self) -> usize {
        self.batches.len()
    }

    /// Whether some notifying batch waits for outcomes.
    pub fn tracks_any(&self) -> bool {
        !self.by_request.is_empty()
    }

    /// Feeds one outcome.
    pub fn on_outcome(&mut self, outcome: Outcome) -> Step {
        // No notifying batch in flight (the common case): nothing to hash.
        if self.by_request.is_empty() {
            return Step::Release(outcome);
        }
        let Some(id) = self.by_request.remove(&outcome.request) else {
            return Step::Release(outcome);
        };
        let Some(batch) = self.batches.get_mut(&id) else {
            // Cannot happen (invariant); never lose an outcome.
            return Step::Release(outcome);
        };
        batch.outcomes.insert(outcome.request, outcome);
        if batch.outcomes.len() < batch.requests.len() {
            return Step::Held;
        }
        let Some(mut batch) = self.batches.remove(&id) else {
            return Step::Held;
        };
        let outcomes: Vec<Outcome> = batch
            .requests
            .iter()
            .filter_map(|r| batch.outcomes.remove(r))
            .collect();
        let verdict = match outcomes.iter().find(|o| o.status != Status::Complete) {
            None => Verdict::Send,
            Some(o) => Verdict::Withhold(
                format!(
                    "{} of the batch ended {:?}{}",
                    o.request,
                    o.status,
                    o.failure
                        .as_ref()
                        .map(|f| format!(" ({f})"))
                        .unwrap_or_default()
                )
                .into(),
            ),
        };
        Step::Resolved(Resolved {
            id,
            peer: batch.peer,
            rails: batch.rails,
            frame: batch.frame,
            verdict,
            outcomes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Op;
    use crate::outcome::{DrainStatus, RemoteEffect};

    fn outcome(id: u64, status: Status) -> Outcome {
        Outcome {
            request: RequestId(id),
            label: id,
            op: Op::Write,
            len: 8,
            status,
            completed_prefix: if status == Status::Complete { 8 } else { 0 },
            completed_slices: u32::from(status == Status::Complete),
            slices: 1,
            failure: None,
            uncertain: 0..0,
            remote_effect: RemoteEffect::None,
            drain: DrainStatus::Drained,
            notification: NotificationStatus::NotRequested,
        }
    }

    fn tracked(ids: &[u64]) -> Tracker {
        let mut t = Tracker::default();
        let id = t.next_id();
        let reqs: Vec<RequestId> = ids.iter().map(|i| RequestId(*i)).collect();
        t.track(
            id,
            &reqs,
            PeerId(3),
            vec![RailId(5)],
            Arc::from(&b"frame"[..]),
        );
        t
    }

    #[test]
    fn outcomes_outside_notifying_batches_pass_through() {
        let mut t = tracked(&[1, 2]);
        assert!(
            matches!(t.on_outcome(outcome(9, Status::Complete)), Step::Release(o) if o.request == RequestId(9))
        );
        assert_eq!(t.pending(), 1);
    }

    #[test]
    fn the_last_completion_resolves_to_send_with_outcomes_in_submission_order() {
        let mut t = tracked(&[1, 2, 3]);
        assert!(matches!(
            t.on_outcome(outcome(3, Status::Complete)),
            Step::Held
        ));
        assert!(t.holds(RequestId(3)));
        assert!(!t.holds(RequestId(1)));
        assert!(matches!(
            t.on_outcome(outcome(1, Status::Complete)),
            Step::Held
        ));
        let Step::Resolved(r) = t.on_outcome(outcome(2, Status::Complete)) else {
            panic!("the third outcome resolves the batch");
        };
        assert_eq!(r.verdict, Verdict::Send);
        assert_eq!((r.peer, r.rails.as_slice()), (PeerId(3), &[RailId(5)][..]));
        let order: Vec<u64> = r.outcomes.iter().map(|o| o.request.0).collect();
        assert_eq!(order, [1, 2, 3]);
        let stamped = r.stamp(&NotificationStatus::Sent);
        assert!(
            stamped
                .iter()
                .all(|o| o.notification == NotificationStatus::Sent)
        );
        assert_eq!(t.pending(), 0);
        assert!(!t.holds(RequestId(3)));
    }

    #[test]
    fn any_request_that_does_not_complete_withholds_the_notification() {
        for bad in [Status::Failed, Status::TimedOut, Status::Cancelled] {
            let mut t = tracked(&[1, 2]);
            assert!(matches!(t.on_outcome(outcome(1, bad)), Step::Held));
            let Step::Resolved(r) = t.on_outcome(outcome(2, Status::Complete)) else {
                panic!("resolved");
            };
            match r.verdict {
                Verdict::Withhold(why) => assert!(why.contains(&format!("{bad:?}")), "{why}"),
                Verdict::Send => panic!("{bad:?} must withhold"),
            }
        }
    }

    #[test]
    fn a_single_request_batch_resolves_at_once() {
        let mut t = tracked(&[7]);
        assert!(matches!(
            t.on_outcome(outcome(7, Status::Complete)),
            Step::Resolved(_)
        ));
        // A second outcome for the same id (cannot happen) is not held.
        assert!(matches!(
            t.on_outcome(outcome(7, Status::Complete)),
            Step::Release(_)
        ));
    }
}
