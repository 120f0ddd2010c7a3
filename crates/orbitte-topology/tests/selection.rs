//! Selection rules on the fixture machines: pins, selectors, the
//! whitelist/blacklist/pin algebra, device masks, GID choice, reasons.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use orbitte_topology::{
    DeviceExclusion, DeviceMask, GidChoiceError, GidProblem, GidType, InertCause, LinkLayer, NicId,
    PortExclusion, PortOutcome, PortState, RdmaConfig, SelectionError, SysfsRoots, Topology,
    UverbsAccess, discover, select,
};

fn fixture(machine: &str) -> Topology {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(machine);
    discover(&SysfsRoots::fixture(root))
}

fn devices(sel: &orbitte_topology::Selection) -> Vec<&str> {
    sel.rails.iter().map(|r| r.device.as_str()).collect()
}

fn nothing(err: SelectionError) -> Vec<orbitte_topology::NicReport> {
    match err {
        SelectionError::NothingSelected { report, .. } => report,
        other => panic!("expected NothingSelected, got {other}"),
    }
}

#[test]
fn default_discovers_and_picks_v2_ipv4_first() {
    let t = fixture("cx7-roce");
    let sel = select(&t, &RdmaConfig::default(), DeviceMask::ALL).unwrap();
    assert_eq!(devices(&sel), ["mlx5_0"]);
    let rail = &sel.rails[0];
    assert_eq!((rail.nic, rail.port, rail.gid.index), (NicId(0), 1, 3));
    assert_eq!(rail.gid.gid_type, Some(GidType::RoceV2));
    assert_eq!(rail.link_layer, LinkLayer::Ethernet);
    // The down port is reported, not selected.
    let down = &sel.report[1].ports[0];
    assert_eq!(
        down.outcome,
        PortOutcome::Excluded(vec![PortExclusion::NotActive(PortState::Down)])
    );
}

#[test]
fn automatic_gid_order_v2_ipv4_then_global_then_link_local_then_v1() {
    let t = fixture("cx7-roce");
    let mut nic = t.slots()[0].nic().unwrap().clone();
    let cfg = RdmaConfig::default();
    let order: Vec<u32> = (0..6)
        .map(|_| {
            let port = &mut nic.ports[0];
            let chosen = orbitte_topology::choose_gid(port, &cfg).unwrap().index;
            port.gids.retain(|g| g.index != chosen);
            chosen
        })
        .collect();
    // 3: v2 IPv4, 5: v2 global IPv6, 1: v2 link-local, then v1 in the same family order.
    assert_eq!(order, [3, 5, 1, 2, 4, 0]);
    let port = &nic.ports[0];
    assert!(matches!(
        orbitte_topology::choose_gid(port, &cfg),
        Err(GidChoiceError::NoUsableGid { rejected }) if rejected.is_empty()
    ));
}

#[test]
fn gid_type_and_netdev_selectors_filter_automatic_choice() {
    let t = fixture("cx7-roce");
    let sel = select(
        &t,
        &RdmaConfig::default().gid_type(GidType::RoceV1),
        DeviceMask::ALL,
    )
    .unwrap();
    assert_eq!(sel.rails[0].gid.index, 2);
    let err = select(&t, &RdmaConfig::default().netdev("eth9"), DeviceMask::ALL).unwrap_err();
    let report = nothing(err);
    let PortOutcome::Excluded(reasons) = &report[0].ports[0].outcome else {
        panic!()
    };
    let PortExclusion::Gid(GidChoiceError::NoUsableGid { rejected }) = &reasons[0] else {
        panic!("{reasons:?}")
    };
    assert_eq!(rejected.len(), 6);
    assert!(
        rejected
            .iter()
            .all(|(_, p)| matches!(p, GidProblem::Netdev { wanted, .. } if wanted == "eth9"))
    );
}

#[test]
fn new_pins_port_1_gid_0_strictly() {
    let t = fixture("cx7-roce");
    let sel = select(&t, &RdmaConfig::new("mlx5_0"), DeviceMask::ALL).unwrap();
    assert_eq!(devices(&sel), ["mlx5_0"]);
    assert_eq!((sel.rails[0].port, sel.rails[0].gid.index), (1, 0));
    assert_eq!(sel.rails[0].gid.gid_type, Some(GidType::RoceV1));
    // Pinned GID 0 is RoCE v1; asking for v2 is an error naming the mismatch, no fallback to 1.
    let err = select(
        &t,
        &RdmaConfig::new("mlx5_0").gid_type(GidType::RoceV2),
        DeviceMask::ALL,
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("pinned gid index 0: type RoCE v1, configured RoCE v2"),
        "{text}"
    );
    // The down port is not replaced by anything else.
    let err = select(&t, &RdmaConfig::new("mlx5_1"), DeviceMask::ALL).unwrap_err();
    let report = nothing(err);
    assert_eq!(
        report[0].excluded,
        vec![DeviceExclusion::NotPinnedDevice {
            pinned: "mlx5_1".into()
        }]
    );
    let PortOutcome::Excluded(r) = &report[1].ports[0].outcome else {
        panic!()
    };
    assert_eq!(r[0], PortExclusion::NotActive(PortState::Down));
    // Pinned port 2 does not exist on a single-port device.
    let err = select(&t, &RdmaConfig::new("mlx5_0").port(2), DeviceMask::ALL).unwrap_err();
    let report = nothing(err);
    assert_eq!(
        report[0].ports[0].outcome,
        PortOutcome::Excluded(vec![PortExclusion::NotPinnedPort { pinned: 2 }])
    );
}

#[test]
fn pinned_gid_mismatches_are_named() {
    let t = fixture("cx7-roce");
    let cases = [
        (
            RdmaConfig::new("mlx5_0").gid_index(7),
            "pinned gid index 7: empty entry",
        ),
        (
            RdmaConfig::new("mlx5_0").gid_index(3).netdev("eth9"),
            "netdev ens1f0np0, configured eth9",
        ),
        (
            RdmaConfig::new("mlx5_0").link_layer(LinkLayer::InfiniBand),
            "link layer Ethernet, configured InfiniBand",
        ),
    ];
    for (cfg, needle) in cases {
        let text = select(&t, &cfg, DeviceMask::ALL).unwrap_err().to_string();
        assert!(text.contains(needle), "{needle:?} not in: {text}");
    }
    // A RoCE type pinned on an InfiniBand port: invalid for the link layer.
    let ib = fixture("ib-hdr");
    let text = select(
        &ib,
        &RdmaConfig::new("mlx5_0").gid_type(GidType::RoceV2),
        DeviceMask::ALL,
    )
    .unwrap_err()
    .to_string();
    assert!(text.contains("type IB, configured RoCE v2"), "{text}");
    let text = select(&ib, &RdmaConfig::default().netdev("ib0"), DeviceMask::ALL)
        .unwrap_err()
        .to_string();
    assert!(text.contains("no netdev, configured ib0"), "{text}");
    // Contradictory config is the caller's error.
    let err = select(
        &ib,
        &RdmaConfig::default()
            .gid_type(GidType::RoceV2)
            .link_layer(LinkLayer::InfiniBand),
        DeviceMask::ALL,
    );
    assert!(matches!(err, Err(SelectionError::InvalidConfig(_))));
}

#[test]
fn infiniband_uses_the_port_gid_and_skips_unopenable_uverbs() {
    let t = fixture("ib-hdr");
    let sel = select(&t, &RdmaConfig::default(), DeviceMask::ALL).unwrap();
    assert_eq!(devices(&sel), ["mlx5_0"]);
    assert_eq!(sel.rails[0].gid.index, 0);
    assert_eq!(sel.rails[0].gid.gid_type, Some(GidType::Ib));
    assert!(matches!(
        &sel.report[1].excluded[..],
        [DeviceExclusion::Uverbs { access: UverbsAccess::Denied, node: Some(n) }] if n.ends_with("uverbs1")
    ));
    let text = select(&t, &RdmaConfig::new("mlx5_1"), DeviceMask::ALL)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("uverbs node") && text.contains("not readable and writable"),
        "{text}"
    );
}

#[test]
fn whitelist_beats_blacklist_and_intersects_the_pin() {
    let t = fixture("dgx-8gpu");
    let all = |cfg: &RdmaConfig| select(&t, cfg, DeviceMask::ALL);
    let sel = all(&RdmaConfig::default().blacklist(["mlx5_0", "mlx5_3"])).unwrap();
    assert_eq!(sel.rails.len(), 6);
    assert!(!devices(&sel).contains(&"mlx5_0"));
    // Nonempty whitelist: the blacklist is ignored.
    let sel = all(&RdmaConfig::default()
        .whitelist(["mlx5_0", "mlx5_4"])
        .blacklist(["mlx5_0"]))
    .unwrap();
    assert_eq!(devices(&sel), ["mlx5_0", "mlx5_4"]);
    // Whitelist intersects the device pin.
    let sel = all(&RdmaConfig::default()
        .device("mlx5_4")
        .whitelist(["mlx5_0", "mlx5_4"]))
    .unwrap();
    assert_eq!(devices(&sel), ["mlx5_4"]);
    let report = nothing(
        all(&RdmaConfig::default()
            .device("mlx5_5")
            .whitelist(["mlx5_0", "mlx5_4"]))
        .unwrap_err(),
    );
    let r5 = report.iter().find(|r| r.name == "mlx5_5").unwrap();
    assert_eq!(r5.excluded, vec![DeviceExclusion::NotInWhitelist]);
    let r0 = report.iter().find(|r| r.name == "mlx5_0").unwrap();
    assert_eq!(
        r0.excluded,
        vec![DeviceExclusion::NotPinnedDevice {
            pinned: "mlx5_5".into()
        }]
    );
}

#[test]
fn device_mask_bits_are_nic_ids_and_inert_slots_keep_theirs() {
    let mut t = fixture("dgx-8gpu");
    let sel = select(&t, &RdmaConfig::default(), DeviceMask(0b1010_0000)).unwrap();
    assert_eq!(devices(&sel), ["mlx5_9", "mlx5_11"]);
    t.mark_inert(
        NicId(5),
        InertCause::Construction("ibv_open_device: EIO".into()),
    )
    .unwrap();
    // IDs after the inert slot do not shift.
    assert_eq!(t.slots()[7].name(), "mlx5_11");
    assert_eq!(t.slots()[5].id(), NicId(5));
    let sel = select(&t, &RdmaConfig::default(), DeviceMask(0b1010_0000)).unwrap();
    assert_eq!(devices(&sel), ["mlx5_11"]);
    let err = select(&t, &RdmaConfig::default(), DeviceMask(1 << 5 | 1 << 9)).unwrap_err();
    match &err {
        SelectionError::MaskSelectsNoActiveNic { inert, absent, .. } => {
            assert_eq!(inert.len(), 1);
            assert_eq!(inert[0].0, NicId(5));
            assert_eq!(absent, &[NicId(9)]);
        }
        other => panic!("{other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("only inert or absent")
            && text.contains("mlx5_9 is inert")
            && text.contains("nic 9 absent"),
        "{text}"
    );
    assert!(
        t.mark_inert(NicId(8), InertCause::Construction("x".into()))
            .is_err()
    );
}

#[test]
fn nothing_selected_lists_every_device_and_port_with_its_reason() {
    let mut t = fixture("lab-edge-cases");
    t.set_provider_visibility(["mlx5_1", "mlx5_3", "mlx5_4", "mlx5_5", "rxe0"]);
    let cfg = RdmaConfig::default().whitelist(["mlx5_0", "mlx5_1", "mlx5_3", "mlx5_4", "mlx5_5"]);
    let err = select(&t, &cfg, DeviceMask(!(1 << 4))).unwrap_err();
    let text = err.to_string();
    let report = nothing(err);
    assert_eq!(report.len(), 8, "{text}");
    let by = |n: &str| report.iter().find(|r| r.name == n).unwrap();
    assert_eq!(
        by("mlx5_0").excluded,
        vec![DeviceExclusion::ProviderNotVisible]
    );
    // mlx5_1: device fine, port has an empty GID table.
    assert!(by("mlx5_1").excluded.is_empty());
    assert_eq!(
        by("mlx5_1").ports[0].outcome,
        PortOutcome::Excluded(vec![PortExclusion::Gid(GidChoiceError::NoUsableGid {
            rejected: vec![]
        })])
    );
    assert!(matches!(
        &by("mlx5_2").excluded[0],
        DeviceExclusion::Inert(InertCause::Discovery(_))
    ));
    let PortOutcome::Excluded(r3) = &by("mlx5_3").ports[0].outcome else {
        panic!()
    };
    assert_eq!(r3[0], PortExclusion::NotActive(PortState::Unknown));
    assert!(
        matches!(&r3[1], PortExclusion::Gid(GidChoiceError::NoUsableGid { rejected }) if rejected == &[(0, GidProblem::TypeUnknown)])
    );
    assert_eq!(
        by("mlx5_4").excluded,
        vec![
            DeviceExclusion::MaskedOut,
            DeviceExclusion::Uverbs {
                node: None,
                access: UverbsAccess::NoNode
            }
        ]
    );
    assert!(matches!(
        &by("mlx5_5").excluded[..],
        [DeviceExclusion::Uverbs {
            access: UverbsAccess::ReadOnly,
            ..
        }]
    ));
    assert!(matches!(
        &by("mlx5_6").excluded[0],
        DeviceExclusion::Inert(_)
    ));
    assert_eq!(by("rxe0").excluded, vec![DeviceExclusion::NotInWhitelist]);
    for needle in [
        "provider not visible",
        "gid table empty",
        "inert slot: discovery failed",
        "port not active (state unknown)",
        "masked out by device_mask",
        "no uverbs node",
        "read-only",
        "not in the whitelist",
        "nic 7 rxe0",
        "discovery problem",
        "ports/1/state: expected a port state",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    // Blacklist and pin reasons appear as well.
    let text = select(
        &t,
        &RdmaConfig::default().device("mlx5_9").blacklist(["rxe0"]),
        DeviceMask::ALL,
    )
    .unwrap_err()
    .to_string();
    assert!(
        text.contains("in the blacklist") && text.contains("pinned device mlx5_9 does not exist"),
        "{text}"
    );
}

#[test]
fn soft_roce_without_pci_is_selectable() {
    let t = fixture("lab-edge-cases");
    let sel = select(&t, &RdmaConfig::default(), DeviceMask::ALL).unwrap();
    assert_eq!(devices(&sel), ["mlx5_0", "rxe0"]);
    assert_eq!(sel.rails[1].gid.netdev.as_deref(), Some("eth1"));
}

#[test]
fn empty_topology_error_says_so() {
    let text = select(
        &Topology::default(),
        &RdmaConfig::default(),
        DeviceMask::ALL,
    )
    .unwrap_err()
    .to_string();
    assert!(text.contains("no rdma devices"), "{text}");
}

#[test]
fn pinned_gid_of_the_wrong_link_layer_is_named() {
    use orbitte_topology::{Gid, Nic, Port};
    let gid = Gid {
        index: 0,
        value: "::ffff:10.0.0.1".parse().unwrap(),
        gid_type: Some(GidType::RoceV2),
        netdev: None,
    };
    let t = Topology::from_nics([Nic::new(
        "rec0",
        vec![Port::active(1, LinkLayer::InfiniBand, vec![gid])],
    )]);
    let err = select(&t, &RdmaConfig::new("rec0"), DeviceMask::ALL).unwrap_err();
    let report = nothing(err.clone());
    assert_eq!(
        report[0].ports[0].outcome,
        PortOutcome::Excluded(vec![PortExclusion::Gid(GidChoiceError::Pinned {
            index: 0,
            problem: GidProblem::LinkLayer {
                gid_type: GidType::RoceV2,
                link_layer: LinkLayer::InfiniBand
            },
        })])
    );
    assert!(
        err.to_string()
            .contains("RoCE v2 gid invalid on an InfiniBand port"),
        "{err}"
    );
}
