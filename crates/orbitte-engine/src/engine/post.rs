//! Posting without the state lock.
//!
//! Under the state lock the core hands out work (`State::pump` collects
//! it). Before the lock is released ([`StateGuard`](super::StateGuard)),
//! its holder takes the post lock of every rail that work is for
//! ([`State::take_posts`]), releases the state lock, posts, and drops each
//! rail's post lock after posting to it. Only the state lock's holder takes
//! a post lock, so each rail is posted in the order the core handed its
//! items out (which selective signaling relies on: a completion implies
//! the items posted before it), while other threads use the state. A
//! thread holding a post lock takes no lock but the rail's own queue pair
//! and the transport's internal ones, so the state lock's holder may wait
//! for a post lock (a flush or close of that rail does, see
//! `State::flush_and_reap`).
//!
//! What a post finds (a post that stopped early, events of items the
//! transport executed while they were posted) goes onto the intake before
//! the rail's post lock is dropped, so the core learns it before any later
//! event of that rail: a later post to the rail needs that lock, and its
//! completions reach the core through the intake behind it, or from a
//! thread that polls the completion queue under the state lock, which
//! drains the intake when it takes the lock (`Shared::lock`).

use std::sync::{Arc, Mutex, MutexGuard};

use super::State;
use super::arrivals::{Arrival, Intake};
use super::snapshot::TablesSnapshot;
use super::target::{Target, lock_lane};
use crate::request::Posting;
use crate::transport::{PostError, RailId, TransportEvent, WorkItem};

/// Work taken from the state to post after the lock is released; reused
/// from release to release (the engine keeps a few).
#[derive(Debug, Default)]
pub(crate) struct Posts {
    work: Vec<WorkItem>,
    runs: Vec<Run>,
    /// The post lock of each run's rail.
    lanes: Vec<Arc<Mutex<()>>>,
    done: Vec<TransportEvent>,
    snapshot: Option<Arc<TablesSnapshot>>,
    /// Whether the transports may execute items while they are posted.
    posting: Posting,
}

/// The items of one rail in `Posts::work`.
#[derive(Debug)]
struct Run {
    rail: RailId,
    start: usize,
    end: usize,
    target: Target,
}

impl Posts {
    /// Whether there is nothing to post.
    pub(crate) fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Takes the post lock of every rail, releases the state lock `state`,
    /// and posts every run, putting what it finds on `intake` before
    /// dropping that run's post lock. Leaves `self` empty for reuse.
    pub(crate) fn post_unlocked<T>(&mut self, state: MutexGuard<'_, T>, intake: &Intake) {
        let held: Vec<MutexGuard<'_, ()>> = self.lanes.iter().map(|l| lock_lane(l)).collect();
        drop(state);
        let empty = TablesSnapshot::default();
        let ctx: &TablesSnapshot = self.snapshot.as_deref().unwrap_or(&empty);
        for (run, guard) in self.runs.iter().zip(held) {
            let items = &self.work[run.start..run.end];
            let res = run
                .target
                .post(run.rail, items, ctx, self.posting, &mut self.done);
            if let Err(e) = res {
                let posted = e.posted.min(items.len());
                intake.push(Arrival::PostFailed {
                    error: PostError { posted: 0, ..e },
                    items: items[posted..].to_vec(),
                });
            }
            intake.push_events(&mut self.done);
            drop(guard);
        }
        self.work.clear();
        self.runs.clear();
        self.lanes.clear();
        self.snapshot = None;
        self.posting = Posting::Inline;
    }
}

impl State {
    /// Moves the work the core handed out into `posts`, one run per rail
    /// (a rail's items keep their order), with each rail's post lock and
    /// transport and the tables' current copy. `posts` must be empty.
    pub(crate) fn take_posts(&mut self, posts: &mut Posts) {
        if self.work.is_empty() {
            return;
        }
        std::mem::swap(&mut self.work, &mut posts.work);
        posts.posting = std::mem::take(&mut self.posting);
        self.cut_runs(posts);
        let runs = &posts.runs;
        let repeated = runs
            .iter()
            .enumerate()
            .any(|(i, r)| runs[..i].iter().any(|q| q.rail == r.rail));
        if repeated {
            // Several pumps in one hold of the lock handed out runs for
            // the same rail: one run per rail, in order (the sort is
            // stable).
            posts.runs.clear();
            posts.lanes.clear();
            posts.work.sort_by_key(|w| w.rail);
            self.cut_runs(posts);
        }
        posts.snapshot = Some(self.snapshot.clone());
    }

    /// Cuts `posts.work` into runs of one rail each.
    fn cut_runs(&self, posts: &mut Posts) {
        let work = &posts.work;
        let mut start = 0;
        while start < work.len() {
            let rail = work[start].rail;
            let end = work[start..]
                .iter()
                .position(|w| w.rail != rail)
                .map_or(work.len(), |p| start + p);
            posts.runs.push(Run {
                rail,
                start,
                end,
                target: self.target(rail),
            });
            posts.lanes.push(self.lane(rail));
            start = end;
        }
    }
}
