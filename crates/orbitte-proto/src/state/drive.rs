//! What the driver calls on [`EngineState`] between its I/O: the core's
//! pump (work out, events and time in, flushes), and the read views of
//! the tables, the ledger and the outcomes. The fields stay private, so
//! every call across the line is one of these methods.

use std::time::Instant;

use super::{EngineState, Tables};
use crate::core::{Core, CoreRequest};
use crate::outcome::{Outcome, RequestId};
use crate::registration::{Charges, Resources};
use crate::{PostError, RailId, SliceToken, TransportEvent, WorkItem};

impl<R: Resources> EngineState<R> {
    /// The core, for its queries (rail state, drain status, pending
    /// requests, the fence).
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// The registration and peer tables, read-only (what transports read
    /// while they post).
    pub fn tables(&self) -> &Tables<R> {
        &self.tables
    }

    /// Whether a table was changed since the last call (the driver then
    /// copies what posting and serving need).
    pub fn take_tables_changed(&mut self) -> bool {
        self.tables.take_changed()
    }

    /// What is charged against the budgets now.
    pub fn in_use(&self) -> Charges {
        self.ledger.in_use
    }

    /// Every cleanup that failed so far (each fenced admission).
    pub fn unquiesced(&self) -> &[R::Unquiesced] {
        &self.unquiesced
    }

    /// Puts admitted requests into the core at `now`; their ids go to
    /// `ids`.
    pub fn insert(
        &mut self,
        now: Instant,
        batch: impl IntoIterator<Item = CoreRequest>,
        ids: &mut Vec<RequestId>,
    ) {
        self.core.insert(now, batch, ids);
    }

    /// Work items ready to post, each rail's run together, into `out`.
    pub fn poll_work(&mut self, out: &mut Vec<WorkItem>) {
        self.core.poll_work(out);
    }

    /// A transport's event.
    pub fn handle_event(&mut self, now: Instant, event: TransportEvent) {
        match event {
            TransportEvent::NotificationAnswered { rail, answer } => {
                self.notification_answered(rail, answer);
            }
            TransportEvent::RailDown { rail, reason } => {
                self.core.handle_event(
                    now,
                    TransportEvent::RailDown {
                        rail,
                        reason: reason.clone(),
                    },
                );
                self.unanswered_on(rail, &reason);
            }
            event => self.core.handle_event(now, event),
        }
    }

    /// A post that stopped early: `items` is the run handed to it.
    pub fn handle_post_error(&mut self, now: Instant, error: &PostError, items: &[WorkItem]) {
        self.core.handle_post_error(now, error, items);
    }

    /// When the core next needs [`handle_timeout`](Self::handle_timeout).
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.core.poll_timeout()
    }

    /// Deadlines due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.core.handle_timeout(now);
    }

    /// Cancels a request; whether it was still running.
    pub fn cancel(&mut self, now: Instant, id: RequestId) -> bool {
        self.core.cancel(now, id)
    }

    /// The next rail to flush with its marker token (see `Core::poll_flush`).
    pub fn poll_flush(&mut self, now: Instant) -> Option<(RailId, SliceToken)> {
        self.core.poll_flush(now)
    }

    /// The transport did not post a flush marker: it reports every item
    /// itself.
    pub fn marker_dropped(&mut self, rail: RailId, marker: SliceToken) {
        self.core.marker_dropped(rail, marker);
    }

    /// The transport released everything outstanding on `rail`.
    pub fn release_rail(&mut self, now: Instant, rail: RailId) {
        self.core.release_rail(now, rail);
    }

    /// A recovered rail takes work again; whether it could.
    pub fn restore_rail(&mut self, rail: RailId) -> bool {
        self.core.restore_rail(rail)
    }

    /// Takes the outcome of `id` if it is made and not held.
    pub fn take_outcome(&mut self, id: &RequestId) -> Option<Outcome> {
        self.outcomes.remove(id)
    }

    /// The outcome of `id` if it is made and not taken (left in place).
    pub fn outcome(&self, id: &RequestId) -> Option<&Outcome> {
        self.outcomes.get(id)
    }

    /// Whether the outcome of `id` is made and not taken.
    pub fn has_outcome(&self, id: &RequestId) -> bool {
        self.outcomes.contains_key(id)
    }

    /// Puts an outcome made outside the core (a cuda-staging request's)
    /// among those not taken yet.
    pub fn insert_outcome(&mut self, id: RequestId, outcome: Outcome) {
        self.outcomes.insert(id, outcome);
    }

    /// Moves the ids of outcomes that arrived since the last call into
    /// `into` (the driver wakes their waiters).
    pub fn take_arrived(&mut self, into: &mut Vec<RequestId>) {
        self.outcomes.take_arrived(into);
    }

    /// Whether `id`'s outcome is held because its batch's notification is
    /// not decided yet.
    pub fn holds_notification(&self, id: RequestId) -> bool {
        self.notifications.holds(id)
    }
}
