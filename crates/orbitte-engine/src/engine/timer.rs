//! The timer thread: expires deadlines on the core's schedule.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Shared;

pub(super) fn timer_loop(shared: &Shared) {
    let mut st = shared.lock();
    while !shared.stop.load(Ordering::Acquire) {
        let now = Instant::now();
        st.core.handle_timeout(now);
        st.pump(now);
        shared.cond.notify_all();
        let next = st
            .core
            .poll_timeout()
            .map_or(Duration::from_millis(50), |t| {
                t.saturating_duration_since(now)
            });
        let wait = next.clamp(Duration::from_millis(1), Duration::from_millis(50));
        st = shared
            .timer
            .wait_timeout(st, wait)
            .map_or_else(|e| e.into_inner().0, |(g, _)| g);
    }
}
