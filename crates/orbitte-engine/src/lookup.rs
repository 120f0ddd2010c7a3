//! The engine's registration table as the tcp/local target's
//! [`RangeLookup`](crate::session::RangeLookup): what a peer may reach on
//! the non-rdma paths is exactly what this engine published (remotely
//! accessible, not retired), with the same token as in its descriptor.

use std::sync::{Arc, Weak};

use orbitte_wire::{AccessFlags, NicRkey, RangeId};

use crate::TransferEngine;
use crate::engine::Shared;
use crate::registration::{RegEntry, RegState};
use crate::session::{Published, RangeLookup};
use crate::transport::RegistrationId;

pub(crate) struct EngineRanges(Weak<Shared>);

impl std::fmt::Debug for EngineRanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineRanges")
    }
}

fn published(e: &RegEntry) -> Option<Published> {
    if e.state != RegState::Published {
        return None;
    }
    if !e.access.is_remote() {
        return None;
    }
    let mut access = AccessFlags(0);
    if e.access.remote_read() {
        access = access | AccessFlags::REMOTE_READ;
    }
    if e.access.remote_write() {
        access = access | AccessFlags::REMOTE_WRITE;
    }
    Some(Published {
        memory: e.memory.clone(),
        offset: 0,
        length: e.memory.len() as u64,
        access,
        token: e.token,
    })
}

impl RangeLookup for EngineRanges {
    fn lookup(&self, range: RangeId) -> Option<Published> {
        let shared = self.0.upgrade()?;
        let st = shared.lock();
        st.tables.regs.get(&range.0).and_then(published)
    }

    fn published(&self) -> Vec<(RangeId, Published)> {
        let Some(shared) = self.0.upgrade() else {
            return Vec::new();
        };
        let st = shared.lock();
        let mut v: Vec<_> = st
            .tables
            .regs
            .iter()
            .filter_map(|(id, e)| published(e).map(|p| (RangeId(*id), p)))
            .collect();
        v.sort_by_key(|(id, _)| id.0);
        v
    }

    fn rkeys(&self, range: RangeId) -> Vec<NicRkey> {
        let Some(shared) = self.0.upgrade() else {
            return Vec::new();
        };
        let st = shared.lock();
        let nics = st.nic_info();
        st.tables
            .regs
            .get(&range.0)
            .and_then(|e| e.descriptor(RegistrationId(range.0), &nics))
            .map(|d| d.rkeys)
            .unwrap_or_default()
    }

    fn notification(
        &self,
        from: &crate::session::PeerIdentity,
        path: crate::transport::PathKind,
        note: orbitte_wire::Notification,
    ) {
        self.deliver(from, path, note);
    }
}

impl EngineRanges {
    fn deliver(
        &self,
        from: &crate::session::PeerIdentity,
        path: crate::transport::PathKind,
        note: orbitte_wire::Notification,
    ) {
        if let Some(shared) = self.0.upgrade() {
            crate::notify::deliver(&shared.inbox, from, path, note);
        }
    }
}

impl TransferEngine {
    /// The published ranges as the tcp/local target looks them up (range id
    /// = registration id; token = the descriptor's token).
    pub(crate) fn range_lookup(&self) -> Arc<dyn RangeLookup> {
        Arc::new(EngineRanges(Arc::downgrade(&self.shared)))
    }
}
