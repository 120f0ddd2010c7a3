//! Outcomes made and not taken yet.

use std::collections::HashMap;

use crate::outcome::{Outcome, RequestId};

/// Slots below this are kept in the slab; an id whose slot is beyond it
/// (not one the core hands out while fewer requests are live) goes to the
/// map.
const SLAB_SLOTS: usize = 1 << 16;

/// Outcomes waiting to be taken. Who waits for them is the driver's
/// business: it learns which arrived from [`take_arrived`](Self::take_arrived).
///
/// A request id is its slot in the core's request slab (the low half) and
/// the slot's generation (the high half), so outcomes are kept by slot,
/// with no hashing on the hot path. A slot the core reused while the older
/// request's outcome is still untaken sends the newer outcome to `others`.
#[derive(Debug, Default)]
pub struct Outcomes {
    /// Invariant: an entry at index `i` holds an id whose low half is `i`.
    by_slot: Vec<Option<(RequestId, Outcome)>>,
    /// Outcomes whose slot was taken, or is beyond the slab.
    others: HashMap<RequestId, Outcome>,
    /// Requests whose outcome arrived since the last `take_arrived`.
    arrived: Vec<RequestId>,
}

fn slot(id: RequestId) -> Option<usize> {
    let s = (id.0 & 0xffff_ffff) as usize;
    (s < SLAB_SLOTS).then_some(s)
}

impl Outcomes {
    /// Adds an outcome (replacing one of the same id not taken yet).
    pub fn insert(&mut self, id: RequestId, outcome: Outcome) {
        self.arrived.push(id);
        if let Some(s) = slot(id) {
            if self.by_slot.len() <= s {
                self.by_slot.resize_with(s + 1, || None);
            }
            let entry = &mut self.by_slot[s];
            match entry {
                Some((held, _)) if *held != id => {}
                _ => {
                    *entry = Some((id, outcome));
                    return;
                }
            }
        }
        self.others.insert(id, outcome);
    }

    /// Takes the outcome.
    pub fn remove(&mut self, id: &RequestId) -> Option<Outcome> {
        if let Some(entry) = slot(*id).and_then(|s| self.by_slot.get_mut(s))
            && entry.as_ref().is_some_and(|(held, _)| held == id)
        {
            return entry.take().map(|(_, o)| o);
        }
        if self.others.is_empty() {
            return None;
        }
        self.others.remove(id)
    }

    /// The outcome, left in place.
    pub fn get(&self, id: &RequestId) -> Option<&Outcome> {
        if let Some((held, o)) = slot(*id)
            .and_then(|s| self.by_slot.get(s))
            .and_then(Option::as_ref)
            && held == id
        {
            return Some(o);
        }
        self.others.get(id)
    }

    /// Whether the request's outcome is here, not taken yet.
    pub fn contains_key(&self, id: &RequestId) -> bool {
        let in_slab = slot(*id)
            .and_then(|s| self.by_slot.get(s))
            .is_some_and(|e| e.as_ref().is_some_and(|(held, _)| held == id));
        in_slab || self.others.contains_key(id)
    }

    /// Moves the ids of the outcomes that arrived since the last call into
    /// `into`.
    pub fn take_arrived(&mut self, into: &mut Vec<RequestId>) {
        into.append(&mut self.arrived);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Op;
    use crate::outcome::{DrainStatus, RemoteEffect, Status};

    fn outcome(id: u64) -> Outcome {
        Outcome {
            request: RequestId(id),
            label: id,
            op: Op::Read,
            len: 1,
            status: Status::Complete,
            completed_prefix: 1,
            completed_slices: 1,
            slices: 1,
            failure: None,
            uncertain: 1..1,
            remote_effect: RemoteEffect::None,
            drain: DrainStatus::Drained,
            notification: crate::notification::NotificationStatus::NotRequested,
        }
    }

    #[test]
    fn a_reused_slot_keeps_both_outcomes_apart() {
        let mut t = Outcomes::default();
        let (old, new) = (RequestId(1 << 32 | 3), RequestId(2 << 32 | 3));
        t.insert(old, outcome(old.0));
        t.insert(new, outcome(new.0));
        let far = RequestId(1 << 32 | (SLAB_SLOTS as u64 + 5));
        t.insert(far, outcome(far.0));
        assert!(t.contains_key(&old) && t.contains_key(&new) && t.contains_key(&far));
        assert_eq!(t.get(&old).map(|o| o.label), Some(old.0));
        assert_eq!(t.get(&new).map(|o| o.label), Some(new.0));
        assert_eq!(t.get(&far).map(|o| o.label), Some(far.0));
        assert!(t.get(&RequestId(3 << 32 | 3)).is_none());
        assert!(!t.contains_key(&RequestId(3 << 32 | 3)));
        assert_eq!(t.remove(&new).map(|o| o.label), Some(new.0));
        assert!(t.remove(&new).is_none(), "taken once");
        assert_eq!(t.remove(&old).map(|o| o.label), Some(old.0));
        assert_eq!(t.remove(&far).map(|o| o.label), Some(far.0));
        assert!(!t.contains_key(&old));
        let mut arrived = Vec::new();
        t.take_arrived(&mut arrived);
        assert_eq!(arrived, [old, new, far]);
    }
}
