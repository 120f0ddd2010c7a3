//! Where an engine finds its peers' segment descriptors.
//!
//! Two modes ([`MetadataMode`]):
//! - **p2p** (the embedded default): no server. When a session opens, the
//!   target sends its publications (`segment-publication` frames) over the
//!   session, and the initiator keeps them in a [`DescriptorCache`] keyed by
//!   the target's source id and epoch.
//! - **etcd** (cluster mode, cargo feature `etcd`, on by default): each engine stores a
//!   [`PeerRecord`] under `<prefix>/engines/<source id>`, attached to a
//!   lease that the engine keeps alive; when the engine dies the lease
//!   expires and the record disappears. See the `etcd` module.
//!
//! Both modes feed the same cache, and the cache obeys the epoch rule: a
//! record of an older epoch than the one cached is refused, a newer one
//! replaces everything cached from the source.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(feature = "etcd")]
pub mod etcd;

/// How descriptors are exchanged.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MetadataMode {
    /// Descriptors travel over the session when it opens (no server).
    #[default]
    P2p,
    /// Descriptors live in etcd under a key prefix, with leases.
    Etcd {
        /// `host:port` of the etcd servers.
        endpoints: Vec<String>,
        /// Key prefix, e.g. `/orbitte/cluster-a`.
        prefix: String,
        /// Lease time-to-live: how long a dead engine's record survives.
        lease_ttl: Duration,
    },
}

/// One published range as stored in the metadata service. Mirrors the wire
/// protocol's range descriptor (the fields the tcp and local paths use).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeRecord {
    /// Range id within the owner's epoch.
    pub range_id: u64,
    /// Length in bytes.
    pub length: u64,
    /// Wire access flags (`REMOTE_READ`, `REMOTE_WRITE` bits).
    pub access: u32,
    /// The access token that tcp data requests must present.
    pub token: u64,
    /// Host id of the owner when the range can be mapped by a same-host
    /// peer (local path); `None` otherwise.
    pub local_host: Option<String>,
}

/// What an engine stores about itself in the metadata service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerRecord {
    /// Source id of the owner.
    pub source_id: String,
    /// Authoritative epoch of the owner.
    pub epoch: u64,
    /// Address its sessions listen on (`ip:port`).
    pub listen_addr: String,
    /// Its host id (the local path compares it).
    pub host_id: String,
    /// Its publications.
    pub ranges: Vec<RangeRecord>,
    /// Its listener token (hexadecimal), when it listens with one: whoever
    /// may read the metadata service may open it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener_token: Option<String>,
}

impl PeerRecord {
    /// The record of an engine that serves `publication` at `listen_addr`
    /// (e.g. `TransferEngine::segment_publication()` and the address of
    /// its `serve_tcp` listener).
    pub fn from_publication(
        source_id: &str,
        listen_addr: std::net::SocketAddr,
        host_id: &str,
        publication: &orbitte_wire::SegmentPublication,
    ) -> Self {
        Self {
            source_id: source_id.to_owned(),
            epoch: publication.epoch.value(),
            listen_addr: listen_addr.to_string(),
            host_id: host_id.to_owned(),
            ranges: publication
                .ranges
                .iter()
                .map(|r| RangeRecord {
                    range_id: r.range_id.0,
                    length: r.length,
                    access: r.access.0,
                    token: r.token.0,
                    local_host: r.local.as_ref().map(|h| h.host_id.as_str().to_owned()),
                })
                .collect(),
            listener_token: None,
        }
    }

    /// The JSON bytes stored in the metadata service.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain strings and integers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses stored bytes; a malformed record is an error, never a panic.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, MetadataError> {
        serde_json::from_slice(bytes).map_err(|e| MetadataError::Malformed(e.to_string()))
    }
}

/// Why a metadata operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// A stored record does not parse.
    #[error("malformed metadata record: {0}; was it written by another release?")]
    Malformed(String),
    /// The metadata service failed or is unreachable.
    #[error("metadata service {endpoint}: {reason}; check that it runs and is reachable")]
    Service {
        /// Endpoints tried.
        endpoint: String,
        /// What the client said.
        reason: String,
    },
    /// The engine was built without the `etcd` feature.
    #[error("etcd metadata needs orbitte-engine built with the `etcd` cargo feature")]
    NotBuilt,
}

/// What [`DescriptorCache::update`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheUpdate {
    /// First record from this source.
    Inserted,
    /// Same epoch: descriptors refreshed.
    Refreshed,
    /// A newer epoch replaced the old one; everything cached from the old
    /// epoch was dropped.
    Replaced {
        /// The epoch that was dropped.
        old_epoch: u64,
        /// How many ranges were dropped with it.
        dropped: usize,
    },
    /// An older epoch than the cached one: refused, cache unchanged.
    Stale {
        /// The epoch cached.
        current: u64,
    },
}

/// Descriptors cached per source owner, obeying the epoch rule.
#[derive(Debug, Default)]
pub struct DescriptorCache {
    /// Invariant: one entry per source id, holding the newest epoch seen.
    by_source: HashMap<String, PeerRecord>,
}

impl DescriptorCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Offers a record.
    pub fn update(&mut self, record: PeerRecord) -> CacheUpdate {
        match self.by_source.get(&record.source_id) {
            None => {
                self.by_source.insert(record.source_id.clone(), record);
                CacheUpdate::Inserted
            }
            Some(old) if old.epoch > record.epoch => CacheUpdate::Stale { current: old.epoch },
            Some(old) if old.epoch == record.epoch => {
                self.by_source.insert(record.source_id.clone(), record);
                CacheUpdate::Refreshed
            }
            Some(old) => {
                let (old_epoch, dropped) = (old.epoch, old.ranges.len());
                tracing::info!(
                    source = %record.source_id,
                    old_epoch,
                    new_epoch = record.epoch,
                    dropped,
                    "newer epoch adopted: descriptors of the old epoch dropped"
                );
                self.by_source.insert(record.source_id.clone(), record);
                CacheUpdate::Replaced { old_epoch, dropped }
            }
        }
    }

    /// Drops everything cached from `source` older than `epoch` (a session
    /// of a newer epoch was adopted). Returns the number of ranges dropped.
    pub fn invalidate_before(&mut self, source: &str, epoch: u64) -> usize {
        match self.by_source.get(source) {
            Some(r) if r.epoch < epoch => {
                let n = r.ranges.len();
                self.by_source.remove(source);
                n
            }
            _ => 0,
        }
    }

    /// The cached record of `source`.
    pub fn record(&self, source: &str) -> Option<&PeerRecord> {
        self.by_source.get(source)
    }

    /// One cached range.
    pub fn range(&self, source: &str, range_id: u64) -> Option<&RangeRecord> {
        self.by_source
            .get(source)?
            .ranges
            .iter()
            .find(|r| r.range_id == range_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(epoch: u64, ranges: usize) -> PeerRecord {
        PeerRecord {
            source_id: "a".into(),
            epoch,
            listen_addr: "127.0.0.1:1".into(),
            host_id: "h".into(),
            ranges: (0..ranges as u64)
                .map(|i| RangeRecord {
                    range_id: i,
                    length: 10,
                    access: 6,
                    token: 99,
                    local_host: None,
                })
                .collect(),
            listener_token: None,
        }
    }

    #[test]
    fn epoch_rule_older_refused_newer_replaces_equal_refreshes() {
        let mut c = DescriptorCache::new();
        assert_eq!(c.update(rec(5, 2)), CacheUpdate::Inserted);
        assert_eq!(c.update(rec(4, 1)), CacheUpdate::Stale { current: 5 });
        assert_eq!(c.record("a").unwrap().ranges.len(), 2);
        assert_eq!(c.update(rec(5, 3)), CacheUpdate::Refreshed);
        assert_eq!(
            c.update(rec(6, 1)),
            CacheUpdate::Replaced {
                old_epoch: 5,
                dropped: 3
            }
        );
        assert!(c.range("a", 2).is_none());
        assert_eq!(c.invalidate_before("a", 7), 1);
        assert!(c.record("a").is_none());
    }

    #[test]
    fn records_roundtrip_and_garbage_is_an_error() {
        let r = rec(3, 2);
        assert_eq!(PeerRecord::from_bytes(&r.to_bytes()).unwrap(), r);
        assert!(matches!(
            PeerRecord::from_bytes(b"\xff{"),
            Err(MetadataError::Malformed(_))
        ));
    }
}
