//! Notifications: opaque bytes (at most [`MAX_NOTIFICATION_LEN`], 1 MiB;
//! 4 KiB on the rdma path, [`RDMA_MAX_NOTIFICATION_LEN`]) a batch carries
//! to its peer, delivered once, after every byte of the batch, and
//! answered.
//!
//! Initiator side: [`TransferEngine::submit_with_notification`](crate::TransferEngine::submit_with_notification) admits the
//! batch like [`TransferEngine::submit`](crate::TransferEngine::submit) and tracks it (`orbitte_proto::notification::tracker`). The
//! outcomes of its requests are held until the last one is made; then, on
//! the engine's own threads (whichever pumps the core: a poller, a
//! transport's reporting thread, the timer), the notification goes to the
//! peer if every request completed, and the outcomes wait for the target's
//! answer (`notification-answer`). Every outcome of the batch is then
//! released with the same [`NotificationStatus`]: `Sent` (queued),
//! `Refused` (the target holds as much from this engine as it keeps; its
//! application must read its notifications), or `Unconfirmed` (the rail
//! went down before the answer). The caller never has to poll for it to go
//! out. A batch with a request that failed, timed out or was cancelled
//! sends nothing (`NotSent`).
//!
//! It goes on one of the rails the batch used, after the bytes they placed:
//! rdma as a SEND on the rail's RC queue pair (`transport::rdma::notify`), tcp as a
//! `notification` frame on a session whose WRITEs the target answered only
//! after applying them, local as a `notification` frame on the mapping
//! session after the copies into the shared mapping finished. The answer
//! comes back the same way.
//!
//! Target side: received notifications wait in a queue bounded per sender
//! in count and bytes, and in bytes for all senders (module `inbox`,
//! [`InboxLimits`]; past a bound the sender is answered "refused"), read
//! with
//! [`TransferEngine::notifications`](crate::TransferEngine::notifications) and
//! [`TransferEngine::wait_notification`](crate::TransferEngine::wait_notification), each tagged with the source id
//! and epoch the session or queue pair was admitted with.

pub(crate) mod inbox;

use orbitte_wire as wire;

use crate::transport::PathKind;

pub use inbox::{
    ENTRY_COST, INBOX_BYTES_PER_PEER, INBOX_BYTES_TOTAL, INBOX_CAPACITY, InboxLimits,
    NotificationStats, ReceivedNotification,
};
pub(crate) use orbitte_proto::notification::Armed;
pub use orbitte_proto::notification::{Notification, NotificationError, NotificationStatus};
pub use orbitte_wire::MAX_NOTIFICATION_LEN;

/// The largest notification the rdma path carries: 4 KiB. Its receives
/// are posted in advance in fixed slots, each one frame of this payload;
/// a larger notification is refused on an rdma rail (its batch's outcomes
/// say `NotSent`, naming this limit) and goes on a tcp or local rail of
/// the same peer when the batch has one.
pub const RDMA_MAX_NOTIFICATION_LEN: usize = 4096;

/// Queues a notification received on a tcp or local session admitted as
/// `from` (the target side of those paths calls it); returns the answer
/// for its sender.
pub(crate) fn deliver(
    inbox: &inbox::Inbox,
    from: &crate::session::PeerIdentity,
    path: PathKind,
    note: wire::Notification,
) -> wire::NotificationAnswer {
    let notification_id = note.notification_id;
    let (verdict, limit) = inbox.push(
        ReceivedNotification {
            source_id: from.source_id.as_str().to_owned(),
            epoch: from.epoch,
            path,
            payload: note.payload,
        },
        std::time::Instant::now(),
    );
    wire::NotificationAnswer {
        notification_id,
        verdict,
        limit,
    }
}
