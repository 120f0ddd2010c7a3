//! The tcp and local paths on a [`TransferEngine`].
//!
//! Target side: [`TransferEngine::serve_tcp`] serves the engine's published
//! ranges over tcp sessions (and through shared memory to same-host peers);
//! rdma peers open it over control links ([`TransferEngine::accept_peer`] on
//! a [`TcpControlLink`]).
//!
//! Initiator side: [`TransferEngine::attach_net`] attaches a tcp and a local
//! transport to the engine; [`NetPaths::open_peer`] opens a peer over a tcp
//! session (handshake into the engine's peer table, p2p descriptors),
//! records it in the engine ([`TransferEngine::adopt_peer`]), chooses the
//! path by the documented policy (docs/paths.md: local, then rdma over the
//! peer's control link when both sides have rails, then tcp) and adds that
//! path's rails, so [`TransferEngine::submit`] runs requests on them with
//! the engine's outcome contract.

use std::net::SocketAddr;

use orbitte_wire::handshake::Established;
use orbitte_wire::{Epoch, Identity, SourceId, TextError};

use super::path::{NoPath, PathInputs, choose_path};
use super::{Listener, SessionConfig, SessionError, TcpControlLink};
use crate::transport::local::{LocalError, LocalTransport};
use crate::transport::tcp::{Dialed, TcpTransport};
use crate::transport::{PathKind, PeerId, RailId, RailSpec};
use crate::{OpenPeerError, PeerInfo, TransferEngine, TransportId};

impl TransferEngine {
    /// Session settings with this engine's identity (source id, epoch) and
    /// the defaults of [`SessionConfig::new`]; adjust (cluster secret,
    /// timeouts, bounds) and pass to [`serve_tcp`](Self::serve_tcp) and
    /// [`attach_net`](Self::attach_net).
    pub fn session_config(&self) -> Result<SessionConfig, TextError> {
        let source = SourceId::new(self.source_id())?;
        // The engine's epoch is never 0 (EngineBuilder chooses it).
        let epoch = Epoch::new(self.epoch()).unwrap_or(Epoch::MIN);
        let mut cfg = SessionConfig::new(source, epoch);
        // Sessions go into the engine's one peer table: number them with
        // the engine's counter (as `new_session_id` does).
        let shared = std::sync::Arc::downgrade(&self.shared);
        let fallback = super::SessionIds::process();
        cfg.session_ids = super::SessionIds::new(move || match shared.upgrade() {
            Some(s) => orbitte_wire::SessionId(
                s.next_session
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            ),
            None => fallback.next(),
        });
        Ok(cfg)
    }

    /// Starts a session listener on `addr` (port 0: any) that serves this
    /// engine's published, remotely accessible ranges over the tcp path,
    /// and over the local path to same-host peers. Hellos are admitted into
    /// the engine's peer table (one epoch rule for every path). Requests
    /// are checked against the registrations as they are at that moment: a
    /// retired or unregistered range is refused. Stops when dropped.
    pub fn serve_tcp(
        &self,
        cfg: SessionConfig,
        addr: SocketAddr,
    ) -> Result<Listener, SessionError> {
        Listener::bind(cfg, self.peer_table(), self.range_lookup(), addr)
    }

    /// Attaches the tcp and local transports to this engine (once; keep the
    /// returned [`NetPaths`] to open peers).
    pub fn attach_net(&self, cfg: SessionConfig) -> NetPaths {
        let tcp = TcpTransport::new(cfg.clone(), self.peer_table(), self.event_sink());
        let tcp_id = self.attach_transport(Box::new(tcp.clone()));
        let local = LocalTransport::new(self.event_sink());
        let local_id = self.attach_transport(Box::new(local.clone()));
        NetPaths {
            cfg,
            tcp,
            tcp_id,
            local,
            local_id,
            links: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }
}

/// Which path a peer opened by [`NetPaths::open_peer`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathPreference {
    /// The policy (docs/paths.md): local when it applies and works, else
    /// rdma when both sides have usable rails and the peer's rdma control
    /// link opens them, else tcp. Every path given up on the way is a
    /// reported fallback.
    Auto,
    /// Exactly this path (`Tcp`, `Local` or `Rdma`), or an error naming why
    /// not.
    Only(PathKind),
}

/// Where a peer listens: its session address (tcp and local paths,
/// [`TransferEngine::serve_tcp`]) and, when it serves rdma peers, its rdma
/// control link (a TCP listener that runs [`TransferEngine::accept_peer`]
/// on every connection; `orbitte serve`: `engine.control_listen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddrs {
    /// The session address.
    pub session: SocketAddr,
    /// The rdma control link, if the peer serves one.
    pub rdma_control: Option<SocketAddr>,
}

impl PeerAddrs {
    /// A session address; no rdma control link.
    pub fn session(session: SocketAddr) -> Self {
        Self {
            session,
            rdma_control: None,
        }
    }

    /// The same, with the peer's rdma control link at `at`.
    pub fn with_rdma_control(mut self, at: SocketAddr) -> Self {
        self.rdma_control = Some(at);
        self
    }
}

impl From<SocketAddr> for PeerAddrs {
    fn from(session: SocketAddr) -> Self {
        Self::session(session)
    }
}

/// A peer opened over the net paths.
#[derive(Debug, Clone)]
pub struct NetPeer {
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

/// Why opening a peer over the net paths failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetOpenError {
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
}

/// The tcp and local transports of one engine.
#[derive(Debug)]
pub struct NetPaths {
    cfg: SessionConfig,
    tcp: std::sync::Arc<TcpTransport>,
    tcp_id: TransportId,
    local: std::sync::Arc<LocalTransport>,
    local_id: TransportId,
    /// The rdma control link of each peer on the rdma path (kept open
    /// while the peer is).
    links: std::sync::Mutex<std::collections::HashMap<PeerId, TcpControlLink>>,
}

impl NetPaths {
    /// The tcp transport (for statistics and tests).
    pub fn tcp(&self) -> &std::sync::Arc<TcpTransport> {
        &self.tcp
    }

    /// The local transport.
    pub fn local(&self) -> &std::sync::Arc<LocalTransport> {
        &self.local
    }

    /// Opens the engine that cluster metadata (etcd) lists as `source`:
    /// looks its record up, then [`open_peer`](Self::open_peer) at the
    /// recorded address. The session's epoch rule still decides: a record
    /// whose listener now belongs to an older incarnation is refused.
    #[cfg(feature = "etcd")]
    pub fn open_peer_from_etcd(
        &self,
        engine: &TransferEngine,
        etcd: &crate::metadata::etcd::EtcdMetadata,
        source: &str,
        rails: usize,
        prefer: PathPreference,
    ) -> Result<NetPeer, NetOpenError> {
        let record = etcd
            .lookup(source)
            .map_err(|e| SessionError::Protocol(format!("etcd lookup of {source} failed: {e}")))?
            .ok_or_else(|| {
                SessionError::Protocol(format!(
                    "no record of {source} in etcd (expired or never published)"
                ))
            })?;
        let addr: SocketAddr = record.listen_addr.parse().map_err(|e| {
            SessionError::Protocol(format!("record of {source} has a bad address: {e}"))
        })?;
        let peer = self.open_peer(engine, addr, rails, prefer)?;
        if peer.info.epoch < record.epoch {
            return Err(SessionError::Protocol(format!(
                "{source} at {addr} answered with epoch {}, older than its record's {}",
                peer.info.epoch, record.epoch
            ))
            .into());
        }
        Ok(peer)
    }

    /// Opens the engine at `addrs` (its session address, and where it
    /// serves rdma control links, if it does) as a peer of `engine` with
    /// `rails` rails (tcp connections or local worker threads; rdma opens
    /// one rail per usable NIC) on the path chosen by `prefer`. A plain
    /// `SocketAddr` is a session address without an rdma control link. See
    /// the module docs and docs/paths.md.
    pub fn open_peer(
        &self,
        engine: &TransferEngine,
        addrs: impl Into<PeerAddrs>,
        rails: usize,
        prefer: PathPreference,
    ) -> Result<NetPeer, NetOpenError> {
        let addrs = addrs.into();
        let addr = addrs.session;
        let only = match prefer {
            PathPreference::Auto => None,
            PathPreference::Only(p) => Some(p),
        };
        if let Some(p) = only
            && !matches!(p, PathKind::Tcp | PathKind::Local | PathKind::Rdma)
        {
            return Err(NetOpenError::Unsupported(p));
        }
        // A path other than the one asked for is not a candidate (and not
        // a fallback).
        let excluded = |p: PathKind| only.filter(|o| *o != p);
        let rails = rails.max(1);
        let first = self.tcp.dial(addr)?;
        let hs = first.handshake().clone();
        let established = Established {
            peer: Identity::new(
                hs.peer.source_id.clone(),
                hs.peer.epoch,
                hs.peer.capabilities,
            ),
            admission: hs.admission.clone(),
        };
        let info = engine.adopt_peer(hs.session, &established, first.publication())?;
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
                .map_peer(&self.cfg, &engine.peer_table(), peer, &hs.peer)
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
                Ok(()) => match addrs.rdma_control {
                    None => (
                        true,
                        Err("the peer's rdma control link is not known: give its address in PeerAddrs::rdma_control (orbitte serve: engine.control_listen)".to_owned()),
                    ),
                    Some(at) => match self.open_rdma(engine, at) {
                        Ok((opened, l)) if opened.id == peer => {
                            link = Some(l);
                            (true, Ok(()))
                        }
                        Ok((opened, _)) => {
                            return Err(SessionError::Protocol(format!(
                                "the rdma control link at {at} belongs to {} (epoch {}), not to {} (epoch {}) at {addr}: give the control link of the same engine",
                                opened.source_id, opened.epoch, hs.peer.source_id, hs.peer.epoch
                            ))
                            .into());
                        }
                        Err(why) => (true, Err(why)),
                    },
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
        Ok(NetPeer {
            info,
            path: choice.path,
            fell_back: choice.fell_back,
            rails: rail_ids,
            closed_rails,
        })
    }

    /// Opens the rdma rails over the control link at `at`
    /// ([`TransferEngine::open_peer`]); `Err` says why not.
    fn open_rdma(
        &self,
        engine: &TransferEngine,
        at: SocketAddr,
    ) -> Result<(PeerInfo, TcpControlLink), String> {
        let mut link = TcpControlLink::connect(at, self.cfg.handshake_timeout)
            .map_err(|e| format!("the peer's rdma control link at {at} is unreachable: {e}"))?;
        let info = engine
            .open_peer(&mut link)
            .map_err(|e| format!("the peer's rdma control link at {at} refused: {e}"))?;
        Ok((info, link))
    }
}
