//! Frames on a non-blocking socket, for connections that live on an I/O
//! loop ([`crate::io_pool`]) before they are admitted: bytes to send kept
//! until the socket takes them ([`Outbox`]), one small frame read as its
//! bytes arrive ([`SmallFrameReader`]), and the close of a refused
//! connection that lets its error frame reach the peer ([`Refusal`]).
//! Nothing here blocks: a call that would wait answers what readiness to
//! wait for.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::{Duration, Instant};

use mio::Interest;
use orbitte_wire::{ErrorCode, ErrorFrame, Frame, FrameHeader, FrameType, HEADER_LEN, Message};

use super::SessionError;
use crate::io_pool::{Next, Watched};

/// Bytes to send, written as the socket takes them.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    buf: Vec<u8>,
    /// Bytes of `buf` sent already.
    sent: usize,
}

impl Outbox {
    /// Queues `frame` (header and body) after what waits.
    pub(crate) fn push(&mut self, frame: &Frame) -> Result<(), SessionError> {
        frame.encode(&mut self.buf)?;
        Ok(())
    }

    /// Queues an error frame telling the peer why it is refused (a frame
    /// that cannot be encoded is left out: the close says enough).
    pub(crate) fn push_error(&mut self, code: ErrorCode, frame_type: FrameType, message: &str) {
        let frame = Frame::Error(ErrorFrame {
            code,
            frame_type,
            request_id: orbitte_wire::RequestId(0),
            message: Message::truncating(message),
        });
        let len = self.buf.len();
        if frame.encode(&mut self.buf).is_err() {
            self.buf.truncate(len);
        }
    }

    /// Writes what waits until the socket would block; `Ok(true)`: all
    /// of it is sent.
    pub(crate) fn flush<W: Write>(&mut self, w: &mut W) -> io::Result<bool> {
        while self.sent < self.buf.len() {
            match w.write(&self.buf[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        self.buf.clear();
        self.sent = 0;
        Ok(true)
    }
}

/// Reads one frame of at most `limit` body bytes from a non-blocking
/// socket as its bytes arrive, never reading past its end (what follows
/// is the next reader's). A header announcing a larger body is refused
/// before any of it is read.
#[derive(Debug)]
pub(crate) struct SmallFrameReader {
    buf: Vec<u8>,
    header: Option<FrameHeader>,
    limit: u32,
}

impl SmallFrameReader {
    /// A reader of frames up to `limit` body bytes.
    pub(crate) fn new(limit: u32) -> Self {
        Self {
            buf: Vec::new(),
            header: None,
            limit,
        }
    }

    /// Reads what arrived; `Ok(None)`: the frame is not complete yet (wait
    /// until the socket is readable).
    pub(crate) fn poll<R: Read>(&mut self, r: &mut R) -> Result<Option<Frame>, SessionError> {
        loop {
            let need = match &self.header {
                None => HEADER_LEN,
                Some(h) => HEADER_LEN + h.fixed_len(),
            };
            if self.buf.len() == need {
                match self.header {
                    None => {
                        let mut head = [0u8; HEADER_LEN];
                        head.copy_from_slice(&self.buf);
                        let header = FrameHeader::decode(&head)?;
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
                        self.header = Some(header);
                        continue;
                    }
                    Some(header) => {
                        let frame = orbitte_wire::decode_body(&header, &self.buf[HEADER_LEN..]);
                        self.buf = Vec::new();
                        self.header = None;
                        return Ok(Some(frame?));
                    }
                }
            }
            let have = self.buf.len();
            self.buf.resize(need, 0);
            match r.read(&mut self.buf[have..]) {
                Ok(0) => {
                    self.buf.truncate(have);
                    return Err(SessionError::Closed {
                        during: match (have, &self.header) {
                            (0, _) => "waiting for a frame",
                            (_, None) => "a frame header (truncated frame)",
                            (_, Some(_)) => "a frame body (truncated frame)",
                        },
                    });
                }
                Ok(n) => self.buf.truncate(have + n),
                Err(e) => {
                    self.buf.truncate(have);
                    match e.kind() {
                        io::ErrorKind::Interrupted => {}
                        io::ErrorKind::WouldBlock => return Ok(None),
                        _ => return Err(e.into()),
                    }
                }
            }
        }
    }
}

/// How long a refused connection is kept for its error frame to leave
/// and be read; at most [`LINGER_BYTES`] the peer still sends are read
/// meanwhile.
pub(crate) const LINGER: Duration = Duration::from_millis(500);
/// See [`LINGER`].
pub(crate) const LINGER_BYTES: usize = 64 * 1024;

/// A refused connection on its loop: its error frame is sent as the
/// socket takes it, then (`linger`) our sending side is shut and what the
/// peer still sends is read and dropped until it closes, so that the peer
/// reads the frame before the close (closing a socket whose receive queue
/// holds unread bytes resets the connection, and a reset can overtake the
/// frame). All within [`LINGER`]; then `closed` runs and the socket is
/// closed.
pub(crate) struct Refusal<S> {
    sock: S,
    out: Outbox,
    linger: bool,
    /// Our sending side is shut: the frame is out.
    shut: bool,
    read: usize,
    deadline: Instant,
    closed: Option<Box<dyn FnOnce() + Send>>,
}

impl<S: Read + Write + AsFd + AsRawFd + Send + 'static> Refusal<S> {
    /// Sends what `out` holds on `sock` and closes it, lingering if
    /// `linger`; `closed` runs once it is closed. Returns what its loop
    /// does with it.
    pub(crate) fn start(
        sock: S,
        out: Outbox,
        linger: bool,
        now: Instant,
        closed: Box<dyn FnOnce() + Send>,
    ) -> Next {
        Box::new(Self {
            sock,
            out,
            linger,
            shut: false,
            read: 0,
            deadline: now + LINGER,
            closed: Some(closed),
        })
        .advance()
    }

    fn advance(mut self: Box<Self>) -> Next {
        if !self.shut {
            match self.out.flush(&mut self.sock) {
                Ok(true) if self.linger => {
                    if rustix::net::shutdown(self.sock.as_fd(), rustix::net::Shutdown::Write)
                        .is_err()
                    {
                        return self.close();
                    }
                    self.shut = true;
                }
                Ok(false) => {
                    let at = self.deadline;
                    return Next::Wait(self, Some(at));
                }
                Ok(true) | Err(_) => return self.close(),
            }
        }
        let mut sink = [0u8; 4096];
        while self.read < LINGER_BYTES {
            match self.sock.read(&mut sink) {
                Ok(0) => break,
                Ok(n) => self.read += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let at = self.deadline;
                    return Next::Wait(self, Some(at));
                }
                Err(_) => break,
            }
        }
        self.close()
    }

    fn close(&mut self) -> Next {
        if let Some(closed) = self.closed.take() {
            closed();
        }
        Next::Done
    }
}

impl<S: Read + Write + AsFd + AsRawFd + Send + 'static> Watched for Refusal<S> {
    fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn interest(&self) -> Interest {
        if self.shut {
            Interest::READABLE
        } else {
            Interest::WRITABLE
        }
    }

    fn ready(self: Box<Self>, _now: Instant) -> Next {
        self.advance()
    }

    fn expired(mut self: Box<Self>, _now: Instant) -> Next {
        self.close()
    }

    fn abandoned(mut self: Box<Self>, _why: &str) {
        let _ = self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orbitte_wire::{Challenge, Nonce};
    use std::os::unix::net::UnixStream;

    fn bytes(frame: &Frame) -> Vec<u8> {
        let mut b = Vec::new();
        frame.encode(&mut b).unwrap();
        b
    }

    /// A frame that arrives byte by byte is read whole once its last byte
    /// came, and not a byte of what follows it is taken.
    #[test]
    fn a_frame_arriving_byte_by_byte_is_read_whole_and_no_further() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let frame = Frame::Challenge(Challenge {
            nonce: Nonce([7; 32]),
        });
        let wire = bytes(&frame);
        let mut r = SmallFrameReader::new(orbitte_wire::MAX_SMALL_BODY_LEN);
        for (i, byte) in wire.iter().enumerate() {
            assert!(
                r.poll(&mut b).unwrap().is_none(),
                "complete after {i} bytes"
            );
            a.write_all(&[*byte]).unwrap();
        }
        a.write_all(b"next").unwrap();
        assert_eq!(r.poll(&mut b).unwrap(), Some(frame));
        let mut rest = [0u8; 8];
        assert_eq!(
            b.read(&mut rest).unwrap(),
            4,
            "what follows stays on the socket"
        );
    }

    #[test]
    fn a_header_announcing_a_large_body_is_refused_before_it() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let header = FrameHeader {
            version: orbitte_wire::PROTOCOL_VERSION,
            frame_type: FrameType::HELLO,
            body_len: orbitte_wire::MAX_SMALL_BODY_LEN + 1,
        };
        a.write_all(&header.encode()).unwrap();
        let mut r = SmallFrameReader::new(orbitte_wire::MAX_SMALL_BODY_LEN);
        match r.poll(&mut b) {
            Err(SessionError::Malformed(e)) => assert_eq!(e.field, "header.body_len"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_close_mid_frame_says_the_frame_was_truncated() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let wire = bytes(&Frame::Challenge(Challenge {
            nonce: Nonce([1; 32]),
        }));
        a.write_all(&wire[..HEADER_LEN + 3]).unwrap();
        drop(a);
        let mut r = SmallFrameReader::new(orbitte_wire::MAX_SMALL_BODY_LEN);
        match r.poll(&mut b) {
            Err(SessionError::Closed { during }) => assert!(during.contains("body"), "{during}"),
            other => panic!("{other:?}"),
        }
    }

    /// An outbox keeps what a full socket did not take and sends it once
    /// the socket has room, in order.
    #[test]
    fn an_outbox_keeps_what_a_full_socket_did_not_take() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let mut out = Outbox::default();
        let frame = Frame::Challenge(Challenge {
            nonce: Nonce([3; 32]),
        });
        let mut want = Vec::new();
        while out.flush(&mut a).unwrap() {
            out.push(&frame).unwrap();
            want.extend(bytes(&frame));
        }
        b.set_nonblocking(true).unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 65536];
        loop {
            match b.read(&mut chunk) {
                Ok(n) => got.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if out.flush(&mut a).unwrap() && got.len() == want.len() {
                        break;
                    }
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(got == want, "bytes lost or reordered");
    }
}
