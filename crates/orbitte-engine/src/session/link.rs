//! [`ControlLink`] over TCP: the engine's control channel (handshake,
//! segment publications, RC connect request/accept) between processes and
//! hosts, with the same frame bounds as the sessions.

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use orbitte_wire::{Frame, Problem};

use super::SessionError;
use super::io::{FrameReader, write_frame};
use crate::control::ControlLink;
use crate::error::LinkError;

/// A control link over one TCP connection.
#[derive(Debug)]
pub struct TcpControlLink {
    stream: TcpStream,
    reader: FrameReader,
    scratch: Vec<u8>,
    peer: Option<SocketAddr>,
    frame_timeout: Duration,
}

impl TcpControlLink {
    /// Wraps a connected stream. `frame_timeout` bounds a frame once it
    /// started (truncated frames).
    pub fn new(stream: TcpStream, frame_timeout: Duration) -> std::io::Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(frame_timeout))?;
        let peer = stream.peer_addr().ok();
        Ok(Self {
            stream,
            reader: FrameReader::new(),
            scratch: Vec::new(),
            peer,
            frame_timeout,
        })
    }

    /// Connects to `addr` within `timeout`.
    pub fn connect(addr: impl ToSocketAddrs, timeout: Duration) -> std::io::Result<Self> {
        let mut last = std::io::Error::other("address resolved to nothing");
        for a in addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => return Self::new(s, timeout),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Accepts one connection from `listener`.
    pub fn accept(listener: &TcpListener, frame_timeout: Duration) -> std::io::Result<Self> {
        let (s, _) = listener.accept()?;
        Self::new(s, frame_timeout)
    }
}

impl ControlLink for TcpControlLink {
    fn send(&mut self, frame: &Frame) -> Result<(), LinkError> {
        if frame.payload_len() != 0 {
            return Err(LinkError::DataFrame { sent: true });
        }
        write_frame(&mut self.stream, frame, &mut self.scratch).map_err(|e| match e {
            SessionError::Io(e) => LinkError::Io(Arc::new(e)),
            SessionError::Encode(e) => LinkError::Encode(e),
            other => LinkError::Session(Arc::new(other)),
        })
    }

    fn recv(&mut self, timeout: Duration) -> Result<Frame, LinkError> {
        match self
            .reader
            .read(&mut self.stream, Some(timeout), self.frame_timeout)
        {
            Ok(f) if f.payload_len() != 0 => Err(LinkError::DataFrame { sent: false }),
            Ok(f) => Ok(f),
            Err(SessionError::Idle) => Err(LinkError::TimedOut(timeout)),
            Err(SessionError::Closed { .. }) => Err(LinkError::Closed),
            Err(SessionError::Malformed(e)) => match e.problem {
                Problem::UnsupportedVersion { theirs, .. } => Err(LinkError::Version { theirs }),
                _ => Err(LinkError::Decode(e)),
            },
            Err(SessionError::Io(e)) => Err(LinkError::Io(Arc::new(e))),
            Err(e) => Err(LinkError::Session(Arc::new(e))),
        }
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orbitte_wire::{Goodbye, GoodbyeReason, Message};

    #[test]
    fn frames_cross_a_socket_and_bad_input_is_an_error_not_a_panic() {
        use std::io::Write;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a =
            TcpControlLink::connect(l.local_addr().unwrap(), Duration::from_secs(5)).unwrap();
        let mut b = TcpControlLink::accept(&l, Duration::from_millis(200)).unwrap();
        let bye = Frame::Goodbye(Goodbye {
            reason: GoodbyeReason::NORMAL,
            message: Message::truncating("x"),
        });
        a.send(&bye).unwrap();
        assert_eq!(b.recv(Duration::from_secs(5)).unwrap(), bye);
        assert!(matches!(
            b.recv(Duration::from_millis(50)),
            Err(LinkError::TimedOut(_))
        ));
        a.stream.write_all(b"OBTE\x00\x01").unwrap();
        assert!(
            matches!(b.recv(Duration::from_secs(5)), Err(LinkError::Session(_))),
            "truncated frame"
        );
        let mut c =
            TcpControlLink::connect(l.local_addr().unwrap(), Duration::from_secs(5)).unwrap();
        let mut d = TcpControlLink::accept(&l, Duration::from_millis(200)).unwrap();
        c.stream.write_all(b"garbage!garbage!").unwrap();
        assert!(matches!(
            d.recv(Duration::from_secs(5)),
            Err(LinkError::Decode(_))
        ));
        drop(c);
        drop(a);
        assert!(matches!(
            b.recv(Duration::from_secs(5)),
            Err(LinkError::Closed) | Err(LinkError::Io(_)) | Err(LinkError::Session(_))
        ));
    }
}
