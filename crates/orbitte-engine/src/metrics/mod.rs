//! What the engine counts, and the counts as data.
//!
//! Per path and peer (source id): requests, bytes (completed prefix) and
//! outcomes by kind for each op, and a latency histogram from submit to
//! outcome; engine-wide: rails up and down, rail recoveries,
//! notifications sent and refused, listener refusals and evictions, and
//! registration budgets used. [`TransferEngine::metrics`](crate::TransferEngine::metrics)
//! returns a [`MetricsSnapshot`]; [`MetricsSnapshot::to_prometheus`] writes
//! it in the Prometheus text format.
//!
//! The counting is lock-free: a peer's cells ([`PeerCells`]) are looked up
//! once in the [`Registry`] (a mutex around a map, keyed by path and
//! source id) and kept where the driver keeps the peer, so counting an
//! outcome is a few relaxed atomic adds.

mod cells;
mod prometheus;
mod snapshot;
mod starts;

pub use cells::{MAX_PEER_ROWS, OTHER_PEERS, ServedCounter};
pub(crate) use cells::{PeerCells, Registry};
pub use prometheus::PROMETHEUS_CONTENT_TYPE;
pub use snapshot::{
    LATENCY_BUCKETS, LatencyHistogram, ListenerMetrics, MetricsSnapshot, NotificationMetrics,
    OpMetrics, OutcomeCounts, PeerMetrics, RegistrationMetrics,
};
pub(crate) use starts::Counting;
