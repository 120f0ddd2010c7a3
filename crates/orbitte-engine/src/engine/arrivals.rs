//! The intake: the queue through which transports' events and the posts
//! that stopped early reach whoever holds the state lock next.

use crate::transport::{PostError, TransportEvent, WorkItem};

/// What the intake carries: transports' events, and the posts that
/// stopped early without the state lock.
#[derive(Debug)]
pub(crate) enum Arrival {
    /// A transport's event.
    Event(TransportEvent),
    /// Several events of one delivery, in order.
    Events(Vec<TransportEvent>),
    /// A post stopped early: `items` (the tail of the run) were not posted
    /// (`error.posted` is 0 for them).
    PostFailed {
        error: PostError,
        items: Vec<WorkItem>,
    },
}

/// The queue of events delivered while the state lock was busy, and of
/// posts that stopped early: an unbounded lock-free channel whose both
/// ends the engine holds. A delivery of several events is one arrival;
/// its emptied buffer comes back for the next delivery, so delivering
/// allocates nothing once the engine runs.
#[derive(Debug)]
pub(crate) struct Intake {
    tx: crossbeam_channel::Sender<Arrival>,
    rx: crossbeam_channel::Receiver<Arrival>,
    spare_tx: crossbeam_channel::Sender<Vec<TransportEvent>>,
    spare_rx: crossbeam_channel::Receiver<Vec<TransportEvent>>,
}

/// Emptied event buffers kept for reuse.
const SPARE_EVENT_BUFFERS: usize = 16;

impl Intake {
    pub(super) fn new() -> Self {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (spare_tx, spare_rx) = crossbeam_channel::bounded(SPARE_EVENT_BUFFERS);
        Self {
            tx,
            rx,
            spare_tx,
            spare_rx,
        }
    }

    pub(super) fn push(&self, ev: Arrival) {
        // Cannot fail: the receiver lives as long as the sender.
        let _ = self.tx.send(ev);
    }

    /// Queues the events of `events`, in order, as one arrival; leaves
    /// `events` empty (holding a reused buffer when one is spare).
    pub(super) fn push_events(&self, events: &mut Vec<TransportEvent>) {
        match events.len() {
            0 => {}
            1 => {
                if let Some(ev) = events.pop() {
                    self.push(Arrival::Event(ev));
                }
            }
            _ => {
                let spare = self.spare_rx.try_recv().unwrap_or_default();
                self.push(Arrival::Events(std::mem::replace(events, spare)));
            }
        }
    }

    /// Keeps an emptied buffer of [`Arrival::Events`] for a later delivery
    /// (a full pool drops it).
    pub(super) fn recycle(&self, mut events: Vec<TransportEvent>) {
        events.clear();
        let _ = self.spare_tx.try_send(events);
    }

    /// Another receiving end of the queue.
    pub(super) fn receiver(&self) -> crossbeam_channel::Receiver<Arrival> {
        self.rx.clone()
    }

    pub(super) fn pop(&self) -> Option<Arrival> {
        self.rx.try_recv().ok()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}
