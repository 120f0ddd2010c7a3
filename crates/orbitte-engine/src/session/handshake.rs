//! The session handshake, both sides, over any blocking stream.

use std::net::SocketAddr;
use std::time::Instant;

use orbitte_wire::{
    Admission, Challenge, ErrorCode, Frame, FrameType, Hello, HelloAck, Identity, Nonce, SessionId,
    SessionPurpose,
};

use super::io::{Conn, FrameReader, send_error, write_frame};
use super::{PeerIdentity, SessionConfig, SessionError, SharedPeerTable, random_bytes};

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
    if let Some(secret) = &cfg.cluster_secret {
        hello.proof = Some(orbitte_wire::auth::hello_proof(secret, &challenge, &hello));
    }
    write_frame(c, &Frame::Hello(hello.clone()), &mut scratch)?;
    let ack = match read_handshake(c, &mut reader, deadline, "a hello-ack")? {
        Frame::HelloAck(ack) => ack,
        other => return Err(refused(other)),
    };
    if let Err(e) =
        orbitte_wire::auth::verify_hello_ack(cfg.cluster_secret.as_ref(), &challenge, &hello, &ack)
    {
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

/// Responder side: challenges, checks the hello (version, proof, epoch)
/// and answers with our hello-ack. On refusal the peer gets an error frame
/// naming the reason and the refusal is logged.
pub(crate) fn accept<C: Conn>(
    c: &mut C,
    cfg: &SessionConfig,
    peers: &SharedPeerTable,
    from: Option<SocketAddr>,
) -> Result<Handshake, SessionError> {
    accept_within(c, cfg, peers, from, |_, _| Ok(()))
}

/// [`accept`], asking `room` for a session slot once the hello proved
/// itself and before the peer is admitted: a refusal (its text names the
/// limit) reaches the peer as `resource-exhausted` in reply to its hello,
/// and nothing was admitted or acknowledged.
pub(crate) fn accept_within<C: Conn>(
    c: &mut C,
    cfg: &SessionConfig,
    peers: &SharedPeerTable,
    from: Option<SocketAddr>,
    room: impl FnOnce(&Identity, SessionPurpose) -> Result<(), String>,
) -> Result<Handshake, SessionError> {
    // Nothing is known about the peer yet: the shorter bound applies.
    let bound = cfg.handshake_timeout.min(cfg.preauth_timeout);
    let deadline = Instant::now() + bound;
    c.set_write_timeout_(Some(bound))?;
    let mut reader = FrameReader::with_limit(orbitte_wire::MAX_SMALL_BODY_LEN);
    let mut scratch = Vec::with_capacity(512);
    let challenge = Challenge {
        nonce: Nonce(random_bytes()?),
    };
    write_frame(c, &Frame::Challenge(challenge.clone()), &mut scratch)?;
    let hello = match read_handshake(c, &mut reader, deadline, "a hello") {
        Ok(Frame::Hello(h)) => h,
        Ok(other) => {
            let msg = format!("expected hello, got {}", other.frame_type());
            send_error(c, ErrorCode::UNEXPECTED_FRAME, other.frame_type(), &msg);
            return Err(SessionError::Protocol(msg));
        }
        Err(SessionError::Malformed(e)) => {
            send_error(c, e.error_code(), e.frame, &e.to_string());
            return Err(SessionError::Malformed(e));
        }
        Err(e) => {
            if matches!(e, SessionError::Timeout { .. }) {
                send_error(
                    c,
                    ErrorCode::TIMEOUT,
                    FrameType(0),
                    "no hello within the handshake timeout",
                );
            }
            return Err(e);
        }
    };
    if let Err(e) =
        orbitte_wire::auth::verify_hello(cfg.cluster_secret.as_ref(), &challenge, &hello)
    {
        // Debug only: the caller logs the refusal within its log budget.
        tracing::debug!(
            peer = %hello.identity.source_id, ?from, error = %e,
            "initiator failed authentication: session refused, nothing readable or writable"
        );
        send_error(c, e.error_code(), FrameType::HELLO, &e.to_string());
        return Err(e.into());
    }
    if let Err(why) = room(&hello.identity, hello.purpose) {
        send_error(c, ErrorCode::RESOURCE_EXHAUSTED, FrameType::HELLO, &why);
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
            send_error(c, e.error_code(), FrameType::HELLO, &e.to_string());
            return Err(e.into());
        }
    };
    let mut ack = HelloAck {
        identity: identity(cfg),
        proof: None,
    };
    if let Some(secret) = &cfg.cluster_secret {
        ack.proof = Some(orbitte_wire::auth::hello_ack_proof(
            secret, &challenge, &hello, &ack,
        ));
    }
    if let Err(e) = write_frame(c, &Frame::HelloAck(ack), &mut scratch) {
        peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .session_closed(session);
        return Err(e);
    }
    Ok(Handshake {
        peer: PeerIdentity {
            source_id: hello.identity.source_id,
            epoch: hello.identity.epoch,
            capabilities: hello.identity.capabilities,
            addr: from,
        },
        session,
        admission,
        purpose: hello.purpose,
    })
}
