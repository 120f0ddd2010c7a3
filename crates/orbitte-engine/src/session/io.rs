//! Reading and writing wire frames on blocking sockets, with bounds.
//!
//! A frame may take as long as it likes to *start* (up to the caller's idle
//! bound), but once its first byte arrived, its header and fixed part must
//! arrive within the frame timeout. A peer that stops mid-frame (a truncated
//! frame) is therefore cut off within a bound, whatever it does.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use orbitte_wire::{
    ErrorCode, ErrorFrame, Frame, FrameHeader, FrameType, HEADER_LEN, Message, RequestId,
};

use super::SessionError;

/// A blocking byte stream with settable timeouts (TCP or unix).
pub(crate) trait Conn: Read + Write {
    fn set_read_timeout_(&self, d: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout_(&self, d: Option<Duration>) -> io::Result<()>;
}

impl Conn for TcpStream {
    fn set_read_timeout_(&self, d: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(d)
    }
    fn set_write_timeout_(&self, d: Option<Duration>) -> io::Result<()> {
        self.set_write_timeout(d)
    }
}

impl Conn for UnixStream {
    fn set_read_timeout_(&self, d: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(d)
    }
    fn set_write_timeout_(&self, d: Option<Duration>) -> io::Result<()> {
        self.set_write_timeout(d)
    }
}

impl<C: Conn + ?Sized> Conn for &mut C {
    fn set_read_timeout_(&self, d: Option<Duration>) -> io::Result<()> {
        (**self).set_read_timeout_(d)
    }
    fn set_write_timeout_(&self, d: Option<Duration>) -> io::Result<()> {
        (**self).set_write_timeout_(d)
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Reads exactly `buf.len()` bytes before `deadline`.
///
/// The socket timeout is set once to the time left and set again only
/// after a read timed out, so a peer that trickles bytes is cut off within
/// twice the bound at worst, and a fast peer costs one `setsockopt`.
pub(crate) fn read_exact_by<C: Conn>(
    c: &mut C,
    buf: &mut [u8],
    deadline: Instant,
    what: &'static str,
) -> Result<(), SessionError> {
    let mut done = 0;
    let mut armed = false;
    while done < buf.len() {
        let now = Instant::now();
        if now >= deadline {
            return Err(SessionError::Timeout { what });
        }
        if !armed {
            c.set_read_timeout_(Some((deadline - now).max(Duration::from_millis(1))))?;
            armed = true;
        }
        match c.read(&mut buf[done..]) {
            Ok(0) => return Err(SessionError::Closed { during: what }),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => armed = false,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Reads frames into a buffer it reuses (no allocation per frame once warm).
#[derive(Debug, Default)]
pub(crate) struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Reads one frame's header and body (for a data frame: its fixed part;
    /// the payload is left on the socket for the caller).
    ///
    /// `idle`: how long to wait for the frame's first byte (`None`: forever);
    /// past it the error is [`SessionError::Idle`], and nothing was consumed.
    pub(crate) fn read<C: Conn>(
        &mut self,
        c: &mut C,
        idle: Option<Duration>,
        frame_timeout: Duration,
    ) -> Result<Frame, SessionError> {
        let mut header = [0u8; HEADER_LEN];
        c.set_read_timeout_(idle)?;
        // Up to a whole header in one read (never more: the payload that
        // may follow is the caller's to move).
        let got = loop {
            match c.read(&mut header) {
                Ok(0) => {
                    return Err(SessionError::Closed {
                        during: "waiting for a frame",
                    });
                }
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => return Err(SessionError::Idle),
                Err(e) => return Err(e.into()),
            }
        };
        let deadline = Instant::now() + frame_timeout;
        read_exact_by(
            c,
            &mut header[got..],
            deadline,
            "a frame header (truncated frame)",
        )?;
        let header = FrameHeader::decode(&header)?;
        let fixed = header.fixed_len();
        self.buf.clear();
        self.buf.resize(fixed, 0);
        read_exact_by(c, &mut self.buf, deadline, "a frame body (truncated frame)")?;
        Ok(orbitte_wire::decode_body(&header, &self.buf)?)
    }
}

/// Writes a complete frame (header + body; a data frame's payload is the
/// caller's to send right after).
pub(crate) fn write_frame<W: Write>(
    w: &mut W,
    frame: &Frame,
    scratch: &mut Vec<u8>,
) -> Result<(), SessionError> {
    scratch.clear();
    frame
        .encode(scratch)
        .map_err(|e| SessionError::Protocol(e.to_string()))?;
    w.write_all(scratch)?;
    Ok(())
}

/// Best effort: tells the peer why we close. Errors are ignored (the peer
/// may be gone, which is often why we close).
pub(crate) fn send_error<W: Write>(
    w: &mut W,
    code: ErrorCode,
    frame_type: FrameType,
    message: &str,
) {
    let frame = Frame::Error(ErrorFrame {
        code,
        frame_type,
        request_id: RequestId(0),
        message: Message::truncating(message),
    });
    let mut scratch = Vec::new();
    let _ = write_frame(w, &frame, &mut scratch);
}
