//! The session handshake as sans-IO state machines.
//!
//! ```text
//! initiator                                   responder
//!     | ---------------- TCP connect --------------> |
//!     | <--------------- challenge(nonce_r) -------- |  Responder::new, ::challenge
//!     | Initiator::handle_challenge                  |
//!     | ---- hello(identity, nonce_i, proof?) -----> |
//!     |                                              |  Responder::handle_hello:
//!     |                                              |  verify proof, PeerTable::admit
//!     | <------- hello-ack(identity, proof?) ------- |  (or error frame, then close)
//!     | Initiator::handle_hello_ack:                 |
//!     | verify proof, PeerTable::admit               |
//!     |         session established on both sides    |
//! ```
//!
//! The caller does the I/O and supplies the nonces (32 bytes from a CSPRNG).
//! On any [`HandshakeError`] the caller sends [`HandshakeError::error_frame`]
//! (when it returns one) and closes the connection; the peer table is
//! unchanged.

use std::net::SocketAddr;

use crate::auth::{self, AuthError, ClusterSecret};
use crate::frame_type::FrameType;
use crate::frames::{Challenge, ErrorFrame, Frame, Hello, HelloAck, Identity};
use crate::peer_table::{Admission, AdmitError, PeerTable, SessionId};
use crate::types::{ErrorCode, Message, Nonce, RequestId, SessionPurpose};

/// The handshake failed. Nothing was recorded in the peer table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// A frame arrived that the handshake does not allow at this point.
    #[error("expected a {expected} frame during the handshake, received {received}")]
    UnexpectedFrame {
        /// What was expected.
        expected: FrameType,
        /// What came.
        received: FrameType,
    },
    /// Authentication failed.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The peer table rejected the peer (version, epoch, id).
    #[error(transparent)]
    Admit(#[from] AdmitError),
    /// The peer rejected us with an `error` frame.
    #[error("peer rejected the session: {code}: {message}")]
    Rejected {
        /// The peer's code.
        code: ErrorCode,
        /// The peer's message.
        message: Message,
    },
    /// The state machine was used after it finished or failed.
    #[error("the handshake already finished; start a new one per connection")]
    Finished,
}

impl HandshakeError {
    /// The `error` frame to send before closing, or `None` when the peer is
    /// the one that gave up (`Rejected`) or the error is ours (`Finished`).
    pub fn error_frame(&self) -> Option<ErrorFrame> {
        let (code, frame_type) = match self {
            Self::UnexpectedFrame { received, .. } => (ErrorCode::UNEXPECTED_FRAME, *received),
            Self::Auth(e) => (e.error_code(), FrameType::HELLO),
            Self::Admit(e) => (e.error_code(), FrameType::HELLO),
            Self::Rejected { .. } | Self::Finished => return None,
        };
        Some(ErrorFrame {
            code,
            frame_type,
            request_id: RequestId(0),
            message: Message::truncating(self.to_string()),
        })
    }
}

/// The handshake completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Established {
    /// Who the peer is (its source id, epoch, capabilities).
    pub peer: Identity,
    /// What the peer table did; on `Replaced`, tear down what it lists.
    pub admission: Admission,
    /// What the session is for (the initiator's `hello.purpose`).
    pub purpose: SessionPurpose,
}

fn rejected_or_unexpected(expected: FrameType, frame: Frame) -> HandshakeError {
    match frame {
        Frame::Error(e) => HandshakeError::Rejected {
            code: e.code,
            message: e.message,
        },
        other => HandshakeError::UnexpectedFrame {
            expected,
            received: other.frame_type(),
        },
    }
}

/// The accepting side of a session.
#[derive(Debug)]
pub struct Responder {
    local: Identity,
    secret: Option<ClusterSecret>,
    challenge: Challenge,
    done: bool,
}

impl Responder {
    /// Starts a handshake on an accepted connection. Send
    /// [`Responder::challenge`] first.
    pub fn new(local: Identity, secret: Option<ClusterSecret>, nonce: Nonce) -> Self {
        Self {
            local,
            secret,
            challenge: Challenge { nonce },
            done: false,
        }
    }

    /// The `challenge` frame to send as soon as the connection is accepted.
    pub fn challenge(&self) -> Frame {
        Frame::Challenge(self.challenge.clone())
    }

    /// Handles the initiator's first frame. On success send the returned
    /// `hello-ack` frame; the session is then established.
    pub fn handle_hello(
        &mut self,
        frame: Frame,
        table: &mut PeerTable,
        session: SessionId,
        from: Option<SocketAddr>,
    ) -> Result<(Frame, Established), HandshakeError> {
        if self.done {
            return Err(HandshakeError::Finished);
        }
        self.done = true;
        let hello = match frame {
            Frame::Hello(h) => h,
            other => return Err(rejected_or_unexpected(FrameType::HELLO, other)),
        };
        auth::verify_hello(self.secret.as_ref(), &self.challenge, &hello)?;
        // Build the reply before admitting so that nothing can fail after
        // the peer table changed.
        let mut ack = HelloAck {
            identity: self.local.clone(),
            proof: None,
        };
        if let Some(secret) = &self.secret {
            ack.proof = Some(auth::hello_ack_proof(secret, &self.challenge, &hello, &ack));
        }
        let admission = table.admit(session, from, &hello.identity)?;
        Ok((
            Frame::HelloAck(ack),
            Established {
                peer: hello.identity,
                admission,
                purpose: hello.purpose,
            },
        ))
    }
}

/// The connecting side of a session.
#[derive(Debug)]
pub struct Initiator {
    local: Identity,
    secret: Option<ClusterSecret>,
    nonce: Nonce,
    purpose: SessionPurpose,
    state: InitiatorState,
}

#[derive(Debug)]
enum InitiatorState {
    AwaitChallenge,
    AwaitAck { challenge: Challenge, hello: Hello },
    Done,
}

impl Initiator {
    /// Starts a handshake on a connected socket; wait for the challenge.
    pub fn new(local: Identity, secret: Option<ClusterSecret>, nonce: Nonce) -> Self {
        Self {
            local,
            secret,
            nonce,
            purpose: SessionPurpose::DATA,
            state: InitiatorState::AwaitChallenge,
        }
    }

    /// The same handshake, opening the session for `purpose` (default
    /// [`SessionPurpose::DATA`]).
    pub fn with_purpose(mut self, purpose: SessionPurpose) -> Self {
        self.purpose = purpose;
        self
    }

    /// Handles the responder's first frame; returns the `hello` to send.
    pub fn handle_challenge(&mut self, frame: Frame) -> Result<Frame, HandshakeError> {
        if !matches!(self.state, InitiatorState::AwaitChallenge) {
            return Err(HandshakeError::Finished);
        }
        self.state = InitiatorState::Done;
        let challenge = match frame {
            Frame::Challenge(c) => c,
            other => return Err(rejected_or_unexpected(FrameType::CHALLENGE, other)),
        };
        let mut hello = Hello {
            identity: self.local.clone(),
            nonce: self.nonce,
            purpose: self.purpose,
            proof: None,
        };
        if let Some(secret) = &self.secret {
            hello.proof = Some(auth::hello_proof(secret, &challenge, &hello));
        }
        self.state = InitiatorState::AwaitAck {
            challenge,
            hello: hello.clone(),
        };
        Ok(Frame::Hello(hello))
    }

    /// Handles the responder's answer to our hello. On success the session
    /// is established.
    pub fn handle_hello_ack(
        &mut self,
        frame: Frame,
        table: &mut PeerTable,
        session: SessionId,
        from: Option<SocketAddr>,
    ) -> Result<Established, HandshakeError> {
        let InitiatorState::AwaitAck { challenge, hello } =
            std::mem::replace(&mut self.state, InitiatorState::Done)
        else {
            return Err(HandshakeError::Finished);
        };
        let ack = match frame {
            Frame::HelloAck(a) => a,
            other => return Err(rejected_or_unexpected(FrameType::HELLO_ACK, other)),
        };
        auth::verify_hello_ack(self.secret.as_ref(), &challenge, &hello, &ack)?;
        let admission = table.admit(session, from, &ack.identity)?;
        Ok(Established {
            peer: ack.identity,
            admission,
            purpose: self.purpose,
        })
    }
}
