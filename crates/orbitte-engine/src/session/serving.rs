//! What a listener's threads share: the session config, the peer table,
//! the published ranges, the live connections and closed sessions, the
//! counters and the log budgets ([`Shared`]), read by the tcp accept
//! threads and by the local path's server alike.

use std::collections::HashMap;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use orbitte_wire::{Frame, SessionId, SourceId};

use super::activity::SessionActivity;
use super::log_budget::LogBudget;
use super::{RangeLookup, SessionConfig, SharedPeerTable, handshake};
use crate::io_pool::IoPool;
use crate::transport::tcp::serve::CloseReason;

/// One session the listener closed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedSession {
    /// The peer's address.
    pub from: SocketAddr,
    /// The peer's source id, when the handshake got that far.
    pub source_id: Option<SourceId>,
    /// Whether the close was abnormal (misbehaving peer or a bound hit).
    pub abnormal: bool,
    /// Why it was closed.
    pub reason: String,
}

#[derive(Debug)]
pub(crate) struct LiveConn {
    /// `None` until the peer authenticated (a pre-auth slot).
    pub(crate) source: Option<SourceId>,
    pub(crate) session: Option<SessionId>,
    pub(crate) ip: IpAddr,
    pub(crate) since: Instant,
    pub(crate) stream: TcpStream,
    /// Closed to make room for a newcomer: it no longer holds a pre-auth
    /// slot or a session slot, though its thread may not have recorded the
    /// close yet.
    pub(crate) evicted: bool,
    /// What a tcp data session did last; `None` for every other session
    /// (never closed to make room).
    pub(crate) activity: Option<Arc<SessionActivity>>,
}

/// Serves sessions opened for [`SessionPurpose::RDMA_CONTROL`] (the
/// engine's rdma control link) after the handshake admitted them.
pub(crate) trait ControlAcceptor: Send + Sync + std::fmt::Debug {
    /// What answers the frames of the link admitted as `hs`, from the
    /// setup of its rails on (`session::control_conn` drives it on an I/O
    /// loop); `Err`: why the link is closed at once.
    fn open(&self, hs: &handshake::Handshake) -> Result<Box<dyn ControlSession>, CloseReason>;
}

/// A control link: what the peer's frames on it ask, answered.
pub(crate) trait ControlSession: Send + std::fmt::Debug {
    /// Answers one frame the peer sent (while its rails are set up: its
    /// publication and its connect request; after: a request to
    /// re-establish one of its rails): the frame to send back, if any, or
    /// how the link ends. Called on an I/O loop: it must not wait for the
    /// network.
    fn answer(&mut self, frame: Frame) -> Result<Option<Frame>, ControlEnd>;

    /// Whether the link's rails are set up; until then the link must get
    /// there within `handshake_timeout` of its admission.
    fn is_set_up(&self) -> bool {
        true
    }
}

/// How a control link ends: a last frame that tells the peer why (an
/// error or a reject, sent before the close), and the reason recorded.
#[derive(Debug)]
pub(crate) struct ControlEnd {
    pub(crate) last: Option<Box<Frame>>,
    pub(crate) reason: CloseReason,
}

impl From<CloseReason> for ControlEnd {
    fn from(reason: CloseReason) -> Self {
        Self { last: None, reason }
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) cfg: SessionConfig,
    pub(crate) peers: SharedPeerTable,
    pub(crate) ranges: Arc<dyn RangeLookup>,
    /// Who serves rdma control links; `None`: such sessions are refused.
    pub(crate) control: Option<Arc<dyn ControlAcceptor>>,
    pub(crate) stop: AtomicBool,
    /// The listener's I/O threads: its accept loop and its idle tcp data
    /// sessions wait there. The listener owns the pool; a session that
    /// finds it gone closes.
    pub(crate) pool: Weak<IoPool>,
    /// `accept` calls made (each connection taken costs one, and each
    /// wake-up one more that finds the backlog empty).
    pub(crate) accept_calls: AtomicU64,
    pub(crate) live: Mutex<HashMap<u64, LiveConn>>,
    pub(crate) closed: Mutex<Vec<ClosedSession>>,
    pub(crate) next_conn: AtomicU64,
    pub(crate) accepted: AtomicU64,
    pub(crate) admitted: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) data_requests: AtomicU64,
    pub(crate) data_bytes: AtomicU64,
    /// Connections refused a pre-auth slot.
    pub(crate) preauth_refused: AtomicU64,
    /// Unauthenticated connections closed for a newcomer.
    pub(crate) preauth_evicted: AtomicU64,
    /// Idle tcp data sessions closed for a newcomer.
    pub(crate) sessions_evicted: AtomicU64,
    /// Refused and abnormally closed sessions.
    pub(crate) refusal_log: LogBudget,
    /// Sessions closed normally, newer epochs adopted, local handouts.
    pub(crate) session_log: LogBudget,
    /// Accept and thread failures a flood of connections can cause.
    pub(crate) resource_log: LogBudget,
}

/// Keeps the last records only, so a flood of connections cannot grow it.
const CLOSED_KEPT: usize = 1024;

impl Shared {
    /// Whether a refusal may be logged now (within
    /// `refusal_logs_per_second`), with the count of those left out since
    /// the last one logged; `None`: count it and log nothing.
    pub(crate) fn refusal_to_log(&self) -> Option<u64> {
        self.refusal_log.admit(Instant::now())
    }

    /// Whether a line about a session that went as it should (closed
    /// normally, a newer epoch adopted, a local handout) may be logged now,
    /// within the same per-second budget as refusals but counted apart;
    /// `Some(left_out)` as [`refusal_to_log`](Self::refusal_to_log).
    pub(crate) fn session_line_to_log(&self) -> Option<u64> {
        self.session_log.admit(Instant::now())
    }

    /// Whether a line about a local failure that connections can cause
    /// (accept failed, no thread for a session) may be logged now.
    pub(crate) fn resource_line_to_log(&self) -> Option<u64> {
        self.resource_log.admit(Instant::now())
    }

    /// Closes an admitted connection: its socket, its session in the peer
    /// table, its live entry, and the record of why. The record and the
    /// tables are updated before the socket is shut down, so a peer that
    /// sees the close finds the listener's account of it already there.
    pub(crate) fn close_admitted(
        &self,
        stream: &TcpStream,
        conn: u64,
        from: SocketAddr,
        session: SessionId,
        source: SourceId,
        reason: CloseReason,
    ) {
        self.peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .session_closed(session);
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&conn);
        self.record_close(from, Some(source), reason.abnormal, reason.text);
        let _ = stream.shutdown(Shutdown::Both);
    }

    pub(crate) fn record_close(
        &self,
        from: SocketAddr,
        source_id: Option<SourceId>,
        abnormal: bool,
        reason: String,
    ) {
        // Peer text in `reason` is escaped by the wire types' Display, and
        // `?` quotes and escapes it once more.
        if abnormal {
            self.refused.fetch_add(1, Ordering::Relaxed);
            if let Some(left_out) = self.refusal_to_log() {
                tracing::warn!(%from, source = ?source_id.as_ref().map(|s| s.as_str()), ?reason, left_out, "session closed");
            }
        } else if let Some(left_out) = self.session_line_to_log() {
            tracing::info!(%from, source = ?source_id.as_ref().map(|s| s.as_str()), ?reason, left_out, "session closed");
        }
        let mut c = self.closed.lock().unwrap_or_else(|p| p.into_inner());
        if c.len() >= CLOSED_KEPT {
            c.remove(0);
        }
        c.push(ClosedSession {
            from,
            source_id,
            abnormal,
            reason,
        });
    }
}
