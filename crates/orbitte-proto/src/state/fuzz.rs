//! Seeded fault fuzz of `EngineState` on virtual time: no threads, no
//! sleeps, so 10,000 schedules run in seconds (the whole-engine fuzz in
//! `tests/fuzz_sim.rs` runs fewer, on the sim fabric with its threads).
//!
//! Each schedule submits a batch of disjoint READs and WRITEs over one to
//! three rails, may try a batch with one bad request (refused whole, nothing
//! posted), and meets random completions, error completions that moved half
//! a slice, hung work, posts refused part-way, rails going down, a cancel,
//! a fence and the passing of time. Then it checks, per request:
//! - bytes: the destination's completed prefix holds the source's bytes,
//!   the uncertain range holds each byte either from the source or as it
//!   was, and every other byte is as it was; `Complete` means every byte;
//! - the uncertain range is exact: from the completed prefix to the end of
//!   the furthest slice the transport accepted, and a WRITE's remote
//!   effect is `None` exactly when nothing was accepted;
//! - the failure slice is at or after the prefix, at its slice's offset,
//!   and was accepted unless its post was refused or its rail was down;
//! - accounting: one outcome per admitted request, nothing outstanding
//!   after the drain timeout, the registration can be taken (no request
//!   pins it) and the ledger is back to zero.
//!
//! Seeds: 10,000 by default, `ORBITTE_STATE_FUZZ_SEEDS=N` for another
//! count.

use std::time::Duration;

use super::tests::{
    DRAIN_TIMEOUT, Fate, REQUEST_TIMEOUT, SIZE, SLICE, Sim, local_before, remote_before,
};
use crate::TransferRequest;
use crate::outcome::{Outcome, RemoteEffect, Status, SubmitError};
use crate::registration::Charges;
use crate::{Op, SliceFailure};

use crate::test_rng::Rng;

fn seeds() -> u64 {
    crate::test_rng::seeds("ORBITTE_STATE_FUZZ_SEEDS", 10_000)
}

#[test]
fn fuzz_engine_state_fault_schedules_keep_the_contract() {
    let n = seeds();
    let mut statuses = [0u64; 4];
    for seed in 0..n {
        for o in fuzz_one(seed) {
            statuses[o.status as usize] += 1;
        }
    }
    // The schedules reach every ending (a fuzz whose faults never bite
    // checks nothing).
    if n >= 1000 {
        assert!(statuses.iter().all(|c| *c > 0), "statuses {statuses:?}");
    }
}

fn fuzz_one(seed: u64) -> Vec<Outcome> {
    let mut rng = Rng(seed);
    let nrails = 1 + rng.below(3) as usize;
    let rails: Vec<(u32, u32)> = (0..nrails)
        .map(|_| (1 + rng.below(6) as u32, 1 + rng.below(4) as u32))
        .collect();
    let mut sim = Sim::new(&rails);
    let half = SIZE as u64 / 2;
    // Disjoint requests: WRITEs to the remote's first half, READs from its
    // second half, so no byte has two writers and no READ sees a WRITE.
    let mut batch: Vec<TransferRequest> = Vec::new();
    let mut at = 0u64;
    for _ in 0..1 + rng.below(4) {
        let len = 1 + rng.below(5 * u64::from(SLICE));
        if at + len > half {
            break;
        }
        let op = if rng.below(2) == 0 {
            Op::Read
        } else {
            Op::Write
        };
        let remote = if op == Op::Write { at } else { half + at };
        batch.push(sim.request(op, at, remote, len));
        at += len + rng.below(100);
    }
    // Sometimes a batch with one bad request first: refused whole.
    if rng.below(4) == 0 {
        let mut bad = batch.clone();
        let i = rng.below(bad.len() as u64) as usize;
        bad[i].remote_offset = SIZE as u64 - bad[i].len / 2;
        let err = sim.submit(&bad).unwrap_err();
        assert!(
            matches!(err, SubmitError::Invalid { index, .. } if index == i),
            "seed {seed}: {err:?}"
        );
        sim.pump();
        assert!(
            sim.accepted.is_empty(),
            "seed {seed}: a refused batch posted"
        );
    }
    let ids = sim.submit(&batch).unwrap();
    let mut cancelled = false;
    for _ in 0..120 {
        sim.pump();
        let i = rng.below(nrails as u64) as usize;
        match rng.below(24) {
            0 => sim.advance(Duration::from_millis(rng.below(60))),
            1 if !cancelled => {
                cancelled = true;
                let id = ids[rng.below(ids.len() as u64) as usize];
                sim.st.core.cancel(sim.now, id);
            }
            2 => sim.rail_down(i),
            3 => {
                sim.step(i, Fate::ErrorHalf);
            }
            4 => {
                sim.step(i, Fate::Hang);
            }
            5 => sim.fail_next_post = Some(rng.below(3) as usize),
            6 => {
                sim.st.fence("fenced mid-run");
                let again = sim.request(Op::Write, 0, 0, 1);
                assert!(
                    matches!(sim.submit(&[again]), Err(SubmitError::Fenced { .. })),
                    "seed {seed}: admission while fenced"
                );
            }
            _ => {
                if !sim.hung(i) {
                    sim.step(i, Fate::Ok);
                }
            }
        }
    }
    // Every request ends by its timeout; past the drain timeout every rail
    // holding slices is flushed, which drains them.
    sim.advance(REQUEST_TIMEOUT);
    sim.advance(DRAIN_TIMEOUT);
    sim.pump();
    assert_eq!(
        sim.outcomes.len(),
        ids.len(),
        "seed {seed}: one outcome each"
    );
    assert_eq!(sim.st.core.outstanding_slices(), 0, "seed {seed}: drained");
    let (local_before, remote_before) = (local_before(), remote_before());
    let local_after = sim.local.to_vec(0, SIZE).unwrap();
    let remote_after = sim.remote.to_vec(0, SIZE).unwrap();
    let mut out = Vec::new();
    for (id, r) in ids.iter().zip(&batch) {
        let o = sim.outcomes.remove(id).expect("checked above");
        // Request-relative (offset, end) of each data slice accepted.
        let posted: Vec<(u64, u64)> = sim
            .accepted
            .iter()
            .filter(|w| {
                w.len > 0
                    && w.local_offset >= r.local_offset
                    && w.local_offset < r.local_offset + r.len
            })
            .map(|w| {
                let off = w.local_offset - r.local_offset;
                (off, off + u64::from(w.len))
            })
            .collect();
        check_outcome(seed, &o, r, &posted);
        let (l, rm, n) = (
            r.local_offset as usize,
            r.remote_offset as usize,
            r.len as usize,
        );
        match r.op {
            Op::Write => check_bytes(
                seed,
                &o,
                &local_before[l..l + n],
                &remote_before[rm..rm + n],
                &remote_after[rm..rm + n],
            ),
            Op::Read => check_bytes(
                seed,
                &o,
                &remote_before[rm..rm + n],
                &local_before[l..l + n],
                &local_after[l..l + n],
            ),
        }
        out.push(o);
    }
    // Nothing pins the registration any more; the ledger balances.
    let entry = sim
        .st
        .take_registration(sim.reg)
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    drop(entry);
    assert_eq!(sim.st.ledger.in_use, Charges::default(), "seed {seed}");
    out
}

fn check_outcome(seed: u64, o: &Outcome, r: &TransferRequest, posted: &[(u64, u64)]) {
    let slices = r.len.div_ceil(u64::from(SLICE)) as u32;
    assert_eq!(
        (o.label, o.op, o.len, o.slices),
        (r.label, r.op, r.len, slices),
        "seed {seed}"
    );
    assert_eq!(
        o.completed_prefix,
        (u64::from(o.completed_slices) * u64::from(SLICE)).min(r.len),
        "seed {seed}: prefix and slices agree ({o:?})"
    );
    let hull = posted.iter().map(|p| p.1).max().unwrap_or(0);
    if o.status == Status::Complete {
        assert_eq!(o.completed_slices, slices, "seed {seed}");
        assert_eq!(o.failure, None, "seed {seed}");
        assert!(o.uncertain.is_empty(), "seed {seed}: {o:?}");
        let effect = if r.op == Op::Write {
            RemoteEffect::Complete
        } else {
            RemoteEffect::None
        };
        assert_eq!(o.remote_effect, effect, "seed {seed}");
        return;
    }
    assert!(o.completed_slices < slices, "seed {seed}: {o:?}");
    assert_eq!(
        o.uncertain,
        o.completed_prefix..hull.max(o.completed_prefix),
        "seed {seed}: uncertain is the hull of the accepted slices past the prefix \
         (posted {posted:?}, {o:?})"
    );
    let effect = match (r.op, posted.is_empty()) {
        (Op::Read, _) | (Op::Write, true) => RemoteEffect::None,
        (Op::Write, false) => RemoteEffect::Possible {
            bytes: o.uncertain.clone(),
        },
    };
    assert_eq!(o.remote_effect, effect, "seed {seed}: {o:?}");
    if o.status == Status::Failed {
        assert!(o.failure.is_some(), "seed {seed}: {o:?}");
    }
    if let Some(f) = &o.failure {
        assert!(
            f.slice >= o.completed_slices && f.slice < slices,
            "seed {seed}: failure slice {} against prefix {} of {slices} ({o:?})",
            f.slice,
            o.completed_slices
        );
        let offset = u64::from(f.slice) * u64::from(SLICE);
        assert_eq!(f.offset, offset, "seed {seed}: {o:?}");
        let was_posted = posted.iter().any(|p| p.0 == offset);
        match f.status {
            SliceFailure::PostFailed(_) | SliceFailure::RailDown(_) => assert!(
                !was_posted,
                "seed {seed}: a slice never accepted is in the record ({o:?})"
            ),
            SliceFailure::Completion { .. } | SliceFailure::Flushed => assert!(
                was_posted,
                "seed {seed}: a failed slice the transport never accepted ({o:?}, posted {posted:?})"
            ),
            ref other => panic!("seed {seed}: {other:?} on host memory ({o:?})"),
        }
    }
}

/// The destination after the request, against the source and the
/// destination before it: the prefix is the source's, the uncertain range
/// byte by byte either, the rest untouched.
fn check_bytes(seed: u64, o: &Outcome, source: &[u8], before: &[u8], after: &[u8]) {
    let prefix = o.completed_prefix as usize;
    assert_eq!(
        after[..prefix],
        source[..prefix],
        "seed {seed}: completed prefix ({o:?})"
    );
    for i in prefix..after.len() {
        let uncertain = o.uncertain.contains(&(i as u64));
        let ok = after[i] == before[i] || (uncertain && after[i] == source[i]);
        assert!(
            ok,
            "seed {seed}: byte {i} changed outside the uncertain range ({o:?})"
        );
    }
}
