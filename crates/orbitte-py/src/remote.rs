//! A peer's published ranges named by the owner's address.
//!
//! Mooncake's callers name remote memory by the target's virtual address.
//! Segment descriptors carry each range's address in its owner's process,
//! so an address resolves to (range, offset) against the peer's
//! publication, with the same refusals as the engine's: unknown address,
//! crossing two ranges, past the end.

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

/// Why a remote address does not resolve.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RemoteMiss {
    #[error(
        "remote address {addr:#x} is not in any range {peer} published: use an address inside memory the target registered"
    )]
    Unknown { peer: String, addr: u64 },
    #[error(
        "remote access {addr:#x}+{len} runs past the end of {peer}'s range {start:#x}+{range_len} (into another range or unpublished memory): split the request at the range boundary"
    )]
    PastEnd {
        peer: String,
        addr: u64,
        len: u64,
        start: u64,
        range_len: u64,
    },
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

impl RemotePeer {
    /// The range containing `addr..addr+len`, and the offset in it.
    pub(crate) fn resolve(&self, addr: u64, len: u64) -> Result<(RangeId, u64), RemoteMiss> {
        let i = self.ranges.partition_point(|r| r.address <= addr);
        let unknown = || RemoteMiss::Unknown {
            peer: self.source_id.clone(),
            addr,
        };
        let r = i
            .checked_sub(1)
            .and_then(|i| self.ranges.get(i))
            .ok_or_else(unknown)?;
        let off = addr - r.address;
        if off >= r.length {
            return Err(unknown());
        }
        if len > r.length - off {
            return Err(RemoteMiss::PastEnd {
                peer: self.source_id.clone(),
                addr,
                len,
                start: r.address,
                range_len: r.length,
            });
        }
        Ok((r.range, off))
    }
}
