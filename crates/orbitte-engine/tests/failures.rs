//! docs/troubleshooting.md's "A request times out or returns an uncertain WRITE" section,
//! one test per sentence, and the simulated failures: a port paused
//! mid-batch, a QP in error, an error completion, a work request that never
//! completes. Each gives the documented outcome within its timeout; no
//! hang, no panic, no replay through another rail.
#![forbid(unsafe_code)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use orbitte_engine::transport::SliceFailure;
use orbitte_engine::{
    Access, DrainStatus, Op, RangeId, RemoteEffect, Status, TransferEngine, TransferRequest,
    UnregisterError,
};
use orbitte_memory::HostMemory;
use orbitte_topology::NicId;
use orbitte_verbs::sim::{Delivery, SimFabric, WrMatch};
use orbitte_verbs::{QpState, WcStatus};

const LEN: usize = 8 * 4096;

struct Setup {
    fabric: SimFabric,
    a: TransferEngine,
    _b: TransferEngine,
    src: Arc<HostMemory>,
    dst: Arc<HostMemory>,
    req: TransferRequest,
}

fn setup(nics: usize, seed: u64, signal_interval: u32) -> Setup {
    let fabric = fabric(nics, Delivery::Manual, seed);
    let a = builder(&fabric, "a", nics)
        .signal_interval(signal_interval)
        .build()
        .unwrap();
    let b = builder(&fabric, "b", nics).build().unwrap();
    let src = region(LEN, 1);
    let dst = region(LEN, 2);
    let ra = register(&a, &src, Access::LocalOnly);
    let rb = register(&b, &dst, Access::REMOTE_READ_WRITE);
    let (pb, _) = connect(&a, &b);
    let req = TransferRequest::write(ra.id, 0, pb.id, RangeId(rb.id.0), 0, LEN as u64);
    Setup {
        fabric,
        a,
        _b: b,
        src,
        dst,
        req,
    }
}

#[test]
fn inspect_completed_prefix_counts_failure_information_remote_effect_and_local_drain_status() {
    let s = setup(1, 20, 1);
    s.fabric.faults().stall_send(WrMatch::nth(3));
    let before = s.dst.to_vec(0, LEN).unwrap();
    let id = s.a.submit(&[s.req]).unwrap()[0];
    let o = drive_wait(&s.fabric, &s.a, id);
    assert_eq!(o.status, Status::TimedOut);
    assert_eq!(
        o.completed_prefix,
        2 * 4096,
        "slices 0 and 1 are known done"
    );
    assert_eq!(o.completed_slices, 2);
    assert_eq!(o.failure, None, "nothing failed: it timed out");
    assert!(
        matches!(o.remote_effect, RemoteEffect::Possible { .. }),
        "{o:?}"
    );
    assert!(matches!(o.drain, DrainStatus::Pending { .. }), "{o:?}");
    check_bytes(
        &o,
        &s.src.to_vec(0, LEN).unwrap(),
        &before,
        &s.dst.to_vec(0, LEN).unwrap(),
    );
    // Past the drain timeout the rail is flushed and the request drains.
    drive_drain(&s.fabric, &s.a, id);
}

#[test]
fn an_uncertain_write_may_have_changed_remote_bytes() {
    let s = setup(1, 21, 1);
    // The 2nd WRITE moves its bytes, then completes with an error.
    s.fabric
        .faults()
        .fail_send(WrMatch::nth(2), WcStatus::RemoteOperation, true);
    let before = s.dst.to_vec(0, LEN).unwrap();
    let id = s.a.submit(&[s.req]).unwrap()[0];
    let o = drive_wait(&s.fabric, &s.a, id);
    assert_eq!(o.status, Status::Failed);
    let f = o.failure.clone().unwrap();
    assert_eq!(f.slice, 1);
    assert_eq!(f.nic, Some(NicId(0)));
    assert!(
        matches!(f.status, SliceFailure::Completion { code: 11, .. }),
        "{f:?}"
    );
    assert_eq!(o.completed_prefix, 4096);
    let RemoteEffect::Possible { bytes } = o.remote_effect.clone() else {
        panic!("{o:?}")
    };
    assert!(bytes.contains(&4096), "{bytes:?}");
    let after = s.dst.to_vec(0, LEN).unwrap();
    assert_eq!(
        after[4096..8192],
        pattern(LEN, 1)[4096..8192],
        "the failed WRITE did change remote bytes"
    );
    check_bytes(&o, &s.src.to_vec(0, LEN).unwrap(), &before, &after);
    assert_eq!(
        o.drain,
        DrainStatus::Drained,
        "an error completion flushes the rest"
    );
}

#[test]
fn logical_cancellation_and_timeout_do_not_establish_physical_dma_completion_or_rollback() {
    let s = setup(2, 22, 1);
    s.fabric
        .faults()
        .stall_send(WrMatch::nth(1).on_device("a0"));
    let before = s.dst.to_vec(0, LEN).unwrap();
    let id = s.a.submit(&[s.req]).unwrap()[0];
    // Let rail a1's slices (odd ones) run, then cancel.
    for _ in 0..50 {
        s.fabric.drive();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(s.a.cancel(id));
    let o = s.a.poll(id).expect("cancel makes the outcome now");
    assert_eq!(o.status, Status::Cancelled);
    assert!(
        matches!(o.drain, DrainStatus::Pending { .. }),
        "cancel does not claim DMA stopped: {o:?}"
    );
    assert_eq!(s.a.drain_status(id), o.drain);
    let after = s.dst.to_vec(0, LEN).unwrap();
    // No rollback: slices that ran stay written.
    assert_eq!(after[4096..8192], pattern(LEN, 1)[4096..8192]);
    check_bytes(&o, &s.src.to_vec(0, LEN).unwrap(), &before, &after);
    drive_drain(&s.fabric, &s.a, id);
}

#[test]
fn keep_application_ownership_consistent_with_the_transfer_contract_and_rdma_drain_requirements() {
    let s = setup(1, 23, 4);
    s.fabric.faults().stall_send(WrMatch::nth(1));
    let id = s.a.submit(&[s.req]).unwrap()[0];
    let o = drive_wait(&s.fabric, &s.a, id);
    assert_eq!(o.status, Status::TimedOut);
    // The buffer is not the caller's until drained.
    let err = s.a.wait_drain(id, Duration::from_millis(1)).unwrap_err();
    assert!(err.slices > 0, "{err}");
    assert!(matches!(
        s.a.unregister(s.req.registration),
        Err(UnregisterError::Undrained { .. })
    ));
    drive_drain(&s.fabric, &s.a, id);
    s.a.wait_drain(id, Duration::from_secs(1)).unwrap();
    s.a.unregister(s.req.registration).unwrap();
}

#[test]
fn port_paused_mid_batch_gives_the_documented_outcome_within_the_timeout() {
    let s = setup(2, 24, 2);
    let before = s.dst.to_vec(0, LEN).unwrap();
    let id = s.a.submit(&[s.req]).unwrap()[0];
    // A few slices run, then rail a0's port pauses.
    s.fabric.step();
    s.fabric.step();
    s.fabric.faults().port_down("a0", 1).unwrap();
    let o = drive_wait(&s.fabric, &s.a, id);
    assert!(
        matches!(o.status, Status::Failed | Status::TimedOut),
        "{o:?}"
    );
    if let Some(f) = &o.failure {
        assert_eq!(
            f.nic,
            Some(NicId(0)),
            "the failure names the paused rail: {f:?}"
        );
    }
    drive_drain(&s.fabric, &s.a, id);
    check_bytes(
        &o,
        &s.src.to_vec(0, LEN).unwrap(),
        &before,
        &s.dst.to_vec(0, LEN).unwrap(),
    );
    // Nothing is replayed through a1: a new request is refused only if no
    // rail is left; a1 still carries new work.
    let rails = &s.a.peers()[0].rails;
    assert!(
        rails.iter().any(|r| r.nic == Some(NicId(1)) && r.up),
        "{rails:?}"
    );
    // The port recovers, but a0's queue pair saw errors: that rail stays
    // down (reopen the peer to replace it) instead of failing every new
    // request with flushes.
    s.fabric.faults().port_up("a0", 1).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(s.a.topology().contexts.iter().all(|c| c.port_active));
    let rails = &s.a.peers()[0].rails;
    let a0 = rails.iter().find(|r| r.nic == Some(NicId(0))).unwrap();
    if o.failure.is_some() {
        assert!(!a0.up, "{rails:?}");
    }
}

#[test]
fn qp_in_error_fails_the_request_within_the_timeout() {
    let s = setup(1, 25, 4);
    let before = s.dst.to_vec(0, LEN).unwrap();
    let id = s.a.submit(&[s.req]).unwrap()[0];
    let qpn = s.a.peers()[0].rails[0].qpn.unwrap();
    s.fabric.faults().qp_fatal("a0", qpn).unwrap();
    let o = drive_wait(&s.fabric, &s.a, id);
    assert_eq!(o.status, Status::Failed, "{o:?}");
    assert_eq!(o.failure.as_ref().unwrap().status, SliceFailure::Flushed);
    assert_eq!(
        o.remote_effect,
        RemoteEffect::Possible {
            bytes: 0..(16 * 4096).min(LEN as u64)
        }
    );
    drive_drain(&s.fabric, &s.a, id);
    check_bytes(
        &o,
        &s.src.to_vec(0, LEN).unwrap(),
        &before,
        &s.dst.to_vec(0, LEN).unwrap(),
    );
    let rail = &s.a.peers()[0].rails[0];
    assert!(
        !rail.up
            && rail
                .down_reason
                .as_deref()
                .unwrap_or("")
                .contains("QpFatal"),
        "{rail:?}"
    );
}

#[test]
fn error_completion_reports_slice_rail_and_status() {
    let s = setup(2, 26, 1);
    s.fabric.faults().fail_send(
        WrMatch::nth(1).on_device("a1"),
        WcStatus::RemoteAccess,
        false,
    );
    let before = s.dst.to_vec(0, LEN).unwrap();
    let id = s.a.submit(&[s.req]).unwrap()[0];
    let o = drive_wait(&s.fabric, &s.a, id);
    assert_eq!(o.status, Status::Failed);
    let f = o.failure.clone().unwrap();
    assert_eq!((f.nic, f.path.name()), (Some(NicId(1)), "rdma"));
    assert!(
        matches!(f.status, SliceFailure::Completion { code: 10, .. }),
        "{f:?}"
    );
    assert!(f.to_string().contains("RemoteAccess"), "{f}");
    drive_drain(&s.fabric, &s.a, id);
    let after = s.dst.to_vec(0, LEN).unwrap();
    check_bytes(&o, &s.src.to_vec(0, LEN).unwrap(), &before, &after);
}

#[test]
fn a_work_request_that_never_completes_times_out_and_drains_after_the_flush() {
    let s = setup(1, 27, 4);
    s.fabric.faults().stall_send(WrMatch::nth(2));
    let id = s.a.submit(&[s.req]).unwrap()[0];
    let o = drive_wait(&s.fabric, &s.a, id);
    assert_eq!(o.status, Status::TimedOut);
    assert!(matches!(o.drain, DrainStatus::Pending { .. }));
    drive_drain(&s.fabric, &s.a, id);
    assert_eq!(s.a.outstanding_slices(), 0);
}

#[test]
fn the_current_implementation_does_not_replay_a_failed_transfer_through_another_rail() {
    let s = setup(2, 28, 1);
    // Slice on a0 fails without touching memory; a1 keeps working.
    s.fabric.faults().fail_send(
        WrMatch::nth(1).on_device("a0"),
        WcStatus::RetryExceeded,
        false,
    );
    let before = s.dst.to_vec(0, LEN).unwrap();
    let id = s.a.submit(&[s.req]).unwrap()[0];
    let o = drive_wait(&s.fabric, &s.a, id);
    drive_drain(&s.fabric, &s.a, id);
    assert_eq!(o.status, Status::Failed);
    let f = o.failure.clone().unwrap();
    assert_eq!(f.nic, Some(NicId(0)));
    let after = s.dst.to_vec(0, LEN).unwrap();
    let slice = f.slice as usize * 4096;
    assert_eq!(
        after[slice..slice + 4096],
        before[slice..slice + 4096],
        "the failed slice was not replayed on a1"
    );
    assert_eq!(o.completed_prefix, 0);
    check_bytes(&o, &s.src.to_vec(0, LEN).unwrap(), &before, &after);
}

#[test]
fn read_failures_keep_remote_bytes_untouched() {
    let s = setup(1, 29, 1);
    s.fabric
        .faults()
        .fail_send(WrMatch::nth(3), WcStatus::RemoteAccess, false);
    let mut req = s.req;
    req.op = Op::Read;
    let remote_before = s.dst.to_vec(0, LEN).unwrap();
    let local_before = s.src.to_vec(0, LEN).unwrap();
    let id = s.a.submit(&[req]).unwrap()[0];
    let o = drive_wait(&s.fabric, &s.a, id);
    drive_drain(&s.fabric, &s.a, id);
    assert_eq!(o.status, Status::Failed);
    assert_eq!(o.remote_effect, RemoteEffect::None);
    assert_eq!(s.dst.to_vec(0, LEN).unwrap(), remote_before);
    check_bytes(
        &o,
        &remote_before,
        &local_before,
        &s.src.to_vec(0, LEN).unwrap(),
    );
}

/// `post_send` fails part-way through a run (the driver refuses the 3rd
/// work request): the two before it were really posted, the refused one
/// and everything after it never reach the NIC. The rail is flushed at
/// once (its marker covers the posted slices, signaled or not), so the
/// request fails without waiting for its timeout: the outcome names the
/// first refused slice with the driver's error, claims no more than the
/// posted slices as possible remote effect, and is drained.
#[test]
fn a_post_failing_part_way_gives_prefix_failure_remote_effect_and_drain() {
    for signal_interval in [1, 4] {
        let s = setup(1, 31, signal_interval);
        s.fabric
            .faults()
            .fail_post(WrMatch::nth(3).on_device("a0"), 22);
        let before = s.dst.to_vec(0, LEN).unwrap();
        let id = s.a.submit(&[s.req]).unwrap()[0];
        let o = drive_wait(&s.fabric, &s.a, id);
        println!("signal interval {signal_interval}: {o:?}");
        assert_eq!(o.status, Status::Failed, "{o:?}");
        let f = o.failure.clone().unwrap();
        assert_eq!(
            (f.slice, f.offset, f.nic),
            (2, 2 * 4096, Some(NicId(0))),
            "{f:?}"
        );
        let SliceFailure::PostFailed(reason) = &f.status else {
            panic!("{f:?}")
        };
        assert!(
            reason.contains("work request 2") && reason.contains("ibv_post_send"),
            "{reason}"
        );
        // Slices 0 and 1 were posted: their bytes may have landed (and did),
        // nothing else may have.
        let posted = 0..2 * 4096u64;
        match &o.remote_effect {
            RemoteEffect::Possible { bytes } => assert!(
                bytes.start >= posted.start && bytes.end <= posted.end,
                "{o:?}"
            ),
            other => panic!("a posted WRITE is a possible remote effect: {other:?}"),
        }
        assert!(o.completed_prefix <= 2 * 4096, "{o:?}");
        assert_eq!(o.drain, DrainStatus::Drained, "{o:?}");
        drive_drain(&s.fabric, &s.a, id);
        assert_eq!(s.a.outstanding_slices(), 0);
        let after = s.dst.to_vec(0, LEN).unwrap();
        assert!(
            after[2 * 4096..] == before[2 * 4096..],
            "refused slices never ran"
        );
        check_bytes(&o, &s.src.to_vec(0, LEN).unwrap(), &before, &after);
        // The rail is down (reopen the peer to replace it); nothing was
        // replayed.
        let rail = &s.a.peers()[0].rails[0];
        assert!(!rail.up, "{rail:?}");
        s.a.unregister(s.req.registration).unwrap();
    }
}

/// The drain flush moves the queue pair to the error state *before* it
/// posts the signaled marker, so the marker is flushed and never executes
/// at a healthy peer. The sim refuses any post to a ready (RTS) QP from
/// the moment the request times out: the marker still goes out (the QP is
/// in error by then), so the QP is not destroyed by the fallback.
#[test]
fn the_flush_marker_is_posted_after_the_queue_pair_is_in_error() {
    let s = setup(1, 32, 4);
    s.fabric.faults().stall_send(WrMatch::nth(2));
    let id = s.a.submit(&[s.req]).unwrap()[0];
    let o = drive_wait(&s.fabric, &s.a, id);
    assert_eq!(o.status, Status::TimedOut);
    assert!(matches!(o.drain, DrainStatus::Pending { .. }), "{o:?}");
    let qpn = s.a.peers()[0].rails[0].qpn.expect("the rail's qp");
    s.fabric
        .faults()
        .fail_post(WrMatch::nth(1).on_device("a0").in_state(QpState::Rts), 22);
    drive_drain(&s.fabric, &s.a, id);
    let rail = &s.a.peers()[0].rails[0];
    assert!(!rail.up, "a flushed rail takes no new work: {rail:?}");
    assert_eq!(
        rail.qpn,
        Some(qpn),
        "the marker was posted to the errored qp (not refused on an RTS one, \
         which would have destroyed it): {rail:?}"
    );
    // The peer's rail is healthy: it saw neither the marker nor an error.
    let theirs = &s._b.peers()[0].rails[0];
    assert!(theirs.up, "{theirs:?}");
}
