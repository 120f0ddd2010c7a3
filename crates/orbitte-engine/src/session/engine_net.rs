//! The tcp and local paths, and the engine's own listener and connect.
//!
//! Target side: with [`EngineBuilder::listen`](crate::EngineBuilder::listen)
//! the engine binds one [`Listener`] at build that serves every session it
//! accepts: data sessions (its published ranges over tcp, and through
//! shared memory to same-host peers) and rdma control links (the `hello`
//! says [`SessionPurpose::RDMA_CONTROL`]; the listener then runs the queue
//! pair exchange on that connection and keeps it open while the rails
//! live).
//!
//! Initiator side: the engine attaches its tcp and local transports at
//! build; [`TransferEngine::connect`] opens a peer over a data session
//! (handshake into the engine's peer table, p2p descriptors), records it
//! in the engine, chooses the path by the documented policy (docs/paths.md:
//! local, then rdma over a control link to the same address when both
//! sides have rails, then tcp) and adds that path's rails, so
//! [`TransferEngine::submit`] runs requests on them with the engine's
//! outcome contract.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use orbitte_wire::SessionPurpose;

use super::handshake::{self, Handshake};
use super::log_budget::LogBudget;
use super::path::{NoPath, PathInputs, choose_path};
use super::serving::ControlAcceptor;
use super::{Listener, SessionConfig, SessionError, TcpControlLink};
use crate::control::ControlLink;
use crate::engine::Shared;
use crate::engine::TransportId;
use crate::error::BuildError;
use crate::transport::local::{LocalError, LocalTransport};
use crate::transport::tcp::serve::CloseReason;
use crate::transport::tcp::{Dialed, TcpTransport};
use crate::transport::{PathKind, PeerId, RailId, RailSpec};
use crate::{OpenPeerError, PeerInfo, RemoteRange, TransferEngine};

impl TransferEngine {
    /// Opens the engine listening at `addr` as a peer, with the default
    /// [`ConnectOptions`] (path policy local > rdma > tcp, 2 rails). The
    /// returned [`Peer`] says which path and rails it got and, for every
    /// path that applied but could not be used, why (`fell_back`).
    pub fn connect(&self, addr: SocketAddr) -> Result<Peer, ConnectError> {
        self.connect_with(addr, ConnectOptions::default())
    }

    /// [`connect`](Self::connect) with explicit options (a path
    /// preference, the number of rails). Connecting again to the same
    /// engine replaces the peer's rails with the new path's.
    pub fn connect_with(
        &self,
        addr: SocketAddr,
        options: ConnectOptions,
    ) -> Result<Peer, ConnectError> {
        self.net()
            .open_peer(self, addr, options.rails, options.prefer)
    }

    /// Opens the engine that cluster metadata (etcd, see
    /// [`EngineBuilder::metadata`](crate::EngineBuilder::metadata)) lists
    /// as `source_id`, with the default [`ConnectOptions`]: looks its
    /// record up, then connects at the recorded address. The session's
    /// epoch rule still decides: a record whose listener now belongs to an
    /// older incarnation is refused.
    #[cfg(feature = "etcd")]
    pub fn connect_by_name(&self, source_id: &str) -> Result<Peer, ConnectError> {
        self.connect_by_name_with(source_id, ConnectOptions::default())
    }

    /// [`connect_by_name`](Self::connect_by_name) with explicit options.
    #[cfg(feature = "etcd")]
    pub fn connect_by_name_with(
        &self,
        source_id: &str,
        options: ConnectOptions,
    ) -> Result<Peer, ConnectError> {
        let record = {
            let etcd = self.shared.etcd.lock().unwrap_or_else(|e| e.into_inner());
            let etcd = etcd.as_ref().ok_or(ConnectError::NoMetadata)?;
            etcd.lookup(source_id)?
        };
        let record = record.ok_or_else(|| ConnectError::NotInMetadata {
            source_id: source_id.to_owned(),
        })?;
        let addr: SocketAddr =
            record
                .listen_addr
                .parse()
                .map_err(|source| ConnectError::RecordAddress {
                    source_id: source_id.to_owned(),
                    addr: record.listen_addr.clone(),
                    source,
                })?;
        let peer = self.connect_with(addr, options)?;
        if peer.info.epoch.value() < record.epoch {
            return Err(ConnectError::OlderThanRecord {
                source_id: source_id.to_owned(),
                addr,
                answered: peer.info.epoch.value(),
                recorded: record.epoch,
            });
        }
        Ok(peer)
    }

    /// The engine's tcp and local transports (attached at build).
    pub(crate) fn net(&self) -> &NetPaths {
        self.shared
            .net
            .get_or_init(|| NetPaths::attach(self, self.shared.sessions.clone()))
    }

    /// Attaches the engine's own tcp and local transports.
    pub(crate) fn attach_own_net(&self) {
        let _ = self.net();
    }

    /// Starts the engine's listener on `addr` (port 0: any free port)
    /// after build, as [`EngineBuilder::listen`](crate::EngineBuilder::listen)
    /// does at build: one listener for data sessions, same-host mapping and
    /// rdma control links. Returns the bound address. An engine has one
    /// listener; it stops at [`shutdown`](Self::shutdown) or drop.
    pub fn listen(&self, addr: SocketAddr) -> Result<SocketAddr, ListenError> {
        let mut slot = self
            .shared
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(l) = slot.as_ref() {
            return Err(ListenError::AlreadyListening { at: l.local_addr() });
        }
        let control: Arc<dyn ControlAcceptor> = Arc::new(EngineControl {
            engine: Arc::downgrade(&self.shared),
            accepted_log: LogBudget::new(self.shared.sessions.refusal_logs_per_second),
        });
        let listener = Listener::bind_serving(
            self.shared.sessions.clone(),
            self.shared.peer_table.clone(),
            self.range_lookup(),
            addr,
            Some(control),
        )
        .map_err(|source| ListenError::Bind { addr, source })?;
        let at = listener.local_addr();
        *slot = Some(listener);
        Ok(at)
    }

    /// Joins the cluster metadata `mode` asks for: with etcd, connects and
    /// (when listening) stores this engine's record under a kept-alive
    /// lease.
    pub(crate) fn join_metadata(
        &self,
        mode: &crate::metadata::MetadataMode,
    ) -> Result<(), BuildError> {
        match mode {
            crate::metadata::MetadataMode::P2p => Ok(()),
            #[cfg(feature = "etcd")]
            crate::metadata::MetadataMode::Etcd {
                endpoints,
                prefix,
                lease_ttl,
            } => {
                let mut etcd =
                    crate::metadata::etcd::EtcdMetadata::connect(endpoints, prefix, *lease_ttl)
                        .map_err(BuildError::Metadata)?;
                if let Some(addr) = self.listen_addr() {
                    let record = crate::metadata::PeerRecord::from_publication(
                        self.source_id(),
                        addr,
                        self.shared.sessions.host_id.as_str(),
                        &self.segment_publication(),
                    );
                    etcd.publish(&record).map_err(BuildError::Metadata)?;
                }
                *self.shared.etcd.lock().unwrap_or_else(|e| e.into_inner()) = Some(etcd);
                Ok(())
            }
            #[cfg(not(feature = "etcd"))]
            crate::metadata::MetadataMode::Etcd { .. } => Err(BuildError::Metadata(
                crate::metadata::MetadataError::NotBuilt,
            )),
        }
    }

    /// This host's identity as sessions present it (same-host peers
    /// compare it to choose the local path).
    pub fn host_id(&self) -> &str {
        self.shared.sessions.host_id.as_str()
    }

    /// Counters of the engine's listener (`None` when it does not listen).
    pub fn listener_stats(&self) -> Option<super::ListenerStats> {
        self.shared
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(Listener::stats)
    }

    /// Whether the engine's listener serves same-host peers over the local
    /// path (its unix socket is up).
    pub fn serves_local(&self) -> bool {
        self.shared
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(Listener::serves_local)
    }

    /// Session settings with this engine's identity and settings (the
    /// builder's cluster secret, timeouts and session adjustments).
    #[cfg(any(test, feature = "testing"))]
    pub fn session_config(&self) -> SessionConfig {
        self.shared.sessions.clone()
    }

    /// Starts a second listener on `addr` with session settings `cfg`
    /// (tests: a listener with other bounds than the engine's own). It
    /// serves data sessions and same-host mapping, no rdma control link.
    #[cfg(any(test, feature = "testing"))]
    pub fn serve_tcp(
        &self,
        cfg: SessionConfig,
        addr: SocketAddr,
    ) -> Result<Listener, SessionError> {
        Listener::bind(
            cfg,
            self.shared.peer_table.clone(),
            self.range_lookup(),
            addr,
        )
    }
}

/// Serves rdma control links for the engine's listener.
struct EngineControl {
    engine: Weak<Shared>,
    /// Lines about rdma peers accepted (refusals and closes are the
    /// listener's lines, within its budgets).
    accepted_log: LogBudget,
}

impl std::fmt::Debug for EngineControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineControl")
    }
}

impl ControlAcceptor for EngineControl {
    fn serve(&self, stream: TcpStream, hs: &Handshake, stop: &AtomicBool) -> CloseReason {
        let Some(shared) = self.engine.upgrade() else {
            return CloseReason {
                abnormal: false,
                text: "the engine stopped".into(),
            };
        };
        let frame_timeout = shared.sessions.frame_timeout;
        let engine = TransferEngine::view(shared);
        let mut link = match TcpControlLink::new(stream, frame_timeout) {
            Ok(l) => l,
            Err(e) => {
                return CloseReason {
                    abnormal: true,
                    text: format!("cannot set up the rdma control link: {e}"),
                };
            }
        };
        let established = hs.established();
        let peer = match engine.accept_rdma_rails(&mut link, hs.session, &established) {
            Ok(p) => p,
            Err(e) => {
                return CloseReason {
                    abnormal: true,
                    text: format!("rdma peer refused: {e}"),
                };
            }
        };
        if let Some(left_out) = self.accepted_log.admit(Instant::now()) {
            tracing::info!(peer = %hs.peer.source_id, rails = peer.rails.len(), left_out, "rdma peer accepted");
        }
        drop(engine);
        let session = hs.session;
        // The link stays open while the rails live; the peer closes it (or
        // says goodbye) when it is done.
        loop {
            match link.recv(Duration::from_millis(200)) {
                Err(crate::error::LinkError::TimedOut(_)) => {
                    if stop.load(std::sync::atomic::Ordering::Acquire) {
                        return CloseReason {
                            abnormal: false,
                            text: "listener stopped".into(),
                        };
                    }
                }
                Ok(orbitte_wire::Frame::Goodbye(g)) => {
                    return CloseReason {
                        abnormal: false,
                        text: format!("rdma control link: goodbye ({})", g.reason),
                    };
                }
                Ok(orbitte_wire::Frame::ConnectRequest(r)) => {
                    // The peer re-establishes one of the rails.
                    let Some(shared) = self.engine.upgrade() else {
                        return CloseReason {
                            abnormal: false,
                            text: "the engine stopped".into(),
                        };
                    };
                    let answer =
                        TransferEngine::view(shared).answer_rail_request(peer.id, session, &r);
                    if let Err(e) = link.send(&answer) {
                        return CloseReason {
                            abnormal: true,
                            text: format!("rdma control link failed: {e}"),
                        };
                    }
                }
                Ok(other) => {
                    tracing::debug!(frame = %other.frame_type(), "rdma control link: frame ignored");
                }
                Err(crate::error::LinkError::Closed) => {
                    return CloseReason {
                        abnormal: false,
                        text: "rdma control link closed by the peer".into(),
                    };
                }
                Err(e) => {
                    return CloseReason {
                        abnormal: true,
                        text: format!("rdma control link failed: {e}"),
                    };
                }
            }
        }
    }
}

/// Which path a peer takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathPreference {
    /// The policy (docs/paths.md): local when it applies and works, else
    /// rdma when both sides have usable rails and the peer serves rdma
    /// control links, else tcp. Every path given up on the way is a
    /// reported fallback.
    #[default]
    Auto,
    /// Exactly this path (`Tcp`, `Local` or `Rdma`), or an error naming why
    /// not.
    Only(PathKind),
}

/// How [`TransferEngine::connect_with`] opens a peer.
///
/// ```
/// use orbitte_engine::{ConnectOptions, PathKind};
/// let opts = ConnectOptions::new().path(PathKind::Tcp).rails(4);
/// assert_eq!(opts.rails, 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// The path policy (default: [`PathPreference::Auto`]).
    pub prefer: PathPreference,
    /// tcp connections or local worker threads to open (default 2; at
    /// least 1). rdma opens one rail per usable NIC whatever this says.
    pub rails: usize,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            prefer: PathPreference::Auto,
            rails: 2,
        }
    }
}

impl ConnectOptions {
    /// The defaults: automatic path, 2 rails.
    pub fn new() -> Self {
        Self::default()
    }

    /// Exactly this path, never another one.
    pub fn path(mut self, path: PathKind) -> Self {
        self.prefer = PathPreference::Only(path);
        self
    }

    /// This many tcp connections or local worker threads.
    pub fn rails(mut self, rails: usize) -> Self {
        self.rails = rails;
        self
    }
}

/// An open peer: the handle [`TransferEngine::connect`] returns.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The engine's view of the peer (id for requests, ranges, rails).
    pub info: PeerInfo,
    /// The path its requests take.
    pub path: PathKind,
    /// Paths that applied but could not be used, with the reason (also
    /// logged as warnings).
    pub fell_back: Vec<(PathKind, String)>,
    /// Rails added for it.
    pub rails: Vec<RailId>,
    /// Rails of an older epoch of the same source that were closed.
    pub closed_rails: Vec<RailId>,
}

impl Peer {
    /// The peer's id (what requests name).
    pub fn id(&self) -> PeerId {
        self.info.id
    }

    /// Its source id.
    pub fn source_id(&self) -> &str {
        &self.info.source_id
    }

    /// Its authoritative epoch.
    pub fn epoch(&self) -> orbitte_wire::Epoch {
        self.info.epoch
    }

    /// The ranges it published when it was opened, in range id order.
    pub fn ranges(&self) -> &[RemoteRange] {
        &self.info.ranges
    }
}

/// Why [`TransferEngine::listen`] (or `EngineBuilder::listen` at build)
/// failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListenError {
    /// The engine already listens (one listener serves every session).
    #[error("the engine already listens on {at}")]
    AlreadyListening {
        /// Where.
        at: SocketAddr,
    },
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: SessionError,
    },
}

/// Why [`TransferEngine::connect`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The tcp session failed (refused, stale epoch, authentication, ...).
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The engine refused the peer (fenced, stale publication).
    #[error(transparent)]
    Engine(#[from] OpenPeerError),
    /// The local path was required and failed.
    #[error(transparent)]
    Local(#[from] LocalError),
    /// No path can be used.
    #[error(transparent)]
    NoPath(#[from] NoPath),
    /// Ask for `Auto`, `Only(Tcp)`, `Only(Local)` or `Only(Rdma)`.
    #[error("{0} peers are not opened here: use PathPreference::Auto or Only(tcp|local|rdma)")]
    Unsupported(PathKind),
    /// The metadata service failed (not the peer's fault).
    #[cfg(feature = "etcd")]
    #[error(transparent)]
    Metadata(#[from] crate::metadata::MetadataError),
    /// `connect_by_name` on an engine built without cluster metadata.
    #[error("connecting by name needs cluster metadata: build the engine with EngineBuilder::etcd")]
    NoMetadata,
    /// The metadata service has no record of the source.
    #[error("no record of {source_id} in the cluster metadata (expired or never published)")]
    NotInMetadata {
        /// The source id looked up.
        source_id: String,
    },
    /// The record's address does not parse.
    #[error("the metadata record of {source_id} has a bad address {addr:?}")]
    RecordAddress {
        /// The source id.
        source_id: String,
        /// The address as recorded.
        addr: String,
        /// Why it does not parse.
        #[source]
        source: std::net::AddrParseError,
    },
    /// The engine at the recorded address is older than the record.
    #[error(
        "{source_id} at {addr} answered with epoch {answered}, older than its record's {recorded}"
    )]
    OlderThanRecord {
        /// The source id.
        source_id: String,
        /// Where it was reached.
        addr: SocketAddr,
        /// The epoch it answered with.
        answered: u64,
        /// The epoch recorded.
        recorded: u64,
    },
}

/// The tcp and local transports of one engine.
#[derive(Debug)]
pub(crate) struct NetPaths {
    cfg: SessionConfig,
    tcp: Arc<TcpTransport>,
    tcp_id: TransportId,
    local: Arc<LocalTransport>,
    local_id: TransportId,
    /// The rdma control link of each peer on the rdma path (kept open
    /// while the peer is).
    pub(crate) links: std::sync::Mutex<std::collections::HashMap<PeerId, TcpControlLink>>,
}

impl NetPaths {
    /// Attaches a tcp and a local transport to `engine`.
    pub(crate) fn attach(engine: &TransferEngine, cfg: SessionConfig) -> Self {
        let tcp = TcpTransport::new(
            cfg.clone(),
            engine.shared.peer_table.clone(),
            engine.event_sink(),
        );
        let tcp_id = engine.attach_transport(Box::new(tcp.clone()));
        let local = LocalTransport::new(engine.event_sink());
        let local_id = engine.attach_transport(Box::new(local.clone()));
        Self {
            cfg,
            tcp,
            tcp_id,
            local,
            local_id,
            links: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Opens the engine listening at `addr` as a peer of `engine` with
    /// `rails` rails (tcp connections or local worker threads; rdma opens
    /// one rail per usable NIC) on the path chosen by `prefer`. The rdma
    /// control link is a session to the same address opened for
    /// [`SessionPurpose::RDMA_CONTROL`]. See the module docs and
    /// docs/paths.md.
    pub(crate) fn open_peer(
        &self,
        engine: &TransferEngine,
        addr: SocketAddr,
        rails: usize,
        prefer: PathPreference,
    ) -> Result<Peer, ConnectError> {
        let only = match prefer {
            PathPreference::Auto => None,
            PathPreference::Only(p) => Some(p),
        };
        if let Some(p) = only
            && !matches!(p, PathKind::Tcp | PathKind::Local | PathKind::Rdma)
        {
            return Err(ConnectError::Unsupported(p));
        }
        // A path other than the one asked for is not a candidate (and not
        // a fallback).
        let excluded = |p: PathKind| only.filter(|o| *o != p);
        let rails = rails.max(1);
        let first = self.tcp.dial(addr)?;
        let hs = first.handshake().clone();
        let established = hs.established();
        let info = engine.adopt_session(hs.session, &established, first.publication())?;
        let peer = info.id;
        let ranges = &first.publication().ranges;
        let same_host = ranges.iter().any(|r| {
            r.local
                .as_ref()
                .is_some_and(|h| h.host_id == self.cfg.host_id)
        });
        let local = if !same_host {
            Err("peer is on another host".to_owned())
        } else if let Some(o) = excluded(PathKind::Local) {
            Err(format!("{o} was asked for explicitly"))
        } else {
            match self
                .local
                .map_peer(&self.cfg, &engine.shared.peer_table, peer, &hs.peer)
            {
                Ok(att) => match ranges.iter().find(|r| !att.ranges.contains(&r.range_id)) {
                    None => Ok(()),
                    Some(r) => Err(format!(
                        "range {} is not mappable (no memfd, or published without remote read)",
                        r.range_id.0
                    )),
                },
                Err(e) => Err(e.to_string()),
            }
        };
        // rdma is tried only when local did not win: opening it sets up
        // queue pairs on both sides.
        let mut link = None;
        let (rdma_applies, rdma) = if let Some(o) = excluded(PathKind::Rdma) {
            (false, Err(format!("{o} was asked for explicitly")))
        } else if same_host && local.is_ok() {
            (false, Err("not tried: the local path applies".to_owned()))
        } else if !ranges.iter().any(|r| !r.rkeys.is_empty()) {
            (
                false,
                Err(
                    "the peer publishes no range with rkeys (no Host Direct registration)"
                        .to_owned(),
                ),
            )
        } else {
            match engine.rdma_usable() {
                Err((applies, why)) => (applies, Err(format!("no usable rail here: {why}"))),
                Ok(()) => match self.open_rdma(engine, addr) {
                    Ok((opened, l)) if opened.id == peer => {
                        link = Some(l);
                        (true, Ok(()))
                    }
                    Ok((opened, _)) => (
                        true,
                        Err(format!(
                            "the rdma control link at {addr} answered as {} (epoch {}), not {} (epoch {}): the engine there changed",
                            opened.source_id, opened.epoch, hs.peer.source_id, hs.peer.epoch
                        )),
                    ),
                    Err(why) => (true, Err(why)),
                },
            }
        };
        let inputs = PathInputs {
            // An explicitly asked path is not a fallback from local.
            same_host: same_host && excluded(PathKind::Local).is_none(),
            local,
            rdma_applies,
            rdma,
            tcp: match excluded(PathKind::Tcp) {
                Some(o) => Err(format!("{o} was asked for explicitly")),
                None => Ok(()),
            },
        };
        let choice = choose_path(hs.peer.source_id.as_str(), None, &inputs)?;
        let spec = |path| RailSpec {
            path,
            peer,
            nic: None,
            remote_nic: None,
            max_in_flight: match path {
                PathKind::Local => 256,
                _ => self
                    .cfg
                    .max_in_flight_per_connection
                    .saturating_mul(2)
                    .max(2),
            },
            signal_interval: 1,
        };
        // One path per peer: rails of the other paths (an earlier open with
        // another preference) are closed, so the engine stripes requests
        // over the chosen path only.
        let mut switched = Vec::new();
        if choice.path != PathKind::Tcp {
            switched.extend(self.tcp.close_peer(peer));
        }
        if choice.path != PathKind::Local {
            switched.extend(self.local.close_peer(peer));
        }
        if choice.path != PathKind::Rdma {
            switched.extend(engine.close_rdma_rails(peer));
            self.links
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&peer);
        }
        if !switched.is_empty() {
            tracing::info!(peer = peer.0, path = %choice.path, closed = switched.len(), "peer switched path");
        }
        let (rail_ids, closed_rails) = match choice.path {
            PathKind::Local => {
                let ids: Vec<RailId> = (0..rails)
                    .map(|_| engine.add_rail(self.local_id, spec(PathKind::Local)))
                    .collect();
                self.local.start_rails(peer, &ids)?;
                drop(first);
                (ids, Vec::new())
            }
            PathKind::Rdma => {
                self.local.detach(peer);
                drop(first);
                if let Some(l) = link.take() {
                    self.links
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(peer, l);
                    engine.recover_rails_of(peer);
                }
                let ids = engine
                    .peers()
                    .into_iter()
                    .find(|p| p.id == peer)
                    .map(|p| {
                        p.rails
                            .iter()
                            .filter(|r| r.nic.is_some() && r.up)
                            .map(|r| r.rail)
                            .collect()
                    })
                    .unwrap_or_default();
                (ids, Vec::new())
            }
            _ => {
                self.local.detach(peer);
                let mut dialed: Vec<(RailId, Dialed)> = Vec::with_capacity(rails);
                dialed.push((engine.add_rail(self.tcp_id, spec(PathKind::Tcp)), first));
                for _ in 1..rails {
                    let d = self.tcp.dial(addr)?;
                    dialed.push((engine.add_rail(self.tcp_id, spec(PathKind::Tcp)), d));
                }
                let ids = dialed.iter().map(|(r, _)| *r).collect();
                let link = self.tcp.start_rails(peer, dialed)?;
                (ids, link.closed_rails)
            }
        };
        let info = engine
            .peers()
            .into_iter()
            .find(|p| p.id == peer)
            .unwrap_or(info);
        tracing::info!(
            peer = peer.0, source = %hs.peer.source_id, path = %choice.path, rails = rail_ids.len(),
            fell_back = choice.fell_back.len(), "net peer opened"
        );
        Ok(Peer {
            info,
            path: choice.path,
            fell_back: choice.fell_back,
            rails: rail_ids,
            closed_rails,
        })
    }

    /// Opens the rdma rails over a session to `at` opened for
    /// [`SessionPurpose::RDMA_CONTROL`]; `Err` says why not.
    fn open_rdma(
        &self,
        engine: &TransferEngine,
        at: SocketAddr,
    ) -> Result<(PeerInfo, TcpControlLink), String> {
        let mut stream = TcpStream::connect_timeout(&at, self.cfg.handshake_timeout)
            .map_err(|e| format!("the peer's rdma control link at {at} is unreachable: {e}"))?;
        let hs = handshake::connect_for(
            &mut stream,
            &self.cfg,
            &engine.shared.peer_table,
            Some(at),
            SessionPurpose::RDMA_CONTROL,
        )
        .map_err(|e| format!("the peer at {at} refused an rdma control link: {e}"))?;
        let established = hs.established();
        let mut link = TcpControlLink::new(stream, self.cfg.frame_timeout)
            .map_err(|e| format!("the peer's rdma control link at {at} failed: {e}"))?;
        let info = engine
            .open_rdma_rails(&mut link, hs.session, &established)
            .map_err(|e| format!("the peer's rdma control link at {at} refused: {e}"))?;
        Ok((info, link))
    }
}
