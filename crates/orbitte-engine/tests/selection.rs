//! docs/troubleshooting.md's "No RDMA device, or no compatible path is selected" section, one
//! test per sentence (named after it). The last sentence ("does not replay a
//! failed transfer through another rail") is in `failures.rs`.
#![forbid(unsafe_code)]

mod common;

use std::time::Duration;

use common::*;
use orbitte_engine::{
    Access, DeviceMask, EngineBuilder, RangeId, RdmaConfig, RegisterError, Status, SubmitError,
    TransferRequest,
};
use orbitte_topology::{GidType, InertCause, NicId, ProviderVisibility};
use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric, WrMatch};
use orbitte_verbs::{NodeAccess, WcStatus};

const EACCES: i32 = 13;

#[test]
fn check_provider_visibility_and_read_write_access_to_the_matching_uverbs_character_node() {
    let mut denied = SimDeviceDesc::roce("a0", [10, 1, 0, 1]);
    denied.uverbs_access = NodeAccess::Denied { errno: EACCES };
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            denied,
            SimDeviceDesc::roce("a1", [10, 1, 1, 1]),
            SimDeviceDesc::roce("hidden", [10, 1, 2, 1]),
        ]),
        30,
    );
    // "hidden" is not visible through this host's provider.
    let a = EngineBuilder::new("a")
        .provider(fabric.provider_for(&["a0", "a1"]))
        .build()
        .unwrap();
    assert_eq!(
        a.topology().listed,
        ["a0", "a1"],
        "only what the provider lists"
    );
    let r = register(&a, &region(4096, 1), Access::LocalOnly);
    assert_eq!(r.copies, 1, "only a1 could be opened");
    let mrs = |d: &str| fabric.counts_on(d).map(|c| c.mrs);
    assert_eq!(
        (mrs("a0"), mrs("a1"), mrs("hidden")),
        (Some(0), Some(1), Some(0)),
        "what the fabric holds"
    );
    let topo = a.topology();
    let t = topo.topology.unwrap();
    let slot = t.slot_by_name("a0").unwrap();
    assert!(slot.is_inert());
    let cause = slot.inert_cause().unwrap();
    assert!(
        matches!(cause, InertCause::Construction(why)
            if why.contains("ibv_open_device failed with errno 13") && why.contains("uverbs")),
        "{cause:?}"
    );
    assert_eq!(
        topo.contexts
            .iter()
            .map(|c| c.device.as_str())
            .collect::<Vec<_>>(),
        ["a1"]
    );
}

#[test]
fn confirm_the_device_port_is_active_and_the_selected_gid_is_valid_for_link_layer_gid_type_and_netdev()
 {
    let fabric = fabric(1, Delivery::Manual, 31);
    let cfg = RdmaConfig::default()
        .gid_type(GidType::RoceV2)
        .netdev("a0-eth");
    let a = builder(&fabric, "a", 1).rdma(cfg).build().unwrap();
    register(&a, &region(64, 1), Access::LocalOnly);
    let c = &a.topology().contexts[0];
    assert_eq!(
        (c.port, c.gid_index, c.port_active),
        (1, 1, true),
        "the RoCE v2 GID on a0-eth"
    );
    // A netdev that does not exist: nothing is selected, and it says why.
    let b = builder(&fabric, "a", 1)
        .rdma(RdmaConfig::default().netdev("eth9"))
        .build()
        .unwrap();
    let err = b
        .register_host(region(64, 1), Access::LocalOnly)
        .unwrap_err();
    assert!(matches!(err, RegisterError::NoUsableNic { .. }), "{err:?}");
    assert!(err.to_string().contains("eth9"), "{err}");
    // A port that is not active shows in the topology and gives no rail.
    fabric.faults().port_down("a0", 1).unwrap();
    assert!(!a.topology().contexts[0].port_active);
}

#[test]
fn an_explicit_device_port_gid_pin_is_strict() {
    let fabric = fabric(2, Delivery::Manual, 32);
    let a = builder(&fabric, "a", 2)
        .rdma(RdmaConfig::new("a0").gid_index(7))
        .build()
        .unwrap();
    let err = a
        .register_host(region(64, 1), Access::LocalOnly)
        .unwrap_err();
    assert!(
        matches!(err, RegisterError::NoUsableNic { .. }),
        "no fallback to another gid or device: {err:?}"
    );
    assert!(err.to_string().contains('7'), "{err}");
    assert!(a.topology().contexts.is_empty());
}

#[test]
fn rdma_config_new_selects_port_1_and_gid_0_explicitly_use_default_and_optional_selectors_for_discovery()
 {
    let fabric = fabric(2, Delivery::Manual, 33);
    let a = builder(&fabric, "a", 2)
        .rdma(RdmaConfig::new("a1"))
        .build()
        .unwrap();
    register(&a, &region(64, 1), Access::LocalOnly);
    let ctx: Vec<_> = a
        .topology()
        .contexts
        .iter()
        .map(|c| (c.device.clone(), c.port, c.gid_index))
        .collect();
    assert_eq!(ctx, [("a1".to_owned(), 1, 0)]);
    let d = builder(&fabric, "a", 2)
        .rdma(RdmaConfig::default())
        .build()
        .unwrap();
    register(&d, &region(64, 1), Access::LocalOnly);
    let names: Vec<_> = d
        .topology()
        .contexts
        .iter()
        .map(|c| c.device.clone())
        .collect();
    assert_eq!(names, ["a0", "a1"], "default discovers every usable device");
}

#[test]
fn a_nonempty_whitelist_takes_precedence_over_the_blacklist_and_still_intersects_a_device_pin() {
    let fabric = fabric(2, Delivery::Manual, 34);
    let a = builder(&fabric, "a", 2)
        .rdma(
            RdmaConfig::default()
                .whitelist(["a0", "a1"])
                .blacklist(["a0"]),
        )
        .build()
        .unwrap();
    register(&a, &region(64, 1), Access::LocalOnly);
    assert_eq!(
        a.topology().contexts.len(),
        2,
        "the whitelist wins over the blacklist"
    );
    let b = builder(&fabric, "a", 2)
        .rdma(RdmaConfig::default().device("a0").whitelist(["a1"]))
        .build()
        .unwrap();
    let err = b
        .register_host(region(64, 1), Access::LocalOnly)
        .unwrap_err();
    assert!(
        matches!(err, RegisterError::NoUsableNic { .. }),
        "pin a0 ∩ whitelist a1 = nothing: {err:?}"
    );
}

#[test]
fn device_mask_uses_topology_nic_ids_including_inert_slots_after_failed_construction() {
    let fabric = fabric(2, Delivery::Background, 35);
    fabric.faults().fail_open(Some("a0"), 1, EACCES).unwrap();
    let b = builder(&fabric, "b", 2).build().unwrap();
    let dst = region(8192, 2);
    let rb = register(&b, &dst, Access::REMOTE_READ_WRITE);
    for (mask, works) in [(0b10, true), (0b01, false)] {
        let a = builder(&fabric, "a", 2)
            .dispatch_mask(DeviceMask(mask))
            .build()
            .unwrap();
        let ra = register(&a, &region(8192, 1), Access::LocalOnly);
        let t = a.topology().topology.unwrap();
        assert!(
            t.slots()[0].is_inert(),
            "a0 keeps NIC ID 0 as an inert slot"
        );
        assert_eq!(t.slots()[1].name(), "a1");
        let (pb, _) = connect(&a, &b);
        let req = TransferRequest::write(ra.id, 0, pb.id, RangeId(rb.id.0), 0, 8192);
        match a.submit(&[req]) {
            Ok(ids) => {
                assert!(works);
                assert_eq!(
                    a.wait(ids[0], Duration::from_secs(5)).unwrap().status,
                    Status::Complete
                );
            }
            Err(e) => {
                assert!(!works, "{e}");
                assert!(
                    matches!(e, SubmitError::Invalid { .. })
                        && e.to_string().contains("dispatch mask"),
                    "{e}"
                );
            }
        }
        // Only the first open of a0 fails.
        fabric.faults().fail_open(Some("a0"), 1, EACCES).unwrap();
    }
}

/// The provider lists devices in its own order (libibverbs' list order is
/// not sorted); NIC IDs are still the topology positions `orbitte topology`
/// shows (natural name order), and a `device_mask` bit names that NIC.
#[test]
fn device_mask_uses_topology_nic_ids_whatever_order_the_provider_lists_devices_in() {
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("a2", [10, 1, 2, 1]),
            SimDeviceDesc::roce("a10", [10, 1, 10, 1]),
            SimDeviceDesc::roce("a1", [10, 1, 1, 1]),
            SimDeviceDesc::roce("b0", [10, 2, 0, 1]),
        ])
        .with_delivery(Delivery::Background),
        38,
    );
    let b = builder(&fabric, "b", 1).build().unwrap();
    let a = builder(&fabric, "a", 0)
        .provider(fabric.provider_for(&["a2", "a10", "a1"]))
        .dispatch_mask(DeviceMask(0b010))
        .build()
        .unwrap();
    assert_eq!(a.topology().listed, ["a1", "a2", "a10"], "NIC ID order");
    let ra = register(&a, &region(8192, 1), Access::LocalOnly);
    let t = a.topology().topology.unwrap();
    let names: Vec<(u32, &str)> = t.slots().iter().map(|s| (s.id().0, s.name())).collect();
    assert_eq!(names, [(0, "a1"), (1, "a2"), (2, "a10")]);
    for slot in t.slots() {
        assert_eq!(
            slot.nic().map(|n| n.provider),
            Some(ProviderVisibility::Visible),
            "the engine's topology comes from the provider's list: {slot:?}"
        );
    }
    let rb = register(&b, &region(8192, 2), Access::REMOTE_READ_WRITE);
    let (pb, _) = connect(&a, &b);
    for rail in &pb.rails {
        let expected = ["a1", "a2", "a10"][rail.nic.unwrap().index()];
        assert_eq!(rail.device.as_deref(), Some(expected), "{rail:?}");
    }
    // Bit 1 of the mask is NIC ID 1, a2: a failure injected on a2 is the
    // request's failure.
    fabric.faults().fail_send(
        WrMatch::nth(1).on_device("a2"),
        WcStatus::RetryExceeded,
        false,
    );
    let req = TransferRequest::write(ra.id, 0, pb.id, RangeId(rb.id.0), 0, 8192);
    let id = a.submit(&[req]).unwrap()[0];
    let o = a.wait(id, Duration::from_secs(5)).unwrap();
    assert_eq!(o.status, Status::Failed, "{o:?}");
    assert_eq!(
        o.failure.as_ref().and_then(|f| f.nic),
        Some(NicId(1)),
        "{o:?}"
    );
}

#[test]
fn host_direct_registration_itself_initializes_contexts_inspect_topology_after_registration_or_first_rdma_use()
 {
    let fabric = fabric(2, Delivery::Background, 36);
    let a = builder(&fabric, "a", 2).build().unwrap();
    let before = a.topology();
    assert!(!before.initialized && before.contexts.is_empty());
    assert_eq!(before.listed, ["a0", "a1"]);
    register(&a, &region(64, 1), Access::LocalOnly);
    let after = a.topology();
    assert!(after.initialized);
    assert_eq!(after.contexts.len(), 2);
    // First RDMA use (opening a peer) initializes too.
    let b = builder(&fabric, "b", 2).build().unwrap();
    let c = builder(&fabric, "a", 2).build().unwrap();
    assert!(!b.topology().initialized);
    connect(&c, &b);
    assert!(b.topology().initialized && c.topology().initialized);
}

#[test]
fn matching_gid_families_or_nic_names_does_not_prove_that_two_fabric_ports_can_connect() {
    let a0 = SimDeviceDesc::roce("a0", [10, 1, 0, 1]);
    let mut b0 = SimDeviceDesc::roce("b0", [10, 2, 0, 1]);
    b0.ports[0].network = 7; // another fabric: same GID family, no route
    let fabric = SimFabric::new(
        SimDescription::new(vec![a0, b0]).with_delivery(Delivery::Background),
        37,
    );
    let a = builder(&fabric, "a", 1).build().unwrap();
    let b = builder(&fabric, "b", 1).build().unwrap();
    let ra = register(&a, &region(4096, 1), Access::LocalOnly);
    let dst = region(4096, 2);
    let rb = register(&b, &dst, Access::REMOTE_READ_WRITE);
    let (pb, _) = connect(&a, &b);
    assert_eq!(
        pb.rails.len(),
        1,
        "selection and connection setup succeed locally"
    );
    let ids = a
        .submit(&[TransferRequest::write(
            ra.id,
            0,
            pb.id,
            RangeId(rb.id.0),
            0,
            4096,
        )])
        .unwrap();
    let o = a.wait(ids[0], Duration::from_secs(5)).unwrap();
    assert_eq!(o.status, Status::Failed, "{o:?}");
    assert!(o.failure.unwrap().to_string().contains("RetryExceeded"));
    assert_eq!(dst.to_vec(0, 4096).unwrap(), pattern(4096, 2));
}
