//! What every engine thread shares: the state lock and its event intake,
//! the peer table, settings, threads, listener.
//!
//! Transports deliver events without waiting for the state lock: they
//! push them on the intake queue and drain it only if the lock is free.
//! Whoever holds the lock drains the queue before releasing it (one pump
//! per drained batch, see [`StateGuard`]) and looks at it again after
//! releasing, so no event waits for the next lock holder.

use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use orbitte_topology::{DeviceMask, RdmaConfig};
use orbitte_verbs::Provider;
use orbitte_wire::{Epoch, PeerTable, SourceId};

use super::State;
use super::arrivals::Intake;
use super::post::Posts;
use super::snapshot::TablesSnapshot;
use crate::transport::TransportEvent;

/// Settings fixed at build time.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) rdma: RdmaConfig,
    pub(crate) dispatch_mask: DeviceMask,
    pub(crate) max_in_flight: u32,
    pub(crate) signal_interval: u32,
    pub(crate) handshake_timeout: Duration,
    pub(crate) budgets: crate::registration::Budgets,
}

pub(crate) struct Shared {
    /// Taken through [`lock`](Self::lock) only, whose guard drains the
    /// intake.
    pub(super) state: Mutex<State>,
    /// Events delivered while the state was busy, drained by its holder.
    pub(super) intake: Intake,
    /// The tables as posts and the tcp/local target read them, replaced
    /// under the state lock after every change (see `snapshot`).
    pub(super) snapshot: RwLock<Arc<TablesSnapshot>>,
    /// Emptied posts for reuse.
    pub(super) spare: Spare,
    /// The wire's epoch rules, shared with the net sessions. Lock order:
    /// `state` before `peer_table`, never the other way round.
    pub(crate) peer_table: Arc<Mutex<PeerTable>>,
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    pub(crate) next_session: Arc<std::sync::atomic::AtomicU64>,
    /// Where the timer and recovery threads sleep (without the state
    /// lock); rung only at stop. They run on their own schedule and are not
    /// woken by every event batch: whoever drains a batch already pumps.
    pub(super) bell: (Mutex<()>, Condvar),
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
    pub(crate) net: std::sync::OnceLock<crate::session::net::NetPaths>,
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
    /// Every path and peer's counters (see `metrics`).
    pub(crate) metrics: Arc<crate::metrics::Registry>,
}

impl Shared {
    /// Takes the state lock and handles what the intake holds, so that an
    /// event the holder finds itself (a completion it polls) never
    /// overtakes one queued before (a post that stopped early on that
    /// rail, see `post`). Releasing the guard drains the intake again.
    pub(crate) fn lock(&self) -> StateGuard<'_> {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !self.intake.is_empty() {
            g.intake(&self.intake, Instant::now());
        }
        StateGuard {
            shared: self,
            guard: Some(g),
        }
    }

    fn try_lock(&self) -> Option<MutexGuard<'_, State>> {
        match self.state.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Takes transports' events without waiting for the state lock: they
    /// are queued, and handled now if the lock is free, else by its holder
    /// before it releases the lock.
    pub(crate) fn deliver(&self, events: &mut Vec<TransportEvent>) {
        self.intake.push_events(events);
        // Pairs with the fence in `StateGuard::drop`: either the holder
        // sees these events after releasing, or this try_lock sees the
        // lock released.
        fence(Ordering::SeqCst);
        if let Some(g) = self.try_lock() {
            release(self, g);
        }
    }

    /// The current copy of the tables (see `snapshot`).
    pub(crate) fn snapshot(&self) -> Arc<TablesSnapshot> {
        self.snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sleeps (holding no lock) for up to `wait`, or until the engine
    /// stops.
    pub(crate) fn sleep(&self, wait: Duration) {
        let (lock, cv) = &self.bell;
        let g = lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.stop.load(Ordering::Acquire) {
            return;
        }
        let _ = cv.wait_timeout(g, wait);
    }

    /// Stops the sleepers: sets `stop` and rings the bell.
    pub(crate) fn ring_stop(&self) {
        let (lock, cv) = &self.bell;
        let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
        self.stop.store(true, Ordering::Release);
        cv.notify_all();
    }

    pub(crate) fn peer_table(&self) -> MutexGuard<'_, PeerTable> {
        self.peer_table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh session id for the peer table, unique in this engine.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn new_session_id(&self) -> orbitte_wire::SessionId {
        orbitte_wire::SessionId(self.next_session.fetch_add(1, Ordering::Relaxed))
    }
}

/// The state lock, held. Dropping it handles every queued event (one pump
/// per drained batch), releases the lock, wakes the threads whose outcomes
/// arrived, and drains again if events came in meanwhile and the lock is
/// free.
pub(crate) struct StateGuard<'a> {
    shared: &'a Shared,
    /// Invariant: `Some` until dropped.
    guard: Option<MutexGuard<'a, State>>,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.guard
            .as_deref()
            .expect("a StateGuard holds its lock until dropped")
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.guard
            .as_deref_mut()
            .expect("a StateGuard holds its lock until dropped")
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        if let Some(g) = self.guard.take() {
            release(self.shared, g);
        }
    }
}

/// Drains the intake into the held state, publishes the tables' copy if
/// they changed, takes the work to post and its rails' post locks,
/// releases the lock, posts, wakes the waiters; repeats while events
/// arrived after the release and the lock is free.
fn release<'a>(shared: &'a Shared, mut g: MutexGuard<'a, State>) {
    let mut wake = Vec::new();
    let mut posts: Option<Posts> = None;
    loop {
        if !shared.intake.is_empty() {
            g.intake(&shared.intake, Instant::now());
        }
        let st = &mut *g;
        if st.engine.take_tables_changed() | std::mem::take(&mut st.staged.changed) {
            let copy = Arc::new(TablesSnapshot::of(st.engine.tables(), &st.staged));
            st.snapshot = copy.clone();
            *shared.snapshot.write().unwrap_or_else(|e| e.into_inner()) = copy;
        }
        st.count_arrived(None);
        st.waiters.take_woken(&st.arrived, &mut wake);
        st.arrived.clear();
        if !st.work.is_empty() {
            let p = posts.get_or_insert_with(|| shared.spare.take());
            st.take_posts(p);
        }
        match posts.as_mut() {
            Some(p) if !p.is_empty() => p.post_unlocked(g, &shared.intake),
            _ => drop(g),
        }
        for t in wake.drain(..) {
            t.unpark();
        }
        // Pairs with the fence in `Shared::deliver`.
        fence(Ordering::SeqCst);
        if shared.intake.is_empty() {
            break;
        }
        match shared.try_lock() {
            Some(next) => g = next,
            None => break,
        }
    }
    if let Some(p) = posts {
        shared.spare.put(p);
    }
}

/// A few emptied [`Posts`] kept for reuse, so that a release allocates
/// nothing for its posts once the engine runs.
#[derive(Debug)]
pub(crate) struct Spare {
    tx: crossbeam_channel::Sender<Posts>,
    rx: crossbeam_channel::Receiver<Posts>,
}

impl Spare {
    pub(super) fn new() -> Self {
        let (tx, rx) = crossbeam_channel::bounded(8);
        Self { tx, rx }
    }

    fn take(&self) -> Posts {
        self.rx.try_recv().unwrap_or_default()
    }

    fn put(&self, posts: Posts) {
        // A full pool drops it.
        let _ = self.tx.try_send(posts);
    }
}
