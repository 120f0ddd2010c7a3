//! The control channel: how two engines exchange wire frames (handshake,
//! segment publications, RC connect request/accept) before and beside the
//! data path.
//!
//! [`ControlLink`] is the seam. [`InProcessLink`] carries encoded frames
//! between two engines in one process (tests, the capability check); the
//! tcp session of the net path implements the same trait over a socket.
//! Frames always go through the wire codec, so an in-process test exercises
//! the same bytes a socket would carry.

use std::net::SocketAddr;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Duration;

use orbitte_wire::{self as wire, Frame};

use crate::error::LinkError;

/// A bidirectional, ordered, reliable channel of wire frames to one peer.
pub trait ControlLink: Send {
    /// Sends one frame.
    fn send(&mut self, frame: &Frame) -> Result<(), LinkError>;
    /// Receives the next frame, waiting at most `timeout`.
    fn recv(&mut self, timeout: Duration) -> Result<Frame, LinkError>;
    /// The peer's address, when the link has one (epoch rules log it).
    fn peer_addr(&self) -> Option<SocketAddr> {
        None
    }
}

/// One end of an in-process link (see [`InProcessLink::pair`]).
#[derive(Debug)]
pub struct InProcessLink {
    tx: Sender<Vec<u8>>,
    rx: Receiver<Vec<u8>>,
    addr: Option<SocketAddr>,
}

impl InProcessLink {
    /// Two connected ends.
    pub fn pair() -> (Self, Self) {
        let (a_tx, b_rx) = channel();
        let (b_tx, a_rx) = channel();
        (
            Self {
                tx: a_tx,
                rx: a_rx,
                addr: None,
            },
            Self {
                tx: b_tx,
                rx: b_rx,
                addr: None,
            },
        )
    }

    /// Sends raw bytes as one message, whatever they are (tests use it to
    /// play a peer that speaks another protocol version).
    pub fn send_raw(&mut self, bytes: Vec<u8>) -> Result<(), LinkError> {
        self.tx.send(bytes).map_err(|_| LinkError::Closed)
    }

    /// Same end, reporting `addr` as the peer's address (to test "same
    /// address, old epoch").
    pub fn with_peer_addr(mut self, addr: SocketAddr) -> Self {
        self.addr = Some(addr);
        self
    }
}

impl ControlLink for InProcessLink {
    fn send(&mut self, frame: &Frame) -> Result<(), LinkError> {
        let bytes = frame.to_bytes().map_err(LinkError::Encode)?;
        self.tx.send(bytes).map_err(|_| LinkError::Closed)
    }

    fn recv(&mut self, timeout: Duration) -> Result<Frame, LinkError> {
        let bytes = self.rx.recv_timeout(timeout).map_err(|e| match e {
            RecvTimeoutError::Timeout => LinkError::TimedOut(timeout),
            RecvTimeoutError::Disconnected => LinkError::Closed,
        })?;
        if bytes.len() >= 8 && bytes[..4] == wire::MAGIC {
            let version = u16::from_be_bytes([bytes[4], bytes[5]]);
            let frame_type = u16::from_be_bytes([bytes[6], bytes[7]]);
            if version != wire::PROTOCOL_VERSION
                && wire::FrameType(frame_type) != wire::FrameType::ERROR
            {
                return Err(LinkError::Version { theirs: version });
            }
        }
        let (frame, payload) = wire::decode_exact(&bytes).map_err(LinkError::Decode)?;
        if !payload.is_empty() {
            return Err(LinkError::DataFrame { sent: false });
        }
        Ok(frame)
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.addr
    }
}
