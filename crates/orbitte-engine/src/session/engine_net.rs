//! The tcp/local paths on a [`TransferEngine`]: serving its published
//! ranges to peers that reach it over tcp sessions (and, on the same host,
//! through shared memory).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use orbitte_wire::{Epoch, PeerTable, SourceId, TextError};

use super::{Listener, SessionConfig, SessionError};
use crate::TransferEngine;

impl TransferEngine {
    /// Session settings with this engine's identity (source id, epoch) and
    /// the defaults of [`SessionConfig::new`]; adjust (cluster secret,
    /// timeouts, bounds) and pass to [`serve_tcp`](Self::serve_tcp).
    pub fn session_config(&self) -> Result<SessionConfig, TextError> {
        let source = SourceId::new(self.source_id())?;
        // The engine's epoch is never 0 (EngineBuilder chooses it).
        let epoch = Epoch::new(self.epoch()).unwrap_or(Epoch::MIN);
        Ok(SessionConfig::new(source, epoch))
    }

    /// Starts a session listener on `addr` (port 0: any) that serves this
    /// engine's published, remotely accessible ranges over the tcp path,
    /// and over the local path to same-host peers. Requests are checked
    /// against the registrations as they are at that moment: a retired or
    /// unregistered range is refused. Stops when the listener is dropped.
    pub fn serve_tcp(
        &self,
        cfg: SessionConfig,
        addr: SocketAddr,
    ) -> Result<Listener, SessionError> {
        let peers = Arc::new(Mutex::new(PeerTable::new(cfg.source_id.clone())));
        Listener::bind(cfg, peers, self.range_lookup(), addr)
    }
}
