//! The target side: accepts sessions on TCP (and same-host mapping
//! requests on a unix socket) and serves them.
//!
//! The accept loop runs on the listener's I/O pool ([`IoPool`], sized by
//! `SessionConfig::io_threads`): the listening socket waits on epoll with
//! the idle sessions. A connection's handshake runs there too, on its
//! non-blocking socket with its pre-auth deadline in the loop's timer
//! (`Handshaking`, over the responder of module `handshake`), so
//! connections being accepted hold no thread; a refused one is closed
//! there once its error frame is out (module `nonblocking`). An admitted
//! tcp data session gets a thread while it serves requests; once quiet it
//! parks on the pool (module `data`), so idle sessions hold no thread.
//! An rdma control link gets a thread while its rails are set up, then
//! lives on the pool (module `control_conn`), and same-host mapping
//! sessions live on the pool all along (`transport::local::server`).

use std::collections::HashMap;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mio::Interest;

use orbitte_wire::{Admission, ErrorCode, Frame, FrameType, SessionPurpose, SourceId};

use super::accept::{Accepting, Acceptor};
use super::activity::SessionActivity;
use super::control_conn::ControlConn;
use super::data::{Admitted, DataSession};
use super::handshake::{Responder, Step};
use super::io::{send_error, write_frame};
use super::log_budget::LogBudget;
use super::nonblocking::Refusal;
use super::publications::publication_frames;
use super::serving::{ClosedSession, ControlAcceptor, ControlServed, LiveConn, Shared};
use super::{RangeLookup, SessionConfig, SessionError, SharedPeerTable, handshake};
use crate::io_pool::{IoPool, IoThreads, Next, WatchKey, Watched, spawn_with};
use crate::transport::tcp::serve::CloseReason;

/// Why [`TransferEngine::listen`](crate::TransferEngine::listen) (or `EngineBuilder::listen` at build)
/// failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListenError {
    /// The engine already listens (one listener serves every session).
    #[error("the engine already listens on {at}")]
    AlreadyListening {
        /// Where.
        at: SocketAddr,
    },
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: SessionError,
    },
}

/// Counters of a listener.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenerStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Sessions that completed the handshake.
    pub admitted: u64,
    /// Connections refused or closed for a bad reason.
    pub refused: u64,
    /// Connections open now.
    pub live: u64,
    /// tcp data requests (READ and WRITE) served, refused ones included.
    pub data_requests: u64,
    /// Payload bytes moved by tcp data requests.
    pub data_bytes: u64,
    /// Refusals and abnormal closes counted but not logged (the log takes
    /// `refusal_logs_per_second`).
    pub refusals_not_logged: u64,
    /// Connections refused before authenticating: no pre-auth slot.
    pub preauth_refused: u64,
    /// Unauthenticated connections closed to make room for a newcomer.
    pub preauth_evicted: u64,
    /// Idle tcp data sessions closed to make room for a newcomer.
    pub sessions_evicted: u64,
}

/// Accepts and serves sessions until dropped or [`shut down`](Self::shutdown).
#[derive(Debug)]
pub struct Listener {
    shared: Arc<Shared>,
    addr: SocketAddr,
    /// The accept loop's place on the pool.
    accept: Option<WatchKey>,
    local: Option<crate::transport::local::LocalServer>,
    /// Owns the I/O threads (the sessions only hold a `Weak`).
    pool: Arc<IoPool>,
}

impl Listener {
    /// Binds `addr` (port 0: any free port) and starts serving `ranges`.
    /// Same-host peers can also map mappable ranges (the local path) through
    /// a unix socket named after our source id and epoch.
    pub fn bind(
        cfg: SessionConfig,
        peers: SharedPeerTable,
        ranges: Arc<dyn RangeLookup>,
        addr: SocketAddr,
    ) -> Result<Self, SessionError> {
        let io = IoThreads::new(cfg.io_threads);
        Self::bind_serving(cfg, peers, ranges, addr, None, &io)
    }

    /// [`bind`](Self::bind), also serving rdma control links with
    /// `control`, on the I/O threads `io` (an engine's, shared with its
    /// rails).
    pub(crate) fn bind_serving(
        cfg: SessionConfig,
        peers: SharedPeerTable,
        ranges: Arc<dyn RangeLookup>,
        addr: SocketAddr,
        control: Option<Arc<dyn ControlAcceptor>>,
        io: &IoThreads,
    ) -> Result<Self, SessionError> {
        let listener = bind_backlogged(addr)?;
        let addr = listener.local_addr()?;
        let lines_per_second = cfg.refusal_logs_per_second;
        let pool = io.pool()?;
        let shared = Arc::new(Shared {
            cfg,
            peers,
            ranges,
            control,
            stop: AtomicBool::new(false),
            pool: Arc::downgrade(&pool),
            accept_calls: AtomicU64::new(0),
            live: Mutex::new(HashMap::new()),
            closed: Mutex::new(Vec::new()),
            next_conn: AtomicU64::new(1),
            accepted: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            data_requests: AtomicU64::new(0),
            data_bytes: AtomicU64::new(0),
            preauth_refused: AtomicU64::new(0),
            preauth_evicted: AtomicU64::new(0),
            sessions_evicted: AtomicU64::new(0),
            refusal_log: LogBudget::new(lines_per_second),
            session_log: LogBudget::new(lines_per_second),
            resource_log: LogBudget::new(lines_per_second),
        });
        let local = match crate::transport::local::LocalServer::start(shared.clone()) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(error = %e, "local path unavailable: cannot bind its unix socket; same-host peers will use tcp");
                None
            }
        };
        let accept = pool.watch(
            Box::new(Acceptor(TcpAccepting {
                listener,
                shared: shared.clone(),
            })),
            None,
        );
        tracing::info!(%addr, source = %shared.cfg.source_id, epoch = %shared.cfg.epoch, "listening");
        Ok(Self {
            shared,
            addr,
            accept: Some(accept),
            local,
            pool,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the local path's unix socket is up.
    pub fn serves_local(&self) -> bool {
        self.local.is_some()
    }

    /// The sessions closed so far (the last 1024), with reasons.
    pub fn closed_sessions(&self) -> Vec<ClosedSession> {
        self.shared
            .closed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Counters.
    pub fn stats(&self) -> ListenerStats {
        ListenerStats {
            accepted: self.shared.accepted.load(Ordering::Relaxed),
            admitted: self.shared.admitted.load(Ordering::Relaxed),
            refused: self.shared.refused.load(Ordering::Relaxed),
            live: self
                .shared
                .live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len() as u64,
            data_requests: self.shared.data_requests.load(Ordering::Relaxed),
            data_bytes: self.shared.data_bytes.load(Ordering::Relaxed),
            refusals_not_logged: self.shared.refusal_log.not_logged(),
            preauth_refused: self.shared.preauth_refused.load(Ordering::Relaxed),
            preauth_evicted: self.shared.preauth_evicted.load(Ordering::Relaxed),
            sessions_evicted: self.shared.sessions_evicted.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting (the listening socket is closed when this returns)
    /// and closes every session.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for c in self
            .shared
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        if let Some(key) = self.accept.take() {
            self.pool.forget(key);
        }
        if let Some(l) = self.local.take() {
            l.stop();
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Connections the kernel queues for the accept loop (capped by
/// `net.core.somaxconn`). A connection that finds the queue full loses its
/// SYN and waits a second for the kernel to send it again, so the queue
/// holds a burst of unauthenticated connections while the accept loop
/// takes them.
const ACCEPT_BACKLOG: i32 = 1024;

/// A non-blocking listening socket on `addr` with [`ACCEPT_BACKLOG`]
/// (`TcpListener::bind` queues 128).
fn bind_backlogged(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = rustix::net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    // As `TcpListener::bind` does: a restarted target binds its port again
    // while connections of the old one linger in TIME_WAIT.
    rustix::net::sockopt::set_socket_reuseaddr(&fd, true)?;
    rustix::net::bind(&fd, &addr)?;
    rustix::net::listen(&fd, ACCEPT_BACKLOG)?;
    Ok(TcpListener::from(fd))
}

/// The tcp listening socket's side of its [`Acceptor`].
struct TcpAccepting {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl Accepting for TcpAccepting {
    type Conn = (TcpStream, SocketAddr);
    const KIND: &'static str = "tcp";

    fn fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    fn accept(&mut self) -> std::io::Result<Self::Conn> {
        self.shared.accept_calls.fetch_add(1, Ordering::Relaxed);
        self.listener.accept()
    }

    fn take(&mut self, (stream, from): Self::Conn) {
        take(stream, from, &self.shared);
    }

    fn stopped(&self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }

    fn log_line(&self) -> Option<u64> {
        self.shared.resource_line_to_log()
    }
}

/// Gives an accepted connection a pre-auth slot and starts its handshake
/// on the pool's loops (it holds no thread until it is admitted).
fn take(stream: TcpStream, from: SocketAddr, shared: &Arc<Shared>) {
    shared.accepted.fetch_add(1, Ordering::Relaxed);
    // Nothing on a loop may block: refusals are sent as the socket takes
    // them.
    if let Err(e) = stream.set_nonblocking(true) {
        shared.record_close(from, None, true, format!("cannot set up the socket: {e}"));
        return;
    }
    let _ = stream.set_nodelay(true);
    let conn = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let now = Instant::now();
    {
        let mut live = shared.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(why) = preauth_slot(&shared.cfg, &mut live, from.ip(), &shared.preauth_evicted) {
            shared.preauth_refused.fetch_add(1, Ordering::Relaxed);
            drop(live);
            let mut s = stream;
            send_error(&mut s, ErrorCode::RESOURCE_EXHAUSTED, FrameType(0), why);
            shared.record_close(from, None, true, format!("refused: {why}"));
            return;
        }
        match stream.try_clone() {
            Ok(clone) => {
                live.insert(
                    conn,
                    LiveConn {
                        source: None,
                        session: None,
                        ip: from.ip(),
                        since: now,
                        stream: clone,
                        evicted: false,
                        activity: None,
                    },
                );
            }
            Err(e) => {
                shared.record_close(from, None, true, format!("cannot clone the socket: {e}"));
                return;
            }
        }
    }
    let responder = match Responder::new(&shared.cfg, now) {
        Ok(r) => r,
        Err(e) => {
            shared
                .live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&conn);
            shared.record_close(from, None, true, format!("handshake failed: {e}"));
            return;
        }
    };
    let Some(pool) = shared.pool.upgrade() else {
        shared
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&conn);
        return;
    };
    let handshaking = Box::new(Handshaking {
        stream,
        from,
        conn,
        shared: shared.clone(),
        activity: Arc::new(SessionActivity::new()),
        responder,
        want: Interest::WRITABLE,
    });
    // The challenge goes out now; the rest as the peer answers.
    if let Next::Wait(w, deadline) = handshaking.advance(now) {
        pool.watch(w, deadline);
    }
}

/// Finds room for one more unauthenticated connection from `ip`.
///
/// Unauthenticated connections have their own budget, apart from the
/// authenticated sessions' `max_sessions`, so they can never lock out a
/// peer that authenticates. One address holds at most
/// `max_unauthenticated_per_address` of them (more are refused); when all
/// `max_unauthenticated` are taken, the oldest is closed for the newcomer:
/// a legitimate peer authenticates within a round trip, long before its
/// slot becomes the oldest. A closed connection gives up its slot at once,
/// before its thread has recorded the close, so a burst of newcomers
/// closes one connection each and never holds more than the budget.
fn preauth_slot(
    cfg: &SessionConfig,
    live: &mut HashMap<u64, LiveConn>,
    ip: IpAddr,
    evicted: &AtomicU64,
) -> Result<(), &'static str> {
    let waiting = |c: &LiveConn| c.source.is_none() && !c.evicted;
    let from_ip = live.values().filter(|c| waiting(c) && c.ip == ip).count();
    if from_ip >= cfg.max_unauthenticated_per_address {
        return Err("too many unauthenticated connections from this address");
    }
    if live.values().filter(|c| waiting(c)).count() >= cfg.max_unauthenticated {
        if cfg.max_unauthenticated == 0 {
            return Err("no unauthenticated connections accepted");
        }
        if let Some(oldest) = live
            .values_mut()
            .filter(|c| waiting(c))
            .min_by_key(|c| c.since)
        {
            // Its session thread sees the socket fail and records the close.
            let _ = oldest.stream.shutdown(Shutdown::Both);
            oldest.evicted = true;
            evicted.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Finds a session slot for `conn`, now authenticated as `source` for
/// `purpose`, and takes it; says why not.
///
/// At most `max_connections_per_source` per source and `max_sessions` in
/// all. When all `max_sessions` are taken, the tcp data session idle the
/// longest (at least `evict_idle_after`, and not serving a request) gives
/// its slot up at once and says goodbye when its thread next looks;
/// rdma control links carry no requests and are never chosen. The
/// refusal names the limit and how to raise it.
fn session_slot(
    cfg: &SessionConfig,
    live: &mut HashMap<u64, LiveConn>,
    conn: u64,
    source: &SourceId,
    activity: Option<Arc<SessionActivity>>,
    evicted: &AtomicU64,
) -> Result<(), String> {
    let holds = |c: &LiveConn| c.source.is_some() && !c.evicted;
    let same = live
        .values()
        .filter(|c| holds(c) && c.source.as_ref() == Some(source))
        .count();
    if same >= cfg.max_connections_per_source {
        return Err(format!(
            "too many connections from {source}: {same} open (max_connections_per_source {}); \
             close some, or raise SessionConfig::max_connections_per_source on this target",
            cfg.max_connections_per_source
        ));
    }
    let open = live.values().filter(|c| holds(c)).count();
    if open >= cfg.max_sessions {
        let idlest = cfg.evict_idle_after.and_then(|least| {
            live.iter_mut()
                .filter(|(_, c)| holds(c))
                .filter_map(|(_, c)| {
                    let idle = c.activity.as_ref()?.idle()?;
                    (idle >= least).then_some((idle, c))
                })
                .max_by_key(|(idle, _)| *idle)
        });
        let Some((_, c)) = idlest else {
            let none_idle = match cfg.evict_idle_after {
                Some(d) => format!("no tcp data session idle for {d:?} to close for it"),
                None => "closing idle sessions for newcomers is off (evict_idle_after)".to_owned(),
            };
            return Err(format!(
                "too many sessions: {open} open (max_sessions {}), {none_idle}; try again \
                 later, or raise max_sessions on this target (SessionConfig::max_sessions; \
                 key engine.max_sessions of `orbitte serve`)",
                cfg.max_sessions
            ));
        };
        c.evicted = true;
        evicted.fetch_add(1, Ordering::Relaxed);
        if let Some(a) = &c.activity {
            a.evict();
        }
    }
    if let Some(c) = live.get_mut(&conn) {
        c.source = Some(source.clone());
        c.activity = activity;
    }
    Ok(())
}

/// A tcp connection in its handshake, on an I/O loop: its pre-auth
/// deadline is its deadline there, and refusals close it through a
/// [`Refusal`].
struct Handshaking {
    stream: TcpStream,
    from: SocketAddr,
    conn: u64,
    shared: Arc<Shared>,
    /// What the tcp data session does, from the moment it holds a slot.
    activity: Arc<SessionActivity>,
    responder: Responder,
    want: Interest,
}

impl Handshaking {
    fn advance(mut self: Box<Self>, now: Instant) -> Next {
        let Self {
            stream,
            from,
            conn,
            shared,
            activity,
            responder,
            ..
        } = &mut *self;
        let room = |identity: &orbitte_wire::Identity, purpose: SessionPurpose| {
            let mut live = shared.live.lock().unwrap_or_else(|p| p.into_inner());
            // Idle from the moment it holds a slot.
            activity.stamp();
            let data = (purpose == SessionPurpose::DATA).then(|| activity.clone());
            session_slot(
                &shared.cfg,
                &mut live,
                *conn,
                &identity.source_id,
                data,
                &shared.sessions_evicted,
            )
        };
        match responder.step(stream, &shared.cfg, &shared.peers, Some(*from), room) {
            Step::Wait(interest) => {
                self.want = interest;
                let at = self.responder.deadline();
                Next::Wait(self, Some(at))
            }
            Step::Done(hs) => {
                let Self {
                    stream,
                    from,
                    conn,
                    shared,
                    activity,
                    ..
                } = *self;
                hand_over(stream, from, conn, shared, hs, activity);
                Next::Done
            }
            Step::Refused(e) => self.refuse(e, now),
        }
    }

    /// Gives the pre-auth slot up and closes the connection once the error
    /// frame (if any) is out; a refusal before admission lingers for it.
    fn refuse(self: Box<Self>, e: SessionError, now: Instant) -> Next {
        let Self {
            stream,
            from,
            conn,
            shared,
            responder,
            ..
        } = *self;
        shared
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&conn);
        let (what, linger) = match e {
            SessionError::Auth(_) => ("initiator failed authentication", false),
            // The error frame must reach the peer before the close.
            SessionError::Limit(_) => ("refused before admission", true),
            _ => ("handshake failed", false),
        };
        let closed = move || shared.record_close(from, None, true, format!("{what}: {e}"));
        Refusal::start(stream, responder.outbox(), linger, now, Box::new(closed))
    }
}

impl Watched for Handshaking {
    fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    fn interest(&self) -> Interest {
        self.want
    }

    fn ready(self: Box<Self>, now: Instant) -> Next {
        self.advance(now)
    }

    fn expired(mut self: Box<Self>, now: Instant) -> Next {
        let e = self.responder.expired(&self.shared.peers);
        self.refuse(e, now)
    }

    fn abandoned(mut self: Box<Self>, why: &str) {
        self.responder.abandon(&self.shared.peers);
        self.shared
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.conn);
        self.shared.record_close(
            self.from,
            None,
            false,
            format!("handshake abandoned: {why}"),
        );
    }
}

/// An admitted session, on the loop that ran its handshake: the epoch
/// rule's bookkeeping, then the hand-over by purpose (a tcp data session,
/// and an rdma control link for the setup of its rails, to a thread of
/// their own; other purposes are refused).
fn hand_over(
    mut stream: TcpStream,
    from: SocketAddr,
    conn: u64,
    shared: Arc<Shared>,
    hs: handshake::Handshake,
    activity: Arc<SessionActivity>,
) {
    shared.admitted.fetch_add(1, Ordering::Relaxed);
    let source = hs.peer.source_id.clone();
    // The epoch rule's "drop old sessions".
    {
        let mut live = shared.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Admission::Replaced {
            previous,
            invalidated,
        } = &hs.admission
        {
            let mut dropped = 0;
            for c in live.values() {
                if c.session.is_some_and(|s| invalidated.sessions.contains(&s)) {
                    let _ = c.stream.shutdown(Shutdown::Both);
                    dropped += 1;
                }
            }
            if let Some(left_out) = shared.session_line_to_log() {
                tracing::info!(
                    source = %source, old_epoch = %previous, new_epoch = %hs.peer.epoch, dropped,
                    left_out, "newer epoch adopted: sessions of the old epoch closed"
                );
            }
        }
        if let Some(c) = live.get_mut(&conn) {
            c.session = Some(hs.session);
        }
    }
    let refusal = match (hs.purpose, &shared.control) {
        (SessionPurpose::DATA, _) | (SessionPurpose::RDMA_CONTROL, Some(_)) => None,
        (SessionPurpose::RDMA_CONTROL, None) => Some((
            ErrorCode::NO_USABLE_RAIL,
            "this listener serves no rdma control links".to_owned(),
        )),
        (other, _) => Some((
            ErrorCode::UNEXPECTED_FRAME,
            format!("session purpose {other} is not served here"),
        )),
    };
    let reason = match refusal {
        // Best effort, as the socket takes it: the close follows.
        Some((code, msg)) => {
            send_error(&mut stream, code, FrameType::HELLO, &msg);
            CloseReason::abnormal(msg)
        }
        None => match stream.set_nonblocking(false) {
            Err(e) => CloseReason::abnormal(format!("cannot serve the session: {e}")),
            Ok(()) => {
                let name = format!("orbitte-session-{conn}");
                let theirs = shared.clone();
                let spawned = spawn_with(name, (stream, hs, activity), move |(s, hs, a)| {
                    serve_admitted(s, from, conn, &theirs, hs, a);
                });
                let Err(((s, hs, _), e)) = spawned else {
                    return;
                };
                if let Some(left_out) = shared.resource_line_to_log() {
                    tracing::warn!(error = %e, left_out, "cannot spawn a session thread");
                }
                let reason = CloseReason::abnormal(format!("no thread to serve the session: {e}"));
                shared.close_admitted(&s, conn, from, hs.session, source, reason);
                return;
            }
        },
    };
    shared.close_admitted(&stream, conn, from, hs.session, source, reason);
}

/// Serves an admitted tcp data session or rdma control link on its own
/// thread (the socket blocks again).
fn serve_admitted(
    mut stream: TcpStream,
    from: SocketAddr,
    conn: u64,
    shared: &Arc<Shared>,
    hs: handshake::Handshake,
    activity: Arc<SessionActivity>,
) {
    let cfg = &shared.cfg;
    let source = hs.peer.source_id.clone();
    // What a session that outlives this thread closes with.
    let admitted = |stream: TcpStream| Admitted {
        stream,
        from,
        conn,
        shared: shared.clone(),
        session: hs.session,
        source: source.clone(),
    };
    let reason = if let Some(control) = &shared.control
        && hs.purpose == SessionPurpose::RDMA_CONTROL
    {
        match stream.try_clone() {
            Ok(s) => match control.serve(s, &hs) {
                ControlServed::Closed(reason) => reason,
                ControlServed::Open(link) => {
                    ControlConn::start(admitted(stream), link);
                    return;
                }
            },
            Err(e) => CloseReason {
                abnormal: true,
                text: format!("cannot clone the socket: {e}"),
            },
        }
    } else {
        // p2p metadata: our publications, then the data phase.
        let mut scratch = Vec::new();
        let mut sent = Ok(());
        for p in publication_frames(shared.ranges.as_ref(), cfg.epoch, &cfg.host_id) {
            sent = write_frame(&mut stream, &Frame::SegmentPublication(p), &mut scratch);
            if sent.is_err() {
                break;
            }
        }
        match sent {
            Err(e) => CloseReason {
                abnormal: true,
                text: format!("cannot send publications: {e}"),
            },
            Ok(()) => {
                DataSession {
                    conn: admitted(stream),
                    peer: hs.peer,
                    activity,
                }
                .start();
                return;
            }
        }
    };
    shared.close_admitted(&stream, conn, from, hs.session, source, reason);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::session::PublicationTable;
    use crate::session::io::FrameReader;
    use orbitte_wire::{Epoch, PeerTable};

    fn listener() -> Listener {
        let cfg = SessionConfig::new(
            SourceId::new("accept-target").unwrap(),
            Epoch::new(1).unwrap(),
        );
        let peers = Arc::new(Mutex::new(PeerTable::new(cfg.source_id.clone())));
        Listener::bind(
            cfg,
            peers,
            PublicationTable::new(),
            "127.0.0.1:0".parse().unwrap(),
        )
        .unwrap()
    }

    fn accept_calls(l: &Listener) -> u64 {
        l.shared.accept_calls.load(Ordering::Relaxed)
    }

    /// The accept loop waits on epoll until a connection waits: no timer
    /// wakes it in between (a loop that sleeps and retries `accept` on an empty
    /// backlog would have made a call every few milliseconds), and each
    /// connection costs one wake-up, the `accept` that takes it and at most
    /// one more that finds the backlog empty. Nothing here depends on how
    /// fast the machine is: a waiting loop makes no call however long the
    /// quiet lasts.
    #[test]
    fn the_accept_loop_runs_only_when_a_connection_waits() {
        let l = listener();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            accept_calls(&l),
            0,
            "accept called with no connection waiting"
        );
        const CONNECTIONS: u64 = 3;
        for _ in 0..CONNECTIONS {
            let mut s = TcpStream::connect(l.local_addr()).unwrap();
            let bound = Duration::from_secs(20);
            let first = FrameReader::new().read(&mut s, Some(bound), bound).unwrap();
            assert!(matches!(first, Frame::Challenge(_)), "{first:?}");
        }
        std::thread::sleep(Duration::from_millis(300));
        let calls = accept_calls(&l);
        assert!(
            (CONNECTIONS..=2 * CONNECTIONS).contains(&calls),
            "{calls} accept calls for {CONNECTIONS} connections"
        );
        assert_eq!(l.stats().accepted, CONNECTIONS);
    }

    /// A burst of connections far above `TcpListener::bind`'s queue of 128
    /// is queued by the kernel while nobody accepts: each connect
    /// completes at once (a full queue drops the SYN, and the connect
    /// would wait for its resend a second later, past the 2 s bound).
    #[test]
    fn the_kernel_queues_a_burst_of_connections_above_128() {
        const BURST: usize = 300;
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(0);
        if somaxconn < BURST {
            let why =
                format!("net.core.somaxconn is {somaxconn}, below the {BURST} this test queues");
            assert!(std::env::var_os("CI").is_none(), "{why}");
            println!("skipped: {why}");
            return;
        }
        let l = bind_backlogged("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let mut held = Vec::with_capacity(BURST);
        for i in 0..BURST {
            use rustix::net::{AddressFamily, SocketType, sockopt};
            let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
            sockopt::set_socket_timeout(&fd, sockopt::Timeout::Send, Some(Duration::from_secs(2)))
                .unwrap();
            if let Err(e) = rustix::net::connect(&fd, &addr) {
                panic!("connection {i} of {BURST} not queued: {e}");
            }
            held.push(fd);
        }
    }

    /// Stopping takes the listening socket off its loop and closes it
    /// before `shutdown` returns: a new connection is refused at once.
    #[test]
    fn shutdown_closes_the_listening_socket() {
        let l = listener();
        let addr = l.local_addr();
        l.shutdown();
        let e = TcpStream::connect(addr).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    }
}
