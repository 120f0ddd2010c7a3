//! What every engine thread shares: the state lock, the peer table,
//! settings, threads, listener.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use orbitte_topology::{DeviceMask, RdmaConfig};
use orbitte_verbs::Provider;
use orbitte_wire::{self as wire, Epoch, PeerTable, SourceId};

use super::State;

/// Settings fixed at build time.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) rdma: RdmaConfig,
    pub(crate) dispatch_mask: DeviceMask,
    pub(crate) max_in_flight: u32,
    pub(crate) signal_interval: u32,
    pub(crate) handshake_timeout: Duration,
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// The wire's epoch rules, shared with the net sessions. Lock order:
    /// `state` before `peer_table`, never the other way round.
    pub(crate) peer_table: Arc<Mutex<PeerTable>>,
    pub(crate) next_session: Arc<std::sync::atomic::AtomicU64>,
    pub(crate) cond: Condvar,
    /// Wakes only the timer thread (at stop). It runs on its own schedule
    /// and is not woken by every event batch: whoever delivers a batch
    /// already pumps, so a timer pump after each one is work done twice.
    pub(crate) timer: Condvar,
    pub(crate) stop: AtomicBool,
    pub(crate) source_id: SourceId,
    pub(crate) epoch: Epoch,
    pub(crate) provider: Arc<dyn Provider>,
    pub(crate) settings: Settings,
    /// Poller and timer threads, joined when the engine stops.
    pub(crate) threads: Mutex<Vec<JoinHandle<()>>>,
    /// The session settings of every session this engine opens or serves.
    pub(crate) sessions: crate::session::SessionConfig,
    /// The tcp and local transports (attached at build).
    pub(crate) net: std::sync::OnceLock<crate::session::NetPaths>,
    /// The listener `EngineBuilder::listen` asked for, serving data
    /// sessions, same-host mapping and rdma control links.
    pub(crate) listener: Mutex<Option<crate::session::Listener>>,
    /// `EngineBuilder::host_memory_without_rdma`: `register` makes no MR
    /// for host memory.
    pub(crate) host_without_rdma: bool,
    /// Cluster metadata (`EngineBuilder::metadata`), holding this engine's
    /// lease.
    #[cfg(feature = "etcd")]
    pub(crate) etcd: Mutex<Option<crate::metadata::etcd::EtcdMetadata>>,
    /// Notifications received from peers, waiting to be read.
    pub(crate) inbox: crate::notify::inbox::Inbox,
    /// The cuda-staging lanes of each CUDA device.
    pub(crate) staging: crate::staging::Pools,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn peer_table(&self) -> MutexGuard<'_, PeerTable> {
        self.peer_table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the waiters if a pump under `st` completed work while posting
    /// it (no transport thread delivered those events, so no one else
    /// wakes them).
    pub(crate) fn wake_if_completed_inline(&self, st: &mut State) {
        if std::mem::take(&mut st.completed_inline) {
            self.cond.notify_all();
        }
    }

    /// A fresh session id for the peer table, unique in this engine.
    pub(crate) fn new_session_id(&self) -> wire::SessionId {
        wire::SessionId(self.next_session.fetch_add(1, Ordering::Relaxed))
    }
}
