//! Notifications: opaque bytes (at most [`MAX_NOTIFICATION_LEN`]) a batch
//! carries to its peer, delivered once, after every byte of the batch.
//!
//! Initiator side: [`TransferEngine::submit_with_notification`] admits the
//! batch like [`TransferEngine::submit`] and tracks it (module `tracker`). The
//! outcomes of its requests are held until the last one is made; then, on
//! the engine's own threads (whichever pumps the core: a poller, a
//! transport's reporting thread, the timer), the notification goes to the
//! peer if every request completed, and every outcome of the batch is
//! released with the same [`NotificationStatus`]. The caller never has to
//! poll for it to go out. A batch with a request that failed, timed out or
//! was cancelled sends nothing.
//!
//! It goes on one of the rails the batch used, after the bytes they placed:
//! rdma as a SEND on the rail's RC queue pair (module `rdma`), tcp as a
//! `notification` frame on a session whose WRITEs the target answered only
//! after applying them, local as a `notification` frame on the mapping
//! session after the copies into the shared mapping finished.
//!
//! Target side: received notifications wait in a bounded queue
//! (module `inbox`; full: new ones refused and counted), read with
//! [`TransferEngine::notifications`] and
//! [`TransferEngine::wait_notification`], each tagged with the source id
//! and epoch the session or queue pair was admitted with.

pub(crate) mod inbox;
pub(crate) mod rdma;
pub(crate) mod tracker;

use std::sync::Arc;
use std::time::Duration;

use orbitte_wire as wire;

use crate::core::CoreRequest;
use crate::engine::{Owner, State, TransferEngine, TransferRequest};
use crate::outcome::{RequestId, SubmitError};
use crate::state::Transmit;
use crate::transport::{PathKind, PeerId, RailId};

pub use inbox::INBOX_CAPACITY;
pub use orbitte_wire::MAX_NOTIFICATION_LEN;

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

/// Whether a request's batch sent a notification.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NotificationStatus {
    /// The batch carried none.
    #[default]
    NotRequested,
    /// Every request of the batch completed and the notification was handed
    /// to the peer's path (a SEND posted behind the WRITEs, a frame queued
    /// on a live session). The target queues it once; a rail that breaks
    /// after this point can lose it, never duplicate it.
    Sent,
    /// Not sent, and it never will be: a request of the batch did not
    /// complete, or no rail to the peer took it.
    NotSent {
        /// Why.
        why: Arc<str>,
    },
}

/// A notification as the target receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedNotification {
    /// The sender's source id (as its session or queue pair was admitted).
    pub source_id: String,
    /// The sender's epoch.
    pub epoch: wire::Epoch,
    /// The path it came over.
    pub path: PathKind,
    /// The bytes.
    pub payload: Vec<u8>,
}

/// Counters of the target's notification queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotificationStats {
    /// Waiting to be read.
    pub queued: usize,
    /// Queued since the engine was built.
    pub received: u64,
    /// Refused because the queue held [`INBOX_CAPACITY`] already.
    pub refused_full: u64,
    /// Notification frames from peers that did not decode (dropped).
    pub malformed: u64,
}

/// Why a notifying batch was refused at submit (nothing was posted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotificationError {
    /// The notification is larger than the protocol carries.
    #[error(
        "notification of {len} bytes is larger than {max} bytes: send less (put bulk data in registered memory)"
    )]
    TooLarge {
        /// Its length.
        len: usize,
        /// [`MAX_NOTIFICATION_LEN`].
        max: usize,
    },
    /// A notifying batch goes to one peer.
    #[error(
        "a notifying batch goes to one peer: request #{index} names peer {found}, the first one peer {first}; submit one batch per peer"
    )]
    MixedPeers {
        /// Position of the first request to another peer.
        index: usize,
        /// The first request's peer.
        first: u32,
        /// That request's peer.
        found: u32,
    },
    /// A notifying batch cannot carry cuda-staging requests (local memory
    /// on a GPU): their chunks are separate requests of the engine, and the
    /// notification would not be held behind them.
    #[error(
        "a notifying batch cannot carry cuda-staging requests: request #{index} has GPU memory as \
         its local side; send the notification with a batch of host memory after it completes"
    )]
    Staged {
        /// Position of the first cuda-staging request.
        index: usize,
    },
}

/// The notification of a batch being admitted: checked, not yet tracked.
#[derive(Debug)]
pub(crate) struct Armed {
    peer: PeerId,
    notification: Notification,
    /// The rails the batch's requests were given, in first-use order: the
    /// notification goes on one of them (so the dispatch mask holds).
    rails: Vec<RailId>,
}

impl Armed {
    /// Checks `notification` for `batch`.
    pub(crate) fn check(
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

    /// The peer, the bytes and the rails.
    pub(crate) fn into_parts(self) -> (PeerId, Vec<u8>, Vec<RailId>) {
        (self.peer, self.notification.bytes, self.rails)
    }

    /// The same, with the rails the core was given for the batch.
    pub(crate) fn on_rails(mut self, batch: &[CoreRequest]) -> Self {
        for r in batch.iter().flat_map(|r| &r.rails) {
            if !self.rails.contains(r) {
                self.rails.push(*r);
            }
        }
        self
    }
}

/// Tracks the admitted batch `ids` carrying `armed` (the engine calls it
/// right after the core admitted the batch, before it pumps).
pub(crate) fn track(st: &mut State, ids: &[RequestId], armed: Armed) {
    st.engine.track_notification(ids, armed);
}

/// Moves the core's outcomes to the engine's table (`EngineState` holds
/// those of notifying batches and decides each notification) and sends
/// the notifications it asks for. The engine's pump calls it.
pub(crate) fn collect_outcomes(st: &mut State) {
    st.engine.collect_outcomes();
    while let Some(t) = st.engine.poll_transmit() {
        let result = send(st, &t);
        st.engine.notification_sent(t.id, result);
    }
}

/// Hands the frame to the first of the transmit's rails whose transport
/// takes it; else why each refused.
fn send(st: &mut State, t: &Transmit) -> Result<(), Vec<String>> {
    let mut why = Vec::new();
    for &rail in &t.rails {
        let res = match st.owner.get(rail.0 as usize) {
            Some(Owner::Rdma) => rdma::send(st.rdma.rail_mut(rail).as_deref_mut(), rail, &t.frame),
            Some(Owner::Other(i)) => match st.others.get_mut(*i) {
                Some(tr) => tr.notify(rail, &t.frame),
                None => {
                    why.push(format!("rail {} has no transport", rail.0));
                    continue;
                }
            },
            None => {
                why.push(format!("rail {} has no transport", rail.0));
                continue;
            }
        };
        match res {
            Ok(()) => return Ok(()),
            Err(e) => why.push(e.to_string()),
        }
    }
    Err(why)
}

impl TransferEngine {
    /// Submits a batch like [`submit`](Self::submit) that also carries
    /// `notification` to the batch's peer (every request must name the same
    /// peer). The peer receives it once, after every byte of the batch was
    /// placed, and only if every request completes; the engine's threads
    /// send it, the caller only waits for the outcomes as usual. Every
    /// outcome of the batch comes out when the last one is made, with
    /// [`Outcome::notification`](crate::Outcome::notification) saying
    /// whether it was sent. A notification larger than
    /// [`MAX_NOTIFICATION_LEN`] or a batch to several peers is refused here.
    pub fn submit_with_notification<R: Into<crate::Request> + Copy>(
        &self,
        batch: &[R],
        notification: Notification,
    ) -> Result<Vec<RequestId>, SubmitError> {
        let resolved = self.resolve(batch)?;
        if let Some(index) = self.first_staged(&resolved) {
            return Err(NotificationError::Staged { index }.into());
        }
        let armed = Armed::check(&resolved, notification)?;
        self.submit_inner(&resolved, Some(armed))
    }

    /// Takes every notification received so far, oldest first (never
    /// blocks).
    pub fn notifications(&self) -> Vec<ReceivedNotification> {
        self.shared.inbox.drain()
    }

    /// Takes the oldest notification, waiting up to `timeout` for one;
    /// `None` when none came.
    pub fn wait_notification(&self, timeout: Duration) -> Option<ReceivedNotification> {
        self.shared.inbox.wait(timeout)
    }

    /// Counters of the notification queue.
    pub fn notification_stats(&self) -> NotificationStats {
        self.shared.inbox.stats()
    }
}

/// Queues a notification received on a tcp or local session admitted as
/// `from` (the target side of those paths calls it).
pub(crate) fn deliver(
    inbox: &inbox::Inbox,
    from: &crate::session::PeerIdentity,
    path: PathKind,
    note: wire::Notification,
) {
    inbox.push(
        ReceivedNotification {
            source_id: from.source_id.as_str().to_owned(),
            epoch: from.epoch,
            path,
            payload: note.payload,
        },
        std::time::Instant::now(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{RangeId, RegistrationId};

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
