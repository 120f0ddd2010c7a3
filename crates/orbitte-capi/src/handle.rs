//! Handles: the live engines by number, and each engine's tables of
//! registrations, peers and transfers by number.
//!
//! A handle is a number that is never reused in the process (engines) or
//! in its engine (the others), so a stale handle is refused instead of
//! reaching something made later. C sees an engine as an opaque pointer
//! whose value is that number: nothing dereferences it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use orbitte::{
    ConnectOptions, Epoch, HostMemory, ListenerToken, PathKind, PeerId, ReceivedNotification,
    RegistrationId, TransferEngine,
};

use orbitte_cuda::CudaBuffer;

use crate::cma;
use crate::status::Failure;
use crate::xfer::Xfer;

/// An engine, as C holds it: an opaque pointer (never dereferenced).
#[derive(Debug)]
pub struct orbitte_engine {
    _opaque: [u8; 0],
}

/// A registration of an engine (0 is never one).
pub type orbitte_reg = u64;
/// A peer an engine connected to (0 is never one).
pub type orbitte_peer = u64;
/// A prepared transfer of an engine (0 is never one).
pub type orbitte_xfer = u64;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Registered memory, by the address of its first byte.
#[derive(Debug)]
pub(crate) struct LocalReg {
    pub(crate) id: RegistrationId,
    pub(crate) len: u64,
    /// Kept for the engine-allocated kind, freed once deregistered and
    /// drained (the engine holds its own reference while requests run).
    pub(crate) memory: Kept,
}

/// The memory a registration holds.
#[derive(Debug)]
pub(crate) enum Kept {
    Host(Arc<HostMemory>),
    /// CUDA device memory (the cuda-staging path).
    Device(Arc<CudaBuffer>),
}

/// The registrations of an engine.
///
/// Invariant: no two entries of `by_start` overlap; `by_handle` names the
/// same entries by handle.
#[derive(Debug, Default)]
pub(crate) struct Regs {
    pub(crate) by_start: BTreeMap<u64, LocalReg>,
    pub(crate) by_handle: HashMap<orbitte_reg, u64>,
}

impl Regs {
    /// The registration holding `addr..addr+len`, and `addr`'s offset in it.
    pub(crate) fn resolve(&self, addr: u64, len: u64) -> Option<(&LocalReg, u64)> {
        let (start, reg) = self.by_start.range(..=addr).next_back()?;
        let offset = addr - start;
        (offset < reg.len && len <= reg.len - offset).then_some((reg, offset))
    }

    /// A registration overlapping `addr..addr+len`, as (start, len).
    pub(crate) fn overlapping(&self, addr: u64, len: u64) -> Option<(u64, u64)> {
        let end = addr.saturating_add(len);
        self.by_start
            .range(..end)
            .next_back()
            .filter(|(start, r)| start.saturating_add(r.len) > addr)
            .map(|(start, r)| (*start, r.len))
    }
}

/// A peer, as `orbitte_connect` opened it.
#[derive(Debug, Clone)]
pub(crate) struct PeerEntry {
    pub(crate) id: PeerId,
    /// The incarnation connected to: requests are refused once it restarted.
    pub(crate) epoch: Epoch,
    pub(crate) source_id: String,
    pub(crate) path: PathKind,
    /// Where it listens (a reopen connects there again).
    pub(crate) addr: SocketAddr,
    /// The address of the peer's notification anchor (`orbitte_notify`
    /// READs one byte of it to carry a notification).
    pub(crate) anchor: u64,
    /// How it was connected (its listener token): a reopen connects so again.
    pub(crate) options: ConnectOptions,
    /// Its process, when same-host copies serve it; else why not.
    pub(crate) cma: Result<Arc<cma::Target>, String>,
}

/// A small registration every engine makes first: peers READ one byte of
/// it to carry a notification that moves no bytes of the caller's.
#[derive(Debug)]
pub(crate) struct Anchor {
    pub(crate) id: RegistrationId,
    pub(crate) address: u64,
    pub(crate) memory: Arc<HostMemory>,
    /// Held while a peer's pid is proven (its nonce is read into the anchor).
    pub(crate) proof: Mutex<()>,
}

/// An engine and what this API keeps for it.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) engine: TransferEngine,
    pub(crate) anchor: Anchor,
    /// `host:port` peers connect to (None: no listener).
    pub(crate) advertised: Option<String>,
    /// The token its listener requires (published in the connection info).
    pub(crate) token: Option<ListenerToken>,
    /// With `ORBITTE_ENGINE_CMA`: this host's identity (or why unknown).
    pub(crate) host: Option<Result<String, String>>,
    /// Host memory ranges peers published whose public data was loaded,
    /// by peer: same-host copies reach these only.
    pub(crate) loaded: Mutex<HashMap<orbitte_peer, Vec<(u64, u64)>>>,
    /// Counts what was unloaded: a transfer prepared before checks its
    /// same-host plan again at post.
    pub(crate) unloads: AtomicU64,
    pub(crate) cma: cma::Counters,
    pub(crate) workers: cma::Workers,
    pub(crate) regs: Mutex<Regs>,
    pub(crate) peers: Mutex<HashMap<orbitte_peer, PeerEntry>>,
    pub(crate) xfers: Mutex<HashMap<orbitte_xfer, Arc<Mutex<Xfer>>>>,
    /// Notifications taken from the engine and not polled yet.
    pub(crate) inbox: Mutex<VecDeque<ReceivedNotification>>,
    next: AtomicU64,
}

impl Engine {
    pub(crate) fn new(
        engine: TransferEngine,
        anchor: Anchor,
        advertised: Option<String>,
        token: Option<ListenerToken>,
        host: Option<Result<String, String>>,
    ) -> Self {
        Self {
            engine,
            anchor,
            advertised,
            token,
            host,
            loaded: Mutex::default(),
            unloads: AtomicU64::new(0),
            cma: cma::Counters::default(),
            workers: cma::Workers::default(),
            regs: Mutex::default(),
            peers: Mutex::default(),
            xfers: Mutex::default(),
            inbox: Mutex::default(),
            next: AtomicU64::new(1),
        }
    }

    /// A new handle for a registration, peer or transfer.
    pub(crate) fn mint(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn peer(&self, handle: orbitte_peer) -> Result<PeerEntry, Failure> {
        lock(&self.peers)
            .get(&handle)
            .cloned()
            .ok_or_else(|| Failure::bad_handle("peer", handle))
    }

    pub(crate) fn xfer(&self, handle: orbitte_xfer) -> Result<Arc<Mutex<Xfer>>, Failure> {
        lock(&self.xfers)
            .get(&handle)
            .cloned()
            .ok_or_else(|| Failure::bad_handle("transfer", handle))
    }
}

/// The live engines: every call reads it, create and destroy write it.
static ENGINES: RwLock<BTreeMap<u64, Arc<Engine>>> = RwLock::new(BTreeMap::new());
static NEXT_ENGINE: AtomicU64 = AtomicU64::new(1);

/// Keeps `engine` and returns the handle C holds.
pub(crate) fn insert(engine: Engine) -> *mut orbitte_engine {
    let id = NEXT_ENGINE.fetch_add(1, Ordering::Relaxed);
    ENGINES
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(id, Arc::new(engine));
    std::ptr::without_provenance_mut(id as usize)
}

/// The engine `h` names.
pub(crate) fn engine(h: *const orbitte_engine) -> Result<Arc<Engine>, Failure> {
    if h.is_null() {
        return Err(Failure::null("engine"));
    }
    let id = h.addr() as u64;
    ENGINES
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&id)
        .cloned()
        .ok_or_else(|| Failure::bad_handle("engine", id))
}

/// Takes the engine `h` names out of the table (later calls with `h` are
/// refused).
pub(crate) fn remove(h: *const orbitte_engine) -> Result<Arc<Engine>, Failure> {
    if h.is_null() {
        return Err(Failure::null("engine"));
    }
    let id = h.addr() as u64;
    ENGINES
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&id)
        .ok_or_else(|| Failure::bad_handle("engine", id))
}
