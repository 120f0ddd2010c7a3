//! The peer table: authoritative epochs per source owner, as pure logic.
//!
//! The engine keeps one `PeerTable`. For every admitted `hello`/`hello-ack`
//! it calls [`PeerTable::admit`]; for every publication and retire frame
//! [`PeerTable::record_publication`] / [`PeerTable::record_retire`]; for every
//! RC connection it sets up, [`PeerTable::record_rc_connection`]; when a
//! session ends, [`PeerTable::session_closed`].
//!
//! Rules (docs/protocol.md, "Epochs"):
//! - a source presenting an older epoch than the one recorded is rejected,
//!   whatever TCP address it comes from (the table is keyed by source id,
//!   never by address, so reopening the same address cannot adopt the newer
//!   incarnation's state);
//! - a newer epoch replaces the source: everything cached from the old one is
//!   returned as an [`Invalidation`] for the engine to tear down;
//! - an equal epoch is a reconnect (another session of the same incarnation);
//! - a protocol version other than ours is rejected, naming both versions.
//!
//! Every method checks everything before it changes anything: on error the
//! table is exactly as before.
//!
//! # Bounded, without forgetting a fence
//!
//! Any peer can present a new source id (without a cluster secret, any
//! number of them), so the table cannot keep a full record per source
//! forever. It keeps three tiers ([`PeerTableLimits`]):
//!
//! 1. Full records ([`SourceRecord`]), at most `max_sources` of them once
//!    the idle ones are evicted. A record is evictable only when it holds
//!    nothing the engine still uses: no session, no RC connection, no
//!    cached descriptor. Among those, the least recently active goes first.
//!    A source with a live session is never evicted, so the bound can be
//!    exceeded by sources that are all in use (which other limits bound).
//! 2. Fences of evicted sources: a 64-bit fingerprint of the source id and
//!    its authoritative epoch (tens of bytes each instead of a record), at
//!    most `max_fences`. A source that comes back is judged against its
//!    fence exactly as against its record: an older epoch is refused, an
//!    equal one is a reconnect, a newer one replaces it.
//! 3. When the fences are full, the oldest fence is folded into one of
//!    [`FLOOR_BUCKETS`] floors (the highest epoch folded into the bucket of
//!    its fingerprint). A source that has neither a record nor a fence must
//!    present at least its bucket's floor. Nothing is ever forgotten: a
//!    folded fence still refuses every older incarnation of its source; the
//!    price is that a source never seen (or long evicted) whose epoch is
//!    older than an unrelated source's in its bucket is refused too, as
//!    stale, until it restarts with a newer epoch. Epochs are start times
//!    ([`Epoch::choose`](crate::Epoch::choose)), so this hits only engines that started
//!    before the folded one and were idle through `max_fences` newer
//!    sources.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;

use crate::epoch::Epoch;
use crate::frames::{Identity, NicRkey, SegmentPublication, SegmentRetire};
use crate::header::PROTOCOL_VERSION;
use crate::types::{Capabilities, ConnectId, ErrorCode, NicId, RangeId, SourceId};

/// The engine's handle for one control session (one TCP connection), chosen
/// by the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

/// One rkey cached from a source: which range, which NIC, which key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CachedRkey {
    /// The range.
    pub range_id: RangeId,
    /// The owner's NIC.
    pub nic_id: NicId,
    /// The key.
    pub rkey: u32,
}

/// What the engine must drop because a source's incarnation ended (newer
/// epoch) or because ranges were retired. Plain data, sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Invalidation {
    /// Control sessions of the old incarnation to close.
    pub sessions: Vec<SessionId>,
    /// RC connections (queue pairs) to the old incarnation to destroy.
    pub rc_connections: Vec<(SessionId, ConnectId)>,
    /// Cached segment descriptors to drop.
    pub descriptors: Vec<RangeId>,
    /// Cached rkeys to drop; requests must never use them again.
    pub rkeys: Vec<CachedRkey>,
}

/// The outcome of a successful [`PeerTable::admit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// First time this source is seen.
    New,
    /// Same epoch as recorded: another session of the same incarnation.
    /// Cached descriptors and rkeys stay valid.
    Reconnect,
    /// A newer epoch: the source restarted. The old incarnation's state is
    /// gone from the table; the engine tears down what is listed.
    Replaced {
        /// The epoch that was recorded.
        previous: Epoch,
        /// What to tear down.
        invalidated: Invalidation,
    },
}

/// A `hello` or `hello-ack` was rejected. The table is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// The peer speaks another protocol version; there is no fallback.
    #[error(
        "source `{source_id}` speaks orbitte protocol version {theirs}, we speak {ours}; \
         run the same orbitte release on both (no legacy or mixed-engine fallback)"
    )]
    VersionMismatch {
        /// The peer.
        source_id: SourceId,
        /// Our version.
        ours: u16,
        /// Theirs.
        theirs: u16,
    },
    /// The epoch is older than the one recorded for the source.
    #[error(
        "source `{source_id}` presented epoch {presented}{from}, older than its recorded \
         authoritative epoch {recorded}{same}; a restarted engine must present a newer epoch",
        from = from.map(|a| format!(" from {a}")).unwrap_or_default(),
        same = if *same_address { " (an address the recorded incarnation used)" } else { "" }
    )]
    StaleEpoch {
        /// The peer.
        source_id: SourceId,
        /// The epoch it presented.
        presented: Epoch,
        /// The epoch on record.
        recorded: Epoch,
        /// Where the session came from, if known.
        from: Option<SocketAddr>,
        /// Whether a session of the recorded incarnation came from that same
        /// address (diagnostic: the old process reconnecting).
        same_address: bool,
    },
    /// The peer presented our own source id (a loop or a misconfiguration).
    #[error("peer presented our own source id `{source_id}`; give every engine its own id")]
    OwnSourceId {
        /// The id.
        source_id: SourceId,
    },
    /// The session id is already admitted (engine bug).
    #[error("session {session:?} is already admitted; use a fresh session id per connection")]
    SessionInUse {
        /// The session.
        session: SessionId,
    },
}

impl AdmitError {
    /// The code of the `error` frame to send before closing.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            Self::VersionMismatch { .. } => ErrorCode::UNSUPPORTED_VERSION,
            Self::StaleEpoch { .. } => ErrorCode::STALE_EPOCH,
            Self::OwnSourceId { .. } => ErrorCode::SOURCE_CONFLICT,
            Self::SessionInUse { .. } => ErrorCode::INTERNAL,
        }
    }
}

/// A publication, retire or RC connection could not be recorded. The table
/// is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The session was never admitted or was closed or invalidated.
    #[error("session {session:?} is not admitted; admit its hello first")]
    UnknownSession {
        /// The session.
        session: SessionId,
    },
    /// The frame's epoch is not the session's source's current epoch.
    #[error(
        "frame from source `{source_id}` names epoch {frame_epoch}, but its authoritative \
         epoch is {current}; drop the frame"
    )]
    EpochMismatch {
        /// The source.
        source_id: SourceId,
        /// The epoch in the frame.
        frame_epoch: Epoch,
        /// The recorded epoch.
        current: Epoch,
    },
}

impl RecordError {
    /// The code of the `error` frame to send before closing.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            Self::UnknownSession { .. } => ErrorCode::UNEXPECTED_FRAME,
            Self::EpochMismatch { .. } => ErrorCode::STALE_EPOCH,
        }
    }
}

/// How much a [`PeerTable`] keeps (module docs, "Bounded").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerTableLimits {
    /// Full records kept once idle ones are evicted.
    pub max_sources: usize,
    /// Fences (fingerprint and epoch) of evicted sources kept before the
    /// oldest is folded into a floor.
    pub max_fences: usize,
}

impl Default for PeerTableLimits {
    /// 1024 records (about 1 MiB) and 65 536 fences (about 3 MiB).
    fn default() -> Self {
        Self {
            max_sources: 1024,
            max_fences: 1 << 16,
        }
    }
}

/// Buckets of the epoch floors that folded fences raise.
pub const FLOOR_BUCKETS: usize = 256;

/// What the table knows about one source owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRecord {
    /// The authoritative epoch.
    pub epoch: Epoch,
    /// Capabilities announced by the latest admitted hello.
    pub capabilities: Capabilities,
    /// Open sessions and their remote addresses.
    pub sessions: BTreeMap<SessionId, Option<SocketAddr>>,
    /// RC connections set up with this incarnation.
    pub rc_connections: BTreeSet<(SessionId, ConnectId)>,
    /// Cached descriptors: range id → its rkeys.
    pub ranges: BTreeMap<RangeId, Vec<NicRkey>>,
    /// When it was last admitted or closed a session (the table's tick).
    last_active: u64,
}

impl SourceRecord {
    fn new(identity: &Identity) -> Self {
        Self {
            epoch: identity.epoch,
            capabilities: identity.capabilities,
            sessions: BTreeMap::new(),
            rc_connections: BTreeSet::new(),
            ranges: BTreeMap::new(),
            last_active: 0,
        }
    }

    /// Whether the engine uses nothing of it: it may become a fence.
    fn is_idle(&self) -> bool {
        self.sessions.is_empty() && self.rc_connections.is_empty() && self.ranges.is_empty()
    }

    fn into_invalidation(self) -> Invalidation {
        let mut inv = Invalidation {
            sessions: self.sessions.into_keys().collect(),
            rc_connections: self.rc_connections.into_iter().collect(),
            ..Invalidation::default()
        };
        for (range_id, keys) in self.ranges {
            inv.descriptors.push(range_id);
            inv.rkeys.extend(keys.iter().map(|k| CachedRkey {
                range_id,
                nic_id: k.nic_id,
                rkey: k.rkey,
            }));
        }
        inv
    }
}

/// Per source owner: the authoritative epoch and what was cached from it.
/// See the module docs for the rules and the calling order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTable {
    local: SourceId,
    sources: BTreeMap<SourceId, SourceRecord>,
    /// Invariant: every session here is in its source's `sessions`, and
    /// vice versa.
    sessions: BTreeMap<SessionId, SourceId>,
    limits: PeerTableLimits,
    /// Evicted sources: fingerprint → (epoch, when it became a fence).
    /// Invariant: no fingerprint of a source in `sources`; `by_age` holds
    /// exactly the same entries, keyed by age.
    fences: BTreeMap<u64, (Epoch, u64)>,
    by_age: BTreeMap<u64, u64>,
    /// Highest epoch folded into each bucket (empty until a fence folds).
    floors: Vec<u64>,
    /// Counts admissions and closes: activity order and fence age.
    tick: u64,
}

/// The 64-bit fingerprint of a source id that fences and floors use.
fn fingerprint(source_id: &SourceId) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    source_id.as_str().hash(&mut h);
    h.finish()
}

impl PeerTable {
    /// An empty table for the engine whose own source id is `local`, with
    /// the default [`PeerTableLimits`].
    pub fn new(local: SourceId) -> Self {
        Self::with_limits(local, PeerTableLimits::default())
    }

    /// An empty table keeping at most `limits` (see the module docs).
    pub fn with_limits(local: SourceId, limits: PeerTableLimits) -> Self {
        Self {
            local,
            sources: BTreeMap::new(),
            sessions: BTreeMap::new(),
            limits,
            fences: BTreeMap::new(),
            by_age: BTreeMap::new(),
            floors: Vec::new(),
            tick: 0,
        }
    }

    /// The epoch a source without a record must at least present, and
    /// whether it comes from its own fence (`true`) or a shared floor.
    fn fence_of_unknown(&self, source_id: &SourceId) -> Option<(Epoch, bool)> {
        let fp = fingerprint(source_id);
        if let Some((epoch, _)) = self.fences.get(&fp) {
            return Some((*epoch, true));
        }
        let floor = *self.floors.get(fp as usize % FLOOR_BUCKETS)?;
        Epoch::new(floor).ok().map(|e| (e, false))
    }

    /// The fence the table holds for `source_id` when it has no full
    /// record (evicted): the epoch it must at least present. `None` when it
    /// has a record (see [`PeerTable::epoch_of`]) or no fence at all.
    pub fn fence_of(&self, source_id: &SourceId) -> Option<Epoch> {
        if self.sources.contains_key(source_id) {
            return None;
        }
        self.fence_of_unknown(source_id).map(|(e, _)| e)
    }

    /// Turns idle records into fences (least recently active first) until
    /// at most `max_sources` records remain or none is idle, and folds the
    /// oldest fences into floors beyond `max_fences`.
    fn trim(&mut self) {
        while self.sources.len() > self.limits.max_sources {
            let Some(victim) = self
                .sources
                .iter()
                .filter(|(_, r)| r.is_idle())
                .min_by_key(|(_, r)| r.last_active)
                .map(|(s, _)| s.clone())
            else {
                break;
            };
            let Some(rec) = self.sources.remove(&victim) else {
                break;
            };
            self.tick += 1;
            let fp = fingerprint(&victim);
            if let Some((_, age)) = self.fences.insert(fp, (rec.epoch, self.tick)) {
                self.by_age.remove(&age);
            }
            self.by_age.insert(self.tick, fp);
        }
        while self.fences.len() > self.limits.max_fences {
            let Some((_, fp)) = self.by_age.pop_first() else {
                break;
            };
            if let Some((epoch, _)) = self.fences.remove(&fp) {
                if self.floors.is_empty() {
                    self.floors = vec![0; FLOOR_BUCKETS];
                }
                let floor = &mut self.floors[fp as usize % FLOOR_BUCKETS];
                *floor = (*floor).max(epoch.value());
            }
        }
    }

    /// How many full records, fences and floors the table holds.
    pub fn footprint(&self) -> (usize, usize, usize) {
        (self.sources.len(), self.fences.len(), self.floors.len())
    }

    /// Judges a peer's identity (from its `hello`, or from the `hello-ack`
    /// on the initiator side) and records the session under its source.
    ///
    /// Call it after authentication succeeded. On error nothing changed;
    /// send an `error` frame with [`AdmitError::error_code`] and close.
    pub fn admit(
        &mut self,
        session: SessionId,
        from: Option<SocketAddr>,
        identity: &Identity,
    ) -> Result<Admission, AdmitError> {
        let source_id = &identity.source_id;
        if identity.protocol_version != PROTOCOL_VERSION {
            return Err(AdmitError::VersionMismatch {
                source_id: source_id.clone(),
                ours: PROTOCOL_VERSION,
                theirs: identity.protocol_version,
            });
        }
        if *source_id == self.local {
            return Err(AdmitError::OwnSourceId {
                source_id: source_id.clone(),
            });
        }
        if self.sessions.contains_key(&session) {
            return Err(AdmitError::SessionInUse { session });
        }
        let fenced = if self.sources.contains_key(source_id) {
            None
        } else {
            self.fence_of_unknown(source_id)
        };
        let admission = match (self.sources.get(source_id), fenced) {
            (None, Some((recorded, _))) if identity.epoch < recorded => {
                return Err(AdmitError::StaleEpoch {
                    source_id: source_id.clone(),
                    presented: identity.epoch,
                    recorded,
                    from,
                    same_address: false,
                });
            }
            (None, Some((recorded, true))) if identity.epoch == recorded => Admission::Reconnect,
            (None, Some((previous, true))) => Admission::Replaced {
                previous,
                invalidated: Invalidation::default(),
            },
            (None, _) => Admission::New,
            (Some(rec), _) if identity.epoch < rec.epoch => {
                return Err(AdmitError::StaleEpoch {
                    source_id: source_id.clone(),
                    presented: identity.epoch,
                    recorded: rec.epoch,
                    from,
                    same_address: from.is_some() && rec.sessions.values().any(|a| *a == from),
                });
            }
            (Some(rec), _) if identity.epoch == rec.epoch => Admission::Reconnect,
            (Some(rec), _) => Admission::Replaced {
                previous: rec.epoch,
                invalidated: Invalidation::default(),
            },
        };
        // The source is back from its fence (if it had one).
        if matches!(fenced, Some((_, true)))
            && let Some((_, age)) = self.fences.remove(&fingerprint(source_id))
        {
            self.by_age.remove(&age);
        }
        // All checks passed: apply.
        let admission = match admission {
            Admission::Replaced { previous, .. } => {
                let old = self
                    .sources
                    .insert(source_id.clone(), SourceRecord::new(identity));
                let invalidated = old.map(SourceRecord::into_invalidation).unwrap_or_default();
                for s in &invalidated.sessions {
                    self.sessions.remove(s);
                }
                Admission::Replaced {
                    previous,
                    invalidated,
                }
            }
            other => other,
        };
        self.tick += 1;
        let rec = self
            .sources
            .entry(source_id.clone())
            .or_insert_with(|| SourceRecord::new(identity));
        rec.capabilities = identity.capabilities;
        rec.last_active = self.tick;
        rec.sessions.insert(session, from);
        self.sessions.insert(session, source_id.clone());
        self.trim();
        Ok(admission)
    }

    fn session_record(
        &self,
        session: SessionId,
        frame_epoch: Epoch,
    ) -> Result<&SourceId, RecordError> {
        let source_id = self
            .sessions
            .get(&session)
            .ok_or(RecordError::UnknownSession { session })?;
        // Invariant: a session's source has a record.
        let current = self
            .sources
            .get(source_id)
            .map(|r| r.epoch)
            .ok_or(RecordError::UnknownSession { session })?;
        if frame_epoch != current {
            return Err(RecordError::EpochMismatch {
                source_id: source_id.clone(),
                frame_epoch,
                current,
            });
        }
        Ok(source_id)
    }

    /// Caches the ranges of a `segment-publication` received on `session`
    /// (replacing same-id ranges). Returns the rkeys the replaced ranges had
    /// that the new descriptors no longer carry.
    pub fn record_publication(
        &mut self,
        session: SessionId,
        publication: &SegmentPublication,
    ) -> Result<Invalidation, RecordError> {
        let source_id = self.session_record(session, publication.epoch)?.clone();
        let mut inv = Invalidation::default();
        if let Some(rec) = self.sources.get_mut(&source_id) {
            for range in &publication.ranges {
                if let Some(old) = rec.ranges.insert(range.range_id, range.rkeys.clone()) {
                    inv.rkeys
                        .extend(old.iter().filter(|k| !range.rkeys.contains(k)).map(|k| {
                            CachedRkey {
                                range_id: range.range_id,
                                nic_id: k.nic_id,
                                rkey: k.rkey,
                            }
                        }));
                }
            }
        }
        inv.rkeys.sort();
        Ok(inv)
    }

    /// Drops the ranges of a `segment-retire` received on `session` and
    /// returns their descriptors and rkeys. Ids not cached are ignored
    /// (retire is idempotent).
    pub fn record_retire(
        &mut self,
        session: SessionId,
        retire: &SegmentRetire,
    ) -> Result<Invalidation, RecordError> {
        let source_id = self.session_record(session, retire.epoch)?.clone();
        let mut inv = Invalidation::default();
        if let Some(rec) = self.sources.get_mut(&source_id) {
            for id in &retire.range_ids {
                if let Some(keys) = rec.ranges.remove(id) {
                    inv.descriptors.push(*id);
                    inv.rkeys.extend(keys.iter().map(|k| CachedRkey {
                        range_id: *id,
                        nic_id: k.nic_id,
                        rkey: k.rkey,
                    }));
                }
            }
        }
        inv.descriptors.sort();
        inv.rkeys.sort();
        Ok(inv)
    }

    /// Records an RC connection set up over `session` (after its
    /// `connect-accept`), so that a newer epoch lists it for teardown.
    pub fn record_rc_connection(
        &mut self,
        session: SessionId,
        connect_id: ConnectId,
    ) -> Result<(), RecordError> {
        let source_id = self
            .sessions
            .get(&session)
            .ok_or(RecordError::UnknownSession { session })?;
        if let Some(rec) = self.sources.get_mut(source_id) {
            rec.rc_connections.insert((session, connect_id));
        }
        Ok(())
    }

    /// Forgets an RC connection the engine destroyed.
    pub fn rc_connection_closed(&mut self, session: SessionId, connect_id: ConnectId) {
        for rec in self.sources.values_mut() {
            rec.rc_connections.remove(&(session, connect_id));
        }
        self.trim();
    }

    /// The session ended (goodbye, error or socket closed). The source's
    /// epoch, cached descriptors and RC connections stay (queue pairs outlive
    /// the control session; forget them with
    /// [`PeerTable::rc_connection_closed`]): its epoch must still fence older
    /// incarnations, and a reconnect at the same epoch reuses the cache.
    /// Returns the session's source, or `None` if it was not admitted (or
    /// was already invalidated by a newer epoch).
    pub fn session_closed(&mut self, session: SessionId) -> Option<SourceId> {
        let source_id = self.sessions.remove(&session)?;
        self.tick += 1;
        if let Some(rec) = self.sources.get_mut(&source_id) {
            rec.sessions.remove(&session);
            rec.last_active = self.tick;
        }
        self.trim();
        Some(source_id)
    }

    /// The source a session belongs to.
    pub fn source_of(&self, session: SessionId) -> Option<&SourceId> {
        self.sessions.get(&session)
    }

    /// What is recorded for a source.
    pub fn source(&self, source_id: &SourceId) -> Option<&SourceRecord> {
        self.sources.get(source_id)
    }

    /// The authoritative epoch recorded for a source.
    pub fn epoch_of(&self, source_id: &SourceId) -> Option<Epoch> {
        self.sources.get(source_id).map(|r| r.epoch)
    }

    /// Every source on record.
    pub fn sources(&self) -> impl Iterator<Item = (&SourceId, &SourceRecord)> {
        self.sources.iter()
    }
}
