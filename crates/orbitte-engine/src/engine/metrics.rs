//! What the engine counted, as data: [`TransferEngine::metrics`].

use super::TransferEngine;
use crate::metrics::{ListenerMetrics, MetricsSnapshot, NotificationMetrics, RegistrationMetrics};
use crate::transport::PathKind;

impl TransferEngine {
    /// What the engine counted since it was built: per path and peer,
    /// requests, bytes and outcomes by op with latency histograms, and
    /// rails up and down; engine-wide, rail recoveries, notifications,
    /// listener refusals and evictions, and registration budgets used.
    /// [`MetricsSnapshot::to_prometheus`] writes it in the Prometheus text
    /// format (`orbitte serve --metrics` serves that).
    pub fn metrics(&self) -> MetricsSnapshot {
        let (rails, rail_recoveries, charges, sent, not_sent) = {
            let st = self.lock();
            let core = st.engine.core();
            let mut rails: Vec<(PathKind, String, bool)> = Vec::new();
            for p in st.engine.tables().peers.values() {
                for &rail in &p.rails {
                    if core.rail_is_closed(rail) {
                        continue;
                    }
                    if let Some(spec) = core.rail_spec(rail) {
                        rails.push((
                            spec.path,
                            p.source_id.as_str().to_owned(),
                            core.rail_is_up(rail),
                        ));
                    }
                }
            }
            (
                rails,
                st.recovery.total(),
                st.engine.in_use(),
                st.notifications_sent,
                st.notifications_not_sent,
            )
        };
        let registry = &self.shared.metrics;
        // A peer with rails and no request yet still gets its row (or,
        // past the registry's limit, the other peers' row).
        let rails: Vec<(PathKind, String, bool)> = rails
            .into_iter()
            .map(|(path, peer, up)| (path, registry.cells(path, &peer).peer().to_owned(), up))
            .collect();
        let mut peers = registry.snapshot();
        for (path, peer, up) in rails {
            if let Some(row) = peers
                .iter_mut()
                .find(|r| r.path == path.name() && r.peer == peer)
            {
                if up {
                    row.rails_up += 1;
                } else {
                    row.rails_down += 1;
                }
            }
        }
        // No zero rows: a peer that was served nothing, asked nothing and
        // has no rail is not listed.
        peers.retain(|p| {
            p.rails_up + p.rails_down > 0
                || p.ops
                    .iter()
                    .any(|o| o.requests > 0 || o.served_requests > 0)
        });
        let inbox = self.notification_stats();
        let budgets = self.shared.settings.budgets;
        MetricsSnapshot {
            source_id: self.source_id().to_owned(),
            peers,
            rail_recoveries,
            notifications: NotificationMetrics {
                sent,
                not_sent,
                received: inbox.received,
                refused_full: inbox.refused_full,
                malformed: inbox.malformed,
                queued: inbox.queued as u64,
            },
            listener: self.listener_stats().map(|l| ListenerMetrics {
                accepted: l.accepted,
                admitted: l.admitted,
                refused: l.refused,
                preauth_refused: l.preauth_refused,
                preauth_evicted: l.preauth_evicted,
                sessions_evicted: l.sessions_evicted,
                live: l.live,
            }),
            registration: RegistrationMetrics {
                mrs_used: charges.mrs,
                bytes_used: charges.bytes,
                max_mrs: budgets.max_mrs,
                max_bytes: budgets.max_bytes,
            },
        }
    }
}
