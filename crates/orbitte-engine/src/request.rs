//! Requests built from handles: a local [`Registration`] and a byte range
//! of it on one side, a peer's published [`RemoteRange`] (or a virtual
//! address the peer published) on the other.
//!
//! ```
//! # use orbitte_engine::{Request, Registration, RemoteRange};
//! # fn f(local: &Registration, remote: &RemoteRange) {
//! let write = Request::write(local, 0..4096).to(remote, 0);
//! let read = Request::read(local, 4096..8192).from(remote, 0).label(7);
//! # let _ = (write, read);
//! # }
//! ```
//!
//! Names, not positions: the local byte range and the remote offset cannot
//! be swapped, and no id is converted by hand. A request naming remote
//! memory by address ([`LocalWrite::to_address`],
//! [`LocalRead::from_address`]) is resolved against the peer's
//! publications when it is submitted; an address that no published range
//! contains, a request that crosses from one range into the next, or one
//! past a range's end is refused with a [`RequestError`] naming the
//! address.

use std::ops::Range;

use orbitte_wire::{AccessFlags, Epoch, RangeDescriptor};

use crate::engine::{State, TransferEngine, TransferRequest};
use crate::outcome::{RequestError, SubmitError};
use crate::registration::Registration;
use crate::session::Peer;
use crate::transport::{Op, PeerId, RangeId, RegistrationId};

/// One range a peer published, as this engine learned it (p2p: from the
/// session's `segment-publication`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRange {
    /// The peer that published it.
    pub peer: PeerId,
    /// The peer's epoch it was published in: a request naming it is
    /// refused once the peer restarted
    /// ([`RequestError::PeerRestarted`]).
    pub epoch: Epoch,
    /// Its id within the peer's epoch.
    pub range: RangeId,
    /// Its virtual address in the peer's process.
    pub address: u64,
    /// Its length in bytes.
    pub len: u64,
    /// What the peer allows on it (`REMOTE_READ`, `REMOTE_WRITE`).
    pub access: AccessFlags,
}

impl RemoteRange {
    /// Whether `address..address + len` lies inside this range.
    pub fn contains(&self, address: u64, len: u64) -> bool {
        address >= self.address
            && address
                .checked_add(len)
                .is_some_and(|end| end <= self.address.saturating_add(self.len))
    }
}

/// Where the remote side of a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteTarget {
    /// A published range and an offset in it.
    Range {
        /// The range.
        range: RemoteRange,
        /// Offset in it.
        offset: u64,
    },
    /// A virtual address in the peer's process, resolved against its
    /// publications at submit.
    Address {
        /// The peer.
        peer: PeerId,
        /// The peer's epoch the address was learned in (`None`: whichever
        /// incarnation is open at submit).
        epoch: Option<Epoch>,
        /// The address.
        address: u64,
    },
    /// A range named by the peer's ids alone (the positional
    /// [`TransferRequest`] form).
    Ids {
        /// The peer.
        peer: PeerId,
        /// The peer's epoch the ids were learned in (`None`: whichever
        /// incarnation is open at submit).
        epoch: Option<Epoch>,
        /// The range.
        range: RangeId,
        /// Offset in it.
        offset: u64,
    },
}

/// A peer as a request names it by address: its id and, from a handle,
/// the incarnation the handle was made for. From a [`Peer`] (or its
/// [`PeerInfo`](crate::PeerInfo)) the request is refused once the peer
/// restarted; from a bare [`PeerId`] it runs against whichever incarnation
/// is open at submit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerRef {
    /// The peer.
    pub id: PeerId,
    /// The epoch the handle was made for.
    pub epoch: Option<Epoch>,
}

impl PeerRef {
    /// The peer's memory at virtual address `address`.
    fn at(self, address: u64) -> RemoteTarget {
        RemoteTarget::Address {
            peer: self.id,
            epoch: self.epoch,
            address,
        }
    }
}

impl From<PeerId> for PeerRef {
    fn from(id: PeerId) -> Self {
        Self { id, epoch: None }
    }
}

impl From<&Peer> for PeerRef {
    fn from(p: &Peer) -> Self {
        (&p.info).into()
    }
}

impl From<&crate::PeerInfo> for PeerRef {
    fn from(p: &crate::PeerInfo) -> Self {
        Self {
            id: p.id,
            epoch: Some(p.epoch),
        }
    }
}

/// One READ or WRITE, built with [`Request::write`] or [`Request::read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// READ (remote → local) or WRITE (local → remote).
    pub op: Op,
    /// The local registration.
    pub local: RegistrationId,
    /// Offset in it.
    pub local_offset: u64,
    /// Bytes.
    pub len: u64,
    /// The remote side.
    pub remote: RemoteTarget,
    /// Caller's label, echoed in the outcome and in errors.
    pub label: u64,
}

/// The local side of a WRITE; name the destination with
/// [`to`](Self::to) or [`to_address`](Self::to_address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a WRITE needs a destination: call .to(..) or .to_address(..)"]
pub struct LocalWrite {
    local: RegistrationId,
    offset: u64,
    len: u64,
}

/// The local side of a READ; name the source with [`from`](Self::from)
/// or [`from_address`](Self::from_address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a READ needs a source: call .from(..) or .from_address(..)"]
pub struct LocalRead {
    local: RegistrationId,
    offset: u64,
    len: u64,
}

/// `bytes` as (offset, length); a reversed range is zero bytes long (and
/// refused at submit).
fn span(bytes: &Range<u64>) -> (u64, u64) {
    (bytes.start, bytes.end.saturating_sub(bytes.start))
}

impl Request {
    /// A WRITE of the bytes `bytes` of `local`.
    pub fn write(local: &Registration, bytes: Range<u64>) -> LocalWrite {
        let (offset, len) = span(&bytes);
        LocalWrite {
            local: local.id,
            offset,
            len,
        }
    }

    /// A READ into the bytes `bytes` of `local`.
    pub fn read(local: &Registration, bytes: Range<u64>) -> LocalRead {
        let (offset, len) = span(&bytes);
        LocalRead {
            local: local.id,
            offset,
            len,
        }
    }

    /// The same request with a label (echoed in its outcome and errors).
    pub fn label(mut self, label: u64) -> Self {
        self.label = label;
        self
    }
}

impl LocalWrite {
    /// Into `remote` at `offset`.
    pub fn to(self, remote: &RemoteRange, offset: u64) -> Request {
        self.finish(RemoteTarget::Range {
            range: *remote,
            offset,
        })
    }

    /// Into the peer's memory at virtual address `address` (inside one of
    /// its published ranges). Name the peer by its [`Peer`] handle to have
    /// the request refused after the peer restarted ([`PeerRef`]).
    pub fn to_address(self, peer: impl Into<PeerRef>, address: u64) -> Request {
        self.finish(peer.into().at(address))
    }

    fn finish(self, remote: RemoteTarget) -> Request {
        Request {
            op: Op::Write,
            local: self.local,
            local_offset: self.offset,
            len: self.len,
            remote,
            label: 0,
        }
    }
}

impl LocalRead {
    /// From `remote` at `offset`.
    pub fn from(self, remote: &RemoteRange, offset: u64) -> Request {
        self.finish(RemoteTarget::Range {
            range: *remote,
            offset,
        })
    }

    /// From the peer's memory at virtual address `address` (inside one of
    /// its published ranges). Name the peer by its [`Peer`] handle to have
    /// the request refused after the peer restarted ([`PeerRef`]).
    pub fn from_address(self, peer: impl Into<PeerRef>, address: u64) -> Request {
        self.finish(peer.into().at(address))
    }

    fn finish(self, remote: RemoteTarget) -> Request {
        Request {
            op: Op::Read,
            local: self.local,
            local_offset: self.offset,
            len: self.len,
            remote,
            label: 0,
        }
    }
}

impl From<TransferRequest> for Request {
    fn from(r: TransferRequest) -> Self {
        Self {
            op: r.op,
            local: r.registration,
            local_offset: r.local_offset,
            len: r.len,
            remote: RemoteTarget::Ids {
                peer: r.peer,
                epoch: r.epoch,
                range: r.range,
                offset: r.remote_offset,
            },
            label: r.label,
        }
    }
}

/// Finds the published range of `peer` holding `address..address + len`.
/// An address learned from an older incarnation of the peer is refused as
/// such, not as an address in no range.
fn resolve_address(
    st: &State,
    peer: PeerId,
    epoch: Option<Epoch>,
    address: u64,
    len: u64,
) -> Result<(RangeId, u64), RequestError> {
    let p = st
        .engine
        .tables()
        .peers
        .get(&peer.0)
        .ok_or_else(|| st.engine.tables().missing_peer(peer))?;
    orbitte_proto::state::check_epoch(p, peer, epoch)?;
    find_range(p.ranges.values(), peer, address, len).map_err(|e| match e {
        RequestError::UnknownAddress { peer, address } => {
            match st.engine.tables().predecessor_epoch(peer) {
                Some(previous) => RequestError::AddressAfterRestart {
                    peer,
                    address,
                    previous,
                    current: p.epoch,
                },
                None => e,
            }
        }
        e => e,
    })
}

/// The range among `ranges` holding `address..address + len`, and the
/// offset of `address` in it.
fn find_range<'a>(
    ranges: impl Iterator<Item = &'a RangeDescriptor> + Clone,
    peer: PeerId,
    address: u64,
    len: u64,
) -> Result<(RangeId, u64), RequestError> {
    let Some(d) = ranges
        .clone()
        .find(|d| address >= d.address && address - d.address < d.length)
    else {
        return Err(RequestError::UnknownAddress { peer, address });
    };
    let end = d.address.saturating_add(d.length);
    if address.checked_add(len).is_none_or(|e| e > end) {
        let mut ranges = ranges;
        return Err(if ranges.any(|n| n.address == end) {
            RequestError::CrossesRanges {
                peer,
                address,
                len,
                boundary: end,
            }
        } else {
            RequestError::PastEnd {
                peer,
                address,
                len,
                end,
            }
        });
    }
    Ok((RangeId(d.range_id.0), address - d.address))
}

impl TransferEngine {
    /// Turns requests into the engine's resolved form: remote addresses
    /// become (range, offset) against the peers' publications as they are
    /// now. A refusal names the request (index and label).
    pub(crate) fn resolve<R: Into<Request> + Copy>(
        &self,
        batch: &[R],
    ) -> Result<Vec<TransferRequest>, SubmitError> {
        let mut out = Vec::with_capacity(batch.len());
        let mut st = None;
        for (index, r) in batch.iter().enumerate() {
            let r: Request = (*r).into();
            let (peer, epoch, range, remote_offset) = match r.remote {
                RemoteTarget::Range { range, offset } => {
                    (range.peer, Some(range.epoch), range.range, offset)
                }
                RemoteTarget::Ids {
                    peer,
                    epoch,
                    range,
                    offset,
                } => (peer, epoch, range, offset),
                RemoteTarget::Address {
                    peer,
                    epoch,
                    address,
                } => {
                    let st = st.get_or_insert_with(|| self.lock());
                    let (range, offset) = resolve_address(st, peer, epoch, address, r.len)
                        .map_err(|error| SubmitError::Invalid {
                            index,
                            label: r.label,
                            error,
                        })?;
                    (peer, epoch, range, offset)
                }
            };
            out.push(TransferRequest {
                op: r.op,
                registration: r.local,
                local_offset: r.local_offset,
                peer,
                range,
                remote_offset,
                len: r.len,
                label: r.label,
                epoch,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use orbitte_wire::{AccessToken, RangeId as WireRangeId};

    use super::*;

    fn range(id: u64, address: u64, length: u64) -> RangeDescriptor {
        RangeDescriptor {
            range_id: WireRangeId(id),
            address,
            length,
            access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
            token: AccessToken(0),
            rkeys: Vec::new(),
            local: None,
        }
    }

    #[test]
    fn addresses_resolve_to_range_and_offset_or_a_refusal_naming_the_address() {
        // Two adjacent ranges and one apart.
        let ranges = [
            range(1, 0x1000, 0x1000),
            range(2, 0x2000, 0x1000),
            range(3, 0x9000, 0x100),
        ];
        let peer = PeerId(4);
        let find = |address, len| find_range(ranges.iter(), peer, address, len);
        assert_eq!(find(0x1000, 0x1000), Ok((RangeId(1), 0)));
        assert_eq!(find(0x2ff0, 0x10), Ok((RangeId(2), 0xff0)));
        assert_eq!(find(0x9080, 0x80), Ok((RangeId(3), 0x80)));
        assert_eq!(
            find(0x0fff, 1),
            Err(RequestError::UnknownAddress {
                peer,
                address: 0x0fff
            })
        );
        assert_eq!(
            find(0x3000, 1),
            Err(RequestError::UnknownAddress {
                peer,
                address: 0x3000
            })
        );
        assert_eq!(
            find(0x1ff0, 0x20),
            Err(RequestError::CrossesRanges {
                peer,
                address: 0x1ff0,
                len: 0x20,
                boundary: 0x2000
            })
        );
        assert_eq!(
            find(0x9080, 0x81),
            Err(RequestError::PastEnd {
                peer,
                address: 0x9080,
                len: 0x81,
                end: 0x9100
            })
        );
        assert_eq!(
            find(0x9080, u64::MAX),
            Err(RequestError::PastEnd {
                peer,
                address: 0x9080,
                len: u64::MAX,
                end: 0x9100
            })
        );
        let text = find(0x1ff0, 0x20).unwrap_err().to_string();
        assert!(text.contains("0x1ff0") && text.contains("0x2000"), "{text}");
    }
}
