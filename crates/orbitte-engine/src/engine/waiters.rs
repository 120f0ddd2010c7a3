//! Outcomes waiting to be taken, and the threads waiting for them.
//!
//! A thread that waits for a request parks itself under the request's id;
//! the outcome's arrival wakes that thread only. A thread that waits for
//! drain parks on the drain list, woken when slices are released. The
//! threads to wake are collected under the state lock and unparked after
//! it is released (see [`StateGuard`](super::StateGuard)), so a woken
//! thread does not run into the lock its waker still holds.

use std::collections::HashMap;
use std::thread::Thread;

use crate::outcome::{Outcome, RequestId};

/// Outcomes made and not yet taken, and who waits for them.
#[derive(Debug, Default)]
pub(crate) struct Outcomes {
    ready: HashMap<RequestId, Outcome>,
    /// One parked thread per awaited request.
    waiting: HashMap<RequestId, Thread>,
    /// Threads parked until some slice is released.
    draining: Vec<Thread>,
    /// Threads to unpark once the state lock is released.
    wake: Vec<Thread>,
}

impl Outcomes {
    /// Adds an outcome; the thread waiting for it, if any, is woken, and
    /// so are drain waiters (an outcome may come with released slices).
    pub(crate) fn insert(&mut self, id: RequestId, outcome: Outcome) {
        self.ready.insert(id, outcome);
        if let Some(t) = self.waiting.remove(&id) {
            self.wake.push(t);
        }
        self.slices_released();
    }

    /// Takes the outcome.
    pub(crate) fn remove(&mut self, id: &RequestId) -> Option<Outcome> {
        self.ready.remove(id)
    }

    /// Whether the request's outcome is here, not taken yet.
    pub(crate) fn contains_key(&self, id: &RequestId) -> bool {
        self.ready.contains_key(id)
    }

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

    /// Slices were released (or a drain status may have changed): wake
    /// every drain waiter.
    pub(crate) fn slices_released(&mut self) {
        self.wake.append(&mut self.draining);
    }

    /// Moves the threads to wake into `into`.
    pub(crate) fn take_wakeups(&mut self, into: &mut Vec<Thread>) {
        into.append(&mut self.wake);
    }
}
