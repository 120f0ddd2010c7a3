//! The registration and peer tables, and the check of a request's remote side.

use std::sync::Arc;

use orbitte_memory::HostMemory;
use orbitte_wire::{self as wire, Epoch, SourceId};

use crate::engine::TransferRequest;
use crate::outcome::RequestError;
use crate::registration::RegEntry;
use crate::transport::{Op, PeerId, PostContext, RailId, RangeId, RegistrationId};

/// An open peer: its source owner and epoch, the sessions it was admitted
/// on, the ranges it published, its rails.
#[derive(Debug)]
pub(crate) struct PeerState {
    pub(crate) source_id: SourceId,
    pub(crate) epoch: Epoch,
    pub(crate) sessions: Vec<wire::SessionId>,
    pub(crate) ranges: crate::Map<RangeId, wire::RangeDescriptor>,
    pub(crate) rails: Vec<RailId>,
}

/// The registration and peer tables, lent to transports while they post.
/// Each table remembers whether it was changed (any `&mut` access counts),
/// so the driver copies what posting and serving need only after a change
/// ([`take_changed`](Self::take_changed)).
#[derive(Debug, Default)]
pub(crate) struct Tables {
    pub(crate) regs: Tracked<crate::Map<u64, RegEntry>>,
    pub(crate) peers: Tracked<crate::Map<u32, PeerState>>,
}

impl Tables {
    /// Whether a table was changed since the last call.
    pub(crate) fn take_changed(&mut self) -> bool {
        let regs = std::mem::take(&mut self.regs.changed);
        let peers = std::mem::take(&mut self.peers.changed);
        regs || peers
    }
}

/// A value that records every mutable access to it: reads go through
/// `Deref`, and any `DerefMut` (insert, remove, `get_mut`, ...) marks it
/// changed, whether or not the caller then changes anything.
#[derive(Debug, Default)]
pub(crate) struct Tracked<T> {
    value: T,
    changed: bool,
}

impl<T> std::ops::Deref for Tracked<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> std::ops::DerefMut for Tracked<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.changed = true;
        &mut self.value
    }
}

impl PostContext for Tables {
    fn memory(&self, registration: RegistrationId) -> Option<&Arc<HostMemory>> {
        self.regs.get(&registration.0).map(|e| &e.memory)
    }

    fn local_key(&self, registration: RegistrationId, nic: u32) -> Option<(u64, u32)> {
        let c = self.regs.get(&registration.0)?.copies_on(nic)?;
        Some((c.local.addr(), c.local.lkey()))
    }

    fn remote_range(&self, peer: PeerId, range: RangeId) -> Option<&wire::RangeDescriptor> {
        self.peers.get(&peer.0)?.ranges.get(&range)
    }
}

/// The peer and the published range a request names, checked: the peer
/// is open, the range published, `rend` (the request's end in it) inside
/// it, and the range allows the operation.
pub(crate) fn published_remote<'t>(
    tables: &'t Tables,
    r: &TransferRequest,
    rend: u64,
) -> Result<(&'t PeerState, &'t wire::RangeDescriptor), RequestError> {
    let peer = tables
        .peers
        .get(&r.peer.0)
        .ok_or(RequestError::UnknownPeer(r.peer))?;
    let desc = peer
        .ranges
        .get(&r.range)
        .ok_or(RequestError::UnpublishedRemote {
            peer: r.peer,
            range: r.range,
        })?;
    if rend > desc.length {
        return Err(RequestError::OutOfRange {
            side: "remote",
            offset: r.remote_offset,
            len: r.len,
            size: desc.length,
        });
    }
    let need = match r.op {
        Op::Read => wire::AccessFlags::REMOTE_READ,
        Op::Write => wire::AccessFlags::REMOTE_WRITE,
    };
    if !desc.access.contains(need) {
        return Err(RequestError::WrongAccess {
            side: "remote",
            op: r.op,
        });
    }
    Ok((peer, desc))
}
