//! The transport seam: how a path (rdma, tcp, local) executes slices and
//! reports what happened to them.
//!
//! The engine's sans-IO core (`core::Core`) cuts every request into
//! slices and hands them out as [`WorkItem`]s, each bound to one *rail*
//! (one queue pair for rdma, one connection for tcp, one mapping for local).
//! A [`Transport`] owns rails and executes their work items; it reports
//! back through the [`EventSink`] it was given when it was attached, or,
//! for items it executes while they are posted
//! ([`Transport::post_inline`]), in the events it hands back there. The core
//! never calls a transport and a transport never touches the core: the
//! engine's driver pumps both.
//!
//! # What a transport must report
//!
//! For every work item it accepted in [`Transport::post`]:
//!
//! 1. **Completion.** A [`TransportEvent::Completed`] with the item's
//!    [`SliceToken`] and a [`SliceStatus`]. A transport that honours
//!    [`WorkItem::signaled`] (rdma's selective signaling) may stay silent for
//!    unsignaled items: on a rail whose signal interval is above 1, a
//!    completion for token `T` means every item posted *before* `T` on the
//!    same rail finished successfully, unless the rail already reported an
//!    error (then the earlier ones count as flushed). After the first error
//!    on a rail, the transport reports every remaining item of that rail
//!    individually (verbs flush semantics). Transports without selective
//!    signaling set [`RailSpec::signal_interval`] to 1 and report every
//!    item, in any order (a tcp peer may answer requests out of order): a
//!    completion then finishes exactly the item it names.
//! 2. **Drain.** `Completed { released: true, .. }` says the transport will
//!    never again read or write the local bytes of that item (and of the
//!    items it implies). This is the rdma case: a CQE means the NIC is done
//!    with the buffer. A transport that learns the outcome before it lets go
//!    of the buffer (a tcp READ whose socket might still be written into
//!    the destination, say) reports `released: false` and later a
//!    [`TransportEvent::Released`] for the same token. Until then the request
//!    stays *undrained*: the engine keeps its memory alive and
//!    [`TransferEngine::wait_drain`](crate::TransferEngine::wait_drain) keeps
//!    waiting.
//! 3. **Rail loss.** [`TransportEvent::RailDown`] when the rail cannot take
//!    new work (port down, QP in error, socket closed). Items already posted
//!    must still be reported (flushed) or the engine keeps them undrained.
//!
//! A transport never retries a failed item on another rail: the engine's
//! contract is that a failed transfer is not replayed through another rail.
//!
//! Nothing here may panic on input from the network or the hardware; bad
//! tokens are ignored by the core with a trace event.

use std::fmt;
use std::sync::Arc;

use orbitte_memory::HostMemory;
use orbitte_wire::RangeDescriptor;

/// A path: one way bytes move between registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathKind {
    /// Host Direct: host memory registered on RDMA NICs, one-sided verbs.
    Rdma,
    /// One-sided READ/WRITE emulated over TCP sessions.
    Tcp,
    /// Same host, different process: shared memory.
    Local,
    /// GPU memory through pinned host bounce buffers.
    CudaStaging,
    /// Direct GPU registration on RDMA NICs (not implemented).
    GpudirectRdma,
    /// CUDA IPC between processes on one host (not implemented).
    CudaIpc,
    /// NVLink peer transfers (not implemented).
    Nvlink,
}

impl PathKind {
    /// Every path, in capability-matrix order.
    pub const ALL: [Self; 7] = [
        Self::Rdma,
        Self::Tcp,
        Self::Local,
        Self::CudaStaging,
        Self::GpudirectRdma,
        Self::CudaIpc,
        Self::Nvlink,
    ];

    /// The path's name as the docs and `orbitte doctor` write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rdma => "rdma",
            Self::Tcp => "tcp",
            Self::Local => "local",
            Self::CudaStaging => "cuda-staging",
            Self::GpudirectRdma => "gpudirect-rdma",
            Self::CudaIpc => "cuda-ipc",
            Self::Nvlink => "nvlink",
        }
    }
}

impl fmt::Display for PathKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One-sided operation of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Copy remote bytes into local memory.
    Read,
    /// Copy local bytes into remote memory.
    Write,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Read => "READ",
            Self::Write => "WRITE",
        })
    }
}

/// A rail: one lane (queue pair, connection, mapping) to one peer on one
/// path. Assigned by the engine; stable for the rail's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RailId(pub u32);

/// A local registration (a registered host range), engine-assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegistrationId(pub u64);

/// A peer (remote source owner) as opened in this engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

/// A range a peer published, identified by the id in its segment
/// descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RangeId(pub u64);

/// Opaque token naming one posted slice; rdma uses it as the `wr_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SliceToken(pub u64);

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
    DeviceCopy(orbitte_cuda::CopyError),
    /// cuda-staging: the lane's pipeline was unquiesced by an earlier copy
    /// that did not drain (that copy's error); the lane runs no more.
    PipelineUnquiesced(orbitte_cuda::CopyError),
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

/// Where a transport sends its events. The engine implements it; its
/// `deliver` may be called from any thread except from inside a
/// [`Transport`] method: those run holding the rail's post lock (and some
/// the engine's state lock), and `deliver` may drain the engine's event
/// queue, which posts and so takes rails' post locks (report from the
/// transport's own threads, or queue the events and deliver later).
pub trait EventSink: Send + Sync {
    /// Hands a batch of events to the engine.
    fn deliver(&self, events: &mut Vec<TransportEvent>);
}

/// Closes `rails` one by one with `close`, then tells `sink` at once that
/// they are down (`reason`), so the engine's next submit no longer picks
/// them; returns them. Rail threads that report again when they finish are
/// harmless (a second `RailDown` changes nothing). Never call this from
/// inside an engine callback (see [`EventSink`]).
pub(crate) fn close_rails_now(
    sink: &dyn EventSink,
    rails: Vec<RailId>,
    reason: &str,
    mut close: impl FnMut(RailId),
) -> Vec<RailId> {
    for r in &rails {
        close(*r);
    }
    let mut events: Vec<TransportEvent> = rails
        .iter()
        .map(|r| TransportEvent::RailDown {
            rail: *r,
            reason: reason.into(),
        })
        .collect();
    if !events.is_empty() {
        sink.deliver(&mut events);
    }
    rails
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

/// What the engine lends a transport while it posts: the memory behind a
/// registration (tcp and local copy bytes from it), its local keys (rdma)
/// and the peer's published range (address, length, access, token, rkeys).
pub trait PostContext {
    /// The host memory of a live local registration.
    fn memory(&self, registration: RegistrationId) -> Option<&Arc<HostMemory>>;
    /// Address and lkey of the registration's local-access MR on a NIC.
    fn local_key(&self, registration: RegistrationId, nic: u32) -> Option<(u64, u32)>;
    /// The peer's descriptor of a published range.
    fn remote_range(&self, peer: PeerId, range: RangeId) -> Option<&RangeDescriptor>;
}

/// A path's executor of work items.
///
/// The engine shares its transports between its threads. It posts without
/// its state lock, holding only the rail's own post lock: posts to one
/// rail never overlap and arrive in the order the core handed the items
/// out, posts to different rails may run at the same time on different
/// threads. [`flush`](Self::flush), [`flush_marked`](Self::flush_marked)
/// and [`close_rail`](Self::close_rail) run under the state lock and the
/// rail's post lock, after every post of items handed out before them.
/// `post` must not block on the network: queue the items and return.
pub trait Transport: Send + Sync + fmt::Debug {
    /// Which path this is.
    fn path(&self) -> PathKind;

    /// Posts `items`, all for `rail`, in order, as one batch (one doorbell
    /// for rdma). On error, `posted` items at the front were accepted and
    /// will be reported; the rest were not posted.
    fn post(
        &self,
        rail: RailId,
        items: &[WorkItem],
        ctx: &dyn PostContext,
    ) -> Result<(), PostError>;

    /// Posts like [`post`](Self::post), and may execute some of the items
    /// at once on the calling thread (the local path copies small batches
    /// this way: no hand-off to another thread, no wakeup). The events of
    /// what it executed (their completions, and a `RailDown` that
    /// executing found) go into `done`, which the caller hands to the core
    /// in the same pump instead of through the [`EventSink`]; it must do so
    /// also when this returns an error. Items not reported in `done` are
    /// reported later, as for `post`. The default executes nothing here.
    fn post_inline(
        &self,
        rail: RailId,
        items: &[WorkItem],
        ctx: &dyn PostContext,
        done: &mut Vec<TransportEvent>,
    ) -> Result<(), PostError> {
        let _ = done;
        self.post(rail, items, ctx)
    }

    /// Makes the rail report every outstanding item (rdma: move the QP to
    /// the error state so the NIC flushes it). Used after a timeout and at
    /// shutdown so that drain can finish. Idempotent.
    fn flush(&self, rail: RailId) -> Result<(), CleanupError>;

    /// Flushes the rail with a marker (see
    /// `Core::poll_flush`): a transport
    /// with selective signaling moves the rail to the error state first and
    /// then posts `marker` as a signaled item (so it is flushed after every
    /// earlier item and never executes at the peer), and reports it like
    /// any item.
    /// The default (transports that report every item) calls
    /// [`flush`](Self::flush) and drops the marker.
    fn flush_marked(&self, rail: RailId, marker: SliceToken) -> Result<MarkerFate, CleanupError> {
        let _ = marker;
        self.flush(rail).map(|()| MarkerFate::Dropped)
    }

    /// Releases the rail's resources. An error means they are still held
    /// (the engine then reports `Unquiesced`).
    fn close_rail(&self, rail: RailId) -> Result<(), CleanupError>;

    /// Sends an encoded `notification` frame to the rail's peer. The engine
    /// calls it only after every request of the notification's batch
    /// completed, so the frame follows every byte of the batch; the target
    /// must queue it only after it applied every byte it acknowledged
    /// before. Must not block on the network (queue it). The default: this
    /// path carries no notifications.
    fn notify(&self, rail: RailId, frame: &Arc<[u8]>) -> Result<(), NotifyError> {
        let _ = frame;
        Err(NotifyError {
            rail,
            reason: format!("the {} path carries no notifications", self.path()).into(),
        })
    }
}

/// What became of a flush marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerFate {
    /// Posted: its completion will be reported.
    Posted,
    /// Not posted: the transport reports every item itself.
    Dropped,
    /// Not posted, and the transport released everything outstanding on
    /// the rail (rdma: the queue pair was destroyed).
    Released,
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

/// A notification a rail did not take.
#[derive(Debug, Clone, thiserror::Error)]
#[error("rail {} did not take the notification: {reason}", rail.0)]
pub struct NotifyError {
    /// The rail.
    pub rail: RailId,
    /// Why.
    pub reason: Arc<str>,
}

/// A destroy/close that did not happen: the evidence the engine keeps for
/// `Unquiesced`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cleanup of {object} on {device} failed: {error}")]
pub struct CleanupError {
    /// The object (`MR lkey 0x12`, `QP 7`, `rail 3`).
    pub object: String,
    /// Device identity (name, NIC ID) or path.
    pub device: String,
    /// The native error.
    pub error: String,
}

// The paths.
pub mod local;
pub(crate) mod rdma;
pub mod tcp;
