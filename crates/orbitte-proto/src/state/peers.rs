//! The rules of the peer table: adoption by epoch (new, reconnect,
//! replacement), the ranges a peer publishes and retires, and which rails
//! a peer loses.
//!
//! The wire's [`PeerTable`](orbitte_wire::PeerTable) decides whether a
//! hello is admitted and records the frames of each session; the driver
//! asks it first (it is shared with the net sessions), then applies the
//! outcome here.

use orbitte_wire::handshake::Established;
use orbitte_wire::{self as wire, Admission};

use super::{EngineState, PeerState};
use crate::registration::Resources;
use crate::{PathKind, PeerId, RailId, RangeId};

/// What adopting a peer asks of the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "the replaced incarnation's rails must be retired"]
pub struct Adoption {
    /// The peer: the same id on a reconnect, a fresh one otherwise.
    pub peer: PeerId,
    /// The old incarnation a newer epoch replaced: gone from the table,
    /// its id unknown from now on.
    pub replaced: Option<PeerId>,
    /// The replaced incarnation's rails, for the driver to retire (closed
    /// for new work, flushed, destroyed once drained).
    pub retire: Vec<RailId>,
}

impl<R: Resources> EngineState<R> {
    /// Records a peer admitted on `session` as `est` says, with the ranges
    /// of its `publication`. A reconnect of a source in the table keeps its
    /// id (and rails) and replaces its ranges; a newer epoch forgets the
    /// old incarnation (its descriptors with it) and opens a fresh id; a
    /// source not in the table gets a fresh id.
    pub fn adopt_peer(
        &mut self,
        session: wire::SessionId,
        est: &Established,
        publication: &wire::SegmentPublication,
    ) -> Adoption {
        let source = &est.peer.source_id;
        let existing = self
            .tables
            .peers
            .iter()
            .find(|(_, p)| p.source_id == *source)
            .map(|(id, _)| PeerId(*id));
        let (peer, replaced, retire) = match (&est.admission, existing) {
            (Admission::Reconnect, Some(id)) => (id, None, Vec::new()),
            (
                Admission::Replaced {
                    previous,
                    invalidated,
                },
                Some(old),
            ) => {
                // At debug: a peer causes this once per session, and the
                // listener that admitted the session logs the newer epoch
                // within its budget.
                tracing::debug!(
                    source = source.as_str(),
                    previous = previous.value(),
                    new = est.peer.epoch.value(),
                    descriptors = invalidated.descriptors.len(),
                    "source restarted: old incarnation invalidated"
                );
                let epoch = self.tables.peers.get(&old.0).map_or(*previous, |p| p.epoch);
                let rails = self.forget_peer(old).unwrap_or_default();
                let successor = self.fresh_peer_id();
                self.tables.record_restart(old, epoch, successor);
                (successor, Some(old), rails)
            }
            _ => (self.fresh_peer_id(), None, Vec::new()),
        };
        let entry = self
            .tables
            .peers
            .entry(peer.0)
            .or_insert_with(|| PeerState {
                source_id: source.clone(),
                epoch: est.peer.epoch,
                sessions: Vec::new(),
                ranges: crate::Map::default(),
                rails: Vec::new(),
            });
        entry.epoch = est.peer.epoch;
        entry.sessions.push(session);
        entry.ranges = publication
            .ranges
            .iter()
            .map(|r| (RangeId(r.range_id.0), r.clone()))
            .collect();
        Adoption {
            peer,
            replaced,
            retire,
        }
    }

    /// Forgets a peer (its descriptors with it); returns its rails for the
    /// driver to retire, or `None` for an unknown peer.
    pub fn forget_peer(&mut self, peer: PeerId) -> Option<Vec<RailId>> {
        self.tables.peers.remove(&peer.0).map(|p| p.rails)
    }

    /// Takes `peer`'s rails of `path` off it and returns them, for the
    /// driver to retire (a reconnect replaces the rdma rails of the same
    /// incarnation; a peer that switched paths loses them).
    pub fn detach_rails(&mut self, peer: PeerId, path: PathKind) -> Vec<RailId> {
        let Some(p) = self.tables.peers.get_mut(&peer.0) else {
            return Vec::new();
        };
        let core = &self.core;
        let on = |r: &RailId| core.rail_spec(*r).is_some_and(|s| s.path == path);
        let taken: Vec<RailId> = p.rails.iter().copied().filter(on).collect();
        p.rails.retain(|r| !on(r));
        taken
    }

    /// The peer's latest session (where frames about its ranges are
    /// recorded); `None` for an unknown peer.
    pub fn peer_session(&self, peer: PeerId) -> Option<wire::SessionId> {
        self.tables.peers.get(&peer.0)?.sessions.last().copied()
    }

    /// Adds (or replaces, by range id) the ranges of a publication the
    /// peer sent after it was opened. `false` for an unknown peer.
    pub fn apply_publication(
        &mut self,
        peer: PeerId,
        publication: &wire::SegmentPublication,
    ) -> bool {
        let Some(p) = self.tables.peers.get_mut(&peer.0) else {
            return false;
        };
        for r in &publication.ranges {
            p.ranges.insert(RangeId(r.range_id.0), r.clone());
        }
        true
    }

    /// Drops the ranges a peer retired: requests naming them are refused
    /// from now on. `false` for an unknown peer.
    pub fn apply_retire(&mut self, peer: PeerId, retire: &wire::SegmentRetire) -> bool {
        let Some(p) = self.tables.peers.get_mut(&peer.0) else {
            return false;
        };
        for id in &retire.range_ids {
            p.ranges.remove(&RangeId(id.0));
        }
        true
    }

    /// A fresh peer id (ids are never reused).
    pub(super) fn fresh_peer_id(&mut self) -> PeerId {
        let id = self.next_peer;
        self.next_peer += 1;
        PeerId(id)
    }
}
