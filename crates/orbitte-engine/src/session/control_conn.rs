//! An admitted rdma control link, on an I/O loop of the listener's pool
//! ([`crate::io_pool`]) for its whole life, from the setup of its rails
//! on, idle or busy: its socket is non-blocking, the frames the peer sends
//! (its publication and its connect request, then its requests to
//! re-establish one of its rails) are read as they arrive and answered by
//! the engine's [`ControlSession`], and the answers are sent as the socket
//! takes them. One frame is answered at a time: while an answer waits for
//! room, nothing more is read, so a peer that does not read is throttled
//! by its own window. A link that ends with a last frame for the peer (an
//! error, a reject, a malformed frame answered) closes through a
//! [`Refusal`], which sends it and lingers.
//!
//! Bounds, checked every [`CHECK`]: the rails must be set up within
//! `handshake_timeout` of the admission; a frame that started must
//! finish, and a waiting answer must leave, within `frame_timeout`; the
//! link closes when the listener stops.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::time::Instant;

use mio::Interest;

use orbitte_wire::{ErrorFrame, Frame, Message, RequestId};

use super::SessionError;
use super::data::{Admitted, CHECK};
use super::io::FrameBuffer;
use super::nonblocking::{Outbox, Refusal};
use super::serving::{ControlEnd, ControlSession};
use crate::io_pool::{Next, Watched};
use crate::transport::tcp::serve::CloseReason;

/// How many reads one readiness makes at most before the loop's other
/// descriptors get their turn (the registration is level-triggered).
const READS_PER_TURN: usize = 16;

/// An admitted rdma control link on its loop.
#[derive(Debug)]
pub(crate) struct ControlConn {
    conn: Admitted,
    link: Box<dyn ControlSession>,
    /// A frame that started and is not complete (`None` between frames:
    /// an idle link holds no buffer).
    frames: Option<FrameBuffer>,
    /// An answer waiting for room, and since when.
    out: Outbox,
    out_since: Option<Instant>,
    /// When the rails must be up.
    set_up_by: Instant,
}

impl ControlConn {
    /// Puts the link, just admitted, on the listener's pool (closes it
    /// when the pool is gone or its socket cannot be made non-blocking).
    pub(crate) fn start(conn: Admitted, link: Box<dyn ControlSession>) {
        let Some(pool) = conn.shared.pool.upgrade() else {
            return conn.close(CloseReason::normal("listener shut down"));
        };
        if let Err(e) = conn.stream.set_nonblocking(true) {
            return conn.close(CloseReason::abnormal(format!(
                "cannot serve the rdma control link: {e}"
            )));
        }
        let set_up_by = Instant::now() + conn.shared.cfg.handshake_timeout;
        let c = Box::new(Self {
            conn,
            link,
            frames: None,
            out: Outbox::default(),
            out_since: None,
            set_up_by,
        });
        pool.watch(c, Some(Instant::now() + CHECK));
    }

    fn finish(self, reason: CloseReason) {
        self.conn.close(reason);
    }

    /// Ends the link: its last frame, if any, sent after what waits (and
    /// the close lingers for the peer to read it), then closed.
    fn end(self, end: ControlEnd, now: Instant) -> Next {
        let Some(last) = end.last else {
            self.finish(end.reason);
            return Next::Done;
        };
        let Self { conn, mut out, .. } = self;
        let sock = match (out.push(&last), conn.stream.try_clone()) {
            (Ok(()), Ok(sock)) => sock,
            _ => {
                conn.close(end.reason);
                return Next::Done;
            }
        };
        let reason = end.reason;
        Refusal::start(sock, out, true, now, Box::new(move || conn.close(reason)))
    }

    /// Sends what waits and answers what arrived; `Err`: the link ends.
    fn serve(&mut self, now: Instant) -> Result<(), ControlEnd> {
        let failed = |e: &dyn std::fmt::Display| {
            ControlEnd::from(CloseReason::abnormal(format!(
                "rdma control link failed: {e}"
            )))
        };
        let mut frames = self.frames.take().unwrap_or_default();
        'reads: for turn in 0..=READS_PER_TURN {
            // One frame at a time: the next is taken once this one's
            // answer left.
            loop {
                match self.out.flush(&mut self.conn.stream) {
                    Ok(true) => self.out_since = None,
                    Ok(false) => {
                        self.out_since.get_or_insert(now);
                        break 'reads;
                    }
                    Err(e) => return Err(failed(&SessionError::Io(e))),
                }
                match frames.next() {
                    Ok(Some(frame)) => {
                        if frame.payload_len() != 0 {
                            return Err(failed(
                                &"the peer sent a data frame, which does not travel on it",
                            ));
                        }
                        if let Some(answer) = self.link.answer(frame)? {
                            self.out.push(&answer).map_err(|e| failed(&e))?;
                        }
                    }
                    Ok(None) => break,
                    Err(SessionError::Malformed(e)) => {
                        let last = Frame::Error(ErrorFrame {
                            code: e.error_code(),
                            frame_type: e.frame,
                            request_id: RequestId(0),
                            message: Message::truncating(e.to_string()),
                        });
                        return Err(ControlEnd {
                            last: Some(Box::new(last)),
                            reason: CloseReason::abnormal(format!(
                                "rdma control link failed: malformed frame: {e}"
                            )),
                        });
                    }
                    Err(e) => return Err(failed(&e)),
                }
            }
            if turn == READS_PER_TURN {
                // The rest waits for the loop's next round.
                break;
            }
            match frames.fill(&self.conn.stream, true) {
                Ok(0) => {
                    return Err(CloseReason::normal("rdma control link closed by the peer").into());
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(failed(&SessionError::Io(e))),
            }
        }
        if !frames.is_empty() {
            self.frames = Some(frames);
        }
        Ok(())
    }
}

impl Watched for ControlConn {
    fn fd(&self) -> RawFd {
        self.conn.stream.as_raw_fd()
    }

    fn interest(&self) -> Interest {
        if self.out_since.is_some() {
            Interest::WRITABLE
        } else {
            Interest::READABLE
        }
    }

    fn ready(mut self: Box<Self>, now: Instant) -> Next {
        if self.conn.shared.stop.load(Ordering::Acquire) {
            self.finish(CloseReason::normal("listener stopped"));
            return Next::Done;
        }
        match self.serve(now) {
            Ok(()) => Next::Wait(self, Some(now + CHECK)),
            Err(end) => self.end(end, now),
        }
    }

    fn expired(self: Box<Self>, now: Instant) -> Next {
        if self.conn.shared.stop.load(Ordering::Acquire) {
            self.finish(CloseReason::normal("listener stopped"));
            return Next::Done;
        }
        if !self.link.is_set_up() && now >= self.set_up_by {
            let bound = self.conn.shared.cfg.handshake_timeout;
            self.finish(CloseReason::abnormal(format!(
                "rdma control link failed: its rails were not set up within the handshake \
                 timeout ({bound:?}); the peer sent no publication or connect request in time \
                 (raise handshake_timeout for slow peers)"
            )));
            return Next::Done;
        }
        let bound = self.conn.shared.cfg.frame_timeout;
        if self.frames.as_ref().is_some_and(|f| f.overdue(bound)) {
            self.finish(CloseReason::abnormal(
                "rdma control link failed: a frame did not finish within the frame timeout \
                 (truncated frame)",
            ));
            return Next::Done;
        }
        if self
            .out_since
            .is_some_and(|t| now.saturating_duration_since(t) >= bound)
        {
            self.finish(CloseReason::abnormal(
                "rdma control link failed: the peer took no answer within the frame timeout",
            ));
            return Next::Done;
        }
        Next::Wait(self, Some(now + CHECK))
    }

    fn abandoned(self: Box<Self>, why: &str) {
        self.finish(CloseReason::normal(format!("session closed: {why}")));
    }
}
