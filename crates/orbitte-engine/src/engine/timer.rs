//! The timer thread: expires deadlines on the core's schedule.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Shared;

pub(super) fn timer_loop(shared: &Shared) {
    while !shared.stop.load(Ordering::Acquire) {
        let mut st = shared.lock();
        let now = Instant::now();
        st.expire(now);
        st.pump(now);
        let next = st
            .engine
            .poll_timeout()
            .map_or(Duration::from_millis(50), |t| {
                t.saturating_duration_since(now)
            });
        drop(st);
        shared.sleep(next.clamp(Duration::from_millis(1), Duration::from_millis(50)));
    }
}
