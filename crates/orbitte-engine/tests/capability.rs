//! The capability matrix as data: rdma evaluated for real on the sim, the
//! other paths as rows the engine does not evaluate.
#![forbid(unsafe_code)]

mod common;

use common::*;
use orbitte_engine::{Check, EngineBuilder, PathKind};
use orbitte_verbs::sim::{Delivery, SimDescription, SimFabric, WrMatch};
use orbitte_verbs::{ObjectKind, WcStatus};

#[test]
fn rdma_row_passes_build_discovery_completion_and_drain_on_a_working_nic() {
    let fabric = fabric(2, Delivery::Background, 60);
    let a = builder(&fabric, "a", 2).build().unwrap();
    assert!(!a.topology().initialized);
    let m = a.capabilities();
    let r = m.row(PathKind::Rdma).unwrap();
    assert_eq!(
        (&r.build, &r.discovery, &r.completion, &r.drain),
        (&Check::Pass, &Check::Pass, &Check::Pass, &Check::Pass),
        "{m}"
    );
    assert!(a.topology().initialized, "the check is an RDMA use");
    for p in [PathKind::GpudirectRdma, PathKind::CudaIpc, PathKind::Nvlink] {
        let row = m.row(p).unwrap();
        assert_eq!(row.build, Check::NotImplemented);
        assert_eq!(row.completion, Check::NotImplemented);
    }
    // Before evaluation the other paths are skipped rows waiting for their
    // path to contribute (net: tcp/local, staging: cuda-staging).
    let base = orbitte_engine::CapabilityMatrix::baseline();
    for p in [PathKind::Tcp, PathKind::Local, PathKind::CudaStaging] {
        assert!(matches!(
            base.row(p).unwrap().discovery,
            Check::Skipped { .. }
        ));
    }
    assert_eq!(m.rows.len(), 7);
    assert!(m.to_string().contains("gpudirect-rdma"));
}

#[test]
fn no_device_fails_discovery_with_a_fix_and_skips_the_rest() {
    let fabric = SimFabric::new(SimDescription::new(vec![]), 61);
    let a = EngineBuilder::new("lonely")
        .provider(fabric.provider())
        .build()
        .unwrap();
    let r = a.evaluate_rdma();
    assert_eq!(r.build, Check::Pass);
    let Check::Fail { reason, fix } = &r.discovery else {
        panic!("{r:?}")
    };
    assert!(reason.contains("no RDMA device"), "{reason}");
    assert!(fix.contains("rdma-core"), "{fix}");
    assert!(matches!(r.completion, Check::Skipped { .. }));
    assert!(matches!(r.drain, Check::Skipped { .. }));
}

#[test]
fn a_paused_port_fails_discovery_not_build() {
    let fabric = fabric(1, Delivery::Background, 62);
    fabric.faults().port_down("a0", 1).unwrap();
    let a = builder(&fabric, "a", 1).build().unwrap();
    let r = a.evaluate_rdma();
    assert!(
        matches!(&r.discovery, Check::Fail { reason, .. } if reason.contains("down")),
        "{r:?}"
    );
}

#[test]
fn a_failing_loopback_fails_completion_and_skips_drain() {
    let fabric = fabric(1, Delivery::Background, 63);
    let a = builder(&fabric, "a", 1).build().unwrap();
    a.topology();
    fabric
        .faults()
        .fail_send(WrMatch::nth(1), WcStatus::RetryExceeded, false);
    let r = a.evaluate_rdma();
    assert_eq!(r.discovery, Check::Pass);
    let Check::Fail { reason, .. } = &r.completion else {
        panic!("{r:?}")
    };
    assert!(
        reason.contains("RetryExceeded") && reason.contains("NIC ID 0"),
        "{reason}"
    );
    assert!(matches!(r.drain, Check::Skipped { .. }));
}

const EBUSY: i32 = 16;

/// A destroy of the loopback's own objects that fails is a native cleanup
/// failure like any other: `Unquiesced` recorded with the evidence, new
/// admission fenced with the reason, and the drain check fails.
#[test]
fn a_failed_destroy_in_the_loopback_is_unquiesced_and_fences() {
    let fabric = fabric(1, Delivery::Background, 64);
    let a = builder(&fabric, "a", 1).build().unwrap();
    a.topology();
    fabric
        .faults()
        .fail_destroy("a0", ObjectKind::QueuePair, EBUSY)
        .unwrap();
    let r = a.evaluate_rdma();
    assert_eq!(r.completion, Check::Pass, "{r:?}");
    let Check::Fail { reason, fix } = &r.drain else {
        panic!("{r:?}")
    };
    assert!(reason.contains("a0"), "{reason}");
    assert!(fix.contains("Unquiesced"), "{fix}");
    let u = a.unquiesced();
    assert_eq!(u.len(), 1, "{u:?}");
    assert!(u[0].during.contains("capability check"), "{}", u[0]);
    assert_eq!(u[0].failures[0].object, ObjectKind::QueuePair);
    assert_eq!(u[0].failures[0].device.name, "a0");
    let fenced = a.fenced().expect("fenced");
    assert!(fenced.contains("unquiesced"), "{fenced}");
    assert!(matches!(
        a.register_host(region(64, 1), orbitte_engine::Access::LocalOnly),
        Err(orbitte_engine::RegisterError::Fenced { .. })
    ));
}

/// An early error (the WRITE's completion fails) still closes every
/// loopback object explicitly, so a failed destroy there is reported and
/// recorded, not hidden in a drop.
#[test]
fn an_early_loopback_error_still_closes_and_reports_its_objects() {
    let fabric = fabric(1, Delivery::Background, 65);
    let a = builder(&fabric, "a", 1).build().unwrap();
    a.topology();
    fabric
        .faults()
        .fail_send(WrMatch::nth(1), WcStatus::RetryExceeded, false);
    fabric
        .faults()
        .fail_destroy("a0", ObjectKind::MemoryRegion, EBUSY)
        .unwrap();
    let r = a.evaluate_rdma();
    assert!(matches!(r.completion, Check::Fail { .. }), "{r:?}");
    assert!(
        matches!(&r.drain, Check::Fail { reason, .. } if reason.contains("a0")),
        "{r:?}"
    );
    let u = a.unquiesced();
    assert_eq!(u.len(), 1, "{u:?}");
    assert_eq!(u[0].failures[0].object, ObjectKind::MemoryRegion);
    assert!(a.fenced().is_some());
    assert_eq!(fabric.counts().qps, 0, "the loopback QPs were destroyed");
}

#[test]
fn the_default_native_provider_never_fails_the_build_and_reports_discovery() {
    // Whatever this machine has: no libibverbs and no device are a reported
    // capability, never a build failure or a panic.
    let a = EngineBuilder::new("native").build().unwrap();
    let r = a.evaluate_rdma();
    assert_eq!(r.build, Check::Pass);
    match &r.discovery {
        Check::Pass => {}
        Check::Fail { reason, fix } => {
            assert!(!reason.is_empty() && !fix.is_empty());
            assert!(matches!(r.completion, Check::Skipped { .. }));
            let err = a
                .register_host(region(64, 1), orbitte_engine::Access::LocalOnly)
                .unwrap_err();
            assert!(
                matches!(err, orbitte_engine::RegisterError::NoUsableNic { .. }),
                "{err:?}"
            );
        }
        other => panic!("discovery must pass or fail with a fix: {other:?}"),
    }
}
