//! What a request ends with: the transfer contract as types.
//!
//! See `docs/contract.md` for the prose. In short: an [`Outcome`] says how
//! many leading bytes are known done (the *completed prefix*), what failed
//! and where, what a WRITE may have done to the remote bytes (the *remote
//! effect*) and whether the local buffer is still in use by the transport
//! (the *drain* status). Timeout and cancellation are logical: the outcome
//! of a timed-out request can say `drain: Pending`, and the buffer is not
//! the caller's again until [`DrainStatus::Drained`].

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use orbitte_wire::Epoch;

use crate::{Op, PathKind, PeerId, RailId, RangeId, RegistrationId};

/// Names one request of one engine.
///
/// Invariant: the low 32 bits are a slot index, the high 32 bits that
/// slot's generation, so a stale id never aliases a newer request. The
/// core's slots stay below 2^31; cuda-staging requests take their ids from
/// slots at 2^31 and above, so the two never alias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request {}:{}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Every byte arrived.
    Complete,
    /// A slice failed; see [`Outcome::failure`].
    Failed,
    /// The request timeout passed first (logical: DMA may still run).
    TimedOut,
    /// The caller cancelled it (logical: DMA may still run).
    Cancelled,
}

/// What a WRITE may have done to the peer's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteEffect {
    /// No remote byte changed: nothing was ever posted (also every READ).
    None,
    /// Some remote bytes may have changed: the completed prefix did, and
    /// bytes in `bytes` (request-relative) may have.
    Possible {
        /// Request-relative byte range beyond the completed prefix that may
        /// have been written.
        bytes: Range<u64>,
    },
    /// Every byte was written.
    Complete,
}

/// Whether the transports still use the request's local bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainStatus {
    /// Nothing outstanding: the local buffer is the caller's again.
    Drained,
    /// `slices` posted slices have not been reported back yet.
    Pending {
        /// Outstanding slices.
        slices: u32,
    },
}

/// Where and why a request failed.
///
/// For a cuda-staging request (local memory on a GPU) the failed step is
/// either a chunk's request over the peer's path (`rail`, `path`, `nic`
/// and `status` are that request's failure; `slice` counts within the
/// chunk's request) or a device copy (`rail` is `None`, `path` is
/// [`PathKind::CudaStaging`], `status` is
/// [`SliceFailure::DeviceCopy`] with the CUDA error); [`chunk`](Self::chunk)
/// says which chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureInfo {
    /// Index of the first failed slice (cuda-staging: within the chunk's
    /// request).
    pub slice: u32,
    /// Request-relative offset of that slice (or of the failed device
    /// copy's chunk).
    pub offset: u64,
    /// The rail it was bound to; `None` when the failed step ran on no
    /// rail (a device copy, a refused chunk).
    pub rail: Option<RailId>,
    /// That rail's path, or [`PathKind::CudaStaging`] for a step of the
    /// staging lane itself.
    pub path: PathKind,
    /// Local NIC ID of the rail (rdma).
    pub nic: Option<orbitte_topology::NicId>,
    /// What the transport (or the CUDA driver) said.
    pub status: SliceFailure,
    /// cuda-staging: the chunk that failed.
    pub chunk: Option<ChunkFailure>,
}

/// The chunk of a cuda-staging request where it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkFailure {
    /// Chunk index, from 0.
    pub index: u32,
    /// Request-relative offset of the chunk.
    pub offset: u64,
    /// The engine request that moved the chunk over the peer's path, when
    /// one was admitted.
    pub request: Option<RequestId>,
    /// How that request ended.
    pub status: Option<Status>,
    /// Whether what the chunk used drained (false: its bounce buffer, or
    /// for a copy the lane, is still held).
    pub drained: bool,
}

impl fmt::Display for FailureInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(c) = &self.chunk {
            write!(f, "chunk {} (offset {}), ", c.index, c.offset)?;
            if let Some(r) = c.request {
                write!(f, "{r}, ")?;
            }
            if !c.drained {
                f.write_str("not drained, ")?;
            }
        }
        write!(
            f,
            "slice {} (offset {}) on {}",
            self.slice, self.offset, self.path
        )?;
        if let Some(r) = self.rail {
            write!(f, " rail {}", r.0)?;
        }
        if let Some(n) = self.nic {
            write!(f, " (NIC ID {})", n.0)?;
        }
        write!(f, ": {}", self.status)
    }
}

/// The end of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The request.
    pub request: RequestId,
    /// Caller's label from the request.
    pub label: u64,
    /// READ or WRITE.
    pub op: Op,
    /// Requested bytes.
    pub len: u64,
    /// How it ended.
    pub status: Status,
    /// Leading bytes known done (for a READ: in local memory; for a WRITE:
    /// in remote memory).
    pub completed_prefix: u64,
    /// Leading slices known done.
    pub completed_slices: u32,
    /// Slices the request was cut into.
    pub slices: u32,
    /// The first failure, when a slice failed (boxed: rare, and it would
    /// more than double the size of every outcome the hot path moves).
    pub failure: Option<Box<FailureInfo>>,
    /// Request-relative bytes of the *destination* beyond the completed
    /// prefix that may have changed (remote for WRITE, local for READ).
    pub uncertain: Range<u64>,
    /// What a WRITE may have done remotely.
    pub remote_effect: RemoteEffect,
    /// Drain status when the outcome was made (query the engine for later).
    pub drain: DrainStatus,
    /// Whether the request's batch sent its notification (the same on
    /// every outcome of the batch).
    pub notification: NotificationStatus,
}

impl Outcome {
    /// Whether every byte arrived.
    pub fn is_complete(&self) -> bool {
        self.status == Status::Complete
    }
}

/// Why a request was refused at submit time. Nothing of the batch was
/// posted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The peer is not open (or was replaced by a newer epoch).
    #[error("unknown peer {}: open the peer first (or reopen it after a restart)", .0.0)]
    UnknownPeer(PeerId),
    /// The request was made from a handle of an older incarnation of the
    /// peer: the peer restarted (same address, a new epoch) since the
    /// handle was made, and its memory is not the memory the handle named.
    #[error(
        "peer {} restarted: the request was made for its epoch {}, it now runs epoch {}; \
         connect again and build requests from the new handle's ranges",
        .peer.0, .handle.value(), .current.value()
    )]
    PeerRestarted {
        /// Peer.
        peer: PeerId,
        /// The epoch of the handle the request was made from.
        handle: Epoch,
        /// The epoch of the incarnation open now.
        current: Epoch,
    },
    /// The local registration is not published (never was, retired, or
    /// unregistered).
    #[error("local registration {} is not published: register it (or stop using a retired range)", .0.0)]
    UnpublishedLocal(RegistrationId),
    /// The peer never published this range, or retired it.
    #[error("remote range {} of peer {} is not published: refresh the peer's descriptors", .range.0, .peer.0)]
    UnpublishedRemote {
        /// Peer.
        peer: PeerId,
        /// Range id.
        range: RangeId,
    },
    /// No range the peer published contains the address.
    #[error("address {address:#x} is in no range peer {} published", .peer.0)]
    UnknownAddress {
        /// Peer.
        peer: PeerId,
        /// The address asked for.
        address: u64,
    },
    /// No range the peer publishes now contains the address, and the peer
    /// restarted since it was first opened: the address is likely one of
    /// the previous incarnation's.
    #[error(
        "address {address:#x} is in no range peer {} publishes: it restarted (epoch {} then {}) and \
         its ranges are new; look the address up again in the new incarnation's ranges",
        .peer.0, .previous.value(), .current.value()
    )]
    AddressAfterRestart {
        /// Peer.
        peer: PeerId,
        /// The address asked for.
        address: u64,
        /// The epoch of the incarnation it replaced.
        previous: Epoch,
        /// The epoch open now.
        current: Epoch,
    },
    /// The request starts in one published range and runs into the next.
    #[error("{len} bytes at address {address:#x} cross from one range of peer {} into the next at {boundary:#x}: split the request", .peer.0)]
    CrossesRanges {
        /// Peer.
        peer: PeerId,
        /// The address asked for.
        address: u64,
        /// Bytes asked for.
        len: u64,
        /// Where the first range ends and the next begins.
        boundary: u64,
    },
    /// The request runs past the end of the range holding its address.
    #[error("{len} bytes at address {address:#x} run past the end ({end:#x}) of the range of peer {} holding it", .peer.0)]
    PastEnd {
        /// Peer.
        peer: PeerId,
        /// The address asked for.
        address: u64,
        /// Bytes asked for.
        len: u64,
        /// Where the range ends.
        end: u64,
    },
    /// `offset + len` goes past the end of a range.
    #[error("{side} range: offset {offset} + {len} bytes is past its end ({size} bytes)")]
    OutOfRange {
        /// `local` or `remote`.
        side: &'static str,
        /// Offset asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// Range size.
        size: u64,
    },
    /// The range does not allow the operation.
    #[error("{side} range does not allow {op}: register/publish it with that access")]
    WrongAccess {
        /// `local` or `remote`.
        side: &'static str,
        /// The operation.
        op: Op,
    },
    /// Zero bytes asked for.
    #[error("zero-length request: ask for at least one byte")]
    ZeroLength,
    /// `offset + len` overflows u64, or the request has more slices than
    /// u32 can count.
    #[error("request length overflows (offset {offset} + {len}): split it")]
    Overflow {
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
    },
    /// No rail to the peer is up and allowed by the dispatch mask.
    #[error("no usable rail to peer {}: {}", .peer.0, RailRefusal::list(.why))]
    NoRail {
        /// Peer.
        peer: PeerId,
        /// Why each rail was refused (the peer's rails in order).
        why: Vec<RailRefusal>,
    },
    /// Every cuda-staging lane of the GPU holding the local memory is
    /// unquiesced (a device copy did not drain; its buffers are retained
    /// for good).
    #[error(
        "every cuda-staging lane of CUDA device {device} is fenced ({reasons}); register the \
         memory on another device or restart the engine"
    )]
    StagingFenced {
        /// The CUDA device.
        device: usize,
        /// Why, per lane.
        reasons: Arc<str>,
    },
}

/// Why one rail to a peer cannot carry a request
/// ([`RequestError::NoRail`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RailRefusal {
    /// The peer has no rails at all.
    NoRails,
    /// The rail's NIC is outside the dispatch mask.
    OutsideMask {
        /// The rail.
        rail: RailId,
        /// Its local NIC ID.
        nic: orbitte_topology::NicId,
        /// The engine's dispatch mask.
        mask: orbitte_topology::DeviceMask,
    },
    /// The rail is down.
    Down {
        /// The rail.
        rail: RailId,
        /// Why (what the transport or the port said).
        reason: Arc<str>,
    },
    /// The rail (rdma) has no keys for this local/remote range pair: the
    /// local range has no MR on its NIC, or the remote range no rkey on
    /// the remote NIC.
    NoKeys {
        /// The rail.
        rail: RailId,
    },
    /// The rail is rdma and the remote range has no rkey on any of the
    /// owner's NICs: the owner serves it over tcp only (GPU memory staged
    /// through host memory, or host memory registered without rdma).
    TcpOnly {
        /// The rail.
        rail: RailId,
        /// The remote range.
        range: RangeId,
    },
    /// The engine knows no such rail.
    Unknown {
        /// The rail.
        rail: RailId,
    },
}

impl RailRefusal {
    /// The refusals as one line, `; ` between them.
    fn list(refusals: &[Self]) -> String {
        refusals
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl fmt::Display for RailRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoRails => f.write_str("the peer has no rails"),
            Self::OutsideMask { rail, nic, mask } => write!(
                f,
                "rail {} (NIC ID {}) outside the dispatch mask {mask}",
                rail.0, nic.0
            ),
            Self::Down { rail, reason } => write!(f, "rail {} down: {reason}", rail.0),
            Self::NoKeys { rail } => {
                write!(f, "rail {} has no keys for this range pair", rail.0)
            }
            Self::TcpOnly { rail, range } => write!(
                f,
                "rail {} is rdma but remote range {} is served over tcp only (the owner \
                 registered it with no NIC: GPU memory staged through host memory, or host \
                 memory without rdma); connect to the peer over tcp",
                rail.0, range.0
            ),
            Self::Unknown { rail } => write!(f, "unknown rail {}", rail.0),
        }
    }
}

/// A refused batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// Request `index` of the batch (labelled `label`) is invalid.
    #[error("request #{index} (label {label}) refused: {error}; nothing of the batch was posted")]
    Invalid {
        /// Position in the batch.
        index: usize,
        /// The request's label.
        label: u64,
        /// Why.
        #[source]
        error: RequestError,
    },
    /// The engine is fenced: it admits nothing new.
    #[error("engine is fenced, request #{index} (label {label}) refused: {reason}")]
    Fenced {
        /// Position in the batch (the first one).
        index: usize,
        /// Label of that request.
        label: u64,
        /// Why the engine is fenced.
        reason: Arc<str>,
    },
    /// An empty batch.
    #[error("empty batch: submit at least one request")]
    Empty,
    /// The batch's notification cannot be carried.
    #[error(transparent)]
    Notification(#[from] NotificationError),
}

impl SubmitError {
    /// Whether the refusal says the peer, or its session, is gone (unknown,
    /// restarted, or without a rail): the caller's remote is lost, not its
    /// request wrong.
    pub fn peer_gone(&self) -> bool {
        matches!(
            self,
            Self::Invalid {
                error: RequestError::UnknownPeer(_)
                    | RequestError::PeerRestarted { .. }
                    | RequestError::NoRail { .. },
                ..
            }
        )
    }
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
    Refused(Box<SubmitError>),
    /// cuda-staging: a chunk's request ended with this status and no slice
    /// failure (its request timeout passed, or it was cancelled).
    Ended(Status),
    /// cuda-staging: a chunk could not be handled and whether it was posted
    /// is unknown (its bytes count as uncertain).
    Internal(Arc<str>),
}

impl SliceFailure {
    /// Whether the slice failed because its connection to the peer was
    /// lost: its rail went down, was flushed, or was found down when the
    /// slice was posted.
    pub fn connection_lost(&self) -> bool {
        matches!(
            self,
            Self::RailDown(_) | Self::Flushed | Self::PostFailed(_)
        )
    }
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

/// Whether a request's batch sent a notification, and whether the target
/// took it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NotificationStatus {
    /// The batch carried none.
    #[default]
    NotRequested,
    /// Every request of the batch completed and the target answered that
    /// it queued the notification: its application reads it once.
    Sent,
    /// Not sent, and it never will be: a request of the batch did not
    /// complete, or no rail to the peer took it.
    NotSent {
        /// Why.
        why: Arc<str>,
    },
    /// Sent, and the target refused it: it holds as many notifications (or
    /// bytes of them) from this engine as it keeps, because its application
    /// does not read them. Nothing was queued. The target's application
    /// must drain its notifications; then send again.
    Refused {
        /// The bound the target named, and the fix.
        why: Arc<str>,
    },
    /// Sent, and the rail went down before the target answered: it may or
    /// may not have been queued.
    Unconfirmed {
        /// Why the answer did not come.
        why: Arc<str>,
    },
}

impl NotificationStatus {
    /// Whether the target queued the notification (`Sent`).
    pub fn is_sent(&self) -> bool {
        matches!(self, Self::Sent)
    }
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
        /// [`MAX_NOTIFICATION_LEN`](orbitte_wire::MAX_NOTIFICATION_LEN).
        max: usize,
    },
    /// The notification is larger than the peer's path carries (the rdma
    /// path posts its receives in advance, in fixed slots).
    #[error(
        "notification of {len} bytes is larger than the {max} bytes the {path} path carries: \
         connect to this peer over tcp or local for larger ones, or put the bulk in registered \
         memory and notify its place"
    )]
    TooLargeForPath {
        /// Its length.
        len: usize,
        /// The path's limit.
        max: usize,
        /// The path of every rail to the peer.
        path: PathKind,
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

#[cfg(test)]
mod loss_tests {
    use super::*;

    #[test]
    fn a_lost_connection_and_a_gone_peer_are_told_apart_from_other_failures() {
        for f in [
            SliceFailure::RailDown("reset".into()),
            SliceFailure::Flushed,
            SliceFailure::PostFailed("rail down".into()),
        ] {
            assert!(f.connection_lost(), "{f:?}");
        }
        let completion = SliceFailure::Completion {
            status: "peer error frame".into(),
            code: 3,
        };
        assert!(!completion.connection_lost());
        assert!(!SliceFailure::Internal("bug".into()).connection_lost());

        let gone = SubmitError::Invalid {
            index: 0,
            label: 0,
            error: RequestError::UnknownPeer(PeerId(1)),
        };
        assert!(gone.peer_gone());
        assert!(!SubmitError::Empty.peer_gone());
    }
}
