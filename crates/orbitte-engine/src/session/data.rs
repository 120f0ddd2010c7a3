//! An admitted tcp data session between its requests: served by a thread
//! of its own while requests come, parked on an I/O loop of the
//! listener's pool ([`crate::io_pool`]) once it has been quiet for the
//! poll interval, so an idle session holds no thread.
//!
//! While parked, the loop watches the socket and, every [`CHECK`], the
//! checks a quiet session makes (listener stopping, `idle_timeout`, its
//! slot taken by a newcomer: `transport::tcp::serve::quiet`). The first
//! byte of a request (or the peer's close, or a shutdown of the socket by
//! the listener) hands the session to a new thread, which serves it with
//! every bound of a busy session (frame timeout, `io_timeout` over a whole
//! answer) until it is quiet again. Nothing is buffered and no answer
//! waits while it is parked, so serving it again starts from a clean
//! frame boundary.

use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use orbitte_wire::{SessionId, SourceId};

use super::PeerIdentity;
use super::activity::SessionActivity;
use super::serving::Shared;
use crate::io_pool::{Next, Watched, spawn_with};
use crate::transport::tcp::serve::{CloseReason, ServeCtx, Served, prepare, quiet, serve};

/// How often a parked session makes a quiet session's checks (as often as
/// a thread serving it would, between its reads).
pub(crate) const CHECK: Duration = Duration::from_millis(200);

/// An admitted connection of a listener, with what closing it takes.
#[derive(Debug)]
pub(crate) struct Admitted {
    /// The listener's handle of the socket.
    pub(crate) stream: TcpStream,
    pub(crate) from: SocketAddr,
    /// Its key in the listener's live connections.
    pub(crate) conn: u64,
    pub(crate) shared: Arc<Shared>,
    /// Its session in the peer table.
    pub(crate) session: SessionId,
    pub(crate) source: SourceId,
}

impl Admitted {
    /// Closes it and records why.
    pub(crate) fn close(self, reason: CloseReason) {
        self.shared.close_admitted(
            &self.stream,
            self.conn,
            self.from,
            self.session,
            self.source,
            reason,
        );
    }
}

/// An admitted tcp data session.
#[derive(Debug)]
pub(crate) struct DataSession {
    pub(crate) conn: Admitted,
    pub(crate) peer: PeerIdentity,
    pub(crate) activity: Arc<SessionActivity>,
}

impl DataSession {
    /// Serves it on this thread (after the handshake and the
    /// publications) until it ends or parks.
    pub(crate) fn start(self) {
        match prepare(&self.conn.stream, &self.conn.shared.cfg) {
            Ok(()) => self.run(),
            Err(reason) => self.finish(reason),
        }
    }

    /// Serves requests until the session ends or is quiet, then parks it.
    fn run(mut self) {
        let ctx = ctx(
            &self.conn.shared,
            &self.peer,
            self.conn.session,
            &self.activity,
        );
        let served = serve(&mut self.conn.stream, &ctx);
        match served {
            Served::Closed(reason) => self.finish(reason),
            Served::Idle => {
                let Some(pool) = self.conn.shared.pool.upgrade() else {
                    return self.finish(CloseReason::normal("listener shut down"));
                };
                // Parked, the socket never blocks a loop: a goodbye that
                // finds the send buffer full is left out.
                if let Err(e) = self.conn.stream.set_nonblocking(true) {
                    return self.finish(CloseReason::abnormal(format!(
                        "cannot park the session: {e}"
                    )));
                }
                pool.watch(Box::new(self), Some(Instant::now() + CHECK));
            }
        }
    }

    /// Closes the session: the socket, its peer table entry, its live
    /// connection, and the record of why.
    fn finish(self, reason: CloseReason) {
        self.conn.close(reason);
    }

    /// A quiet session's checks, on the loop; `Some`: it closed.
    fn check(&mut self) -> Option<CloseReason> {
        let ctx = ctx(
            &self.conn.shared,
            &self.peer,
            self.conn.session,
            &self.activity,
        );
        quiet(&mut self.conn.stream, &ctx)
    }
}

/// What [`serve`] reads of a session.
fn ctx<'a>(
    shared: &'a Shared,
    peer: &'a PeerIdentity,
    session: SessionId,
    activity: &'a SessionActivity,
) -> ServeCtx<'a> {
    ServeCtx {
        cfg: &shared.cfg,
        peers: &shared.peers,
        ranges: shared.ranges.as_ref(),
        peer,
        session,
        stop: &shared.stop,
        requests: &shared.data_requests,
        bytes: &shared.data_bytes,
        activity,
    }
}

impl Watched for DataSession {
    fn fd(&self) -> RawFd {
        self.conn.stream.as_raw_fd()
    }

    fn ready(self: Box<Self>, _now: Instant) -> Next {
        if self.conn.shared.stop.load(Ordering::Acquire) {
            self.finish(CloseReason::normal("listener shut down"));
            return Next::Done;
        }
        if let Err(e) = self.conn.stream.set_nonblocking(false) {
            self.finish(CloseReason::abnormal(format!(
                "cannot serve the session again: {e}"
            )));
            return Next::Done;
        }
        let name = format!("orbitte-session-{}", self.conn.conn);
        if let Err((s, e)) = spawn_with(name, *self, Self::run) {
            if let Some(left_out) = s.conn.shared.resource_line_to_log() {
                tracing::warn!(error = %e, left_out, "cannot spawn a session thread");
            }
            s.finish(CloseReason::abnormal(format!(
                "no thread to serve the session: {e}"
            )));
        }
        Next::Done
    }

    fn expired(mut self: Box<Self>, now: Instant) -> Next {
        match self.check() {
            Some(reason) => {
                self.finish(reason);
                Next::Done
            }
            None => Next::Wait(self, Some(now + CHECK)),
        }
    }

    fn abandoned(self: Box<Self>, why: &str) {
        self.finish(CloseReason::normal(format!("session closed: {why}")));
    }
}
