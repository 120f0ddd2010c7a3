//! Seeded fault injection over many random schedules, on the sim fabric
//! through the whole engine (verbs, pollers, timers): stalled work
//! requests, error completions (with and without remote effect), posts
//! refused part-way through a batch, port pauses, QP fatal errors and
//! cancels, checking the contract's invariants each time:
//! - bytes outside the completed prefix changed only where the outcome's
//!   uncertain range ("possible") allows; `Complete` means every byte;
//! - every wait ends (an outcome by the request timeout, drain after the
//!   drain timeout's flush);
//! - charges balance (zero after unregistering everything) and nothing
//!   leaks (the memory is freed once the engine lets go).
//!
//! Seeds: 1000 by default, `ORBITTE_FUZZ_SEEDS=N` for more (the core's
//! virtual-time fuzz in `src/core/tests.rs` reads the same variable).
#![forbid(unsafe_code)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use orbitte_engine::transport::SliceFailure;
use orbitte_engine::{Access, Charges, Op, RangeId, TransferRequest};
use orbitte_verbs::WcStatus;
use orbitte_verbs::sim::{Delivery, WrMatch};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn seeds() -> u64 {
    if let Some(n) = std::env::var("ORBITTE_FUZZ_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return n;
    }
    1000
}

const SIZE: usize = 64 * 1024;
const SLICE: usize = 4096;

#[test]
fn fuzz_sim_fault_schedules_keep_the_contract() {
    let n = seeds();
    let mut seen = std::collections::BTreeMap::new();
    for seed in 0..n {
        for tag in one(seed) {
            *seen.entry(tag).or_insert(0u32) += 1;
        }
    }
    // The schedules must reach every ending (and a refused post), or the
    // fuzz proves little.
    if n >= 200 {
        for status in ["Complete", "Failed", "TimedOut", "Cancelled", "PostFailed"] {
            assert!(
                seen.contains_key(status),
                "no {status} outcome in {n} seeds: {seen:?}"
            );
        }
    }
}

/// Runs one schedule; returns each outcome's status, plus `PostFailed`
/// for each outcome whose failure is a refused post.
fn one(seed: u64) -> Vec<String> {
    let mut rng = Rng(seed);
    let nics = 1 + rng.below(2) as usize;
    let fabric = fabric(nics, Delivery::Manual, seed);
    let a = builder(&fabric, "a", nics)
        .request_timeout(Duration::from_millis(25))
        .drain_timeout(Duration::from_millis(10))
        .max_in_flight(1 + rng.below(8) as u32)
        .signal_interval(1 + rng.below(4) as u32)
        .build()
        .unwrap();
    let b = builder(&fabric, "b", nics).build().unwrap();
    let local = region(SIZE, 1);
    let remote = region(2 * SIZE, 2);
    let weak_local = Arc::downgrade(&local);
    let ra = register(&a, &local, Access::LocalOnly);
    let rb = register(&b, &remote, Access::REMOTE_READ_WRITE);
    let (pb, _) = connect(&a, &b);
    let range = RangeId(rb.id.0);
    let local_before = local.to_vec(0, SIZE).unwrap();
    let remote_before = remote.to_vec(0, 2 * SIZE).unwrap();

    // Faults for the WRs to come.
    let faults = fabric.faults();
    let nfaults = rng.below(3);
    for _ in 0..nfaults {
        let nth = 1 + rng.below(12) as u32;
        match rng.below(10) {
            0 => faults.stall_send(WrMatch::nth(nth)),
            1..=5 => {
                let status = [
                    WcStatus::RemoteAccess,
                    WcStatus::RetryExceeded,
                    WcStatus::RemoteOperation,
                ][rng.below(3) as usize];
                faults.fail_send(WrMatch::nth(nth), status, rng.below(2) == 0);
            }
            // post_send refused part-way through a batch (EINVAL, or ENOMEM:
            // a full queue).
            6 => faults.fail_post(WrMatch::nth(nth), [22, 12][rng.below(2) as usize]),
            _ => {}
        }
    }
    // Disjoint requests: WRITEs go to the first half of the remote range,
    // READs come from its second half, so no byte has two writers.
    let mut batch = Vec::new();
    let mut at = 0u64;
    for i in 0..1 + rng.below(4) {
        let len = 1 + rng.below(5 * SLICE as u64);
        if at + len > SIZE as u64 {
            break;
        }
        let op = if rng.below(2) == 0 {
            Op::Write
        } else {
            Op::Read
        };
        let remote_offset = if op == Op::Write {
            at
        } else {
            SIZE as u64 + at
        };
        batch.push(TransferRequest {
            op,
            registration: ra.id,
            local_offset: at,
            peer: pb.id,
            range,
            remote_offset,
            len,
            label: i,
        });
        at += len + rng.below(300);
    }
    let ids = a.submit(&batch).unwrap();
    // A random schedule: steps, a port pause, a QP fatal, a cancel.
    for _ in 0..rng.below(40) {
        match rng.below(30) {
            0 => {
                let dev = format!("a{}", rng.below(nics as u64));
                faults.port_down(&dev, 1).unwrap();
            }
            1 => {
                if let Some(q) = a.peers()[0].rails.first().and_then(|r| r.qpn) {
                    let _ = faults.qp_fatal("a0", q);
                }
            }
            2 => {
                a.cancel(ids[rng.below(ids.len() as u64) as usize]);
            }
            3 => std::thread::sleep(Duration::from_millis(1)),
            4 => {
                let dev = format!("a{}", rng.below(nics as u64));
                faults.port_up(&dev, 1).unwrap();
            }
            _ => {
                fabric.step();
            }
        }
    }
    let outcomes: Vec<_> = ids.iter().map(|id| drive_wait(&fabric, &a, *id)).collect();
    for id in &ids {
        drive_drain(&fabric, &a, *id);
    }
    assert_eq!(a.outstanding_slices(), 0, "seed {seed}");
    let local_after = local.to_vec(0, SIZE).unwrap();
    let remote_after = remote.to_vec(0, 2 * SIZE).unwrap();
    for (o, r) in outcomes.iter().zip(&batch) {
        assert_eq!(o.label, r.label);
        let (l, rm, n) = (
            r.local_offset as usize,
            r.remote_offset as usize,
            r.len as usize,
        );
        match r.op {
            Op::Write => check_bytes(
                o,
                &local_before[l..l + n],
                &remote_before[rm..rm + n],
                &remote_after[rm..rm + n],
            ),
            Op::Read => check_bytes(
                o,
                &remote_before[rm..rm + n],
                &local_before[l..l + n],
                &local_after[l..l + n],
            ),
        }
        if o.is_complete() {
            assert_eq!(o.completed_prefix, r.len, "seed {seed}");
        }
    }
    // Charges balance; nothing leaks.
    a.unregister(ra.id)
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    assert_eq!(a.charges(), Charges::default(), "seed {seed}");
    assert!(a.fenced().is_none(), "seed {seed}");
    drop(local);
    a.shutdown(Duration::from_millis(200))
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    drop(a);
    assert!(
        weak_local.upgrade().is_none(),
        "seed {seed}: the engine let go of the memory"
    );
    let mut tags: Vec<String> = outcomes.iter().map(|o| format!("{:?}", o.status)).collect();
    tags.extend(
        outcomes
            .iter()
            .filter(|o| {
                o.failure
                    .as_ref()
                    .is_some_and(|f| matches!(f.status, SliceFailure::PostFailed(_)))
            })
            .map(|_| "PostFailed".to_owned()),
    );
    tags
}
