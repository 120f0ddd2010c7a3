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

pub use orbitte_proto::{
    DeviceError, Op, PathKind, PeerId, PostError, RailId, RailSpec, RangeId, RegistrationId,
    SliceFailure, SliceStatus, SliceToken, TransportEvent, WorkItem,
};

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
    /// before, and answer it (`notification-answer`: queued or refused),
    /// which the transport reports as
    /// [`TransportEvent::NotificationAnswered`] on this rail; a rail that
    /// cannot deliver the answer goes down. Must not block on the network
    /// (queue it). The default: this path carries no notifications.
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

/// A handle for a transport attached with
/// `TransferEngine::attach_transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct TransportId(pub(crate) usize);

// The paths.
pub mod local;
pub(crate) mod rdma;
pub mod tcp;
