//! `challenge`, `hello`, `hello-ack`: the session handshake.

use crate::codec::{Reader, Writer};
use crate::epoch::Epoch;
use crate::error::{DecodeError, EncodeError, Problem};
use crate::header::PROTOCOL_VERSION;
use crate::types::{AuthTag, Capabilities, Nonce, SessionPurpose, SourceId};

/// The responder's first frame: a fresh nonce the initiator's proof covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// The responder's nonce.
    pub nonce: Nonce,
}

/// Who speaks: the part of `hello` and `hello-ack` that the peer table
/// judges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The sender's protocol version; must be [`PROTOCOL_VERSION`].
    pub protocol_version: u16,
    /// The sender's authoritative epoch.
    pub epoch: Epoch,
    /// What the sender offers.
    pub capabilities: Capabilities,
    /// The sender's stable identity.
    pub source_id: SourceId,
}

impl Identity {
    /// An identity speaking [`PROTOCOL_VERSION`].
    pub fn new(source_id: SourceId, epoch: Epoch, capabilities: Capabilities) -> Self {
        Self {
            protocol_version: PROTOCOL_VERSION,
            epoch,
            capabilities,
            source_id,
        }
    }
}

/// The initiator's identity, nonce and optional proof (see [`crate::auth`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The initiator.
    pub identity: Identity,
    /// The initiator's nonce, covered by the responder's proof.
    pub nonce: Nonce,
    /// What the session is for (covered by the proof).
    pub purpose: SessionPurpose,
    /// HMAC proof over the challenge and this frame; `None` when the cluster
    /// has no secret.
    pub proof: Option<AuthTag>,
}

/// The responder's identity and optional proof; after it the session is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloAck {
    /// The responder.
    pub identity: Identity,
    /// HMAC proof over the challenge, the hello and this frame.
    pub proof: Option<AuthTag>,
}

impl Challenge {
    pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.put(&self.nonce.0);
        Ok(())
    }

    pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            nonce: Nonce(r.array("challenge.nonce")?),
        })
    }
}

impl Identity {
    pub(crate) fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u16(self.protocol_version);
        w.u64(self.epoch.value());
        w.u64(self.capabilities.0);
        w.bytes8("identity.source_id", self.source_id.as_str().as_bytes())
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let protocol_version = r.u16("identity.protocol_version")?;
        if protocol_version != PROTOCOL_VERSION {
            return Err(r.err(
                "identity.protocol_version",
                Problem::UnsupportedVersion {
                    ours: PROTOCOL_VERSION,
                    theirs: protocol_version,
                },
            ));
        }
        let epoch = r.u64("identity.epoch")?;
        let epoch = Epoch::new(epoch).map_err(|_| r.err("identity.epoch", Problem::Empty))?;
        let capabilities = Capabilities(r.u64("identity.capabilities")?);
        let raw = r.bytes8("identity.source_id")?;
        let text = Reader::utf8(raw).map_err(|p| r.err("identity.source_id", p))?;
        let source_id =
            SourceId::new(text).map_err(|_| r.err("identity.source_id", Problem::Empty))?;
        Ok(Self {
            protocol_version,
            epoch,
            capabilities,
            source_id,
        })
    }

    pub(crate) fn validate(&self) -> Result<(), (&'static str, Problem)> {
        if self.protocol_version != PROTOCOL_VERSION {
            return Err((
                "identity.protocol_version",
                Problem::UnsupportedVersion {
                    ours: PROTOCOL_VERSION,
                    theirs: self.protocol_version,
                },
            ));
        }
        Ok(())
    }
}

fn encode_proof(w: &mut Writer<'_>, proof: Option<&AuthTag>) {
    w.tag(proof.is_some());
    if let Some(p) = proof {
        w.put(&p.0);
    }
}

fn decode_proof(r: &mut Reader<'_>) -> Result<Option<AuthTag>, DecodeError> {
    Ok(if r.tag("proof")? {
        Some(AuthTag(r.array("proof")?))
    } else {
        None
    })
}

impl Hello {
    /// The body bytes the proof covers: everything before the proof field.
    pub(crate) fn encode_unproven(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        self.identity.encode(w)?;
        w.put(&self.nonce.0);
        w.u8(self.purpose.0);
        Ok(())
    }

    pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        if let Err((field, problem)) = self.identity.validate() {
            return Err(w.err(field, problem));
        }
        self.encode_unproven(w)?;
        encode_proof(w, self.proof.as_ref());
        Ok(())
    }

    pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let identity = Identity::decode(r)?;
        let nonce = Nonce(r.array("hello.nonce")?);
        let purpose = SessionPurpose(r.u8("hello.purpose")?);
        let proof = decode_proof(r)?;
        Ok(Self {
            identity,
            nonce,
            purpose,
            proof,
        })
    }
}

impl HelloAck {
    pub(crate) fn encode_unproven(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        self.identity.encode(w)
    }

    pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        if let Err((field, problem)) = self.identity.validate() {
            return Err(w.err(field, problem));
        }
        self.encode_unproven(w)?;
        encode_proof(w, self.proof.as_ref());
        Ok(())
    }

    pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let identity = Identity::decode(r)?;
        let proof = decode_proof(r)?;
        Ok(Self { identity, proof })
    }
}
