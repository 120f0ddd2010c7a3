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

use std::collections::{BTreeMap, BTreeSet};
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
}

impl SourceRecord {
    fn new(identity: &Identity) -> Self {
        Self {
            epoch: identity.epoch,
            capabilities: identity.capabilities,
            sessions: BTreeMap::new(),
            rc_connections: BTreeSet::new(),
            ranges: BTreeMap::new(),
        }
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
}

impl PeerTable {
    /// An empty table for the engine whose own source id is `local`.
    pub fn new(local: SourceId) -> Self {
        Self {
            local,
            sources: BTreeMap::new(),
            sessions: BTreeMap::new(),
        }
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
        let admission = match self.sources.get(source_id) {
            None => Admission::New,
            Some(rec) if identity.epoch < rec.epoch => {
                return Err(AdmitError::StaleEpoch {
                    source_id: source_id.clone(),
                    presented: identity.epoch,
                    recorded: rec.epoch,
                    from,
                    same_address: from.is_some() && rec.sessions.values().any(|a| *a == from),
                });
            }
            Some(rec) if identity.epoch == rec.epoch => Admission::Reconnect,
            Some(rec) => Admission::Replaced {
                previous: rec.epoch,
                invalidated: Invalidation::default(),
            },
        };
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
        let rec = self
            .sources
            .entry(source_id.clone())
            .or_insert_with(|| SourceRecord::new(identity));
        rec.capabilities = identity.capabilities;
        rec.sessions.insert(session, from);
        self.sessions.insert(session, source_id.clone());
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
        if let Some(rec) = self.sources.get_mut(&source_id) {
            rec.sessions.remove(&session);
        }
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
