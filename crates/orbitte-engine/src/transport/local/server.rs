//! Target side of the local path: hands mappable ranges to authenticated
//! same-host peers over the owner's abstract unix socket.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use orbitte_memory::HostMemory;
use orbitte_wire::{AccessFlags, ErrorCode, Frame, GoodbyeReason, SegmentPublication};

use super::{fdpass, socket_name};
use crate::session::accept::{self, StopSignal};
use crate::session::io::{FrameReader, send_error, write_frame};
use crate::session::{PeerIdentity, SessionError, handshake};
use crate::transport::PathKind;

/// Target side: hands mappable ranges to authenticated same-host peers.
#[derive(Debug)]
pub(crate) struct LocalServer {
    stop: Arc<StopSignal>,
    thread: Option<JoinHandle<()>>,
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
    pub(crate) fn start(shared: Arc<crate::session::serving::Shared>) -> std::io::Result<Self> {
        let name = socket_name(&shared.cfg.source_id, shared.cfg.epoch);
        let addr = UnixAddr::from_abstract_name(name.as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(StopSignal::new()?);
        let st = stop.clone();
        let sessions = Arc::new(Sessions::default());
        let open = sessions.clone();
        let thread = std::thread::Builder::new()
            .name("orbitte-local-accept".into())
            .spawn(move || {
                let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
                accept::serve(
                    "local",
                    &listener,
                    &[&st, &shared.stopping],
                    &shared.stop,
                    || shared.resource_line_to_log(),
                    || listener.accept(),
                    |(s, _)| {
                        // Same bound as tcp sessions: a local flood of
                        // connections cannot make unbounded threads.
                        if live.load(Ordering::Acquire) >= shared.cfg.max_sessions {
                            if let Some(left_out) = shared.refusal_to_log() {
                                tracing::warn!(
                                    max = shared.cfg.max_sessions,
                                    left_out,
                                    "local session refused: too many open"
                                );
                            }
                            return;
                        }
                        live.fetch_add(1, Ordering::AcqRel);
                        let (sh, lv, ss) = (shared.clone(), live.clone(), open.clone());
                        let id = open.open(&s);
                        let spawned = std::thread::Builder::new()
                            .name("orbitte-local-session".into())
                            .spawn(move || {
                                serve_local(s, &sh);
                                ss.close(id);
                                lv.fetch_sub(1, Ordering::AcqRel);
                            });
                        if spawned.is_err() {
                            open.close(id);
                            live.fetch_sub(1, Ordering::AcqRel);
                        }
                    },
                );
            })?;
        tracing::debug!(%name, "local path serving");
        Ok(Self {
            stop,
            thread: Some(thread),
            sessions,
        })
    }

    /// Stops accepting and ends every open mapping session.
    pub(crate) fn stop(mut self) {
        self.stop.raise();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.sessions.shut_all();
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

fn serve_local(mut s: UnixStream, shared: &crate::session::serving::Shared) {
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
        return;
    }
    let hs = match handshake::accept(&mut s, cfg, &shared.peers, None) {
        Ok(h) => h,
        Err(e) => {
            if let Some(left_out) = shared.refusal_to_log() {
                tracing::warn!(error = %e, left_out, "local session refused");
            }
            return;
        }
    };
    let mut scratch = Vec::new();
    let mut handed = 0usize;
    let result = (|| -> Result<(), SessionError> {
        for (id, p) in shared.ranges.published() {
            if !p.is_mappable() {
                continue;
            }
            let writable = p.access.contains(AccessFlags::REMOTE_WRITE);
            let fd = handout_fd(&p.memory, writable)?;
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
    if result.is_ok() {
        receive_notifications(&mut s, shared, &hs.peer);
    }
    shared
        .peers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .session_closed(hs.session);
    match result {
        Ok(()) => {
            if let Some(left_out) = shared.session_line_to_log() {
                tracing::info!(peer = %hs.peer.source_id, handed, left_out, "local mappings handed out");
            }
        }
        Err(e) => {
            if let Some(left_out) = shared.refusal_to_log() {
                tracing::warn!(peer = %hs.peer.source_id, error = %e, left_out, "local session failed");
            }
        }
    }
}

/// After the handout the initiator keeps the session open to send
/// `notification` frames (the local path's notifications, each sent after
/// the copies of its batch into the shared mapping finished); queues them
/// until the initiator closes the session or the listener stops.
fn receive_notifications(
    s: &mut UnixStream,
    shared: &crate::session::serving::Shared,
    peer: &PeerIdentity,
) {
    let mut reader = FrameReader::new();
    loop {
        match reader.read(
            s,
            Some(Duration::from_millis(200)),
            shared.cfg.frame_timeout,
        ) {
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
                    return;
                }
                shared.ranges.notification(peer, PathKind::Local, n);
            }
            Ok(Frame::Goodbye(_)) | Err(SessionError::Closed { .. }) => return,
            Ok(other) => {
                let msg = format!(
                    "{} is not allowed on a local session after the handout",
                    other.frame_type()
                );
                send_error(s, ErrorCode::UNEXPECTED_FRAME, other.frame_type(), &msg);
                if let Some(left_out) = shared.refusal_to_log() {
                    tracing::warn!(peer = %peer.source_id, left_out, "{msg}");
                }
                return;
            }
            Err(SessionError::Idle) => {
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
            }
            Err(SessionError::Malformed(e)) => {
                send_error(s, e.error_code(), e.frame, &e.to_string());
                if let Some(left_out) = shared.refusal_to_log() {
                    tracing::warn!(peer = %peer.source_id, error = %e, left_out, "malformed frame on a local session");
                }
                return;
            }
            Err(e) => {
                tracing::debug!(peer = %peer.source_id, error = %e, "local session ended");
                return;
            }
        }
    }
}
