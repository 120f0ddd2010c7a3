//! `connect-request`, `connect-accept`, `connect-reject`: RC queue pairs.

use std::collections::HashSet;

use crate::codec::{Reader, Writer};
use crate::error::{DecodeError, EncodeError, Problem};
use crate::types::{ConnectId, ErrorCode, Gid, Message, Mtu, NicId, Psn, Qpn};

/// The most rails in one connection request.
pub const MAX_RAILS: usize = 64;

/// Wire bytes of one [`RailEndpoint`].
pub(crate) const RAIL_ENDPOINT_LEN: usize = 30;

/// One side of an RC queue pair on one rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RailEndpoint {
    /// The sender's NIC ID this queue pair lives on.
    pub nic_id: NicId,
    /// The queue pair number.
    pub qpn: Qpn,
    /// The first packet sequence number the sender will use.
    pub psn: Psn,
    /// The path MTU the sender proposes (request) or settled on (accept:
    /// the smaller of both ports' active MTUs).
    pub mtu: Mtu,
    /// The port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The port's selected GID.
    pub gid: Gid,
}

/// One requested rail: which NIC of the responder to reach, and the
/// initiator's endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RailRequest {
    /// The responder's NIC ID (from its publication's rkeys).
    pub target_nic: NicId,
    /// The initiator's side.
    pub endpoint: RailEndpoint,
}

/// Request for RC queue pairs, one per rail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Chosen by the initiator, unique within the session.
    pub connect_id: ConnectId,
    /// Invariant: 1 to [`MAX_RAILS`] rails, each (initiator NIC, target NIC)
    /// pair at most once.
    pub rails: Vec<RailRequest>,
}

/// The responder's endpoints, in the order of the request's rails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectAccept {
    /// Echoes the request.
    pub connect_id: ConnectId,
    /// Invariant: 1 to [`MAX_RAILS`]; the receiver checks that the count
    /// equals the request's.
    pub rails: Vec<RailEndpoint>,
}

/// The responder refuses the whole request (no partial accept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectReject {
    /// Echoes the request.
    pub connect_id: ConnectId,
    /// Why (e.g. `unknown-nic`, `no-usable-rail`, `resource-exhausted`).
    pub code: ErrorCode,
    /// Details for the log.
    pub message: Message,
}

impl RailEndpoint {
    fn encode(&self, w: &mut Writer<'_>) {
        w.u16(self.nic_id.0);
        w.u32(self.qpn.value());
        w.u32(self.psn.value());
        w.u16(self.mtu.bytes());
        w.u16(self.lid);
        w.put(&self.gid.0);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let nic_id = NicId(r.u16("rail.nic_id")?);
        let qpn = r.u32("rail.qpn")?;
        let qpn = Qpn::new(qpn).ok_or_else(|| {
            r.err(
                "rail.qpn",
                Problem::OutOfRange {
                    value: qpn.into(),
                    expected: "a 24-bit queue pair number",
                },
            )
        })?;
        let psn = r.u32("rail.psn")?;
        let psn = Psn::new(psn).ok_or_else(|| {
            r.err(
                "rail.psn",
                Problem::OutOfRange {
                    value: psn.into(),
                    expected: "a 24-bit packet sequence number",
                },
            )
        })?;
        let mtu = r.u16("rail.mtu")?;
        let mtu = Mtu::new(mtu).ok_or_else(|| {
            r.err(
                "rail.mtu",
                Problem::OutOfRange {
                    value: mtu.into(),
                    expected: "256, 512, 1024, 2048 or 4096",
                },
            )
        })?;
        Ok(Self {
            nic_id,
            qpn,
            psn,
            mtu,
            lid: r.u16("rail.lid")?,
            gid: Gid(r.array("rail.gid")?),
        })
    }
}

fn nonempty<T>(rails: &[T]) -> Result<(), (&'static str, Problem)> {
    if rails.is_empty() {
        Err(("rails", Problem::Empty))
    } else {
        Ok(())
    }
}

impl ConnectRequest {
    fn validate(&self) -> Result<(), (&'static str, Problem)> {
        nonempty(&self.rails)?;
        let mut pairs = HashSet::with_capacity(self.rails.len());
        for rail in &self.rails {
            if !pairs.insert((rail.endpoint.nic_id, rail.target_nic)) {
                return Err((
                    "rail.target_nic",
                    Problem::Duplicate {
                        value: rail.target_nic.0.into(),
                    },
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u64(self.connect_id.0);
        w.count("rails", false, self.rails.len(), MAX_RAILS)?;
        if let Err((f, p)) = self.validate() {
            return Err(w.err(f, p));
        }
        for rail in &self.rails {
            w.u16(rail.target_nic.0);
            rail.endpoint.encode(w);
        }
        Ok(())
    }

    pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let connect_id = ConnectId(r.u64("connect_id")?);
        let n = r.count("rails", false, MAX_RAILS, RAIL_ENDPOINT_LEN + 2)?;
        let mut rails = Vec::with_capacity(n);
        for _ in 0..n {
            let target_nic = NicId(r.u16("rail.target_nic")?);
            let endpoint = RailEndpoint::decode(r)?;
            rails.push(RailRequest {
                target_nic,
                endpoint,
            });
        }
        let f = Self { connect_id, rails };
        f.validate().map_err(|(field, p)| r.err(field, p))?;
        Ok(f)
    }
}

impl ConnectAccept {
    fn validate(&self) -> Result<(), (&'static str, Problem)> {
        nonempty(&self.rails)
    }

    pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u64(self.connect_id.0);
        w.count("rails", false, self.rails.len(), MAX_RAILS)?;
        if let Err((f, p)) = self.validate() {
            return Err(w.err(f, p));
        }
        for rail in &self.rails {
            rail.encode(w);
        }
        Ok(())
    }

    pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let connect_id = ConnectId(r.u64("connect_id")?);
        let n = r.count("rails", false, MAX_RAILS, RAIL_ENDPOINT_LEN)?;
        let mut rails = Vec::with_capacity(n);
        for _ in 0..n {
            rails.push(RailEndpoint::decode(r)?);
        }
        let f = Self { connect_id, rails };
        f.validate().map_err(|(field, p)| r.err(field, p))?;
        Ok(f)
    }
}

impl ConnectReject {
    pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u64(self.connect_id.0);
        w.u16(self.code.0);
        w.bytes16(
            "message",
            self.message.as_str().as_bytes(),
            Message::MAX_LEN,
        )
    }

    pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let connect_id = ConnectId(r.u64("connect_id")?);
        let code = ErrorCode(r.u16("code")?);
        let message = super::control::decode_message(r)?;
        Ok(Self {
            connect_id,
            code,
            message,
        })
    }
}
