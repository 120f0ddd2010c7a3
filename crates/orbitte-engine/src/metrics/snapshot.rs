//! The counts as plain data ([`MetricsSnapshot`]), as
//! [`TransferEngine::metrics`](crate::TransferEngine::metrics) returns them
//! and `docs/json.md` describes them.

use serde::Serialize;

/// Bounded latency buckets: bucket `i` holds latencies of at most 2^i µs
/// (1 µs to 2^26 µs, about 67 s); one more bucket holds the rest.
pub const LATENCY_BUCKETS: usize = 27;

/// What the engine counted since it was built.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricsSnapshot {
    /// This engine's source id.
    pub source_id: String,
    /// One row per path and peer (source id) the engine sent requests
    /// to, served, or has rails to, sorted by path, then peer; a peer
    /// whose sessions closed is in one more snapshot, then leaves. Past
    /// the engine's limit on peer rows, the other peers share one row per
    /// path whose `peer` is empty. A row with nothing counted is not
    /// listed.
    pub peers: Vec<PeerMetrics>,
    /// Times an rdma rail came back after going down (engine-wide).
    pub rail_recoveries: u64,
    /// Notifications this engine sent and received.
    pub notifications: NotificationMetrics,
    /// The engine's listener; `None` when it does not listen.
    pub listener: Option<ListenerMetrics>,
    /// Registration budgets: what is charged and the limits.
    pub registration: RegistrationMetrics,
}

/// The counts of one path and peer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeerMetrics {
    /// The path (`rdma`, `tcp`, `local`, `cuda-staging`).
    pub path: String,
    /// The peer's source id (as the peer presented it); empty: the
    /// peers past the engine's limit on peer rows, together.
    pub peer: String,
    /// Rails of this path to the peer that take work now.
    pub rails_up: u64,
    /// Rails of this path to the peer that are down.
    pub rails_down: u64,
    /// One entry per op: `read`, then `write`.
    pub ops: Vec<OpMetrics>,
}

/// The requests of one op to one peer on one path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpMetrics {
    /// `read` or `write`.
    pub op: String,
    /// Requests that got their outcome.
    pub requests: u64,
    /// Bytes known done: the sum of the outcomes' completed prefixes.
    pub bytes: u64,
    /// tcp requests of this op (one per slice) the peer made to this
    /// engine and it served as a target. Over the local and rdma paths
    /// the peer moves the bytes itself, unseen by the target: 0 there. A
    /// READ is counted as its payload starts out, a WRITE once its
    /// payload is in: before the peer has the outcome.
    pub served_requests: u64,
    /// Bytes those served requests moved.
    pub served_bytes: u64,
    /// The outcomes by kind.
    pub outcomes: OutcomeCounts,
    /// Time from submit to outcome.
    pub latency: LatencyHistogram,
}

/// Outcomes by kind. `complete + failed + timed_out + cancelled` is the
/// request count; `uncertain` counts, among them, the WRITEs whose remote
/// effect is only possible (bytes beyond the completed prefix may have
/// changed at the peer); always 0 for READ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OutcomeCounts {
    /// Every byte arrived.
    pub complete: u64,
    /// A slice failed.
    pub failed: u64,
    /// The request timeout passed first.
    pub timed_out: u64,
    /// The caller cancelled it.
    pub cancelled: u64,
    /// WRITEs whose remote effect is uncertain.
    pub uncertain: u64,
}

/// A latency histogram over [`LATENCY_BUCKETS`] log2 buckets of
/// microseconds and one for the rest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyHistogram {
    /// Observations per bucket (not cumulative): `counts[i]` for
    /// `i < LATENCY_BUCKETS` holds latencies in (2^(i-1) µs, 2^i µs] (the
    /// first from 0), the last one those above 2^26 µs.
    pub counts: Vec<u64>,
    /// Sum of all observed latencies, in seconds.
    pub sum_seconds: f64,
    /// Observations.
    pub count: u64,
}

impl LatencyHistogram {
    /// The upper bound of bucket `i` in seconds (2^i µs); `None` for the
    /// last, unbounded one.
    pub fn bound_seconds(i: usize) -> Option<f64> {
        (i < LATENCY_BUCKETS).then(|| (1u64 << i) as f64 * 1e-6)
    }
}

/// Notifications (batch notifications): the initiator's and the target's
/// side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NotificationMetrics {
    /// Notifications this engine's batches handed to a rail.
    pub sent: u64,
    /// Notifications of this engine's batches that no rail took (the
    /// batch's outcomes say `NotSent`).
    pub not_sent: u64,
    /// Notifications from peers queued for the application.
    pub received: u64,
    /// Notifications from peers refused because the queue was full.
    pub refused_full: u64,
    /// Notification frames from peers that did not decode.
    pub malformed: u64,
    /// Waiting to be read now.
    pub queued: u64,
}

/// The listener's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ListenerMetrics {
    /// Connections accepted.
    pub accepted: u64,
    /// Sessions that completed the handshake.
    pub admitted: u64,
    /// Connections refused or closed for a bad reason.
    pub refused: u64,
    /// Connections refused before authenticating: no pre-auth slot
    /// (too many unauthenticated connections from the address, or none
    /// accepted).
    pub preauth_refused: u64,
    /// Unauthenticated connections closed to make room for a newcomer.
    pub preauth_evicted: u64,
    /// Idle tcp data sessions closed to make room for a newcomer
    /// (`max_sessions` reached).
    pub sessions_evicted: u64,
    /// Connections open now.
    pub live: u64,
}

/// Registration budgets used and their limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RegistrationMetrics {
    /// MRs charged (retained copies included).
    pub mrs_used: u64,
    /// Bytes charged (every copy counts its full range).
    pub bytes_used: u64,
    /// The MR budget.
    pub max_mrs: u64,
    /// The byte budget.
    pub max_bytes: u64,
}
