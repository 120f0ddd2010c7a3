//! The notifying batches the state holds: tracked until they resolve,
//! then with the driver until a transport took the notification or none
//! could ([`Transmit`]), then waiting for the target's answer.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::RailId;
use crate::notification::tracker::{Resolved, Tracker};
use crate::outcome::RequestId;

/// A notification the driver hands to a transport: it tries `rails` in
/// order until one takes `frame`, then reports to
/// [`EngineState::notification_sent`](super::EngineState::notification_sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The notification's number (the frame's id).
    pub id: u64,
    /// The batch's rails that are still its peer's and up, in first-use
    /// order; never empty.
    pub rails: Vec<RailId>,
    /// The encoded `notification` frame.
    pub frame: Arc<[u8]>,
}

/// A resolved batch whose notification is with the driver.
#[derive(Debug)]
pub(super) struct Sending {
    /// Why rails of the batch were passed over.
    pub(super) skipped: Vec<String>,
    /// The rail that took the notification; its answer is awaited there.
    pub(super) awaiting: Option<RailId>,
    /// The batch's outcomes, held until the notification is decided.
    pub(super) outcomes: Resolved,
}

/// The notifying batches: in flight (`tracker`), resolved and being sent.
#[derive(Debug, Default)]
pub struct Notifications {
    pub(super) tracker: Tracker,
    /// Invariant: every id in `transmits` is a key of `sending`.
    pub(super) sending: HashMap<u64, Sending>,
    pub(super) transmits: VecDeque<Transmit>,
}

impl Notifications {
    /// Whether the request's outcome is made and held until its batch's
    /// notification is decided.
    pub fn holds(&self, request: RequestId) -> bool {
        self.tracker.holds(request)
            || self
                .sending
                .values()
                .any(|s| s.outcomes.outcomes.iter().any(|o| o.request == request))
    }
}

/// Notifying batches not yet released (tracked or being sent).
#[cfg(test)]
impl Notifications {
    pub(crate) fn pending(&self) -> usize {
        self.tracker.pending() + self.sending.len()
    }
}
