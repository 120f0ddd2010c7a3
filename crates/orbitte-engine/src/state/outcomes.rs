//! Outcomes made and not taken yet.

use std::collections::HashMap;

use crate::outcome::{Outcome, RequestId};

/// Outcomes waiting to be taken. Who waits for them is the driver's
/// business: it learns which arrived from [`take_arrived`](Self::take_arrived).
#[derive(Debug, Default)]
pub(crate) struct Outcomes {
    ready: HashMap<RequestId, Outcome>,
    /// Requests whose outcome arrived since the last `take_arrived`.
    arrived: Vec<RequestId>,
}

impl Outcomes {
    /// Adds an outcome.
    pub(crate) fn insert(&mut self, id: RequestId, outcome: Outcome) {
        self.ready.insert(id, outcome);
        self.arrived.push(id);
    }

    /// Takes the outcome.
    pub(crate) fn remove(&mut self, id: &RequestId) -> Option<Outcome> {
        self.ready.remove(id)
    }

    /// Whether the request's outcome is here, not taken yet.
    pub(crate) fn contains_key(&self, id: &RequestId) -> bool {
        self.ready.contains_key(id)
    }

    /// Moves the ids of the outcomes that arrived since the last call into
    /// `into`.
    pub(crate) fn take_arrived(&mut self, into: &mut Vec<RequestId>) {
        into.append(&mut self.arrived);
    }
}
