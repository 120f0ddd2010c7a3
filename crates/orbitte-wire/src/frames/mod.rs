//! Every frame, and the encode/decode entry points.

mod connect;
mod control;
mod data;
mod handshake;
mod notify;
mod segment;

pub use connect::{
    ConnectAccept, ConnectReject, ConnectRequest, MAX_RAILS, RailEndpoint, RailRequest,
};
pub use control::{ErrorFrame, Goodbye};
pub use data::{ReadRequest, ReadResponse, WriteRequest, WriteResponse};
pub use handshake::{Challenge, Hello, HelloAck, Identity};
pub use notify::{
    MAX_NOTIFICATION_FRAME_LEN, MAX_NOTIFICATION_LEN, NOTIFICATION_ANSWER_LEN,
    NOTIFICATION_OVERHEAD, Notification, NotificationAnswer,
};
pub use segment::{
    LocalHint, MAX_RANGES_PER_FRAME, MAX_RKEYS_PER_RANGE, NicRkey, RangeDescriptor,
    SegmentPublication, SegmentRetire,
};

use crate::codec::{Reader, Writer};
use crate::error::{DecodeError, EncodeError, Problem};
use crate::frame_type::FrameType;
use crate::header::{
    FrameHeader, HEADER_LEN, MAGIC, PROTOCOL_VERSION, fixed_part_len, max_body_len,
};

/// A frame of any type. Data frames (`WriteRequest`, `ReadResponse`) hold
/// their fixed fields only; their payload travels beside them (see
/// [`Frame::encode`] and [`decode_body`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// `challenge` (0x0001).
    Challenge(Challenge),
    /// `hello` (0x0002).
    Hello(Hello),
    /// `hello-ack` (0x0003).
    HelloAck(HelloAck),
    /// `goodbye` (0x0004).
    Goodbye(Goodbye),
    /// `error` (0x0005).
    Error(ErrorFrame),
    /// `segment-publication` (0x0010).
    SegmentPublication(SegmentPublication),
    /// `segment-retire` (0x0011).
    SegmentRetire(SegmentRetire),
    /// `connect-request` (0x0020).
    ConnectRequest(ConnectRequest),
    /// `connect-accept` (0x0021).
    ConnectAccept(ConnectAccept),
    /// `connect-reject` (0x0022).
    ConnectReject(ConnectReject),
    /// `read-request` (0x0030).
    ReadRequest(ReadRequest),
    /// `read-response` (0x0031); `length` payload bytes follow.
    ReadResponse(ReadResponse),
    /// `write-request` (0x0032); `length` payload bytes follow.
    WriteRequest(WriteRequest),
    /// `write-response` (0x0033).
    WriteResponse(WriteResponse),
    /// `notification` (0x0034).
    Notification(Notification),
    /// `notification-answer` (0x0035).
    NotificationAnswer(NotificationAnswer),
}

macro_rules! from_impls {
    ($($v:ident),*) => {
        $(impl From<$v> for Frame {
            fn from(f: $v) -> Self {
                Self::$v(f)
            }
        })*
    };
}
from_impls!(
    Challenge,
    Hello,
    HelloAck,
    Goodbye,
    SegmentPublication,
    SegmentRetire,
    ConnectRequest,
    ConnectAccept,
    ConnectReject,
    ReadRequest,
    ReadResponse,
    WriteRequest,
    WriteResponse,
    Notification,
    NotificationAnswer
);

impl From<ErrorFrame> for Frame {
    fn from(f: ErrorFrame) -> Self {
        Self::Error(f)
    }
}

impl Frame {
    /// The frame's type code.
    pub fn frame_type(&self) -> FrameType {
        match self {
            Self::Challenge(_) => FrameType::CHALLENGE,
            Self::Hello(_) => FrameType::HELLO,
            Self::HelloAck(_) => FrameType::HELLO_ACK,
            Self::Goodbye(_) => FrameType::GOODBYE,
            Self::Error(_) => FrameType::ERROR,
            Self::SegmentPublication(_) => FrameType::SEGMENT_PUBLICATION,
            Self::SegmentRetire(_) => FrameType::SEGMENT_RETIRE,
            Self::ConnectRequest(_) => FrameType::CONNECT_REQUEST,
            Self::ConnectAccept(_) => FrameType::CONNECT_ACCEPT,
            Self::ConnectReject(_) => FrameType::CONNECT_REJECT,
            Self::ReadRequest(_) => FrameType::READ_REQUEST,
            Self::ReadResponse(_) => FrameType::READ_RESPONSE,
            Self::WriteRequest(_) => FrameType::WRITE_REQUEST,
            Self::WriteResponse(_) => FrameType::WRITE_RESPONSE,
            Self::Notification(_) => FrameType::NOTIFICATION,
            Self::NotificationAnswer(_) => FrameType::NOTIFICATION_ANSWER,
        }
    }

    /// Payload bytes that follow the frame's fixed part: the `length` of a
    /// `WriteRequest` or `ReadResponse`, 0 for every other frame.
    pub fn payload_len(&self) -> u32 {
        match self {
            Self::WriteRequest(f) => f.length,
            Self::ReadResponse(f) => f.length,
            _ => 0,
        }
    }

    /// Appends the header and the body to `out`.
    ///
    /// For `WriteRequest` and `ReadResponse` it appends the header and the
    /// fixed part only; the header announces [`Frame::payload_len`] more
    /// bytes, which the caller must send right after, straight from the
    /// source memory (vectored write). Every other frame is complete.
    ///
    /// On error `out` is left as it was.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let start = out.len();
        let result = self.encode_inner(out);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    fn encode_inner(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let frame_type = self.frame_type();
        let start = out.len();
        out.extend_from_slice(&[0u8; HEADER_LEN]);
        let mut w = Writer::new(frame_type, out);
        match self {
            Self::Challenge(f) => f.encode_body(&mut w)?,
            Self::Hello(f) => f.encode_body(&mut w)?,
            Self::HelloAck(f) => f.encode_body(&mut w)?,
            Self::Goodbye(f) => f.encode_body(&mut w)?,
            Self::Error(f) => f.encode_body(&mut w)?,
            Self::SegmentPublication(f) => f.encode_body(&mut w)?,
            Self::SegmentRetire(f) => f.encode_body(&mut w)?,
            Self::ConnectRequest(f) => f.encode_body(&mut w)?,
            Self::ConnectAccept(f) => f.encode_body(&mut w)?,
            Self::ConnectReject(f) => f.encode_body(&mut w)?,
            Self::ReadRequest(f) => f.encode_body(&mut w)?,
            Self::ReadResponse(f) => f.encode_body(&mut w)?,
            Self::WriteRequest(f) => f.encode_body(&mut w)?,
            Self::WriteResponse(f) => f.encode_body(&mut w)?,
            Self::Notification(f) => f.encode_body(&mut w)?,
            Self::NotificationAnswer(f) => f.encode_body(&mut w)?,
        }
        let fixed = out.len() - start - HEADER_LEN;
        let max = max_body_len(frame_type);
        if fixed_part_len(frame_type).is_none() && fixed > max as usize {
            return Err(EncodeError {
                frame: frame_type,
                field: "body",
                problem: Problem::TooLong {
                    len: fixed as u64,
                    max: max.into(),
                },
            });
        }
        // fixed <= max_body_len (at most 4 MiB) or a data frame's fixed part, and the
        // payload was checked against MAX_PAYLOAD_LEN: the sum fits u32.
        let body_len = fixed as u32 + self.payload_len();
        let header = FrameHeader {
            version: PROTOCOL_VERSION,
            frame_type,
            body_len,
        };
        out[start..start + HEADER_LEN].copy_from_slice(&header.encode());
        Ok(())
    }

    /// Appends the complete frame, payload included (a convenience for tests
    /// and small frames; the tcp transport sends payloads with a vectored
    /// write instead). `payload` must be exactly [`Frame::payload_len`]
    /// bytes. On error `out` is left as it was.
    pub fn encode_with_payload(
        &self,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        if payload.len() != self.payload_len() as usize {
            return Err(EncodeError {
                frame: self.frame_type(),
                field: "payload",
                problem: Problem::Inconsistent {
                    rule: "payload must be exactly `length` bytes",
                },
            });
        }
        self.encode(out)?;
        out.extend_from_slice(payload);
        Ok(())
    }

    /// The complete frame in a new buffer (no payload: see
    /// [`Frame::encode`]).
    pub fn to_bytes(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }
}

/// Decodes the body of a frame whose header was decoded with
/// [`FrameHeader::decode`]. `fixed` must be exactly
/// [`FrameHeader::fixed_len`] bytes: the whole body of a control frame, the
/// fixed part of a data frame. For a data frame, [`FrameHeader::payload_len`]
/// bytes follow on the wire: read them into the destination.
///
/// This is the zero-copy receive path: read 12 bytes, decode the header,
/// read `fixed_len` bytes into a reusable buffer (at most
/// [`max_body_len`]), decode them here, then read the payload.
pub fn decode_body(header: &FrameHeader, fixed: &[u8]) -> Result<Frame, DecodeError> {
    let frame_type = header.frame_type;
    let want = header.fixed_len();
    if fixed.len() < want {
        return Err(DecodeError::new(
            frame_type,
            "body",
            Problem::Truncated {
                needed: want,
                available: fixed.len(),
            },
        ));
    }
    if fixed.len() > want {
        return Err(DecodeError::new(
            frame_type,
            "body",
            Problem::TrailingBytes {
                count: fixed.len() - want,
            },
        ));
    }
    if header.version != PROTOCOL_VERSION && frame_type != FrameType::ERROR {
        return Err(DecodeError::new(
            frame_type,
            "header.version",
            Problem::UnsupportedVersion {
                ours: PROTOCOL_VERSION,
                theirs: header.version,
            },
        ));
    }
    let mut r = Reader::new(frame_type, fixed);
    let frame = match frame_type {
        FrameType::CHALLENGE => Frame::Challenge(Challenge::decode_body(&mut r)?),
        FrameType::HELLO => Frame::Hello(Hello::decode_body(&mut r)?),
        FrameType::HELLO_ACK => Frame::HelloAck(HelloAck::decode_body(&mut r)?),
        FrameType::GOODBYE => Frame::Goodbye(Goodbye::decode_body(&mut r)?),
        FrameType::ERROR => Frame::Error(ErrorFrame::decode_body(&mut r)?),
        FrameType::SEGMENT_PUBLICATION => {
            Frame::SegmentPublication(SegmentPublication::decode_body(&mut r)?)
        }
        FrameType::SEGMENT_RETIRE => Frame::SegmentRetire(SegmentRetire::decode_body(&mut r)?),
        FrameType::CONNECT_REQUEST => Frame::ConnectRequest(ConnectRequest::decode_body(&mut r)?),
        FrameType::CONNECT_ACCEPT => Frame::ConnectAccept(ConnectAccept::decode_body(&mut r)?),
        FrameType::CONNECT_REJECT => Frame::ConnectReject(ConnectReject::decode_body(&mut r)?),
        FrameType::READ_REQUEST => Frame::ReadRequest(ReadRequest::decode_body(&mut r)?),
        FrameType::READ_RESPONSE => Frame::ReadResponse(ReadResponse::decode_body(&mut r)?),
        FrameType::WRITE_REQUEST => Frame::WriteRequest(WriteRequest::decode_body(&mut r)?),
        FrameType::WRITE_RESPONSE => Frame::WriteResponse(WriteResponse::decode_body(&mut r)?),
        FrameType::NOTIFICATION => Frame::Notification(Notification::decode_body(&mut r)?),
        FrameType::NOTIFICATION_ANSWER => {
            Frame::NotificationAnswer(NotificationAnswer::decode_body(&mut r)?)
        }
        _ => {
            return Err(DecodeError::new(
                frame_type,
                "header.frame_type",
                Problem::UnknownFrameType,
            ));
        }
    };
    r.finish()?;
    if frame.payload_len() != header.payload_len() {
        return Err(DecodeError::new(
            frame_type,
            "length",
            Problem::Inconsistent {
                rule: "length must equal the payload bytes the header announces",
            },
        ));
    }
    Ok(frame)
}

/// A frame decoded from a buffer by [`decode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The frame (fixed fields).
    pub frame: Frame,
    /// The payload of a data frame, empty otherwise.
    pub payload: &'a [u8],
    /// Bytes of `buf` the frame occupied, header and payload included; the
    /// next frame, if any, starts there.
    pub frame_len: usize,
}

/// Decodes the frame at the start of `buf` (header, body and payload all in
/// memory). Bytes after the frame are left for the next call.
///
/// When `buf` holds only a prefix of a frame the error satisfies
/// [`DecodeError::is_truncation`]: read more and call again. A prefix that
/// already contradicts the magic fails at once.
pub fn decode(buf: &[u8]) -> Result<Decoded<'_>, DecodeError> {
    let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
        let frame_type = match buf {
            [_, _, _, _, _, _, a, b, ..] => FrameType(u16::from_be_bytes([*a, *b])),
            _ => FrameType(0),
        };
        let n = buf.len().min(MAGIC.len());
        if buf[..n] != MAGIC[..n] {
            let mut found = [0u8; 4];
            found[..n].copy_from_slice(&buf[..n]);
            return Err(DecodeError::new(
                frame_type,
                "header.magic",
                Problem::BadMagic { found },
            ));
        }
        return Err(DecodeError::new(
            frame_type,
            "header",
            Problem::Truncated {
                needed: HEADER_LEN,
                available: buf.len(),
            },
        ));
    };
    let header = FrameHeader::decode(head)?;
    let rest = &buf[HEADER_LEN..];
    let body_len = header.body_len as usize;
    if rest.len() < body_len {
        return Err(DecodeError::new(
            header.frame_type,
            "body",
            Problem::Truncated {
                needed: body_len,
                available: rest.len(),
            },
        ));
    }
    let (fixed, payload) = rest[..body_len].split_at(header.fixed_len());
    let frame = decode_body(&header, fixed)?;
    Ok(Decoded {
        frame,
        payload,
        frame_len: header.frame_len(),
    })
}

/// Decodes a buffer that must hold exactly one frame (payload included):
/// bytes after it are an error (`TrailingBytes`).
pub fn decode_exact(buf: &[u8]) -> Result<(Frame, &[u8]), DecodeError> {
    let d = decode(buf)?;
    if d.frame_len != buf.len() {
        return Err(DecodeError::new(
            d.frame.frame_type(),
            "frame",
            Problem::TrailingBytes {
                count: buf.len() - d.frame_len,
            },
        ));
    }
    Ok((d.frame, d.payload))
}
