//! `error` and `goodbye`.

use crate::codec::{Reader, Writer};
use crate::error::{DecodeError, EncodeError};
use crate::frame_type::FrameType;
use crate::types::{ErrorCode, GoodbyeReason, Message, RequestId};

/// A fatal error: the sender closes the session after sending it.
///
/// The layout of this frame is frozen across protocol versions, and a
/// decoder accepts it whatever the header's version, so that a peer rejected
/// for its version still learns why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorFrame {
    /// The stable code.
    pub code: ErrorCode,
    /// The type of the frame that caused the error (`FrameType(0)` when no
    /// frame did, e.g. a timeout).
    pub frame_type: FrameType,
    /// The request the error is about, `RequestId(0)` when none.
    pub request_id: RequestId,
    /// Details for the log; for `unsupported-version` it names both
    /// versions.
    pub message: Message,
}

/// Orderly end of a session. After sending it a side sends no new requests
/// and connect-requests, still answers the requests it had received, then
/// closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Goodbye {
    /// Why.
    pub reason: GoodbyeReason,
    /// Details for the log.
    pub message: Message,
}

pub(crate) fn decode_message(r: &mut Reader<'_>) -> Result<Message, DecodeError> {
    let raw = r.bytes16("message", Message::MAX_LEN)?;
    let text = Reader::utf8(raw).map_err(|p| r.err("message", p))?;
    // Length was checked by bytes16, so `new` cannot fail; stay total anyway.
    Ok(Message::truncating(text))
}

impl ErrorFrame {
    /// The frame to send before closing a session because a received frame
    /// did not decode: the code from [`DecodeError::error_code`], the
    /// offending frame type, and the error's text (truncated to
    /// [`Message::MAX_LEN`]).
    pub fn from_decode_error(error: &DecodeError) -> Self {
        Self {
            code: error.error_code(),
            frame_type: error.frame,
            request_id: RequestId(0),
            message: Message::truncating(error.to_string()),
        }
    }

    pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u16(self.code.0);
        w.u16(self.frame_type.0);
        w.u64(self.request_id.0);
        w.bytes16(
            "message",
            self.message.as_str().as_bytes(),
            Message::MAX_LEN,
        )
    }

    pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            code: ErrorCode(r.u16("code")?),
            frame_type: FrameType(r.u16("frame_type")?),
            request_id: RequestId(r.u64("request_id")?),
            message: decode_message(r)?,
        })
    }
}

impl Goodbye {
    pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u16(self.reason.0);
        w.bytes16(
            "message",
            self.message.as_str().as_bytes(),
            Message::MAX_LEN,
        )
    }

    pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            reason: GoodbyeReason(r.u16("reason")?),
            message: decode_message(r)?,
        })
    }
}
