//! The threads waiting for outcomes and for drain.
//!
//! A thread that waits for a request parks itself under the request's id;
//! the outcome's arrival ([`Outcomes::take_arrived`](orbitte_proto::state::Outcomes::take_arrived))
//! wakes that thread only. A thread that waits for drain parks on the
//! drain list, woken when slices are released. The threads to wake are
//! collected under the state lock and unparked after it is released (see
//! [`StateGuard`](super::StateGuard)), so a woken thread does not run into
//! the lock its waker still holds.

use std::thread::Thread;

use crate::outcome::RequestId;

/// Who waits for what.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    /// One parked thread per awaited request.
    waiting: crate::Map<RequestId, Thread>,
    /// Threads parked until some slice is released.
    draining: Vec<Thread>,
    /// Whether slices were released since the drain waiters were last woken.
    wake_drain: bool,
}

impl Waiters {
    /// Records the current thread as the one waiting for `id` (replacing
    /// an earlier waiter, which then wakes on its own timeout).
    pub(crate) fn await_outcome(&mut self, id: RequestId) {
        self.waiting.insert(id, std::thread::current());
    }

    /// Forgets the waiter of `id` (it stopped waiting).
    pub(crate) fn forget_waiter(&mut self, id: RequestId) {
        self.waiting.remove(&id);
    }

    /// Records the current thread as waiting for released slices.
    pub(crate) fn await_drain(&mut self) {
        let me = std::thread::current();
        if !self.draining.iter().any(|t| t.id() == me.id()) {
            self.draining.push(me);
        }
    }

    /// Slices were released (or a drain status may have changed): every
    /// drain waiter is to be woken at the next release of the lock.
    pub(crate) fn slices_released(&mut self) {
        self.wake_drain = true;
    }

    /// The threads to wake for the outcomes that `arrived` (an outcome may
    /// come with released slices, so drain waiters too), and for released
    /// slices, into `into`.
    pub(crate) fn take_woken(&mut self, arrived: &[RequestId], into: &mut Vec<Thread>) {
        if self.waiting.len() * 8 < arrived.len() {
            // Few waiters, many outcomes (a batch completing): look each
            // waiter up among the arrivals instead of hashing every one.
            self.waiting.retain(|id, t| {
                let woken = arrived.contains(id);
                if woken {
                    into.push(t.clone());
                }
                !woken
            });
        } else {
            for id in arrived {
                if let Some(t) = self.waiting.remove(id) {
                    into.push(t);
                }
            }
        }
        if !arrived.is_empty() || std::mem::take(&mut self.wake_drain) {
            into.append(&mut self.draining);
        }
    }
}
