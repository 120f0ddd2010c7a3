//! The registration and peer tables, and the check of a request's remote side.

use orbitte_wire::{self as wire, Epoch, SourceId};

use crate::TransferRequest;
use crate::outcome::RequestError;
use crate::registration::{RegEntry, Resources};
use crate::{Op, PeerId, RailId, RangeId};

/// An open peer: its source owner and epoch, the sessions it was admitted
/// on, the ranges it published, its rails.
#[derive(Debug)]
pub struct PeerState {
    /// Its source id.
    pub source_id: SourceId,
    /// The incarnation open.
    pub epoch: Epoch,
    /// The sessions it was admitted on.
    pub sessions: Vec<wire::SessionId>,
    /// The ranges it published.
    pub ranges: crate::Map<RangeId, wire::RangeDescriptor>,
    /// Its rails.
    pub rails: Vec<RailId>,
}

/// The registration and peer tables, lent to transports while they post.
/// Each table remembers whether it was changed (any `&mut` access counts),
/// so the driver copies what posting and serving need only after a change
/// ([`take_changed`](Self::take_changed)).
#[derive(Debug)]
pub struct Tables<R: Resources> {
    /// Registrations by id.
    pub regs: Tracked<crate::Map<u64, RegEntry<R>>>,
    /// Open peers by id.
    pub peers: Tracked<crate::Map<u32, PeerState>>,
    /// Ids of incarnations a newer epoch replaced, so that a request made
    /// from an old handle is refused as the peer's restart, naming both
    /// epochs. The oldest are forgotten beyond [`RESTARTED_KEPT`] (then
    /// refused as an unknown peer).
    pub restarted: std::collections::BTreeMap<u32, Restarted>,
}

impl<R: Resources> Default for Tables<R> {
    fn default() -> Self {
        Self {
            regs: Tracked::default(),
            peers: Tracked::default(),
            restarted: std::collections::BTreeMap::new(),
        }
    }
}

/// Replaced incarnations remembered (a few dozen bytes each).
pub const RESTARTED_KEPT: usize = 4096;

/// An incarnation of a peer that a newer epoch replaced.
#[derive(Debug, Clone, Copy)]
pub struct Restarted {
    /// Its epoch.
    pub epoch: Epoch,
    /// The id of the incarnation that replaced it.
    pub successor: PeerId,
}

impl<R: Resources> Tables<R> {
    /// Records that `successor` replaced `old` (of epoch `epoch`).
    pub fn record_restart(&mut self, old: PeerId, epoch: Epoch, successor: PeerId) {
        self.restarted.insert(old.0, Restarted { epoch, successor });
        while self.restarted.len() > RESTARTED_KEPT {
            self.restarted.pop_first();
        }
    }

    /// The epoch of the incarnation `peer` replaced, if it replaced one.
    pub fn predecessor_epoch(&self, peer: PeerId) -> Option<Epoch> {
        self.restarted
            .values()
            .rev()
            .find(|r| r.successor == peer)
            .map(|r| r.epoch)
    }

    /// Why no open peer has id `peer`: it restarted (the refusal names the
    /// epoch of the handle and the epoch open now), or it is unknown.
    pub fn missing_peer(&self, peer: PeerId) -> RequestError {
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

impl<R: Resources> Tables<R> {
    /// Whether a table was changed since the last call.
    pub fn take_changed(&mut self) -> bool {
        let regs = std::mem::take(&mut self.regs.changed);
        let peers = std::mem::take(&mut self.peers.changed);
        regs || peers
    }
}

/// A value that records every mutable access to it: reads go through
/// `Deref`, and any `DerefMut` (insert, remove, `get_mut`, ...) marks it
/// changed, whether or not the caller then changes anything.
#[derive(Debug, Default)]
pub struct Tracked<T> {
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

/// The peer and the published range a request names, checked: the peer
/// is open, the range published, `rend` (the request's end in it) inside
/// it, and the range allows the operation.
/// Refuses a request made for another incarnation of `peer` than the one
/// open (`epoch` `None`: made for whichever is open).
pub fn check_epoch(peer: &PeerState, id: PeerId, epoch: Option<Epoch>) -> Result<(), RequestError> {
    match epoch {
        Some(handle) if handle != peer.epoch => Err(RequestError::PeerRestarted {
            peer: id,
            handle,
            current: peer.epoch,
        }),
        _ => Ok(()),
    }
}

/// The peer and published range `r` names, checked (see above).
pub fn published_remote<'t, R: Resources>(
    tables: &'t Tables<R>,
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
