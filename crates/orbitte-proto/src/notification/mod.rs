//! Notifications as the sans-IO state sees them: the bytes a batch
//! carries, the check at admission ([`Armed`]), whether each batch sent
//! one ([`NotificationStatus`]) and the tracker that holds a notifying
//! batch's outcomes until the batch resolves.
//!
//! Delivery rules (once, after every byte of the batch, on one of the
//! rails the batch used) are in the engine's `notify` module and
//! docs/contract.md.

pub mod tracker;

use orbitte_wire::MAX_NOTIFICATION_LEN;

use crate::core::CoreRequest;
use crate::ids::{PeerId, RailId};
pub use crate::outcome::{NotificationError, NotificationStatus};
use crate::request::TransferRequest;

/// The bytes a batch carries to its peer (at most
/// [`MAX_NOTIFICATION_LEN`], checked at submit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    bytes: Vec<u8>,
}

impl Notification {
    /// A notification of `bytes`.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            bytes: bytes.into(),
        }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The notification of a batch being admitted: checked, not yet tracked.
#[derive(Debug)]
pub struct Armed {
    peer: PeerId,
    notification: Notification,
    /// The rails the batch's requests were given, in first-use order: the
    /// notification goes on one of them (so the dispatch mask holds).
    rails: Vec<RailId>,
}

impl Armed {
    /// Checks `notification` for `batch`.
    pub fn check(
        batch: &[TransferRequest],
        notification: Notification,
    ) -> Result<Self, NotificationError> {
        let len = notification.bytes.len();
        if len > MAX_NOTIFICATION_LEN {
            return Err(NotificationError::TooLarge {
                len,
                max: MAX_NOTIFICATION_LEN,
            });
        }
        let peer = batch.first().map_or(PeerId(0), |r| r.peer);
        if let Some((index, r)) = batch.iter().enumerate().find(|(_, r)| r.peer != peer) {
            return Err(NotificationError::MixedPeers {
                index,
                first: peer.0,
                found: r.peer.0,
            });
        }
        Ok(Self {
            peer,
            notification,
            rails: Vec::new(),
        })
    }

    /// The peer it goes to.
    pub fn peer(&self) -> PeerId {
        self.peer
    }

    /// Bytes of the notification.
    pub fn payload_len(&self) -> usize {
        self.notification.bytes.len()
    }

    /// The peer, the bytes and the rails.
    pub fn into_parts(self) -> (PeerId, Vec<u8>, Vec<RailId>) {
        (self.peer, self.notification.bytes, self.rails)
    }

    /// The same, with the rails the core was given for the batch.
    pub fn on_rails(mut self, batch: &[CoreRequest]) -> Self {
        for r in batch.iter().flat_map(|r| &r.rails) {
            if !self.rails.contains(r) {
                self.rails.push(*r);
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PeerId, RangeId, RegistrationId};

    fn to(peer: u32) -> TransferRequest {
        TransferRequest::write(RegistrationId(1), 0, PeerId(peer), RangeId(1), 0, 8)
    }

    #[test]
    fn a_notification_is_checked_for_size_and_for_one_peer() {
        let max = Notification::new(vec![0; MAX_NOTIFICATION_LEN]);
        assert!(Armed::check(&[to(2), to(2)], max).is_ok());
        assert_eq!(
            Armed::check(
                &[to(2)],
                Notification::new(vec![0; MAX_NOTIFICATION_LEN + 1])
            )
            .err(),
            Some(NotificationError::TooLarge {
                len: MAX_NOTIFICATION_LEN + 1,
                max: MAX_NOTIFICATION_LEN
            })
        );
        assert_eq!(
            Armed::check(&[to(2), to(2), to(3)], Notification::new(&b"x"[..])).err(),
            Some(NotificationError::MixedPeers {
                index: 2,
                first: 2,
                found: 3
            })
        );
    }
}
