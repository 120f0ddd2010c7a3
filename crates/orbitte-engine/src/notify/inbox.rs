//! The target's queue of received notifications.
//!
//! Bounded per sender (source id): it holds at most
//! [`InboxLimits::per_peer`] unread notifications and
//! [`InboxLimits::per_peer_bytes`] bytes of them from one sender, and at
//! most [`InboxLimits::total_bytes`] from all senders (each notification
//! charged its payload and [`ENTRY_COST`], so the count is bounded too). A
//! notification past any bound is refused, never dropped silently: the
//! sender is answered (`notification-answer`, refused) and its batch's
//! outcomes say `Refused`; here it is counted in
//! [`NotificationStats::refused_full`] and logged as a warning within
//! [`REFUSAL_LOGS_PER_SECOND`] (the rest counted and the count logged with
//! the next one). Refusing instead of waiting keeps a slow reader from
//! stalling the sender's rails (an rdma receive not reposted would stall
//! the queue pair; a tcp session not read would stall its data requests),
//! and a sender never waits on a reader that may wait on it.

use std::collections::{HashMap, VecDeque};
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
    /// Bytes of the notifications waiting to be read.
    pub queued_bytes: u64,
    /// Queued since the engine was built.
    pub received: u64,
    /// Refused because their sender had as many unread notifications (or
    /// bytes of them) queued as [`InboxLimits`] allows; each sender was
    /// told.
    pub refused_full: u64,
    /// Notification frames from peers that did not decode (dropped).
    pub malformed: u64,
}

/// Unread notifications a target keeps from one sender by default.
pub const INBOX_CAPACITY: usize = 1024;

/// Bytes of unread notifications a target keeps from one sender by
/// default: 16 MiB.
pub const INBOX_BYTES_PER_PEER: u64 = 16 << 20;

/// Bytes of unread notifications a target keeps from all senders by
/// default: 256 MiB (senders are many: each admitted source id has its
/// own per-sender share, and this bounds their sum).
pub const INBOX_BYTES_TOTAL: u64 = 256 << 20;

/// What a queued notification costs the engine-wide budget on top of its
/// payload (its record and its sender's name), so that empty ones are
/// bounded too.
pub const ENTRY_COST: u64 = 128;

/// How much a target keeps, per sender, of the notifications its
/// application has not read (see
/// [`EngineBuilder::notification_inbox`](crate::EngineBuilder::notification_inbox)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxLimits {
    /// Unread notifications from one sender (default [`INBOX_CAPACITY`]).
    pub per_peer: usize,
    /// Bytes of unread notifications from one sender (default
    /// [`INBOX_BYTES_PER_PEER`]). One notification larger than this is
    /// refused even from a sender with nothing queued.
    pub per_peer_bytes: u64,
    /// Bytes of unread notifications from all senders, each charged its
    /// payload, its sender's source id and [`ENTRY_COST`] (default
    /// [`INBOX_BYTES_TOTAL`]).
    pub total_bytes: u64,
}

impl Default for InboxLimits {
    fn default() -> Self {
        Self {
            per_peer: INBOX_CAPACITY,
            per_peer_bytes: INBOX_BYTES_PER_PEER,
            total_bytes: INBOX_BYTES_TOTAL,
        }
    }
}

/// Lines a target logs per second about notifications it refused (queue
/// full, malformed): a peer sending them as fast as it can makes a few
/// lines a second, each with the count left out since the last.
pub(crate) const REFUSAL_LOGS_PER_SECOND: u32 = 10;

/// The queue and, per sender, what it holds of theirs.
#[derive(Debug, Default)]
struct Queue {
    notes: VecDeque<ReceivedNotification>,
    /// Source id -> (notifications, bytes) queued. Invariant: the sums
    /// over `notes` by source id; no entry with nothing queued.
    held: HashMap<String, (usize, u64)>,
    bytes: u64,
    /// What the queued notifications cost the engine-wide budget
    /// ([`charge`]).
    charged: u64,
}

/// What `n` costs the engine-wide budget.
fn charge(n: &ReceivedNotification) -> u64 {
    n.payload.len() as u64 + n.source_id.len() as u64 + ENTRY_COST
}

impl Queue {
    fn take(&mut self, n: &ReceivedNotification) {
        let len = n.payload.len() as u64;
        self.bytes -= len;
        self.charged -= charge(n);
        if let Some(h) = self.held.get_mut(&n.source_id) {
            h.0 -= 1;
            h.1 -= len;
            if h.0 == 0 {
                self.held.remove(&n.source_id);
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct Inbox {
    queue: Mutex<Queue>,
    cond: Condvar,
    limits: InboxLimits,
    received: AtomicU64,
    refused_full: AtomicU64,
    malformed: AtomicU64,
    refusal_log: LogBudget,
}

impl Default for Inbox {
    fn default() -> Self {
        Self::new(InboxLimits::default())
    }
}

impl Inbox {
    pub(crate) fn new(limits: InboxLimits) -> Self {
        Self {
            queue: Mutex::new(Queue::default()),
            cond: Condvar::new(),
            limits,
            received: AtomicU64::new(0),
            refused_full: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            refusal_log: LogBudget::new(REFUSAL_LOGS_PER_SECOND),
        }
    }

    #[cfg(test)]
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self::new(InboxLimits {
            per_peer: capacity,
            ..InboxLimits::default()
        })
    }

    /// Queues a notification received at `now`, or refuses it when its
    /// sender has as many (or as many bytes) queued as the limits allow;
    /// returns the verdict and the bound it hit (0 when queued).
    pub(crate) fn push(
        &self,
        n: ReceivedNotification,
        now: Instant,
    ) -> (wire::NotificationVerdict, u64) {
        let len = n.payload.len() as u64;
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let (count, bytes) = q.held.get(&n.source_id).copied().unwrap_or_default();
        let refused = if count >= self.limits.per_peer {
            Some((
                wire::NotificationVerdict::INBOX_FULL,
                self.limits.per_peer as u64,
            ))
        } else if bytes.saturating_add(len) > self.limits.per_peer_bytes {
            Some((
                wire::NotificationVerdict::BYTES_FULL,
                self.limits.per_peer_bytes,
            ))
        } else if q.charged.saturating_add(charge(&n)) > self.limits.total_bytes {
            Some((
                wire::NotificationVerdict::TOTAL_FULL,
                self.limits.total_bytes,
            ))
        } else {
            None
        };
        if let Some((verdict, limit)) = refused {
            drop(q);
            self.refused_full.fetch_add(1, Ordering::Relaxed);
            if let Some(left_out) = self.refusal_to_log(now) {
                // Source ids are checked wire text; `?` escapes them.
                tracing::warn!(
                    source = ?n.source_id,
                    queued = count,
                    queued_bytes = bytes,
                    len,
                    %verdict,
                    limit,
                    left_out,
                    "notification refused and its sender told: the sender's unread notifications \
                     reached their bound (read them with notifications())"
                );
            }
            return (verdict, limit);
        }
        let h = q.held.entry(n.source_id.clone()).or_default();
        h.0 += 1;
        h.1 += len;
        q.bytes += len;
        q.charged += charge(&n);
        q.notes.push_back(n);
        drop(q);
        self.received.fetch_add(1, Ordering::Relaxed);
        self.cond.notify_all();
        (wire::NotificationVerdict::QUEUED, 0)
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
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.held.clear();
        q.bytes = 0;
        q.charged = 0;
        q.notes.drain(..).collect()
    }

    /// The oldest notification, waiting up to `timeout` for one.
    pub(crate) fn wait(&self, timeout: Duration) -> Option<ReceivedNotification> {
        let deadline = Instant::now() + timeout;
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(n) = q.notes.pop_front() {
                q.take(&n);
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
        let (queued, queued_bytes) = {
            let q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            (q.notes.len(), q.bytes)
        };
        NotificationStats {
            queued,
            queued_bytes,
            received: self.received.load(Ordering::Relaxed),
            refused_full: self.refused_full.load(Ordering::Relaxed),
            malformed: self.malformed.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(v: (wire::NotificationVerdict, u64)) -> bool {
        v.0.is_queued()
    }

    #[test]
    fn each_sender_has_its_own_count_and_byte_bounds() {
        let inbox = Inbox::new(InboxLimits {
            per_peer: 3,
            per_peer_bytes: 10,
            ..InboxLimits::default()
        });
        let t0 = Instant::now();
        let from = |src: &str, len: usize| ReceivedNotification {
            source_id: src.into(),
            epoch: orbitte_wire::Epoch::MIN,
            path: PathKind::Tcp,
            payload: vec![0; len],
        };
        assert!(queued(inbox.push(from("a", 6), t0)));
        // 6 + 5 bytes pass the 10-byte budget; 6 + 4 do not.
        assert_eq!(
            inbox.push(from("a", 5), t0),
            (wire::NotificationVerdict::BYTES_FULL, 10)
        );
        assert!(queued(inbox.push(from("a", 4), t0)));
        // Another sender is not held back by the first.
        assert!(queued(inbox.push(from("b", 10), t0)));
        assert_eq!(
            inbox.push(from("b", 11), t0).0,
            wire::NotificationVerdict::BYTES_FULL
        );
        assert!(queued(inbox.push(from("a", 0), t0)));
        assert_eq!(
            inbox.push(from("a", 0), t0),
            (wire::NotificationVerdict::INBOX_FULL, 3)
        );
        let s = inbox.stats();
        assert_eq!((s.queued, s.queued_bytes, s.refused_full), (4, 20, 3));
        // Reading frees the reader's share: one at a time or all.
        assert_eq!(inbox.wait(Duration::ZERO).map(|n| n.payload.len()), Some(6));
        assert!(queued(inbox.push(from("a", 6), t0)));
        assert_eq!(inbox.drain().len(), 4);
        assert_eq!(inbox.stats().queued_bytes, 0);
        assert!(queued(inbox.push(from("b", 10), t0)));
    }

    #[test]
    fn all_senders_together_stay_within_the_engine_wide_budget() {
        // Room for two entries of 100 payload bytes from one-letter ids.
        let inbox = Inbox::new(InboxLimits {
            total_bytes: 2 * (100 + 1 + ENTRY_COST),
            ..InboxLimits::default()
        });
        let t0 = Instant::now();
        let from = |src: &str| ReceivedNotification {
            source_id: src.into(),
            epoch: orbitte_wire::Epoch::MIN,
            path: PathKind::Tcp,
            payload: vec![0; 100],
        };
        assert!(queued(inbox.push(from("a"), t0)));
        assert!(queued(inbox.push(from("b"), t0)));
        assert_eq!(
            inbox.push(from("c"), t0),
            (
                wire::NotificationVerdict::TOTAL_FULL,
                2 * (101 + ENTRY_COST)
            )
        );
        assert!(inbox.wait(Duration::ZERO).is_some());
        assert!(queued(inbox.push(from("c"), t0)));
        inbox.drain();
        assert!(queued(inbox.push(from("d"), t0)));
    }

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
        assert!(queued(inbox.push(note(1), t0)));
        assert!(queued(inbox.push(note(2), t0)));
        assert_eq!(
            inbox.push(note(3), t0),
            (wire::NotificationVerdict::INBOX_FULL, 2)
        );
        let s = inbox.stats();
        assert_eq!((s.queued, s.received, s.refused_full), (2, 2, 1));
        let got: Vec<u8> = inbox.drain().iter().map(|n| n.payload[0]).collect();
        assert_eq!(got, [1, 2]);
        assert!(queued(inbox.push(note(4), t0)));
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
            assert!(queued(inbox.push(note(0), t0)));
            // One virtual second of refusals, one every 20 us.
            for i in 0..FLOOD {
                assert!(!queued(
                    inbox.push(note(1), t0 + Duration::from_micros(20 * i))
                ));
            }
            // One more, after a quiet second.
            assert!(!queued(inbox.push(note(2), t0 + Duration::from_secs(2))));
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
            crate::session::log_budget::captured(|| !queued(inbox.push(n, Instant::now())));
        assert!(refused);
        assert_eq!(log.lines().count(), 1, "{log}");
    }

    #[test]
    fn wait_wakes_on_a_push_from_another_thread() {
        let inbox = std::sync::Arc::new(Inbox::default());
        let i2 = inbox.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            let _ = i2.push(note(9), Instant::now());
        });
        assert_eq!(
            inbox.wait(Duration::from_secs(5)).map(|n| n.payload),
            Some(vec![9])
        );
        t.join().unwrap();
    }
}
