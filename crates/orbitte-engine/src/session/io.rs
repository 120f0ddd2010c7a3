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

/// Bytes a [`FrameBuffer`] holds for small frames; it grows past this only
/// for a frame whose header and fixed part do not fit, as its bytes arrive.
const FRAME_BUFFER: usize = 4 << 10;

/// Reads frames from a socket through a small buffer: one `recv` brings
/// every frame already waiting (a batch's answers or requests), and they
/// are decoded from the buffer without a system call each. A data frame's
/// payload is the caller's: the part that arrived in the buffer with the
/// header is taken with [`take_payload`](Self::take_payload), the rest is
/// received from the socket straight into its destination. The buffer is
/// small (so little of a payload goes through it), grows only as the bytes
/// of a larger frame arrive (at most twice what arrived) and shrinks back
/// once that frame is decoded.
///
/// The socket's receive timeout is the caller's, set once: a
/// [`fill`](Self::fill) that finds nothing within it returns `WouldBlock`,
/// and [`overdue`](Self::overdue) tells whether a frame that started has
/// been incomplete for longer than the frame timeout.
#[derive(Debug)]
pub(crate) struct FrameBuffer {
    /// Storage; bytes `start..end` are received and not yet consumed.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Bytes the frame at `start` needs in the buffer (header and fixed
    /// part), once its header arrived.
    need: usize,
    /// Payload bytes of the last decoded data frame not yet taken.
    payload: u64,
    /// When the incomplete frame at `start` was first seen.
    partial_since: Option<Instant>,
}

impl Default for FrameBuffer {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameBuffer {
    /// An empty buffer.
    pub(crate) fn new() -> Self {
        Self {
            buf: vec![0; FRAME_BUFFER],
            start: 0,
            end: 0,
            need: HEADER_LEN,
            payload: 0,
            partial_since: None,
        }
    }

    /// Decodes the next frame whose header and fixed part are buffered
    /// (`Ok(None)`: not complete yet, [`fill`](Self::fill) next). After a
    /// data frame, its [`payload_len`](Self::payload_len) bytes follow:
    /// take them (buffered part and socket) before the next frame.
    pub(crate) fn next(&mut self) -> Result<Option<Frame>, SessionError> {
        debug_assert_eq!(self.payload, 0, "payload of the last frame not taken");
        let avail = &self.buf[self.start..self.end];
        let Some(head) = avail.first_chunk::<HEADER_LEN>() else {
            return Ok(self.incomplete(HEADER_LEN));
        };
        let header = FrameHeader::decode(head)?;
        let need = HEADER_LEN + header.fixed_len();
        if avail.len() < need {
            return Ok(self.incomplete(need));
        }
        let frame = orbitte_wire::decode_body(&header, &avail[HEADER_LEN..need])?;
        self.start += need;
        self.need = HEADER_LEN;
        self.payload = u64::from(header.payload_len());
        self.partial_since = None;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > BODY_STEP {
                self.buf = vec![0; FRAME_BUFFER];
            }
        }
        Ok(Some(frame))
    }

    /// The type of the next frame when its header and fixed part are all
    /// buffered (so [`next`](Self::next) would decode it), without
    /// consuming it; `None` otherwise, or when its header is bad (which
    /// `next` then reports).
    pub(crate) fn next_whole(&self) -> Option<FrameType> {
        if self.payload != 0 {
            return None;
        }
        let avail = &self.buf[self.start..self.end];
        let header = FrameHeader::decode(avail.first_chunk::<HEADER_LEN>()?).ok()?;
        (avail.len() >= HEADER_LEN + header.fixed_len()).then_some(header.frame_type)
    }

    fn incomplete(&mut self, need: usize) -> Option<Frame> {
        self.need = need;
        if self.start < self.end && self.partial_since.is_none() {
            self.partial_since = Some(Instant::now());
        }
        None
    }

    /// Payload bytes of the last decoded frame still to take.
    pub(crate) fn payload_len(&self) -> u64 {
        self.payload
    }

    /// Takes up to `max` of the payload bytes that are already buffered
    /// (the caller then receives the rest of the payload from the socket
    /// and reports it with [`payload_received`](Self::payload_received)).
    pub(crate) fn take_payload(&mut self, max: usize) -> &[u8] {
        let n = (self.end - self.start)
            .min(max)
            .min(usize::try_from(self.payload).unwrap_or(usize::MAX));
        let at = self.start;
        self.start += n;
        self.payload -= n as u64;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        &self.buf[at..at + n]
    }

    /// The caller received `n` payload bytes from the socket itself.
    pub(crate) fn payload_received(&mut self, n: u64) {
        self.payload = self.payload.saturating_sub(n);
    }

    /// Whether buffered bytes (a started frame, or payload) wait.
    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Whether a frame started and has stayed incomplete for longer than
    /// `frame_timeout`.
    pub(crate) fn overdue(&self, frame_timeout: Duration) -> bool {
        self.partial_since
            .is_some_and(|t| t.elapsed() >= frame_timeout)
    }

    /// Free space, at most `max` bytes, for the bytes that follow a payload
    /// being received from the socket (the next frame's header), to be
    /// received in the same system call ([`HostMemory::recv_from_then`]);
    /// report how many arrived in it with [`filled`](Self::filled). Empty
    /// while buffered bytes wait (the payload's own come first: take them
    /// with [`take_payload`](Self::take_payload)). A `max` of one header
    /// and fixed part keeps the next payload out of the buffer, so that it
    /// too is received straight into its destination.
    ///
    /// [`HostMemory::recv_from_then`]: orbitte_memory::HostMemory::recv_from_then
    pub(crate) fn spare(&mut self, max: usize) -> &mut [u8] {
        if self.start != self.end {
            return &mut [];
        }
        self.start = 0;
        self.end = 0;
        let n = max.min(self.buf.len());
        &mut self.buf[..n]
    }

    /// `n` bytes were received into [`spare`](Self::spare).
    pub(crate) fn filled(&mut self, n: usize) {
        debug_assert!(n <= self.buf.len() - self.end);
        self.end = (self.end + n).min(self.buf.len());
    }

    /// One `recv` into the buffer (`dont_wait`: return `WouldBlock` at once
    /// when nothing waits; otherwise the socket's receive timeout applies).
    /// `Ok(0)`: the peer closed. Call it only while the payload of the last
    /// frame has been taken.
    pub(crate) fn fill(
        &mut self,
        sock: &impl std::os::fd::AsFd,
        dont_wait: bool,
    ) -> io::Result<usize> {
        if self.start > 0 && self.buf.len() - self.end < self.need.max(HEADER_LEN) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            // Full with one incomplete frame larger than the buffer: grow
            // by what arrived, up to what the frame needs.
            let len = (self.buf.len() * 2).min(self.start + self.need.max(self.buf.len() + 1));
            self.buf.resize(len, 0);
        }
        let flags = if dont_wait {
            rustix::net::RecvFlags::DONTWAIT
        } else {
            rustix::net::RecvFlags::empty()
        };
        loop {
            match rustix::net::recv(sock.as_fd(), &mut self.buf[self.end..], flags) {
                Ok((n, _)) => {
                    self.end += n;
                    return Ok(n);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
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
