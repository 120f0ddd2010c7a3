//! What the core hands a transport and what a transport reports back:
//! work items bound to rails, rail events, rail specs.
//!
//! What each event promises (completion, drain, rail loss) is the
//! transport seam's contract; the engine's `transport` module states it.

use std::sync::Arc;

use crate::ids::{Op, PathKind, PeerId, RailId, RangeId, RegistrationId, SliceToken};
use crate::outcome::SliceStatus;

/// One slice of one request, bound to one rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkItem {
    /// Passed back in the completion.
    pub token: SliceToken,
    /// The rail that must execute it (never another one).
    pub rail: RailId,
    /// READ or WRITE.
    pub op: Op,
    /// The local registration.
    pub registration: RegistrationId,
    /// Byte offset inside the local registration.
    pub local_offset: u64,
    /// The peer the rail leads to.
    pub peer: PeerId,
    /// The peer's published range.
    pub range: RangeId,
    /// Byte offset inside the remote range.
    pub remote_offset: u64,
    /// Bytes (at most the engine's slice size).
    pub len: u32,
    /// Whether the transport must report this item's completion (see the
    /// module docs for what an unsignaled item implies).
    pub signaled: bool,
}

/// What a transport reports about its work items and rails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportEvent {
    /// A work item finished (see the module docs for implied items).
    Completed {
        /// Rail the item was posted on.
        rail: RailId,
        /// Token of the item.
        token: SliceToken,
        /// How it finished.
        status: SliceStatus,
        /// Whether the transport has let go of the local bytes.
        released: bool,
    },
    /// The transport let go of the local bytes of an item it completed
    /// earlier with `released: false`.
    Released {
        /// Rail the item was posted on.
        rail: RailId,
        /// Token of the item.
        token: SliceToken,
    },
    /// The rail takes no new work.
    RailDown {
        /// The rail.
        rail: RailId,
        /// Why, for the failure information of requests that needed it.
        reason: Arc<str>,
    },
    /// The rail takes work again (a paused port recovered).
    RailUp {
        /// The rail.
        rail: RailId,
    },
    /// The peer answered a notification sent on the rail: queued or
    /// refused.
    NotificationAnswered {
        /// The rail the answer came on.
        rail: RailId,
        /// The answer.
        answer: orbitte_wire::NotificationAnswer,
    },
}

/// How the engine should treat one rail.
#[derive(Debug, Clone)]
pub struct RailSpec {
    /// The path.
    pub path: PathKind,
    /// The peer at the other end.
    pub peer: PeerId,
    /// Local NIC ID for rdma rails (dispatch mask bit), `None` otherwise.
    pub nic: Option<u32>,
    /// Remote NIC index for rdma rails.
    pub remote_nic: Option<u32>,
    /// Most work items outstanding on the rail (send queue depth).
    pub max_in_flight: u32,
    /// Signal at least every `signal_interval` items (1 = every item).
    pub signal_interval: u32,
}

/// A partial or failed post.
#[derive(Debug, Clone, thiserror::Error)]
#[error("posting to rail {rail:?} stopped after {posted} work items: {reason}")]
pub struct PostError {
    /// The rail.
    pub rail: RailId,
    /// Items accepted before the failure.
    pub posted: usize,
    /// What the transport said.
    pub reason: Arc<str>,
}
