//! The registration and peer tables, and the check of a request's remote side.

use std::sync::Arc;

use orbitte_memory::HostMemory;
use orbitte_wire::{self as wire, Epoch, SourceId};

use crate::outcome::RequestError;
use crate::registration::RegEntry;
use crate::transport::{Op, PeerId, PostContext, RailId, RangeId, RegistrationId};
use orbitte_proto::TransferRequest;

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
    /// Ids of incarnations a newer epoch replaced, so that a request made
    /// from an old handle is refused as the peer's restart, naming both
    /// epochs. The oldest are forgotten beyond [`RESTARTED_KEPT`] (then
    /// refused as an unknown peer).
    pub(crate) restarted: std::collections::BTreeMap<u32, Restarted>,
}

/// Replaced incarnations remembered (a few dozen bytes each).
pub(crate) const RESTARTED_KEPT: usize = 4096;

/// An incarnation of a peer that a newer epoch replaced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Restarted {
    /// Its epoch.
    pub(crate) epoch: Epoch,
    /// The id of the incarnation that replaced it.
    pub(crate) successor: PeerId,
}

impl Tables {
    /// Records that `successor` replaced `old` (of epoch `epoch`).
    pub(crate) fn record_restart(&mut self, old: PeerId, epoch: Epoch, successor: PeerId) {
        self.restarted.insert(old.0, Restarted { epoch, successor });
        while self.restarted.len() > RESTARTED_KEPT {
            self.restarted.pop_first();
        }
    }

    /// The epoch of the incarnation `peer` replaced, if it replaced one.
    pub(crate) fn predecessor_epoch(&self, peer: PeerId) -> Option<Epoch> {
        self.restarted
            .values()
            .rev()
            .find(|r| r.successor == peer)
            .map(|r| r.epoch)
    }

    /// Why no open peer has id `peer`: it restarted (the refusal names the
    /// epoch of the handle and the epoch open now), or it is unknown.
    pub(crate) fn missing_peer(&self, peer: PeerId) -> RequestError {
        let Some(old) = self.restarted.get(&peer.0) else {
            return RequestError::UnknownPeer(peer);
        };
        // Follow the replacements to the incarnation open now.
        let mut next = old.successor;
        for _ in 0..=self.restarted.len() {
            if let Some(p) = self.peers.get(&next.0) {
                return RequestError::PeerRestarted {
                    peer,
                    handle: old.epoch,
                    current: p.epoch,
                };
            }
            match self.restarted.get(&next.0) {
                Some(r) => next = r.successor,
                None => break,
            }
        }
        RequestError::UnknownPeer(peer)
    }
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
/// Refuses a request made for another incarnation of `peer` than the one
/// open (`epoch` `None`: made for whichever is open).
pub(crate) fn check_epoch(
    peer: &PeerState,
    id: PeerId,
    epoch: Option<Epoch>,
) -> Result<(), RequestError> {
    match epoch {
        Some(handle) if handle != peer.epoch => Err(RequestError::PeerRestarted {
            peer: id,
            handle,
            current: peer.epoch,
        }),
        _ => Ok(()),
    }
}

pub(crate) fn published_remote<'t>(
    tables: &'t Tables,
    r: &TransferRequest,
    rend: u64,
) -> Result<(&'t PeerState, &'t wire::RangeDescriptor), RequestError> {
    let peer = tables
        .peers
        .get(&r.peer.0)
        .ok_or_else(|| tables.missing_peer(r.peer))?;
    check_epoch(peer, r.peer, r.epoch)?;
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
