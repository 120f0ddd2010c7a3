//! An admitted tcp data session, served on an I/O loop of the listener's
//! pool ([`crate::io_pool`]) for its whole life, idle or busy: its socket
//! is non-blocking, and each time it is ready as the session asked (or
//! the session's deadline passes) the loop gives it a turn
//! ([`Serving::turn`]), which serves what can be served without waiting.
//! So a target's threads are the same with one peer as with thousands,
//! whether they are idle or keep it busy. Between turns the loop watches
//! the deadlines of the session: the answer in progress (`io_timeout`), a
//! started frame (`frame_timeout`), and every [`CHECK`] the checks a quiet
//! session makes (listener stopping, `idle_timeout`, its slot taken by a
//! newcomer: `transport::tcp::serve::quiet`).
//!
//! An rdma control link lives on the loops too, once its rails are set up
//! (`super::control_conn`).

use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Instant;

use mio::Interest;
use orbitte_wire::{SessionId, SourceId};

use super::PeerIdentity;
use super::activity::SessionActivity;
use super::serving::Shared;
use crate::io_pool::{Next, Watched};
pub(crate) use crate::transport::tcp::serve::CHECK;
use crate::transport::tcp::serve::{CloseReason, ServeCtx, Serving, Step, prepare};

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
    /// Hands it to the listener's pool after the handshake, which sends
    /// `greeting` (the encoded publications) and serves it from then on.
    pub(crate) fn start(self, greeting: Vec<u8>) {
        if let Err(reason) = prepare(&self.conn.stream, &self.conn.shared.cfg) {
            return self.finish(reason);
        }
        let Some(pool) = self.conn.shared.pool.upgrade() else {
            return self.finish(CloseReason::normal("listener shut down"));
        };
        let greeting_len = greeting.len();
        let same_host = crate::transport::tcp::socket::same_host(&self.conn.stream);
        let serving = Serving::new(
            &ctx(
                &self.conn.shared,
                &self.peer,
                self.conn.session,
                &self.activity,
            ),
            greeting,
            same_host,
        );
        // The first turn comes as soon as the socket takes the greeting.
        let interest = if greeting_len == 0 {
            Interest::READABLE
        } else {
            Interest::READABLE | Interest::WRITABLE
        };
        let on_loop = OnLoop {
            session: self,
            serving,
            interest: Some(interest),
        };
        pool.watch(Box::new(on_loop), Some(Instant::now() + CHECK));
    }

    /// Closes the session: the socket, its peer table entry, its live
    /// connection, and the record of why.
    fn finish(self, reason: CloseReason) {
        self.conn.close(reason);
    }
}

/// What [`Serving`] reads of a session.
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

/// A data session on its loop, with its serving state.
#[derive(Debug)]
struct OnLoop {
    session: DataSession,
    serving: Serving,
    /// What its last turn waits for (`None`: its deadline only).
    interest: Option<Interest>,
}

impl OnLoop {
    /// One turn; watched again as it asks, or closed.
    fn turn(mut self: Box<Self>, now: Instant) -> Next {
        let s = &self.session;
        let ctx = ctx(&s.conn.shared, &s.peer, s.conn.session, &s.activity);
        match self.serving.turn(&s.conn.stream, &ctx, now) {
            Step::Wait(interest, at) => {
                self.interest = interest;
                Next::Wait(self, Some(at))
            }
            Step::Closed(reason) => {
                self.session.finish(reason);
                Next::Done
            }
        }
    }
}

impl Watched for OnLoop {
    fn fd(&self) -> RawFd {
        self.session.conn.stream.as_raw_fd()
    }

    fn interest(&self) -> Interest {
        self.interest.unwrap_or(Interest::READABLE)
    }

    fn sleeps(&self) -> bool {
        self.interest.is_none()
    }

    fn ready(self: Box<Self>, now: Instant) -> Next {
        self.turn(now)
    }

    fn expired(self: Box<Self>, now: Instant) -> Next {
        self.turn(now)
    }

    fn abandoned(self: Box<Self>, why: &str) {
        self.session
            .finish(CloseReason::normal(format!("session closed: {why}")));
    }
}
