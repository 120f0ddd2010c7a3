//! The engine's own listener: started at build or with `listen`, serving
//! data sessions, same-host mapping and rdma control links
//! ([`EngineControl`]); the engine's record in cluster metadata; the
//! listener's counters.
//!
//! Target side: with [`EngineBuilder::listen`](crate::EngineBuilder::listen)
//! the engine binds one [`Listener`] at build that serves every session it
//! accepts: data sessions (its published ranges over tcp, and through
//! shared memory to same-host peers) and rdma control links (the `hello`
//! says [`SessionPurpose::RDMA_CONTROL`]; the listener then runs the queue
//! pair exchange on that connection and keeps it open while the rails
//! live).

use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Weak};
use std::time::Instant;

use orbitte_wire::Frame;
#[cfg(doc)]
use orbitte_wire::SessionPurpose;

use super::ranges::EngineRanges;
use super::{Shared, TransferEngine};
use crate::error::BuildError;
use crate::session::handshake::Handshake;
use crate::session::log_budget::LogBudget;
use crate::session::serving::{ControlAcceptor, ControlServed, ControlSession};
use crate::session::{ListenError, Listener, RangeLookup, TcpControlLink};
#[cfg(any(test, feature = "testing"))]
use crate::session::{SessionConfig, SessionError};
use crate::transport::tcp::serve::CloseReason;

impl TransferEngine {
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
            &self.net().tcp.io_threads(),
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
    pub fn listener_stats(&self) -> Option<crate::session::ListenerStats> {
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

    /// The engine's published ranges as the listener's [`RangeLookup`].
    pub(crate) fn range_lookup(&self) -> Arc<dyn RangeLookup> {
        Arc::new(EngineRanges::new(Arc::downgrade(&self.shared)))
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
    fn serve(&self, stream: TcpStream, hs: &Handshake) -> ControlServed {
        let Some(shared) = self.engine.upgrade() else {
            return ControlServed::Closed(CloseReason {
                abnormal: false,
                text: "the engine stopped".into(),
            });
        };
        let frame_timeout = shared.sessions.frame_timeout;
        let engine = TransferEngine::view(shared);
        let mut link = match TcpControlLink::new(stream, frame_timeout) {
            Ok(l) => l,
            Err(e) => {
                return ControlServed::Closed(CloseReason {
                    abnormal: true,
                    text: format!("cannot set up the rdma control link: {e}"),
                });
            }
        };
        let established = hs.established();
        let peer = match engine.accept_rdma_rails(&mut link, hs.session, &established) {
            Ok(p) => p,
            Err(e) => {
                return ControlServed::Closed(CloseReason {
                    abnormal: true,
                    text: format!("rdma peer refused: {e}"),
                });
            }
        };
        if let Some(left_out) = self.accepted_log.admit(Instant::now()) {
            tracing::info!(peer = %hs.peer.source_id, rails = peer.rails.len(), left_out, "rdma peer accepted");
        }
        drop(engine);
        ControlServed::Open(Box::new(EngineControlLink {
            _link: link,
            engine: self.engine.clone(),
            peer: peer.id,
            session: hs.session,
        }))
    }
}

/// An open rdma control link of an accepted rdma peer: it stays open while
/// the peer's rails live, and carries the peer's requests to re-establish
/// one of them.
#[derive(Debug)]
struct EngineControlLink {
    /// Set up over this link; the listener serves its socket now.
    _link: TcpControlLink,
    engine: Weak<Shared>,
    peer: crate::transport::PeerId,
    session: orbitte_wire::SessionId,
}

impl ControlSession for EngineControlLink {
    fn answer(&mut self, frame: Frame) -> Result<Option<Frame>, CloseReason> {
        match frame {
            // The peer closes the link (or says goodbye) when it is done.
            Frame::Goodbye(g) => Err(CloseReason::normal(format!(
                "rdma control link: goodbye ({})",
                g.reason
            ))),
            Frame::ConnectRequest(r) => {
                // The peer re-establishes one of the rails.
                let Some(shared) = self.engine.upgrade() else {
                    return Err(CloseReason::normal("the engine stopped"));
                };
                let answer =
                    TransferEngine::view(shared).answer_rail_request(self.peer, self.session, &r);
                Ok(Some(answer))
            }
            other => {
                tracing::debug!(frame = %other.frame_type(), "rdma control link: frame ignored");
                Ok(None)
            }
        }
    }
}
