//! The driver's side of notifications: tracking a notifying batch once
//! the core admitted it, and the engine's notification calls (the state's
//! pump sends the notifications `EngineState` asks for, `State::pump`). The
//! rules are in the `notify` module's docs.

use std::time::Duration;

use crate::engine::{State, TransferEngine};
use crate::notify::{
    Armed, Notification, NotificationError, NotificationStats, ReceivedNotification,
};
use crate::outcome::{RequestId, SubmitError};

/// Tracks the admitted batch `ids` carrying `armed` (the engine calls it
/// right after the core admitted the batch, before it pumps).
pub(crate) fn track(st: &mut State, ids: &[RequestId], armed: Armed) {
    st.engine.track_notification(ids, armed);
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
    /// [`MAX_NOTIFICATION_LEN`](crate::MAX_NOTIFICATION_LEN) or a batch to several peers is refused here.
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
