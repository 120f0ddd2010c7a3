//! When each request was submitted and whose cells count it, from submit
//! until its outcome is counted ([`Counting`]).

use std::sync::Arc;
use std::time::Instant;

use orbitte_proto::outcome::{Outcome, RequestId};
use orbitte_proto::{PathKind, PeerId};

use super::{PeerCells, Registry};

/// The driver's side of counting: each peer's cells by path (looked up in
/// the [`Registry`] once), and the start of every request whose outcome
/// is not counted yet. Lives in the driver's state, so it is used under
/// the state lock only.
#[derive(Debug, Default)]
pub(crate) struct Counting {
    by_peer: crate::Map<(PeerId, PathKind), u32>,
    /// Invariant: every `Started::cell` and `by_peer` value indexes it.
    cells: Vec<Arc<PeerCells>>,
    starts: Starts,
}

impl Counting {
    /// The index of `peer`'s cells on `path`; `source`: its source id,
    /// asked the first time only.
    pub(crate) fn cell(
        &mut self,
        registry: &Registry,
        peer: PeerId,
        path: PathKind,
        source: impl FnOnce() -> String,
    ) -> u32 {
        if let Some(&i) = self.by_peer.get(&(peer, path)) {
            return i;
        }
        // Two peer ids of one source (a restart) get two indexes of the
        // same cells.
        self.cells.push(registry.cells(path, &source()));
        let i = (self.cells.len() - 1) as u32;
        self.by_peer.insert((peer, path), i);
        i
    }

    /// Request `id` was submitted at `at`, to be counted in `cell`.
    pub(crate) fn start(&mut self, id: RequestId, cell: u32, at: Instant) {
        self.starts.insert(id, Started { cell, at });
    }

    /// Counts the outcome of `id` (made at `now`, read only if it is
    /// counted) in the cells its submit chose; a request without a start
    /// is not counted.
    pub(crate) fn finish(&mut self, id: RequestId, o: &Outcome, now: &mut impl FnMut() -> Instant) {
        let Some(s) = self.starts.remove(id) else {
            return;
        };
        if let Some(c) = self.cells.get(s.cell as usize) {
            c.count(o, Some(now().saturating_duration_since(s.at)));
        }
    }
}

/// Slots below this are kept in the slab (as the outcome table does: a
/// request id's low half is its slot in the core), the rest in a map.
const SLAB_SLOTS: usize = 1 << 16;

/// A request's start: its cells (an index of [`Counting`]'s) and when it
/// was submitted.
#[derive(Debug, Clone, Copy)]
struct Started {
    cell: u32,
    at: Instant,
}

/// The starts of the requests whose outcomes are not counted yet.
#[derive(Debug, Default)]
struct Starts {
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
    fn insert(&mut self, id: RequestId, start: Started) {
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
    fn remove(&mut self, id: RequestId) -> Option<Started> {
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

    #[test]
    fn a_reused_slot_keeps_both_starts_apart() {
        let at = Instant::now();
        let start = || Started { cell: 0, at };
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
