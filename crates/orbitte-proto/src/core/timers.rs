//! The core's deadlines: one queue per kind of timer.
//!
//! Every request gets the same request timeout and every undrained
//! outcome the same drain timeout, so with a clock that does not go back
//! the deadlines of one kind are set in the order they fall due: adding
//! one is an append, and the earliest is the front. A deadline set out of
//! order (a caller's `now` went back) is inserted at its place, so the
//! order holds for any input.

use std::collections::VecDeque;
use std::time::Instant;

/// What a deadline ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum TimerKind {
    /// The request's logical timeout.
    Request,
    /// The drain timeout of a finished, undrained request.
    Drain,
}

/// A deadline of a request slot (the generation tells a reused slot's
/// deadlines from stale ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Deadline {
    pub(super) at: Instant,
    pub(super) kind: TimerKind,
    pub(super) slot: u32,
    pub(super) generation: u32,
}

/// Invariant: each queue is sorted by `at` (ties in the order added).
#[derive(Debug, Default)]
pub(super) struct Timers {
    request: VecDeque<Deadline>,
    drain: VecDeque<Deadline>,
}

impl Timers {
    fn queue(&mut self, kind: TimerKind) -> &mut VecDeque<Deadline> {
        match kind {
            TimerKind::Request => &mut self.request,
            TimerKind::Drain => &mut self.drain,
        }
    }

    /// Adds a deadline.
    pub(super) fn push(&mut self, kind: TimerKind, at: Instant, slot: u32, generation: u32) {
        let d = Deadline {
            at,
            kind,
            slot,
            generation,
        };
        let q = self.queue(kind);
        if q.back().is_none_or(|b| b.at <= at) {
            q.push_back(d);
        } else {
            let i = q.partition_point(|e| e.at <= at);
            q.insert(i, d);
        }
    }

    /// The earliest deadline (a request deadline before a drain deadline
    /// at the same instant).
    pub(super) fn peek(&self) -> Option<Deadline> {
        match (self.request.front(), self.drain.front()) {
            (Some(r), Some(d)) if d.at < r.at => Some(*d),
            (Some(r), _) => Some(*r),
            (None, d) => d.copied(),
        }
    }

    /// Removes the earliest deadline of `kind` (the one [`peek`](Self::peek)
    /// returned).
    pub(super) fn pop(&mut self, kind: TimerKind) {
        self.queue(kind).pop_front();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn drain_all(t: &mut Timers) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(d) = t.peek() {
            t.pop(d.kind);
            out.push(d.slot);
        }
        out
    }

    #[test]
    fn deadlines_come_out_earliest_first_whatever_the_order_they_were_set() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut t = Timers::default();
        t.push(TimerKind::Request, at(10), 1, 0);
        t.push(TimerKind::Request, at(30), 2, 0);
        // Out of order: a caller's clock went back.
        t.push(TimerKind::Request, at(20), 3, 0);
        t.push(TimerKind::Request, at(5), 4, 0);
        t.push(TimerKind::Drain, at(20), 5, 0);
        t.push(TimerKind::Drain, at(1), 6, 0);
        let order = drain_all(&mut t);
        // At 20 ms the request deadline comes before the drain deadline.
        assert_eq!(order, [6, 4, 1, 3, 5, 2]);
        assert_eq!(t.peek(), None);
    }

    #[test]
    fn equal_deadlines_keep_the_order_they_were_set() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        for slot in 0..4 {
            t.push(TimerKind::Request, t0, slot, 7);
        }
        assert_eq!(drain_all(&mut t), [0, 1, 2, 3]);
    }
}
