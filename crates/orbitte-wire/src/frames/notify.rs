//! `notification`: opaque bytes an initiator sends after a batch.
//!
//! The frame carries no claim of who sent it: the receiver tags it with the
//! identity of the session (tcp, local) or queue pair (rdma) it arrived on,
//! which the handshake authenticated.

use crate::codec::{Reader, Writer};
use crate::error::{DecodeError, EncodeError};

/// The largest notification payload: 4 KiB.
pub const MAX_NOTIFICATION_LEN: usize = 4096;

/// The largest encoded `notification` frame, header included: what an rdma
/// receive buffer must hold.
pub const MAX_NOTIFICATION_FRAME_LEN: usize =
    crate::header::HEADER_LEN + 8 + 2 + MAX_NOTIFICATION_LEN;

/// A notification: sent once, after every request of the batch it belongs
/// to completed, on a session or queue pair to the batch's peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// Chosen by the sender, unique among its notifications (for logs).
    pub notification_id: u64,
    /// The caller's bytes. Invariant: at most [`MAX_NOTIFICATION_LEN`].
    pub payload: Vec<u8>,
}

impl Notification {
    pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u64(self.notification_id);
        w.bytes16("payload", &self.payload, MAX_NOTIFICATION_LEN)
    }

    pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            notification_id: r.u64("notification_id")?,
            payload: r.bytes16("payload", MAX_NOTIFICATION_LEN)?.to_vec(),
        })
    }
}
