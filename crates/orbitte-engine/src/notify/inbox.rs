//! The target's queue of received notifications.
//!
//! Bounded: when it holds [`INBOX_CAPACITY`] notifications, a new one is
//! refused (dropped, counted in [`NotificationStats::refused_full`], logged
//! as a warning) and the queued ones are kept. Refusing instead of waiting
//! keeps a slow reader from stalling the sender's rails (an rdma receive
//! not reposted would stall the queue pair; a tcp session not read would
//! stall its data requests).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{NotificationStats, ReceivedNotification};

/// Notifications a target keeps before it refuses new ones.
pub const INBOX_CAPACITY: usize = 1024;

#[derive(Debug)]
pub(crate) struct Inbox {
    queue: Mutex<VecDeque<ReceivedNotification>>,
    cond: Condvar,
    capacity: usize,
    received: AtomicU64,
    refused_full: AtomicU64,
    malformed: AtomicU64,
}

impl Default for Inbox {
    fn default() -> Self {
        Self::with_capacity(INBOX_CAPACITY)
    }
}

impl Inbox {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            queue: Mutex::new(VecDeque::new()),
            cond: Condvar::new(),
            capacity,
            received: AtomicU64::new(0),
            refused_full: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
        }
    }

    /// Queues a notification; `false` when the queue is full (it is
    /// dropped and counted).
    pub(crate) fn push(&self, n: ReceivedNotification) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= self.capacity {
            drop(q);
            self.refused_full.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                source = %n.source_id,
                capacity = self.capacity,
                "notification refused: the queue is full (read it with notifications())"
            );
            return false;
        }
        q.push_back(n);
        drop(q);
        self.received.fetch_add(1, Ordering::Relaxed);
        self.cond.notify_all();
        true
    }

    /// Counts a notification frame from a peer that did not decode.
    pub(crate) fn count_malformed(&self) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
    }

    /// Everything queued, oldest first.
    pub(crate) fn drain(&self) -> Vec<ReceivedNotification> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect()
    }

    /// The oldest notification, waiting up to `timeout` for one.
    pub(crate) fn wait(&self, timeout: Duration) -> Option<ReceivedNotification> {
        let deadline = Instant::now() + timeout;
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(n) = q.pop_front() {
                return Some(n);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            q = self
                .cond
                .wait_timeout(q, deadline - now)
                .map_or_else(|e| e.into_inner().0, |(g, _)| g);
        }
    }

    pub(crate) fn stats(&self) -> NotificationStats {
        NotificationStats {
            queued: self.queue.lock().unwrap_or_else(|p| p.into_inner()).len(),
            received: self.received.load(Ordering::Relaxed),
            refused_full: self.refused_full.load(Ordering::Relaxed),
            malformed: self.malformed.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::PathKind;

    fn note(i: u8) -> ReceivedNotification {
        ReceivedNotification {
            source_id: "a".into(),
            epoch: orbitte_wire::Epoch::MIN,
            path: PathKind::Tcp,
            payload: vec![i],
        }
    }

    #[test]
    fn a_full_queue_keeps_the_oldest_and_counts_the_refused() {
        let inbox = Inbox::with_capacity(2);
        assert!(inbox.push(note(1)));
        assert!(inbox.push(note(2)));
        assert!(!inbox.push(note(3)));
        let s = inbox.stats();
        assert_eq!((s.queued, s.received, s.refused_full), (2, 2, 1));
        let got: Vec<u8> = inbox.drain().iter().map(|n| n.payload[0]).collect();
        assert_eq!(got, [1, 2]);
        assert!(inbox.push(note(4)));
        assert_eq!(inbox.wait(Duration::ZERO).map(|n| n.payload), Some(vec![4]));
        assert_eq!(inbox.wait(Duration::from_millis(5)), None);
    }

    #[test]
    fn wait_wakes_on_a_push_from_another_thread() {
        let inbox = std::sync::Arc::new(Inbox::default());
        let i2 = inbox.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            i2.push(note(9));
        });
        assert_eq!(
            inbox.wait(Duration::from_secs(5)).map(|n| n.payload),
            Some(vec![9])
        );
        t.join().unwrap();
    }
}
