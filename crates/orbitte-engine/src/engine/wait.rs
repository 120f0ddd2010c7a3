//! Outcomes and drain: poll, wait, cancel, wait_drain.

use std::time::{Duration, Instant};

use super::TransferEngine;
use crate::error::{DrainTimeout, WaitError};
use crate::outcome::{DrainStatus, Outcome, RequestId};

impl TransferEngine {
    /// The outcome, if the request has one (taken: a second call says
    /// `None`).
    pub fn poll(&self, id: RequestId) -> Option<Outcome> {
        self.lock().outcomes.remove(&id)
    }

    /// Waits for the outcome. Every request gets one by its request
    /// timeout, so a `timeout` longer than that always returns it.
    pub fn wait(&self, id: RequestId, timeout: Duration) -> Result<Outcome, WaitError> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if let Some(o) = st.outcomes.remove(&id) {
                return Ok(o);
            }
            let now = Instant::now();
            st.core.handle_timeout(now);
            st.pump(now);
            self.shared.wake_if_completed_inline(&mut st);
            if let Some(o) = st.outcomes.remove(&id) {
                return Ok(o);
            }
            if !st.core.is_pending(id) && !st.notify.holds(id) && !st.staged.is_pending(id) {
                return Err(WaitError::Unknown(id));
            }
            if now >= deadline {
                return Err(WaitError::TimedOut(id));
            }
            let step = (deadline - now).min(Duration::from_millis(20));
            st = self
                .shared
                .cond
                .wait_timeout(st, step)
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
    }

    /// Waits for every request of a batch (in order).
    pub fn wait_all(
        &self,
        ids: &[RequestId],
        timeout: Duration,
    ) -> Result<Vec<Outcome>, WaitError> {
        let deadline = Instant::now() + timeout;
        ids.iter()
            .map(|id| self.wait(*id, deadline.saturating_duration_since(Instant::now())))
            .collect()
    }

    /// Logical cancellation: the outcome (status `Cancelled`) is made now;
    /// posted slices may still move bytes until the request drains.
    /// Returns false if the request already had its outcome.
    pub fn cancel(&self, id: RequestId) -> bool {
        if let Some(done) = self.cancel_staged(id) {
            return done;
        }
        let mut st = self.lock();
        let now = Instant::now();
        let done = st.core.cancel(now, id);
        st.pump(now);
        drop(st);
        self.shared.cond.notify_all();
        done
    }

    /// Whether the transports still hold the request's local bytes.
    pub fn drain_status(&self, id: RequestId) -> DrainStatus {
        let mut st = self.lock();
        crate::staging::drain_status(&mut st, id).unwrap_or_else(|| st.core.drain_status(id))
    }

    /// Waits until the request is drained (its local buffer is the
    /// caller's again). Past the engine's drain timeout the rails holding
    /// its slices are flushed, which ends the wait on a working device.
    pub fn wait_drain(&self, id: RequestId, timeout: Duration) -> Result<(), DrainTimeout> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            let now = Instant::now();
            st.core.handle_timeout(now);
            st.pump(now);
            self.shared.wake_if_completed_inline(&mut st);
            let status = crate::staging::drain_status(&mut st, id)
                .unwrap_or_else(|| st.core.drain_status(id));
            match status {
                DrainStatus::Drained => return Ok(()),
                DrainStatus::Pending { slices } if now >= deadline => {
                    return Err(DrainTimeout {
                        request: id,
                        slices,
                    });
                }
                DrainStatus::Pending { .. } => {}
            }
            let step = (deadline - now).min(Duration::from_millis(20));
            st = self
                .shared
                .cond
                .wait_timeout(st, step)
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
    }
}
