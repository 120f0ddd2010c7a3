//! tcp data operations: READ and WRITE requests and responses.
//!
//! `write-request` and `read-response` carry a payload of exactly `length`
//! bytes after their fixed part. They are encoded and decoded without the
//! payload (zero-copy): the sender writes header + fixed part from a small
//! buffer and the payload straight from the source memory (vectored write);
//! the receiver decodes the fixed part, then reads `length` bytes straight
//! into the destination.

use crate::codec::{Reader, Writer};
use crate::error::{DecodeError, EncodeError, Problem};
use crate::header::MAX_PAYLOAD_LEN;
use crate::types::{AccessToken, RangeId, RequestId, Status};

/// Ask the owner for `length` bytes at `offset` of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    /// Chosen by the requester, unique among its outstanding requests.
    pub request_id: RequestId,
    /// The range (from the owner's publication).
    pub range_id: RangeId,
    /// The range's token.
    pub token: AccessToken,
    /// Offset within the range.
    pub offset: u64,
    /// Bytes to read. Invariant: at most [`MAX_PAYLOAD_LEN`], and
    /// `offset + length` does not overflow.
    pub length: u32,
}

/// The owner's answer to a [`ReadRequest`]; `length` payload bytes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadResponse {
    /// Echoes the request.
    pub request_id: RequestId,
    /// Echoes the request.
    pub range_id: RangeId,
    /// Echoes the request.
    pub offset: u64,
    /// The outcome.
    pub status: Status,
    /// Payload bytes that follow: the requested length when `status` is
    /// `ok`. Invariant: at most [`MAX_PAYLOAD_LEN`]; 0 unless `status` is
    /// `ok`.
    pub length: u32,
}

/// Write `length` payload bytes (which follow) at `offset` of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteRequest {
    /// Chosen by the requester, unique among its outstanding requests.
    pub request_id: RequestId,
    /// The range (from the owner's publication).
    pub range_id: RangeId,
    /// The range's token.
    pub token: AccessToken,
    /// Offset within the range.
    pub offset: u64,
    /// Payload bytes that follow. Invariant: at most [`MAX_PAYLOAD_LEN`],
    /// and `offset + length` does not overflow.
    pub length: u32,
}

/// The owner's answer to a [`WriteRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteResponse {
    /// Echoes the request.
    pub request_id: RequestId,
    /// Echoes the request.
    pub range_id: RangeId,
    /// Echoes the request.
    pub offset: u64,
    /// The outcome. Anything but `ok` means the owner wrote nothing (it
    /// checks range, token, access and bounds before touching memory).
    pub status: Status,
    /// Bytes written: the request's length when `status` is `ok`, else 0.
    pub length: u32,
}

fn check_request(offset: u64, length: u32) -> Result<(), (&'static str, Problem)> {
    if length > MAX_PAYLOAD_LEN {
        return Err((
            "length",
            Problem::TooLong {
                len: length.into(),
                max: MAX_PAYLOAD_LEN.into(),
            },
        ));
    }
    if offset.checked_add(length.into()).is_none() {
        return Err((
            "length",
            Problem::Inconsistent {
                rule: "offset + length must not overflow u64",
            },
        ));
    }
    Ok(())
}

fn check_response(status: Status, length: u32) -> Result<(), (&'static str, Problem)> {
    if length > MAX_PAYLOAD_LEN {
        return Err((
            "length",
            Problem::TooLong {
                len: length.into(),
                max: MAX_PAYLOAD_LEN.into(),
            },
        ));
    }
    if !status.is_ok() && length != 0 {
        return Err((
            "length",
            Problem::Inconsistent {
                rule: "length must be 0 when status is not ok",
            },
        ));
    }
    Ok(())
}

macro_rules! request_codec {
    ($ty:ident) => {
        impl $ty {
            pub(crate) fn validate(&self) -> Result<(), (&'static str, Problem)> {
                check_request(self.offset, self.length)
            }

            pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
                if let Err((f, p)) = self.validate() {
                    return Err(w.err(f, p));
                }
                w.u64(self.request_id.0);
                w.u64(self.range_id.0);
                w.u64(self.token.0);
                w.u64(self.offset);
                w.u32(self.length);
                Ok(())
            }

            pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                let f = Self {
                    request_id: RequestId(r.u64("request_id")?),
                    range_id: RangeId(r.u64("range_id")?),
                    token: AccessToken(r.u64("token")?),
                    offset: r.u64("offset")?,
                    length: r.u32("length")?,
                };
                f.validate().map_err(|(field, p)| r.err(field, p))?;
                Ok(f)
            }
        }
    };
}

macro_rules! response_codec {
    ($ty:ident) => {
        impl $ty {
            pub(crate) fn validate(&self) -> Result<(), (&'static str, Problem)> {
                check_response(self.status, self.length)
            }

            pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
                if let Err((f, p)) = self.validate() {
                    return Err(w.err(f, p));
                }
                w.u64(self.request_id.0);
                w.u64(self.range_id.0);
                w.u64(self.offset);
                w.u16(self.status.0);
                w.u32(self.length);
                Ok(())
            }

            pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                let f = Self {
                    request_id: RequestId(r.u64("request_id")?),
                    range_id: RangeId(r.u64("range_id")?),
                    offset: r.u64("offset")?,
                    status: Status(r.u16("status")?),
                    length: r.u32("length")?,
                };
                f.validate().map_err(|(field, p)| r.err(field, p))?;
                Ok(f)
            }
        }
    };
}

request_codec!(ReadRequest);
request_codec!(WriteRequest);
response_codec!(ReadResponse);
response_codec!(WriteResponse);
