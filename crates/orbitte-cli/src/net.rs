//! The tcp and local paths as the CLI drives them: a target (the engine's
//! session listener over a publication table) and an initiator (the
//! engine's sans-IO transfer core pumped with its tcp and local
//! transports).
//!
//! Why the CLI pumps the core itself: `TransferEngine` routes requests over
//! rdma only so far; tcp/local peers on the engine itself are requested in
//! `requests.md` ("cli -> engine, cli -> net"). Until then this module does
//! what the engine's net tests do (`tests/net_support`): it owns a
//! `core::Core`, posts its work items to the transports and feeds their
//! events back, so slicing, striping over rails and every outcome (completed
//! prefix, failure, remote effect, drain) come from the engine's own code.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use orbitte::HostMemory;
use orbitte::core::{Core, CoreConfig, CoreRequest};
use orbitte::session::path::{PathInputs, choose_path};
use orbitte::session::{
    Listener, PeerIdentity, PublicationTable, RangeLookup, SessionConfig, SharedPeerTable,
};
use orbitte::transport::local::LocalTransport;
use orbitte::transport::tcp::TcpTransport;
use orbitte::transport::{
    EventSink, MarkerFate, Op, PathKind, PeerId, PostContext, PostError, RailId, RailSpec, RangeId,
    RegistrationId, Transport, TransportEvent, WorkItem,
};
use orbitte::wire::{AccessFlags, Epoch, PeerTable, RangeDescriptor, SourceId};
use orbitte::{DrainStatus, Outcome, RequestId};

/// Read and write access for peers.
pub(crate) const RW: AccessFlags =
    AccessFlags(AccessFlags::REMOTE_READ.0 | AccessFlags::REMOTE_WRITE.0);

/// Session settings for `source` (epoch: the wire's rule from the clock).
pub(crate) fn session_config(source: &str, epoch: Option<u64>) -> Result<SessionConfig, String> {
    let source = SourceId::new(source.to_owned())
        .map_err(|e| format!("invalid source id `{source}`: {e}"))?;
    let epoch = match epoch {
        Some(e) => Epoch::new(e).map_err(|e| format!("invalid epoch: {e}"))?,
        None => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            Epoch::choose(now, None).map_err(|e| format!("cannot choose an epoch: {e}"))?
        }
    };
    Ok(SessionConfig::new(source, epoch))
}

fn peer_table(cfg: &SessionConfig) -> SharedPeerTable {
    Arc::new(Mutex::new(PeerTable::new(cfg.source_id.clone())))
}

/// A target: published ranges served over tcp (and the local path).
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) ranges: Arc<PublicationTable>,
    pub(crate) listener: Listener,
}

impl Target {
    /// Serves a fresh publication table (fill it with `ranges.publish`).
    pub(crate) fn start(cfg: SessionConfig, addr: SocketAddr) -> Result<Self, String> {
        let ranges = PublicationTable::new();
        let listener = listen(cfg, ranges.clone(), addr)?;
        Ok(Self { ranges, listener })
    }
}

/// Serves `lookup` (a publication table, or an engine's registrations).
pub(crate) fn listen(
    cfg: SessionConfig,
    lookup: Arc<dyn RangeLookup>,
    addr: SocketAddr,
) -> Result<Listener, String> {
    Listener::bind(cfg.clone(), peer_table(&cfg), lookup, addr)
        .map_err(|e| format!("cannot listen on {addr}: {e}; pick a free address"))
}

struct Inner {
    core: Core,
    transports: HashMap<PathKind, Box<dyn Transport>>,
    regs: HashMap<RegistrationId, Arc<HostMemory>>,
    remote: HashMap<(PeerId, RangeId), RangeDescriptor>,
    outcomes: HashMap<RequestId, Outcome>,
    work: Vec<WorkItem>,
    next_reg: u64,
}

struct Ctx<'a> {
    regs: &'a HashMap<RegistrationId, Arc<HostMemory>>,
    remote: &'a HashMap<(PeerId, RangeId), RangeDescriptor>,
}

impl PostContext for Ctx<'_> {
    fn memory(&self, r: RegistrationId) -> Option<&Arc<HostMemory>> {
        self.regs.get(&r)
    }
    fn local_key(&self, _: RegistrationId, _: u32) -> Option<(u64, u32)> {
        None
    }
    fn remote_range(&self, peer: PeerId, range: RangeId) -> Option<&RangeDescriptor> {
        self.remote.get(&(peer, range))
    }
}

/// Pumps the engine's core: requests in, work items to the transports,
/// their events back in, outcomes out.
pub(crate) struct Driver {
    inner: Mutex<Inner>,
    cv: Condvar,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").finish_non_exhaustive()
    }
}

impl Driver {
    fn new(config: CoreConfig) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner {
                core: Core::new(config),
                transports: HashMap::new(),
                regs: HashMap::new(),
                remote: HashMap::new(),
                outcomes: HashMap::new(),
                work: Vec::new(),
                next_reg: 1,
            }),
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pump(g: &mut Inner) {
        let now = Instant::now();
        while let Some(at) = g.core.poll_timeout() {
            if at > now {
                break;
            }
            g.core.handle_timeout(now);
        }
        // A rail to flush comes with a marker; report its fate back the
        // way the engine's driver does.
        while let Some((rail, marker)) = g.core.poll_flush(now) {
            let path = g.core.rail_spec(rail).map(|s| s.path);
            let res = match path.and_then(|p| g.transports.get_mut(&p)) {
                Some(t) => t.flush_marked(rail, marker),
                None => Ok(MarkerFate::Dropped),
            };
            match res {
                Ok(MarkerFate::Posted) => {}
                Ok(MarkerFate::Dropped) => g.core.marker_dropped(rail, marker),
                Ok(MarkerFate::Released) => g.core.release_rail(now, rail),
                Err(e) => {
                    tracing::warn!(error = %e, "flushing a rail failed; its slices stay undrained");
                    g.core.marker_dropped(rail, marker);
                }
            }
        }
        loop {
            let mut work = std::mem::take(&mut g.work);
            work.clear();
            g.core.poll_work(&mut work);
            if work.is_empty() {
                g.work = work;
                break;
            }
            let mut start = 0;
            while start < work.len() {
                let rail = work[start].rail;
                let end = start + work[start..].iter().take_while(|w| w.rail == rail).count();
                let items = &work[start..end];
                let path = g.core.rail_spec(rail).map(|s| s.path);
                let Inner {
                    transports,
                    regs,
                    remote,
                    core,
                    ..
                } = &mut *g;
                let ctx = Ctx { regs, remote };
                let res = match path.and_then(|p| transports.get_mut(&p)) {
                    Some(t) => t.post(rail, items, &ctx),
                    None => Err(PostError {
                        rail,
                        posted: 0,
                        reason: "no transport for this rail".into(),
                    }),
                };
                if let Err(e) = res {
                    core.handle_post_error(now, &e, items);
                }
                start = end;
            }
            g.work = work;
        }
        while let Some(o) = g.core.poll_outcome() {
            g.outcomes.insert(o.request, o);
        }
    }

    pub(crate) fn register(&self, mem: Arc<HostMemory>) -> RegistrationId {
        let mut g = self.lock();
        let id = RegistrationId(g.next_reg);
        g.next_reg += 1;
        g.regs.insert(id, mem);
        id
    }

    pub(crate) fn submit(&self, reqs: Vec<CoreRequest>) -> Result<Vec<RequestId>, String> {
        let mut g = self.lock();
        let ids = g
            .core
            .submit(Instant::now(), reqs)
            .map_err(|e| e.to_string())?;
        Self::pump(&mut g);
        Ok(ids)
    }

    /// The outcome of `id`; `None` past `bound` (the request timeout of
    /// the core is shorter, so this only happens if the core is stuck).
    pub(crate) fn wait(&self, id: RequestId, bound: Duration) -> Option<Outcome> {
        let deadline = Instant::now() + bound;
        let mut g = self.lock();
        loop {
            Self::pump(&mut g);
            if let Some(o) = g.outcomes.remove(&id) {
                return Some(o);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            let wake = g
                .core
                .poll_timeout()
                .map_or(bound, |t| t.saturating_duration_since(now));
            let wait = wake
                .min(deadline - now)
                .clamp(Duration::from_micros(200), Duration::from_millis(50));
            g = self
                .cv
                .wait_timeout(g, wait)
                .map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
    }

    pub(crate) fn wait_drain(&self, id: RequestId, bound: Duration) -> DrainStatus {
        let deadline = Instant::now() + bound;
        let mut g = self.lock();
        loop {
            Self::pump(&mut g);
            let s = g.core.drain_status(id);
            if s == DrainStatus::Drained || Instant::now() >= deadline {
                return s;
            }
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(20))
                .map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
    }

    pub(crate) fn outstanding_slices(&self) -> u64 {
        self.lock().core.outstanding_slices()
    }
}

impl EventSink for Driver {
    fn deliver(&self, events: &mut Vec<TransportEvent>) {
        let mut g = self.lock();
        let now = Instant::now();
        for e in events.drain(..) {
            g.core.handle_event(now, e);
        }
        Self::pump(&mut g);
        drop(g);
        self.cv.notify_all();
    }
}

/// An open peer: the rails requests stripe over and the path they take.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    pub(crate) id: PeerId,
    pub(crate) source_id: String,
    pub(crate) epoch: u64,
    pub(crate) path: PathKind,
    /// Paths that applied but could not be used, with the reason.
    pub(crate) fell_back: Vec<(PathKind, String)>,
    pub(crate) rails: Vec<RailId>,
    pub(crate) ranges: Vec<RangeDescriptor>,
    tcp_rails: Vec<RailId>,
    local_rails: Vec<RailId>,
}

/// An initiator with the tcp and local transports.
pub(crate) struct Initiator {
    cfg: SessionConfig,
    peers: SharedPeerTable,
    pub(crate) driver: Arc<Driver>,
    tcp: Arc<TcpTransport>,
    local: Arc<LocalTransport>,
}

impl std::fmt::Debug for Initiator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Initiator")
            .field("source", &self.cfg.source_id)
            .finish_non_exhaustive()
    }
}

impl Initiator {
    pub(crate) fn new(cfg: SessionConfig, core: CoreConfig) -> Self {
        let peers = peer_table(&cfg);
        let driver = Driver::new(core);
        let sink: Arc<dyn EventSink> = driver.clone();
        let tcp = TcpTransport::new(cfg.clone(), peers.clone(), sink.clone());
        let local = LocalTransport::new(sink);
        {
            let mut g = driver.lock();
            g.transports.insert(PathKind::Tcp, Box::new(tcp.clone()));
            g.transports
                .insert(PathKind::Local, Box::new(local.clone()));
        }
        Self {
            cfg,
            peers,
            driver,
            tcp,
            local,
        }
    }

    fn add_rails(&self, path: PathKind, peer: PeerId, n: usize) -> Vec<RailId> {
        let mut g = self.driver.lock();
        (0..n)
            .map(|_| {
                g.core.add_rail(RailSpec {
                    path,
                    peer,
                    nic: None,
                    remote_nic: None,
                    max_in_flight: self.cfg.max_in_flight_per_connection * 2,
                    signal_interval: 1,
                })
            })
            .collect()
    }

    /// Opens the peer at `addr`: a tcp session (handshake, the peer's
    /// publications), then the path the policy picks, or `want` if given
    /// (and usable: no silent fallback from an explicit path).
    pub(crate) fn connect(
        &self,
        addr: SocketAddr,
        rails: usize,
        want: Option<PathKind>,
    ) -> Result<Peer, String> {
        let peer = PeerId(1);
        let tcp_rails = self.add_rails(PathKind::Tcp, peer, rails);
        let link = self.tcp.open_rails(peer, addr, &tcp_rails).map_err(|e| {
            format!("cannot reach the target at {addr}: {e}; check that `orbitte bench --role target` or `orbitte serve` runs there and the address is right")
        })?;
        let identity: PeerIdentity = link.handshake.peer.clone();
        let same_host = link.ranges.iter().any(|r| {
            r.local
                .as_ref()
                .is_some_and(|h| h.host_id == self.cfg.host_id)
        });
        let try_local = same_host && matches!(want, None | Some(PathKind::Local));
        let mut local_rails = Vec::new();
        let local: Result<(), String> = if try_local {
            local_rails = self.add_rails(PathKind::Local, peer, rails);
            match self
                .local
                .attach(&self.cfg, &self.peers, peer, &identity, &local_rails)
            {
                Ok(a) if !a.ranges.is_empty() => Ok(()),
                Ok(_) => Err("the target's ranges are not mappable (no memfd)".into()),
                Err(e) => Err(e.to_string()),
            }
        } else if !same_host {
            Err("the target is on another host".into())
        } else {
            Err("not asked for (--path)".into())
        };
        let inputs = PathInputs {
            same_host: same_host && want != Some(PathKind::Tcp),
            local,
            rdma_applies: false,
            rdma: Err("the command-line driver runs tcp and local only; rdma runs in-process (--path rdma)".into()),
            tcp: Ok(()),
        };
        let choice =
            choose_path(identity.source_id.as_str(), 0, &inputs).map_err(|e| e.to_string())?;
        if let Some(w) = want
            && w != choice.path
        {
            let why = match w {
                PathKind::Local => inputs.local.clone().err(),
                PathKind::Rdma => inputs.rdma.clone().err(),
                PathKind::Tcp => inputs.tcp.clone().err(),
                _ => None,
            }
            .unwrap_or_else(|| "it does not apply to this peer".into());
            return Err(format!(
                "path {w} is not usable to {addr}: {why}; run `orbitte doctor --path {w}` or pick another --path"
            ));
        }
        {
            let mut g = self.driver.lock();
            for r in &link.ranges {
                g.remote.insert((peer, RangeId(r.range_id.0)), r.clone());
            }
        }
        let rails = if choice.path == PathKind::Local {
            local_rails.clone()
        } else {
            tcp_rails.clone()
        };
        Ok(Peer {
            id: peer,
            source_id: identity.source_id.as_str().to_owned(),
            epoch: identity.epoch.value(),
            path: choice.path,
            fell_back: choice.fell_back,
            rails,
            ranges: link.ranges,
            tcp_rails,
            local_rails,
        })
    }

    /// Closes every rail to `peer` (its sessions end without a warning on
    /// either side).
    pub(crate) fn close(&self, peer: &Peer) {
        for &r in &peer.tcp_rails {
            self.tcp.close(r);
        }
        for &r in &peer.local_rails {
            self.local.close(r);
        }
        self.local.detach(peer.id);
    }
}

/// One request of a batch.
pub(crate) fn request(
    label: u64,
    op: Op,
    registration: RegistrationId,
    local_offset: u64,
    peer: &Peer,
    range: RangeId,
    remote_offset: u64,
    len: u64,
) -> CoreRequest {
    CoreRequest {
        label,
        op,
        registration,
        local_offset,
        peer: peer.id,
        range,
        remote_offset,
        len,
        rails: peer.rails.clone(),
        keepalive: None,
    }
}

/// Accepts rdma peers: every connection on `listener` (non-blocking) is a
/// control link an initiator opens a peer over (`TransferEngine::open_peer`
/// on its side). The links stay open while this runs; returns when `stop`
/// is set.
pub(crate) fn accept_rdma_peers(
    listener: &std::net::TcpListener,
    engine: &orbitte::TransferEngine,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::sync::atomic::Ordering;
    let mut links = Vec::new();
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, from)) => {
                let accepted = stream.set_nonblocking(false).and_then(|()| {
                    orbitte::session::TcpControlLink::new(stream, Duration::from_secs(5))
                });
                let mut link = match accepted {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(%from, error = %e, "control link setup failed");
                        continue;
                    }
                };
                match engine.accept_peer(&mut link) {
                    Ok(p) => {
                        tracing::info!(%from, peer = %p.source_id, rails = p.rails.len(), "rdma peer accepted");
                        links.push(link);
                    }
                    Err(e) => tracing::warn!(%from, error = %e, "rdma peer refused"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a control link failed");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
