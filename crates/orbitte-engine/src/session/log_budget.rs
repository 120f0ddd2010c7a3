//! Budgets for the log lines a peer can cause: refused and closed
//! sessions, local handouts, rdma control sessions, refused and malformed
//! notifications. Each kind of line has its own [`LogBudget`], so a flood
//! of one kind neither floods the log nor silences the others.
//!
//! A budget is a token bucket of `per_second` lines that refills at
//! `per_second` lines a second. A line the budget cannot take is counted,
//! not logged; the next line logged carries that count as its `left_out`
//! field, and the total is kept (for counters such as
//! `ListenerStats::refusals_not_logged`). Time is an argument, so budgets
//! are tested on virtual time; call sites pass `Instant::now()`.
//!
//! Peer-supplied text in these lines (source ids, messages) is escaped by
//! the wire types' `Display`, and reasons are logged with `?` (quoted and
//! escaped) on top.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Log it; `left_out` lines were not logged since the last one.
    Log {
        /// Lines counted but not logged before this one.
        left_out: u64,
    },
    /// Count it, do not log it.
    LeaveOut,
}

#[derive(Debug)]
struct Bucket {
    /// When every line taken so far is paid back (the bucket is full);
    /// `None` before the first line.
    full_at: Option<Instant>,
    /// Lines left out since the last one logged.
    left_out: u64,
}

/// A budget of log lines for one kind of line: bursts of up to
/// `per_second`, and `per_second` a second sustained.
#[derive(Debug)]
pub(crate) struct LogBudget {
    /// The time one line's token takes to come back; `None`: a zero
    /// budget, nothing is logged.
    interval: Option<Duration>,
    /// How far `full_at` may lie ahead of now for a line to be taken:
    /// `per_second - 1` intervals, so a full bucket takes `per_second`
    /// lines at once.
    depth: Duration,
    bucket: Mutex<Bucket>,
    not_logged: AtomicU64,
}

impl LogBudget {
    /// A budget of `per_second` lines a second (0: none).
    pub(crate) fn new(per_second: u32) -> Self {
        let interval = (per_second > 0).then(|| Duration::from_secs(1) / per_second);
        Self {
            interval,
            depth: interval.unwrap_or_default() * per_second.saturating_sub(1),
            bucket: Mutex::new(Bucket {
                full_at: None,
                left_out: 0,
            }),
            not_logged: AtomicU64::new(0),
        }
    }

    /// Judges one line at `now`.
    pub(crate) fn judge(&self, now: Instant) -> Verdict {
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let taken = self.interval.and_then(|interval| {
            let from = b.full_at.map_or(now, |f| f.max(now));
            let room = now
                .checked_add(self.depth)
                .is_none_or(|limit| from <= limit);
            room.then(|| from.checked_add(interval).unwrap_or(from))
        });
        match taken {
            Some(full_at) => {
                b.full_at = Some(full_at);
                Verdict::Log {
                    left_out: std::mem::take(&mut b.left_out),
                }
            }
            None => {
                b.left_out = b.left_out.saturating_add(1);
                self.not_logged.fetch_add(1, Ordering::Relaxed);
                Verdict::LeaveOut
            }
        }
    }

    /// Whether a line may be logged at `now`: the count of lines left out
    /// since the last one logged, or `None` (counted, log nothing).
    pub(crate) fn admit(&self, now: Instant) -> Option<u64> {
        match self.judge(now) {
            Verdict::Log { left_out } => Some(left_out),
            Verdict::LeaveOut => None,
        }
    }

    /// Lines left out so far, in all.
    pub(crate) fn not_logged(&self) -> u64 {
        self.not_logged.load(Ordering::Relaxed)
    }
}

/// What the log lines emitted inside a closure read like (on this
/// thread).
///
/// The test binary gets one global subscriber that writes each line to
/// the capture of the thread that logged it, if that thread is capturing.
/// A thread-local subscriber would not do: tracing caches each callsite's
/// interest for the whole process, computed against the subscriber of the
/// first thread that reaches it, so a test running the same code without
/// a subscriber could switch the callsite off for the capturing one.
#[cfg(test)]
pub(crate) fn captured<R>(f: impl FnOnce() -> R) -> (R, String) {
    use std::cell::RefCell;
    thread_local! {
        static CAPTURE: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
    }
    struct ThreadSink;
    impl std::io::Write for ThreadSink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            CAPTURE.with(|c| {
                if let Some(buf) = c.borrow_mut().as_mut() {
                    buf.extend_from_slice(b);
                }
            });
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(|| ThreadSink)
            .with_ansi(false)
            .finish();
        // Another global subscriber (none in this crate's tests) would
        // keep its own; the capture then stays empty and the test says so.
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
    CAPTURE.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let r = f();
    let bytes = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (r, String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_the_budget_then_counts_and_reports_the_rest() {
        let log = LogBudget::new(3);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        for i in 0..3 {
            assert_eq!(log.judge(ms(i)), Verdict::Log { left_out: 0 });
        }
        for i in 3..100 {
            assert_eq!(log.judge(ms(i)), Verdict::LeaveOut);
        }
        // A second later the bucket is full again, and the count of those
        // left out comes with the next line.
        assert_eq!(log.judge(ms(1000)), Verdict::Log { left_out: 97 });
        assert_eq!(log.judge(ms(1001)), Verdict::Log { left_out: 0 });
        assert_eq!(log.judge(ms(1002)), Verdict::Log { left_out: 0 });
        assert_eq!(log.judge(ms(1003)), Verdict::LeaveOut);
        assert_eq!(log.judge(ms(5000)), Verdict::Log { left_out: 1 });
        assert_eq!(log.not_logged(), 98);
    }

    #[test]
    fn a_steady_flood_gets_the_rate_and_no_more() {
        // 10 a second for 60 virtual seconds, offered 1000 a second: the
        // first burst of 10, then one every 100 ms.
        let log = LogBudget::new(10);
        let t0 = Instant::now();
        let mut logged = 0u64;
        let mut reported = 0u64;
        for i in 0..60_000u64 {
            if let Some(left_out) = log.admit(t0 + Duration::from_millis(i)) {
                logged += 1;
                reported += left_out;
            }
        }
        assert_eq!(logged, 10 + 599);
        assert_eq!(log.not_logged(), 60_000 - logged);
        // Every line left out is reported, but the 99 after the last line.
        assert_eq!(log.not_logged() - reported, 99);
    }

    #[test]
    fn tokens_come_back_one_interval_at_a_time() {
        let log = LogBudget::new(4);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        for _ in 0..4 {
            assert!(log.admit(t0).is_some());
        }
        assert_eq!(log.admit(ms(249)), None);
        assert_eq!(log.admit(ms(250)), Some(1));
        assert_eq!(log.admit(ms(251)), None);
        // A quiet stretch fills the bucket, never beyond its depth.
        for _ in 0..4 {
            assert!(log.admit(ms(60_000)).is_some());
        }
        assert_eq!(log.admit(ms(60_000)), None);
    }

    #[test]
    fn time_going_backwards_takes_nothing_extra() {
        let log = LogBudget::new(2);
        let t0 = Instant::now() + Duration::from_secs(10);
        assert!(log.admit(t0).is_some());
        assert!(log.admit(t0).is_some());
        assert_eq!(log.admit(t0 - Duration::from_secs(5)), None);
    }

    #[test]
    fn a_zero_budget_logs_nothing() {
        let log = LogBudget::new(0);
        let t0 = Instant::now();
        for i in 0..10 {
            assert_eq!(log.judge(t0 + Duration::from_secs(i)), Verdict::LeaveOut);
        }
        assert_eq!(log.not_logged(), 10);
    }
}
