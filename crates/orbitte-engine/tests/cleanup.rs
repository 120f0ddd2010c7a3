//! docs/troubleshooting.md's "Native cleanup returns Unquiesced" section, one test per
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
use orbitte_verbs::sim::{Delivery, SimCounts, SimDescription, SimDeviceDesc, SimFabric, WrMatch};
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
    let failed = &u.failures[0];
    assert_eq!(
        (failed.object, failed.device.name.as_str()),
        (ObjectKind::MemoryRegion, "a1")
    );
    assert!(
        orbitte_verbs::retained()
            .iter()
            .any(|o| o.device.name == "a1"
                && o.object == ObjectKind::MemoryRegion
                && o.label == failed.label),
        "verbs lists the retained owner"
    );
    // The fabric still holds exactly the retained copy, on a1.
    assert_eq!(fabric.counts_on("a0").map(|c| c.mrs), Some(0));
    assert_eq!(fabric.counts_on("a1").map(|c| c.mrs), Some(1));
    let keys: Vec<String> = fabric
        .mr_keys("a1")
        .iter()
        .map(|k| format!("lkey {k:#x}"))
        .collect();
    assert_eq!(keys, [failed.label.as_str()]);
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
    let err = a.unregister(spare.id).unwrap_err();
    assert!(matches!(err, UnregisterError::Unquiesced(_)), "{err:?}");
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

/// The retained MR keeps its PD and context alive on the fabric (so the
/// PD's keys stay issued), verbs lists exactly that MR, and a later
/// registration on the same device gets a key never issued before.
#[test]
fn dropping_a_handle_cannot_establish_a_successful_native_destroy_or_reset_the_pd_key_history() {
    // A device name no other test uses, so the process-wide registry of
    // retained objects can be read for this test's objects alone.
    let fabric = SimFabric::new(
        SimDescription::new(vec![SimDeviceDesc::roce("kh0", [10, 9, 0, 1])])
            .with_delivery(Delivery::Manual),
        42,
    );
    let a = builder(&fabric, "kh", 1).build().unwrap();
    let m = region(4096, 1);
    let weak = Arc::downgrade(&m);
    let r = register(&a, &m, Access::LocalOnly);
    drop(m);
    let issued = fabric.mr_keys("kh0");
    assert_eq!(issued.len(), 1, "one local-only copy on one context");
    fabric
        .faults()
        .fail_destroy("kh0", ObjectKind::MemoryRegion, EBUSY)
        .unwrap();
    let err = a.unregister(r.id).unwrap_err();
    let UnregisterError::Unquiesced(u) = err else {
        panic!("{err:?}")
    };
    assert_eq!(u.failures.len(), 1, "{u}");
    let label = u.failures[0].label.clone();
    assert_eq!(label, format!("lkey {:#x}", issued[0]));
    // Shutdown cannot release the PD: the retained MR still holds it.
    let u = a.shutdown(Duration::from_millis(100)).unwrap_err();
    let pd_refusals: Vec<_> = u
        .failures
        .iter()
        .filter(|f| f.object == ObjectKind::ProtectionDomain)
        .collect();
    assert_eq!(pd_refusals.len(), 1, "{u}");
    assert!(
        matches!(pd_refusals[0].cause, UnquiescedCause::InUse { .. }),
        "{u}"
    );
    drop(a);
    // What the fabric still holds after every handle is gone: the MR, the
    // PD that issued its key and the context under it; nothing else.
    assert_eq!(
        fabric.counts_on("kh0"),
        Some(SimCounts {
            contexts: 1,
            pds: 1,
            mrs: 1,
            cqs: 0,
            qps: 0,
        }),
        "dropping did not pretend the destroy happened"
    );
    assert_eq!(
        fabric.mr_keys("kh0"),
        issued,
        "the retained key stays issued"
    );
    assert!(weak.upgrade().is_some(), "the retained MR keeps the memory");
    let mine: Vec<_> = orbitte_verbs::retained()
        .into_iter()
        .filter(|o| o.device.name == "kh0")
        .map(|o| (o.object, o.label, o.bytes))
        .collect();
    assert_eq!(mine, [(ObjectKind::MemoryRegion, label, 4096)]);
    // A new engine on the same device: its key is new, not a reissue.
    let again = builder(&fabric, "kh", 1).build().unwrap();
    register(&again, &region(4096, 2), Access::LocalOnly);
    let now = fabric.mr_keys("kh0");
    assert_eq!(now.len(), 2, "{now:x?}");
    let fresh: Vec<u32> = now.into_iter().filter(|k| !issued.contains(k)).collect();
    assert_eq!(fresh.len(), 1, "the retained key was not reissued");
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
    assert_eq!(u.epoch.value(), 77);
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
    assert_eq!((u.source_id.as_str(), u.epoch.value()), ("engine-a", 9));
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

/// A PD that still holds a memory region the engine does not own (leaked
/// on purpose) is refused by the device (EBUSY, as the kernel does) when
/// shutdown destroys it: `Unquiesced` with the evidence, the PD retained,
/// its charges kept, admission fenced. The same test runs on rxe0 in
/// `tests/native_rdma.rs`.
#[test]
fn a_pd_the_device_refuses_to_destroy_is_unquiesced_and_retained() {
    let fabric = fabric(1, Delivery::Background, 45);
    let a = builder(&fabric, "a", 1).build().unwrap();
    let m = region(4096, 1);
    register(&a, &m, Access::REMOTE_READ_WRITE);
    a.leak_registration_on(orbitte_topology::NicId(0), region(4096, 2))
        .unwrap();
    assert_eq!(fabric.counts_on("a0").map(|c| c.mrs), Some(3));
    let u = a.shutdown(Duration::from_secs(1)).unwrap_err();
    assert_eq!(
        (u.source_id.as_str(), u.epoch, u.during.as_str()),
        ("engine-a", a.epoch(), "shutdown")
    );
    let pd = u
        .failures
        .iter()
        .find(|f| f.object == ObjectKind::ProtectionDomain)
        .unwrap_or_else(|| panic!("no PD failure: {u}"));
    assert_eq!(pd.device.name, "a0");
    assert_eq!(
        pd.cause,
        UnquiescedCause::Native(orbitte_verbs::NativeError::new("ibv_dealloc_pd", EBUSY))
    );
    assert!(pd.cleanup.retained, "{pd}");
    assert!(
        orbitte_verbs::retained()
            .iter()
            .any(|o| o.object == ObjectKind::ProtectionDomain && o.label == pd.label),
        "verbs retains the PD"
    );
    // The engine's own regions were deregistered: only the leaked one
    // stays on the device, and nothing the engine charged is retained.
    assert_eq!(fabric.counts_on("a0").map(|c| (c.mrs, c.pds)), Some((1, 1)));
    assert_eq!(u.retained, Charges::default());
    assert_eq!(a.charges(), u.retained);
    assert_eq!(a.unquiesced().len(), 1);
    assert!(matches!(
        a.register_host(region(4096, 3), Access::LocalOnly),
        Err(RegisterError::Fenced { .. })
    ));
}
