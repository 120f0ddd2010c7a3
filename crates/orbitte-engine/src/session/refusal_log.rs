//! How a target logs refused and abnormally closed sessions: at most a
//! fixed number per second, so a flood of bad connections cannot flood the
//! log. The refusals left out are counted; the count is logged with the
//! next refusal that is logged, and kept in the listener's stats.
//!
//! Peer-supplied text in these lines (source ids, messages) is escaped by
//! the wire types' `Display`, and reasons are logged with `?` (quoted and
//! escaped) on top.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What to do with one refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Log it; `left_out` refusals were not logged since the last line.
    Log {
        /// Refusals counted but not logged before this one.
        left_out: u64,
    },
    /// Count it, do not log it.
    LeaveOut,
}

#[derive(Debug)]
struct Window {
    start: Option<Instant>,
    logged: u32,
    left_out: u64,
}

/// A per-second budget of refusal log lines. Time is an argument, so the
/// budget is tested without a clock.
#[derive(Debug)]
pub(crate) struct RefusalLog {
    per_second: u32,
    window: Mutex<Window>,
}

impl RefusalLog {
    pub(crate) fn new(per_second: u32) -> Self {
        Self {
            per_second,
            window: Mutex::new(Window {
                start: None,
                logged: 0,
                left_out: 0,
            }),
        }
    }

    /// Judges one refusal at `now`.
    pub(crate) fn judge(&self, now: Instant) -> Verdict {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let expired = w
            .start
            .is_none_or(|s| now.saturating_duration_since(s) >= Duration::from_secs(1));
        if expired {
            w.start = Some(now);
            w.logged = 0;
        }
        if w.logged < self.per_second {
            w.logged += 1;
            Verdict::Log {
                left_out: std::mem::take(&mut w.left_out),
            }
        } else {
            w.left_out += 1;
            Verdict::LeaveOut
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_the_budget_then_counts_and_reports_the_rest() {
        let log = RefusalLog::new(3);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        for i in 0..3 {
            assert_eq!(log.judge(ms(i)), Verdict::Log { left_out: 0 });
        }
        for i in 3..100 {
            assert_eq!(log.judge(ms(i)), Verdict::LeaveOut);
        }
        // A new second: the count of those left out comes with the next line.
        assert_eq!(log.judge(ms(1000)), Verdict::Log { left_out: 97 });
        assert_eq!(log.judge(ms(1001)), Verdict::Log { left_out: 0 });
        assert_eq!(log.judge(ms(1002)), Verdict::Log { left_out: 0 });
        assert_eq!(log.judge(ms(1003)), Verdict::LeaveOut);
        assert_eq!(log.judge(ms(5000)), Verdict::Log { left_out: 1 });
    }

    #[test]
    fn a_zero_budget_logs_nothing() {
        let log = RefusalLog::new(0);
        let t0 = Instant::now();
        for i in 0..10 {
            assert_eq!(log.judge(t0 + Duration::from_secs(i)), Verdict::LeaveOut);
        }
    }
}
