//! Target side of the local path: hands mappable ranges to authenticated
//! same-host peers over the owner's abstract unix socket.
//!
//! After the handout the session stays open for the initiator's
//! notifications. A session quiet for [`CHECK`] parks on the listener's
//! I/O pool ([`crate::io_pool`]) and gives its thread up; the first byte
//! from the initiator (a notification, its goodbye or close, or the
//! server's shutdown of the socket) hands it to a new thread.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use orbitte_memory::HostMemory;
use orbitte_wire::{AccessFlags, ErrorCode, Frame, GoodbyeReason, SegmentPublication};

use super::{fdpass, socket_name};
use crate::io_pool::{IoPool, Next, WatchKey, Watched, spawn_with};
use crate::session::accept::{Accepting, Acceptor};
use crate::session::io::{FrameReader, send_error, write_frame};
use crate::session::serving::Shared;
use crate::session::{PeerIdentity, SessionError, handshake};
use crate::transport::PathKind;

/// How long a mapping session waits for a notification on its thread
/// before it parks, and how often a parked one checks whether the
/// listener stops.
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
        // make unbounded threads.
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
        let sh = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("orbitte-local-session".into())
            .spawn(move || serve_local(s, &sh, release));
        if spawned.is_err() {
            self.sessions.close(id);
            self.live.fetch_sub(1, Ordering::AcqRel);
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
/// engine's uid may (with one, the handshake's proof decides).
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

fn serve_local(mut s: UnixStream, shared: &Arc<Shared>, release: Release) {
    let cfg = &shared.cfg;
    if let Some(why) = mapping_refusal(&s, cfg.cluster_secret.is_some()) {
        send_error(
            &mut s,
            ErrorCode::AUTH_REQUIRED,
            orbitte_wire::FrameType::HELLO,
            &why,
        );
        if let Some(left_out) = shared.refusal_to_log() {
            tracing::warn!(left_out, "{why}");
        }
        return release.release();
    }
    let hs = match handshake::accept(&mut s, cfg, &shared.peers, None) {
        Ok(h) => h,
        Err(e) => {
            if let Some(left_out) = shared.refusal_to_log() {
                tracing::warn!(error = %e, left_out, "local session refused");
            }
            return release.release();
        }
    };
    let mut scratch = Vec::new();
    let mut handed = 0usize;
    let result = (|| -> Result<(), SessionError> {
        for (id, p) in shared.ranges.published() {
            let crate::session::publications::ServedMemory::Host(memory) = &p.memory else {
                continue;
            };
            if !p.is_mappable() {
                continue;
            }
            let writable = p.access.contains(AccessFlags::REMOTE_WRITE);
            let fd = handout_fd(memory, writable)?;
            let desc = crate::session::publications::descriptor(
                id,
                &p,
                &cfg.host_id,
                shared.ranges.rkeys(id),
            );
            let frame = Frame::SegmentPublication(SegmentPublication {
                epoch: cfg.epoch,
                ranges: vec![desc],
            });
            scratch.clear();
            frame
                .encode(&mut scratch)
                .map_err(|e| SessionError::Protocol(e.to_string()))?;
            fdpass::send_with_fd(&s, &scratch, fd.as_fd())?;
            handed += 1;
        }
        let bye = Frame::Goodbye(orbitte_wire::Goodbye {
            reason: GoodbyeReason::NORMAL,
            message: orbitte_wire::Message::truncating("all mappable ranges sent"),
        });
        write_frame(&mut s, &bye, &mut scratch)?;
        s.flush()?;
        Ok(())
    })();
    let session = MappingSession {
        s,
        shared: shared.clone(),
        peer: hs.peer,
        session: hs.session,
        handed,
        release,
    };
    match result {
        Ok(()) => session.run(),
        Err(e) => session.finish(Err(e)),
    }
}

/// A mapping session after its handout, carrying the initiator's
/// notifications: on a thread while they come, parked on the pool while
/// quiet.
#[derive(Debug)]
struct MappingSession {
    s: UnixStream,
    shared: Arc<Shared>,
    peer: PeerIdentity,
    session: orbitte_wire::SessionId,
    /// Ranges handed out.
    handed: usize,
    release: Release,
}

impl MappingSession {
    /// Receives notifications until the session ends, or parks it once
    /// quiet.
    fn run(mut self) {
        match receive_notifications(&mut self.s, &self.shared, &self.peer) {
            Received::Ended => self.finish(Ok(())),
            Received::Quiet => match self.shared.pool.upgrade() {
                Some(pool) => {
                    pool.watch(Box::new(self), Some(Instant::now() + CHECK));
                }
                None => self.finish(Ok(())),
            },
        }
    }

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
}

impl Watched for MappingSession {
    fn fd(&self) -> RawFd {
        self.s.as_raw_fd()
    }

    fn ready(self: Box<Self>, _now: Instant) -> Next {
        if self.shared.stop.load(Ordering::Acquire) {
            self.finish(Ok(()));
            return Next::Done;
        }
        if let Err((m, e)) = spawn_with("orbitte-local-session".into(), *self, Self::run) {
            m.finish(Err(SessionError::Io(e)));
        }
        Next::Done
    }

    fn expired(self: Box<Self>, now: Instant) -> Next {
        if self.shared.stop.load(Ordering::Acquire) {
            self.finish(Ok(()));
            return Next::Done;
        }
        Next::Wait(self, Some(now + CHECK))
    }

    fn abandoned(self: Box<Self>, _why: &str) {
        self.finish(Ok(()));
    }
}

/// How [`receive_notifications`] returned.
enum Received {
    /// The session ended (the initiator left, misbehaved, or the listener
    /// stops).
    Ended,
    /// Nothing arrived for [`CHECK`] and nothing is buffered.
    Quiet,
}

/// After the handout the initiator keeps the session open to send
/// `notification` frames (the local path's notifications, each sent after
/// the copies of its batch into the shared mapping finished); queues them
/// until the initiator closes the session or the listener stops.
fn receive_notifications(s: &mut UnixStream, shared: &Shared, peer: &PeerIdentity) -> Received {
    let mut reader = FrameReader::new();
    loop {
        match reader.read(s, Some(CHECK), shared.cfg.frame_timeout) {
            Ok(Frame::Notification(n)) => {
                // The epoch rule on every notification: a newer incarnation
                // of the source may have been admitted since.
                let current = shared
                    .peers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .epoch_of(&peer.source_id);
                if current != Some(peer.epoch) {
                    send_error(
                        s,
                        ErrorCode::STALE_EPOCH,
                        orbitte_wire::FrameType::NOTIFICATION,
                        "the session's epoch is superseded",
                    );
                    return Received::Ended;
                }
                shared.ranges.notification(peer, PathKind::Local, n);
            }
            Ok(Frame::Goodbye(_)) | Err(SessionError::Closed { .. }) => return Received::Ended,
            Ok(other) => {
                let msg = format!(
                    "{} is not allowed on a local session after the handout",
                    other.frame_type()
                );
                send_error(s, ErrorCode::UNEXPECTED_FRAME, other.frame_type(), &msg);
                if let Some(left_out) = shared.refusal_to_log() {
                    tracing::warn!(peer = %peer.source_id, left_out, "{msg}");
                }
                return Received::Ended;
            }
            Err(SessionError::Idle) => {
                if shared.stop.load(Ordering::Acquire) {
                    return Received::Ended;
                }
                return Received::Quiet;
            }
            Err(SessionError::Malformed(e)) => {
                send_error(s, e.error_code(), e.frame, &e.to_string());
                if let Some(left_out) = shared.refusal_to_log() {
                    tracing::warn!(peer = %peer.source_id, error = %e, left_out, "malformed frame on a local session");
                }
                return Received::Ended;
            }
            Err(e) => {
                tracing::debug!(peer = %peer.source_id, error = %e, "local session ended");
                return Received::Ended;
            }
        }
    }
}
