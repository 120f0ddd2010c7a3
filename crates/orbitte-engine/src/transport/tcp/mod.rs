//! The tcp path: one-sided READ and WRITE emulated over TCP sessions.
//!
//! Initiator side: [`TcpTransport`] opens several connections per peer (one
//! per rail, each a full session with its own handshake) and pipelines up to
//! `max_in_flight_per_connection` requests on each, so a large batch striped
//! over the rails fills the link. Payloads move between the socket and
//! [`HostMemory`](orbitte_memory::HostMemory) directly (module `payload`): a
//! WRITE's bytes are sent from the registered range, a READ's answer is
//! received into it.
//!
//! Target side: `serve` (run by [`crate::session::Listener`]) checks each
//! request against the published ranges and never reads or writes outside a
//! range published as remotely accessible.
//!
//! Outcome contract: the same as rdma, through the engine's core. Each work
//! item is reported once, `released: true` (the rail's loop has let go of
//! its bytes when it reports). A rail that fails reports `RailDown` and
//! every outstanding item: sent ones as `RailDown` (a WRITE may have reached
//! the peer: remote effect possible), never-sent ones as `Flushed`. Nothing
//! is retried on another rail. Answers are passed on as they arrive (see
//! `socket::ANSWER_BATCH`), so a request the request timeout ends while its
//! rail still waits counts every slice answered by then in its completed
//! prefix.

pub(crate) mod payload;
mod rail;
pub(crate) mod serve;
pub(crate) mod socket;
pub(crate) mod staged;

use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use orbitte_wire::{
    AccessToken, Admission, Frame, RangeDescriptor, RangeId, SegmentPublication, SourceId,
};

use crate::io_pool::IoThreads;
use crate::session::io::FrameReader;
use crate::session::{Handshake, SessionConfig, SessionError, SharedPeerTable, handshake};
use crate::transport::{
    CleanupError, EventSink, NotifyError, PathKind, PeerId, PostContext, PostError, RailId,
    Transport, WorkItem, close_rails_now,
};

use rail::{Job, Rail, SegmentUpdate};

/// What the transport knows about one peer: who it is and its ranges.
#[derive(Debug, Clone)]
struct PeerState {
    source: SourceId,
    epoch: orbitte_wire::Epoch,
    ranges: crate::Map<RangeId, RangeDescriptor>,
}

/// A peer reached over tcp.
#[derive(Debug, Clone)]
pub struct TcpPeerLink {
    /// The handshake of the first connection (identity, admission).
    pub handshake: Handshake,
    /// The peer's publications received at connect (p2p metadata).
    pub ranges: Vec<RangeDescriptor>,
    /// The rails opened, in order.
    pub rails: Vec<RailId>,
    /// Rails of an older epoch of the same source that were closed because
    /// this connection adopted a newer one.
    pub closed_rails: Vec<RailId>,
}

/// One admitted tcp session not yet started as a rail.
#[derive(Debug)]
pub struct Dialed {
    stream: Option<TcpStream>,
    handshake: Handshake,
    publication: SegmentPublication,
    peers: SharedPeerTable,
}

impl Dialed {
    /// The handshake (peer identity, session id, admission).
    pub fn handshake(&self) -> &Handshake {
        &self.handshake
    }

    /// The peer's publication received at connect (p2p metadata).
    pub fn publication(&self) -> &SegmentPublication {
        &self.publication
    }
}

impl Drop for Dialed {
    fn drop(&mut self) {
        if let Some(s) = self.stream.take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
            self.peers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .session_closed(self.handshake.session);
        }
    }
}

/// The tcp [`Transport`].
pub struct TcpTransport {
    cfg: SessionConfig,
    peers: SharedPeerTable,
    sink: Arc<dyn EventSink>,
    rails: RwLock<crate::Map<RailId, (PeerId, Arc<Rail>)>>,
    state: Arc<RwLock<crate::Map<PeerId, PeerState>>>,
    /// Where the rails are served (started with the first rail); an
    /// engine shares it with its listener.
    io: IoThreads,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("source", &self.cfg.source_id)
            .field("rails", &self.rails.read().map(|r| r.len()).unwrap_or(0))
            .finish_non_exhaustive()
    }
}

impl TcpTransport {
    /// A tcp transport for an engine with session settings `cfg` and peer
    /// table `peers`, reporting to `sink`.
    pub fn new(cfg: SessionConfig, peers: SharedPeerTable, sink: Arc<dyn EventSink>) -> Arc<Self> {
        Arc::new(Self {
            io: IoThreads::new(cfg.io_threads),
            cfg,
            peers,
            sink,
            rails: RwLock::new(crate::Map::default()),
            state: Arc::new(RwLock::new(crate::Map::default())),
        })
    }

    /// The I/O pool its rails are served on (an engine's listener shares
    /// it).
    pub(crate) fn io_threads(&self) -> IoThreads {
        self.io.clone()
    }

    fn open_connection(
        &self,
        addr: SocketAddr,
    ) -> Result<(TcpStream, Handshake, SegmentPublication), SessionError> {
        let mut stream = TcpStream::connect_timeout(&addr, self.cfg.handshake_timeout)?;
        stream.set_nodelay(true)?;
        let hs = handshake::connect(&mut stream, &self.cfg, &self.peers, Some(addr))?;
        let close = || {
            self.peers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .session_closed(hs.session)
        };
        let deadline = Instant::now() + self.cfg.handshake_timeout;
        let left = deadline.saturating_duration_since(Instant::now());
        let publication =
            match FrameReader::new().read(&mut stream, Some(left), self.cfg.frame_timeout) {
                Ok(Frame::SegmentPublication(p)) if p.epoch == hs.peer.epoch => p,
                Ok(Frame::Error(e)) => {
                    close();
                    return Err(SessionError::Refused {
                        code: e.code,
                        message: e.message.to_string(),
                    });
                }
                Ok(other) => {
                    close();
                    return Err(SessionError::Protocol(format!(
                        "expected the peer's segment-publication, got {}",
                        other.frame_type()
                    )));
                }
                Err(SessionError::Idle) => {
                    close();
                    return Err(SessionError::Timeout {
                        what: "a segment-publication",
                    });
                }
                Err(e) => {
                    close();
                    return Err(e);
                }
            };
        if let Err(e) = self
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record_publication(hs.session, &publication)
        {
            close();
            return Err(SessionError::Protocol(e.to_string()));
        }
        Ok((stream, hs, publication))
    }

    /// Opens one session to the engine at `addr`: handshake (the peer is
    /// admitted into this engine's peer table) and its publication. Start
    /// it as a rail with [`start_rails`](Self::start_rails); dropping it
    /// closes the session.
    pub fn dial(&self, addr: SocketAddr) -> Result<Dialed, SessionError> {
        let (stream, handshake, publication) = self.open_connection(addr)?;
        Ok(Dialed {
            stream: Some(stream),
            handshake,
            publication,
            peers: self.peers.clone(),
        })
    }

    /// Opens one session per rail to the engine at `addr`, registers the
    /// peer's ranges for `peer` and starts the rails (see
    /// [`dial`](Self::dial) and [`start_rails`](Self::start_rails)).
    pub fn open_rails(
        &self,
        peer: PeerId,
        addr: SocketAddr,
        rails: &[RailId],
    ) -> Result<TcpPeerLink, SessionError> {
        let mut dialed = Vec::with_capacity(rails.len());
        for &rail in rails {
            dialed.push((rail, self.dial(addr)?));
        }
        self.start_rails(peer, dialed)
    }

    /// Starts dialed sessions as rails of `peer`. All must have reached the
    /// same source and epoch. When the peer turns out to be a newer epoch
    /// of a source we knew, the rails and descriptors of the old epoch are
    /// dropped first (see [`TcpPeerLink::closed_rails`]); an older epoch
    /// was already refused by [`dial`](Self::dial).
    pub fn start_rails(
        &self,
        peer: PeerId,
        mut dialed: Vec<(RailId, Dialed)>,
    ) -> Result<TcpPeerLink, SessionError> {
        let Some((_, first)) = dialed.first() else {
            return Err(SessionError::Limit("open at least one rail".into()));
        };
        let hs = first.handshake.clone();
        let publication = first.publication.clone();
        if dialed.iter().any(|(_, d)| {
            d.handshake.peer.source_id != hs.peer.source_id
                || d.handshake.peer.epoch != hs.peer.epoch
        }) {
            return Err(SessionError::Protocol(
                "connections to one address reached different peers".into(),
            ));
        }
        let mut closed_rails = Vec::new();
        if let Some(Admission::Replaced {
            previous,
            invalidated,
        }) = dialed
            .iter()
            .map(|(_, d)| &d.handshake.admission)
            .find(|a| matches!(a, Admission::Replaced { .. }))
        {
            closed_rails = self.drop_source(&hs.peer.source_id, Some(*previous));
            tracing::info!(
                source = %hs.peer.source_id, old_epoch = %previous, new_epoch = %hs.peer.epoch,
                closed_rails = closed_rails.len(), dropped_descriptors = invalidated.descriptors.len(),
                "newer epoch adopted: old rails and cached descriptors dropped"
            );
        }
        let ranges: crate::Map<RangeId, RangeDescriptor> = publication
            .ranges
            .iter()
            .map(|r| (r.range_id, r.clone()))
            .collect();
        self.state
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                peer,
                PeerState {
                    source: hs.peer.source_id.clone(),
                    epoch: hs.peer.epoch,
                    ranges,
                },
            );
        let mut started = Vec::with_capacity(dialed.len());
        let pool = self.io.pool().map_err(SessionError::Io)?;
        for (rail, d) in &mut dialed {
            let Some(stream) = d.stream.take() else {
                continue;
            };
            let state = self.state.clone();
            let epoch = hs.peer.epoch;
            let peer_id = peer;
            let on_pub: Arc<dyn Fn(SegmentUpdate) + Send + Sync> =
                Arc::new(move |u: SegmentUpdate| {
                    let mut state = state.write().unwrap_or_else(|e| e.into_inner());
                    let Some(ps) = state.get_mut(&peer_id) else {
                        return;
                    };
                    match u {
                        SegmentUpdate::Published(p) if p.epoch == epoch => {
                            for r in p.ranges {
                                ps.ranges.insert(r.range_id, r);
                            }
                        }
                        SegmentUpdate::Retired(r) if r.epoch == epoch => {
                            for id in &r.range_ids {
                                ps.ranges.remove(id);
                            }
                        }
                        _ => {}
                    }
                });
            let r = Rail::start(
                *rail,
                d.handshake.session,
                stream,
                &self.cfg,
                self.sink.clone(),
                on_pub,
                &pool,
            )
            .map_err(SessionError::Io)?;
            self.rails
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(*rail, (peer, r));
            started.push(*rail);
        }
        Ok(TcpPeerLink {
            handshake: hs,
            ranges: publication.ranges,
            rails: started,
            closed_rails,
        })
    }

    /// Closes the rails and forgets the descriptors of every peer that is
    /// `source` (at `epoch`, or any epoch when `None`). Returns the rails.
    pub fn drop_source(
        &self,
        source: &SourceId,
        epoch: Option<orbitte_wire::Epoch>,
    ) -> Vec<RailId> {
        let peers: Vec<PeerId> = self
            .state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, s)| &s.source == source && epoch.is_none_or(|e| s.epoch == e))
            .map(|(p, _)| *p)
            .collect();
        let mut closed = Vec::new();
        for p in &peers {
            self.state
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(p);
            let rails: Vec<RailId> = self
                .rails
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter(|(_, (pp, _))| pp == p)
                .map(|(r, _)| *r)
                .collect();
            for r in rails {
                self.close(r);
                closed.push(r);
            }
        }
        closed
    }

    /// The descriptor of `range` of `peer`, as cached.
    pub fn range(&self, peer: PeerId, range: RangeId) -> Option<RangeDescriptor> {
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&peer)?
            .ranges
            .get(&range)
            .cloned()
    }

    /// Whether `rail` is up.
    pub fn rail_is_up(&self, rail: RailId) -> bool {
        self.rails
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&rail)
            .is_some_and(|(_, r)| !r.is_down())
    }
}

impl TcpTransport {
    /// Queues `items` on `rail` (see [`Transport::post`]).
    pub fn post_items(
        &self,
        rail: RailId,
        items: &[WorkItem],
        ctx: &dyn PostContext,
    ) -> Result<(), PostError> {
        let Some((peer, r)) = self
            .rails
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&rail)
            .cloned()
        else {
            return Err(PostError {
                rail,
                posted: 0,
                reason: "unknown tcp rail".into(),
            });
        };
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        let Some(ps) = state.get(&peer) else {
            return Err(PostError {
                rail,
                posted: 0,
                reason: "peer of the rail was dropped (epoch changed)".into(),
            });
        };
        let mut jobs = Vec::with_capacity(items.len());
        for item in items {
            let Some(local) = ctx.memory(item.registration) else {
                // Nothing has been queued yet (jobs go out together below),
                // so nothing was posted: claiming `i` would leave those
                // items waiting for a completion that never comes.
                return Err(PostError {
                    rail,
                    posted: 0,
                    reason: "local registration is gone".into(),
                });
            };
            // The engine's cached descriptor first, ours (from connect) next;
            // an unknown range goes out with token 0 and the target refuses it.
            let token = ctx
                .remote_range(item.peer, item.range)
                .map(|d| d.token)
                .or_else(|| ps.ranges.get(&RangeId(item.range.0)).map(|d| d.token))
                .unwrap_or(AccessToken(0));
            jobs.push(Job {
                item: *item,
                local: local.clone(),
                token,
                answered: None,
            });
        }
        drop(state);
        r.push(jobs.into_iter()).map_err(|why| PostError {
            rail,
            posted: 0,
            reason: why,
        })
    }

    /// Queues an encoded `notification` frame on `rail` (see
    /// [`Transport::notify`]).
    pub fn notify_rail(&self, rail: RailId, frame: &Arc<[u8]>) -> Result<(), NotifyError> {
        let r = self
            .rails
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&rail)
            .map(|(_, r)| r.clone());
        let Some(r) = r else {
            return Err(NotifyError {
                rail,
                reason: "unknown tcp rail".into(),
            });
        };
        r.push_note(frame.clone())
            .map_err(|reason| NotifyError { rail, reason })
    }

    /// Closes every rail of `peer` (outstanding items are reported as
    /// failed) and reports them down to the engine at once; returns them.
    pub fn close_peer(&self, peer: PeerId) -> Vec<RailId> {
        let rails: Vec<RailId> = self
            .rails
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, (p, _))| *p == peer)
            .map(|(r, _)| *r)
            .collect();
        close_rails_now(&*self.sink, rails, "peer switched path", |r| self.close(r))
    }

    /// Takes `rail` down so it reports every outstanding item.
    pub fn flush_rail(&self, rail: RailId) {
        if let Some((_, r)) = self
            .rails
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&rail)
        {
            r.fail("flushed by the engine", true);
        }
    }

    /// Closes `rail` (its outstanding items are reported as failed).
    pub fn close(&self, rail: RailId) {
        let removed = self
            .rails
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&rail);
        if let Some((_, r)) = removed {
            r.fail("rail closed", true);
            self.peers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .session_closed(r.session);
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        // The rails' loops hold their own handles: take the rails down.
        for (_, (_, r)) in self
            .rails
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
        {
            r.fail("transport dropped", true);
        }
    }
}

impl Transport for Arc<TcpTransport> {
    fn path(&self) -> PathKind {
        PathKind::Tcp
    }

    fn post(
        &self,
        rail: RailId,
        items: &[WorkItem],
        ctx: &dyn PostContext,
    ) -> Result<(), PostError> {
        self.post_items(rail, items, ctx)
    }

    fn flush(&self, rail: RailId) -> Result<(), CleanupError> {
        self.flush_rail(rail);
        Ok(())
    }

    fn close_rail(&self, rail: RailId) -> Result<(), CleanupError> {
        self.close(rail);
        Ok(())
    }

    fn notify(&self, rail: RailId, frame: &Arc<[u8]>) -> Result<(), NotifyError> {
        self.notify_rail(rail, frame)
    }
}
