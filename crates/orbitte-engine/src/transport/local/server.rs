//! Target side of the local path: hands mappable ranges to authenticated
//! same-host peers over the owner's abstract unix socket.
//!
//! A mapping session lives on the listener's I/O pool
//! ([`crate::io_pool`]) from its accept to its close, on a non-blocking
//! socket, and holds no thread: the peer's credentials, the handshake
//! (with its pre-auth deadline), the handout (each range's fd with its
//! publication, then the goodbye, sent as the socket takes them within
//! the handshake's bound), then the initiator's notifications, read as
//! they arrive (a frame that starts must finish within `frame_timeout`,
//! checked every [`CHECK`]) until its goodbye or close, or the server's
//! shutdown of the socket.

use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use mio::Interest;
use orbitte_memory::HostMemory;
use orbitte_wire::{AccessFlags, ErrorCode, Frame, FrameType, GoodbyeReason, SegmentPublication};

use super::{fdpass, socket_name};
use crate::io_pool::{IoPool, Next, WatchKey, Watched};
use crate::session::accept::{Accepting, Acceptor};
use crate::session::handshake::{Responder, Step};
use crate::session::io::{FrameBuffer, send_error};
use crate::session::nonblocking::{Outbox, Refusal};
use crate::session::serving::Shared;
use crate::session::{PeerIdentity, ServedMemory, SessionError};
use crate::transport::PathKind;

/// How often a mapping session checks whether the listener stops and
/// whether a frame that started is overdue.
pub(crate) const CHECK: Duration = Duration::from_millis(200);

/// Target side: hands mappable ranges to authenticated same-host peers.
#[derive(Debug)]
pub(crate) struct LocalServer {
    /// The unix socket's place on the listener's pool.
    key: WatchKey,
    pool: Weak<IoPool>,
    /// A duplicate of every open mapping session's socket, by session
    /// number, shut down when the server stops: the initiator's watch on
    /// its end then sees the hang-up at once, so no copy into a mapping
    /// the target no longer serves is reported delivered.
    sessions: Arc<Sessions>,
}

/// The open mapping sessions of a local server.
#[derive(Debug, Default)]
struct Sessions {
    next: std::sync::atomic::AtomicU64,
    open: std::sync::Mutex<crate::Map<u64, UnixStream>>,
}

impl Sessions {
    /// Keeps a duplicate of `s` under a fresh number (none if it cannot
    /// be duplicated: the session still runs, and ends on its own).
    fn open(&self, s: &UnixStream) -> Option<u64> {
        let dup = s.try_clone().ok()?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, dup);
        Some(id)
    }

    fn close(&self, id: Option<u64>) {
        if let Some(id) = id {
            self.open
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        }
    }

    /// Shuts every open session down, both ways.
    fn shut_all(&self) {
        for s in self.open.lock().unwrap_or_else(|p| p.into_inner()).values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl LocalServer {
    /// Binds the local path's unix socket and accepts on the listener's
    /// I/O pool.
    pub(crate) fn start(shared: Arc<Shared>) -> std::io::Result<Self> {
        let name = socket_name(&shared.cfg.source_id, shared.cfg.epoch);
        let addr = UnixAddr::from_abstract_name(name.as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)?;
        listener.set_nonblocking(true)?;
        let pool = shared
            .pool
            .upgrade()
            .ok_or_else(|| std::io::Error::other("the listener's i/o threads stopped"))?;
        let sessions = Arc::new(Sessions::default());
        let key = pool.watch(
            Box::new(Acceptor(LocalAccepting {
                listener,
                shared,
                sessions: sessions.clone(),
                live: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            })),
            None,
        );
        tracing::debug!(%name, "local path serving");
        Ok(Self {
            key,
            pool: Arc::downgrade(&pool),
            sessions,
        })
    }

    /// Stops accepting (the unix socket is closed when this returns) and
    /// ends every open mapping session.
    pub(crate) fn stop(self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.forget(self.key);
        }
        self.sessions.shut_all();
    }
}

/// The local path's unix socket on its [`Acceptor`].
struct LocalAccepting {
    listener: UnixListener,
    shared: Arc<Shared>,
    sessions: Arc<Sessions>,
    /// Mapping sessions open now.
    live: Arc<std::sync::atomic::AtomicUsize>,
}

impl Accepting for LocalAccepting {
    type Conn = UnixStream;
    const KIND: &'static str = "local";

    fn fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    fn accept(&mut self) -> std::io::Result<UnixStream> {
        self.listener.accept().map(|(s, _)| s)
    }

    fn take(&mut self, s: UnixStream) {
        let shared = &self.shared;
        // Same bound as tcp sessions: a local flood of connections cannot
        // hold unbounded descriptors.
        if self.live.load(Ordering::Acquire) >= shared.cfg.max_sessions {
            if let Some(left_out) = shared.refusal_to_log() {
                tracing::warn!(
                    max = shared.cfg.max_sessions,
                    left_out,
                    "local session refused: too many open"
                );
            }
            return;
        }
        self.live.fetch_add(1, Ordering::AcqRel);
        let id = self.sessions.open(&s);
        let release = Release {
            sessions: self.sessions.clone(),
            id,
            live: self.live.clone(),
        };
        if let Next::Wait(w, deadline) = open_session(s, shared, release, Instant::now())
            && let Some(pool) = shared.pool.upgrade()
        {
            pool.watch(w, deadline);
        }
    }

    fn stopped(&self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }

    fn log_line(&self) -> Option<u64> {
        self.shared.resource_line_to_log()
    }
}

/// An fd a peer may map, allowing at most what the range allows.
///
/// A writable range: the memfd itself. A read-only range: first the memfd
/// is sealed against every new writable mapping and every write
/// (`F_SEAL_FUTURE_WRITE`: the owner's own mapping stays writable, but no
/// process can make a writable shared mapping of the file again, not even
/// through a read-write reopen of `/proc/PID/fd/N`, and the seal cannot be
/// removed), its mode becomes owner-read-only (another uid cannot reopen
/// it at all), then a read-only reopen is handed out. A writable range
/// whose memfd carries the seal (the same memory also published
/// read-only) is not mappable ([`Published::is_mappable`](crate::session::publications::Published::is_mappable)).
pub(crate) fn handout_fd(mem: &HostMemory, writable: bool) -> std::io::Result<OwnedFd> {
    let fd = mem
        .memfd()
        .ok_or_else(|| std::io::Error::other("memory has no memfd"))?;
    if writable {
        return fd.try_clone_to_owned();
    }
    rustix::fs::fcntl_add_seals(fd, rustix::fs::SealFlags::FUTURE_WRITE)?;
    rustix::fs::fchmod(fd, rustix::fs::Mode::RUSR)?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    Ok(f.into())
}

/// Why a process at the other end of a local session may not map this
/// engine's memory: without a cluster secret only processes of this
/// engine's uid may (with one, or with an access key, the handshake's
/// proof decides).
fn mapping_refusal(s: &UnixStream, with_secret: bool) -> Option<String> {
    if with_secret {
        return None;
    }
    let ours = rustix::process::geteuid().as_raw();
    match rustix::net::sockopt::socket_peercred(s) {
        Ok(c) if c.uid.as_raw() == ours => None,
        Ok(c) => Some(format!(
            "local mapping refused: the peer process {} runs as uid {}, this engine as uid {ours}, \
             and no cluster secret is set; run both as the same user or set the cluster secret on both",
            c.pid.as_raw_pid(),
            c.uid.as_raw()
        )),
        Err(e) => Some(format!(
            "local mapping refused: the peer's credentials are unknown ({e})"
        )),
    }
}

/// What an open mapping session gives back when it ends: its place among
/// the server's open sessions and its count.
#[derive(Debug)]
struct Release {
    sessions: Arc<Sessions>,
    id: Option<u64>,
    live: Arc<std::sync::atomic::AtomicUsize>,
}

impl Release {
    fn release(self) {
        self.sessions.close(self.id);
        self.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts a mapping session on an accepted connection: the peer's
/// credentials, then its handshake on the pool's loops. Returns what a
/// loop does with it next.
fn open_session(s: UnixStream, shared: &Arc<Shared>, release: Release, now: Instant) -> Next {
    let refuse = |s: UnixStream, out: Outbox, release: Release| {
        Refusal::start(s, out, false, now, Box::new(move || release.release()))
    };
    if let Err(e) = s.set_nonblocking(true) {
        if let Some(left_out) = shared.resource_line_to_log() {
            tracing::warn!(error = %e, left_out, "local session refused: cannot set up its socket");
        }
        release.release();
        return Next::Done;
    }
    if let Some(why) = mapping_refusal(&s, shared.cfg.listen_key().is_some()) {
        let mut out = Outbox::default();
        out.push_error(ErrorCode::AUTH_REQUIRED, FrameType::HELLO, &why);
        if let Some(left_out) = shared.refusal_to_log() {
            tracing::warn!(left_out, "{why}");
        }
        return refuse(s, out, release);
    }
    match Responder::new(&shared.cfg, now) {
        Ok(responder) => Box::new(Handshaking {
            s,
            shared: shared.clone(),
            release,
            responder,
            want: Interest::WRITABLE,
        })
        .advance(now),
        Err(e) => {
            if let Some(left_out) = shared.refusal_to_log() {
                tracing::warn!(error = %e, left_out, "local session refused");
            }
            refuse(s, Outbox::default(), release)
        }
    }
}

/// A mapping session in its handshake, on an I/O loop.
struct Handshaking {
    s: UnixStream,
    shared: Arc<Shared>,
    release: Release,
    responder: Responder,
    want: Interest,
}

impl Handshaking {
    fn advance(mut self: Box<Self>, now: Instant) -> Next {
        let cfg = &self.shared.cfg;
        match self
            .responder
            .step(&mut self.s, cfg, &self.shared.peers, None, |_, _| Ok(()))
        {
            Step::Wait(interest) => {
                self.want = interest;
                let at = self.responder.deadline();
                Next::Wait(self, Some(at))
            }
            Step::Done(hs) => {
                let Self {
                    s, shared, release, ..
                } = *self;
                let session = MappingSession {
                    s,
                    shared,
                    peer: hs.peer,
                    session: hs.session,
                    handed: 0,
                    frames: None,
                    release,
                };
                match handout(&session.shared) {
                    Ok(msgs) => Box::new(Handout {
                        deadline: now + cfg_bound(&session.shared),
                        session,
                        msgs,
                        sent: 0,
                    })
                    .advance(now),
                    Err(e) => {
                        session.finish(Err(e));
                        Next::Done
                    }
                }
            }
            Step::Refused(e) => self.refuse(e, now),
        }
    }

    fn refuse(self: Box<Self>, e: SessionError, now: Instant) -> Next {
        if let Some(left_out) = self.shared.refusal_to_log() {
            tracing::warn!(error = %e, left_out, "local session refused");
        }
        let Self {
            s,
            release,
            responder,
            ..
        } = *self;
        Refusal::start(
            s,
            responder.outbox(),
            false,
            now,
            Box::new(move || release.release()),
        )
    }
}

/// How long the handout may take to leave: the handshake's bound.
fn cfg_bound(shared: &Shared) -> Duration {
    shared.cfg.handshake_timeout.min(shared.cfg.preauth_timeout)
}

impl Watched for Handshaking {
    fn fd(&self) -> RawFd {
        self.s.as_raw_fd()
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

    fn abandoned(mut self: Box<Self>, _why: &str) {
        self.responder.abandon(&self.shared.peers);
        self.release.release();
    }
}

/// One message of a handout: its bytes, and the fd that goes with the
/// first of them until it went.
type Message = (Vec<u8>, Option<OwnedFd>);

/// The handout's messages: one `segment-publication` with its fd per
/// mappable range, then the goodbye.
fn handout(shared: &Shared) -> Result<VecDeque<Message>, SessionError> {
    let cfg = &shared.cfg;
    let mut msgs = VecDeque::new();
    for (id, p) in shared.ranges.published() {
        // GPU memory is never mappable: a same-host peer reaches it over tcp.
        let ServedMemory::Host(memory) = &p.memory else {
            continue;
        };
        if !p.is_mappable() {
            continue;
        }
        let writable = p.access.contains(AccessFlags::REMOTE_WRITE);
        let fd = handout_fd(memory, writable)?;
        let desc =
            crate::session::publications::descriptor(id, &p, &cfg.host_id, shared.ranges.rkeys(id));
        let frame = Frame::SegmentPublication(SegmentPublication {
            epoch: cfg.epoch,
            ranges: vec![desc],
        });
        let mut bytes = Vec::new();
        frame.encode(&mut bytes)?;
        msgs.push_back((bytes, Some(fd)));
    }
    let bye = Frame::Goodbye(orbitte_wire::Goodbye {
        reason: GoodbyeReason::NORMAL,
        message: orbitte_wire::Message::truncating("all mappable ranges sent"),
    });
    let mut bytes = Vec::new();
    bye.encode(&mut bytes)?;
    msgs.push_back((bytes, None));
    Ok(msgs)
}

/// A mapping session's handout leaving as the socket takes it, on an I/O
/// loop, within the handshake's bound.
struct Handout {
    session: MappingSession,
    msgs: VecDeque<Message>,
    /// Bytes of the first message sent.
    sent: usize,
    deadline: Instant,
}

impl Handout {
    fn advance(mut self: Box<Self>, now: Instant) -> Next {
        loop {
            match self.send() {
                Ok(true) => {}
                Ok(false) => {
                    let at = self.deadline;
                    return Next::Wait(self, Some(at));
                }
                Err(e) => {
                    self.session.finish(Err(e.into()));
                    return Next::Done;
                }
            }
            if self.msgs.is_empty() {
                // Handed out: the session waits for notifications.
                return Next::Wait(Box::new(self.session), Some(now + CHECK));
            }
        }
    }

    /// Sends what the socket takes of the first message; `Ok(true)`: it
    /// is all sent (or there was none).
    fn send(&mut self) -> std::io::Result<bool> {
        let Some((bytes, fd)) = self.msgs.front_mut() else {
            return Ok(true);
        };
        while self.sent < bytes.len() {
            let rest = &bytes[self.sent..];
            let sent = match fd.take() {
                Some(f) => match fdpass::send_with_fd_now(&self.session.s, rest, f.as_fd()) {
                    Err(e) => {
                        *fd = Some(f);
                        Err(e)
                    }
                    ok => {
                        self.session.handed += 1;
                        ok
                    }
                },
                None => (&self.session.s).write(rest),
            };
            match sent {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        self.msgs.pop_front();
        self.sent = 0;
        Ok(true)
    }
}

impl Watched for Handout {
    fn fd(&self) -> RawFd {
        self.session.s.as_raw_fd()
    }

    fn interest(&self) -> Interest {
        Interest::WRITABLE
    }

    fn ready(self: Box<Self>, now: Instant) -> Next {
        self.advance(now)
    }

    fn expired(self: Box<Self>, _now: Instant) -> Next {
        self.session.finish(Err(SessionError::Timeout {
            what: "room for the handout",
        }));
        Next::Done
    }

    fn abandoned(self: Box<Self>, _why: &str) {
        self.session.finish(Ok(()));
    }
}

/// How many reads one readiness of a mapping session makes at most before
/// the loop's other descriptors get their turn (the registration is
/// level-triggered: it is called again for the rest).
const READS_PER_TURN: usize = 16;

/// A mapping session after its handout, on an I/O loop, carrying the
/// initiator's notifications.
#[derive(Debug)]
struct MappingSession {
    s: UnixStream,
    shared: Arc<Shared>,
    peer: PeerIdentity,
    session: orbitte_wire::SessionId,
    /// Ranges handed out.
    handed: usize,
    /// A frame that started and is not complete yet (`None` between
    /// frames: an idle session holds no buffer).
    frames: Option<FrameBuffer>,
    release: Release,
}

impl MappingSession {
    fn finish(self, result: Result<(), SessionError>) {
        self.shared
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .session_closed(self.session);
        match result {
            Ok(()) => {
                if let Some(left_out) = self.shared.session_line_to_log() {
                    tracing::info!(peer = %self.peer.source_id, handed = self.handed, left_out, "local mappings handed out");
                }
            }
            Err(e) => {
                if let Some(left_out) = self.shared.refusal_to_log() {
                    tracing::warn!(peer = %self.peer.source_id, error = %e, left_out, "local session failed");
                }
            }
        }
        self.release.release();
    }

    /// Takes the frames that arrived; `false`: the session ended.
    fn receive(&mut self) -> bool {
        let mut frames = self.frames.take().unwrap_or_default();
        for _ in 0..READS_PER_TURN {
            match frames.fill(&self.s, true) {
                Ok(0) => return false,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::debug!(peer = %self.peer.source_id, error = %e, "local session ended");
                    return false;
                }
            }
            loop {
                match frames.next() {
                    Ok(Some(frame)) => {
                        if !self.take(frame) {
                            return false;
                        }
                    }
                    Ok(None) => break,
                    Err(SessionError::Malformed(e)) => {
                        send_error(&mut self.s, e.error_code(), e.frame, &e.to_string());
                        if let Some(left_out) = self.shared.refusal_to_log() {
                            tracing::warn!(peer = %self.peer.source_id, error = %e, left_out, "malformed frame on a local session");
                        }
                        return false;
                    }
                    Err(e) => {
                        tracing::debug!(peer = %self.peer.source_id, error = %e, "local session ended");
                        return false;
                    }
                }
            }
        }
        if !frames.is_empty() {
            self.frames = Some(frames);
        }
        true
    }

    /// After the handout the initiator keeps the session open to send
    /// `notification` frames (the local path's notifications, each sent
    /// after the copies of its batch into the shared mapping finished);
    /// queues one. `false`: the session ends (a goodbye, or a frame not
    /// allowed here).
    fn take(&mut self, frame: Frame) -> bool {
        let shared = &self.shared;
        match frame {
            Frame::Notification(n) => {
                // The epoch rule on every notification: a newer incarnation
                // of the source may have been admitted since.
                let current = shared
                    .peers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .epoch_of(&self.peer.source_id);
                if current != Some(self.peer.epoch) {
                    send_error(
                        &mut self.s,
                        ErrorCode::STALE_EPOCH,
                        FrameType::NOTIFICATION,
                        "the session's epoch is superseded",
                    );
                    return false;
                }
                let answer = shared.ranges.notification(&self.peer, PathKind::Local, n);
                // The initiator reads each answer before it sends the next
                // notification: the socket always has room for it.
                let mut scratch = Vec::new();
                let frame = Frame::NotificationAnswer(answer);
                if let Err(e) = crate::session::io::write_frame(&mut self.s, &frame, &mut scratch) {
                    tracing::debug!(peer = %self.peer.source_id, error = %e, "answering a notification failed; the session ends");
                    return false;
                }
                true
            }
            Frame::Goodbye(_) => false,
            other => {
                let msg = format!(
                    "{} is not allowed on a local session after the handout",
                    other.frame_type()
                );
                send_error(
                    &mut self.s,
                    ErrorCode::UNEXPECTED_FRAME,
                    other.frame_type(),
                    &msg,
                );
                if let Some(left_out) = shared.refusal_to_log() {
                    tracing::warn!(peer = %self.peer.source_id, left_out, "{msg}");
                }
                false
            }
        }
    }
}

impl Watched for MappingSession {
    fn fd(&self) -> RawFd {
        self.s.as_raw_fd()
    }

    fn ready(mut self: Box<Self>, now: Instant) -> Next {
        if self.shared.stop.load(Ordering::Acquire) || !self.receive() {
            self.finish(Ok(()));
            return Next::Done;
        }
        Next::Wait(self, Some(now + CHECK))
    }

    fn expired(self: Box<Self>, now: Instant) -> Next {
        if self.shared.stop.load(Ordering::Acquire) {
            self.finish(Ok(()));
            return Next::Done;
        }
        let frame_timeout = self.shared.cfg.frame_timeout;
        if self
            .frames
            .as_ref()
            .is_some_and(|f| f.overdue(frame_timeout))
        {
            self.finish(Err(SessionError::Timeout {
                what: "the rest of a frame (truncated frame)",
            }));
            return Next::Done;
        }
        Next::Wait(self, Some(now + CHECK))
    }

    fn abandoned(self: Box<Self>, _why: &str) {
        self.finish(Ok(()));
    }
}
