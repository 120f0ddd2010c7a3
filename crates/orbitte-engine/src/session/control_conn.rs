//! An admitted rdma control link once its rails are up, on an I/O loop of
//! the listener's pool ([`crate::io_pool`]) for the rest of its life, idle
//! or busy: its socket is non-blocking, the frames the peer sends (its
//! requests to re-establish one of its rails) are read as they arrive and
//! answered by the engine's [`ControlSession`], and the answers are sent
//! as the socket takes them. One frame is answered at a time: while an
//! answer waits for room, nothing more is read, so a peer that does not
//! read is throttled by its own window.
//!
//! Bounds, checked every [`CHECK`]: a frame that started must finish,
//! and a waiting answer must leave, within `frame_timeout`; the link
//! closes when the listener stops.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::time::Instant;

use mio::Interest;

use super::SessionError;
use super::data::{Admitted, CHECK};
use super::io::FrameBuffer;
use super::nonblocking::Outbox;
use super::serving::ControlSession;
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
}

impl ControlConn {
    /// Puts the link on the listener's pool (closes it when the pool is
    /// gone or its socket cannot be made non-blocking).
    pub(crate) fn start(conn: Admitted, link: Box<dyn ControlSession>) {
        let Some(pool) = conn.shared.pool.upgrade() else {
            return conn.close(CloseReason::normal("listener shut down"));
        };
        if let Err(e) = conn.stream.set_nonblocking(true) {
            return conn.close(CloseReason::abnormal(format!(
                "cannot serve the rdma control link: {e}"
            )));
        }
        let c = Box::new(Self {
            conn,
            link,
            frames: None,
            out: Outbox::default(),
            out_since: None,
        });
        pool.watch(c, Some(Instant::now() + CHECK));
    }

    fn finish(self, reason: CloseReason) {
        self.conn.close(reason);
    }

    /// Sends what waits and answers what arrived; `Err`: the link ends.
    fn serve(&mut self, now: Instant) -> Result<(), CloseReason> {
        let failed = |e: &dyn std::fmt::Display| {
            CloseReason::abnormal(format!("rdma control link failed: {e}"))
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
                    Err(e) => return Err(failed(&e)),
                }
            }
            if turn == READS_PER_TURN {
                // The rest waits for the loop's next round.
                break;
            }
            match frames.fill(&self.conn.stream, true) {
                Ok(0) => {
                    return Err(CloseReason::normal("rdma control link closed by the peer"));
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
            Err(reason) => {
                self.finish(reason);
                Next::Done
            }
        }
    }

    fn expired(self: Box<Self>, now: Instant) -> Next {
        if self.conn.shared.stop.load(Ordering::Acquire) {
            self.finish(CloseReason::normal("listener stopped"));
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
