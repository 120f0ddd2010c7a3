//! [`MetricsSnapshot::to_prometheus`]: the Prometheus text exposition
//! format, version 0.0.4, written by the Prometheus project's
//! `prometheus-client` (its families, `_total` suffixes, label escaping
//! and histogram layout), from a snapshot taken at scrape time.
//!
//! No zero series: a row is written for the ops a peer did something
//! with, and a side (initiator, target) only where it counted a request;
//! a peer's rails only while it has some.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::snapshot::{LatencyHistogram, MetricsSnapshot, OpMetrics, PeerMetrics};

/// The `Content-Type` of [`MetricsSnapshot::to_prometheus`]'s text.
pub const PROMETHEUS_CONTENT_TYPE: &str =
    prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

impl MetricsSnapshot {
    /// The snapshot in the Prometheus text format (0.0.4): every metric
    /// `docs/configuration.md` lists, counters ending in `_total`, per
    /// path and peer labelled `path`, `peer` (and `op`, `side`,
    /// `outcome`, `state`).
    pub fn to_prometheus(&self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Exposition(self.clone())));
        let mut out = String::new();
        // Writing to a String cannot fail, and the collector's own
        // encoding fails only when the writer does.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
        out
    }
}

/// A snapshot as a collector.
#[derive(Debug)]
struct Exposition(MetricsSnapshot);

type Fmt = Result<(), std::fmt::Error>;

fn counter(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> Fmt {
    enc.encode_descriptor(name, help, None, MetricType::Counter)?
        .encode_counter::<NoLabelSet, _, u64>(&v, None)
}

fn gauge(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> Fmt {
    enc.encode_descriptor(name, help, None, MetricType::Gauge)?
        .encode_gauge(&v)
}

/// Whether the op counted anything on either side.
fn active(o: &OpMetrics) -> bool {
    o.requests > 0 || o.served_requests > 0
}

/// The ops of `p` that counted something.
fn ops(p: &PeerMetrics) -> impl Iterator<Item = &OpMetrics> {
    p.ops.iter().filter(|o| active(o))
}

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Fmt {
        let m = &self.0;
        // Counter names go without `_total`: the encoder adds it.
        per_side(
            &mut enc,
            m,
            "orbitte_transfer_requests",
            "Requests by path, peer and op; side initiator: this engine's requests that got their outcome; side target: the peer's requests this engine served (tcp).",
            |o| (o.requests, o.served_requests),
        )?;
        per_side(
            &mut enc,
            m,
            "orbitte_transfer_bytes",
            "Bytes by path, peer and op; side initiator: completed prefixes of this engine's requests; side target: bytes of the peer's requests this engine served (tcp).",
            |o| (o.bytes, o.served_bytes),
        )?;
        {
            let mut f = enc.encode_descriptor(
                "orbitte_transfer_outcomes",
                "Outcomes by path, peer, op and kind (complete, failed, timed_out, cancelled; uncertain: WRITEs whose remote effect is unknown).",
                None,
                MetricType::Counter,
            )?;
            for p in &m.peers {
                for o in ops(p).filter(|o| o.requests > 0) {
                    let c = &o.outcomes;
                    let mut kinds = vec![
                        ("complete", c.complete),
                        ("failed", c.failed),
                        ("timed_out", c.timed_out),
                        ("cancelled", c.cancelled),
                    ];
                    if o.op == "write" {
                        kinds.push(("uncertain", c.uncertain));
                    }
                    for (kind, n) in kinds {
                        let labels = [
                            ("path", p.path.as_str()),
                            ("peer", &p.peer),
                            ("op", &o.op),
                            ("outcome", kind),
                        ];
                        f.encode_family(&labels)?
                            .encode_counter::<NoLabelSet, _, u64>(&n, None)?;
                    }
                }
            }
        }
        {
            let mut f = enc.encode_descriptor(
                "orbitte_transfer_latency_seconds",
                "Time from submit to outcome, by path, peer and op.",
                None,
                MetricType::Histogram,
            )?;
            for p in &m.peers {
                for o in ops(p).filter(|o| o.requests > 0) {
                    let labels = [("path", p.path.as_str()), ("peer", &p.peer), ("op", &o.op)];
                    let h = &o.latency;
                    f.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                        h.sum_seconds,
                        h.count,
                        &buckets(h),
                        None,
                    )?;
                }
            }
        }
        {
            let mut f = enc.encode_descriptor(
                "orbitte_rails",
                "Rails to each peer by path and state (up: takes work; down).",
                None,
                MetricType::Gauge,
            )?;
            for p in m.peers.iter().filter(|p| p.rails_up + p.rails_down > 0) {
                for (state, n) in [("up", p.rails_up), ("down", p.rails_down)] {
                    let labels = [
                        ("path", p.path.as_str()),
                        ("peer", &p.peer),
                        ("state", state),
                    ];
                    f.encode_family(&labels)?.encode_gauge(&n)?;
                }
            }
        }
        let n = &m.notifications;
        counter(
            &mut enc,
            "orbitte_rail_recoveries",
            "Times an rdma rail came back after going down.",
            m.rail_recoveries,
        )?;
        counter(
            &mut enc,
            "orbitte_notifications_sent",
            "Notifications of this engine's batches handed to a rail.",
            n.sent,
        )?;
        counter(
            &mut enc,
            "orbitte_notifications_not_sent",
            "Notifications of this engine's batches that no rail took.",
            n.not_sent,
        )?;
        counter(
            &mut enc,
            "orbitte_notifications_received",
            "Notifications from peers queued for the application.",
            n.received,
        )?;
        gauge(
            &mut enc,
            "orbitte_notifications_queued",
            "Notifications from peers waiting to be read.",
            n.queued,
        )?;
        gauge(
            &mut enc,
            "orbitte_registration_mrs_used",
            "MRs charged against the MR budget (retained copies included).",
            m.registration.mrs_used,
        )?;
        {
            let mut f = enc.encode_descriptor(
                "orbitte_notifications_refused",
                "Notifications from peers refused, by reason (queue_full, malformed).",
                None,
                MetricType::Counter,
            )?;
            for (reason, v) in [("queue_full", n.refused_full), ("malformed", n.malformed)] {
                f.encode_family(&[("reason", reason)])?
                    .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
            }
        }
        let r = &m.registration;
        gauge(
            &mut enc,
            "orbitte_registration_bytes_used",
            "Bytes charged against the byte budget (each copy its full range).",
            r.bytes_used,
        )?;
        gauge(
            &mut enc,
            "orbitte_registration_mrs_budget",
            "The MR budget.",
            r.max_mrs,
        )?;
        gauge(
            &mut enc,
            "orbitte_registration_bytes_budget",
            "The byte budget.",
            r.max_bytes,
        )?;
        if let Some(l) = &m.listener {
            for (name, help, v) in [
                (
                    "orbitte_listener_accepted",
                    "Connections the listener accepted.",
                    l.accepted,
                ),
                (
                    "orbitte_listener_admitted",
                    "Sessions that completed the handshake.",
                    l.admitted,
                ),
                (
                    "orbitte_listener_refused",
                    "Connections refused or closed for a bad reason.",
                    l.refused,
                ),
                (
                    "orbitte_preauth_refusals",
                    "Connections refused before authenticating (no pre-auth slot).",
                    l.preauth_refused,
                ),
                (
                    "orbitte_preauth_evictions",
                    "Unauthenticated connections closed to make room for a newcomer.",
                    l.preauth_evicted,
                ),
                (
                    "orbitte_session_evictions",
                    "Idle tcp data sessions closed to make room for a newcomer.",
                    l.sessions_evicted,
                ),
            ] {
                counter(&mut enc, name, help, v)?;
            }
            gauge(
                &mut enc,
                "orbitte_listener_connections",
                "Connections open now.",
                l.live,
            )?;
        }
        Ok(())
    }
}

/// A per-op counter family over every peer, with a `side` label:
/// `value` gives the initiator's count and the target's; a side that
/// counted no request is left out.
fn per_side(
    enc: &mut DescriptorEncoder<'_>,
    m: &MetricsSnapshot,
    name: &str,
    help: &str,
    value: impl Fn(&OpMetrics) -> (u64, u64),
) -> Fmt {
    let mut f = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for p in &m.peers {
        for o in ops(p) {
            let (initiator, target) = value(o);
            for (side, v, counted) in [
                ("initiator", initiator, o.requests > 0),
                ("target", target, o.served_requests > 0),
            ] {
                if !counted {
                    continue;
                }
                let labels = [
                    ("path", p.path.as_str()),
                    ("peer", &p.peer),
                    ("op", &o.op),
                    ("side", side),
                ];
                f.encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
            }
        }
    }
    Ok(())
}

/// The bounded buckets of `h` (upper bound in seconds, count in it); the
/// encoder adds `+Inf` from the total count.
fn buckets(h: &LatencyHistogram) -> Vec<(f64, u64)> {
    h.counts
        .iter()
        .enumerate()
        .filter_map(|(i, &n)| LatencyHistogram::bound_seconds(i).map(|b| (b, n)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::snapshot::{
        LATENCY_BUCKETS, ListenerMetrics, NotificationMetrics, OutcomeCounts, PeerMetrics,
        RegistrationMetrics,
    };

    fn op(name: &str, counts: Vec<u64>) -> OpMetrics {
        OpMetrics {
            op: name.to_owned(),
            requests: 4,
            bytes: 4096,
            served_requests: 3,
            served_bytes: 1024,
            outcomes: OutcomeCounts {
                complete: 2,
                failed: 1,
                timed_out: 1,
                cancelled: 0,
                uncertain: 1,
            },
            latency: LatencyHistogram {
                count: counts.iter().sum(),
                counts,
                sum_seconds: 0.5,
            },
        }
    }

    fn snapshot(peer: &str) -> MetricsSnapshot {
        let mut counts = vec![0; LATENCY_BUCKETS + 1];
        counts[0] = 1;
        counts[2] = 2;
        counts[LATENCY_BUCKETS] = 1;
        MetricsSnapshot {
            source_id: "me".into(),
            peers: vec![
                PeerMetrics {
                    path: "tcp".into(),
                    peer: peer.into(),
                    rails_up: 2,
                    rails_down: 1,
                    ops: vec![
                        op("read", vec![0; LATENCY_BUCKETS + 1]),
                        op("write", counts.clone()),
                    ],
                },
                PeerMetrics {
                    path: "local".into(),
                    peer: "other".into(),
                    rails_up: 1,
                    rails_down: 0,
                    ops: vec![op("read", counts.clone()), op("write", counts)],
                },
            ],
            rail_recoveries: 3,
            notifications: NotificationMetrics {
                sent: 5,
                not_sent: 1,
                received: 7,
                refused_full: 2,
                malformed: 1,
                queued: 4,
            },
            listener: Some(ListenerMetrics {
                accepted: 9,
                admitted: 8,
                refused: 1,
                preauth_refused: 6,
                preauth_evicted: 5,
                sessions_evicted: 4,
                live: 2,
            }),
            registration: RegistrationMetrics {
                mrs_used: 2,
                bytes_used: 1 << 20,
                max_mrs: 1024,
                max_bytes: 1 << 30,
            },
        }
    }

    /// The metric name of a sample line.
    fn name_of(line: &str) -> &str {
        line.split(['{', ' ']).next().unwrap()
    }

    #[test]
    fn a_label_value_from_the_network_is_escaped() {
        let text = snapshot("evil\"} 1\nfake_metric{a=\"\\").to_prometheus();
        let want = r#"peer="evil\"} 1\nfake_metric{a=\"\\""#;
        assert!(text.contains(want), "{text}");
        assert!(
            !text.lines().any(|l| l.starts_with("fake_metric")),
            "the newline in the peer's id stays inside its label"
        );
    }

    #[test]
    fn every_family_has_one_help_and_type_and_its_samples_together() {
        let text = snapshot("decode").to_prometheus();
        let mut families: Vec<String> = Vec::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap().to_owned();
                assert!(!families.contains(&name), "{name}: a second HELP");
                families.push(name.clone());
                current = name;
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split(' ');
                assert_eq!(
                    parts.next(),
                    Some(current.as_str()),
                    "TYPE follows its HELP"
                );
                let kind = parts.next().unwrap();
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                assert_eq!(kind == "counter", current.ends_with("_total"), "{line}");
            } else {
                let name = name_of(line);
                let base = name
                    .strip_suffix("_bucket")
                    .or_else(|| name.strip_suffix("_sum"))
                    .or_else(|| name.strip_suffix("_count"))
                    .filter(|b| *b == current)
                    .unwrap_or(name);
                assert_eq!(base, current, "sample {line} outside its family");
                let value = line.rsplit(' ').next().unwrap();
                assert!(value.parse::<f64>().is_ok(), "{line}");
            }
        }
        assert_eq!(families.len(), 22, "{families:?}");
        let none = MetricsSnapshot {
            listener: None,
            ..snapshot("decode")
        }
        .to_prometheus();
        assert!(!none.contains("orbitte_listener_accepted_total"));
    }

    #[test]
    fn the_histogram_is_cumulative_and_ends_at_its_count() {
        let text = snapshot("decode").to_prometheus();
        let buckets: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.starts_with("orbitte_transfer_latency_seconds_bucket{path=\"tcp\",peer=\"decode\",op=\"write\"")
            })
            .collect();
        assert_eq!(buckets.len(), LATENCY_BUCKETS + 1);
        let value = |l: &str| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap();
        assert!(buckets[0].contains("le=\"1e-06\""), "{}", buckets[0]);
        assert_eq!(value(buckets[0]), 1);
        assert_eq!(value(buckets[1]), 1);
        assert!(buckets[2].contains("le=\"4e-06\""), "{}", buckets[2]);
        assert_eq!(value(buckets[2]), 3);
        assert_eq!(value(buckets[LATENCY_BUCKETS - 1]), 3);
        assert!(buckets[LATENCY_BUCKETS].contains("le=\"+Inf\""));
        assert_eq!(value(buckets[LATENCY_BUCKETS]), 4);
        let sample = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("{name} missing"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_owned()
        };
        let labels = "{path=\"tcp\",peer=\"decode\",op=\"write\"}";
        assert_eq!(
            sample(&format!("orbitte_transfer_latency_seconds_count{labels}")),
            "4"
        );
        assert_eq!(
            sample(&format!("orbitte_transfer_latency_seconds_sum{labels}")),
            "0.5"
        );
        let uncertain_read = "op=\"read\",outcome=\"uncertain\"";
        assert!(
            !text.contains(uncertain_read),
            "READs have no uncertain outcome"
        );
        assert_eq!(
            sample(
                "orbitte_transfer_outcomes_total{path=\"tcp\",peer=\"decode\",op=\"write\",outcome=\"uncertain\"}"
            ),
            "1"
        );
        assert_eq!(sample("orbitte_preauth_evictions_total"), "5");
        let bytes = "orbitte_transfer_bytes_total{path=\"tcp\",peer=\"decode\",op=\"write\",side=";
        assert_eq!(sample(&format!("{bytes}\"initiator\"}}")), "4096");
        assert_eq!(sample(&format!("{bytes}\"target\"}}")), "1024");
        assert_eq!(
            sample("orbitte_notifications_refused_total{reason=\"queue_full\"}"),
            "2"
        );
    }
}
