//! `notification`: opaque bytes an initiator sends after a batch, and
//! `notification-answer`: whether the target queued it.
//!
//! The frame carries no claim of who sent it: the receiver tags it with the
//! identity of the session (tcp, local) or queue pair (rdma) it arrived on,
//! which the handshake authenticated.

use crate::codec::{Reader, Writer};
use crate::error::{DecodeError, EncodeError};
use crate::header::HEADER_LEN;
use crate::types::NotificationVerdict;

/// The largest notification payload: 1 MiB.
pub const MAX_NOTIFICATION_LEN: usize = 1 << 20;

/// Bytes of an encoded `notification` frame besides its payload: the
/// header, the id (8) and the payload's length (4).
pub const NOTIFICATION_OVERHEAD: usize = HEADER_LEN + 8 + 4;

/// The largest encoded `notification` frame, header included.
pub const MAX_NOTIFICATION_FRAME_LEN: usize = NOTIFICATION_OVERHEAD + MAX_NOTIFICATION_LEN;

/// Body bytes of a `notification-answer`.
pub const NOTIFICATION_ANSWER_LEN: usize = 8 + 2 + 8;

/// A notification: sent once, after every request of the batch it belongs
/// to completed, on a session or queue pair to the batch's peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// Chosen by the sender, unique among its notifications; the answer
    /// names it.
    pub notification_id: u64,
    /// The caller's bytes. Invariant: at most [`MAX_NOTIFICATION_LEN`].
    pub payload: Vec<u8>,
}

impl Notification {
    pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u64(self.notification_id);
        w.bytes32("payload", &self.payload, MAX_NOTIFICATION_LEN)
    }

    pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            notification_id: r.u64("notification_id")?,
            payload: r.bytes32("payload", MAX_NOTIFICATION_LEN)?.to_vec(),
        })
    }
}

/// The target's answer to a `notification`, on the same session or queue
/// pair: queued, or refused and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotificationAnswer {
    /// The answered notification's id.
    pub notification_id: u64,
    /// Queued or refused.
    pub verdict: NotificationVerdict,
    /// For a refusal, the bound that was reached (notifications or bytes
    /// the target holds for this sender); 0 otherwise.
    pub limit: u64,
}

impl NotificationAnswer {
    pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u64(self.notification_id);
        w.u16(self.verdict.0);
        w.u64(self.limit);
        Ok(())
    }

    pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            notification_id: r.u64("notification_id")?,
            verdict: NotificationVerdict(r.u16("verdict")?),
            limit: r.u64("limit")?,
        })
    }
}
