//! Core tests with virtual time and a scripted transport that moves real
//! bytes between two vectors, so every outcome is checked against data.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::{PathKind, PeerId, RangeId, RegistrationId};

const SLICE: u32 = 1024;

fn config() -> CoreConfig {
    CoreConfig {
        slice_size: SLICE,
        tcp_slice_size: 0,
        request_timeout: Duration::from_millis(100),
        drain_timeout: Duration::from_millis(50),
    }
}

fn spec(nic: u32, depth: u32, interval: u32) -> RailSpec {
    RailSpec {
        path: PathKind::Rdma,
        peer: PeerId(1),
        nic: Some(nic),
        remote_nic: Some(nic),
        max_in_flight: depth,
        signal_interval: interval,
    }
}

fn req(op: Op, off: u64, len: u64, rails: &[RailId], keep: &Arc<()>) -> CoreRequest {
    CoreRequest {
        label: off,
        op,
        registration: RegistrationId(1),
        local_offset: off,
        peer: PeerId(1),
        range: RangeId(7),
        remote_offset: off,
        len,
        rails: rails.into(),
        keepalive: Some(keep.clone() as Arc<dyn Any + Send + Sync>),
    }
}

/// What the scripted NIC does with the next item of a rail.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Ok,
    /// Executes half the bytes, then reports an error completion.
    ErrorHalf,
    /// Never reports (until flushed).
    Hang,
}

/// Two "hosts" (local and remote byte vectors) and per-rail send queues.
struct Harness {
    core: Core,
    now: Instant,
    local: Vec<u8>,
    remote: Vec<u8>,
    queues: Vec<VecDeque<(WorkItem, bool)>>,
    /// Rail is in error: remaining items are flushed.
    broken: Vec<bool>,
    outcomes: Vec<Outcome>,
    work: Vec<WorkItem>,
    posts: usize,
    /// The next post accepts only this many items, then fails.
    fail_next_post: Option<usize>,
}

impl Harness {
    fn new(rails: &[RailSpec], size: usize) -> (Self, Vec<RailId>) {
        let mut core = Core::new(config());
        let ids = rails
            .iter()
            .map(|s| core.add_rail(s.clone()))
            .collect::<Vec<_>>();
        let local = (0..size).map(|i| (i * 7 + 3) as u8).collect();
        let remote = (0..size).map(|i| (i * 13 + 1) as u8).collect();
        let h = Self {
            core,
            now: Instant::now(),
            local,
            remote,
            queues: vec![VecDeque::new(); rails.len()],
            broken: vec![false; rails.len()],
            outcomes: Vec::new(),
            work: Vec::new(),
            posts: 0,
            fail_next_post: None,
        };
        (h, ids)
    }

    fn pump(&mut self) {
        self.work.clear();
        self.core.poll_work(&mut self.work);
        let mut start = 0;
        while start < self.work.len() {
            let rail = self.work[start].rail;
            let end = self.work[start..]
                .iter()
                .position(|w| w.rail != rail)
                .map_or(self.work.len(), |p| start + p);
            // Every run ends signaled (selective signaling rule).
            assert!(self.work[end - 1].signaled);
            self.posts += 1;
            let accepted = self
                .fail_next_post
                .take()
                .map_or(end - start, |k| k.min(end - start));
            for w in &self.work[start..start + accepted] {
                self.queues[rail.0 as usize].push_back((*w, false));
            }
            if accepted < end - start {
                let err = PostError {
                    rail,
                    posted: accepted,
                    reason: "injected post failure".into(),
                };
                let run = self.work[start..end].to_vec();
                self.core.handle_post_error(self.now, &err, &run);
            }
            start = end;
        }
        while let Some(o) = self.core.poll_outcome() {
            self.outcomes.push(o);
        }
        while let Some((r, marker)) = self.core.poll_flush(self.now) {
            self.flush_marked(r, marker);
        }
    }

    fn copy(&mut self, w: &WorkItem, len: u64) {
        let (l, r) = (w.local_offset as usize, w.remote_offset as usize);
        let n = len as usize;
        match w.op {
            Op::Write => {
                let src = self.local[l..l + n].to_vec();
                self.remote[r..r + n].copy_from_slice(&src);
            }
            Op::Read => {
                let src = self.remote[r..r + n].to_vec();
                self.local[l..l + n].copy_from_slice(&src);
            }
        }
    }

    /// Executes the head item of `rail` with `fate`; reports it if
    /// signaled (or failed). Returns false if nothing was queued.
    fn step(&mut self, rail: usize, fate: Fate) -> bool {
        let Some((w, _)) = self.queues[rail].front().copied() else {
            return false;
        };
        if self.broken[rail] {
            self.queues[rail].pop_front();
            self.report(w, SliceStatus::Failed(SliceFailure::Flushed));
            return true;
        }
        match fate {
            Fate::Hang => {
                self.queues[rail].front_mut().unwrap().1 = true;
                return false;
            }
            Fate::Ok => {
                self.queues[rail].pop_front();
                self.copy(&w, u64::from(w.len));
                if w.signaled {
                    self.report(w, SliceStatus::Success);
                }
            }
            Fate::ErrorHalf => {
                self.queues[rail].pop_front();
                self.copy(&w, u64::from(w.len / 2));
                self.broken[rail] = true;
                let status = SliceFailure::Completion {
                    status: "IBV_WC_RETRY_EXC_ERR".into(),
                    code: 12,
                };
                self.report(w, SliceStatus::Failed(status));
            }
        }
        true
    }

    fn report(&mut self, w: WorkItem, status: SliceStatus) {
        let ev = TransportEvent::Completed {
            rail: w.rail,
            token: w.token,
            status,
            released: true,
        };
        self.core.handle_event(self.now, ev);
    }

    /// The driver's flush: QP to error, then a signaled marker (flushed
    /// after everything queued before it).
    fn flush_marked(&mut self, rail: RailId, marker: SliceToken) {
        self.broken[rail.0 as usize] = true;
        let m = WorkItem {
            token: marker,
            rail,
            op: Op::Write,
            registration: RegistrationId(0),
            local_offset: 0,
            peer: PeerId(0),
            range: RangeId(0),
            remote_offset: 0,
            len: 0,
            signaled: true,
        };
        self.queues[rail.0 as usize].push_back((m, false));
        self.flush(rail);
    }

    /// QP to error (a device error or the flush): every queued item
    /// reports flushed; items that ran unsignaled report nothing.
    fn flush(&mut self, rail: RailId) {
        self.broken[rail.0 as usize] = true;
        while self.step(rail.0 as usize, Fate::Ok) {}
    }

    /// The transport reports `rail` down.
    fn rail_down(&mut self, rail: RailId, reason: &str) {
        self.core.handle_event(
            self.now,
            TransportEvent::RailDown {
                rail,
                reason: reason.into(),
            },
        );
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.core.handle_timeout(self.now);
        self.pump();
    }

    fn run_ok(&mut self) {
        loop {
            self.pump();
            let mut any = false;
            for r in 0..self.queues.len() {
                while self.step(r, Fate::Ok) {
                    any = true;
                }
            }
            if !any {
                self.pump();
                break;
            }
        }
    }
}

#[test]
fn slices_stripe_over_rails_and_data_arrives() {
    let (mut h, rails) = Harness::new(&[spec(0, 4, 2), spec(1, 4, 2)], 64 * 1024);
    let keep = Arc::new(());
    let ids = h
        .core
        .submit(h.now, vec![req(Op::Write, 0, 10 * 1024 + 5, &rails, &keep)])
        .unwrap();
    h.pump();
    // Bounded in flight: 4 per rail.
    assert_eq!(h.queues[0].len(), 4);
    assert_eq!(h.queues[1].len(), 4);
    assert!(
        h.queues[0]
            .iter()
            .all(|(w, _)| (w.local_offset / 1024) % 2 == 0)
    );
    h.run_ok();
    let o = &h.outcomes[0];
    assert_eq!(o.request, ids[0]);
    assert_eq!(o.status, Status::Complete);
    assert_eq!(o.completed_prefix, 10 * 1024 + 5);
    assert_eq!(o.slices, 11);
    assert_eq!(o.remote_effect, RemoteEffect::Complete);
    assert_eq!(o.drain, DrainStatus::Drained);
    assert_eq!(h.local[..10 * 1024 + 5], h.remote[..10 * 1024 + 5]);
    assert_ne!(h.local[10 * 1024 + 5], h.remote[10 * 1024 + 5]);
    assert_eq!(
        Arc::strong_count(&keep),
        1,
        "keepalive released after drain"
    );
    assert_eq!(h.core.live_requests(), 0);
}

#[test]
fn selective_signaling_signals_every_interval_and_each_run_end() {
    let (mut h, rails) = Harness::new(&[spec(0, 16, 4)], 64 * 1024);
    let keep = Arc::new(());
    h.core
        .submit(h.now, vec![req(Op::Read, 0, 10 * 1024, &rails, &keep)])
        .unwrap();
    h.pump();
    let signaled: Vec<bool> = h.queues[0].iter().map(|(w, _)| w.signaled).collect();
    assert_eq!(
        signaled,
        [
            false, false, false, true, false, false, false, true, false, true
        ],
        "every 4th and the last of the doorbell"
    );
    assert_eq!(h.posts, 1, "one doorbell for the run");
    h.run_ok();
    assert!(h.outcomes[0].is_complete());
    assert_eq!(h.local[..10 * 1024], h.remote[..10 * 1024]);
}

#[test]
fn completed_prefix_counts_only_contiguous_slices() {
    let (mut h, rails) = Harness::new(&[spec(0, 8, 1), spec(1, 8, 1)], 64 * 1024);
    let keep = Arc::new(());
    h.core
        .submit(h.now, vec![req(Op::Write, 0, 4 * 1024, &rails, &keep)])
        .unwrap();
    h.pump();
    // Rail 1 (slices 1, 3) completes; rail 0 hangs on slice 0.
    while h.step(1, Fate::Ok) {}
    h.step(0, Fate::Hang);
    h.advance(Duration::from_millis(101));
    let o = h.outcomes[0].clone();
    assert_eq!(o.status, Status::TimedOut);
    assert_eq!(o.completed_prefix, 0);
    assert_eq!(o.remote_effect, RemoteEffect::Possible { bytes: 0..4096 });
    assert_eq!(o.drain, DrainStatus::Pending { slices: 2 });
    // Logical timeout: still undrained, memory still held.
    assert_eq!(Arc::strong_count(&keep), 2);
    // Drain deadline: the core asks for rail 0 to be flushed.
    h.advance(Duration::from_millis(51));
    assert_eq!(h.core.drain_status(o.request), DrainStatus::Drained);
    assert_eq!(Arc::strong_count(&keep), 1);
    assert!(
        !h.core.rail_is_up(rails[0]),
        "a flushed rail takes no new work"
    );
    assert!(h.core.rail_is_up(rails[1]));
}

#[test]
fn a_rail_reporting_every_item_completes_only_the_item_reported() {
    // Signal interval 1 (tcp, local): the peer may answer in any order, so
    // a completion says nothing about the items posted before it.
    let (mut h, rails) = Harness::new(&[spec(0, 8, 1)], 64 * 1024);
    let keep = Arc::new(());
    h.core
        .submit(
            h.now,
            vec![
                req(Op::Read, 0, 1024, &rails, &keep),
                req(Op::Read, 1024, 1024, &rails, &keep),
            ],
        )
        .unwrap();
    h.pump();
    let (first, _) = h.queues[0].pop_front().unwrap();
    let (second, _) = h.queues[0].pop_front().unwrap();
    h.copy(&second, 1024);
    h.report(second, SliceStatus::Success);
    h.pump();
    let done: Vec<u64> = h.outcomes.iter().map(|o| o.label).collect();
    assert_eq!(
        done,
        [1024],
        "only the second request, whose item was reported"
    );
    assert_eq!(
        h.core.rail_in_flight(rails[0]),
        1,
        "the first item is still in flight"
    );
    h.copy(&first, 1024);
    h.report(first, SliceStatus::Success);
    h.pump();
    assert_eq!(h.outcomes.len(), 2);
    assert!(h.outcomes.iter().all(Outcome::is_complete));
    assert_eq!(h.local[..2048], h.remote[..2048]);
}

#[test]
fn error_completion_fails_request_without_replay_on_other_rail() {
    let (mut h, rails) = Harness::new(&[spec(0, 8, 1), spec(1, 8, 1)], 64 * 1024);
    let keep = Arc::new(());
    h.core
        .submit(h.now, vec![req(Op::Write, 0, 8 * 1024, &rails, &keep)])
        .unwrap();
    h.pump();
    let posted_before: usize = h.queues.iter().map(VecDeque::len).sum();
    assert!(h.step(0, Fate::Ok));
    assert!(h.step(0, Fate::ErrorHalf)); // slice 2 fails
    while h.step(0, Fate::Ok) {} // flushed
    while h.step(1, Fate::Ok) {}
    h.pump();
    let o = &h.outcomes[0];
    assert_eq!(o.status, Status::Failed);
    let f = o.failure.as_ref().unwrap();
    assert_eq!(
        (f.slice, f.rail, f.nic),
        (2, Some(rails[0]), Some(orbitte_topology::NicId(0)))
    );
    assert!(matches!(
        f.status,
        SliceFailure::Completion { code: 12, .. }
    ));
    assert_eq!(o.completed_prefix, 2 * 1024);
    assert_eq!(h.local[..2048], h.remote[..2048]);
    assert!(matches!(o.remote_effect, RemoteEffect::Possible { .. }));
    assert_eq!(o.drain, DrainStatus::Drained);
    // Nothing was re-posted on rail 1.
    assert_eq!(posted_before, 8);
    assert!(h.queues.iter().all(VecDeque::is_empty));
}

#[test]
fn rail_down_mid_batch_fails_waiting_requests() {
    let (mut h, rails) = Harness::new(&[spec(0, 2, 1), spec(1, 2, 1)], 64 * 1024);
    let keep = Arc::new(());
    let ids = h
        .core
        .submit(
            h.now,
            vec![
                req(Op::Write, 0, 8 * 1024, &rails, &keep),
                req(Op::Read, 8192, 1024, &rails, &keep),
            ],
        )
        .unwrap();
    h.pump();
    h.rail_down(rails[1], "port 1 PAUSED");
    h.flush(rails[1]);
    h.run_ok();
    assert_eq!(h.outcomes.len(), 2);
    let w = h.outcomes.iter().find(|o| o.request == ids[0]).unwrap();
    assert_eq!(w.status, Status::Failed, "{w:?}");
    assert_eq!(w.drain, DrainStatus::Drained);
    let f = w.failure.as_ref().unwrap();
    assert_eq!(f.rail, Some(rails[1]));
    // Slices of rail 0 still completed; nothing moved to rail 0 from rail 1.
    assert_eq!(w.completed_prefix, 1024);
    assert_eq!(h.local[..1024], h.remote[..1024]);
    // The one-slice READ was striped onto rail 0 only: it completes.
    let r = h.outcomes.iter().find(|o| o.request == ids[1]).unwrap();
    assert_eq!(r.status, Status::Complete);
    assert_eq!(
        r.remote_effect,
        RemoteEffect::None,
        "a READ never changes remote bytes"
    );
    // A new request on the down rail is refused at submit.
    let err = h
        .core
        .submit(h.now, vec![req(Op::Write, 0, 1, &rails, &keep)])
        .unwrap_err();
    assert!(
        matches!(
            err,
            SubmitError::Invalid {
                error: RequestError::NoRail { .. },
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(Arc::strong_count(&keep), 1);
}

#[test]
fn a_request_taken_in_after_its_rail_went_down_fails_at_once_and_posts_nothing() {
    let (mut h, rails) = Harness::new(&[spec(0, 4, 1), spec(1, 4, 1)], 64 * 1024);
    let keep = Arc::new(());
    let batch = vec![
        req(Op::Write, 0, 1024, &rails[..1], &keep),
        req(Op::Write, 4096, 4096, &rails, &keep),
        req(Op::Read, 8192, 2048, &rails[..1], &keep),
    ];
    h.core.check(&batch).unwrap();
    // The driver took the first request in and posted it; rail 1 went
    // down before it took the rest in.
    let mut ids = Vec::new();
    let mut rest = batch.into_iter();
    h.core.insert(h.now, rest.by_ref().take(1), &mut ids);
    h.pump();
    h.rail_down(rails[1], "port 1 PAUSED");
    h.core.insert(h.now, rest, &mut ids);
    assert_eq!(ids.len(), 3);
    h.pump();
    h.run_ok();
    assert_eq!(h.outcomes.len(), 3);
    let by = |id| h.outcomes.iter().find(|o| o.request == id).unwrap();
    assert_eq!(by(ids[0]).status, Status::Complete);
    assert_eq!(by(ids[2]).status, Status::Complete);
    // Striped over both rails, with rail 1 down: it fails before any
    // slice is posted, without waiting for its request timeout.
    let o = by(ids[1]);
    assert_eq!(o.status, Status::Failed, "{o:?}");
    assert_eq!(o.remote_effect, RemoteEffect::None);
    assert_eq!(o.completed_prefix, 0);
    assert_eq!(o.drain, DrainStatus::Drained);
    let f = o.failure.as_ref().unwrap();
    assert_eq!(f.rail, Some(rails[1]));
    assert!(matches!(&f.status, SliceFailure::RailDown(r) if r.contains("PAUSED")));
    assert_eq!(h.local[..1024], h.remote[..1024]);
    assert_ne!(
        h.local[4096..8192],
        h.remote[4096..8192],
        "nothing of it moved"
    );
    assert_eq!(h.core.live_requests(), 0);
}

#[test]
fn cancel_is_logical_and_drain_is_separate() {
    let (mut h, rails) = Harness::new(&[spec(0, 2, 1)], 64 * 1024);
    let keep = Arc::new(());
    let ids = h
        .core
        .submit(h.now, vec![req(Op::Write, 0, 8 * 1024, &rails, &keep)])
        .unwrap();
    h.pump();
    assert!(h.core.cancel(h.now, ids[0]));
    assert!(!h.core.cancel(h.now, ids[0]), "already has its outcome");
    h.pump();
    assert_eq!(h.outcomes[0].status, Status::Cancelled);
    assert_eq!(h.outcomes[0].drain, DrainStatus::Pending { slices: 2 });
    assert_eq!(
        h.core.drain_status(ids[0]),
        DrainStatus::Pending { slices: 2 }
    );
    h.run_ok();
    assert_eq!(h.outcomes.len(), 1, "one outcome per request");
    assert_eq!(h.core.drain_status(ids[0]), DrainStatus::Drained);
    // Only the two posted slices ever moved.
    assert_eq!(h.local[..2048], h.remote[..2048]);
    assert_ne!(h.local[2048..4096], h.remote[2048..4096]);
}

#[test]
fn post_failure_fails_unposted_items_and_takes_rail_down() {
    let (mut h, rails) = Harness::new(&[spec(0, 4, 1)], 64 * 1024);
    let keep = Arc::new(());
    h.core
        .submit(h.now, vec![req(Op::Write, 0, 4 * 1024, &rails, &keep)])
        .unwrap();
    let mut work = Vec::new();
    h.core.poll_work(&mut work);
    assert_eq!(work.len(), 4);
    let err = PostError {
        rail: rails[0],
        posted: 1,
        reason: "ENOMEM".into(),
    };
    h.core.handle_post_error(h.now, &err, &work);
    assert!(!h.core.rail_is_up(rails[0]));
    // The accepted item completes.
    let ev = TransportEvent::Completed {
        rail: rails[0],
        token: work[0].token,
        status: SliceStatus::Success,
        released: true,
    };
    h.core.handle_event(h.now, ev);
    h.pump();
    let o = &h.outcomes[0];
    assert_eq!(o.status, Status::Failed);
    assert_eq!(o.completed_prefix, 1024);
    assert!(matches!(
        o.failure.as_ref().unwrap().status,
        SliceFailure::PostFailed(_)
    ));
    assert_eq!(Arc::strong_count(&keep), 1);
}

#[test]
fn a_post_failure_learned_after_more_work_was_handed_out_keeps_the_later_items() {
    // The driver posts without holding the core: by the time a post's
    // failure comes back, the core may have handed out more of the rail.
    let (mut h, rails) = Harness::new(&[spec(0, 4, 1)], 64 * 1024);
    let keep = Arc::new(());
    h.core
        .submit(h.now, vec![req(Op::Write, 0, 8 * 1024, &rails, &keep)])
        .unwrap();
    let mut first = Vec::new();
    h.core.poll_work(&mut first);
    assert_eq!(first.len(), 4, "the rail's depth");
    let done = |w: &WorkItem| TransportEvent::Completed {
        rail: w.rail,
        token: w.token,
        status: SliceStatus::Success,
        released: true,
    };
    // The first two complete; two more slices are handed out.
    h.core.handle_event(h.now, done(&first[0]));
    h.core.handle_event(h.now, done(&first[1]));
    let mut second = Vec::new();
    h.core.poll_work(&mut second);
    assert_eq!(second.len(), 2);
    // Now the first post's failure arrives: its last two were not posted.
    let err = PostError {
        rail: rails[0],
        posted: 2,
        reason: "ENOMEM".into(),
    };
    h.core.handle_post_error(h.now, &err, &first);
    assert!(!h.core.rail_is_up(rails[0]));
    assert_eq!(
        h.core.outstanding_slices(),
        2,
        "the later items stay in flight"
    );
    // The later items were posted and report; the request drains.
    h.core.handle_event(h.now, done(&second[0]));
    h.core.handle_event(h.now, done(&second[1]));
    h.pump();
    assert_eq!(h.core.outstanding_slices(), 0);
    let o = &h.outcomes[0];
    assert_eq!(o.status, Status::Failed);
    assert_eq!(o.completed_prefix, 2 * 1024);
    assert!(matches!(
        o.failure.as_ref().unwrap().status,
        SliceFailure::PostFailed(_)
    ));
    // The later slices may have written: the uncertain range covers them.
    assert_eq!(o.uncertain, 2 * 1024..6 * 1024);
    assert_eq!(Arc::strong_count(&keep), 1);
}

#[test]
fn unknown_tokens_and_rails_are_ignored() {
    let (mut h, rails) = Harness::new(&[spec(0, 4, 1)], 1024);
    h.core.handle_event(
        h.now,
        TransportEvent::Completed {
            rail: RailId(9),
            token: SliceToken(5),
            status: SliceStatus::Success,
            released: true,
        },
    );
    h.core.handle_event(
        h.now,
        TransportEvent::Completed {
            rail: rails[0],
            token: SliceToken(u64::MAX),
            status: SliceStatus::Success,
            released: true,
        },
    );
    h.core.handle_event(
        h.now,
        TransportEvent::Released {
            rail: rails[0],
            token: SliceToken(3),
        },
    );
    h.pump();
    assert!(h.outcomes.is_empty());
}

#[test]
fn release_after_completion_keeps_request_undrained() {
    let (mut h, rails) = Harness::new(&[spec(0, 4, 1)], 4096);
    let keep = Arc::new(());
    let ids = h
        .core
        .submit(h.now, vec![req(Op::Read, 0, 1024, &rails, &keep)])
        .unwrap();
    let mut work = Vec::new();
    h.core.poll_work(&mut work);
    let t = work[0].token;
    h.core.handle_event(
        h.now,
        TransportEvent::Completed {
            rail: rails[0],
            token: t,
            status: SliceStatus::Success,
            released: false,
        },
    );
    let o = h.core.poll_outcome().unwrap();
    assert_eq!(o.status, Status::Complete);
    assert_eq!(o.drain, DrainStatus::Pending { slices: 1 });
    assert_eq!(Arc::strong_count(&keep), 2);
    h.core.handle_event(
        h.now,
        TransportEvent::Released {
            rail: rails[0],
            token: t,
        },
    );
    assert_eq!(h.core.drain_status(ids[0]), DrainStatus::Drained);
    assert_eq!(Arc::strong_count(&keep), 1);
}

#[test]
fn bad_input_is_refused_whole_batch() {
    let (mut h, rails) = Harness::new(&[spec(0, 4, 1)], 4096);
    let keep = Arc::new(());
    let err = h
        .core
        .submit(
            h.now,
            vec![
                req(Op::Read, 0, 10, &rails, &keep),
                req(Op::Read, 5, 0, &rails, &keep),
            ],
        )
        .unwrap_err();
    assert!(matches!(
        err,
        SubmitError::Invalid {
            index: 1,
            label: 5,
            error: RequestError::ZeroLength
        }
    ));
    let err = h
        .core
        .submit(h.now, vec![req(Op::Read, u64::MAX, 2, &rails, &keep)])
        .unwrap_err();
    assert!(matches!(
        err,
        SubmitError::Invalid {
            error: RequestError::Overflow { .. },
            ..
        }
    ));
    assert!(matches!(
        h.core.submit(h.now, vec![]),
        Err(SubmitError::Empty)
    ));
    h.core.fence("unquiesced: MR destroy failed".into());
    let err = h
        .core
        .submit(h.now, vec![req(Op::Read, 0, 10, &rails, &keep)])
        .unwrap_err();
    assert!(err.to_string().contains("MR destroy failed"), "{err}");
    h.pump();
    assert!(h.queues[0].is_empty(), "nothing posted");
    assert_eq!(Arc::strong_count(&keep), 1);
}

use crate::test_rng::Rng;

fn seeds() -> u64 {
    crate::test_rng::seeds("ORBITTE_FUZZ_SEEDS", 1000)
}

/// Random schedules of completions, errors, hangs, port loss, cancels and
/// timeouts; checks the contract's invariants each time.
#[test]
fn fuzz_core_schedules_keep_the_contract() {
    for seed in 0..seeds() {
        fuzz_one(seed);
    }
}

fn fuzz_one(seed: u64) {
    let mut rng = Rng(seed);
    let nrails = 1 + rng.below(3) as usize;
    let specs: Vec<_> = (0..nrails)
        .map(|i| spec(i as u32, 1 + rng.below(6) as u32, 1 + rng.below(4) as u32))
        .collect();
    let size = 16 * 1024;
    let (mut h, rails) = Harness::new(&specs, 2 * size);
    let orig_local = h.local.clone();
    let orig_remote = h.remote.clone();
    let keep = Arc::new(());
    // Disjoint requests so each destination range has one writer.
    let nreq = 1 + rng.below(4);
    let mut batch = Vec::new();
    let mut at = 0u64;
    for _ in 0..nreq {
        let len = 1 + rng.below(5 * u64::from(SLICE));
        if at + len > size as u64 {
            break;
        }
        let op = if rng.below(2) == 0 {
            Op::Read
        } else {
            Op::Write
        };
        let k = 1 + rng.below(nrails as u64) as usize;
        // READs read the remote copy at a disjoint offset (second half) so
        // a WRITE never changes what a READ reads.
        let mut r = req(op, at, len, &rails[..k], &keep);
        if op == Op::Read {
            r.remote_offset = size as u64 + at;
        }
        batch.push(r);
        at += len + rng.below(100);
    }
    let ids = h.core.submit(h.now, batch).unwrap();
    let mut cancelled = false;
    for _ in 0..400 {
        h.pump();
        match rng.below(20) {
            0 => h.advance(Duration::from_millis(rng.below(60))),
            1 if !cancelled => {
                cancelled = true;
                h.core
                    .cancel(h.now, ids[rng.below(ids.len() as u64) as usize]);
            }
            2 => {
                let r = rng.below(nrails as u64) as usize;
                h.core.handle_event(
                    h.now,
                    TransportEvent::RailDown {
                        rail: rails[r],
                        reason: "port paused".into(),
                    },
                );
                h.flush(rails[r]);
            }
            3 => {
                let r = rng.below(nrails as u64) as usize;
                h.step(r, Fate::ErrorHalf);
            }
            4 => {
                let r = rng.below(nrails as u64) as usize;
                h.step(r, Fate::Hang);
            }
            5 => h.fail_next_post = Some(rng.below(3) as usize),
            _ => {
                let r = rng.below(nrails as u64) as usize;
                let hung = h.queues[r].front().is_some_and(|q| q.1);
                if !hung {
                    h.step(r, Fate::Ok);
                }
            }
        }
    }
    // Every wait ends: past every deadline there is an outcome per request,
    // and past the drain timeout everything is drained.
    h.advance(Duration::from_millis(101));
    h.advance(Duration::from_millis(51));
    h.pump();
    assert_eq!(
        h.outcomes.len(),
        ids.len(),
        "seed {seed}: one outcome per request"
    );
    assert_eq!(h.core.outstanding_slices(), 0, "seed {seed}: drained");
    assert_eq!(h.core.live_requests(), 0, "seed {seed}");
    assert_eq!(Arc::strong_count(&keep), 1, "seed {seed}: nothing leaks");
    for o in &h.outcomes {
        let (lo, ro) = if o.op == Op::Write {
            (o.label as usize, o.label as usize)
        } else {
            (o.label as usize, size + o.label as usize)
        };
        let len = o.len as usize;
        let (dst, dst_orig, src) = match o.op {
            Op::Write => (
                &h.remote[ro..ro + len],
                &orig_remote[ro..ro + len],
                &orig_local[lo..lo + len],
            ),
            Op::Read => (
                &h.local[lo..lo + len],
                &orig_local[lo..lo + len],
                &orig_remote[ro..ro + len],
            ),
        };
        let p = o.completed_prefix as usize;
        assert_eq!(dst[..p], src[..p], "seed {seed}: prefix arrived");
        let unc = o.uncertain.start as usize..o.uncertain.end as usize;
        for i in p..len {
            if !unc.contains(&i) {
                assert_eq!(
                    dst[i], dst_orig[i],
                    "seed {seed}: byte {i} outside the uncertain range changed ({o:?})"
                );
            }
        }
        match (&o.remote_effect, o.op) {
            (RemoteEffect::Complete, _) => assert_eq!(dst, src, "seed {seed}"),
            (RemoteEffect::None, Op::Write) => assert_eq!(dst, dst_orig, "seed {seed}"),
            _ => {}
        }
        if o.status == Status::Complete {
            assert_eq!(o.completed_prefix, o.len);
        }
    }
}

/// The work a core with `config`, a tcp rail and an rdma rail hands out
/// for three requests of `len` bytes: a READ on the tcp rail, a WRITE on
/// the rdma rail and a WRITE on both; and the two rails.
fn three_requests(config: CoreConfig, len: u64) -> (Vec<WorkItem>, RailId, RailId) {
    let mut core = Core::new(config);
    let tcp = core.add_rail(RailSpec {
        path: PathKind::Tcp,
        nic: None,
        remote_nic: None,
        ..spec(0, 64, 1)
    });
    let rdma = core.add_rail(spec(1, 64, 1));
    let keep = Arc::new(());
    core.submit(
        Instant::now(),
        vec![
            req(Op::Read, 0, len, &[tcp], &keep),
            req(Op::Write, 0, len, &[rdma], &keep),
            req(Op::Write, 0, len, &[tcp, rdma], &keep),
        ],
    )
    .unwrap();
    let mut work = Vec::new();
    core.poll_work(&mut work);
    (work, tcp, rdma)
}

/// (local offset, length) of the items of `op` on `rail`, in order.
fn cut(work: &[WorkItem], op: Op, rail: RailId) -> Vec<(u64, u32)> {
    work.iter()
        .filter(|w| w.op == op && w.rail == rail)
        .map(|w| (w.local_offset, w.len))
        .collect()
}

#[test]
fn requests_on_tcp_rails_only_are_cut_into_tcp_slices() {
    let len = 10 * u64::from(SLICE) + 5;
    let config = CoreConfig {
        tcp_slice_size: 4 * SLICE,
        ..config()
    };
    let (work, tcp, rdma) = three_requests(config, len);
    let (s, t) = (u64::from(SLICE), 4 * SLICE);
    // tcp only: slices of tcp_slice_size, the last one shorter.
    assert_eq!(
        cut(&work, Op::Read, tcp),
        vec![(0, t), (4 * s, t), (8 * s, 2 * SLICE + 5)]
    );
    // rdma, and a request that has an rdma rail among its rails: the
    // engine's slice size.
    let rdma_only = cut(&work, Op::Write, rdma);
    let mixed = cut(&work, Op::Write, tcp);
    assert!(rdma_only.iter().all(|&(_, l)| l <= SLICE));
    assert_eq!(mixed.len(), 6);
    assert!(mixed.iter().all(|&(_, l)| l <= SLICE));
    let written: u64 = rdma_only.iter().map(|&(_, l)| u64::from(l)).sum();
    // The rdma rail holds the rdma-only request (11 slices) and every
    // second slice of the mixed one (5 whole ones of 11).
    assert_eq!(rdma_only.len(), 11 + 5);
    assert_eq!(written, len + 5 * s);
}

#[test]
fn a_slice_on_a_tcp_rail_is_at_most_the_largest_payload_of_the_protocol() {
    let max = orbitte_wire::MAX_PAYLOAD_LEN;
    let config = CoreConfig {
        slice_size: 2 * max,
        tcp_slice_size: 1 << 20,
        ..config()
    };
    let (work, tcp, rdma) = three_requests(config, 5 * u64::from(max) / 2);
    let lens = |op, rail| {
        cut(&work, op, rail)
            .into_iter()
            .map(|(_, l)| l)
            .collect::<Vec<_>>()
    };
    // tcp only: slices of the largest payload a tcp frame carries.
    assert_eq!(lens(Op::Read, tcp), vec![max, max, max / 2]);
    // A request with a tcp rail among its rails: the same bound on both.
    assert_eq!(lens(Op::Write, tcp), vec![max, max / 2]);
    // rdma only: the engine's slice size; then the mixed request's
    // slice 1 of 3.
    assert_eq!(lens(Op::Write, rdma), vec![2 * max, max / 2, max]);
}
