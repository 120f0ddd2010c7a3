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

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Instant;

use orbitte_wire::Frame;
#[cfg(doc)]
use orbitte_wire::SessionPurpose;

use super::ranges::EngineRanges;
use super::rdma_peers::{RailSetup, SetupFailed, SetupStep};
use super::{Shared, TransferEngine};
use crate::error::BuildError;
use crate::session::handshake::Handshake;
use crate::session::log_budget::LogBudget;
use crate::session::serving::{ControlAcceptor, ControlEnd, ControlSession};
use crate::session::{ListenError, Listener, RangeLookup};
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
            accepted_log: Arc::new(LogBudget::new(self.shared.sessions.refusal_logs_per_second)),
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
        drop(slot);
        if let Some(w) = self.open_listener() {
            tracing::warn!("{w}");
        }
        Ok(at)
    }

    /// When the engine listens beyond this host and admits every peer (no
    /// cluster secret, no access token): what that exposes and the fix,
    /// as `listen` logs it once. `None` otherwise.
    pub fn open_listener(&self) -> Option<String> {
        if self.shared.sessions.listen_key().is_some() {
            return None;
        }
        crate::secret::open_listener_warning(self.listen_addr()?)
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
                    let mut record = crate::metadata::PeerRecord::from_publication(
                        self.source_id(),
                        addr,
                        self.shared.sessions.host_id.as_str(),
                        &self.segment_publication(),
                    );
                    record.listener_token = self.shared.sessions.listener_token.map(|t| t.to_hex());
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
    accepted_log: Arc<LogBudget>,
}

impl std::fmt::Debug for EngineControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineControl")
    }
}

impl ControlAcceptor for EngineControl {
    fn open(&self, hs: &Handshake) -> Result<Box<dyn ControlSession>, CloseReason> {
        if self.engine.strong_count() == 0 {
            return Err(CloseReason::normal("the engine stopped"));
        }
        Ok(Box::new(EngineControlLink {
            engine: self.engine.clone(),
            accepted_log: self.accepted_log.clone(),
            source: hs.peer.source_id.clone(),
            session: hs.session,
            stage: LinkStage::SettingUp(RailSetup::new(hs.session, hs.established())),
        }))
    }
}

/// An rdma control link of a peer: it sets the peer's rails up, then
/// stays open while they live and carries the peer's requests to
/// re-establish one of them.
#[derive(Debug)]
struct EngineControlLink {
    engine: Weak<Shared>,
    accepted_log: Arc<LogBudget>,
    source: orbitte_wire::SourceId,
    session: orbitte_wire::SessionId,
    stage: LinkStage,
}

#[derive(Debug)]
enum LinkStage {
    SettingUp(RailSetup),
    Open(crate::transport::PeerId),
}

impl ControlSession for EngineControlLink {
    fn answer(&mut self, frame: Frame) -> Result<Option<Frame>, ControlEnd> {
        let Some(shared) = self.engine.upgrade() else {
            return Err(CloseReason::normal("the engine stopped").into());
        };
        let engine = TransferEngine::view(shared);
        let peer = match &mut self.stage {
            LinkStage::SettingUp(setup) => {
                return match engine.rail_setup_step(setup, frame) {
                    Ok(SetupStep::Answer(f)) => Ok(Some(f)),
                    Ok(SetupStep::Open(peer, f)) => {
                        if let Some(left_out) = self.accepted_log.admit(Instant::now()) {
                            tracing::info!(peer = %self.source, rails = peer.rails.len(), left_out, "rdma peer accepted");
                        }
                        self.stage = LinkStage::Open(peer.id);
                        Ok(Some(f))
                    }
                    Err(failed) => {
                        let SetupFailed { last, error } = *failed;
                        Err(ControlEnd {
                            last: last.map(Box::new),
                            reason: CloseReason::abnormal(format!("rdma peer refused: {error}")),
                        })
                    }
                };
            }
            LinkStage::Open(peer) => *peer,
        };
        match frame {
            // The peer closes the link (or says goodbye) when it is done.
            Frame::Goodbye(g) => Err(CloseReason::normal(format!(
                "rdma control link: goodbye ({})",
                g.reason
            ))
            .into()),
            Frame::ConnectRequest(r) => {
                // The peer re-establishes one of the rails.
                Ok(Some(engine.answer_rail_request(peer, self.session, &r)))
            }
            other => {
                tracing::debug!(frame = %other.frame_type(), "rdma control link: frame ignored");
                Ok(None)
            }
        }
    }

    fn is_set_up(&self) -> bool {
        matches!(self.stage, LinkStage::Open(_))
    }
}
