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

use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orbitte_wire::SessionId;

use super::PeerIdentity;
use super::activity::SessionActivity;
use super::serving::Shared;
use crate::io_pool::{Next, Watched};
use crate::transport::tcp::serve::{CloseReason, ServeCtx, Served, prepare, quiet, serve};

/// How often a parked session makes a quiet session's checks (as often as
/// a thread serving it would, between its reads).
pub(crate) const CHECK: Duration = Duration::from_millis(200);

/// An admitted tcp data session, with what closing it takes.
#[derive(Debug)]
pub(crate) struct DataSession {
    pub(crate) stream: TcpStream,
    pub(crate) from: SocketAddr,
    /// Its key in the listener's live connections.
    pub(crate) conn: u64,
    pub(crate) shared: Arc<Shared>,
    pub(crate) peer: PeerIdentity,
    pub(crate) session: SessionId,
    pub(crate) activity: Arc<SessionActivity>,
}

impl DataSession {
    /// Serves it on this thread (after the handshake and the
    /// publications) until it ends or parks.
    pub(crate) fn start(self) {
        match prepare(&self.stream, &self.shared.cfg) {
            Ok(()) => self.run(),
            Err(reason) => self.finish(reason),
        }
    }

    /// Serves requests until the session ends or is quiet, then parks it.
    fn run(mut self) {
        let ctx = ctx(&self.shared, &self.peer, self.session, &self.activity);
        let served = serve(&mut self.stream, &ctx);
        match served {
            Served::Closed(reason) => self.finish(reason),
            Served::Idle => {
                let Some(pool) = self.shared.pool.upgrade() else {
                    return self.finish(CloseReason::normal("listener shut down"));
                };
                // Parked, the socket never blocks a loop: a goodbye that
                // finds the send buffer full is left out.
                if let Err(e) = self.stream.set_nonblocking(true) {
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
        let _ = self.stream.shutdown(Shutdown::Both);
        self.shared
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .session_closed(self.session);
        self.shared
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.conn);
        self.shared.record_close(
            self.from,
            Some(self.peer.source_id.clone()),
            reason.abnormal,
            reason.text,
        );
    }

    /// A quiet session's checks, on the loop; `Some`: it closed.
    fn check(&mut self) -> Option<CloseReason> {
        let ctx = ctx(&self.shared, &self.peer, self.session, &self.activity);
        quiet(&mut self.stream, &ctx)
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
        self.stream.as_raw_fd()
    }

    fn ready(self: Box<Self>, _now: Instant) -> Next {
        if self.shared.stop.load(Ordering::Acquire) {
            self.finish(CloseReason::normal("listener shut down"));
            return Next::Done;
        }
        if let Err(e) = self.stream.set_nonblocking(false) {
            self.finish(CloseReason::abnormal(format!(
                "cannot serve the session again: {e}"
            )));
            return Next::Done;
        }
        // Kept where a failed spawn can take it back.
        let conn = self.conn;
        let slot = Arc::new(Mutex::new(Some(*self)));
        let theirs = slot.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("orbitte-session-{conn}"))
            .spawn(move || {
                let s = theirs.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(s) = s {
                    s.run();
                }
            });
        if let Err(e) = spawned {
            let s = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(s) = s {
                if let Some(left_out) = s.shared.resource_line_to_log() {
                    tracing::warn!(error = %e, left_out, "cannot spawn a session thread");
                }
                s.finish(CloseReason::abnormal(format!(
                    "no thread to serve the session: {e}"
                )));
            }
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
