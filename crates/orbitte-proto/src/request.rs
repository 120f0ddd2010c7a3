//! The positional request form.

use orbitte_wire::Epoch;

use crate::{Op, PeerId, RangeId, RegistrationId};

/// One READ or WRITE of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferRequest {
    /// READ (remote → local) or WRITE (local → remote).
    pub op: Op,
    /// The local registration.
    pub registration: RegistrationId,
    /// Offset in it.
    pub local_offset: u64,
    /// The peer.
    pub peer: PeerId,
    /// The peer's published range.
    pub range: RangeId,
    /// Offset in it.
    pub remote_offset: u64,
    /// Bytes.
    pub len: u64,
    /// Caller's label, echoed in the outcome and in errors.
    pub label: u64,
    /// The peer's epoch the request was made for (from the handle that
    /// named the range); `None` runs against whatever incarnation of the
    /// peer is open at submit. A request for an older epoch than the one
    /// open is refused with [`RequestError::PeerRestarted`](crate::outcome::RequestError::PeerRestarted).
    pub epoch: Option<Epoch>,
}

impl TransferRequest {
    /// A WRITE of `len` bytes from `local` at `local_offset` to the peer's
    /// `range` at `remote_offset`.
    pub fn write(
        local: RegistrationId,
        local_offset: u64,
        peer: PeerId,
        range: RangeId,
        remote_offset: u64,
        len: u64,
    ) -> Self {
        Self {
            op: Op::Write,
            registration: local,
            local_offset,
            peer,
            range,
            remote_offset,
            len,
            label: 0,
            epoch: None,
        }
    }

    /// A READ of `len` bytes from the peer's `range` at `remote_offset` into
    /// `local` at `local_offset`.
    pub fn read(
        local: RegistrationId,
        local_offset: u64,
        peer: PeerId,
        range: RangeId,
        remote_offset: u64,
        len: u64,
    ) -> Self {
        Self {
            op: Op::Read,
            registration: local,
            local_offset,
            peer,
            range,
            remote_offset,
            len,
            label: 0,
            epoch: None,
        }
    }

    /// Same request with a label.
    pub fn label(mut self, label: u64) -> Self {
        self.label = label;
        self
    }

    /// Same request, bound to the peer's incarnation `epoch` (the epoch of
    /// the handle its range came from).
    pub fn for_epoch(mut self, epoch: Epoch) -> Self {
        self.epoch = Some(epoch);
        self
    }
}
