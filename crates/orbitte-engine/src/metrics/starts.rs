//! When each request was submitted and whose cells count it, from submit
//! until its outcome is counted.

use std::sync::Arc;
use std::time::Instant;

use orbitte_proto::outcome::RequestId;

use super::PeerCells;

/// Slots below this are kept in the slab (as the outcome table does: a
/// request id's low half is its slot in the core), the rest in a map.
const SLAB_SLOTS: usize = 1 << 16;

/// A request's start: its cells and when it was submitted.
#[derive(Debug, Clone)]
pub(crate) struct Started {
    pub(crate) cells: Arc<PeerCells>,
    pub(crate) at: Instant,
}

/// The starts of the requests whose outcomes are not counted yet.
#[derive(Debug, Default)]
pub(crate) struct Starts {
    /// Invariant: an entry at index `i` holds an id whose low half is `i`.
    by_slot: Vec<Option<(RequestId, Started)>>,
    others: crate::Map<RequestId, Started>,
}

fn slot(id: RequestId) -> Option<usize> {
    let s = (id.0 & 0xffff_ffff) as usize;
    (s < SLAB_SLOTS).then_some(s)
}

impl Starts {
    /// Records the start of `id`.
    pub(crate) fn insert(&mut self, id: RequestId, start: Started) {
        if let Some(s) = slot(id) {
            if self.by_slot.len() <= s {
                self.by_slot.resize_with(s + 1, || None);
            }
            let entry = &mut self.by_slot[s];
            if entry.as_ref().is_none_or(|(held, _)| *held == id) {
                *entry = Some((id, start));
                return;
            }
        }
        self.others.insert(id, start);
    }

    /// Takes the start of `id`.
    pub(crate) fn remove(&mut self, id: RequestId) -> Option<Started> {
        if let Some(entry) = slot(id).and_then(|s| self.by_slot.get_mut(s))
            && entry.as_ref().is_some_and(|(held, _)| *held == id)
        {
            return entry.take().map(|(_, s)| s);
        }
        if self.others.is_empty() {
            return None;
        }
        self.others.remove(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orbitte_proto::PathKind;

    #[test]
    fn a_reused_slot_keeps_both_starts_apart() {
        let cells = Arc::new(PeerCells::new_for_tests(PathKind::Local, "p"));
        let at = Instant::now();
        let start = || Started {
            cells: cells.clone(),
            at,
        };
        let mut s = Starts::default();
        let (old, new) = (RequestId(1 << 32 | 3), RequestId(2 << 32 | 3));
        let far = RequestId(1 << 32 | (SLAB_SLOTS as u64 + 5));
        s.insert(old, start());
        s.insert(new, start());
        s.insert(far, start());
        assert!(s.remove(new).is_some());
        assert!(s.remove(new).is_none(), "taken once");
        assert!(s.remove(old).is_some());
        assert!(s.remove(far).is_some());
        assert!(s.remove(RequestId(3 << 32 | 3)).is_none());
    }
}
