//! The tcp and local paths on a [`TransferEngine`].
//!
//! Target side: [`TransferEngine::serve_tcp`] serves the engine's published
//! ranges over tcp sessions (and through shared memory to same-host peers).
//!
//! Initiator side: [`TransferEngine::attach_net`] attaches a tcp and a local
//! transport to the engine; [`NetPaths::open_peer`] opens a peer over a tcp
//! session (handshake into the engine's peer table, p2p descriptors),
//! records it in the engine ([`TransferEngine::adopt_peer`]), chooses the
//! path by the documented policy (docs/paths.md) and adds that path's rails,
//! so [`TransferEngine::submit`] runs requests on them with the engine's
//! outcome contract.

use std::net::SocketAddr;

use orbitte_wire::handshake::Established;
use orbitte_wire::{Epoch, Identity, SourceId, TextError};

use super::path::{NoPath, PathInputs, choose_path};
use super::{Listener, SessionConfig, SessionError};
use crate::transport::local::{LocalError, LocalTransport};
use crate::transport::tcp::{Dialed, TcpTransport};
use crate::transport::{PathKind, RailId, RailSpec};
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
        }
    }
}

/// Which path a peer opened by [`NetPaths::open_peer`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathPreference {
    /// The policy: local when it applies and works, else tcp (rdma peers
    /// are opened with [`TransferEngine::open_peer`] over a
    /// [`TcpControlLink`](super::TcpControlLink)).
    Auto,
    /// Exactly this path (`Tcp` or `Local`), or an error naming why not.
    Only(PathKind),
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
    /// Ask for `Only(Tcp)` or `Only(Local)`; rdma goes through `open_peer`.
    #[error(
        "{0} peers are not opened here: use PathPreference::Only(tcp|local), or open_peer for rdma"
    )]
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

    /// Opens the engine at `addr` as a peer of `engine` with `rails`
    /// rails (tcp connections, or local worker threads) on the path chosen
    /// by `prefer`. See the module docs.
    pub fn open_peer(
        &self,
        engine: &TransferEngine,
        addr: SocketAddr,
        rails: usize,
        prefer: PathPreference,
    ) -> Result<NetPeer, NetOpenError> {
        if let PathPreference::Only(p) = prefer
            && !matches!(p, PathKind::Tcp | PathKind::Local)
        {
            return Err(NetOpenError::Unsupported(p));
        }
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
        } else if prefer == PathPreference::Only(PathKind::Tcp) {
            Err("tcp was asked for explicitly".to_owned())
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
        let inputs = PathInputs {
            // An explicit tcp request is not a fallback.
            same_host: same_host && prefer != PathPreference::Only(PathKind::Tcp),
            local,
            rdma_applies: false,
            rdma: Err("rdma peers are opened with open_peer over a control link".into()),
            tcp: if prefer == PathPreference::Only(PathKind::Local) {
                Err("local was asked for explicitly".into())
            } else {
                Ok(())
            },
        };
        let choice = choose_path(hs.peer.source_id.as_str(), 0, &inputs)?;
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
        // One path per peer: rails of the other path (an earlier open with
        // another preference) are closed, so the engine stripes requests
        // over the chosen path only.
        let switched = match choice.path {
            PathKind::Local => self.tcp.close_peer(peer),
            _ => self.local.close_peer(peer),
        };
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
}
