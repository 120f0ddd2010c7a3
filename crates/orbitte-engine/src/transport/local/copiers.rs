//! The local path's copy workers: a bounded set of threads that copy
//! what posts queued on the rails (beyond what a post copies on its own
//! thread), shared by every rail of a local transport; what serving a
//! rail means is the transport's ([`Serve`]).
//!
//! A rail with work queued is scheduled once (its queue's `scheduled`
//! flag stays set while it waits in the run queue or a worker holds it), so
//! only one worker copies a rail's items at a time and they complete in
//! posting order. A worker takes everything queued on the rail at once,
//! copies and reports it, and puts the rail at the back of the run queue
//! when more was queued meanwhile: busy rails take turns, one batch each.
//! Workers start as rails are scheduled, up to the bound, and end after
//! [`WORKER_IDLE`] with no rail to serve, so idle rails hold no thread
//! and a thousand busy rails hold no more than the bound.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

/// What the workers run: a rail with work queued, served one batch at a
/// time.
pub(super) trait Serve: Send + 'static {
    /// Shared by every worker (the transport's event sink).
    type Ctx: Send + Sync + 'static;
    /// Each worker's own buffers, kept from one batch to the next.
    type Scratch: Default;
    /// Serves one batch; whether it goes to the back of the run queue
    /// again (more is queued, or its end is still to be reported).
    fn serve(&self, ctx: &Self::Ctx, scratch: &mut Self::Scratch) -> bool;
    /// Fails what is queued: no worker can be started to serve it.
    fn fail(&self, ctx: &Self::Ctx, reason: &Arc<str>);
}

/// How long a copy worker with no rail to serve waits before it ends (the
/// next rail scheduled starts one again).
const WORKER_IDLE: std::time::Duration = crate::io_pool::PARK_AFTER;

struct Runs<S> {
    ready: VecDeque<S>,
    /// Workers running (or being started).
    workers: usize,
    /// Of those, the ones waiting for a rail.
    waiting: usize,
}

/// The copy workers of one local transport.
pub(super) struct Copiers<S: Serve> {
    max: usize,
    runs: Mutex<Runs<S>>,
    cv: Condvar,
    ctx: S::Ctx,
}

impl<S: Serve> std::fmt::Debug for Copiers<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Copiers")
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl<S: Serve> Copiers<S> {
    /// At most `max` workers (at least one), sharing `ctx`.
    pub(super) fn new(max: usize, ctx: S::Ctx) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            runs: Mutex::new(Runs {
                ready: VecDeque::new(),
                workers: 0,
                waiting: 0,
            }),
            cv: Condvar::new(),
            ctx,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Runs<S>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `job` (a rail just marked scheduled) in the run queue, waking
    /// a waiting worker or starting one when none waits and the bound
    /// allows.
    pub(super) fn schedule(self: &Arc<Self>, job: S) {
        let mut runs = self.lock();
        runs.ready.push_back(job);
        if runs.waiting >= runs.ready.len() {
            // A waiting worker takes it; one woken but not yet running
            // counts as waiting until it takes its rail, so every rail in
            // the queue has a waiter of its own before none is started.
            drop(runs);
            self.cv.notify_one();
            return;
        }
        if runs.workers >= self.max {
            // A busy worker takes it after its current rail.
            return;
        }
        runs.workers += 1;
        let n = runs.workers;
        drop(runs);
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("orbitte-local-copy-{n}"))
            .spawn(move || me.work());
        if let Err(e) = spawned {
            let orphans = {
                let mut runs = self.lock();
                runs.workers -= 1;
                if runs.workers == 0 {
                    std::mem::take(&mut runs.ready)
                } else {
                    // The running workers serve the queue.
                    VecDeque::new()
                }
            };
            if !orphans.is_empty() || n == 1 {
                tracing::warn!(error = %e, "cannot start a local copy worker");
            }
            let reason: Arc<str> = format!("cannot start the local path's copy worker: {e}").into();
            for job in orphans {
                job.fail(&self.ctx, &reason);
            }
        }
    }

    fn work(self: Arc<Self>) {
        let mut scratch = S::Scratch::default();
        loop {
            let next = {
                let mut runs = self.lock();
                loop {
                    if let Some(next) = runs.ready.pop_front() {
                        break Some(next);
                    }
                    runs.waiting += 1;
                    let (g, waited) = self
                        .cv
                        .wait_timeout(runs, WORKER_IDLE)
                        .unwrap_or_else(|p| p.into_inner());
                    runs = g;
                    runs.waiting -= 1;
                    if waited.timed_out() && runs.ready.is_empty() {
                        runs.workers -= 1;
                        break None;
                    }
                }
            };
            let Some(job) = next else { return };
            if job.serve(&self.ctx, &mut scratch) {
                self.lock().ready.push_back(job);
            }
        }
    }
}
