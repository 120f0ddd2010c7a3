//! An opened peer as this package caches it per session id, with its
//! published ranges by the owner's address (what `connect()` shows; the
//! engine resolves a request's remote address against them at submit).

use orbitte::{PathKind, PeerId, RangeId};

/// One published range of a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RemoteRange {
    pub(crate) range: RangeId,
    pub(crate) address: u64,
    pub(crate) length: u64,
}

/// An opened peer, as this package caches it per session id.
#[derive(Debug, Clone)]
pub(crate) struct RemotePeer {
    pub(crate) id: PeerId,
    pub(crate) source_id: String,
    pub(crate) epoch: u64,
    pub(crate) path: PathKind,
    pub(crate) fell_back: Vec<(PathKind, String)>,
    /// Sorted by address. Invariant: no two overlap (one owner's mappings).
    pub(crate) ranges: Vec<RemoteRange>,
}

/// A peer's published ranges, sorted by address.
pub(crate) fn ranges_of(published: &[orbitte::RemoteRange]) -> Vec<RemoteRange> {
    let mut v: Vec<RemoteRange> = published
        .iter()
        .map(|r| RemoteRange {
            range: r.range,
            address: r.address,
            length: r.len,
        })
        .collect();
    v.sort_unstable_by_key(|r| r.address);
    v
}
