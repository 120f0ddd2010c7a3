//! Target side of the tcp path: serves READ and WRITE requests of one
//! session against the published ranges.
//!
//! Every request is checked before any byte of registered memory is
//! touched: the session's epoch must still be the source's authoritative
//! one, the range must be published, the token must match, the access must
//! allow the operation and `offset + length` must lie inside the range.
//! Otherwise the answer carries the failing status (and a refused WRITE's
//! payload is read and dropped, never written).

use std::io::Write;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use orbitte_wire::{
    AccessFlags, AccessToken, ErrorCode, Frame, FrameType, GoodbyeReason, RangeId, ReadResponse,
    SessionId, Status, WriteResponse,
};

use super::payload::PayloadIo;
use crate::session::io::{FrameReader, send_error, write_frame};
use crate::session::{
    PeerIdentity, Published, RangeLookup, SessionConfig, SessionError, SharedPeerTable,
};

/// How often a quiet connection checks whether the listener shuts down.
const POLL: Duration = Duration::from_millis(200);

/// Why a served session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CloseReason {
    /// Whether it is worth a warning (the peer misbehaved or a bound hit).
    pub(crate) abnormal: bool,
    /// Text for the log and the records.
    pub(crate) text: String,
}

impl CloseReason {
    fn normal(text: impl Into<String>) -> Self {
        Self {
            abnormal: false,
            text: text.into(),
        }
    }
    fn abnormal(text: impl Into<String>) -> Self {
        Self {
            abnormal: true,
            text: text.into(),
        }
    }
}

pub(crate) struct ServeCtx<'a> {
    pub(crate) cfg: &'a SessionConfig,
    pub(crate) peers: &'a SharedPeerTable,
    pub(crate) ranges: &'a dyn RangeLookup,
    pub(crate) peer: &'a PeerIdentity,
    pub(crate) session: SessionId,
    pub(crate) stop: &'a AtomicBool,
    pub(crate) requests: &'a std::sync::atomic::AtomicU64,
    pub(crate) bytes: &'a std::sync::atomic::AtomicU64,
}

/// Sends `bytes` with MSG_MORE so the payload that follows shares packets.
pub(crate) fn send_more(sock: &TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    use rustix::net::SendFlags;
    while !bytes.is_empty() {
        match rustix::net::send(sock.as_fd(), bytes, SendFlags::MORE | SendFlags::NOSIGNAL) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => return Err(std::io::ErrorKind::TimedOut.into()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn check(
    ranges: &dyn RangeLookup,
    range: RangeId,
    token: AccessToken,
    offset: u64,
    length: u32,
    need: AccessFlags,
) -> Result<Published, Status> {
    let p = ranges.lookup(range).ok_or(Status::UNKNOWN_RANGE)?;
    if p.token != token {
        return Err(Status::BAD_TOKEN);
    }
    if !p.access.contains(need) {
        return Err(Status::ACCESS_DENIED);
    }
    match offset.checked_add(u64::from(length)) {
        Some(end) if end <= p.length => Ok(p),
        _ => Err(Status::OUT_OF_BOUNDS),
    }
}

/// Serves requests until the session ends; returns why.
pub(crate) fn serve(stream: &mut TcpStream, ctx: &ServeCtx<'_>) -> CloseReason {
    let cfg = ctx.cfg;
    let mut reader = FrameReader::new();
    let mut scratch = Vec::with_capacity(64);
    let mut io = PayloadIo::new(cfg.zero_copy);
    let mut last_request = Instant::now();
    if let Err(e) = stream.set_write_timeout(Some(cfg.io_timeout)) {
        return CloseReason::abnormal(format!("cannot set the write timeout: {e}"));
    }
    loop {
        let frame = match reader.read(stream, Some(POLL), cfg.frame_timeout) {
            Ok(f) => f,
            Err(SessionError::Idle) => {
                if ctx.stop.load(Ordering::Acquire) {
                    let _ = goodbye(stream, GoodbyeReason::SHUTDOWN, "listener shutting down");
                    return CloseReason::normal("listener shut down");
                }
                if let Some(idle) = cfg.idle_timeout
                    && last_request.elapsed() >= idle
                {
                    let _ = goodbye(stream, GoodbyeReason::IDLE, "idle");
                    return CloseReason::normal(format!("idle for {idle:?}"));
                }
                continue;
            }
            Err(SessionError::Malformed(e)) => {
                send_error(stream, e.error_code(), e.frame, &e.to_string());
                return CloseReason::abnormal(format!("malformed frame: {e}"));
            }
            Err(SessionError::Timeout { what }) => {
                send_error(
                    stream,
                    ErrorCode::TIMEOUT,
                    FrameType(0),
                    "frame not completed in time",
                );
                return CloseReason::abnormal(format!(
                    "peer did not complete {what} within {:?}",
                    cfg.frame_timeout
                ));
            }
            Err(SessionError::Closed { .. }) => {
                return CloseReason::normal("peer closed the connection");
            }
            Err(e) => return CloseReason::abnormal(format!("connection failed: {e}")),
        };
        last_request = Instant::now();
        // The epoch rule on every request: a newer incarnation of the
        // source may have been admitted since this session opened.
        let current = ctx
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .epoch_of(&ctx.peer.source_id);
        if current != Some(ctx.peer.epoch) {
            let msg = format!(
                "session of {} at epoch {} is superseded (authoritative epoch {:?})",
                ctx.peer.source_id,
                ctx.peer.epoch,
                current.map(|e| e.value())
            );
            send_error(stream, ErrorCode::STALE_EPOCH, frame.frame_type(), &msg);
            return CloseReason::abnormal(msg);
        }
        if let Frame::ReadRequest(_) | Frame::WriteRequest(_) = &frame {
            ctx.requests.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(any(test, feature = "testing"))]
        if !cfg.serve_delay.is_zero() {
            std::thread::sleep(cfg.serve_delay);
        }
        // A whole answer (a READ's payload, a WRITE's payload and its
        // answer) must move within io_timeout, however the peer paces it.
        let deadline = Some(Instant::now() + cfg.io_timeout);
        if let Frame::ReadRequest(_) | Frame::WriteRequest(_) = &frame
            && let Err(e) = stream.set_write_timeout(Some(cfg.io_timeout))
        {
            return CloseReason::abnormal(format!("cannot set the write timeout: {e}"));
        }
        let result = match frame {
            Frame::ReadRequest(r) => {
                match check(
                    ctx.ranges,
                    r.range_id,
                    r.token,
                    r.offset,
                    r.length,
                    AccessFlags::REMOTE_READ,
                ) {
                    Ok(p) => {
                        let resp = Frame::ReadResponse(ReadResponse {
                            request_id: r.request_id,
                            range_id: r.range_id,
                            offset: r.offset,
                            status: Status::OK,
                            length: r.length,
                        });
                        scratch.clear();
                        match resp.encode(&mut scratch) {
                            Ok(()) => send_more(stream, &scratch)
                                .and_then(|()| {
                                    io.send(
                                        stream,
                                        &p.memory,
                                        p.offset + r.offset,
                                        r.length as usize,
                                        deadline,
                                    )
                                })
                                .map(|()| {
                                    ctx.bytes.fetch_add(u64::from(r.length), Ordering::Relaxed);
                                }),
                            Err(e) => Err(std::io::Error::other(e)),
                        }
                    }
                    Err(status) => {
                        tracing::debug!(session = ?ctx.session, range = r.range_id.0, %status, "read refused");
                        let resp = Frame::ReadResponse(ReadResponse {
                            request_id: r.request_id,
                            range_id: r.range_id,
                            offset: r.offset,
                            status,
                            length: 0,
                        });
                        write_frame(stream, &resp, &mut scratch).map_err(std::io::Error::other)
                    }
                }
            }
            Frame::WriteRequest(w) => {
                let status = match check(
                    ctx.ranges,
                    w.range_id,
                    w.token,
                    w.offset,
                    w.length,
                    AccessFlags::REMOTE_WRITE,
                ) {
                    Ok(p) => {
                        match io.recv(
                            stream,
                            &p.memory,
                            p.offset + w.offset,
                            w.length as usize,
                            deadline,
                        ) {
                            Ok(()) => {
                                ctx.bytes.fetch_add(u64::from(w.length), Ordering::Relaxed);
                                Ok(Status::OK)
                            }
                            Err(e) => Err(e),
                        }
                    }
                    Err(status) => {
                        tracing::debug!(session = ?ctx.session, range = w.range_id.0, %status, "write refused");
                        io.discard(stream, u64::from(w.length), deadline)
                            .map(|()| status)
                    }
                };
                match status {
                    Ok(status) => {
                        let resp = Frame::WriteResponse(WriteResponse {
                            request_id: w.request_id,
                            range_id: w.range_id,
                            offset: w.offset,
                            status,
                            length: if status.is_ok() { w.length } else { 0 },
                        });
                        write_frame(stream, &resp, &mut scratch).map_err(std::io::Error::other)
                    }
                    Err(e) => Err(e),
                }
            }
            // Either side publishes after the handshake (docs/protocol.md,
            // "Session"). A tcp target reads and writes only its own ranges,
            // so it checks the epoch and keeps nothing of the initiator's.
            Frame::SegmentPublication(orbitte_wire::SegmentPublication { epoch, .. })
            | Frame::SegmentRetire(orbitte_wire::SegmentRetire { epoch, .. }) => {
                if epoch != ctx.peer.epoch {
                    let msg = format!(
                        "{} names epoch {epoch}, the session's is {}",
                        frame.frame_type(),
                        ctx.peer.epoch
                    );
                    send_error(stream, ErrorCode::STALE_EPOCH, frame.frame_type(), &msg);
                    return CloseReason::abnormal(msg);
                }
                Ok(())
            }
            // Sent after every WRITE of its batch was answered, and this
            // session answers a WRITE only after its bytes are applied.
            Frame::Notification(n) => {
                ctx.ranges
                    .notification(ctx.peer, crate::transport::PathKind::Tcp, n);
                Ok(())
            }
            Frame::Goodbye(g) => {
                return CloseReason::normal(format!(
                    "peer said goodbye ({}: {})",
                    g.reason, g.message
                ));
            }
            Frame::Error(e) => {
                return CloseReason::abnormal(format!("peer sent error {}: {}", e.code, e.message));
            }
            other => {
                let msg = format!(
                    "{} is not allowed after the handshake on a tcp session",
                    other.frame_type()
                );
                send_error(
                    stream,
                    ErrorCode::UNEXPECTED_FRAME,
                    other.frame_type(),
                    &msg,
                );
                return CloseReason::abnormal(msg);
            }
        };
        if let Err(e) = result {
            let what = if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                format!(
                    "peer stalled for {:?} (not reading answers or not sending payload): {e}",
                    cfg.io_timeout
                )
            } else {
                format!("data transfer failed: {e}")
            };
            return CloseReason::abnormal(what);
        }
    }
}

fn goodbye(stream: &mut TcpStream, reason: GoodbyeReason, text: &str) -> Result<(), SessionError> {
    let f = Frame::Goodbye(orbitte_wire::Goodbye {
        reason,
        message: orbitte_wire::Message::truncating(text),
    });
    let mut scratch = Vec::new();
    write_frame(stream, &f, &mut scratch)?;
    stream.flush()?;
    Ok(())
}
