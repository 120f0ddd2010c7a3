//! The session handshake, both sides: the initiator's over a blocking
//! stream (it runs on the caller's thread), the responder's on a
//! non-blocking socket, one step at a time on an I/O loop.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Instant;

use mio::Interest;

use orbitte_wire::{
    Admission, Challenge, ErrorCode, Frame, FrameType, Hello, HelloAck, Identity, Nonce, SessionId,
    SessionPurpose,
};

use super::io::{Conn, FrameReader, send_error, write_frame};
use super::nonblocking::{Outbox, SmallFrameReader};
use super::{PeerIdentity, SessionConfig, SessionError, SharedPeerTable, random_bytes};
use orbitte_wire::auth::ClusterSecret;

/// A finished handshake: who the peer is and what admitting it did.
#[derive(Debug, Clone)]
pub struct Handshake {
    /// The admitted peer.
    pub peer: PeerIdentity,
    /// This session's id in the peer table (close it with
    /// `PeerTable::session_closed`).
    pub session: SessionId,
    /// New source, reconnect, or replacement of an older epoch (whose
    /// sessions and descriptors the caller must drop).
    pub admission: Admission,
    /// What the initiator opened the session for.
    pub purpose: SessionPurpose,
}

impl Handshake {
    /// The same admission in the wire's terms (what the engine's peer
    /// tables take).
    pub(crate) fn established(&self) -> orbitte_wire::handshake::Established {
        orbitte_wire::handshake::Established {
            peer: Identity::new(
                self.peer.source_id.clone(),
                self.peer.epoch,
                self.peer.capabilities,
            ),
            admission: self.admission.clone(),
            purpose: self.purpose,
        }
    }
}

fn identity(cfg: &SessionConfig) -> Identity {
    Identity::new(cfg.source_id.clone(), cfg.epoch, cfg.capabilities)
}

fn remaining(deadline: Instant) -> std::time::Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(std::time::Duration::from_millis(1))
}

fn refused(frame: Frame) -> SessionError {
    match frame {
        Frame::Error(e) => SessionError::Refused {
            code: e.code,
            message: e.message.to_string(),
        },
        other => SessionError::Protocol(format!(
            "expected a handshake frame, got {}",
            other.frame_type()
        )),
    }
}

fn read_handshake<C: Conn>(
    c: &mut C,
    reader: &mut FrameReader,
    deadline: Instant,
    what: &'static str,
) -> Result<Frame, SessionError> {
    let left = remaining(deadline);
    match reader.read(c, Some(left), left) {
        Err(SessionError::Idle) | Err(SessionError::Timeout { .. }) => {
            Err(SessionError::Timeout { what })
        }
        other => other,
    }
}

/// Initiator side of a data session: [`connect_for`] with
/// [`SessionPurpose::DATA`].
pub(crate) fn connect<C: Conn>(
    c: &mut C,
    cfg: &SessionConfig,
    peers: &SharedPeerTable,
    addr: Option<SocketAddr>,
) -> Result<Handshake, SessionError> {
    connect_for(c, cfg, peers, addr, SessionPurpose::DATA)
}

/// Initiator side: answers the responder's challenge with our hello (which
/// names the session's `purpose`), checks its hello-ack and admits it into
/// `peers`.
pub(crate) fn connect_for<C: Conn>(
    c: &mut C,
    cfg: &SessionConfig,
    peers: &SharedPeerTable,
    addr: Option<SocketAddr>,
    purpose: SessionPurpose,
) -> Result<Handshake, SessionError> {
    let key = cfg.dial_key(addr);
    connect_keyed(c, cfg, peers, addr, purpose, key.as_ref())
}

/// [`connect_for`] proving `key` (`None`: no proof), whatever `cfg`
/// records for `addr`: for sessions to a peer found by its source id.
pub(crate) fn connect_keyed<C: Conn>(
    c: &mut C,
    cfg: &SessionConfig,
    peers: &SharedPeerTable,
    addr: Option<SocketAddr>,
    purpose: SessionPurpose,
    key: Option<&ClusterSecret>,
) -> Result<Handshake, SessionError> {
    let deadline = Instant::now() + cfg.handshake_timeout;
    c.set_write_timeout_(Some(cfg.handshake_timeout))?;
    let mut reader = FrameReader::with_limit(orbitte_wire::MAX_SMALL_BODY_LEN);
    let mut scratch = Vec::with_capacity(512);
    let challenge = match read_handshake(c, &mut reader, deadline, "a challenge")? {
        Frame::Challenge(ch) => ch,
        other => return Err(refused(other)),
    };
    let mut hello = Hello {
        identity: identity(cfg),
        nonce: Nonce(random_bytes()?),
        purpose,
        proof: None,
    };
    if let Some(secret) = key {
        hello.proof = Some(orbitte_wire::auth::hello_proof(secret, &challenge, &hello));
    }
    write_frame(c, &Frame::Hello(hello.clone()), &mut scratch)?;
    let ack = match read_handshake(c, &mut reader, deadline, "a hello-ack")? {
        Frame::HelloAck(ack) => ack,
        other => return Err(refused(other)),
    };
    if let Err(e) = orbitte_wire::auth::verify_hello_ack(key, &challenge, &hello, &ack) {
        tracing::warn!(peer = %ack.identity.source_id, ?addr, error = %e, "responder failed authentication; closing");
        send_error(c, e.error_code(), FrameType::HELLO_ACK, &e.to_string());
        return Err(e.into());
    }
    let session = cfg.session_ids.next();
    let admission = {
        let mut table = peers.lock().unwrap_or_else(|p| p.into_inner());
        table.admit(session, addr, &ack.identity)
    };
    let admission = match admission {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(?addr, error = %e, "responder not admitted; closing");
            send_error(c, e.error_code(), FrameType::HELLO_ACK, &e.to_string());
            return Err(e.into());
        }
    };
    Ok(Handshake {
        peer: PeerIdentity {
            source_id: ack.identity.source_id,
            epoch: ack.identity.epoch,
            capabilities: ack.identity.capabilities,
            addr,
        },
        session,
        admission,
        purpose,
    })
}

/// The responder's side of the handshake on a non-blocking socket, driven
/// by its I/O loop: [`Responder::step`] each time the socket is ready as
/// the last step asked, [`Responder::expired`] once
/// [`deadline`](Responder::deadline) passes.
///
/// It challenges, reads the hello (at most
/// [`MAX_SMALL_BODY_LEN`](orbitte_wire::MAX_SMALL_BODY_LEN) of body, all
/// of it within `min(handshake_timeout, preauth_timeout)` of the start:
/// nothing is known about the peer yet, so the shorter bound applies),
/// checks it (version, proof, epoch), asks `room` for a session slot and
/// admits the peer, and answers with our hello-ack. A refusal queues an
/// error frame naming the reason in its [`outbox`](Responder::outbox) for
/// the caller to send before the close.
#[derive(Debug)]
pub(crate) struct Responder {
    challenge: Challenge,
    reader: SmallFrameReader,
    out: Outbox,
    deadline: Instant,
    /// The admitted session while its hello-ack waits to be sent.
    admitted: Option<Handshake>,
}

/// What a [`Responder`] needs next.
#[derive(Debug)]
pub(crate) enum Step {
    /// The socket to be ready for this (until the deadline).
    Wait(Interest),
    /// Admitted, and the hello-ack is sent.
    Done(Handshake),
    /// Refused: the error frame for the peer (if any) is in the outbox.
    Refused(SessionError),
}

impl Responder {
    /// A handshake starting `now`: its challenge waits in the outbox.
    pub(crate) fn new(cfg: &SessionConfig, now: Instant) -> Result<Self, SessionError> {
        let challenge = Challenge {
            nonce: Nonce(random_bytes()?),
        };
        let mut out = Outbox::default();
        out.push(&Frame::Challenge(challenge.clone()))?;
        Ok(Self {
            challenge,
            reader: SmallFrameReader::new(orbitte_wire::MAX_SMALL_BODY_LEN),
            out,
            deadline: now + cfg.handshake_timeout.min(cfg.preauth_timeout),
            admitted: None,
        })
    }

    /// When the peer's time is up.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// What waits to be sent (after a refusal: the error frame).
    pub(crate) fn outbox(self) -> Outbox {
        self.out
    }

    /// Goes as far as the socket allows. `room` is asked at most once over
    /// all steps, after the hello proved itself and before the peer is
    /// admitted: a refusal (its text names the limit) reaches the peer as
    /// `resource-exhausted` in reply to its hello, and nothing was admitted
    /// or acknowledged.
    pub(crate) fn step<S: Read + Write>(
        &mut self,
        s: &mut S,
        cfg: &SessionConfig,
        peers: &SharedPeerTable,
        from: Option<SocketAddr>,
        room: impl FnOnce(&Identity, SessionPurpose) -> Result<(), String>,
    ) -> Step {
        match self.out.flush(s) {
            Ok(true) => {}
            Ok(false) => return Step::Wait(Interest::WRITABLE),
            Err(e) => {
                self.unadmit(peers);
                return Step::Refused(e.into());
            }
        }
        if let Some(hs) = self.admitted.take() {
            return Step::Done(hs);
        }
        let hello = match self.reader.poll(s) {
            Ok(None) => return Step::Wait(Interest::READABLE),
            Ok(Some(Frame::Hello(h))) => h,
            Ok(Some(other)) => {
                let msg = format!("expected hello, got {}", other.frame_type());
                self.out
                    .push_error(ErrorCode::UNEXPECTED_FRAME, other.frame_type(), &msg);
                return Step::Refused(SessionError::Protocol(msg));
            }
            Err(SessionError::Malformed(e)) => {
                self.out.push_error(e.error_code(), e.frame, &e.to_string());
                return Step::Refused(SessionError::Malformed(e));
            }
            Err(e) => return Step::Refused(e),
        };
        if let Err(e) = self.admit(cfg, peers, from, hello, room) {
            return Step::Refused(e);
        }
        match self.out.flush(s) {
            Ok(true) => match self.admitted.take() {
                Some(hs) => Step::Done(hs),
                None => Step::Wait(Interest::READABLE),
            },
            Ok(false) => Step::Wait(Interest::WRITABLE),
            Err(e) => {
                self.unadmit(peers);
                Step::Refused(e.into())
            }
        }
    }

    /// The deadline passed: the peer is refused. Before its hello the
    /// refusal is a `timeout` error frame; a peer that does not take its
    /// hello-ack in time loses the session it was admitted to.
    pub(crate) fn expired(&mut self, peers: &SharedPeerTable) -> SessionError {
        if self.admitted.is_some() {
            self.unadmit(peers);
            return SessionError::Timeout {
                what: "room for the hello-ack",
            };
        }
        self.out.push_error(
            ErrorCode::TIMEOUT,
            FrameType(0),
            "no hello within the handshake timeout",
        );
        SessionError::Timeout { what: "a hello" }
    }

    /// Gives up (its loop stops): a session admitted and not yet
    /// acknowledged is closed in `peers`.
    pub(crate) fn abandon(&mut self, peers: &SharedPeerTable) {
        self.unadmit(peers);
    }

    fn unadmit(&mut self, peers: &SharedPeerTable) {
        if let Some(hs) = self.admitted.take() {
            peers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .session_closed(hs.session);
        }
    }

    /// Checks `hello`, takes a slot and admits the peer; queues the
    /// hello-ack, or the error frame of the refusal.
    fn admit(
        &mut self,
        cfg: &SessionConfig,
        peers: &SharedPeerTable,
        from: Option<SocketAddr>,
        hello: Hello,
        room: impl FnOnce(&Identity, SessionPurpose) -> Result<(), String>,
    ) -> Result<(), SessionError> {
        let challenge = &self.challenge;
        if let Err(e) = orbitte_wire::auth::verify_hello(cfg.listen_key(), challenge, &hello) {
            // Debug only: the caller logs the refusal within its log budget.
            tracing::debug!(
                peer = %hello.identity.source_id, ?from, error = %e,
                "initiator failed authentication: session refused, nothing readable or writable"
            );
            self.out
                .push_error(e.error_code(), FrameType::HELLO, &e.to_string());
            return Err(e.into());
        }
        if let Err(why) = room(&hello.identity, hello.purpose) {
            self.out
                .push_error(ErrorCode::RESOURCE_EXHAUSTED, FrameType::HELLO, &why);
            return Err(SessionError::Limit(why));
        }
        let session = cfg.session_ids.next();
        let admission = {
            let mut table = peers.lock().unwrap_or_else(|p| p.into_inner());
            table.admit(session, from, &hello.identity)
        };
        let admission = match admission {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(?from, error = %e, "initiator not admitted; session refused");
                self.out
                    .push_error(e.error_code(), FrameType::HELLO, &e.to_string());
                return Err(e.into());
            }
        };
        let mut ack = HelloAck {
            identity: identity(cfg),
            proof: None,
        };
        if let Some(secret) = cfg.listen_key() {
            ack.proof = Some(orbitte_wire::auth::hello_ack_proof(
                secret, challenge, &hello, &ack,
            ));
        }
        let hs = Handshake {
            peer: PeerIdentity {
                source_id: hello.identity.source_id,
                epoch: hello.identity.epoch,
                capabilities: hello.identity.capabilities,
                addr: from,
            },
            session,
            admission,
            purpose: hello.purpose,
        };
        self.admitted = Some(hs);
        if let Err(e) = self.out.push(&Frame::HelloAck(ack)) {
            self.unadmit(peers);
            return Err(e);
        }
        Ok(())
    }
}
