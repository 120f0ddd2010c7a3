//! The transfer engine: the driver around the sans-IO layers
//! (`orbitte_proto::core` and [`EngineState`](crate::registration::EngineState)).
//!
//! One mutex guards the driver's state (the `EngineState`, the transports,
//! the NIC contexts); one poller thread per NIC context turns completions
//! and async events into core events, a timer thread expires deadlines.
//! Transports deliver events onto a lock-free intake that the lock's
//! holder drains, one pump per drained batch ([`StateGuard`]); a waiting
//! thread parks under its request's id and is woken by that outcome alone
//! (`waiters`), or, for a request on rdma rails of one NIC, polls that
//! NIC's completion queue itself (`wait`). Whoever releases the lock posts
//! the work the core handed out meanwhile, holding each rail's post lock
//! but not the state lock (`post`), with the tables' copy (`snapshot`)
//! that the tcp/local target also serves from.

mod arrivals;
mod build;
mod capability;
mod connect;
mod contexts;
mod intake;
mod listen;
mod metrics;
mod notify;
mod peer_info;
mod peers;
mod poll;
mod post;
mod queries;
mod ranges;
mod rdma_peers;
mod recovery;
mod register;
mod resolve;
mod shared;
mod shutdown;
mod snapshot;
mod staged;
mod state;
mod submit;
mod target;
mod timer;
mod wait;
mod waiters;

pub use orbitte_proto::TransferRequest;
pub(crate) use orbitte_proto::state::published_remote;
pub use peer_info::{PeerInfo, RailInfo};
pub(crate) use shared::{Settings, Shared, StateGuard};
pub(crate) use state::{Owner, State};
pub use submit::SubmitOptions;

use std::sync::Arc;

/// The transfer engine. See the crate docs for the contract.
pub struct TransferEngine {
    pub(crate) shared: Arc<Shared>,
    /// Whether dropping this handle stops the engine: true for the handle
    /// `build` returns, false for the views its listener uses to serve
    /// rdma control links.
    owner: bool,
}

impl std::fmt::Debug for TransferEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferEngine")
            .field("source_id", &self.shared.source_id.as_str())
            .field("epoch", &self.shared.epoch.value())
            .finish_non_exhaustive()
    }
}

impl TransferEngine {
    /// This engine's source owner id.
    pub fn source_id(&self) -> &str {
        self.shared.source_id.as_str()
    }

    /// This engine's authoritative epoch.
    pub fn epoch(&self) -> orbitte_wire::Epoch {
        self.shared.epoch
    }

    /// The engine's peer table (the wire's epoch and version rules), for
    /// tests that admit hellos as a session outside the engine would. Lock
    /// it briefly; never call into the engine while holding it.
    #[cfg(any(test, feature = "testing"))]
    pub fn peer_table(&self) -> Arc<std::sync::Mutex<orbitte_wire::PeerTable>> {
        self.shared.peer_table.clone()
    }

    /// A fresh session id for the peer table, unique in this engine.
    #[cfg(any(test, feature = "testing"))]
    pub fn new_session_id(&self) -> orbitte_wire::SessionId {
        self.shared.new_session_id()
    }

    /// The address the engine's own listener is bound to
    /// ([`EngineBuilder::listen`](crate::EngineBuilder::listen); port 0 there: the port chosen), or
    /// `None` when the engine does not listen.
    pub fn listen_addr(&self) -> Option<std::net::SocketAddr> {
        self.shared
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(crate::session::Listener::local_addr)
    }

    /// A non-owning handle on the same engine (dropping it stops nothing),
    /// for the listener threads that serve rdma control links.
    pub(crate) fn view(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            owner: false,
        }
    }

    pub(crate) fn lock(&self) -> StateGuard<'_> {
        self.shared.lock()
    }
}
