//! Admission of a batch: validation, rail choice, submission to the core.

use std::time::Instant;

use super::wait::OwnCq;
use super::{TransferEngine, TransferRequest};
use crate::notify::{Armed, Notification, NotificationError};
use crate::outcome::{RequestId, SubmitError};
use crate::request::Posting;

/// How [`TransferEngine::submit_with`] submits a batch; the default is
/// what [`TransferEngine::submit`] does.
#[derive(Debug, Clone, Default)]
pub struct SubmitOptions {
    notification: Option<Notification>,
    posting: Posting,
}

impl SubmitOptions {
    /// No notification, [`Posting::Inline`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The batch carries `notification` to its peer (see
    /// [`TransferEngine::submit_with_notification`]).
    #[must_use]
    pub fn notification(mut self, notification: Notification) -> Self {
        self.notification = Some(notification);
        self
    }

    /// Whether the calling thread may execute some of the batch.
    #[must_use]
    pub fn posting(mut self, posting: Posting) -> Self {
        self.posting = posting;
        self
    }
}

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
        self.submit_with(batch, SubmitOptions::new())
    }

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
        self.submit_with(batch, SubmitOptions::new().notification(notification))
    }

    /// Submits a batch like [`submit`](Self::submit), with `options`: a
    /// notification the batch carries (as
    /// [`submit_with_notification`](Self::submit_with_notification)) and
    /// whether the calling thread may execute some of it
    /// ([`Posting`]).
    pub fn submit_with<R: Into<crate::Request> + Copy>(
        &self,
        batch: &[R],
        options: SubmitOptions,
    ) -> Result<Vec<RequestId>, SubmitError> {
        let resolved = self.resolve(batch)?;
        let staged = self.first_staged(&resolved);
        match options.notification {
            Some(notification) => {
                if let Some(index) = staged {
                    return Err(NotificationError::Staged { index }.into());
                }
                let armed = Armed::check(&resolved, notification)?;
                self.submit_inner(&resolved, Some(armed), options.posting)
            }
            None if staged.is_some() => self.submit_with_staged(&resolved),
            None => self.submit_inner(&resolved, None, options.posting),
        }
    }

    /// Admits a batch whose remote addresses are resolved
    /// ([`submit`](Self::submit)), tracking its notification if it carries
    /// one.
    pub(crate) fn submit_inner(
        &self,
        batch: &[TransferRequest],
        notification: Option<Armed>,
        posting: Posting,
    ) -> Result<Vec<RequestId>, SubmitError> {
        let span = tracing::trace_span!("submit", requests = batch.len());
        let _g = span.enter();
        let mut guard = self.lock();
        let st = &mut *guard;
        if let Some(armed) = &notification {
            fits_the_path(st, armed)?;
        }
        st.posting = posting;
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
                guard.posting = posting;
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

/// Refuses a notification larger than
/// [`RDMA_MAX_NOTIFICATION_LEN`](crate::notify::RDMA_MAX_NOTIFICATION_LEN)
/// to a peer whose every rail is rdma (no rail could carry it).
fn fits_the_path(st: &super::State, armed: &Armed) -> Result<(), NotificationError> {
    let max = crate::notify::RDMA_MAX_NOTIFICATION_LEN;
    let len = armed.payload_len();
    if len <= max {
        return Ok(());
    }
    let core = st.engine.core();
    let rdma_only = st
        .engine
        .tables()
        .peers
        .get(&armed.peer().0)
        .is_some_and(|p| {
            !p.rails.is_empty()
                && p.rails.iter().all(|r| {
                    core.rail_spec(*r)
                        .is_some_and(|s| s.path == crate::transport::PathKind::Rdma)
                })
        });
    if rdma_only {
        return Err(NotificationError::TooLargeForPath {
            len,
            max,
            path: crate::transport::PathKind::Rdma,
        });
    }
    Ok(())
}
