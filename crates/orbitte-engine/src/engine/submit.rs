//! Admission of a batch: validation, rail choice, submission to the core.

use std::time::Instant;

use super::wait::OwnCq;
use super::{TransferEngine, TransferRequest};
use crate::outcome::{RequestId, SubmitError};

impl TransferEngine {
    /// Submits a batch of READ/WRITE requests ([`Request`](crate::Request),
    /// or the positional [`TransferRequest`]): all admitted or none (a typed
    /// error names the first bad request; nothing is posted then). Remote
    /// addresses are resolved against the peers' publications now. Returns
    /// at once; every request ends with an [`Outcome`](crate::Outcome) ([`poll`](Self::poll),
    /// [`wait`](Self::wait)).
    pub fn submit<R: Into<crate::Request> + Copy>(
        &self,
        batch: &[R],
    ) -> Result<Vec<RequestId>, SubmitError> {
        let resolved = self.resolve(batch)?;
        if self.first_staged(&resolved).is_some() {
            return self.submit_with_staged(&resolved);
        }
        self.submit_inner(&resolved, None)
    }

    /// Admits a batch whose remote addresses are resolved
    /// ([`submit`](Self::submit)), tracking its notification if it carries
    /// one.
    pub(crate) fn submit_inner(
        &self,
        batch: &[TransferRequest],
        notification: Option<crate::notify::Armed>,
    ) -> Result<Vec<RequestId>, SubmitError> {
        let span = tracing::trace_span!("submit", requests = batch.len());
        let _g = span.enter();
        let mut guard = self.lock();
        let st = &mut *guard;
        let now = Instant::now();
        let mut admission = st
            .engine
            .validate(batch, self.shared.settings.dispatch_mask)?;
        let mut ids = Vec::with_capacity(batch.len());
        if let Some(armed) = notification {
            let reqs: Vec<_> = admission.collect();
            let armed = armed.on_rails(&reqs);
            st.engine.insert(now, reqs, &mut ids);
            st.record_starts(&self.shared.metrics, now, batch, &ids);
            super::notify::track(st, &ids, armed);
            st.pump(now);
            return Ok(ids);
        }
        if admission.len() > PIECE + PIECE / 2 {
            // The whole batch is validated: its requests are built, taken
            // in and posted a piece at a time, so the transports start at
            // once and work while the rest is taken in. Between pieces
            // this thread takes the completions of the earlier ones from
            // the first request's queue (as `wait` does), rather than
            // waking the poller thread for them.
            let mut own = None;
            let mut events = Vec::new();
            while admission.len() > PIECE + PIECE / 2 {
                let st = &mut *guard;
                let from = ids.len();
                st.engine
                    .insert(now, admission.by_ref().take(PIECE), &mut ids);
                st.record_starts(&self.shared.metrics, now, &batch[from..], &ids[from..]);
                if own.is_none()
                    && let Some(&first) = ids.first()
                {
                    own = Some(OwnCq::of(st, first));
                }
                st.pump(now);
                drop(guard);
                guard = self.lock();
                if let Some(Some(cq)) = &own {
                    cq.take(&mut guard, &self.shared, &mut events);
                }
            }
        }
        let st = &mut *guard;
        let from = ids.len();
        st.engine.insert(now, admission, &mut ids);
        st.record_starts(&self.shared.metrics, now, &batch[from..], &ids[from..]);
        st.pump(now);
        Ok(ids)
    }
}

/// Requests of a large batch taken in and posted at a time.
const PIECE: usize = 32;
