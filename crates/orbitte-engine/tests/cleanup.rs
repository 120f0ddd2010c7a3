//! The seed's "Native cleanup returns Unquiesced" section, one test per
//! sentence (named after it).
#![forbid(unsafe_code)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use orbitte_engine::{
    Access, Charges, OpenPeerError, RangeId, RegisterError, Status, SubmitError, TransferRequest,
    UnregisterError,
};
use orbitte_verbs::sim::{Delivery, WrMatch};
use orbitte_verbs::{ObjectKind, QpState, UnquiescedCause};

const EBUSY: i32 = 16;

#[test]
fn the_actual_native_owners_and_memory_remain_retained_with_their_charges() {
    let fabric = fabric(2, Delivery::Manual, 40);
    let a = builder(&fabric, "a", 2).build().unwrap();
    let m = region(4096, 1);
    let weak = Arc::downgrade(&m);
    let r = register(&a, &m, Access::REMOTE_READ_WRITE);
    drop(m);
    assert_eq!(
        a.charges(),
        Charges {
            mrs: 4,
            bytes: 4 * 4096
        }
    );
    fabric
        .faults()
        .fail_destroy("a1", ObjectKind::MemoryRegion, EBUSY)
        .unwrap();
    let err = a.unregister(r.id).unwrap_err();
    let UnregisterError::Unquiesced(u) = err else {
        panic!("{err:?}")
    };
    assert_eq!(u.failures.len(), 1);
    assert_eq!(
        u.retained,
        Charges {
            mrs: 1,
            bytes: 4096
        }
    );
    assert_eq!(
        a.charges(),
        Charges {
            mrs: 1,
            bytes: 4096
        },
        "the retained copy keeps its charge"
    );
    assert!(
        weak.upgrade().is_some(),
        "the retained MR keeps the memory mapped"
    );
    assert!(
        orbitte_verbs::retained()
            .iter()
            .any(|o| o.device.name == "a1" && o.object == ObjectKind::MemoryRegion),
        "verbs lists the retained owner"
    );
}

#[test]
fn new_admission_is_fenced() {
    let fabric = fabric(1, Delivery::Background, 41);
    let a = builder(&fabric, "a", 1).build().unwrap();
    let b = builder(&fabric, "b", 1).build().unwrap();
    let ra = register(&a, &region(4096, 1), Access::LocalOnly);
    let spare = register(&a, &region(4096, 1), Access::LocalOnly);
    let rb = register(&b, &region(4096, 2), Access::REMOTE_READ_WRITE);
    let (pb, _) = connect(&a, &b);
    fabric
        .faults()
        .fail_destroy("a0", ObjectKind::MemoryRegion, EBUSY)
        .unwrap();
    assert!(a.unregister(spare.id).is_err());
    let reason = a.fenced().expect("fenced");
    assert!(reason.contains("unquiesced"), "{reason}");
    let err = a
        .submit(&[TransferRequest::write(ra.id, 0, pb.id, RangeId(rb.id.0), 0, 4096).label(3)])
        .unwrap_err();
    assert!(matches!(err, SubmitError::Fenced { label: 3, .. }), "{err}");
    assert!(
        err.to_string().contains("unquiesced"),
        "the refusal says why: {err}"
    );
    assert!(matches!(
        a.register_host(region(8, 1), Access::LocalOnly),
        Err(RegisterError::Fenced { .. })
    ));
    let (mut la, _lb) = orbitte_engine::InProcessLink::pair();
    assert!(matches!(
        a.open_peer(&mut la),
        Err(OpenPeerError::Fenced(_))
    ));
    assert_eq!(a.outstanding_slices(), 0, "nothing posted");
}

#[test]
fn dropping_a_handle_cannot_establish_a_successful_native_destroy_or_reset_the_pd_key_history() {
    let fabric = fabric(1, Delivery::Manual, 42);
    let a = builder(&fabric, "a", 1).build().unwrap();
    let r = register(&a, &region(4096, 1), Access::LocalOnly);
    fabric
        .faults()
        .fail_destroy("a0", ObjectKind::MemoryRegion, EBUSY)
        .unwrap();
    assert!(a.unregister(r.id).is_err());
    let retained_before = orbitte_verbs::retained().len();
    // Shutdown cannot release the PD: the retained MR still holds it.
    let u = a.shutdown(Duration::from_millis(100)).unwrap_err();
    assert!(
        u.failures
            .iter()
            .any(|f| f.object == ObjectKind::ProtectionDomain
                && matches!(f.cause, UnquiescedCause::InUse { .. })),
        "{u}"
    );
    drop(a);
    assert!(
        orbitte_verbs::retained().len() >= retained_before,
        "dropping did not pretend the destroy happened"
    );
}

#[test]
fn preserve_the_source_device_identity_error_and_cleanup_evidence_for_diagnosis() {
    let fabric = fabric(1, Delivery::Manual, 43);
    let a = builder(&fabric, "a", 1).epoch(77).build().unwrap();
    let r = register(&a, &region(4096, 1), Access::LocalOnly);
    fabric
        .faults()
        .fail_destroy("a0", ObjectKind::MemoryRegion, EBUSY)
        .unwrap();
    let UnregisterError::Unquiesced(u) = a.unregister(r.id).unwrap_err() else {
        panic!()
    };
    assert_eq!(u.source_id, "engine-a");
    assert_eq!(u.epoch, 77);
    assert!(u.during.contains("unregister"));
    let f = &u.failures[0];
    assert_eq!(f.device.name, "a0");
    assert!(
        matches!(&f.cause, UnquiescedCause::Native(e) if e.errno == EBUSY),
        "{f}"
    );
    assert!(!f.cleanup.tried.is_empty() && f.cleanup.retained, "{f:?}");
    let text = u.to_string();
    assert!(
        text.contains("engine-a") && text.contains("a0") && text.contains("fenced"),
        "{text}"
    );
    assert_eq!(a.unquiesced().len(), 1, "the engine keeps the evidence");
}

#[test]
fn shutdown_with_a_failing_qp_destroy_is_unquiesced_with_evidence() {
    let fabric = fabric(1, Delivery::Background, 44);
    let a = builder(&fabric, "a", 1).build().unwrap();
    let b = builder(&fabric, "b", 1).build().unwrap();
    register(&a, &region(4096, 1), Access::LocalOnly);
    register(&b, &region(4096, 2), Access::REMOTE_READ_WRITE);
    connect(&a, &b);
    fabric
        .faults()
        .fail_destroy("a0", ObjectKind::QueuePair, EBUSY)
        .unwrap();
    let u = a.shutdown(Duration::from_secs(1)).unwrap_err();
    assert!(
        u.failures.iter().any(|f| f.object == ObjectKind::QueuePair),
        "{u}"
    );
    assert!(a.fenced().is_some());
    // A clean shutdown has nothing to report.
    b.shutdown(Duration::from_secs(1)).unwrap();
    assert!(b.unquiesced().is_empty());
}

/// A rail flush whose marker cannot be posted falls back to destroying the
/// queue pair; when that destroy fails (EBUSY) the flush is a native
/// cleanup failure like any other: recorded as `Unquiesced` with the
/// evidence, new admission fenced with the reason.
#[test]
fn a_failed_rail_flush_is_unquiesced_and_fences_admission() {
    let fabric = fabric(1, Delivery::Manual, 45);
    let a = builder(&fabric, "a", 1).epoch(9).build().unwrap();
    let b = builder(&fabric, "b", 1).build().unwrap();
    let ra = register(&a, &region(4 * 4096, 1), Access::LocalOnly);
    let rb = register(&b, &region(4 * 4096, 2), Access::REMOTE_READ_WRITE);
    let (pb, _) = connect(&a, &b);
    fabric.faults().stall_send(WrMatch::nth(2));
    let req = TransferRequest::write(ra.id, 0, pb.id, RangeId(rb.id.0), 0, 4 * 4096);
    let id = a.submit(&[req]).unwrap()[0];
    let o = drive_wait(&fabric, &a, id);
    assert_eq!(o.status, Status::TimedOut);
    // The flush marker is refused on the errored QP, so the engine
    // destroys the QP, and that destroy fails.
    fabric
        .faults()
        .fail_post(WrMatch::nth(1).on_device("a0").in_state(QpState::Error), 22);
    fabric
        .faults()
        .fail_destroy("a0", ObjectKind::QueuePair, EBUSY)
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while a.unquiesced().is_empty() {
        fabric.drive();
        assert!(
            std::time::Instant::now() < deadline,
            "a failed rail flush was not recorded as unquiesced (fenced: {:?})",
            a.fenced()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let u = a.unquiesced().remove(0);
    assert_eq!((u.source_id.as_str(), u.epoch), ("engine-a", 9));
    assert!(u.during.contains("flushing rail"), "{u}");
    let f = &u.failures[0];
    assert_eq!(f.object, ObjectKind::QueuePair);
    assert_eq!(f.device.name, "a0");
    assert!(
        matches!(&f.cause, UnquiescedCause::Native(e) if e.errno == EBUSY),
        "{f}"
    );
    assert!(f.cleanup.retained, "{f:?}");
    let reason = a.fenced().expect("fenced");
    assert!(
        reason.contains("unquiesced") && reason.contains("flushing rail"),
        "{reason}"
    );
    assert!(
        matches!(a.submit(&[req]), Err(SubmitError::Fenced { .. })),
        "new admission is fenced"
    );
}
