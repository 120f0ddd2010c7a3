//! [`MetricsSnapshot::to_prometheus`]: the Prometheus text exposition
//! format, version 0.0.4.
//!
//! Each family is written once, its `# HELP` and `# TYPE` lines first and
//! all its samples after them; label values are escaped as the format
//! says (backslash, double quote, newline), since a peer's source id comes
//! from the network.

use std::fmt::Write;

use super::snapshot::{LatencyHistogram, MetricsSnapshot, OpMetrics};

/// The `Content-Type` of [`MetricsSnapshot::to_prometheus`]'s text.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

impl MetricsSnapshot {
    /// The snapshot in the Prometheus text format (0.0.4): every metric
    /// `docs/configuration.md` lists, counters ending in `_total`, per
    /// path and peer labelled `path`, `peer` (and `op`, `outcome`).
    pub fn to_prometheus(&self) -> String {
        let mut w = Writer::default();
        self.per_op(
            &mut w,
            "orbitte_transfer_requests_total",
            "Requests by path, peer and op; side initiator: this engine's requests that got their outcome; side target: the peer's requests this engine served (tcp).",
            |o| (o.requests, o.served_requests),
        );
        self.per_op(
            &mut w,
            "orbitte_transfer_bytes_total",
            "Bytes by path, peer and op; side initiator: completed prefixes of this engine's requests; side target: bytes of the peer's requests this engine served (tcp).",
            |o| (o.bytes, o.served_bytes),
        );
        w.family(
            "orbitte_transfer_outcomes_total",
            "counter",
            "Outcomes by path, peer, op and kind (complete, failed, timed_out, cancelled; uncertain: WRITEs whose remote effect is unknown).",
        );
        for p in &self.peers {
            for o in &p.ops {
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
                    w.sample(
                        "orbitte_transfer_outcomes_total",
                        &[
                            ("path", &p.path),
                            ("peer", &p.peer),
                            ("op", &o.op),
                            ("outcome", kind),
                        ],
                        n,
                    );
                }
            }
        }
        w.family(
            "orbitte_transfer_latency_seconds",
            "histogram",
            "Time from submit to outcome, by path, peer and op.",
        );
        for p in &self.peers {
            for o in &p.ops {
                w.histogram(
                    "orbitte_transfer_latency_seconds",
                    &[("path", &p.path), ("peer", &p.peer), ("op", &o.op)],
                    &o.latency,
                );
            }
        }
        w.family(
            "orbitte_rails",
            "gauge",
            "Rails to each peer by path and state (up: takes work; down).",
        );
        for p in &self.peers {
            for (state, n) in [("up", p.rails_up), ("down", p.rails_down)] {
                w.sample(
                    "orbitte_rails",
                    &[("path", &p.path), ("peer", &p.peer), ("state", state)],
                    n,
                );
            }
        }
        let n = &self.notifications;
        let engine_wide: [(&str, &str, &str, u64); 6] = [
            (
                "orbitte_rail_recoveries_total",
                "counter",
                "Times an rdma rail came back after going down.",
                self.rail_recoveries,
            ),
            (
                "orbitte_notifications_sent_total",
                "counter",
                "Notifications of this engine's batches handed to a rail.",
                n.sent,
            ),
            (
                "orbitte_notifications_not_sent_total",
                "counter",
                "Notifications of this engine's batches that no rail took.",
                n.not_sent,
            ),
            (
                "orbitte_notifications_received_total",
                "counter",
                "Notifications from peers queued for the application.",
                n.received,
            ),
            (
                "orbitte_notifications_queued",
                "gauge",
                "Notifications from peers waiting to be read.",
                n.queued,
            ),
            (
                "orbitte_registration_mrs_used",
                "gauge",
                "MRs charged against the MR budget (retained copies included).",
                self.registration.mrs_used,
            ),
        ];
        for (name, kind, help, v) in engine_wide {
            w.family(name, kind, help);
            w.sample(name, &[], v);
        }
        w.family(
            "orbitte_notifications_refused_total",
            "counter",
            "Notifications from peers refused, by reason (queue_full, malformed).",
        );
        w.sample(
            "orbitte_notifications_refused_total",
            &[("reason", "queue_full")],
            n.refused_full,
        );
        w.sample(
            "orbitte_notifications_refused_total",
            &[("reason", "malformed")],
            n.malformed,
        );
        let r = &self.registration;
        for (name, help, v) in [
            (
                "orbitte_registration_bytes_used",
                "Bytes charged against the byte budget (each copy its full range).",
                r.bytes_used,
            ),
            (
                "orbitte_registration_mrs_budget",
                "The MR budget.",
                r.max_mrs,
            ),
            (
                "orbitte_registration_bytes_budget",
                "The byte budget.",
                r.max_bytes,
            ),
        ] {
            w.family(name, "gauge", help);
            w.sample(name, &[], v);
        }
        if let Some(l) = &self.listener {
            for (name, kind, help, v) in [
                (
                    "orbitte_listener_accepted_total",
                    "counter",
                    "Connections the listener accepted.",
                    l.accepted,
                ),
                (
                    "orbitte_listener_admitted_total",
                    "counter",
                    "Sessions that completed the handshake.",
                    l.admitted,
                ),
                (
                    "orbitte_listener_refused_total",
                    "counter",
                    "Connections refused or closed for a bad reason.",
                    l.refused,
                ),
                (
                    "orbitte_preauth_refusals_total",
                    "counter",
                    "Connections refused before authenticating (no pre-auth slot).",
                    l.preauth_refused,
                ),
                (
                    "orbitte_preauth_evictions_total",
                    "counter",
                    "Unauthenticated connections closed to make room for a newcomer.",
                    l.preauth_evicted,
                ),
                (
                    "orbitte_session_evictions_total",
                    "counter",
                    "Idle tcp data sessions closed to make room for a newcomer.",
                    l.sessions_evicted,
                ),
                (
                    "orbitte_listener_connections",
                    "gauge",
                    "Connections open now.",
                    l.live,
                ),
            ] {
                w.family(name, kind, help);
                w.sample(name, &[], v);
            }
        }
        w.out
    }

    /// A per-op counter family over every peer, with a `side` label:
    /// `value` gives the initiator's count and the target's.
    fn per_op(
        &self,
        w: &mut Writer,
        name: &str,
        help: &str,
        value: impl Fn(&OpMetrics) -> (u64, u64),
    ) {
        w.family(name, "counter", help);
        for p in &self.peers {
            for o in &p.ops {
                let (initiator, target) = value(o);
                for (side, v) in [("initiator", initiator), ("target", target)] {
                    let labels = [
                        ("path", p.path.as_str()),
                        ("peer", &p.peer),
                        ("op", &o.op),
                        ("side", side),
                    ];
                    w.sample(name, &labels, v);
                }
            }
        }
    }
}

#[derive(Default)]
struct Writer {
    out: String,
}

impl Writer {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        self.labels(labels, None);
        let _ = writeln!(self.out, " {value}");
    }

    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let mut first = true;
        for (k, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
            if !first {
                self.out.push(',');
            }
            first = false;
            let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
        }
        self.out.push('}');
    }

    /// `_bucket` samples (cumulative, `le` in seconds, `+Inf` last),
    /// `_sum` and `_count`.
    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &LatencyHistogram) {
        let mut cumulative = 0u64;
        for (i, n) in h.counts.iter().enumerate() {
            cumulative += n;
            let le = LatencyHistogram::bound_seconds(i)
                .map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
            let _ = write!(self.out, "{name}_bucket");
            self.labels(labels, Some(&le));
            let _ = writeln!(self.out, " {cumulative}");
        }
        let _ = write!(self.out, "{name}_sum");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", h.sum_seconds);
        let _ = write!(self.out, "{name}_count");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {}", h.count);
    }
}

/// A label value as the format writes it: `\` as `\\`, `"` as `\"`, a
/// newline as `\n`.
fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// Help text as the format writes it: `\` as `\\`, a newline as `\n`.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
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
        assert_eq!(escape_label("plain-id_1"), "plain-id_1");
        assert_eq!(escape_help("a\\b\nc"), "a\\\\b\\nc");
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
        assert!(buckets[0].contains("le=\"0.000001\""), "{}", buckets[0]);
        assert_eq!(value(buckets[0]), 1);
        assert_eq!(value(buckets[1]), 1);
        assert!(buckets[2].contains("le=\"0.000004\""), "{}", buckets[2]);
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
