//! What a target has published, as the tcp and local paths look it up.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use orbitte_memory::HostMemory;
use orbitte_wire::{
    AccessFlags, AccessToken, Epoch, HostId, LocalHint, LocalMechanism, NicRkey, RangeDescriptor,
    RangeId, SegmentPublication,
};

pub use crate::transport::tcp::staged::ServedMemory;

/// One published range: the memory behind it and what peers may do.
#[derive(Debug, Clone)]
pub struct Published {
    /// The memory (kept alive by this clone while a request uses it): host
    /// memory, or GPU memory the tcp target stages through host memory.
    pub memory: ServedMemory,
    /// Where the range starts inside `memory`.
    pub offset: u64,
    /// Its length.
    ///
    /// Invariant: `offset + length` lies inside `memory`.
    pub length: u64,
    /// Remote access allowed (`REMOTE_READ`, `REMOTE_WRITE`).
    pub access: AccessFlags,
    /// The token requests must present.
    pub token: AccessToken,
}

impl Published {
    /// Whether a same-host peer may map it. A mapping of the memfd gives a
    /// peer the whole file, and always allows reading: so only a range that
    /// is the whole of its memfd-backed memory and readable by peers is
    /// mapped (a view inside a memory, or a write-only range, goes over
    /// tcp), and a writable one only while its memfd allows new writable
    /// mappings (the same memory published read-only seals it: see the
    /// local server's handout). GPU memory is never mappable: a same-host
    /// peer reaches it over tcp.
    pub fn is_mappable(&self) -> bool {
        let ServedMemory::Host(memory) = &self.memory else {
            return false;
        };
        let Some(fd) = memory.memfd() else {
            return false;
        };
        if !self.access.contains(AccessFlags::REMOTE_READ)
            || self.offset != 0
            || self.length != memory.len() as u64
        {
            return false;
        }
        !self.access.contains(AccessFlags::REMOTE_WRITE)
            || rustix::fs::fcntl_get_seals(fd)
                .is_ok_and(|seals| !seals.contains(rustix::fs::SealFlags::FUTURE_WRITE))
    }
}

/// The target's view of its publications. The engine implements it over
/// its registration table; [`PublicationTable`] is a standalone one.
pub trait RangeLookup: Send + Sync + std::fmt::Debug {
    /// The range, if it is published now (not retired).
    fn lookup(&self, range: RangeId) -> Option<Published>;
    /// Every remotely accessible range, for the `segment-publication` sent
    /// to each new session.
    fn published(&self) -> Vec<(RangeId, Published)>;
    /// The range's rkeys on the owner's NICs (a Host Direct registration),
    /// sent in each session's `segment-publication` so that a peer knows
    /// the range is also reachable over rdma (the path policy). Default:
    /// none.
    fn rkeys(&self, _range: RangeId) -> Vec<NicRkey> {
        Vec::new()
    }
    /// What counts the requests served to `peer` (a source id) over
    /// `path`. Default: nothing counts them.
    fn served_counter(
        &self,
        _path: crate::transport::PathKind,
        _peer: &str,
    ) -> crate::metrics::ServedCounter {
        crate::metrics::ServedCounter::default()
    }
    /// Queues a `notification` received over `path` on a session admitted
    /// as `from` (the target side calls it once the session's epoch was
    /// checked); returns the answer for its sender. Default: the target
    /// keeps no notification queue; the notification is refused
    /// (`not-kept`).
    fn notification(
        &self,
        from: &crate::session::PeerIdentity,
        path: crate::transport::PathKind,
        note: orbitte_wire::Notification,
    ) -> orbitte_wire::NotificationAnswer {
        tracing::debug!(
            source = %from.source_id,
            %path,
            id = note.notification_id,
            "notification refused: this target keeps no notification queue"
        );
        orbitte_wire::NotificationAnswer {
            notification_id: note.notification_id,
            verdict: orbitte_wire::NotificationVerdict::NOT_KEPT,
            limit: 0,
        }
    }
}

/// A simple publication table: ids count up, tokens are random.
#[derive(Debug, Default)]
pub struct PublicationTable {
    ranges: RwLock<BTreeMap<RangeId, Published>>,
    next: std::sync::atomic::AtomicU64,
}

impl PublicationTable {
    /// An empty table.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Publishes all of `memory` with `access`; returns the range id.
    pub fn publish(
        &self,
        memory: Arc<HostMemory>,
        access: AccessFlags,
    ) -> std::io::Result<RangeId> {
        let length = memory.len() as u64;
        self.publish_view(memory, 0, length, access)
    }

    /// Publishes `offset..offset + length` of `memory`.
    pub fn publish_view(
        &self,
        memory: Arc<HostMemory>,
        offset: u64,
        length: u64,
        access: AccessFlags,
    ) -> std::io::Result<RangeId> {
        let end = offset.checked_add(length);
        if length == 0 || end.is_none_or(|e| e > memory.len() as u64) {
            return Err(std::io::Error::other(format!(
                "view {offset}+{length} does not fit the {}-byte memory",
                memory.len()
            )));
        }
        let token = AccessToken(u64::from_ne_bytes(super::random_bytes()?));
        let id = RangeId(self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
        let p = Published {
            memory: ServedMemory::Host(memory),
            offset,
            length,
            access,
            token,
        };
        self.ranges
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, p);
        Ok(id)
    }

    /// Retires a range: new requests for it fail with `retired`/`unknown
    /// range`. Returns whether it was published.
    pub fn retire(&self, range: RangeId) -> bool {
        self.ranges
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&range)
            .is_some()
    }
}

impl RangeLookup for PublicationTable {
    fn lookup(&self, range: RangeId) -> Option<Published> {
        self.ranges
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&range)
            .cloned()
    }

    fn published(&self) -> Vec<(RangeId, Published)> {
        let r = self.ranges.read().unwrap_or_else(|e| e.into_inner());
        r.iter()
            .filter(|(_, p)| {
                p.access.contains(AccessFlags::REMOTE_READ)
                    || p.access.contains(AccessFlags::REMOTE_WRITE)
            })
            .map(|(id, p)| (*id, p.clone()))
            .collect()
    }
}

/// The descriptor of one range as peers see it.
pub(crate) fn descriptor(
    id: RangeId,
    p: &Published,
    host: &HostId,
    rkeys: Vec<NicRkey>,
) -> RangeDescriptor {
    RangeDescriptor {
        range_id: id,
        address: match &p.memory {
            ServedMemory::Host(memory) => memory.as_ptr() as u64 + p.offset,
            ServedMemory::Device(range) => range.buffer().device_ptr() + p.offset,
        },
        length: p.length,
        access: p.access,
        token: p.token,
        rkeys,
        local: p.is_mappable().then(|| LocalHint {
            host_id: host.clone(),
            mechanism: LocalMechanism::MEMFD,
            file_offset: p.offset,
        }),
    }
}

/// The `segment-publication` frames (at most `MAX_RANGES_PER_FRAME` ranges
/// each) describing everything `lookup` publishes.
pub(crate) fn publication_frames(
    lookup: &dyn RangeLookup,
    epoch: Epoch,
    host: &HostId,
) -> Vec<SegmentPublication> {
    let all: Vec<RangeDescriptor> = lookup
        .published()
        .iter()
        .map(|(id, p)| descriptor(*id, p, host, lookup.rkeys(*id)))
        .collect();
    if all.is_empty() {
        return vec![SegmentPublication {
            epoch,
            ranges: Vec::new(),
        }];
    }
    all.chunks(orbitte_wire::MAX_RANGES_PER_FRAME)
        .map(|c| SegmentPublication {
            epoch,
            ranges: c.to_vec(),
        })
        .collect()
}
