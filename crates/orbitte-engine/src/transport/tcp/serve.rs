//! Target side of the tcp path: serves READ and WRITE requests of one
//! session against the published ranges, on an I/O loop ([`Serving`]).
//!
//! Every request is checked before any byte of registered memory is
//! touched: the session's epoch must still be the source's authoritative
//! one, the range must be published, the token must match, the access must
//! allow the operation and `offset + length` must lie inside the range.
//! Otherwise the answer carries the failing status (and a refused WRITE's
//! payload is read and dropped, never written).
//!
//! The socket is non-blocking and a session is a resumable state machine:
//! each [`Serving::turn`] moves what it can without waiting and says what
//! readiness it waits for next, and until when. Requests are received
//! through a small buffer ([`FrameBuffer`]): one `recv` brings every
//! request that waits. A WRITE's payload goes from the socket straight
//! into the range (with the next request's header in the same `recvmsg`),
//! a READ's answer goes out with its header in `sendmsg` calls from the
//! range (or, to a peer on another host and up to 256 KiB, `sendfile`
//! from its memfd); a range of GPU memory moves through a bounce buffer
//! instead, a piece at a time (module `staged`, which says what a failed
//! device copy does). READ requests already buffered behind one whose
//! answer goes with `sendmsg` are checked and answered with it, headers
//! and payloads of up to 16 answers (no more joining once 1 MiB of
//! payload is behind the first) in one `sendmsg`: a batch of READs costs a system call or two per
//! batch, not per request. A request that cannot join (refused, a device
//! range, a superseded epoch) waits, decoded, until the answers before it
//! went, and is then served as any other. The small
//! answers (WRITE answers, refusals) are gathered and sent together when
//! no further request is waiting, before a WRITE payload's receive waits
//! for the peer, and in a stream that never pauses once they acknowledge
//! [`ANSWER_BATCH`] bytes: a WRITE the target applied is acknowledged even
//! if the connection dies before the stream pauses.
//!
//! While answers wait that the peer does not take (its receive window is
//! full), the session waits for the socket to become writable and reads
//! no further request, so a peer that stops reading holds at most one
//! batch of answers. A whole answer (a READ's payload, a WRITE's payload
//! and its answer, gathered answers waiting to go) must move within
//! `io_timeout`, a started frame must complete within `frame_timeout`; a
//! turn moves at most [`TURN_BYTES`] and decodes at most [`TURN_FRAMES`]
//! requests, then lets the loop's other sessions have theirs.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mio::Interest;
use orbitte_memory::{HostMemory, SendPiece};
use orbitte_proto::{Op, PathKind};

use orbitte_wire::{
    AccessFlags, AccessToken, ErrorCode, ErrorFrame, Frame, FrameType, GoodbyeReason, Message,
    RangeId, ReadResponse, RequestId, SessionId, Status, WriteRequest, WriteResponse,
};

use super::payload::{PayloadIo, send_ready};
use super::socket::{ANSWER_BATCH, receive_mark, size_socket_buffers};
use super::staged::{Landed, ReadPayload, ServedMemory, WritePayload};
use crate::metrics::ServedCounter;
use crate::session::activity::SessionActivity;
use crate::session::io::{FrameBuffer, write_frame};
use crate::session::{
    PeerIdentity, Published, RangeLookup, SessionConfig, SessionError, SharedPeerTable,
};

/// How often a waiting session makes a quiet session's checks (listener
/// stopping, `idle_timeout`, its slot taken), and the longest it waits
/// without being called.
pub(crate) const CHECK: Duration = Duration::from_millis(200);

/// Bytes one turn moves at most before the loop's other sessions have
/// their turn.
pub(crate) const TURN_BYTES: usize = 4 << 20;

/// Requests one turn decodes at most.
pub(crate) const TURN_FRAMES: u32 = 256;

/// Gathered answers that are sent before a further request is read, however
/// few bytes they acknowledge.
const OUT_MAX: usize = 64 << 10;

/// Most READ answers that go out behind the one in progress, in the same
/// `sendmsg` calls.
const BEHIND_MAX: usize = 15;

/// Payload bytes of the READ answers behind the one in progress at which
/// no further one joins them.
const BEHIND_BYTES: usize = 1 << 20;

/// A READ answer of host memory behind the one in progress: its header
/// is `out[previous answer's header end..head_end]`, then its payload
/// (checked against the range and the memory).
#[derive(Debug)]
struct Behind {
    head_end: usize,
    payload: ReadPayload,
    length: u32,
}

/// How long a refusal's error frame (and the answers before it) may wait
/// for the peer to take it before the session closes without it.
const REFUSAL_LINGER: Duration = Duration::from_millis(200);

/// Requests decoded within this of the last one released by the
/// `serve_delay` knob are paced from that one, not from now (the loop
/// wakes on a coarse grain: a sub-grain delay still adds up per request).
#[cfg(any(test, feature = "testing"))]
const PACE_GAP: Duration = Duration::from_millis(50);

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

/// The source's authoritative epoch now: a newer incarnation of the
/// source may have been admitted since this session opened.
fn authoritative_epoch(ctx: &ServeCtx<'_>) -> Option<orbitte_wire::Epoch> {
    ctx.peers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .epoch_of(&ctx.peer.source_id)
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

/// An answer that did not move within `io_timeout`.
fn overdue_answer(cfg: &SessionConfig) -> CloseReason {
    stalled(
        cfg,
        &std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "payload not moved within its deadline",
        ),
    )
}

/// Sets an admitted session's socket up for [`Serving`]: its buffer sizes,
/// and non-blocking.
pub(crate) fn prepare(stream: &TcpStream, cfg: &SessionConfig) -> Result<(), CloseReason> {
    size_socket_buffers(stream, cfg.socket_buffer);
    stream
        .set_nonblocking(true)
        .map_err(|e| CloseReason::abnormal(format!("cannot make the socket non-blocking: {e}")))
}

/// What a turn of [`Serving`] asks of its loop.
#[derive(Debug)]
pub(crate) enum Step {
    /// Call it again when the socket is ready as `Some(interest)` says, or
    /// at the deadline, whichever comes first (`None`: at the deadline
    /// only).
    Wait(Option<Interest>, Instant),
    /// The session ended, for this reason (the caller closes it).
    Closed(CloseReason),
}

/// The request a session is in the middle of.
#[derive(Debug)]
enum Task {
    /// Between requests: the next is read.
    Next,
    /// Held back by the `serve_delay` knob until then.
    #[cfg(any(test, feature = "testing"))]
    Delayed(Frame, Instant),
    /// A READ answer going out: the gathered answers and its header
    /// (`out[sent..head_end]`), then its payload of `length` bytes; the
    /// answers [`Serving::behind`] it follow in `out` past `head_end`.
    Read {
        payload: ReadPayload,
        length: u32,
        head_end: usize,
    },
    /// A WRITE payload coming into the range.
    Write {
        payload: WritePayload,
        w: WriteRequest,
    },
    /// A refused WRITE's payload being read and dropped.
    Discard {
        left: u64,
        w: WriteRequest,
        status: Status,
    },
}

/// How one step of a turn went on.
enum Flow {
    /// Go on with the next step.
    Go,
    /// Wait for this readiness (`None`: the deadline only), or at most
    /// until this deadline.
    Wait(Option<Interest>, Option<Instant>),
}

/// How a session ends.
enum End {
    /// Close now, for this reason.
    Close(CloseReason),
    /// Send the gathered answers and this error frame (as far as the peer
    /// takes them within [`REFUSAL_LINGER`]), then close.
    Refuse(ErrorCode, FrameType, String, CloseReason),
}

impl End {
    /// The peer's frame broke the protocol: refused with `code`, closed.
    fn refuse(code: ErrorCode, ft: FrameType, msg: String, why: String) -> Self {
        Self::Refuse(code, ft, msg, CloseReason::abnormal(why))
    }
}

/// What one turn may still spend.
struct Budget {
    bytes: usize,
    frames: u32,
}

impl Budget {
    fn spend(&mut self, n: usize) {
        self.bytes = self.bytes.saturating_sub(n);
    }
    fn spent(&self) -> bool {
        self.bytes == 0 || self.frames == 0
    }
}

/// One tcp data session's serving state, carried across turns: the frame
/// buffer, the gathered answers and how much of them went, the request in
/// progress and the deadline of its answer.
///
/// Call [`Serving::turn`] when the socket is ready as the last turn asked
/// or its deadline passed; a turn never blocks.
#[derive(Debug)]
pub(crate) struct Serving {
    frames: FrameBuffer,
    /// Encoded answers; `out[..sent]` went out already.
    ///
    /// Invariant: `sent <= out.len()`; both are zero once all went.
    out: Vec<u8>,
    sent: usize,
    /// Bytes of the WRITEs `out` answers.
    acknowledged: u64,
    io: PayloadIo,
    /// The socket's `SO_RCVLOWAT` as last set (1: the kernel's default).
    lowat: u32,
    served: ServedCounter,
    task: Task,
    /// When the answer in progress (or the gathered answers waiting for
    /// the peer) must have moved.
    due: Option<Instant>,
    /// A refusal's error frame waiting in `out`, the reason to close with
    /// and until when it may wait.
    closing: Option<(CloseReason, Instant)>,
    /// READ answers of host memory decoded while the one in progress went
    /// out, sent behind it in the same `sendmsg` calls.
    behind: VecDeque<Behind>,
    /// A request decoded while answers were gathered that could not join
    /// them (a refused READ, a device range, a superseded epoch): served
    /// the usual way once the answers before it went.
    held: Option<Frame>,
    /// When the `serve_delay` knob released the last request.
    #[cfg(any(test, feature = "testing"))]
    paced: Option<Instant>,
}

impl Serving {
    /// The state of a session admitted with `ctx`, before its first
    /// request: `greeting` (encoded frames, the publications) goes out
    /// first, as the socket takes it, bounded by `io_timeout` like an
    /// answer; `same_host`: the peer is on this host
    /// ([`PayloadIo::for_answers`]).
    pub(crate) fn new(ctx: &ServeCtx<'_>, mut greeting: Vec<u8>, same_host: bool) -> Self {
        greeting.reserve(1024);
        Self {
            frames: FrameBuffer::new(),
            out: greeting,
            sent: 0,
            acknowledged: 0,
            io: PayloadIo::for_answers(ctx.cfg.zero_copy, same_host),
            lowat: 1,
            served: ctx
                .ranges
                .served_counter(PathKind::Tcp, ctx.peer.source_id.as_str()),
            task: Task::Next,
            due: None,
            closing: None,
            behind: VecDeque::new(),
            held: None,
            #[cfg(any(test, feature = "testing"))]
            paced: None,
        }
    }

    /// Serves what can be served now, without blocking; says what to wait
    /// for next, or that the session ended.
    pub(crate) fn turn(&mut self, stream: &TcpStream, ctx: &ServeCtx<'_>, now: Instant) -> Step {
        if self.closing.is_some() {
            return self.linger(stream, now);
        }
        if self.due.is_some_and(|d| now >= d) {
            return self.closed(stream, overdue_answer(ctx.cfg));
        }
        let mut budget = Budget {
            bytes: TURN_BYTES,
            frames: TURN_FRAMES,
        };
        loop {
            let flow = if budget.spent() {
                // Called again on the loop's next round: the socket is
                // writable unless the peer stopped reading.
                Ok(Flow::Wait(
                    Some(Interest::READABLE | Interest::WRITABLE),
                    None,
                ))
            } else {
                self.advance(stream, ctx, now, &mut budget)
            };
            match flow {
                Ok(Flow::Go) => {}
                Ok(Flow::Wait(interest, at)) => {
                    let at = [at, self.due, Some(now + CHECK)]
                        .into_iter()
                        .flatten()
                        .min()
                        .unwrap_or(now + CHECK);
                    return Step::Wait(interest, at);
                }
                Err(End::Close(reason)) => return self.closed(stream, reason),
                Err(End::Refuse(code, ft, msg, reason)) => {
                    let frame = Frame::Error(ErrorFrame {
                        code,
                        frame_type: ft,
                        request_id: RequestId(0),
                        message: Message::truncating(&msg),
                    });
                    if frame.encode(&mut self.out).is_err() {
                        return self.closed(stream, reason);
                    }
                    self.closing = Some((reason, now + REFUSAL_LINGER));
                    return self.linger(stream, now);
                }
            }
        }
    }

    /// Sends what the socket takes of the gathered answers (best effort)
    /// and ends the session.
    fn closed(&mut self, stream: &TcpStream, reason: CloseReason) -> Step {
        // Headers of answers behind the one in progress never go alone.
        if let Task::Read { head_end, .. } = &self.task {
            self.out.truncate(*head_end);
        }
        if self.sent < self.out.len() {
            let _ = send_ready(stream, &self.out[self.sent..]);
        }
        Step::Closed(reason)
    }

    /// A refusal waits to go out: sends what the socket takes, closes once
    /// all went or its time is up.
    fn linger(&mut self, stream: &TcpStream, now: Instant) -> Step {
        let Some((reason, until)) = self.closing.take() else {
            return Step::Closed(CloseReason::abnormal("closing without a reason"));
        };
        match send_ready(stream, &self.out[self.sent..]) {
            Ok(n) if self.sent + n < self.out.len() && now < until => {
                self.sent += n;
                self.closing = Some((reason, until));
                Step::Wait(Some(Interest::WRITABLE), until)
            }
            _ => Step::Closed(reason),
        }
    }

    /// Sends what the socket takes of the gathered answers; `true` once
    /// all went (then the answers' deadline, if one ran, is off).
    fn flush(&mut self, stream: &TcpStream, ctx: &ServeCtx<'_>, now: Instant) -> Result<bool, End> {
        if self.sent < self.out.len() {
            let n = send_ready(stream, &self.out[self.sent..])
                .map_err(|e| End::Close(stalled(ctx.cfg, &e)))?;
            self.sent += n;
        }
        if self.sent < self.out.len() {
            self.due.get_or_insert(now + ctx.cfg.io_timeout);
            return Ok(false);
        }
        self.out.clear();
        self.sent = 0;
        if matches!(self.task, Task::Next) {
            self.due = None;
        }
        Ok(true)
    }

    /// The payload in progress waits for the peer: the gathered answers go
    /// first, and until they all went nothing more is read.
    fn wait_for_payload(
        &mut self,
        stream: &TcpStream,
        ctx: &ServeCtx<'_>,
        now: Instant,
    ) -> Result<Flow, End> {
        if self.flush(stream, ctx, now)? {
            Ok(Flow::Wait(Some(Interest::READABLE), None))
        } else {
            Ok(Flow::Wait(Some(Interest::WRITABLE), None))
        }
    }

    /// One step: the request in progress moves on, or the next is read.
    fn advance(
        &mut self,
        stream: &TcpStream,
        ctx: &ServeCtx<'_>,
        now: Instant,
        budget: &mut Budget,
    ) -> Result<Flow, End> {
        let fail = |e: std::io::Error| End::Close(stalled(ctx.cfg, &e));
        match &mut self.task {
            Task::Next => self.next_request(stream, ctx, now, budget),
            #[cfg(any(test, feature = "testing"))]
            Task::Delayed(_, until) => {
                let until = *until;
                if now < until {
                    return Ok(Flow::Wait(None, Some(until)));
                }
                let Task::Delayed(frame, _) = std::mem::replace(&mut self.task, Task::Next) else {
                    return Ok(Flow::Go);
                };
                self.paced = Some(until);
                self.apply(frame, ctx, now)
            }
            Task::Read { .. } => self.advance_read(stream, ctx, now, budget),
            Task::Write { payload, w } => {
                let w = *w;
                let mut rest = 0;
                let (landed, blocked) = if payload.is_complete() {
                    (Landed::All, false)
                } else {
                    let (memory, span, ends) = payload.room();
                    let frames = ends.then_some(&mut self.frames);
                    let m = self
                        .io
                        .recv_now(stream, frames, memory, span, budget.bytes)
                        .map_err(fail)?;
                    budget.spend(m.payload);
                    rest = (span.1 - span.0).saturating_sub(m.payload);
                    (payload.received(m.payload), m.blocked)
                };
                let waits = matches!(landed, Landed::More) && blocked;
                self.mark(stream, receive_mark(waits, rest));
                match landed {
                    Landed::All => {
                        ctx.bytes.fetch_add(u64::from(w.length), Ordering::Relaxed);
                        self.served.count(Op::Write, u64::from(w.length));
                        self.answer(w, Status::OK, ctx)
                    }
                    Landed::Failed { left } => {
                        self.task = Task::Discard {
                            left,
                            w,
                            status: Status::INTERNAL,
                        };
                        Ok(Flow::Go)
                    }
                    Landed::More if blocked => self.wait_for_payload(stream, ctx, now),
                    Landed::More => Ok(Flow::Go),
                }
            }
            Task::Discard { left, w, status } => {
                let m = self
                    .io
                    .discard_now(stream, *left, budget.bytes)
                    .map_err(fail)?;
                *left -= m.payload as u64;
                budget.spend(m.payload);
                if *left == 0 {
                    let (w, status) = (*w, *status);
                    return self.answer(w, status, ctx);
                }
                if m.blocked {
                    return self.wait_for_payload(stream, ctx, now);
                }
                Ok(Flow::Go)
            }
        }
    }

    /// The READ answer in progress moves on; READ requests already
    /// buffered behind it join it when its payload goes with `sendmsg`
    /// ([`Serving::gather`]), and go out with it in the same calls.
    fn advance_read(
        &mut self,
        stream: &TcpStream,
        ctx: &ServeCtx<'_>,
        now: Instant,
        budget: &mut Budget,
    ) -> Result<Flow, End> {
        let fail = |e: std::io::Error| End::Close(stalled(ctx.cfg, &e));
        let Task::Read { payload, .. } = &self.task else {
            return Ok(Flow::Go);
        };
        if let ReadPayload::Host { memory, whole, .. } = payload
            && self.io.copies(memory, *whole)
        {
            self.gather(ctx, budget);
        }
        if !self.behind.is_empty() {
            return self.send_behind(stream, ctx, now, budget);
        }
        let Task::Read {
            payload, length, ..
        } = &mut self.task
        else {
            return Ok(Flow::Go);
        };
        let (memory, span, whole) = payload.unsent();
        let m = self
            .io
            .send_now(
                stream,
                &self.out[self.sent..],
                memory,
                span,
                whole,
                budget.bytes,
            )
            .map_err(fail)?;
        self.sent += m.head;
        payload.sent(m.payload);
        budget.spend(m.head + m.payload);
        if self.sent == self.out.len() && payload.piece_sent() {
            // A device range's next piece, copied now: the bounce
            // buffer's last one went out.
            if payload
                .next_piece()
                .map_err(|why| End::Close(CloseReason::abnormal(why)))?
            {
                return Ok(Flow::Go);
            }
            ctx.bytes.fetch_add(u64::from(*length), Ordering::Relaxed);
            self.out.clear();
            self.sent = 0;
            self.done(ctx);
            return Ok(Flow::Go);
        }
        if m.blocked {
            return Ok(Flow::Wait(Some(Interest::WRITABLE), None));
        }
        Ok(Flow::Go)
    }

    /// Decodes the READ requests already whole in the buffer (at most
    /// [`BEHIND_MAX`] answers and [`BEHIND_BYTES`] of payload behind the
    /// one in progress) and, for each that reads host memory and passes
    /// every check, encodes its answer's header into `out` behind it. The
    /// first that cannot join (a refused READ, a device range, a
    /// superseded epoch) is held and served the usual way afterwards.
    fn gather(&mut self, ctx: &ServeCtx<'_>, budget: &mut Budget) {
        #[cfg(any(test, feature = "testing"))]
        if !ctx.cfg.serve_delay.is_zero() {
            return;
        }
        while self.held.is_none()
            && self.behind.len() < BEHIND_MAX
            && self.behind.iter().map(|b| b.length as usize).sum::<usize>() < BEHIND_BYTES
            && budget.frames > 0
            && self.frames.next_whole() == Some(FrameType::READ_REQUEST)
        {
            // A malformed body stays in the buffer: the next request read
            // after these answers reports it.
            let Ok(Some(frame)) = self.frames.next() else {
                return;
            };
            budget.frames -= 1;
            if self.frames.payload_len() != 0 {
                // Its header and body disagree: `serve` refuses it.
                self.held = Some(frame);
                return;
            }
            let Frame::ReadRequest(r) = &frame else {
                self.held = Some(frame);
                return;
            };
            let published = (authoritative_epoch(ctx) == Some(ctx.peer.epoch))
                .then(|| {
                    check(
                        ctx.ranges,
                        r.range_id,
                        r.token,
                        r.offset,
                        r.length,
                        AccessFlags::REMOTE_READ,
                    )
                    .ok()
                })
                .flatten();
            // A device range's payload is never made here: making it copies
            // its first piece.
            let payload = published
                .filter(|p| matches!(p.memory, ServedMemory::Host(_)))
                .and_then(|p| ReadPayload::of(&p.memory, p.offset + r.offset, r.length).ok())
                .filter(|p| {
                    let (memory, _, whole) = p.unsent();
                    self.io.copies(memory, whole)
                });
            let Some(payload) = payload else {
                self.held = Some(frame);
                return;
            };
            let header = Frame::ReadResponse(ReadResponse {
                request_id: r.request_id,
                range_id: r.range_id,
                offset: r.offset,
                status: Status::OK,
                length: r.length,
            });
            if header.encode(&mut self.out).is_err() {
                self.held = Some(frame);
                return;
            }
            ctx.activity.began();
            ctx.requests.fetch_add(1, Ordering::Relaxed);
            // Counted before the payload goes out: the peer has its
            // outcome only after.
            self.served.count(Op::Read, u64::from(r.length));
            self.behind.push_back(Behind {
                head_end: self.out.len(),
                payload,
                length: r.length,
            });
        }
    }

    /// Sends the READ answer in progress and the ones behind it, each its
    /// header and its payload, in one `sendmsg`; an answer that went out
    /// whole is done and the next behind it is in progress (with its own
    /// `io_timeout`).
    fn send_behind(
        &mut self,
        stream: &TcpStream,
        ctx: &ServeCtx<'_>,
        now: Instant,
        budget: &mut Budget,
    ) -> Result<Flow, End> {
        let Task::Read {
            payload, head_end, ..
        } = &self.task
        else {
            return Ok(Flow::Go);
        };
        let mut pieces = [SendPiece::Bytes(&[]); 2 * (BEHIND_MAX + 1)];
        let mut from = self.sent;
        let answers = std::iter::once((*head_end, payload))
            .chain(self.behind.iter().map(|b| (b.head_end, &b.payload)));
        for ((head_end, payload), two) in answers.zip(pieces.chunks_exact_mut(2)) {
            let (memory, (off, end), _) = payload.unsent();
            two[0] = SendPiece::Bytes(&self.out[from..head_end]);
            two[1] = SendPiece::Range(memory, off, end - off);
            from = head_end;
        }
        let sent = match HostMemory::send_gathered(stream.as_fd(), &pieces, true) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(Flow::Go),
            Err(e) => return Err(End::Close(stalled(ctx.cfg, &e))),
        };
        budget.spend(sent);
        let mut left = sent;
        while let Task::Read {
            payload,
            length,
            head_end,
        } = &mut self.task
        {
            let head = (*head_end - self.sent).min(left);
            self.sent += head;
            left -= head;
            let (_, (off, end), _) = payload.unsent();
            let body = (end - off).min(left);
            payload.sent(body);
            left -= body;
            if self.sent < *head_end || !payload.piece_sent() {
                break;
            }
            ctx.bytes.fetch_add(u64::from(*length), Ordering::Relaxed);
            let Some(b) = self.behind.pop_front() else {
                self.out.clear();
                self.sent = 0;
                self.done(ctx);
                return Ok(Flow::Go);
            };
            self.task = Task::Read {
                payload: b.payload,
                length: b.length,
                head_end: b.head_end,
            };
            self.due = Some(now + ctx.cfg.io_timeout);
        }
        // The socket took less than was offered: wait until it drains.
        Ok(Flow::Wait(Some(Interest::WRITABLE), None))
    }

    /// Sets the socket's receive mark to `mark` unless it is set already.
    /// A refusal costs only the wake-ups the mark would have saved.
    fn mark(&mut self, stream: &TcpStream, mark: u32) {
        if mark == self.lowat {
            return;
        }
        match orbitte_memory::set_recv_lowat(stream.as_fd(), mark) {
            Ok(()) => self.lowat = mark,
            Err(e) => tracing::debug!(error = %e, mark, "cannot set the receive mark"),
        }
    }

    /// The request in progress is served.
    fn done(&mut self, ctx: &ServeCtx<'_>) {
        self.task = Task::Next;
        self.due = None;
        ctx.activity.ended();
    }

    /// Gathers the answer of a WRITE whose payload was taken.
    fn answer(&mut self, w: WriteRequest, status: Status, ctx: &ServeCtx<'_>) -> Result<Flow, End> {
        if self.out.is_empty() {
            self.acknowledged = 0;
        }
        Frame::WriteResponse(WriteResponse {
            request_id: w.request_id,
            range_id: w.range_id,
            offset: w.offset,
            status,
            length: if status.is_ok() { w.length } else { 0 },
        })
        .encode(&mut self.out)
        .map_err(|e| End::Close(stalled(ctx.cfg, &std::io::Error::other(e))))?;
        self.acknowledged += u64::from(w.length);
        self.done(ctx);
        Ok(Flow::Go)
    }

    /// Between requests: sends the answers that must go first, decodes the
    /// next request, or receives more; waits when nothing more came.
    fn next_request(
        &mut self,
        stream: &TcpStream,
        ctx: &ServeCtx<'_>,
        now: Instant,
        budget: &mut Budget,
    ) -> Result<Flow, End> {
        let unsent = self.out.len() - self.sent;
        if unsent > 0
            && (self.acknowledged >= ANSWER_BATCH || unsent >= OUT_MAX)
            && !self.flush(stream, ctx, now)?
        {
            return Ok(Flow::Wait(Some(Interest::WRITABLE), None));
        }
        if let Some(frame) = self.held.take() {
            return self.serve(frame, ctx, now);
        }
        match self.frames.next() {
            Ok(Some(frame)) => {
                budget.frames -= 1;
                self.serve(frame, ctx, now)
            }
            Ok(None) => match self.frames.fill(stream, true) {
                Ok(0) => Err(End::Close(CloseReason::normal(
                    "peer closed the connection",
                ))),
                Ok(n) => {
                    budget.spend(n);
                    self.frame_on_time(ctx)?;
                    Ok(Flow::Go)
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // Nothing more came: the gathered answers go before
                    // the session waits.
                    if !self.flush(stream, ctx, now)? {
                        return Ok(Flow::Wait(Some(Interest::WRITABLE), None));
                    }
                    self.frame_on_time(ctx)?;
                    if self.frames.is_empty()
                        && let Some(reason) = quiet(stream, ctx)
                    {
                        return Err(End::Close(reason));
                    }
                    Ok(Flow::Wait(Some(Interest::READABLE), None))
                }
                Err(e) => Err(End::Close(CloseReason::abnormal(format!(
                    "connection failed: {e}"
                )))),
            },
            Err(SessionError::Malformed(e)) => Err(End::refuse(
                e.error_code(),
                e.frame,
                e.to_string(),
                format!("malformed frame: {e}"),
            )),
            Err(e) => Err(End::Close(CloseReason::abnormal(format!(
                "connection failed: {e}"
            )))),
        }
    }

    /// A started frame must complete within `frame_timeout`.
    fn frame_on_time(&self, ctx: &ServeCtx<'_>) -> Result<(), End> {
        if self.frames.overdue(ctx.cfg.frame_timeout) {
            return Err(End::refuse(
                ErrorCode::TIMEOUT,
                FrameType(0),
                "frame not completed in time".to_owned(),
                format!(
                    "peer did not complete a frame (truncated frame) within {:?}",
                    ctx.cfg.frame_timeout
                ),
            ));
        }
        Ok(())
    }

    /// A decoded frame: its length and epoch checked, then served (or held
    /// back by the `serve_delay` knob).
    fn serve(&mut self, frame: Frame, ctx: &ServeCtx<'_>, now: Instant) -> Result<Flow, End> {
        if self.frames.payload_len() != u64::from(frame.payload_len()) {
            let msg = format!(
                "{} announces {} payload bytes in its header and {} in its body",
                frame.frame_type(),
                self.frames.payload_len(),
                frame.payload_len()
            );
            let why = format!("malformed frame: {msg}");
            return Err(End::refuse(
                ErrorCode::MALFORMED_FRAME,
                frame.frame_type(),
                msg,
                why,
            ));
        }
        ctx.activity.began();
        // The epoch rule on every request: a newer incarnation of the
        // source may have been admitted since this session opened.
        let current = authoritative_epoch(ctx);
        if current != Some(ctx.peer.epoch) {
            let msg = format!(
                "session of {} at epoch {} is superseded (authoritative epoch {:?})",
                ctx.peer.source_id,
                ctx.peer.epoch,
                current.map(|e| e.value())
            );
            return Err(End::refuse(
                ErrorCode::STALE_EPOCH,
                frame.frame_type(),
                msg.clone(),
                msg,
            ));
        }
        if let Frame::ReadRequest(_) | Frame::WriteRequest(_) = &frame {
            ctx.requests.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(any(test, feature = "testing"))]
        if !ctx.cfg.serve_delay.is_zero() {
            let base = match self.paced {
                Some(p) if now < p + PACE_GAP => p,
                _ => now,
            };
            self.task = Task::Delayed(frame, base + ctx.cfg.serve_delay);
            return Ok(Flow::Go);
        }
        self.apply(frame, ctx, now)
    }

    /// Serves a checked frame: starts its answer or its payload, or
    /// gathers its answer.
    fn apply(&mut self, frame: Frame, ctx: &ServeCtx<'_>, now: Instant) -> Result<Flow, End> {
        let fail = |e: std::io::Error| End::Close(stalled(ctx.cfg, &e));
        // A whole answer (a READ's payload, a WRITE's payload and its
        // answer) must move within io_timeout, however the peer paces it.
        let deadline = now + ctx.cfg.io_timeout;
        match frame {
            Frame::ReadRequest(r) => {
                // A device range's first piece is copied here, before the
                // header: a failed copy is the answer's status.
                let payload = check(
                    ctx.ranges,
                    r.range_id,
                    r.token,
                    r.offset,
                    r.length,
                    AccessFlags::REMOTE_READ,
                )
                .and_then(|p| ReadPayload::of(&p.memory, p.offset + r.offset, r.length));
                match payload {
                    Ok(payload) => {
                        Frame::ReadResponse(ReadResponse {
                            request_id: r.request_id,
                            range_id: r.range_id,
                            offset: r.offset,
                            status: Status::OK,
                            length: r.length,
                        })
                        .encode(&mut self.out)
                        .map_err(|e| fail(std::io::Error::other(e)))?;
                        // Counted before the payload goes out: the peer
                        // has its outcome only after.
                        self.served.count(Op::Read, u64::from(r.length));
                        self.task = Task::Read {
                            payload,
                            length: r.length,
                            head_end: self.out.len(),
                        };
                        self.due = Some(deadline);
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
                        .encode(&mut self.out)
                        .map_err(|e| fail(std::io::Error::other(e)))?;
                        self.done(ctx);
                    }
                }
                Ok(Flow::Go)
            }
            Frame::WriteRequest(w) => {
                let len = w.length as usize;
                let payload = check(
                    ctx.ranges,
                    w.range_id,
                    w.token,
                    w.offset,
                    w.length,
                    AccessFlags::REMOTE_WRITE,
                )
                .and_then(|p| WritePayload::of(&p.memory, p.offset + w.offset, w.length));
                match payload {
                    Ok(mut payload) => {
                        let buffered = self.frames.take_payload(len);
                        let n = buffered.len();
                        let landed = payload.buffered(buffered).map_err(fail)?;
                        self.frames.payload_received((len - n) as u64);
                        self.task = match landed {
                            Landed::Failed { left } => Task::Discard {
                                left,
                                w,
                                status: Status::INTERNAL,
                            },
                            Landed::More | Landed::All => Task::Write { payload, w },
                        };
                    }
                    Err(status) => {
                        tracing::debug!(session = ?ctx.session, range = w.range_id.0, %status, "write refused");
                        let n = self.frames.take_payload(len).len();
                        self.frames.payload_received((len - n) as u64);
                        self.task = Task::Discard {
                            left: (len - n) as u64,
                            w,
                            status,
                        };
                    }
                }
                self.due = Some(deadline);
                Ok(Flow::Go)
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
                    return Err(End::refuse(
                        ErrorCode::STALE_EPOCH,
                        frame.frame_type(),
                        msg.clone(),
                        msg,
                    ));
                }
                self.done(ctx);
                Ok(Flow::Go)
            }
            // Sent after every WRITE of its batch was answered, and this
            // session answers a WRITE only after its bytes are applied.
            // Answered on this session: queued or refused.
            Frame::Notification(n) => {
                let answer = ctx.ranges.notification(ctx.peer, PathKind::Tcp, n);
                Frame::NotificationAnswer(answer)
                    .encode(&mut self.out)
                    .map_err(|e| fail(std::io::Error::other(e)))?;
                self.done(ctx);
                Ok(Flow::Go)
            }
            Frame::Goodbye(g) => Err(End::Close(CloseReason::normal(format!(
                "peer said goodbye ({}: {})",
                g.reason, g.message
            )))),
            Frame::Error(e) => Err(End::Close(CloseReason::abnormal(format!(
                "peer sent error {}: {}",
                e.code, e.message
            )))),
            other => {
                let msg = format!(
                    "{} is not allowed after the handshake on a tcp session",
                    other.frame_type()
                );
                Err(End::refuse(
                    ErrorCode::UNEXPECTED_FRAME,
                    other.frame_type(),
                    msg.clone(),
                    msg,
                ))
            }
        }
    }
}

/// What a quiet session (nothing buffered, nothing to send) checks: the
/// listener stops, `idle_timeout` passed, or a newcomer took its slot.
/// Says goodbye and why it closes; `None`: it stays open.
pub(crate) fn quiet(stream: &TcpStream, ctx: &ServeCtx<'_>) -> Option<CloseReason> {
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

/// Best effort: a socket without room for it leaves it out.
fn goodbye(stream: &TcpStream, reason: GoodbyeReason, text: &str) -> Result<(), SessionError> {
    let f = Frame::Goodbye(orbitte_wire::Goodbye {
        reason,
        message: Message::truncating(text),
    });
    let mut scratch = Vec::new();
    write_frame(&mut &*stream, &f, &mut scratch)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::socket::PAYLOAD_LOWAT;
    use super::*;

    #[test]
    fn the_receive_mark_never_passes_the_rest_and_is_lifted_once_nothing_waits() {
        assert_eq!(receive_mark(true, 1000), 1000);
        assert_eq!(receive_mark(true, 1), 1);
        // A payload whose room is used up waits for no byte of it.
        assert_eq!(receive_mark(true, 0), 1);
        assert_eq!(receive_mark(true, PAYLOAD_LOWAT), PAYLOAD_LOWAT as u32);
        assert_eq!(receive_mark(true, 16 << 20), PAYLOAD_LOWAT as u32);
        for rest in [0, 1, 4096, 1 << 20] {
            assert_eq!(receive_mark(false, rest), 1, "rest {rest}");
        }
    }
}
