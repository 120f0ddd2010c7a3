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

/// Body bytes buffered per step: a header announcing a large body costs
/// memory only as its bytes arrive.
const BODY_STEP: usize = 64 << 10;

/// Reads frames into a buffer it reuses (no allocation per frame once
/// warm). The buffer grows as body bytes arrive, never to the length a
/// header announces, and is released after a frame larger than
/// [`BODY_STEP`], so an idle connection holds no large buffer.
#[derive(Debug)]
pub(crate) struct FrameReader {
    buf: Vec<u8>,
    /// Largest `body_len` accepted for any frame type, on top of the
    /// per-type bounds of [`orbitte_wire::max_body_len`].
    limit: u32,
}

impl Default for FrameReader {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameReader {
    /// A reader bounded by the per-type limits only.
    pub(crate) fn new() -> Self {
        Self::with_limit(u32::MAX)
    }

    /// A reader that also refuses any frame whose header announces more
    /// than `limit` body bytes (before the peer authenticated: the
    /// handshake frames' bound).
    pub(crate) fn with_limit(limit: u32) -> Self {
        Self {
            buf: Vec::new(),
            limit,
        }
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
        if header.body_len > self.limit {
            return Err(SessionError::Malformed(orbitte_wire::DecodeError {
                frame: header.frame_type,
                field: "header.body_len",
                problem: orbitte_wire::Problem::TooLong {
                    len: header.body_len.into(),
                    max: self.limit.into(),
                },
            }));
        }
        let fixed = header.fixed_len();
        self.buf.clear();
        while self.buf.len() < fixed {
            let done = self.buf.len();
            self.buf.resize(done + (fixed - done).min(BODY_STEP), 0);
            read_exact_by(
                c,
                &mut self.buf[done..],
                deadline,
                "a frame body (truncated frame)",
            )?;
        }
        let frame = orbitte_wire::decode_body(&header, &self.buf);
        if self.buf.capacity() > BODY_STEP {
            self.buf = Vec::new();
        }
        Ok(frame?)
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
    frame.encode(scratch)?;
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

/// Closes our sending side after a refusal and reads what the peer still
/// sends (up to `LINGER_BYTES`, for at most `LINGER`), so that the peer
/// reads our error frame before the close: closing a socket whose receive
/// queue holds unread bytes resets the connection, and a reset can reach
/// the peer before the error frame does.
pub(crate) fn close_after_refusal(stream: &mut TcpStream) {
    const LINGER: Duration = Duration::from_millis(500);
    const LINGER_BYTES: usize = 64 * 1024;
    if stream.shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    let deadline = Instant::now() + LINGER;
    let mut sink = [0u8; 4096];
    let mut read = 0;
    while read < LINGER_BYTES {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(n) => read += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orbitte_wire::{
        AccessFlags, AccessToken, Epoch, Gid, NicId, NicRkey, RangeDescriptor, RangeId,
        SegmentPublication,
    };

    fn large_publication() -> Frame {
        let ranges = (0..1024)
            .map(|i| RangeDescriptor {
                range_id: RangeId(i),
                address: i << 20,
                length: 1 << 20,
                access: AccessFlags::REMOTE_READ,
                token: AccessToken(i),
                rkeys: (0..4)
                    .map(|n| NicRkey {
                        nic_id: NicId(n),
                        rkey: u32::from(n),
                        lid: 0,
                        gid: Gid([0; 16]),
                    })
                    .collect(),
                local: None,
            })
            .collect();
        Frame::SegmentPublication(SegmentPublication {
            epoch: Epoch::MIN,
            ranges,
        })
    }

    #[test]
    fn a_large_frame_leaves_no_large_buffer_behind() {
        let frame = large_publication();
        let mut bytes = Vec::new();
        frame.encode(&mut bytes).unwrap();
        assert!(bytes.len() > 2 * BODY_STEP, "{} bytes", bytes.len());
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || a.write_all(&bytes));
        let mut reader = FrameReader::new();
        let got = reader.read(&mut b, None, Duration::from_secs(30)).unwrap();
        writer.join().unwrap().unwrap();
        assert_eq!(got, frame);
        assert!(
            reader.buf.capacity() <= BODY_STEP,
            "the reader kept {} bytes after the frame",
            reader.buf.capacity()
        );
    }

    #[test]
    fn a_reader_with_a_limit_refuses_a_larger_header_before_its_body() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let header = FrameHeader {
            version: orbitte_wire::PROTOCOL_VERSION,
            frame_type: FrameType::SEGMENT_PUBLICATION,
            body_len: 1 << 20,
        };
        a.write_all(&header.encode()).unwrap();
        let mut reader = FrameReader::with_limit(orbitte_wire::MAX_SMALL_BODY_LEN);
        match reader.read(&mut b, None, Duration::from_secs(30)) {
            Err(SessionError::Malformed(e)) => {
                assert_eq!(e.field, "header.body_len");
                assert_eq!(e.error_code(), ErrorCode::FRAME_TOO_LARGE);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(reader.buf.capacity(), 0, "nothing buffered");
    }
}
