//! What a tcp data session did last: stamped by the thread serving it,
//! read by newcomers that look for the longest-idle session to evict.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What one tcp data session did last, kept by the thread serving it and
/// read by newcomers looking for a slot when `max_sessions` are taken.
#[derive(Debug)]
pub(crate) struct SessionActivity {
    start: Instant,
    /// Milliseconds from `start` to the last request taken in or answered.
    last: AtomicU64,
    /// A request is being served now.
    busy: AtomicBool,
    /// A newcomer took this session's slot: it says goodbye when it is
    /// next idle.
    evict: AtomicBool,
}

impl SessionActivity {
    pub(crate) fn new() -> Self {
        Self {
            start: Instant::now(),
            last: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            evict: AtomicBool::new(false),
        }
    }

    /// Now is the last time it did something.
    pub(crate) fn stamp(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Release);
    }

    /// A request (or any frame) was taken in.
    pub(crate) fn began(&self) {
        self.busy.store(true, Ordering::Release);
    }

    /// Its answer is done.
    pub(crate) fn ended(&self) {
        self.stamp();
        self.busy.store(false, Ordering::Release);
    }

    /// A newcomer takes this session's slot: it says goodbye when next idle.
    pub(crate) fn evict(&self) {
        self.evict.store(true, Ordering::Release);
    }

    /// Whether a newcomer took this session's slot.
    pub(crate) fn evicted(&self) -> bool {
        self.evict.load(Ordering::Acquire)
    }

    /// How long it has been idle; `None` while it serves a request.
    pub(crate) fn idle(&self) -> Option<Duration> {
        if self.busy.load(Ordering::Acquire) {
            return None;
        }
        let last = Duration::from_millis(self.last.load(Ordering::Acquire));
        Some(self.start.elapsed().saturating_sub(last))
    }
}
