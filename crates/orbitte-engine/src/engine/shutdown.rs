//! Shutdown and cleanup evidence: fence, drain, destroy, Unquiesced.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use orbitte_verbs as verbs;

use super::{Owner, State, TransferEngine};
use crate::error::Unquiesced;
use crate::registration::{Charges, close_copies};
use crate::transport::RailId;

impl TransferEngine {
    pub(crate) fn unquiesced_from(
        &self,
        during: String,
        failures: Vec<verbs::Unquiesced>,
        retained: Charges,
    ) -> Unquiesced {
        Unquiesced {
            source_id: self.shared.source_id.as_str().to_owned(),
            epoch: self.shared.epoch,
            during,
            failures,
            retained,
        }
    }

    pub(crate) fn record_unquiesced(&self, st: &mut State, u: &Unquiesced) {
        st.engine.record_unquiesced(u.clone());
    }

    /// Fences the engine, cancels what runs, waits up to `timeout` for
    /// drain (flushing rails), then destroys every native object. A destroy
    /// that fails yields [`Unquiesced`] with the evidence; the owners,
    /// memory and charges stay retained.
    pub fn shutdown(&self, timeout: Duration) -> Result<(), Box<Unquiesced>> {
        let deadline = Instant::now() + timeout;
        {
            let mut st = self.lock();
            st.fence("engine shutting down");
            let now = Instant::now();
            // Close every rail: busy ones are flushed by the pump.
            for rail in (0..st.owner.len() as u32).map(RailId) {
                st.engine.close_rail(rail, now, false);
            }
            st.pump(now);
        }
        // Wait for the flushes to drain (pollers still run).
        let undrained = loop {
            let mut st = self.lock();
            let undrained = st.engine.core().outstanding_slices();
            let now = Instant::now();
            if undrained == 0 || now >= deadline {
                break undrained;
            }
            st.waiters.await_drain();
            drop(st);
            std::thread::park_timeout((deadline - now).min(Duration::from_millis(5)));
        };
        self.stop_threads();
        let mut st = self.lock();
        let mut failures = Vec::new();
        for rail in st.rdma.live_rails() {
            if let Err(u) = st.rdma.destroy(rail) {
                failures.push(*u);
            }
        }
        let others: Vec<(RailId, usize)> = st
            .owner
            .iter()
            .enumerate()
            .filter_map(|(i, o)| match o {
                Owner::Other(t) => Some((RailId(i as u32), *t)),
                Owner::Rdma => None,
            })
            .collect();
        for (rail, t) in others {
            if let Some(tr) = st.others.get_mut(t)
                && let Err(e) = tr.close_rail(rail)
            {
                tracing::error!(error = %e, "closing a rail failed");
            }
        }
        let mut retained = Charges::default();
        for entry in st.engine.take_all_registrations() {
            let len = entry.memory.len() as u64;
            let failed = close_copies(entry.copies);
            let kept = st.engine.retain(failed.len(), len);
            retained.mrs += kept.mrs;
            retained.bytes += kept.bytes;
            failures.extend(failed);
        }
        if let Some(init) = st.init.as_mut() {
            for n in init.nics.drain(..) {
                for r in [n.cq.close(), n.pd.close(), n.context.close()] {
                    if let Err(u) = r {
                        failures.push(u);
                    }
                }
            }
        }
        if failures.is_empty() {
            tracing::info!(undrained, "engine shut down");
            return Ok(());
        }
        let u = self.unquiesced_from("shutdown".into(), failures, retained);
        self.record_unquiesced(&mut st, &u);
        Err(Box::new(u))
    }

    fn stop_threads(&self) {
        let listener = self
            .shared
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(l) = listener {
            l.shutdown();
        }
        self.shared.stop.store(true, Ordering::Release);
        super::staged::cancel_all(&mut self.lock());
        self.shared.staging.stop_all();
        self.shared.ring_stop();
        let threads = std::mem::take(
            &mut *self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for TransferEngine {
    /// Stops the threads. Native objects are released by their handles'
    /// drops, which never pretend: a failed destroy is retained by verbs.
    /// Call [`shutdown`](Self::shutdown) to learn whether cleanup succeeded.
    fn drop(&mut self) {
        if self.owner {
            self.stop_threads();
        }
    }
}
