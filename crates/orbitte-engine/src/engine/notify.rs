//! The driver's side of notifications: tracking a notifying batch once
//! the core admitted it, and the engine's notification calls (the state's
//! pump sends the notifications `EngineState` asks for, `State::pump`). The
//! rules are in the `notify` module's docs.

use std::time::Duration;

use crate::engine::{State, TransferEngine};
use crate::notify::{Armed, NotificationStats, ReceivedNotification};
use crate::outcome::RequestId;

/// Tracks the admitted batch `ids` carrying `armed` (the engine calls it
/// right after the core admitted the batch, before it pumps).
pub(crate) fn track(st: &mut State, ids: &[RequestId], armed: Armed) {
    st.engine.track_notification(ids, armed);
}

impl TransferEngine {
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
