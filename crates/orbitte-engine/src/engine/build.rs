//! Building an engine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use orbitte_verbs::{self as verbs, Provider};
use orbitte_wire::{self as wire, PeerTable};

use super::timer::timer_loop;
use super::{Settings, Shared, State, TransferEngine};
use crate::config::EngineBuilder;
use crate::error::BuildError;
use crate::transport::rdma::RdmaTransport;
use orbitte_proto::core::CoreConfig;

impl EngineBuilder {
    /// Builds the engine. Lists the provider's devices (NIC IDs, in the
    /// natural name order `orbitte topology` numbers sysfs devices in) but
    /// opens none: contexts initialize at the first Host Direct registration or
    /// first RDMA use.
    pub fn build(mut self) -> Result<TransferEngine, BuildError> {
        let (source_id, epoch) = self.checked()?;
        self.resolve_secret()?;
        let mut sessions = self.session_config(&source_id, epoch);
        Self::check_sessions(&sessions)?;
        // Sessions go into the engine's one peer table: number them with the
        // engine's counter.
        let next_session = Arc::new(std::sync::atomic::AtomicU64::new(1));
        let counter = next_session.clone();
        sessions.session_ids = crate::session::SessionIds::new(move || {
            wire::SessionId(counter.fetch_add(1, Ordering::Relaxed))
        });
        let provider: Arc<dyn Provider> = self
            .provider
            .clone()
            .unwrap_or_else(|| Arc::new(verbs::native::NativeProvider::new()));
        let (listed, listing_error) = match provider.devices() {
            // NIC IDs are topology positions: number the provider's devices
            // in the order sysfs discovery does (natural name order), not in
            // the provider's list order.
            Ok(mut l) => {
                l.sort_by(|a, b| {
                    orbitte_topology::nic_name_order(&a.identity.name, &b.identity.name)
                });
                (l, None)
            }
            Err(e) => (Vec::new(), Some(Arc::new(e))),
        };
        let engine = crate::registration::EngineState::new(
            CoreConfig {
                slice_size: self.slice_size,
                tcp_slice_size: CoreConfig::default().tcp_slice_size,
                request_timeout: self.request_timeout,
                drain_timeout: self.drain_timeout,
            },
            self.budgets,
        );
        let intake = super::arrivals::Intake::new();
        let state = State {
            engine,
            rdma: RdmaTransport::default(),
            others: Vec::new(),
            owner: Vec::new(),
            qpn_rail: crate::Map::default(),
            arrived: Vec::new(),
            next_connect: 1,
            listed,
            listing_error,
            init: None,
            nic_order: Vec::new(),
            waiters: super::waiters::Waiters::default(),
            who: (source_id.as_str().to_owned(), epoch),
            recovery: crate::recovery::Recoveries::new(self.recovery),
            staged: crate::staging::Staged::default(),
            lanes: Vec::new(),
            arrivals: intake.receiver(),
            work: Vec::new(),
            posting: crate::request::Posting::Inline,
            done: Vec::new(),
            snapshot: Default::default(),
            last_outstanding: 0,
            counting: Default::default(),
            notifications_sent: 0,
            notifications_not_sent: 0,
        };
        let shared = Arc::new(Shared {
            peer_table: Arc::new(Mutex::new(PeerTable::new(source_id.clone()))),
            next_session,
            state: Mutex::new(state),
            intake,
            snapshot: Default::default(),
            spare: super::shared::Spare::new(),
            bell: (Mutex::new(()), Condvar::new()),
            stop: AtomicBool::new(false),
            source_id,
            epoch,
            provider,
            settings: Settings {
                rdma: self.rdma,
                dispatch_mask: self.dispatch_mask,
                max_in_flight: self.max_in_flight,
                signal_interval: self.signal_interval,
                handshake_timeout: self.handshake_timeout,
                budgets: self.budgets,
            },
            threads: Mutex::new(Vec::new()),
            sessions,
            net: std::sync::OnceLock::new(),
            listener: Mutex::new(None),
            host_without_rdma: self.host_without_rdma,
            #[cfg(feature = "etcd")]
            etcd: Mutex::new(None),
            inbox: crate::notify::inbox::Inbox::new(self.notification_inbox),
            staging: crate::staging::Pools::new(self.staging),
            metrics: Arc::new(crate::metrics::Registry::with_limit(self.metrics_peer_rows)),
        });
        let timer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("orbitte-timer".into())
                .spawn(move || timer_loop(&shared))
                .map_err(|source| BuildError::Thread {
                    what: "timer",
                    source,
                })?
        };
        shared
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(timer);
        let engine = TransferEngine {
            shared,
            owner: true,
        };
        engine.attach_own_net();
        if let Some(addr) = self.listen {
            engine.listen(addr)?;
        }
        engine.join_metadata(&self.metadata)?;
        tracing::debug!(
            source = engine.shared.source_id.as_str(),
            epoch = engine.shared.epoch.value(),
            "engine built"
        );
        Ok(engine)
    }
}
