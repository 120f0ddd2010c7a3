//! Connecting to another engine: by address or by name (etcd), the tcp and
//! local transports attached at build, and the path policy run on each
//! connect.
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

use orbitte_wire::SessionPurpose;
use orbitte_wire::auth::ClusterSecret;
#[cfg(feature = "etcd")]
use orbitte_wire::auth::ListenerToken;

use super::TransferEngine;
use crate::PeerInfo;
use crate::session::handshake;
use crate::session::net::NetPaths;
use crate::session::path::{PathInputs, choose_path};
use crate::session::{
    ConnectError, ConnectOptions, PathPreference, Peer, SessionConfig, TcpControlLink,
};
use crate::transport::local::LocalTransport;
use crate::transport::tcp::{Dialed, TcpTransport};
use crate::transport::{PathKind, RailId, RailSpec};

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
        let net = self.net();
        let key = options
            .token
            .map(|t| ClusterSecret::access_key(net.cfg.cluster_secret.as_ref(), &t));
        if let Some(key) = key {
            net.cfg.peer_keys.set_addr(addr, key);
        }
        net.open_peer(self, addr, options.rails, options.prefer)
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
        let mut options = options;
        if options.token.is_none()
            && let Some(hex) = &record.listener_token
        {
            options.token =
                Some(
                    ListenerToken::from_hex(hex).map_err(|e| ConnectError::RecordToken {
                        source_id: source_id.to_owned(),
                        source: e,
                    })?,
                );
        }
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
        let local = LocalTransport::new(engine.event_sink(), cfg.io_threads);
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
        // The key that opened `addr` (its ack proved it) also opens the
        // same engine found by its id: its same-host mapping session.
        if let Some(key) = self.cfg.peer_keys.for_addr(addr) {
            self.cfg
                .peer_keys
                .set_source(hs.peer.source_id.as_str(), key);
        }
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
