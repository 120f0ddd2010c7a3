//! The transfer engine: the driver around the sans-IO core.
//!
//! One mutex guards the core and every table; the caller's thread posts
//! (submit), one poller thread per NIC context turns completions and async
//! events into core events, and a timer thread expires deadlines. Waiters
//! sleep on one condition variable that every pump wakes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use orbitte_memory::{DmaBuffer, HostMemory};
use orbitte_topology::{DeviceMask, MemoryLocation, NicId, RdmaConfig};
use orbitte_verbs::{self as verbs, Completion, Provider};
use orbitte_wire::{self as wire, Epoch, PeerTable, SourceId};

use crate::config::EngineBuilder;
use crate::core::{Core, CoreConfig, CoreRequest};
use crate::error::{
    BuildError, DrainTimeout, NicsUnavailable, RegisterError, Unquiesced, UnregisterError,
    WaitError,
};
use crate::nic::{self, ContextStatus, EngineTopology, Initialized};
use crate::outcome::{DrainStatus, Outcome, RailRefusal, RequestError, RequestId, SubmitError};
use crate::rdma::{self, RdmaTransport};
use crate::registration::{
    Access, Charges, Ledger, NicCopies, RegEntry, RegState, Registration, close_copies,
};
use crate::transport::{
    EventSink, MarkerFate, Op, PeerId, PostContext, RailId, RailSpec, RangeId, RegistrationId,
    Transport, TransportEvent, WorkItem,
};

/// One READ or WRITE of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferRequest {
    /// READ (remote → local) or WRITE (local → remote).
    pub op: Op,
    /// The local registration.
    pub registration: RegistrationId,
    /// Offset in it.
    pub local_offset: u64,
    /// The peer.
    pub peer: PeerId,
    /// The peer's published range.
    pub range: RangeId,
    /// Offset in it.
    pub remote_offset: u64,
    /// Bytes.
    pub len: u64,
    /// Caller's label, echoed in the outcome and in errors.
    pub label: u64,
}

impl TransferRequest {
    /// A WRITE of `len` bytes from `local` at `local_offset` to the peer's
    /// `range` at `remote_offset`.
    pub fn write(
        local: RegistrationId,
        local_offset: u64,
        peer: PeerId,
        range: RangeId,
        remote_offset: u64,
        len: u64,
    ) -> Self {
        Self {
            op: Op::Write,
            registration: local,
            local_offset,
            peer,
            range,
            remote_offset,
            len,
            label: 0,
        }
    }

    /// A READ of `len` bytes from the peer's `range` at `remote_offset` into
    /// `local` at `local_offset`.
    pub fn read(
        local: RegistrationId,
        local_offset: u64,
        peer: PeerId,
        range: RangeId,
        remote_offset: u64,
        len: u64,
    ) -> Self {
        Self {
            op: Op::Read,
            registration: local,
            local_offset,
            peer,
            range,
            remote_offset,
            len,
            label: 0,
        }
    }

    /// Same request with a label.
    pub fn label(mut self, label: u64) -> Self {
        self.label = label;
        self
    }
}

/// Which transport owns a rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Rdma,
    Other(usize),
}

/// A handle for a transport attached with
/// [`TransferEngine::attach_transport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct TransportId(pub(crate) usize);

/// One rail of an open peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailInfo {
    /// The rail.
    pub rail: RailId,
    /// Local NIC ID (rdma).
    pub nic: Option<NicId>,
    /// Remote NIC ID (rdma).
    pub remote_nic: Option<NicId>,
    /// Queue pair number (rdma), for diagnostics.
    pub qpn: Option<u32>,
    /// Local device name (rdma).
    pub device: Option<String>,
    /// Whether it takes new work now.
    pub up: bool,
    /// Why it is down, if it is.
    pub down_reason: Option<String>,
    /// Its recovery (rdma rails): up, down since, recovering (attempt n)
    /// or cooling down until; `None` for tcp and local rails.
    pub recovery: Option<crate::recovery::RecoveryState>,
    /// How many times it came back after going down.
    pub recoveries: u32,
}

/// An open peer (remote source owner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// Handle for requests.
    pub id: PeerId,
    /// The peer's source id.
    pub source_id: String,
    /// Its authoritative epoch.
    pub epoch: Epoch,
    /// Ranges it published, in range id order.
    pub ranges: Vec<crate::RemoteRange>,
    /// Rails to it.
    pub rails: Vec<RailInfo>,
}

#[derive(Debug)]
pub(crate) struct PeerState {
    pub(crate) source_id: SourceId,
    pub(crate) epoch: Epoch,
    pub(crate) sessions: Vec<wire::SessionId>,
    pub(crate) ranges: HashMap<RangeId, wire::RangeDescriptor>,
    pub(crate) rails: Vec<RailId>,
}

/// The registration and peer tables, lent to transports while they post.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    pub(crate) regs: HashMap<u64, RegEntry>,
    pub(crate) peers: HashMap<u32, PeerState>,
}

impl PostContext for Tables {
    fn memory(&self, registration: RegistrationId) -> Option<&Arc<HostMemory>> {
        self.regs.get(&registration.0).map(|e| &e.memory)
    }

    fn local_key(&self, registration: RegistrationId, nic: u32) -> Option<(u64, u32)> {
        let c = self.regs.get(&registration.0)?.copies_on(nic)?;
        Some((c.local.addr(), c.local.lkey()))
    }

    fn remote_range(&self, peer: PeerId, range: RangeId) -> Option<&wire::RangeDescriptor> {
        self.peers.get(&peer.0)?.ranges.get(&range)
    }
}

/// The peer and the published range a request names, checked: the peer
/// is open, the range published, `rend` (the request's end in it) inside
/// it, and the range allows the operation.
pub(crate) fn published_remote<'t>(
    tables: &'t Tables,
    r: &TransferRequest,
    rend: u64,
) -> Result<(&'t PeerState, &'t wire::RangeDescriptor), RequestError> {
    let peer = tables
        .peers
        .get(&r.peer.0)
        .ok_or(RequestError::UnknownPeer(r.peer))?;
    let desc = peer
        .ranges
        .get(&r.range)
        .ok_or(RequestError::UnpublishedRemote {
            peer: r.peer,
            range: r.range,
        })?;
    if rend > desc.length {
        return Err(RequestError::OutOfRange {
            side: "remote",
            offset: r.remote_offset,
            len: r.len,
            size: desc.length,
        });
    }
    let need = match r.op {
        Op::Read => wire::AccessFlags::REMOTE_READ,
        Op::Write => wire::AccessFlags::REMOTE_WRITE,
    };
    if !desc.access.contains(need) {
        return Err(RequestError::WrongAccess {
            side: "remote",
            op: r.op,
        });
    }
    Ok((peer, desc))
}

pub(crate) struct State {
    pub(crate) core: Core,
    pub(crate) rdma: RdmaTransport,
    pub(crate) others: Vec<Box<dyn Transport>>,
    pub(crate) owner: Vec<Owner>,
    pub(crate) qpn_rail: HashMap<(u32, u32), RailId>,
    pub(crate) tables: Tables,
    pub(crate) next_reg: u64,
    pub(crate) next_peer: u32,
    pub(crate) next_connect: u64,
    pub(crate) ledger: Ledger,
    pub(crate) listed: Vec<verbs::DeviceInfo>,
    pub(crate) listing_error: Option<Arc<verbs::DeviceListError>>,
    pub(crate) init: Option<Initialized>,
    /// NIC IDs in affinity order (best first) for host memory.
    pub(crate) nic_order: Vec<u32>,
    pub(crate) outcomes: HashMap<RequestId, Outcome>,
    pub(crate) unquiesced: Vec<Unquiesced>,
    /// Closed rdma rails waiting for their flushed work to drain before
    /// their queue pair is destroyed.
    pub(crate) reap: Vec<RailId>,
    /// This engine's source id and epoch (for `Unquiesced` evidence).
    pub(crate) who: (String, u64),
    /// Notifying batches whose outcomes are held until they resolve.
    pub(crate) notify: crate::notify::tracker::Tracker,
    /// When to re-establish each rdma rail (see `crate::recovery`).
    pub(crate) recovery: crate::recovery::Recoveries,
    /// CUDA registrations and cuda-staging requests.
    pub(crate) staged: crate::staging::Staged,
    work: Vec<WorkItem>,
    rotor: usize,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl State {
    /// Posts what the core has, reports post errors, flushes what the core
    /// asks, collects outcomes.
    pub(crate) fn pump(&mut self, now: Instant) {
        let mut work = std::mem::take(&mut self.work);
        work.clear();
        self.core.poll_work(&mut work);
        let mut start = 0;
        while start < work.len() {
            let rail = work[start].rail;
            let end = work[start..]
                .iter()
                .position(|w| w.rail != rail)
                .map_or(work.len(), |p| start + p);
            let run = &work[start..end];
            let res = match self.owner.get(rail.0 as usize) {
                Some(Owner::Rdma) => self.rdma.post(rail, run, &self.tables),
                Some(Owner::Other(i)) => match self.others.get_mut(*i) {
                    Some(t) => t.post(rail, run, &self.tables),
                    None => Err(crate::transport::PostError {
                        rail,
                        posted: 0,
                        reason: "no transport".into(),
                    }),
                },
                None => Err(crate::transport::PostError {
                    rail,
                    posted: 0,
                    reason: "no transport".into(),
                }),
            };
            if let Err(e) = res {
                tracing::debug!(error = %e, "post failed");
                self.core.handle_post_error(now, &e, run);
            }
            start = end;
        }
        self.work = work;
        while let Some((rail, marker)) = self.core.poll_flush(now) {
            let res = match self.owner.get(rail.0 as usize) {
                Some(Owner::Rdma) => match self.rdma.flush_with_marker(rail, marker) {
                    Ok(fate) => Ok(fate),
                    Err(u) => {
                        // The queue pair could be neither flushed nor
                        // destroyed: its slices stay undrained, verbs
                        // retains it, and the engine is Unquiesced.
                        self.record_rail_unquiesced(format!("flushing rail {}", rail.0), *u);
                        self.core.marker_dropped(rail, marker);
                        continue;
                    }
                },
                Some(Owner::Other(i)) => self
                    .others
                    .get_mut(*i)
                    .map_or(Ok(MarkerFate::Dropped), |t| t.flush_marked(rail, marker)),
                None => Ok(MarkerFate::Dropped),
            };
            match res {
                Ok(MarkerFate::Posted) => {}
                Ok(MarkerFate::Dropped) => self.core.marker_dropped(rail, marker),
                Ok(MarkerFate::Released) => self.core.release_rail(now, rail),
                Err(e) => {
                    tracing::error!(error = %e, "flushing a rail failed; its slices stay undrained");
                    self.core.marker_dropped(rail, marker);
                }
            }
        }
        if !self.reap.is_empty() {
            let ready: Vec<RailId> = self
                .reap
                .iter()
                .copied()
                .filter(|r| self.core.rail_in_flight(*r) == 0)
                .collect();
            self.reap.retain(|r| !ready.contains(r));
            for rail in ready {
                self.destroy_rdma_rail(rail);
            }
        }
        crate::notify::collect_outcomes(self);
    }

    pub(crate) fn handle_events(&mut self, now: Instant, events: &mut Vec<TransportEvent>) {
        for ev in events.drain(..) {
            self.core.handle_event(now, ev);
        }
        self.core.handle_timeout(now);
        self.pump(now);
    }

    /// Closes a rail for good: no new work; a busy rail is flushed (by the
    /// next pump) and, for rdma, its queue pair destroyed once its work
    /// drained; an idle one is destroyed now.
    pub(crate) fn retire_rail(&mut self, rail: RailId, now: Instant) {
        self.recovery.untrack(rail);
        let busy = self.core.close_rail(rail, now);
        match self.owner.get(rail.0 as usize) {
            Some(Owner::Rdma) if busy => self.reap.push(rail),
            Some(Owner::Rdma) => self.destroy_rdma_rail(rail),
            Some(Owner::Other(t)) if !busy => {
                if let Some(tr) = self.others.get_mut(*t)
                    && let Err(e) = tr.close_rail(rail)
                {
                    tracing::warn!(error = %e, "closing a rail failed");
                }
            }
            _ => {}
        }
    }

    /// Destroys an rdma rail's queue pair; a failure is `Unquiesced`.
    fn destroy_rdma_rail(&mut self, rail: RailId) {
        if let Err(u) = self.rdma.destroy(rail) {
            self.record_rail_unquiesced(format!("closing rail {}", rail.0), *u);
        }
    }

    /// Records a failed queue pair destroy of a rail as `Unquiesced` (the
    /// QP is retained by verbs; a QP carries no budget charge) and fences
    /// new admission with the reason.
    pub(crate) fn record_rail_unquiesced(&mut self, during: String, failure: verbs::Unquiesced) {
        let u = Unquiesced {
            source_id: self.who.0.clone(),
            epoch: self.who.1,
            during,
            failures: vec![failure],
            retained: Charges::default(),
        };
        tracing::error!(error = %u, "unquiesced: fencing new admission");
        self.fence(format!(
            "unquiesced during {}: {}",
            u.during,
            u.failures
                .first()
                .map(|f| f.to_string())
                .unwrap_or_default()
        ));
        self.unquiesced.push(u);
    }

    pub(crate) fn fence(&mut self, reason: impl Into<Arc<str>>) {
        self.core.fence(reason.into());
    }

    pub(crate) fn add_rail(&mut self, owner: Owner, spec: RailSpec) -> RailId {
        let rail = self.core.add_rail(spec);
        let i = rail.0 as usize;
        if self.owner.len() <= i {
            self.owner.resize(i + 1, Owner::Rdma);
        }
        self.owner[i] = owner;
        rail
    }

    pub(crate) fn nic_info(&self) -> Vec<(u32, u16, verbs::Gid)> {
        self.init.as_ref().map_or_else(Vec::new, |i| {
            i.nics.iter().map(|n| (n.id.0, n.lid, n.gid)).collect()
        })
    }
}

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

    /// A fresh session id for the peer table, unique in this engine.
    pub(crate) fn new_session_id(&self) -> wire::SessionId {
        wire::SessionId(self.next_session.fetch_add(1, Ordering::Relaxed))
    }
}

struct Sink(std::sync::Weak<Shared>);

impl EventSink for Sink {
    fn deliver(&self, events: &mut Vec<TransportEvent>) {
        if let Some(shared) = self.0.upgrade() {
            shared.lock().handle_events(Instant::now(), events);
            shared.cond.notify_all();
        } else {
            events.clear();
        }
    }
}

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

impl EngineBuilder {
    /// Builds the engine. Lists the provider's devices (NIC IDs, in the
    /// natural name order `orbitte topology` numbers sysfs devices in) but
    /// opens none: contexts initialize at the first Host Direct registration or
    /// first RDMA use.
    pub fn build(self) -> Result<TransferEngine, BuildError> {
        let (source_id, epoch) = self.checked()?;
        let mut sessions = self.session_config(&source_id, epoch);
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
        let core = Core::new(CoreConfig {
            slice_size: self.slice_size,
            request_timeout: self.request_timeout,
            drain_timeout: self.drain_timeout,
        });
        let state = State {
            core,
            rdma: RdmaTransport::default(),
            others: Vec::new(),
            owner: Vec::new(),
            qpn_rail: HashMap::new(),
            tables: Tables::default(),
            next_reg: 1,
            next_peer: 1,
            next_connect: 1,
            ledger: Ledger {
                budgets: self.budgets,
                in_use: Charges::default(),
            },
            listed,
            listing_error,
            init: None,
            nic_order: Vec::new(),
            outcomes: HashMap::new(),
            unquiesced: Vec::new(),
            reap: Vec::new(),
            who: (source_id.as_str().to_owned(), epoch.value()),
            notify: crate::notify::tracker::Tracker::default(),
            recovery: crate::recovery::Recoveries::new(self.recovery),
            staged: crate::staging::Staged::default(),
            work: Vec::new(),
            rotor: 0,
        };
        let shared = Arc::new(Shared {
            peer_table: Arc::new(Mutex::new(PeerTable::new(source_id.clone()))),
            next_session,
            state: Mutex::new(state),
            cond: Condvar::new(),
            timer: Condvar::new(),
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
            },
            threads: Mutex::new(Vec::new()),
            sessions,
            net: std::sync::OnceLock::new(),
            listener: Mutex::new(None),
            host_without_rdma: self.host_without_rdma,
            #[cfg(feature = "etcd")]
            etcd: Mutex::new(None),
            inbox: crate::notify::inbox::Inbox::default(),
            staging: crate::staging::Pools::new(self.staging),
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

fn timer_loop(shared: &Shared) {
    let mut st = shared.lock();
    while !shared.stop.load(Ordering::Acquire) {
        let now = Instant::now();
        st.core.handle_timeout(now);
        st.pump(now);
        shared.cond.notify_all();
        let next = st
            .core
            .poll_timeout()
            .map_or(Duration::from_millis(50), |t| {
                t.saturating_duration_since(now)
            });
        let wait = next.clamp(Duration::from_millis(1), Duration::from_millis(50));
        st = shared
            .timer
            .wait_timeout(st, wait)
            .map_or_else(|e| e.into_inner().0, |(g, _)| g);
    }
}

fn poll_loop(shared: &Shared, nic: u32, cq: verbs::CompletionQueue, ctx: verbs::Context) {
    let mut buf = [Completion::default(); 64];
    let mut events = Vec::with_capacity(256);
    let device = ctx.identity().name.clone();
    let poll = |buf: &mut [Completion]| match cq.poll(buf) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(device, error = %e, "polling the completion queue failed");
            0
        }
    };
    while !shared.stop.load(Ordering::Acquire) {
        // Poll first; arm and wait only when the queue is empty, so a busy
        // queue costs no notification (a syscall on some providers) per
        // batch.
        let mut n = poll(&mut buf);
        if n == 0 {
            let _ = cq.wait(Duration::from_millis(2));
            n = poll(&mut buf);
        }
        let mut asyncs = Vec::new();
        while let Ok(Some(ev)) = ctx.next_async_event(Duration::ZERO) {
            asyncs.push(ev);
        }
        if n == 0 && asyncs.is_empty() {
            continue;
        }
        let mut st = shared.lock();
        for c in &buf[..n] {
            match st.qpn_rail.get(&(nic, c.qp_num)) {
                Some(&rail) if crate::notify::rdma::is_notification_wr(c.wr_id) => {
                    crate::notify::rdma::on_completion(
                        &mut st,
                        &shared.inbox,
                        rail,
                        c,
                        &mut events,
                    );
                }
                Some(&rail) => {
                    if rdma::completion_events(rail, c, &mut events) {
                        st.rdma.mark_failed(rail);
                    }
                }
                None => tracing::debug!(
                    device,
                    qpn = c.qp_num,
                    "completion for an unknown qp ignored"
                ),
            }
        }
        for ev in asyncs {
            tracing::debug!(device, ?ev, "async event");
            match ev {
                verbs::AsyncEvent::PortError { port } => {
                    for rail in st.rdma.rails_on(nic) {
                        let reason = format!(
                            "port {port} of {device} (NIC ID {nic}) is down or paused; wait for port recovery"
                        );
                        events.push(TransportEvent::RailDown {
                            rail,
                            reason: reason.into(),
                        });
                    }
                }
                verbs::AsyncEvent::PortActive { .. } => {
                    let now = Instant::now();
                    for rail in st.rdma.rails_on(nic) {
                        if st.rdma.is_rts(rail) {
                            events.push(TransportEvent::RailUp { rail });
                            if st.recovery.observe(rail, true, now) {
                                tracing::info!(
                                    rail = rail.0,
                                    "rail recovered: its port is active again"
                                );
                            }
                        } else {
                            // A new queue pair can be connected now.
                            st.recovery.retry_now(rail, now);
                        }
                    }
                }
                verbs::AsyncEvent::QpFatal { qpn }
                | verbs::AsyncEvent::QpAccessError { qpn }
                | verbs::AsyncEvent::QpRequestError { qpn } => {
                    if let Some(&rail) = st.qpn_rail.get(&(nic, qpn)) {
                        st.rdma.mark_failed(rail);
                        let reason = format!("qp {qpn} on {device} hit {ev:?}");
                        events.push(TransportEvent::RailDown {
                            rail,
                            reason: reason.into(),
                        });
                    }
                }
                verbs::AsyncEvent::DeviceFatal => {
                    for rail in st.rdma.rails_on(nic) {
                        let reason = format!("device {device} is fatal");
                        events.push(TransportEvent::RailDown {
                            rail,
                            reason: reason.into(),
                        });
                    }
                }
                _ => {}
            }
        }
        st.handle_events(Instant::now(), &mut events);
        drop(st);
        shared.cond.notify_all();
    }
}

impl TransferEngine {
    /// This engine's source owner id.
    pub fn source_id(&self) -> &str {
        self.shared.source_id.as_str()
    }

    /// This engine's authoritative epoch.
    pub fn epoch(&self) -> u64 {
        self.shared.epoch.value()
    }

    /// The engine's peer table (the wire's epoch and version rules), for
    /// tests that admit hellos as a session outside the engine would. Lock
    /// it briefly; never call into the engine while holding it.
    #[cfg(any(test, feature = "testing"))]
    pub fn peer_table(&self) -> Arc<Mutex<PeerTable>> {
        self.shared.peer_table.clone()
    }

    /// A fresh session id for the peer table, unique in this engine.
    #[cfg(any(test, feature = "testing"))]
    pub fn new_session_id(&self) -> wire::SessionId {
        self.shared.new_session_id()
    }

    /// The address the engine's own listener is bound to
    /// ([`EngineBuilder::listen`]; port 0 there: the port chosen), or
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

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    /// Initializes NIC contexts once (first Host Direct registration or
    /// first RDMA use). Returns the prepared NIC IDs, or why there are none.
    pub(crate) fn ensure_contexts(&self) -> Result<Vec<u32>, NicsUnavailable> {
        let mut st = self.lock();
        if st.init.is_none() {
            let init = nic::initialize(
                self.shared.provider.as_ref(),
                &st.listed,
                &self.shared.settings.rdma,
                (self.shared.settings.max_in_flight * 64).clamp(1024, 65536),
            );
            let mut order: Vec<u32> = match init
                .topology
                .rank_nics(MemoryLocation::Host { numa_node: None })
            {
                Ok(r) => r.into_iter().map(|a| a.nic.0).collect(),
                Err(_) => Vec::new(),
            };
            order.retain(|id| init.nics.iter().any(|n| n.id.0 == *id));
            for n in &init.nics {
                if !order.contains(&n.id.0) {
                    order.push(n.id.0);
                }
            }
            st.nic_order = order;
            let mut threads = self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for n in &init.nics {
                let shared = self.shared.clone();
                let (id, cq, ctx) = (n.id.0, n.cq.clone(), n.context.clone());
                match std::thread::Builder::new()
                    .name(format!("orbitte-poll-{id}"))
                    .spawn(move || poll_loop(&shared, id, cq, ctx))
                {
                    Ok(h) => threads.push(h),
                    Err(e) => tracing::error!(nic = id, error = %e, "poller thread did not start"),
                }
            }
            if !init.nics.is_empty() {
                let shared = self.shared.clone();
                match std::thread::Builder::new()
                    .name("orbitte-recovery".into())
                    .spawn(move || crate::recovery::recovery_loop(&shared))
                {
                    Ok(h) => threads.push(h),
                    Err(e) => {
                        tracing::error!(error = %e, "rail recovery thread did not start")
                    }
                }
            }
            tracing::info!(contexts = init.nics.len(), "nic contexts initialized");
            st.init = Some(init);
        }
        let init = st.init.as_ref().map(|i| {
            (
                i.nics.iter().map(|n| n.id.0).collect::<Vec<_>>(),
                i.selection_error.clone(),
            )
        });
        match init {
            Some((ids, _)) if !ids.is_empty() => Ok(ids),
            Some((_, Some(err))) => Err(NicsUnavailable::Selection(err)),
            _ => Err(st
                .listing_error
                .clone()
                .map_or(NicsUnavailable::NonePrepared, NicsUnavailable::Listing)),
        }
    }

    /// What was discovered and what was initialized so far.
    pub fn topology(&self) -> EngineTopology {
        let st = self.lock();
        let listed = st.listed.iter().map(|d| d.identity.name.clone()).collect();
        match &st.init {
            None => EngineTopology {
                listed,
                initialized: false,
                topology: None,
                selection: None,
                selection_error: st.listing_error.as_ref().map(ToString::to_string),
                contexts: Vec::new(),
            },
            Some(init) => EngineTopology {
                listed,
                initialized: true,
                topology: Some(init.topology.clone()),
                selection: init.selection.clone(),
                selection_error: init.selection_error.as_ref().map(ToString::to_string),
                contexts: init
                    .nics
                    .iter()
                    .map(|n| ContextStatus {
                        nic: n.id,
                        device: n.identity.name.clone(),
                        driver: n.driver.clone(),
                        port: n.port,
                        gid_index: n.gid_index,
                        port_active: n.port_active(),
                    })
                    .collect(),
            },
        }
    }

    /// Budget charges in use (MRs, bytes), retained copies included.
    pub fn charges(&self) -> Charges {
        self.lock().ledger.in_use
    }

    /// Why the engine admits nothing new, if it is fenced.
    pub fn fenced(&self) -> Option<String> {
        self.lock().core.fenced().map(|r| r.to_string())
    }

    /// Every `Unquiesced` so far (the evidence is kept).
    pub fn unquiesced(&self) -> Vec<Unquiesced> {
        self.lock().unquiesced.clone()
    }

    pub(crate) fn unquiesced_from(
        &self,
        during: String,
        failures: Vec<verbs::Unquiesced>,
        retained: Charges,
    ) -> Unquiesced {
        Unquiesced {
            source_id: self.shared.source_id.as_str().to_owned(),
            epoch: self.shared.epoch.value(),
            during,
            failures,
            retained,
        }
    }

    pub(crate) fn record_unquiesced(&self, st: &mut State, u: &Unquiesced) {
        tracing::error!(error = %u, "unquiesced: fencing new admission");
        st.fence(format!(
            "unquiesced during {}: {}",
            u.during,
            u.failures
                .first()
                .map(|f| f.to_string())
                .unwrap_or_default()
        ));
        st.unquiesced.push(u.clone());
    }

    /// Registers `memory` for requests and, unless `access` is
    /// [`Access::LocalOnly`], publishes it to peers. The returned
    /// [`Registration`] says which path serves it
    /// ([`MemoryPath`](crate::MemoryPath)).
    ///
    /// Host memory is a Host Direct registration
    /// ([`register_host_at`](Self::register_host_at): MRs on every usable
    /// NIC context, budgets charged per copy, all or nothing) unless the
    /// engine was built with
    /// [`host_memory_without_rdma`](crate::EngineBuilder::host_memory_without_rdma):
    /// then no MR is made and tcp and local serve it. A Host Direct failure
    /// is an error, never a silent switch to another path.
    pub fn register(
        &self,
        memory: impl Into<crate::registration::Memory>,
        access: Access,
    ) -> Result<Registration, RegisterError> {
        match memory.into() {
            crate::registration::Memory::Host { memory, location } => {
                if self.shared.host_without_rdma {
                    self.register_host_without_rdma(memory, access)
                } else {
                    self.register_host_at(memory, access, location)
                }
            }
            crate::registration::Memory::Cuda(buffer) => self.register_cuda(buffer, access),
        }
    }

    /// Host Direct registration: prepares MRs on every prepared NIC context
    /// (paused ports included, whatever the dispatch mask), one copy per
    /// context for `Access::LocalOnly`, two for a remotely accessible one, and
    /// publishes the range only when all succeeded. The memory's location
    /// is unknown: rails are used in NIC ID order.
    pub fn register_host(
        &self,
        memory: Arc<HostMemory>,
        access: Access,
    ) -> Result<Registration, RegisterError> {
        self.register_host_at(memory, access, MemoryLocation::Host { numa_node: None })
    }

    /// [`register_host`](Self::register_host) for memory at a known
    /// location (NUMA node): requests on it stripe over rails in affinity
    /// order (PCIe distance, then NUMA distance, then NIC ID), best first.
    pub fn register_host_at(
        &self,
        memory: Arc<HostMemory>,
        access: Access,
        location: MemoryLocation,
    ) -> Result<Registration, RegisterError> {
        if let Some(reason) = self.lock().core.fenced().cloned() {
            return Err(RegisterError::Fenced { reason });
        }
        self.ensure_contexts()
            .map_err(|report| RegisterError::NoUsableNic { report })?;
        let len = memory.len();
        let (id, pds, ask) = {
            let mut st = self.lock();
            if let Some(reason) = st.core.fenced().cloned() {
                return Err(RegisterError::Fenced { reason });
            }
            let nics = st.init.as_ref().map(|i| &i.nics[..]).unwrap_or(&[]);
            let pds: Vec<_> = nics
                .iter()
                .map(|n| (n.id.0, n.pd.clone(), n.identity.clone()))
                .collect();
            let copies = access.copies_per_context() * pds.len() as u64;
            let ask = Charges {
                mrs: copies,
                bytes: copies.saturating_mul(len as u64),
            };
            st.ledger.check(ask)?;
            // Reserve now so that concurrent registrations see the charge.
            st.ledger.charge(ask);
            let id = st.next_reg;
            st.next_reg += 1;
            (id, pds, ask)
        };
        let nic_order = {
            let st = self.lock();
            let ranked = st
                .init
                .as_ref()
                .and_then(|i| i.topology.rank_nics(location).ok())
                .unwrap_or_default();
            crate::registration::affinity_classes(&ranked)
        };
        let span = tracing::debug_span!("register_host", id, len, ?access);
        let _g = span.enter();
        let buf: Arc<dyn DmaBuffer> = memory.clone();
        let mut copies = Vec::with_capacity(pds.len());
        let mut failure = None;
        for (nic, pd, identity) in &pds {
            let local = match pd.register(buf.clone(), 0..len, verbs::Access::LOCAL_WRITE) {
                Ok(m) => m,
                Err(source) => {
                    failure = Some(RegisterError::Native {
                        nic: NicId(*nic),
                        device: Box::new(identity.clone()),
                        copy: "local-access",
                        len,
                        source: Box::new(source),
                    });
                    break;
                }
            };
            let remote = match access.remote_verbs() {
                None => None,
                Some(a) => match pd.register(buf.clone(), 0..len, a) {
                    Ok(m) => Some(m),
                    Err(source) => {
                        copies.push(NicCopies {
                            nic: *nic,
                            local,
                            remote: None,
                        });
                        failure = Some(RegisterError::Native {
                            nic: NicId(*nic),
                            device: Box::new(identity.clone()),
                            copy: "remote-access",
                            len,
                            source: Box::new(source),
                        });
                        break;
                    }
                },
            };
            copies.push(NicCopies {
                nic: *nic,
                local,
                remote,
            });
        }
        if let Some(err) = failure {
            // Release the copies made so far; a release that fails leaves
            // them retained (verbs keeps the owners and memory) and charged.
            let failures = close_copies(copies);
            let retained = Charges {
                mrs: failures.len() as u64,
                bytes: failures.len() as u64 * len as u64,
            };
            let mut st = self.lock();
            st.ledger.release(ask);
            st.ledger.charge(retained);
            tracing::warn!(error = %err, "host registration failed; copies released");
            if !failures.is_empty() {
                let u = self.unquiesced_from(
                    format!("release after a failed registration of {len} bytes"),
                    failures,
                    retained,
                );
                self.record_unquiesced(&mut st, &u);
                return Err(RegisterError::Unquiesced {
                    unquiesced: Box::new(u),
                    cause: Box::new(err),
                });
            }
            return Err(err);
        }
        let n = copies.len() as u64 * access.copies_per_context();
        let entry = RegEntry::published(memory, access, copies, ask, nic_order);
        self.lock().tables.regs.insert(id, entry);
        tracing::debug!(id, copies = n, "registration published");
        Ok(Registration {
            id: RegistrationId(id),
            len: len as u64,
            access,
            copies: n,
            path: crate::registration::MemoryPath::HostDirect,
        })
    }

    /// Registers a range for the tcp and local paths only: no MR is made on
    /// any NIC (nothing is charged) and the rdma path is never offered for
    /// it. An explicit choice for hosts without RDMA, never a fallback:
    /// [`register_host`](Self::register_host) does not switch to it.
    pub fn register_host_without_rdma(
        &self,
        memory: Arc<HostMemory>,
        access: Access,
    ) -> Result<Registration, RegisterError> {
        let mut st = self.lock();
        if let Some(reason) = st.core.fenced().cloned() {
            return Err(RegisterError::Fenced { reason });
        }
        let id = st.next_reg;
        st.next_reg += 1;
        let len = memory.len() as u64;
        st.tables.regs.insert(
            id,
            RegEntry::published(memory, access, Vec::new(), Charges::default(), Vec::new()),
        );
        tracing::debug!(id, len, "registration published for tcp/local only");
        Ok(Registration {
            id: RegistrationId(id),
            len,
            access,
            copies: 0,
            path: crate::registration::MemoryPath::HostWithoutRdma,
        })
    }

    /// Unpublishes a registration: new requests on it are refused, peers'
    /// rkeys are revoked (its remote-access MRs are deregistered). Local
    /// requests already in flight keep their local-access MRs until they
    /// drain.
    pub fn retire(&self, registration: RegistrationId) -> Result<(), UnregisterError> {
        let mut st = self.lock();
        let Some(entry) = st.tables.regs.get_mut(&registration.0) else {
            return Err(UnregisterError::Unknown(registration));
        };
        entry.state = RegState::Retired;
        let len = entry.memory.len() as u64;
        let mut failures = Vec::new();
        let mut released = Charges::default();
        for c in &mut entry.copies {
            if let Some(mr) = c.remote.take() {
                match mr.close() {
                    Ok(()) => {
                        released.mrs += 1;
                        released.bytes += len;
                    }
                    Err(u) => failures.push(u),
                }
            }
        }
        entry.charge.mrs -= released.mrs;
        entry.charge.bytes -= released.bytes;
        st.ledger.release(released);
        if failures.is_empty() {
            return Ok(());
        }
        let retained = Charges {
            mrs: failures.len() as u64,
            bytes: failures.len() as u64 * len,
        };
        let u = self.unquiesced_from(
            format!("retire of registration {}", registration.0),
            failures,
            retained,
        );
        self.record_unquiesced(&mut st, &u);
        Err(UnregisterError::Unquiesced(Box::new(u)))
    }

    /// Deregisters every copy and forgets the range. Refused while requests
    /// on it are undrained. A failed native deregistration yields
    /// `Unquiesced`: the copy, its memory and its charge stay retained and
    /// the engine is fenced.
    pub fn unregister(&self, registration: RegistrationId) -> Result<(), UnregisterError> {
        if let Some(result) = self.unregister_cuda(registration) {
            return result;
        }
        let mut st = self.lock();
        let Some(entry) = st.tables.regs.get(&registration.0) else {
            return Err(UnregisterError::Unknown(registration));
        };
        let requests = entry.undrained();
        if requests > 0 {
            return Err(UnregisterError::Undrained {
                id: registration,
                requests,
            });
        }
        let Some(entry) = st.tables.regs.remove(&registration.0) else {
            return Err(UnregisterError::Unknown(registration));
        };
        let len = entry.memory.len() as u64;
        let failures = close_copies(entry.copies);
        let retained = Charges {
            mrs: failures.len() as u64,
            bytes: failures.len() as u64 * len,
        };
        st.ledger.release(entry.charge);
        st.ledger.charge(retained);
        if failures.is_empty() {
            tracing::debug!(id = registration.0, "registration removed");
            return Ok(());
        }
        let u = self.unquiesced_from(
            format!("unregister of registration {}", registration.0),
            failures,
            retained,
        );
        self.record_unquiesced(&mut st, &u);
        Err(UnregisterError::Unquiesced(Box::new(u)))
    }

    /// The segment descriptors of every published, remotely accessible
    /// range, as the wire's `segment-publication` frame.
    pub fn segment_publication(&self) -> wire::SegmentPublication {
        let st = self.lock();
        let nics = st.nic_info();
        let mut ranges: Vec<_> = st
            .tables
            .regs
            .iter()
            .filter_map(|(id, e)| e.descriptor(RegistrationId(*id), &nics))
            .collect();
        ranges.sort_by_key(|r| r.range_id.0);
        wire::SegmentPublication {
            epoch: self.shared.epoch,
            ranges,
        }
    }

    /// Submits a batch of READ/WRITE requests ([`Request`](crate::Request),
    /// or the positional [`TransferRequest`]): all admitted or none (a typed
    /// error names the first bad request; nothing is posted then). Remote
    /// addresses are resolved against the peers' publications now. Returns
    /// at once; every request ends with an [`Outcome`] ([`poll`](Self::poll),
    /// [`wait`](Self::wait)).
    pub fn submit<R: Into<crate::Request> + Copy>(
        &self,
        batch: &[R],
    ) -> Result<Vec<RequestId>, SubmitError> {
        let resolved = self.resolve(batch)?;
        if self.first_staged(&resolved).is_some() {
            return self.submit_with_staged(&resolved);
        }
        self.submit_inner(&resolved, None)
    }

    /// Admits a batch whose remote addresses are resolved
    /// ([`submit`](Self::submit)), tracking its notification if it carries
    /// one.
    pub(crate) fn submit_inner(
        &self,
        batch: &[TransferRequest],
        notification: Option<crate::notify::Armed>,
    ) -> Result<Vec<RequestId>, SubmitError> {
        let span = tracing::trace_span!("submit", requests = batch.len());
        let _g = span.enter();
        let mut guard = self.lock();
        let st = &mut *guard;
        let now = Instant::now();
        let Some(first) = batch.first() else {
            return Err(SubmitError::Empty);
        };
        if let Some(reason) = st.core.fenced() {
            return Err(SubmitError::Fenced {
                index: 0,
                label: first.label,
                reason: reason.clone(),
            });
        }
        let mask = self.shared.settings.dispatch_mask;
        let mut reqs = Vec::with_capacity(batch.len());
        for (index, r) in batch.iter().enumerate() {
            let bad = |error| SubmitError::Invalid {
                index,
                label: r.label,
                error,
            };
            if r.len == 0 {
                return Err(bad(RequestError::ZeroLength));
            }
            let (Some(lend), Some(rend)) = (
                r.local_offset.checked_add(r.len),
                r.remote_offset.checked_add(r.len),
            ) else {
                return Err(bad(RequestError::Overflow {
                    offset: r.local_offset.max(r.remote_offset),
                    len: r.len,
                }));
            };
            let Some(reg) = st
                .tables
                .regs
                .get(&r.registration.0)
                .filter(|e| e.state == RegState::Published)
            else {
                return Err(bad(RequestError::UnpublishedLocal(r.registration)));
            };
            let size = reg.memory.len() as u64;
            if lend > size {
                return Err(bad(RequestError::OutOfRange {
                    side: "local",
                    offset: r.local_offset,
                    len: r.len,
                    size,
                }));
            }
            let (peer, desc) = published_remote(&st.tables, r, rend).map_err(bad)?;
            let mut why = Vec::new();
            let mut rails = Vec::with_capacity(peer.rails.len());
            for &rail in &peer.rails {
                let spec = st.core.rail_spec(rail);
                let nic = spec.and_then(|s| s.nic);
                if let Some(n) = nic
                    && !mask.contains(NicId(n))
                {
                    why.push(RailRefusal::OutsideMask {
                        rail,
                        nic: NicId(n),
                        mask,
                    });
                    continue;
                }
                if !st.core.rail_is_up(rail) {
                    why.push(match st.core.rail_down_reason(rail) {
                        Some(reason) => RailRefusal::Down { rail, reason },
                        None => RailRefusal::Unknown { rail },
                    });
                    continue;
                }
                if let Some(n) = nic
                    && spec.is_some_and(|s| s.path == crate::transport::PathKind::Rdma)
                {
                    let remote_nic = spec.and_then(|s| s.remote_nic).unwrap_or(u32::MAX);
                    if reg.copies_on(n).is_none()
                        || !desc
                            .rkeys
                            .iter()
                            .any(|k| u32::from(k.nic_id.0) == remote_nic)
                    {
                        why.push(RailRefusal::NoKeys { rail });
                        continue;
                    }
                }
                rails.push(rail);
            }
            if rails.is_empty() {
                if why.is_empty() {
                    why.push(RailRefusal::NoRails);
                }
                return Err(bad(RequestError::NoRail { peer: r.peer, why }));
            }
            // Affinity allows the rails whose NIC is in the best class for
            // this memory among the usable ones (all of them when the
            // memory's location is unknown); rotate among those.
            let class = |rail: &RailId| {
                let nic = st.core.rail_spec(*rail).and_then(|s| s.nic);
                nic.map_or(0, |n| reg.affinity_class(n))
            };
            if let Some(best) = rails.iter().map(class).min() {
                rails.retain(|r| class(r) == best);
            }
            let k = rails.len();
            rails.rotate_left(st.rotor % k);
            st.rotor = st.rotor.wrapping_add(1);
            reqs.push(CoreRequest {
                label: r.label,
                op: r.op,
                registration: r.registration,
                local_offset: r.local_offset,
                peer: r.peer,
                range: r.range,
                remote_offset: r.remote_offset,
                len: r.len,
                rails,
                keepalive: Some(reg.pin.clone()),
            });
        }
        let notification = notification.map(|a| a.on_rails(&reqs));
        let ids = st.core.submit(now, reqs)?;
        if let Some(armed) = notification {
            crate::notify::track(st, &ids, armed);
        }
        st.pump(now);
        Ok(ids)
    }

    /// The outcome, if the request has one (taken: a second call says
    /// `None`).
    pub fn poll(&self, id: RequestId) -> Option<Outcome> {
        self.lock().outcomes.remove(&id)
    }

    /// Waits for the outcome. Every request gets one by its request
    /// timeout, so a `timeout` longer than that always returns it.
    pub fn wait(&self, id: RequestId, timeout: Duration) -> Result<Outcome, WaitError> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if let Some(o) = st.outcomes.remove(&id) {
                return Ok(o);
            }
            let now = Instant::now();
            st.core.handle_timeout(now);
            st.pump(now);
            if let Some(o) = st.outcomes.remove(&id) {
                return Ok(o);
            }
            if !st.core.is_pending(id) && !st.notify.holds(id) && !st.staged.is_pending(id) {
                return Err(WaitError::Unknown(id));
            }
            if now >= deadline {
                return Err(WaitError::TimedOut(id));
            }
            let step = (deadline - now).min(Duration::from_millis(20));
            st = self
                .shared
                .cond
                .wait_timeout(st, step)
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
    }

    /// Waits for every request of a batch (in order).
    pub fn wait_all(
        &self,
        ids: &[RequestId],
        timeout: Duration,
    ) -> Result<Vec<Outcome>, WaitError> {
        let deadline = Instant::now() + timeout;
        ids.iter()
            .map(|id| self.wait(*id, deadline.saturating_duration_since(Instant::now())))
            .collect()
    }

    /// Logical cancellation: the outcome (status `Cancelled`) is made now;
    /// posted slices may still move bytes until the request drains.
    /// Returns false if the request already had its outcome.
    pub fn cancel(&self, id: RequestId) -> bool {
        if let Some(done) = self.cancel_staged(id) {
            return done;
        }
        let mut st = self.lock();
        let now = Instant::now();
        let done = st.core.cancel(now, id);
        st.pump(now);
        drop(st);
        self.shared.cond.notify_all();
        done
    }

    /// Whether the transports still hold the request's local bytes.
    pub fn drain_status(&self, id: RequestId) -> DrainStatus {
        let mut st = self.lock();
        crate::staging::drain_status(&mut st, id).unwrap_or_else(|| st.core.drain_status(id))
    }

    /// Waits until the request is drained (its local buffer is the
    /// caller's again). Past the engine's drain timeout the rails holding
    /// its slices are flushed, which ends the wait on a working device.
    pub fn wait_drain(&self, id: RequestId, timeout: Duration) -> Result<(), DrainTimeout> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            let now = Instant::now();
            st.core.handle_timeout(now);
            st.pump(now);
            let status = crate::staging::drain_status(&mut st, id)
                .unwrap_or_else(|| st.core.drain_status(id));
            match status {
                DrainStatus::Drained => return Ok(()),
                DrainStatus::Pending { slices } if now >= deadline => {
                    return Err(DrainTimeout {
                        request: id,
                        slices,
                    });
                }
                DrainStatus::Pending { .. } => {}
            }
            let step = (deadline - now).min(Duration::from_millis(20));
            st = self
                .shared
                .cond
                .wait_timeout(st, step)
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
    }

    /// Slices posted and not yet drained, over all requests.
    pub fn outstanding_slices(&self) -> u64 {
        self.lock().core.outstanding_slices()
    }

    /// Attaches another path's transport (tcp, local). Its rails are added
    /// with [`add_rail`](Self::add_rail); it reports through
    /// [`event_sink`](Self::event_sink).
    pub(crate) fn attach_transport(&self, transport: Box<dyn Transport>) -> TransportId {
        let mut st = self.lock();
        st.others.push(transport);
        TransportId(st.others.len() - 1)
    }

    /// Adds a rail of an attached transport to an open peer.
    pub(crate) fn add_rail(&self, transport: TransportId, spec: RailSpec) -> RailId {
        let mut st = self.lock();
        let peer = spec.peer;
        let rail = st.add_rail(Owner::Other(transport.0), spec);
        if let Some(p) = st.tables.peers.get_mut(&peer.0) {
            p.rails.push(rail);
        }
        rail
    }

    /// Where attached transports deliver their events.
    pub(crate) fn event_sink(&self) -> Arc<dyn EventSink> {
        Arc::new(Sink(Arc::downgrade(&self.shared)))
    }

    /// Open peers.
    pub fn peers(&self) -> Vec<PeerInfo> {
        let st = self.lock();
        let mut v: Vec<_> = st
            .tables
            .peers
            .keys()
            .map(|id| peer_info(&st, PeerId(*id)))
            .collect();
        v.sort_by_key(|p| p.id);
        v
    }

    /// Fences the engine, cancels what runs, waits up to `timeout` for
    /// drain (flushing rails), then destroys every native object. A destroy
    /// that fails yields [`Unquiesced`] with the evidence; the owners,
    /// memory and charges stay retained.
    pub fn shutdown(&self, timeout: Duration) -> Result<(), Box<Unquiesced>> {
        let deadline = Instant::now() + timeout;
        {
            let mut st = self.lock();
            st.fence("engine shutting down");
            let now = Instant::now();
            // Close every rail: busy ones are flushed by the pump.
            for rail in (0..st.owner.len() as u32).map(RailId) {
                st.core.close_rail(rail, now);
            }
            st.pump(now);
        }
        // Wait for the flushes to drain (pollers still run).
        let mut st = self.lock();
        while st.core.outstanding_slices() > 0 && Instant::now() < deadline {
            st = self
                .shared
                .cond
                .wait_timeout(st, Duration::from_millis(5))
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
        let undrained = st.core.outstanding_slices();
        drop(st);
        self.stop_threads();
        let mut st = self.lock();
        let mut failures = Vec::new();
        for rail in st.rdma.live_rails() {
            if let Err(u) = st.rdma.destroy(rail) {
                failures.push(*u);
            }
        }
        let others: Vec<(RailId, usize)> = st
            .owner
            .iter()
            .enumerate()
            .filter_map(|(i, o)| match o {
                Owner::Other(t) => Some((RailId(i as u32), *t)),
                Owner::Rdma => None,
            })
            .collect();
        for (rail, t) in others {
            if let Some(tr) = st.others.get_mut(t)
                && let Err(e) = tr.close_rail(rail)
            {
                tracing::error!(error = %e, "closing a rail failed");
            }
        }
        let mut retained = Charges::default();
        let regs: Vec<u64> = st.tables.regs.keys().copied().collect();
        for id in regs {
            if let Some(entry) = st.tables.regs.remove(&id) {
                let len = entry.memory.len() as u64;
                st.ledger.release(entry.charge);
                for c in entry.copies {
                    for mr in std::iter::once(c.local).chain(c.remote) {
                        if let Err(u) = mr.close() {
                            failures.push(u);
                            retained.mrs += 1;
                            retained.bytes += len;
                        }
                    }
                }
            }
        }
        st.ledger.charge(retained);
        if let Some(init) = st.init.as_mut() {
            for n in init.nics.drain(..) {
                for r in [n.cq.close(), n.pd.close(), n.context.close()] {
                    if let Err(u) = r {
                        failures.push(u);
                    }
                }
            }
        }
        if failures.is_empty() {
            tracing::info!(undrained, "engine shut down");
            return Ok(());
        }
        let u = self.unquiesced_from("shutdown".into(), failures, retained);
        self.record_unquiesced(&mut st, &u);
        Err(Box::new(u))
    }

    fn stop_threads(&self) {
        let listener = self
            .shared
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(l) = listener {
            l.shutdown();
        }
        self.shared.stop.store(true, Ordering::Release);
        crate::staging::cancel_all(&mut self.lock());
        self.shared.staging.stop_all();
        self.shared.cond.notify_all();
        self.shared.timer.notify_all();
        let threads = std::mem::take(
            &mut *self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for t in threads {
            let _ = t.join();
        }
    }
}

pub(crate) fn peer_info(st: &State, id: PeerId) -> PeerInfo {
    let p = &st.tables.peers[&id.0];
    let mut ranges: Vec<_> = p
        .ranges
        .values()
        .map(|d| crate::RemoteRange {
            peer: id,
            range: RangeId(d.range_id.0),
            address: d.address,
            len: d.length,
            access: d.access,
        })
        .collect();
    ranges.sort_by_key(|r| r.range);
    PeerInfo {
        id,
        source_id: p.source_id.as_str().to_owned(),
        epoch: p.epoch,
        ranges,
        rails: p
            .rails
            .iter()
            .map(|&rail| {
                let spec = st.core.rail_spec(rail);
                let qp = st.rdma.rail(rail);
                RailInfo {
                    rail,
                    nic: spec.and_then(|s| s.nic).map(NicId),
                    remote_nic: spec.and_then(|s| s.remote_nic).map(NicId),
                    qpn: qp.and_then(|r| r.qpn()),
                    device: qp.map(|r| r.device.clone()),
                    up: st.core.rail_is_up(rail),
                    down_reason: st.core.rail_down_reason(rail).map(|r| r.to_string()),
                    recovery: st.recovery.state(rail).map(|(s, _)| s),
                    recoveries: st.recovery.state(rail).map_or(0, |(_, n)| n),
                }
            })
            .collect(),
    }
}

impl Drop for TransferEngine {
    /// Stops the threads. Native objects are released by their handles'
    /// drops, which never pretend: a failed destroy is retained by verbs.
    /// Call [`shutdown`](Self::shutdown) to learn whether cleanup succeeded.
    fn drop(&mut self) {
        if self.owner {
            self.stop_threads();
        }
    }
}
