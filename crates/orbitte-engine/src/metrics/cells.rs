//! The counters: one [`PeerCells`] per path and peer, in a [`Registry`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use orbitte_proto::outcome::{Outcome, RemoteEffect, Status};
use orbitte_proto::{Op, PathKind};

use super::snapshot::{LATENCY_BUCKETS, LatencyHistogram, OpMetrics, OutcomeCounts, PeerMetrics};

/// Peer rows (path and peer) a registry keeps apart by default
/// ([`EngineBuilder::metrics_peer_rows`](crate::EngineBuilder::metrics_peer_rows));
/// the peers past it are counted together, per path, under the peer
/// [`OTHER_PEERS`].
pub const MAX_PEER_ROWS: usize = 64;

/// The peer label of the row that counts the peers past the registry's
/// limit: empty, which no source id is (so no peer can name itself into
/// it).
pub const OTHER_PEERS: &str = "";

/// Every path and peer the engine counts for, keyed by path and the
/// peer's source id (a peer that restarts with a new epoch keeps its
/// counters while its row lives). Source ids come from the network, so
/// the rows are bounded:
/// - a row leaves with its peer: once nothing holds its cells (the
///   peer's sessions closed), it is in the next [`snapshot`](Self::snapshot)
///   one last time and then dropped, or dropped at once when a newcomer
///   needs its place;
/// - past `limit` named rows, newcomers share one row per path, labelled
///   [`OTHER_PEERS`], which never leaves.
#[derive(Debug)]
pub(crate) struct Registry {
    rows: Mutex<HashMap<(PathKind, String), Row>>,
    limit: usize,
}

#[derive(Debug)]
struct Row {
    cells: Arc<PeerCells>,
    /// A snapshot showed this row after its peer had left: the next one
    /// drops it.
    shown_departed: bool,
}

impl Row {
    /// Nothing but the registry holds the cells: the peer left.
    fn departed(&self) -> bool {
        Arc::strong_count(&self.cells) == 1
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::with_limit(MAX_PEER_ROWS)
    }
}

impl Registry {
    /// A registry keeping at most `limit` peer rows apart.
    pub(crate) fn with_limit(limit: usize) -> Self {
        Self {
            rows: Mutex::default(),
            limit,
        }
    }

    /// The cells of `peer` on `path`, made at the first call (past the
    /// limit: the path's row of [`OTHER_PEERS`]). The row lives while the
    /// caller holds the cells.
    pub(crate) fn cells(&self, path: PathKind, peer: &str) -> Arc<PeerCells> {
        let mut map = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        let key = (path, peer.to_owned());
        if let Some(row) = map.get_mut(&key) {
            row.shown_departed = false;
            return row.cells.clone();
        }
        let named = |map: &HashMap<(PathKind, String), Row>| {
            map.keys().filter(|(_, p)| p != OTHER_PEERS).count()
        };
        if named(&map) >= self.limit {
            map.retain(|(_, p), row| p == OTHER_PEERS || !row.departed());
        }
        let key = if named(&map) < self.limit && peer != OTHER_PEERS {
            key
        } else {
            (path, OTHER_PEERS.to_owned())
        };
        let label = key.1.clone();
        map.entry(key)
            .or_insert_with(|| Row {
                cells: Arc::new(PeerCells::new(path, &label)),
                shown_departed: false,
            })
            .cells
            .clone()
    }

    /// Every row's counts, sorted by path and peer; drops the rows of
    /// peers that had left by the previous snapshot.
    pub(crate) fn snapshot(&self) -> Vec<PeerMetrics> {
        let all: Vec<Arc<PeerCells>> = {
            let mut map = self.rows.lock().unwrap_or_else(|e| e.into_inner());
            map.retain(|(_, p), row| p == OTHER_PEERS || !(row.departed() && row.shown_departed));
            map.iter_mut()
                .map(|((_, p), row)| {
                    row.shown_departed = p != OTHER_PEERS && row.departed();
                    row.cells.clone()
                })
                .collect()
        };
        let mut rows: Vec<PeerMetrics> = all.iter().map(|c| c.snapshot()).collect();
        rows.sort_by(|a, b| (&a.path, &a.peer).cmp(&(&b.path, &b.peer)));
        rows
    }

    /// Rows held now (named and [`OTHER_PEERS`]).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.rows.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// The counters of one path and peer.
#[derive(Debug)]
pub(crate) struct PeerCells {
    path: PathKind,
    peer: String,
    /// Indexed by [`op_index`].
    ops: [OpCells; 2],
    /// What this engine served to the peer, as a target; indexed by
    /// [`op_index`].
    served: [ServedCells; 2],
}

#[derive(Debug, Default)]
struct ServedCells {
    requests: AtomicU64,
    bytes: AtomicU64,
}

/// Counts what a target serves one peer on one path: the tcp target
/// holds one per session and counts each READ and WRITE it served. The
/// peer's row is taken at the first count, not at the handshake, so a
/// session that is served nothing takes no row. The default counts
/// nothing (a target outside an engine).
#[derive(Debug, Clone, Default)]
pub struct ServedCounter(Option<Arc<LazyCells>>);

#[derive(Debug)]
struct LazyCells {
    registry: Arc<Registry>,
    path: PathKind,
    peer: String,
    cells: OnceLock<Arc<PeerCells>>,
}

impl ServedCounter {
    /// Counts into `peer`'s row on `path` of `registry`, taken at the
    /// first count.
    pub(crate) fn new(registry: Arc<Registry>, path: PathKind, peer: &str) -> Self {
        Self(Some(Arc::new(LazyCells {
            registry,
            path,
            peer: peer.to_owned(),
            cells: OnceLock::new(),
        })))
    }

    /// One request of `op` served, moving `bytes`.
    pub fn count(&self, op: Op, bytes: u64) {
        if let Some(l) = &self.0 {
            let c = l.cells.get_or_init(|| l.registry.cells(l.path, &l.peer));
            let s = &c.served[op_index(op)];
            s.requests.fetch_add(1, Ordering::Relaxed);
            s.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }
}

#[derive(Debug, Default)]
struct OpCells {
    requests: AtomicU64,
    bytes: AtomicU64,
    complete: AtomicU64,
    failed: AtomicU64,
    timed_out: AtomicU64,
    cancelled: AtomicU64,
    uncertain: AtomicU64,
    latency: Histogram,
}

fn op_index(op: Op) -> usize {
    match op {
        Op::Read => 0,
        Op::Write => 1,
    }
}

const OPS: [Op; 2] = [Op::Read, Op::Write];

impl PeerCells {
    fn new(path: PathKind, peer: &str) -> Self {
        Self {
            path,
            peer: peer.to_owned(),
            ops: Default::default(),
            served: Default::default(),
        }
    }

    /// The peer label of these cells (the source id, or [`OTHER_PEERS`]).
    pub(crate) fn peer(&self) -> &str {
        &self.peer
    }

    /// Counts one outcome: its request, its completed prefix, its kind
    /// (and, for a WRITE whose remote effect is not known, uncertain),
    /// and how long it took when that is known.
    ///
    /// Invariant: called only under the engine's state lock (the driver
    /// counts outcomes as they arrive), so it is the outcome counters' one
    /// writer: a load and a store add without a locked read-modify-write
    /// on the hot path, and readers (a snapshot) see whole values.
    pub(crate) fn count(&self, o: &Outcome, latency: Option<Duration>) {
        let c = &self.ops[op_index(o.op)];
        add(&c.requests, 1);
        add(&c.bytes, o.completed_prefix);
        let kind = match o.status {
            Status::Complete => &c.complete,
            Status::Failed => &c.failed,
            Status::TimedOut => &c.timed_out,
            Status::Cancelled => &c.cancelled,
        };
        add(kind, 1);
        if o.op == Op::Write && matches!(o.remote_effect, RemoteEffect::Possible { .. }) {
            add(&c.uncertain, 1);
        }
        if let Some(d) = latency {
            c.latency.observe(d);
        }
    }

    fn snapshot(&self) -> PeerMetrics {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PeerMetrics {
            path: self.path.name().to_owned(),
            peer: self.peer.clone(),
            rails_up: 0,
            rails_down: 0,
            ops: OPS
                .iter()
                .map(|&op| {
                    let c = &self.ops[op_index(op)];
                    let s = &self.served[op_index(op)];
                    OpMetrics {
                        op: op_name(op).to_owned(),
                        requests: load(&c.requests),
                        bytes: load(&c.bytes),
                        served_requests: load(&s.requests),
                        served_bytes: load(&s.bytes),
                        outcomes: OutcomeCounts {
                            complete: load(&c.complete),
                            failed: load(&c.failed),
                            timed_out: load(&c.timed_out),
                            cancelled: load(&c.cancelled),
                            uncertain: load(&c.uncertain),
                        },
                        latency: c.latency.snapshot(),
                    }
                })
                .collect(),
        }
    }
}

/// Adds `n` to a counter whose only writer is the caller (see
/// [`PeerCells::count`]).
fn add(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

/// The name an op has in the metrics (`read`, `write`).
pub(super) fn op_name(op: Op) -> &'static str {
    match op {
        Op::Read => "read",
        Op::Write => "write",
    }
}

/// Latencies in log2 buckets of microseconds: bucket `i` counts the
/// values of at most 2^i µs (1 µs up to about 67 s), the last one the
/// rest.
#[derive(Debug)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS + 1],
    sum_nanos: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
        }
    }
}

/// [`bucket_of_nanos`] of `d`.
#[cfg(test)]
fn bucket_of(d: Duration) -> usize {
    bucket_of_nanos(nanos_of(d))
}

/// `d` in nanoseconds, saturating (in u64: a division of u128 would cost
/// more than the rest of counting an outcome).
fn nanos_of(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The bucket of a latency of `nanos`: the smallest `i` with
/// `nanos <= 2^i µs`, or [`LATENCY_BUCKETS`] (beyond every bound).
fn bucket_of_nanos(nanos: u64) -> usize {
    let us = nanos.div_ceil(1000);
    if us <= 1 {
        return 0;
    }
    let i = (u64::BITS - (us - 1).leading_zeros()) as usize;
    i.min(LATENCY_BUCKETS)
}

impl Histogram {
    /// Only [`PeerCells::count`] observes: one writer (see there).
    fn observe(&self, d: Duration) {
        let nanos = nanos_of(d);
        add(&self.buckets[bucket_of_nanos(nanos)], 1);
        add(&self.sum_nanos, nanos);
    }

    fn snapshot(&self) -> LatencyHistogram {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        LatencyHistogram {
            count: counts.iter().sum(),
            counts,
            sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_past_the_limit_share_one_row_per_path() {
        let r = Registry::with_limit(2);
        let a = r.cells(PathKind::Tcp, "a");
        assert!(Arc::ptr_eq(&a, &r.cells(PathKind::Tcp, "a")));
        let b = r.cells(PathKind::Tcp, "b");
        let c = r.cells(PathKind::Tcp, "c");
        let d = r.cells(PathKind::Tcp, "d");
        assert!(Arc::ptr_eq(&c, &d), "c and d share the other peers' row");
        assert!(!Arc::ptr_eq(&b, &c));
        let local = r.cells(PathKind::Local, "e");
        assert!(!Arc::ptr_eq(&local, &c), "one row per path");
        assert!(
            Arc::ptr_eq(&a, &r.cells(PathKind::Tcp, "a")),
            "a keeps its row"
        );
        let rows: Vec<(String, String)> =
            r.snapshot().into_iter().map(|p| (p.path, p.peer)).collect();
        let row = |p: &str, q: &str| (p.to_owned(), q.to_owned());
        assert_eq!(
            rows,
            [
                row("local", ""),
                row("tcp", ""),
                row("tcp", "a"),
                row("tcp", "b")
            ]
        );
    }

    #[test]
    fn a_row_leaves_with_its_peer_after_one_last_snapshot() {
        let r = Registry::with_limit(2);
        let a = r.cells(PathKind::Tcp, "a");
        let b = r.cells(PathKind::Tcp, "b");
        drop(a);
        let peers =
            |r: &Registry| -> Vec<String> { r.snapshot().into_iter().map(|p| p.peer).collect() };
        assert_eq!(peers(&r), ["a", "b"], "a's last counts are shown once");
        assert_eq!(peers(&r), ["b"], "then a's row leaves");
        // A peer that comes back before its row left keeps it.
        drop(b);
        assert_eq!(peers(&r), ["b"]);
        let b = r.cells(PathKind::Tcp, "b");
        assert_eq!(peers(&r), ["b"]);
        // A newcomer at the limit takes the place of a departed row.
        let c = r.cells(PathKind::Tcp, "c");
        drop(c);
        let d = r.cells(PathKind::Tcp, "d");
        assert_eq!(d.peer(), "d", "c left, so d has a row of its own");
        let e = r.cells(PathKind::Tcp, "e");
        assert_eq!(
            e.peer(),
            OTHER_PEERS,
            "b and d are live: e is counted with the others"
        );
        drop(b);
        // Thousands of peers that come and go hold at most the limit.
        for i in 0..5000 {
            let c = r.cells(PathKind::Tcp, &format!("peer-{i}"));
            c.served[0].requests.fetch_add(1, Ordering::Relaxed);
        }
        assert!(r.len() <= 3, "{} rows", r.len());
        r.snapshot();
        r.snapshot();
        assert_eq!(r.len(), 2, "d and the other peers' row");
        drop((d, e));
    }

    #[test]
    fn a_latency_falls_in_the_first_bucket_whose_bound_holds_it() {
        let us = Duration::from_micros;
        assert_eq!(bucket_of(Duration::ZERO), 0);
        assert_eq!(bucket_of(Duration::from_nanos(999)), 0);
        assert_eq!(bucket_of(us(1)), 0);
        assert_eq!(bucket_of(Duration::from_nanos(1001)), 1);
        assert_eq!(bucket_of(us(2)), 1);
        assert_eq!(bucket_of(us(3)), 2);
        assert_eq!(bucket_of(us(4)), 2);
        assert_eq!(bucket_of(us(5)), 3);
        assert_eq!(bucket_of(us(1 << 26)), 26);
        assert_eq!(bucket_of(us((1 << 26) + 1)), LATENCY_BUCKETS);
        assert_eq!(bucket_of(Duration::from_secs(3600)), LATENCY_BUCKETS);
        for i in 0..LATENCY_BUCKETS {
            assert_eq!(bucket_of(us(1 << i)), i, "the bound of bucket {i} is in it");
        }
    }

    #[test]
    fn an_outcome_counts_its_request_prefix_kind_and_latency() {
        let cells = PeerCells::new(PathKind::Tcp, "decode");
        let mut o = Outcome {
            request: orbitte_proto::outcome::RequestId(1),
            label: 0,
            op: Op::Write,
            len: 100,
            status: Status::TimedOut,
            completed_prefix: 40,
            completed_slices: 1,
            slices: 3,
            failure: None,
            uncertain: 40..100,
            remote_effect: RemoteEffect::Possible { bytes: 40..100 },
            drain: orbitte_proto::outcome::DrainStatus::Drained,
            notification: orbitte_proto::notification::NotificationStatus::NotRequested,
        };
        cells.count(&o, Some(Duration::from_micros(3)));
        o.op = Op::Read;
        o.status = Status::Complete;
        o.completed_prefix = 100;
        o.remote_effect = RemoteEffect::None;
        cells.count(&o, None);
        let row = cells.snapshot();
        let (read, write) = (&row.ops[0], &row.ops[1]);
        assert_eq!((read.op.as_str(), write.op.as_str()), ("read", "write"));
        assert_eq!((write.requests, write.bytes), (1, 40));
        assert_eq!((write.outcomes.timed_out, write.outcomes.uncertain), (1, 1));
        assert_eq!(write.outcomes.complete, 0);
        assert_eq!(write.latency.count, 1);
        assert_eq!(write.latency.counts[2], 1);
        assert!((write.latency.sum_seconds - 3e-6).abs() < 1e-12);
        assert_eq!(
            (read.requests, read.bytes, read.outcomes.complete),
            (1, 100, 1)
        );
        assert_eq!(read.outcomes.uncertain, 0);
        assert_eq!(read.latency.count, 0, "no latency known, none observed");
    }
}
