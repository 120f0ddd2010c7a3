//! The 12-byte frame header and the protocol's bounds.

use crate::error::{DecodeError, Problem};
use crate::frame_type::FrameType;

/// The four bytes every frame starts with: `OBTE`.
pub const MAGIC: [u8; 4] = *b"OBTE";

/// The protocol version this crate speaks. Both peers must speak exactly this
/// version: there is no negotiation and no legacy fallback.
pub const PROTOCOL_VERSION: u16 = 3;

/// Bytes of the frame header: magic (4), version (2), frame type (2), body
/// length (4).
pub const HEADER_LEN: usize = 12;

/// The largest body of a control frame (every frame but `read-response` and
/// `write-request`): 4 MiB. It holds the largest legal segment publication.
/// A receiver buffers at most this much for one frame.
pub const MAX_CONTROL_BODY_LEN: u32 = 4 << 20;

/// The largest payload of one data frame (`write-request`, `read-response`):
/// 16 MiB. The engine slices larger transfers.
pub const MAX_PAYLOAD_LEN: u32 = 16 << 20;

/// Fixed part of a `read-request`.
pub const READ_REQUEST_LEN: usize = 36;
/// Fixed part of a `read-response` (the payload follows).
pub const READ_RESPONSE_FIXED_LEN: usize = 30;
/// Fixed part of a `write-request` (the payload follows).
pub const WRITE_REQUEST_FIXED_LEN: usize = 36;
/// Fixed part of a `write-response`.
pub const WRITE_RESPONSE_LEN: usize = 30;

/// The largest frame on the wire, header included:
/// `HEADER_LEN + 36 + MAX_PAYLOAD_LEN` (a full `write-request`).
pub const MAX_FRAME_LEN: usize = HEADER_LEN + WRITE_REQUEST_FIXED_LEN + MAX_PAYLOAD_LEN as usize;

/// A decoded frame header.
///
/// Invariant (of a header returned by [`FrameHeader::decode`]): the frame
/// type is known, `body_len` is within the type's bounds, and the version is
/// [`PROTOCOL_VERSION`] (or the type is `error`, whose layout is frozen).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Protocol version of the sender.
    pub version: u16,
    /// The frame type.
    pub frame_type: FrameType,
    /// Body bytes after the header: fixed part plus payload.
    pub body_len: u32,
}

impl FrameHeader {
    /// Decodes and checks a header: magic, version, type, body length bounds.
    ///
    /// The `error` frame is accepted from any version because its layout is
    /// frozen across versions: a peer rejected for its version still learns
    /// why.
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Result<Self, DecodeError> {
        let frame_type = FrameType(u16::from_be_bytes([bytes[6], bytes[7]]));
        let err = |field, problem| DecodeError::new(frame_type, field, problem);
        let found = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if found != MAGIC {
            return Err(err("header.magic", Problem::BadMagic { found }));
        }
        let version = u16::from_be_bytes([bytes[4], bytes[5]]);
        if version != PROTOCOL_VERSION && frame_type != FrameType::ERROR {
            return Err(err(
                "header.version",
                Problem::UnsupportedVersion {
                    ours: PROTOCOL_VERSION,
                    theirs: version,
                },
            ));
        }
        if !frame_type.is_known() {
            return Err(err("header.frame_type", Problem::UnknownFrameType));
        }
        let body_len = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        let (min, max) = body_bounds(frame_type);
        if u64::from(body_len) > max {
            return Err(err(
                "header.body_len",
                Problem::TooLong {
                    len: body_len.into(),
                    max,
                },
            ));
        }
        if u64::from(body_len) < min {
            return Err(err(
                "header.body_len",
                Problem::TooShort {
                    len: body_len.into(),
                    min,
                },
            ));
        }
        Ok(Self {
            version,
            frame_type,
            body_len,
        })
    }

    /// The 12 header bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&self.version.to_be_bytes());
        b[6..8].copy_from_slice(&self.frame_type.0.to_be_bytes());
        b[8..12].copy_from_slice(&self.body_len.to_be_bytes());
        b
    }

    /// Bytes of the body to buffer and hand to [`crate::decode_body`]: the
    /// whole body for control frames, the fixed part for data frames.
    pub fn fixed_len(&self) -> usize {
        match fixed_part_len(self.frame_type) {
            Some(fixed) => fixed,
            None => self.body_len as usize,
        }
    }

    /// Payload bytes that follow the fixed part (0 for control frames): read
    /// them straight into the destination.
    pub fn payload_len(&self) -> u32 {
        // body_len >= fixed_len for a decoded header; saturate otherwise.
        self.body_len.saturating_sub(self.fixed_len() as u32)
    }

    /// Header length plus body length.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.body_len as usize
    }
}

/// For payload-carrying frames, the length of their fixed part.
pub(crate) fn fixed_part_len(frame_type: FrameType) -> Option<usize> {
    match frame_type {
        FrameType::READ_RESPONSE => Some(READ_RESPONSE_FIXED_LEN),
        FrameType::WRITE_REQUEST => Some(WRITE_REQUEST_FIXED_LEN),
        _ => None,
    }
}

/// The largest body of a handshake frame (`challenge`, `hello`,
/// `hello-ack`), of `goodbye` and `error`, and of the connect frames: 4 KiB.
/// The largest legal one (a `hello` with a 255-byte source id and a proof,
/// or 64 rails of a `connect-request`) is well below it. A session reads
/// nothing larger before the peer has authenticated.
pub const MAX_SMALL_BODY_LEN: u32 = 4 << 10;

/// The largest body of a `segment-retire`: 16 KiB (1024 range ids and the
/// epoch take 8 202 bytes).
pub const MAX_RETIRE_BODY_LEN: u32 = 16 << 10;

/// The largest `body_len` a receiver accepts for `frame_type`, checked
/// against the header before any body byte is buffered: the fixed part
/// plus [`MAX_PAYLOAD_LEN`] for data frames, the exact length for the
/// fixed-size requests and answers (`notification-answer` included),
/// [`MAX_SMALL_BODY_LEN`] or [`MAX_RETIRE_BODY_LEN`] for the small control
/// frames, the largest `notification` (a
/// [`MAX_NOTIFICATION_LEN`](crate::MAX_NOTIFICATION_LEN) payload) for
/// `notification`, and [`MAX_CONTROL_BODY_LEN`] for
/// `segment-publication` (and any other control frame).
pub fn max_body_len(frame_type: FrameType) -> u32 {
    match frame_type {
        FrameType::READ_RESPONSE => READ_RESPONSE_FIXED_LEN as u32 + MAX_PAYLOAD_LEN,
        FrameType::WRITE_REQUEST => WRITE_REQUEST_FIXED_LEN as u32 + MAX_PAYLOAD_LEN,
        FrameType::READ_REQUEST => READ_REQUEST_LEN as u32,
        FrameType::WRITE_RESPONSE => WRITE_RESPONSE_LEN as u32,
        FrameType::CHALLENGE
        | FrameType::HELLO
        | FrameType::HELLO_ACK
        | FrameType::GOODBYE
        | FrameType::ERROR
        | FrameType::CONNECT_REQUEST
        | FrameType::CONNECT_ACCEPT
        | FrameType::CONNECT_REJECT => MAX_SMALL_BODY_LEN,
        FrameType::SEGMENT_RETIRE => MAX_RETIRE_BODY_LEN,
        FrameType::NOTIFICATION => (crate::frames::MAX_NOTIFICATION_FRAME_LEN - HEADER_LEN) as u32,
        FrameType::NOTIFICATION_ANSWER => crate::frames::NOTIFICATION_ANSWER_LEN as u32,
        _ => MAX_CONTROL_BODY_LEN,
    }
}

/// Allowed body lengths, inclusive.
fn body_bounds(frame_type: FrameType) -> (u64, u64) {
    let min = fixed_part_len(frame_type).unwrap_or(0) as u64;
    (min, u64::from(max_body_len(frame_type)))
}
