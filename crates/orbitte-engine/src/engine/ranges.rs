//! The engine's registration table as the tcp/local target's
//! [`RangeLookup`](crate::session::RangeLookup): what a peer may reach on
//! the non-rdma paths is exactly what this engine published (remotely
//! accessible, not retired), with the same token as in its descriptor.
//! Ranges are looked up in the tables' snapshot (`snapshot`), not
//! under the engine's lock.

use std::sync::Weak;

use orbitte_wire::{NicRkey, RangeId};

use super::Shared;
use crate::session::{Published, RangeLookup};
use crate::transport::RegistrationId;

pub(crate) struct EngineRanges(Weak<Shared>);

impl std::fmt::Debug for EngineRanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineRanges")
    }
}

impl RangeLookup for EngineRanges {
    fn lookup(&self, range: RangeId) -> Option<Published> {
        self.0.upgrade()?.snapshot().lookup(range)
    }

    fn published(&self) -> Vec<(RangeId, Published)> {
        self.0
            .upgrade()
            .map(|shared| shared.snapshot().published())
            .unwrap_or_default()
    }

    fn rkeys(&self, range: RangeId) -> Vec<NicRkey> {
        let Some(shared) = self.0.upgrade() else {
            return Vec::new();
        };
        let st = shared.lock();
        let nics = st.nic_info();
        st.engine
            .tables()
            .regs
            .get(&range.0)
            .and_then(|e| e.descriptor(RegistrationId(range.0), &nics))
            .map(|d| d.rkeys)
            .unwrap_or_default()
    }

    fn served_counter(
        &self,
        path: crate::transport::PathKind,
        peer: &str,
    ) -> crate::metrics::ServedCounter {
        self.0.upgrade().map_or_else(Default::default, |shared| {
            crate::metrics::ServedCounter::new(shared.metrics.clone(), path, peer)
        })
    }

    fn notification(
        &self,
        from: &crate::session::PeerIdentity,
        path: crate::transport::PathKind,
        note: orbitte_wire::Notification,
    ) -> orbitte_wire::NotificationAnswer {
        self.deliver(from, path, note)
    }
}

impl EngineRanges {
    /// The ranges of the engine behind `shared`, while it runs.
    pub(crate) fn new(shared: Weak<Shared>) -> Self {
        Self(shared)
    }

    fn deliver(
        &self,
        from: &crate::session::PeerIdentity,
        path: crate::transport::PathKind,
        note: orbitte_wire::Notification,
    ) -> orbitte_wire::NotificationAnswer {
        match self.0.upgrade() {
            Some(shared) => crate::notify::deliver(&shared.inbox, from, path, note),
            // The engine is shutting down: nothing reads it any more.
            None => orbitte_wire::NotificationAnswer {
                notification_id: note.notification_id,
                verdict: orbitte_wire::NotificationVerdict::NOT_KEPT,
                limit: 0,
            },
        }
    }
}
