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
//! past a range's end is refused with a [`RequestError`](crate::outcome::RequestError) naming the
//! address.

use std::ops::Range;

use orbitte_wire::{AccessFlags, Epoch};

use crate::registration::Registration;
use crate::transport::{Op, PeerId, RangeId, RegistrationId};
use orbitte_proto::TransferRequest;

/// One range a peer published, as this engine learned it (p2p: from the
/// session's `segment-publication`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRange {
    /// The peer that published it.
    pub peer: PeerId,
    /// The peer's epoch it was published in: a request naming it is
    /// refused once the peer restarted
    /// ([`RequestError::PeerRestarted`](crate::outcome::RequestError::PeerRestarted)).
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
/// the incarnation the handle was made for. From a [`Peer`](crate::Peer) (or its
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
    /// its published ranges). Name the peer by its [`Peer`](crate::Peer) handle to have
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
    /// its published ranges). Name the peer by its [`Peer`](crate::Peer) handle to have
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

/// Whether a submit call may execute some of its batch on the calling
/// thread ([`SubmitOptions::posting`](crate::SubmitOptions::posting)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Posting {
    /// The local path copies the front of a batch, up to
    /// [`INLINE_BYTES`](crate::INLINE_BYTES), on the calling thread when
    /// its rail's worker is idle: no hand-off and no wakeup, the lowest
    /// latency for small batches. The call returns after that copy.
    #[default]
    Inline,
    /// Nothing of the batch is executed on the calling thread: the local
    /// path hands every copy to its rail's worker, so the call returns as
    /// soon as the batch is posted, however large it is (for callers that
    /// post and then poll, as NIXL's `transfer` does).
    Queued,
}
