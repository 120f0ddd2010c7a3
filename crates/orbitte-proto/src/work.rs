//! What the core hands a transport and what a transport reports back:
//! work items bound to rails, slice statuses, rail events, rail specs.
//!
//! What each event promises (completion, drain, rail loss) is the
//! transport seam's contract; the engine's `transport` module states it.

use std::fmt;
use std::sync::Arc;

use crate::ids::{Op, PathKind, PeerId, RailId, RangeId, RegistrationId, SliceToken};

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

/// Whether a slice finished, and how it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceStatus {
    /// The slice's bytes arrived where they were going.
    Success,
    /// The slice failed; what is known about it.
    Failed(SliceFailure),
}

/// Why one slice failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceFailure {
    /// The transport completed the item with an error status (for rdma the
    /// work completion status; `code` is its numeric value).
    Completion {
        /// Status name (`IBV_WC_REM_ACCESS_ERR`, `peer error frame`, ...).
        status: Arc<str>,
        /// Numeric status or vendor code.
        code: u32,
    },
    /// Not executed because the rail failed earlier (verbs flush).
    Flushed,
    /// The transport refused to post it.
    PostFailed(Arc<str>),
    /// The rail went down before the slice could be posted.
    RailDown(Arc<str>),
    /// cuda-staging: a device copy between GPU memory and a bounce buffer
    /// failed, or could not be waited for (the CUDA error).
    DeviceCopy(DeviceError),
    /// cuda-staging: the lane's pipeline was unquiesced by an earlier copy
    /// that did not drain (that copy's error); the lane runs no more.
    PipelineUnquiesced(DeviceError),
    /// cuda-staging: the engine refused a chunk's request; nothing of that
    /// chunk was posted.
    Refused(Box<crate::outcome::SubmitError>),
    /// cuda-staging: a chunk's request ended with this status and no slice
    /// failure (its request timeout passed, or it was cancelled).
    Ended(crate::outcome::Status),
    /// cuda-staging: a chunk could not be handled and whether it was posted
    /// is unknown (its bytes count as uncertain).
    Internal(Arc<str>),
}

impl fmt::Display for SliceFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Completion { status, code } => write!(f, "completion error {status} ({code})"),
            Self::Flushed => f.write_str("flushed after an earlier error on the rail"),
            Self::PostFailed(e) => write!(f, "post failed: {e}"),
            Self::RailDown(e) => write!(f, "rail down: {e}"),
            Self::DeviceCopy(e) => write!(f, "device copy failed: {e}"),
            Self::PipelineUnquiesced(e) => write!(f, "staging pipeline unquiesced: {e}"),
            Self::Refused(e) => write!(f, "chunk request refused: {e}"),
            Self::Ended(s) => write!(f, "chunk request ended {s:?}"),
            Self::Internal(e) => f.write_str(e),
        }
    }
}

/// A device's error carried by a slice failure (cuda-staging: the CUDA
/// copy error), kept whole: [`downcast_ref`](Self::downcast_ref) reaches
/// the typed error, and its `source` chain is the error's own.
#[derive(Clone)]
pub struct DeviceError(Arc<dyn std::error::Error + Send + Sync>);

impl DeviceError {
    /// Carries `error`.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(error))
    }

    /// The error carried, if it is an `E`.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl std::error::Error for DeviceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Two reports of a device error are equal when they are the same error
/// or say the same.
impl PartialEq for DeviceError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for DeviceError {}

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
