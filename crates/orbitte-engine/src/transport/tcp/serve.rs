//! Target side of the tcp path: serves READ and WRITE requests of one
//! session against the published ranges.
//!
//! Every request is checked before any byte of registered memory is
//! touched: the session's epoch must still be the source's authoritative
//! one, the range must be published, the token must match, the access must
//! allow the operation and `offset + length` must lie inside the range.
//! Otherwise the answer carries the failing status (and a refused WRITE's
//! payload is read and dropped, never written).
//!
//! Requests are received through a small buffer ([`FrameBuffer`]): one
//! `recv` brings every request that waits. A WRITE's payload goes from the
//! socket straight into the range (with the next request's header in the
//! same `recvmsg`), a READ's answer goes out with its header
//! in one `sendmsg` from the range (or, up to 256 KiB, `sendfile` from its
//! memfd), and the
//! small answers (WRITE answers, refusals) are gathered and sent together
//! when no further request is waiting, before a WRITE payload's receive
//! would wait for the peer, and in a stream that never pauses once they
//! acknowledge [`ANSWER_BATCH`] bytes: a WRITE the target applied is
//! acknowledged even if the connection dies before the stream pauses. The
//! socket's timeouts are set once to the poll interval; deadlines are
//! checked between system calls.

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use orbitte_proto::{Op, PathKind};

use orbitte_wire::{
    AccessFlags, AccessToken, ErrorCode, Frame, FrameType, GoodbyeReason, RangeId, ReadResponse,
    SessionId, Status, WriteResponse,
};

use super::payload::{PayloadIo, send_all};
use super::socket::{ANSWER_BATCH, size_socket_buffers};
use super::staged;
use crate::io_pool::PARK_AFTER;
use crate::session::activity::SessionActivity;
use crate::session::io::{FrameBuffer, send_error, write_frame};
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
    pub(crate) fn normal(text: impl Into<String>) -> Self {
        Self {
            abnormal: false,
            text: text.into(),
        }
    }
    pub(crate) fn abnormal(text: impl Into<String>) -> Self {
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
    /// What this session did last; a newcomer may take its slot when idle.
    pub(crate) activity: &'a SessionActivity,
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

/// Sends the gathered answers in `out` (best effort) and then an error
/// frame: the peer learns the outcome of what was served before.
fn refuse(stream: &mut TcpStream, out: &mut Vec<u8>, code: ErrorCode, ft: FrameType, msg: &str) {
    if !out.is_empty() {
        let _ = send_all(stream, out, false, None);
        out.clear();
    }
    send_error(stream, code, ft, msg);
}

/// Refuses a frame of a superseded epoch and closes the session.
fn stale(stream: &mut TcpStream, out: &mut Vec<u8>, ft: FrameType, msg: String) -> CloseReason {
    refuse(stream, out, ErrorCode::STALE_EPOCH, ft, &msg);
    CloseReason::abnormal(msg)
}

fn stalled(cfg: &SessionConfig, e: &std::io::Error) -> CloseReason {
    if matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ) {
        CloseReason::abnormal(format!(
            "peer stalled for {:?} (not reading answers or not sending payload): {e}",
            cfg.io_timeout
        ))
    } else {
        CloseReason::abnormal(format!("data transfer failed: {e}"))
    }
}

/// Sets an admitted session's socket up for [`serve`]: its buffer sizes
/// and the timeouts of its system calls (the poll interval).
pub(crate) fn prepare(stream: &TcpStream, cfg: &SessionConfig) -> Result<(), CloseReason> {
    size_socket_buffers(stream, cfg.socket_buffer);
    stream
        .set_write_timeout(Some(POLL))
        .and_then(|()| stream.set_read_timeout(Some(POLL)))
        .map_err(|e| CloseReason::abnormal(format!("cannot set the socket timeouts: {e}")))
}

/// How [`serve`] returned.
#[derive(Debug)]
pub(crate) enum Served {
    /// The session ended, for this reason (the caller closes it).
    Closed(CloseReason),
    /// Nothing arrived for [`PARK_AFTER`] and nothing is buffered or
    /// waits to be sent: the caller may park the session until its socket
    /// is readable (checking [`quiet`] meanwhile) and serve it again.
    Idle,
}

/// Serves requests on a socket set up by [`prepare`] until the session
/// ends or has been idle for [`PARK_AFTER`]; says which.
pub(crate) fn serve(stream: &mut TcpStream, ctx: &ServeCtx<'_>) -> Served {
    let cfg = ctx.cfg;
    let served = ctx
        .ranges
        .served_counter(PathKind::Tcp, ctx.peer.source_id.as_str());
    let mut frames = FrameBuffer::new();
    // Encoded answers not sent yet (see the module docs), and the bytes of
    // the WRITEs they answer.
    let mut out = Vec::with_capacity(1024);
    let mut acknowledged = 0u64;
    let mut io = PayloadIo::for_answers(cfg.zero_copy);
    let mut last_request = Instant::now();
    loop {
        let frame = match frames.next() {
            Ok(Some(f)) => f,
            Ok(None) => {
                // No whole request waits in the buffer: send the gathered
                // answers before waiting for more.
                let got = match frames.fill(stream, !out.is_empty()) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && !out.is_empty() => {
                        if let Err(e) =
                            send_all(stream, &out, false, Some(Instant::now() + cfg.io_timeout))
                        {
                            return Served::Closed(stalled(cfg, &e));
                        }
                        out.clear();
                        frames.fill(stream, false)
                    }
                    r => r,
                };
                match got {
                    Ok(0) => {
                        return Served::Closed(CloseReason::normal("peer closed the connection"));
                    }
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        if frames.is_empty() {
                            debug_assert!(out.is_empty(), "answers are sent before waiting");
                            if let Some(reason) = quiet(stream, ctx) {
                                return Served::Closed(reason);
                            }
                            if last_request.elapsed() >= PARK_AFTER {
                                return Served::Idle;
                            }
                            continue;
                        }
                    }
                    Err(e) => {
                        return Served::Closed(CloseReason::abnormal(format!(
                            "connection failed: {e}"
                        )));
                    }
                }
                if frames.overdue(cfg.frame_timeout) {
                    refuse(
                        stream,
                        &mut out,
                        ErrorCode::TIMEOUT,
                        FrameType(0),
                        "frame not completed in time",
                    );
                    return Served::Closed(CloseReason::abnormal(format!(
                        "peer did not complete a frame (truncated frame) within {:?}",
                        cfg.frame_timeout
                    )));
                }
                continue;
            }
            Err(SessionError::Malformed(e)) => {
                refuse(stream, &mut out, e.error_code(), e.frame, &e.to_string());
                return Served::Closed(CloseReason::abnormal(format!("malformed frame: {e}")));
            }
            Err(e) => {
                return Served::Closed(CloseReason::abnormal(format!("connection failed: {e}")));
            }
        };
        if frames.payload_len() != u64::from(frame.payload_len()) {
            let msg = format!(
                "{} announces {} payload bytes in its header and {} in its body",
                frame.frame_type(),
                frames.payload_len(),
                frame.payload_len()
            );
            refuse(
                stream,
                &mut out,
                ErrorCode::MALFORMED_FRAME,
                frame.frame_type(),
                &msg,
            );
            return Served::Closed(CloseReason::abnormal(format!("malformed frame: {msg}")));
        }
        last_request = Instant::now();
        ctx.activity.began();
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
            return Served::Closed(stale(stream, &mut out, frame.frame_type(), msg));
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
        let result = match frame {
            Frame::ReadRequest(r) => {
                let source = check(
                    ctx.ranges,
                    r.range_id,
                    r.token,
                    r.offset,
                    r.length,
                    AccessFlags::REMOTE_READ,
                );
                let source = source
                    .as_ref()
                    .map_err(|s| *s)
                    .and_then(|p| staged::ReadSource::of(&p.memory, p.offset + r.offset, r.length));
                match source {
                    Ok(source) => {
                        let resp = Frame::ReadResponse(ReadResponse {
                            request_id: r.request_id,
                            range_id: r.range_id,
                            offset: r.offset,
                            status: Status::OK,
                            length: r.length,
                        });
                        // Counted before the payload goes out: the peer
                        // has its outcome only after.
                        let encoded = resp
                            .encode(&mut out)
                            .map(|()| served.count(Op::Read, u64::from(r.length)));
                        match encoded {
                            Ok(()) => source
                                .send(&out, |head, memory, at, len| {
                                    io.send(stream, head, memory, at, len, deadline)
                                })
                                .map(|()| {
                                    out.clear();
                                    ctx.bytes.fetch_add(u64::from(r.length), Ordering::Relaxed);
                                }),
                            Err(e) => Err(std::io::Error::other(e)),
                        }
                    }
                    Err(status) => {
                        tracing::debug!(session = ?ctx.session, range = r.range_id.0, %status, "read refused");
                        Frame::ReadResponse(ReadResponse {
                            request_id: r.request_id,
                            range_id: r.range_id,
                            offset: r.offset,
                            status,
                            length: 0,
                        })
                        .encode(&mut out)
                        .map_err(std::io::Error::other)
                    }
                }
            }
            Frame::WriteRequest(w) => {
                let len = w.length as usize;
                let status = match check(
                    ctx.ranges,
                    w.range_id,
                    w.token,
                    w.offset,
                    w.length,
                    AccessFlags::REMOTE_WRITE,
                ) {
                    Ok(p) => {
                        let mut payload = staged::Incoming {
                            stream,
                            frames: &mut frames,
                            io: &mut io,
                            out: &mut out,
                            deadline,
                        };
                        staged::receive_write(
                            &p.memory,
                            p.offset + w.offset,
                            w.length,
                            &mut payload,
                        )
                        .inspect(|status| {
                            if status.is_ok() {
                                ctx.bytes.fetch_add(u64::from(w.length), Ordering::Relaxed);
                                served.count(Op::Write, u64::from(w.length));
                            }
                        })
                    }
                    Err(status) => {
                        tracing::debug!(session = ?ctx.session, range = w.range_id.0, %status, "write refused");
                        staged::Incoming {
                            stream,
                            frames: &mut frames,
                            io: &mut io,
                            out: &mut out,
                            deadline,
                        }
                        .discard(len)
                        .map(|()| status)
                    }
                };
                status.and_then(|status| {
                    if out.is_empty() {
                        acknowledged = 0;
                    }
                    Frame::WriteResponse(WriteResponse {
                        request_id: w.request_id,
                        range_id: w.range_id,
                        offset: w.offset,
                        status,
                        length: if status.is_ok() { w.length } else { 0 },
                    })
                    .encode(&mut out)
                    .map_err(std::io::Error::other)?;
                    acknowledged += u64::from(w.length);
                    if acknowledged >= ANSWER_BATCH {
                        send_all(stream, &out, false, deadline)?;
                        out.clear();
                    }
                    Ok(())
                })
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
                    return Served::Closed(stale(stream, &mut out, frame.frame_type(), msg));
                }
                Ok(())
            }
            // Sent after every WRITE of its batch was answered, and this
            // session answers a WRITE only after its bytes are applied.
            Frame::Notification(n) => {
                ctx.ranges.notification(ctx.peer, PathKind::Tcp, n);
                Ok(())
            }
            Frame::Goodbye(g) => {
                return Served::Closed(CloseReason::normal(format!(
                    "peer said goodbye ({}: {})",
                    g.reason, g.message
                )));
            }
            Frame::Error(e) => {
                return Served::Closed(CloseReason::abnormal(format!(
                    "peer sent error {}: {}",
                    e.code, e.message
                )));
            }
            other => {
                let msg = format!(
                    "{} is not allowed after the handshake on a tcp session",
                    other.frame_type()
                );
                refuse(
                    stream,
                    &mut out,
                    ErrorCode::UNEXPECTED_FRAME,
                    other.frame_type(),
                    &msg,
                );
                return Served::Closed(CloseReason::abnormal(msg));
            }
        };
        if let Err(e) = result {
            return Served::Closed(stalled(cfg, &e));
        }
        ctx.activity.ended();
    }
}

/// What a quiet session (nothing buffered, nothing to send) checks: the
/// listener stops, `idle_timeout` passed, or a newcomer took its slot.
/// Says goodbye and why it closes; `None`: it stays open.
pub(crate) fn quiet(stream: &mut TcpStream, ctx: &ServeCtx<'_>) -> Option<CloseReason> {
    if ctx.stop.load(Ordering::Acquire) {
        let _ = goodbye(stream, GoodbyeReason::SHUTDOWN, "listener shutting down");
        return Some(CloseReason::normal("listener shut down"));
    }
    if let Some(idle) = ctx.cfg.idle_timeout
        && ctx.activity.idle().is_some_and(|i| i >= idle)
    {
        let _ = goodbye(stream, GoodbyeReason::IDLE, "idle");
        return Some(CloseReason::normal(format!("idle for {idle:?}")));
    }
    if ctx.activity.evicted() {
        let why = "idle the longest when a new session needed a slot (max_sessions taken)";
        let _ = goodbye(stream, GoodbyeReason::IDLE, why);
        return Some(CloseReason::normal(format!("closed: {why}")));
    }
    None
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
