//! The target's queue of received notifications.
//!
//! Bounded: when it holds [`INBOX_CAPACITY`] notifications, a new one is
//! refused (dropped, counted in [`NotificationStats::refused_full`], logged
//! as a warning within [`REFUSAL_LOGS_PER_SECOND`], the rest counted and
//! the count logged with the next one) and the queued ones are kept. Refusing instead of waiting
//! keeps a slow reader from stalling the sender's rails (an rdma receive
//! not reposted would stall the queue pair; a tcp session not read would
//! stall its data requests).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use orbitte_wire as wire;

use crate::session::log_budget::LogBudget;
use crate::transport::PathKind;

/// A notification as the target receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedNotification {
    /// The sender's source id (as its session or queue pair was admitted).
    pub source_id: String,
    /// The sender's epoch.
    pub epoch: wire::Epoch,
    /// The path it came over.
    pub path: PathKind,
    /// The bytes.
    pub payload: Vec<u8>,
}

/// Counters of the target's notification queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotificationStats {
    /// Waiting to be read.
    pub queued: usize,
    /// Queued since the engine was built.
    pub received: u64,
    /// Refused because the queue held [`INBOX_CAPACITY`] already.
    pub refused_full: u64,
    /// Notification frames from peers that did not decode (dropped).
    pub malformed: u64,
}

/// Notifications a target keeps before it refuses new ones.
pub const INBOX_CAPACITY: usize = 1024;

/// Lines a target logs per second about notifications it refused (queue
/// full, malformed): a peer sending them as fast as it can makes a few
/// lines a second, each with the count left out since the last.
pub(crate) const REFUSAL_LOGS_PER_SECOND: u32 = 10;

#[derive(Debug)]
pub(crate) struct Inbox {
    queue: Mutex<VecDeque<ReceivedNotification>>,
    cond: Condvar,
    capacity: usize,
    received: AtomicU64,
    refused_full: AtomicU64,
    malformed: AtomicU64,
    refusal_log: LogBudget,
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
            refusal_log: LogBudget::new(REFUSAL_LOGS_PER_SECOND),
        }
    }

    /// Queues a notification received at `now`; `false` when the queue is
    /// full (it is dropped and counted).
    pub(crate) fn push(&self, n: ReceivedNotification, now: Instant) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= self.capacity {
            drop(q);
            self.refused_full.fetch_add(1, Ordering::Relaxed);
            if let Some(left_out) = self.refusal_to_log(now) {
                // Source ids are checked wire text; `?` escapes them.
                tracing::warn!(
                    source = ?n.source_id,
                    capacity = self.capacity,
                    left_out,
                    "notification refused: the queue is full (read it with notifications())"
                );
            }
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

    /// Whether a line about a refused or malformed notification may be
    /// logged at `now` (within [`REFUSAL_LOGS_PER_SECOND`]), with the count
    /// of those left out since the last one; `None`: log nothing.
    pub(crate) fn refusal_to_log(&self, now: Instant) -> Option<u64> {
        self.refusal_log.admit(now)
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
        let t0 = Instant::now();
        assert!(inbox.push(note(1), t0));
        assert!(inbox.push(note(2), t0));
        assert!(!inbox.push(note(3), t0));
        let s = inbox.stats();
        assert_eq!((s.queued, s.received, s.refused_full), (2, 2, 1));
        let got: Vec<u8> = inbox.drain().iter().map(|n| n.payload[0]).collect();
        assert_eq!(got, [1, 2]);
        assert!(inbox.push(note(4), t0));
        assert_eq!(inbox.wait(Duration::ZERO).map(|n| n.payload), Some(vec![4]));
        assert_eq!(inbox.wait(Duration::from_millis(5)), None);
    }

    /// The count a refusal line carries (`left_out=N`).
    fn left_out(line: &str) -> u64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix("left_out="))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no left_out in {line:?}"))
    }

    #[test]
    fn a_flood_to_a_full_queue_logs_a_few_lines_that_count_the_rest() {
        const FLOOD: u64 = 50_000;
        let inbox = Inbox::with_capacity(1);
        let t0 = Instant::now();
        let ((), log) = crate::session::log_budget::captured(|| {
            assert!(inbox.push(note(0), t0));
            // One virtual second of refusals, one every 20 us.
            for i in 0..FLOOD {
                assert!(!inbox.push(note(1), t0 + Duration::from_micros(20 * i)));
            }
            // One more, after a quiet second.
            assert!(!inbox.push(note(2), t0 + Duration::from_secs(2)));
        });
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("notification refused"))
            .collect();
        assert_eq!(log.lines().count(), lines.len(), "{log}");
        // The burst, one line per 100 ms for the rest of the second, and the
        // later one.
        let burst = REFUSAL_LOGS_PER_SECOND as usize;
        assert_eq!(lines.len(), burst + (burst - 1) + 1, "{log}");
        assert!(lines.iter().all(|l| l.contains("WARN")), "{log}");
        // Every refusal is a line or counted in a later one.
        let counted: u64 = lines.iter().map(|l| left_out(l)).sum();
        assert_eq!(counted + lines.len() as u64, FLOOD + 1);
        assert!(left_out(lines[lines.len() - 1]) > 0, "{log}");
        assert_eq!(inbox.stats().refused_full, FLOOD + 1);
    }

    #[test]
    fn a_source_id_with_a_newline_stays_on_its_line() {
        let inbox = Inbox::with_capacity(0);
        let mut n = note(1);
        n.source_id = "evil\nWARN forged".into();
        let (refused, log) =
            crate::session::log_budget::captured(|| !inbox.push(n, Instant::now()));
        assert!(refused);
        assert_eq!(log.lines().count(), 1, "{log}");
    }

    #[test]
    fn wait_wakes_on_a_push_from_another_thread() {
        let inbox = std::sync::Arc::new(Inbox::default());
        let i2 = inbox.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            i2.push(note(9), Instant::now());
        });
        assert_eq!(
            inbox.wait(Duration::from_secs(5)).map(|n| n.payload),
            Some(vec![9])
        );
        t.join().unwrap();
    }
}
