//! docs/troubleshooting.md's "Host registration returns a native error or
//! ResourceExhausted" section, one test per sentence (named after it), plus
//! the part-way failure rules (docs/contract.md, "Registration").
#![forbid(unsafe_code)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use orbitte_engine::{
    Access, Budgets, Charges, DeviceMask, RangeId, RegisterError, Status, SubmitError,
    TransferRequest, UnregisterError,
};
use orbitte_memory::HostMemory;
use orbitte_topology::NicId;
use orbitte_verbs::ObjectKind;
use orbitte_verbs::sim::{Delivery, SimFabric};

const ENOMEM: i32 = 12;
const EBUSY: i32 = 16;

#[test]
fn host_direct_registration_prepares_mrs_on_all_usable_contexts_including_paused_ports_before_publishing()
 {
    let fabric = fabric(3, Delivery::Manual, 2);
    fabric.faults().port_down("a1", 1).unwrap();
    let a = builder(&fabric, "a", 3).build().unwrap();
    let m = region(8192, 1);
    let r = register(&a, &m, Access::REMOTE_READ_WRITE);
    assert_eq!(
        r.copies, 6,
        "two copies on each of the three contexts, paused port included"
    );
    assert_eq!(mrs_on(&fabric, "a", 3), [2, 2, 2], "what the fabric holds");
    let publication = a.segment_publication();
    assert_eq!(publication.ranges.len(), 1);
    let mut nics: Vec<u16> = publication.ranges[0]
        .rkeys
        .iter()
        .map(|k| k.nic_id.0)
        .collect();
    nics.sort_unstable();
    assert_eq!(nics, [0, 1, 2], "published with rkeys for every context");
    let topo = a.topology();
    let paused = topo.contexts.iter().find(|c| c.device == "a1").unwrap();
    assert!(!paused.port_active);
}

#[test]
fn a_successful_registration_does_not_mean_a_route_is_ready_inspect_topology_and_wait_for_port_recovery()
 {
    let fabric = fabric(2, Delivery::Background, 3);
    let a = builder(&fabric, "a", 2)
        .dispatch_mask(DeviceMask(0b10))
        .build()
        .unwrap();
    let b = builder(&fabric, "b", 2).build().unwrap();
    let src = region(16384, 1);
    let dst = region(16384, 2);
    let ra = register(&a, &src, Access::LocalOnly);
    let rb = register(&b, &dst, Access::REMOTE_READ_WRITE);
    let (pb, _) = connect(&a, &b);
    // The only NIC the dispatch mask allows pauses: registration still
    // works, but there is no route until the port recovers.
    fabric.faults().port_down("a1", 1).unwrap();
    let m2 = region(4096, 3);
    let r2 = register(&a, &m2, Access::LocalOnly);
    assert_eq!(r2.copies, 2);
    // ra and r2, one local-only copy each on both contexts, and the
    // notification buffer of the rail on each (engine-internal, uncharged).
    assert_eq!(mrs_on(&fabric, "a", 2), [3, 3], "what the fabric holds");
    assert!(
        !a.topology()
            .contexts
            .iter()
            .find(|c| c.nic.0 == 1)
            .unwrap()
            .port_active
    );
    let req = TransferRequest::write(ra.id, 0, pb.id, RangeId(rb.id.0), 0, 16384);
    // Wait until the poller saw the port event (the rail is down).
    eventually(|| {
        a.peers()[0]
            .rails
            .iter()
            .any(|r| r.nic == Some(NicId(1)) && !r.up)
            .then_some(())
    });
    let err = a.submit(&[req]).unwrap_err();
    assert!(err.to_string().contains("no usable rail"), "{err}");
    assert!(err.to_string().contains("paused"), "{err}");
    fabric.faults().port_up("a1", 1).unwrap();
    eventually(|| a.peers()[0].rails.iter().all(|r| r.up).then_some(()));
    let ids = a.submit(&[req]).unwrap();
    let o = a.wait(ids[0], Duration::from_secs(5)).unwrap();
    assert_eq!(o.status, Status::Complete, "{o:?}");
    assert_eq!(dst.to_vec(0, 16384).unwrap(), pattern(16384, 1));
}

/// How many memory regions the fabric holds on each of `host`'s `nics`
/// devices (`a0`, `a1`, ...).
fn mrs_on(fabric: &SimFabric, host: &str, nics: usize) -> Vec<usize> {
    names(host, nics)
        .iter()
        .map(|d| fabric.counts_on(d).expect("a device of the fabric").mrs)
        .collect()
}

/// Retries `f` until it yields (the pollers see async events
/// asynchronously); gives up after 5 s.
fn eventually<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(std::time::Instant::now() < deadline, "condition never held");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn check_the_original_device_error_and_count_physical_copies_one_per_context_local_two_per_context_remote()
 {
    let fabric = fabric(2, Delivery::Manual, 4);
    let a = builder(&fabric, "a", 2).build().unwrap();
    let local = register(&a, &region(1000, 1), Access::LocalOnly);
    assert_eq!(local.copies, 2);
    assert_eq!(mrs_on(&fabric, "a", 2), [1, 1], "one per context, local");
    let remote = register(&a, &region(1000, 1), Access::RemoteRead);
    assert_eq!(remote.copies, 4);
    assert_eq!(
        mrs_on(&fabric, "a", 2),
        [3, 3],
        "two more per context, remote"
    );
    assert_eq!(
        a.charges(),
        Charges {
            mrs: 6,
            bytes: 6000
        }
    );
    // The original device error comes back with the device identity.
    fabric
        .faults()
        .fail_registration(Some("a1"), 1, ENOMEM)
        .unwrap();
    let err = a
        .register_host(region(1000, 1), Access::LocalOnly)
        .unwrap_err();
    match &err {
        RegisterError::Native {
            nic,
            device,
            copy,
            source,
            ..
        } => {
            assert_eq!(*nic, NicId(1));
            assert_eq!(device.name, "a1");
            assert_eq!(*copy, "local-access");
            assert!(
                matches!(
                    **source,
                    orbitte_verbs::RegisterError::Native {
                        source: orbitte_verbs::NativeError {
                            call: "ibv_reg_mr",
                            errno: ENOMEM
                        },
                        ..
                    }
                ),
                "{source}"
            );
        }
        other => panic!("expected a native error, got {other:?}"),
    }
    assert!(err.to_string().contains("a1"), "{err}");
    // The copy made on a0 before the failure was released.
    assert_eq!(
        a.charges(),
        Charges {
            mrs: 6,
            bytes: 6000
        }
    );
    assert_eq!(mrs_on(&fabric, "a", 2), [3, 3], "a0's new copy released");
}

#[test]
fn both_limits_charge_the_full_view_for_each_copy() {
    let fabric = fabric(2, Delivery::Manual, 5);
    // 2 contexts x 2 copies x 10_000 bytes = 40_000 bytes, 4 MRs.
    let a = builder(&fabric, "a", 2)
        .budgets(Budgets {
            max_mrs: 4,
            max_bytes: 40_000,
        })
        .build()
        .unwrap();
    let r = register(&a, &region(10_000, 1), Access::REMOTE_READ_WRITE);
    assert_eq!(
        a.charges(),
        Charges {
            mrs: 4,
            bytes: 40_000
        }
    );
    a.unregister(r.id).unwrap();
    assert_eq!(a.charges(), Charges::default());
    let b = builder(&fabric, "a", 2)
        .budgets(Budgets {
            max_mrs: 100,
            max_bytes: 39_999,
        })
        .build()
        .unwrap();
    let err = b
        .register_host(region(10_000, 1), Access::REMOTE_READ_WRITE)
        .unwrap_err();
    match err {
        RegisterError::ResourceExhausted {
            resource,
            asked,
            in_use,
            limit,
        } => {
            assert_eq!(
                (resource, asked, in_use, limit),
                ("registered bytes", 40_000, 0, 39_999)
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn published_registrations_cannot_be_evicted_retire_unused_or_adjust_budgets() {
    let fabric = fabric(1, Delivery::Background, 6);
    let a = builder(&fabric, "a", 1)
        .budgets(Budgets {
            max_mrs: 3,
            max_bytes: 1 << 30,
        })
        .build()
        .unwrap();
    let b = builder(&fabric, "b", 1).build().unwrap();
    let first = register(&a, &region(4096, 1), Access::REMOTE_READ_WRITE);
    let err = a
        .register_host(region(4096, 1), Access::REMOTE_READ_WRITE)
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            RegisterError::ResourceExhausted {
                resource: "memory regions",
                asked: 2,
                in_use: 2,
                limit: 3
            }
        ),
        "{text}"
    );
    assert!(
        text.contains("never evicted") && text.contains("retire"),
        "{text}"
    );
    // The first registration is still published and usable by a peer.
    let dst = region(4096, 9);
    let rb = register(&b, &dst, Access::LocalOnly);
    let (pa, _) = connect(&b, &a);
    let ids = b
        .submit(&[TransferRequest::read(
            rb.id,
            0,
            pa.id,
            RangeId(first.id.0),
            0,
            4096,
        )])
        .unwrap();
    assert!(
        b.wait(ids[0], Duration::from_secs(5))
            .unwrap()
            .is_complete()
    );
    assert_eq!(dst.to_vec(0, 4096).unwrap(), pattern(4096, 1));
    // Retiring releases the remote copy's charge; then a local-only range fits.
    a.retire(first.id).unwrap();
    assert_eq!(a.charges().mrs, 1);
    register(&a, &region(4096, 1), Access::LocalOnly);
    a.unregister(first.id).unwrap();
}

#[test]
fn a_dispatch_mask_does_not_reduce_publication_fan_out() {
    let fabric = fabric(3, Delivery::Manual, 7);
    let a = builder(&fabric, "a", 3)
        .dispatch_mask(DeviceMask(0b001))
        .build()
        .unwrap();
    let r = register(&a, &region(4096, 1), Access::REMOTE_READ_WRITE);
    assert_eq!(r.copies, 6);
    assert_eq!(mrs_on(&fabric, "a", 3), [2, 2, 2], "what the fabric holds");
    assert_eq!(a.segment_publication().ranges[0].rkeys.len(), 3);
}

#[test]
fn registration_errors_do_not_automatically_switch_to_staging() {
    let fabric = fabric(1, Delivery::Manual, 8);
    let a = builder(&fabric, "a", 1).build().unwrap();
    fabric.faults().fail_registration(None, 1, ENOMEM).unwrap();
    let m = region(4096, 1);
    let err = a
        .register_host(m.clone(), Access::REMOTE_READ_WRITE)
        .unwrap_err();
    assert!(matches!(err, RegisterError::Native { .. }), "{err:?}");
    assert!(
        err.to_string().contains("no automatic switch to staging"),
        "{err}"
    );
    // Nothing registered, nothing published, nothing charged, memory not held.
    assert!(a.segment_publication().ranges.is_empty());
    assert_eq!(a.charges(), Charges::default());
    assert_eq!(Arc::strong_count(&m), 1);
}

#[test]
fn a_failure_part_way_releases_the_copies_already_made() {
    let fabric = fabric(3, Delivery::Manual, 9);
    let a = builder(&fabric, "a", 3).build().unwrap();
    // Copies are made context by context: a0 local, a0 remote, a1 local,
    // a1 remote, a2 local fails.
    fabric
        .faults()
        .fail_registration(Some("a2"), 1, ENOMEM)
        .unwrap();
    let m = region(4096, 1);
    let err = a
        .register_host(m.clone(), Access::REMOTE_READ_WRITE)
        .unwrap_err();
    match &err {
        RegisterError::Native {
            nic, device, copy, ..
        } => assert_eq!(
            (*nic, device.name.as_str(), *copy),
            (NicId(2), "a2", "local-access")
        ),
        other => panic!("expected a native error on a2, got {other:?}"),
    }
    // Two contexts succeeded and the third failed: nothing is published,
    // the four copies made on a0 and a1 are gone from the fabric, and no
    // budget stays charged.
    assert!(a.segment_publication().ranges.is_empty());
    assert_eq!(mrs_on(&fabric, "a", 3), [0, 0, 0], "what the fabric holds");
    assert_eq!(a.charges(), Charges::default());
    assert_eq!(Arc::strong_count(&m), 1, "every copy made was released");
    assert!(a.fenced().is_none());
    // The next registration publishes itself alone.
    let r = register(&a, &m, Access::REMOTE_READ_WRITE);
    let published: Vec<u64> = a
        .segment_publication()
        .ranges
        .iter()
        .map(|d| d.range_id.0)
        .collect();
    assert_eq!(published, [r.id.0]);
    assert_eq!(mrs_on(&fabric, "a", 3), [2, 2, 2]);
}

#[test]
fn a_failed_release_after_a_part_way_failure_is_unquiesced_fenced_and_charged() {
    let fabric = fabric(2, Delivery::Manual, 10);
    let a = builder(&fabric, "a", 2).build().unwrap();
    fabric
        .faults()
        .fail_registration(Some("a1"), 1, ENOMEM)
        .unwrap();
    fabric
        .faults()
        .fail_destroy("a0", ObjectKind::MemoryRegion, EBUSY)
        .unwrap();
    let m = region(4096, 1);
    let err = a.register_host(m.clone(), Access::LocalOnly).unwrap_err();
    let RegisterError::Unquiesced { unquiesced, cause } = &err else {
        panic!("{err:?}")
    };
    assert!(
        matches!(cause.as_ref(), RegisterError::Native { device, .. } if device.name == "a1"),
        "{cause}"
    );
    assert_eq!(unquiesced.failures.len(), 1);
    assert_eq!(unquiesced.failures[0].device.name, "a0");
    assert_eq!(
        a.charges(),
        Charges {
            mrs: 1,
            bytes: 4096
        },
        "the retained copy stays charged"
    );
    assert!(
        Arc::strong_count(&m) > 1,
        "the retained MR keeps the memory"
    );
    let fence = a.fenced().expect("fenced");
    assert!(fence.contains("unquiesced"), "{fence}");
    assert!(matches!(
        a.register_host(region(10, 1), Access::LocalOnly),
        Err(RegisterError::Fenced { .. })
    ));
}

#[test]
fn unregister_is_refused_while_requests_are_undrained() {
    let fabric = fabric(1, Delivery::Manual, 11);
    let a = builder(&fabric, "a", 1).build().unwrap();
    let b = builder(&fabric, "b", 1).build().unwrap();
    let ra = register(&a, &region(8192, 1), Access::LocalOnly);
    let rb = register(&b, &region(8192, 2), Access::REMOTE_READ_WRITE);
    let (pb, _) = connect(&a, &b);
    let ids = a
        .submit(&[TransferRequest::write(
            ra.id,
            0,
            pb.id,
            RangeId(rb.id.0),
            0,
            8192,
        )])
        .unwrap();
    // Manual delivery: nothing executes until the fabric is driven.
    let err = a.unregister(ra.id).unwrap_err();
    assert!(
        matches!(err, UnregisterError::Undrained { requests: 1, .. }),
        "{err}"
    );
    fabric.drive();
    let o = a.wait(ids[0], Duration::from_secs(5)).unwrap();
    assert!(o.is_complete(), "{o:?}");
    a.wait_drain(ids[0], Duration::from_secs(5)).unwrap();
    a.unregister(ra.id).unwrap();
    let err = a
        .submit(&[TransferRequest::write(
            ra.id,
            0,
            pb.id,
            RangeId(rb.id.0),
            0,
            1,
        )])
        .unwrap_err();
    assert!(matches!(err, SubmitError::Invalid { .. }), "{err}");
}

#[test]
fn memory_stays_alive_while_a_request_on_it_is_undrained() {
    let fabric = fabric(1, Delivery::Manual, 12);
    let a = builder(&fabric, "a", 1).build().unwrap();
    let b = builder(&fabric, "b", 1).build().unwrap();
    let m = HostMemory::alloc(8192).unwrap();
    let weak = Arc::downgrade(&m);
    let ra = register(&a, &m, Access::LocalOnly);
    let rb = register(&b, &region(8192, 2), Access::REMOTE_READ_WRITE);
    let (pb, _) = connect(&a, &b);
    let ids = a
        .submit(&[TransferRequest::write(
            ra.id,
            0,
            pb.id,
            RangeId(rb.id.0),
            0,
            8192,
        )])
        .unwrap();
    drop(m);
    assert!(matches!(
        a.unregister(ra.id),
        Err(UnregisterError::Undrained { .. })
    ));
    assert!(
        weak.upgrade().is_some(),
        "the undrained request keeps the memory mapped"
    );
    fabric.drive();
    a.wait(ids[0], Duration::from_secs(5)).unwrap();
    a.wait_drain(ids[0], Duration::from_secs(5)).unwrap();
    a.unregister(ra.id).unwrap();
    assert!(
        weak.upgrade().is_none(),
        "freed once drained and unregistered"
    );
}
