//! What every baseline shares: the shape of the work it repeats, the
//! sample it gives, and the timed run its threads work in.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The shape of the work the path does, which a baseline repeats.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) block: usize,
    /// Requests per batch.
    pub(crate) batch: usize,
    pub(crate) threads: usize,
    /// Connections the path uses (tcp rails; at least `threads`).
    pub(crate) connections: usize,
    pub(crate) duration: Duration,
}

/// One measurement of a baseline.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) gbps: f64,
    pub(crate) seconds: f64,
}

/// Runs `work(thread, stop, ready)` on `n` threads. Each warms up, calls
/// `ready()`, then works until `stop` is set and returns the bytes it
/// moved after `ready()`. The clock runs for `duration` from the moment
/// every thread is ready. Returns the bytes and the elapsed time.
pub(crate) fn timed<W>(n: usize, duration: Duration, work: W) -> std::io::Result<(u64, Duration)>
where
    W: Fn(usize, &AtomicBool, &dyn Fn()) -> std::io::Result<u64> + Sync,
{
    let stop = AtomicBool::new(false);
    let bytes = AtomicU64::new(0);
    let ready = Barrier::new(n + 1);
    let mut first_error = None;
    let mut start = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|t| {
                let (stop, bytes, ready, work) = (&stop, &bytes, &ready, &work);
                s.spawn(move || {
                    let waited = std::cell::Cell::new(false);
                    let go = || {
                        if !waited.replace(true) {
                            ready.wait();
                        }
                    };
                    let r = work(t, stop, &go);
                    // A thread that failed before it was ready still
                    // releases the start.
                    go();
                    if let Ok(b) = r {
                        bytes.fetch_add(b, Ordering::Relaxed);
                    }
                    r.map(drop)
                })
            })
            .collect();
        ready.wait();
        start = Instant::now();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            match h.join() {
                Ok(Err(e)) => first_error = first_error.take().or(Some(e)),
                Err(_) => {
                    first_error = first_error
                        .take()
                        .or_else(|| Some(std::io::Error::other("a baseline thread panicked")))
                }
                Ok(Ok(())) => {}
            }
        }
    });
    let elapsed = start.elapsed();
    match first_error {
        Some(e) => Err(e),
        None => Ok((bytes.load(Ordering::Relaxed), elapsed)),
    }
}

/// A baseline thread's work inside [`timed`]: one untimed `batch` (the
/// warm-up), `ready()`, then batches until `stop`; returns the bytes of
/// the timed ones (each `batch` returns its own).
pub(crate) fn until_stopped(
    stop: &AtomicBool,
    ready: &dyn Fn(),
    mut batch: impl FnMut() -> std::io::Result<u64>,
) -> std::io::Result<u64> {
    batch()?;
    ready();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += batch()?;
    }
    Ok(n)
}
