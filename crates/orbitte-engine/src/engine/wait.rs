//! Outcomes and drain: poll, wait, cancel, wait_drain.

use std::time::{Duration, Instant};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use orbitte_verbs::{Completion, CompletionQueue};

use super::{Owner, Shared, State, TransferEngine};
use crate::error::{DrainTimeout, WaitError};
use crate::outcome::{DrainStatus, Outcome, RequestId};
use crate::transport::TransportEvent;

impl TransferEngine {
    /// The outcome, if the request has one (taken: a second call says
    /// `None`).
    pub fn poll(&self, id: RequestId) -> Option<Outcome> {
        self.lock().engine.take_outcome(&id)
    }

    /// Waits for the outcome. Every request gets one by its request
    /// timeout, so a `timeout` longer than that always returns it.
    ///
    /// The thread parks under the request's id and wakes when its outcome
    /// arrives (not at every other request's), or when a deadline of the
    /// core is due, which it then expires itself. A request on rdma rails
    /// of one NIC is waited for on that NIC's completion queue instead:
    /// the thread polls it and hands its completions to the core itself,
    /// and sleeps on it once it gave nothing for 20 µs.
    pub fn wait(&self, id: RequestId, timeout: Duration) -> Result<Outcome, WaitError> {
        self.wait_then(id, timeout, |o, _| o)
    }

    /// Waits for the outcome of `ids[0]`, then takes, under the same hold
    /// of the state lock, the outcomes of the requests after it that are
    /// already there, in order up to the first one that is not; appends
    /// them all to `out` and returns how many it took (at least 1).
    ///
    /// For a caller that consumes a batch's outcomes as they come: one
    /// lock round trip per run of arrived outcomes instead of one per
    /// request, and each outcome handed over as soon as it is known.
    /// Call it again with `&ids[taken..]` for the rest. Errors are
    /// [`wait`](Self::wait)'s for `ids[0]`; an empty `ids` takes nothing
    /// and returns `Ok(0)`.
    pub fn wait_ready(
        &self,
        ids: &[RequestId],
        timeout: Duration,
        out: &mut Vec<Outcome>,
    ) -> Result<usize, WaitError> {
        let Some((&first, rest)) = ids.split_first() else {
            return Ok(0);
        };
        self.wait_then(first, timeout, |o, st| {
            out.push(o);
            let mut taken = 1;
            for id in rest {
                match st.engine.take_outcome(id) {
                    Some(o) => out.push(o),
                    None => break,
                }
                taken += 1;
            }
            taken
        })
    }

    /// [`wait`](Self::wait), handing the outcome to `then` with the state
    /// lock still held.
    fn wait_then<R>(
        &self,
        id: RequestId,
        timeout: Duration,
        then: impl FnOnce(Outcome, &mut State) -> R,
    ) -> Result<R, WaitError> {
        // The clock is read only when the outcome is not there yet.
        let mut deadline = None;
        // The completion queue this thread polls itself, once it waits.
        let mut own: Option<OwnCq> = None;
        let mut events = Vec::new();
        // Since when the own queue has given nothing.
        let mut idle_since: Option<Instant> = None;
        loop {
            let mut st = self.lock();
            if let Some(o) = st.engine.take_outcome(&id) {
                return Ok(then(o, &mut st));
            }
            if own.is_none() {
                own = OwnCq::of(&st, id);
            }
            if let Some(cq) = &own {
                // Completions go to the core from this thread, not through
                // the poller thread and a wakeup.
                let st = &mut *st;
                if cq.take(st, &self.shared, &mut events) {
                    idle_since = None;
                }
                if let Some(o) = st.engine.take_outcome(&id) {
                    return Ok(then(o, st));
                }
            }
            let now = Instant::now();
            let deadline = *deadline.get_or_insert_with(|| now + timeout);
            let next_timer = st.engine.poll_timeout();
            if next_timer.is_some_and(|t| t <= now) {
                st.expire(now);
                st.pump(now);
                if let Some(o) = st.engine.take_outcome(&id) {
                    st.waiters.forget_waiter(id);
                    return Ok(then(o, &mut st));
                }
            }
            if !st.engine.core().is_pending(id)
                && !st.engine.holds_notification(id)
                && !st.staged.is_pending(id)
            {
                st.waiters.forget_waiter(id);
                return Err(WaitError::Unknown(id));
            }
            if now >= deadline {
                st.waiters.forget_waiter(id);
                return Err(WaitError::TimedOut(id));
            }
            let until = next_timer
                .filter(|t| *t > now)
                .map_or(deadline, |t| t.min(deadline));
            if let Some(cq) = &own {
                if idle_since.is_none_or(|t| now.duration_since(t) < OWN_CQ_SPIN) {
                    idle_since.get_or_insert(now);
                    drop(st);
                    for _ in 0..32 {
                        std::hint::spin_loop();
                    }
                    continue;
                }
                // Woken by the queue; what ends a request without a
                // completion (a timeout, a cancel, a rail down) is seen at
                // the next look, within `OWN_CQ_LOOK`.
                drop(st);
                let _ = cq
                    .cq
                    .wait(until.saturating_duration_since(now).min(OWN_CQ_LOOK));
                continue;
            }
            st.waiters.await_outcome(id);
            drop(st);
            std::thread::park_timeout(until.saturating_duration_since(now));
        }
    }

    /// Waits for every request of a batch; the outcomes come in the order
    /// of `ids`.
    ///
    /// The thread parks under the last request (in the order of `ids`)
    /// whose outcome is not there yet, and takes every outcome that
    /// arrived when it wakes. A rail completes its requests in the order
    /// they were posted, so a batch spread over several rails wakes the
    /// caller about once per rail, not once per run of arrivals. The
    /// error is [`wait`](Self::wait)'s for the request waited on.
    pub fn wait_all(
        &self,
        ids: &[RequestId],
        timeout: Duration,
    ) -> Result<Vec<Outcome>, WaitError> {
        let deadline = Instant::now() + timeout;
        let mut got: Vec<Option<Outcome>> = Vec::with_capacity(ids.len());
        got.resize_with(ids.len(), || None);
        loop {
            let last = self.take_ready(ids, &mut got);
            let Some(last) = last else {
                return Ok(got.into_iter().flatten().collect());
            };
            let left = deadline.saturating_duration_since(Instant::now());
            got[last] = Some(self.wait(ids[last], left)?);
        }
    }

    /// Takes, under one hold of the state lock, the outcomes of `ids`
    /// that arrived into the empty places of `got` (as long as `ids`);
    /// returns the index of the last request still without one, the one
    /// to [`wait`](Self::wait) for next (`None`: all are there).
    pub fn take_ready(&self, ids: &[RequestId], got: &mut [Option<Outcome>]) -> Option<usize> {
        let mut st = self.lock();
        let mut last = None;
        for (i, (id, slot)) in ids.iter().zip(got.iter_mut()).enumerate() {
            if slot.is_none() {
                *slot = st.engine.take_outcome(id);
                if slot.is_none() {
                    last = Some(i);
                }
            }
        }
        last
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
        let done = st.cancel(now, id);
        st.pump(now);
        done
    }

    /// Whether the transports still hold the request's local bytes.
    pub fn drain_status(&self, id: RequestId) -> DrainStatus {
        let mut st = self.lock();
        let st = &mut *st;
        st.staged
            .drain_status(&st.engine, id)
            .unwrap_or_else(|| st.engine.core().drain_status(id))
    }

    /// Waits until the request is drained (its local buffer is the
    /// caller's again). Past the engine's drain timeout the rails holding
    /// its slices are flushed, which ends the wait on a working device.
    pub fn wait_drain(&self, id: RequestId, timeout: Duration) -> Result<(), DrainTimeout> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut st = self.lock();
            let now = Instant::now();
            st.expire(now);
            st.pump(now);
            let s = &mut *st;
            let status = s
                .staged
                .drain_status(&s.engine, id)
                .unwrap_or_else(|| s.engine.core().drain_status(id));
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
            // Woken when slices are released; cuda-staging lanes drain
            // without the core, so look again at least every 20 ms.
            st.waiters.await_drain();
            let until = st
                .engine
                .poll_timeout()
                .filter(|t| *t > now)
                .map_or(deadline, |t| t.min(deadline))
                .min(now + Duration::from_millis(20));
            drop(st);
            std::thread::park_timeout(until.saturating_duration_since(now));
        }
    }
}

/// How long a thread polling its own completion queue sleeps on it at
/// most before it looks at its request again.
const OWN_CQ_LOOK: Duration = Duration::from_millis(1);

/// How long a thread polls its own completion queue before it sleeps on
/// it, once the queue gave nothing.
const OWN_CQ_SPIN: Duration = Duration::from_micros(20);

/// The completion queue of the NIC a waited-for rdma request runs on,
/// polled by the waiting thread itself while it waits; the context's
/// poller thread leaves it alone meanwhile (`cq_waiters`).
pub(super) struct OwnCq {
    nic: u32,
    cq: CompletionQueue,
    waiters: Arc<AtomicUsize>,
}

impl OwnCq {
    /// The queue of `id`'s NIC when every rail of the request is an rdma
    /// rail on that one NIC (then every completion that decides its
    /// outcome arrives there); `None` otherwise.
    pub(super) fn of(st: &State, id: RequestId) -> Option<Self> {
        let rails = st.engine.core().pending_rails(id)?;
        let mut nic = None;
        for rail in rails {
            if st.owner.get(rail.0 as usize) != Some(&Owner::Rdma) {
                return None;
            }
            let n = st.rdma.rail(*rail)?.nic;
            if nic.is_some_and(|m| m != n) {
                return None;
            }
            nic = Some(n);
        }
        let ctx = st
            .init
            .as_ref()?
            .nics
            .iter()
            .find(|c| Some(c.id.0) == nic)?;
        ctx.cq_waiters.fetch_add(1, Ordering::AcqRel);
        Some(Self {
            nic: ctx.id.0,
            cq: ctx.cq.clone(),
            waiters: ctx.cq_waiters.clone(),
        })
    }

    /// Polls the queue empty and hands its completions to the core;
    /// returns whether there were any.
    pub(super) fn take(
        &self,
        st: &mut State,
        shared: &Shared,
        events: &mut Vec<TransportEvent>,
    ) -> bool {
        let mut buf = [Completion::default(); 32];
        let mut any = false;
        loop {
            let n = super::poll::poll_cq(st, shared, self.nic, &self.cq, &mut buf, events);
            any |= n > 0;
            if n < buf.len() {
                break;
            }
        }
        if !events.is_empty() {
            st.handle_events(Instant::now(), events);
        }
        any
    }
}

impl Drop for OwnCq {
    fn drop(&mut self) {
        self.waiters.fetch_sub(1, Ordering::AcqRel);
    }
}
