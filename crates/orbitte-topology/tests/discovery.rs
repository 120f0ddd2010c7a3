//! Discovery from the recorded fixture trees.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use orbitte_topology::{
    AccessCheck, DiscoveryError, GidType, InertCause, LinkLayer, PciAddress, PortState,
    ProviderVisibility, SysfsRoots, Topology, UverbsAccess, discover,
};

fn fixture(machine: &str) -> Topology {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(machine);
    assert!(root.is_dir(), "fixture {} missing", root.display());
    discover(&SysfsRoots::fixture(root))
}

#[test]
fn cx7_roce_devices_ports_and_gids() {
    let t = fixture("cx7-roce");
    let names: Vec<&str> = t.slots().iter().map(|s| s.name()).collect();
    assert_eq!(names, ["mlx5_0", "mlx5_1"]);
    let nic = t.slots()[0].nic().expect("mlx5_0 active");
    assert_eq!(nic.node_guid, Some(0xb859_9f03_00d4_e8e2));
    let pci = nic.pci.as_ref().expect("pci location");
    assert_eq!(pci.host_bridge, "pci0000:15");
    assert_eq!(pci.address(), "0000:17:00.0".parse::<PciAddress>().unwrap());
    assert_eq!(pci.path.len(), 2);
    assert_eq!(nic.numa_node, Some(0));
    assert_eq!(nic.uverbs_access, UverbsAccess::ReadWrite);
    assert!(
        nic.uverbs_node
            .as_ref()
            .unwrap()
            .ends_with("dev/infiniband/uverbs0")
    );
    assert_eq!(nic.provider, ProviderVisibility::Unknown);
    let port = &nic.ports[0];
    assert_eq!(port.number, 1);
    assert_eq!(port.state, PortState::Active);
    assert_eq!(port.link_layer, Some(LinkLayer::Ethernet));
    assert_eq!(port.rate.as_deref(), Some("200 Gb/sec (4X HDR)"));
    assert!(port.problems.is_empty(), "{:?}", port.problems);
    // six nonzero entries: link-local, IPv4, IPv6, each as v1 then v2; zero entries dropped.
    let types: Vec<(u32, Option<GidType>)> =
        port.gids.iter().map(|g| (g.index, g.gid_type)).collect();
    assert_eq!(
        types,
        [
            (0, Some(GidType::RoceV1)),
            (1, Some(GidType::RoceV2)),
            (2, Some(GidType::RoceV1)),
            (3, Some(GidType::RoceV2)),
            (4, Some(GidType::RoceV1)),
            (5, Some(GidType::RoceV2)),
        ]
    );
    assert!(
        port.gids
            .iter()
            .all(|g| g.netdev.as_deref() == Some("ens1f0np0"))
    );
    assert_eq!(
        port.gids[3].value.to_ipv4_mapped(),
        Some([192, 168, 10, 11].into())
    );
    let down = t.slots()[1].nic().unwrap();
    assert_eq!(down.ports[0].state, PortState::Down);
    assert!(t.problems().is_empty(), "{:?}", t.problems());
}

#[test]
fn ib_hdr_port_gid_and_unopenable_uverbs() {
    let t = fixture("ib-hdr");
    let a = t.slots()[0].nic().unwrap();
    let port = &a.ports[0];
    assert_eq!(port.link_layer, Some(LinkLayer::InfiniBand));
    assert_eq!(port.gids.len(), 1);
    assert_eq!(port.gids[0].gid_type, Some(GidType::Ib));
    assert_eq!(port.gids[0].netdev, None);
    assert_eq!(a.uverbs_access, UverbsAccess::ReadWrite);
    let b = t.slots()[1].nic().unwrap();
    assert_eq!(b.uverbs_access, UverbsAccess::Denied);
}

#[test]
fn dgx_nics_in_natural_order_with_pcie_paths_and_gpus() {
    let t = fixture("dgx-8gpu");
    let names: Vec<&str> = t.slots().iter().map(|s| s.name()).collect();
    assert_eq!(
        names,
        [
            "mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"
        ]
    );
    for (i, slot) in t.slots().iter().enumerate() {
        assert_eq!(slot.id().index(), i);
        let nic = slot.nic().unwrap();
        assert_eq!(nic.pci.as_ref().unwrap().path.len(), 6, "{}", nic.name);
        assert_eq!(nic.numa_node, Some(if i < 4 { 0 } else { 1 }));
    }
    // Eight GPUs (the NVSwitch function, class 0x0680, is not one), in PCI order.
    assert_eq!(t.gpus().len(), 8);
    let addrs: Vec<String> = t
        .gpus()
        .iter()
        .map(|g| g.pci.address().to_string())
        .collect();
    assert_eq!(addrs[0], "0000:15:00.0");
    assert_eq!(addrs[7], "0000:b9:00.0");
    assert!(addrs.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(t.gpus()[5].numa_node, Some(1));
    assert_eq!(t.numa_distance(0, 1), Some(21));
    assert_eq!(t.numa_distance(1, 1), Some(10));
    assert!(t.problems().is_empty(), "{:?}", t.problems());
}

#[test]
fn malformed_files_make_typed_errors_and_discovery_goes_on() {
    let t = fixture("lab-edge-cases");
    let names: Vec<&str> = t.slots().iter().map(|s| s.name()).collect();
    assert_eq!(
        names,
        [
            "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "rxe0"
        ]
    );
    // mlx5_2: malformed node_guid -> inert, error names the file and what was expected.
    match t.slots()[2].inert_cause() {
        Some(InertCause::Discovery(DiscoveryError::Malformed {
            path,
            expected,
            found,
        })) => {
            assert!(path.ends_with("mlx5_2/node_guid"), "{}", path.display());
            assert!(expected.contains("guid"));
            assert_eq!(found, "not-a-guid");
        }
        other => panic!("mlx5_2 should be inert with a malformed node_guid, got {other:?}"),
    }
    let msg = t.slots()[2].inert_cause().unwrap().to_string();
    assert!(
        msg.contains("node_guid") && msg.contains("expected"),
        "{msg}"
    );
    // mlx5_6: no ports directory -> inert with an I/O error naming it.
    match t.slots()[6].inert_cause() {
        Some(InertCause::Discovery(e @ DiscoveryError::Io { .. })) => {
            assert!(e.path().ends_with("mlx5_6/ports"), "{e}");
        }
        other => panic!("mlx5_6 should be inert with an io error, got {other:?}"),
    }
    // mlx5_1: GID table present but all zero.
    let empty = t.slots()[1].nic().unwrap();
    assert!(empty.ports[0].gids.is_empty());
    assert_eq!(empty.ports[0].state, PortState::Active);
    // mlx5_3: malformed state and an unknown gid type, recorded on the port.
    let p = &t.slots()[3].nic().unwrap().ports[0];
    assert_eq!(p.state, PortState::Unknown);
    assert_eq!(p.gids[0].gid_type, None);
    let problems: Vec<String> = p.problems.iter().map(ToString::to_string).collect();
    assert!(
        problems
            .iter()
            .any(|m| m.contains("ports/1/state") && m.contains("ACTIVE")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|m| m.contains("gid_attrs/types/0") && m.contains("RoCE v3")),
        "{problems:?}"
    );
    // mlx5_4: no uverbs node; mlx5_5: read-only.
    assert_eq!(
        t.slots()[4].nic().unwrap().uverbs_access,
        UverbsAccess::NoNode
    );
    assert_eq!(
        t.slots()[5].nic().unwrap().uverbs_access,
        UverbsAccess::ReadOnly
    );
    // rxe0: software device, no PCI location, still discovered.
    let rxe = t.slots()[7].nic().unwrap();
    assert_eq!(rxe.pci, None);
    assert_eq!(rxe.numa_node, None);
    assert_eq!(rxe.ports[0].gids[3].netdev.as_deref(), Some("eth1"));
    // The malformed PCI vendor file is a topology problem naming the file.
    let tp: Vec<String> = t.problems().iter().map(ToString::to_string).collect();
    assert!(
        tp.iter()
            .any(|m| m.contains("0000:05:00.0/vendor") && m.contains("vendor id")),
        "{tp:?}"
    );
}

#[test]
fn missing_sysfs_gives_an_empty_topology() {
    let t = discover(&SysfsRoots {
        sys: PathBuf::from("/nonexistent/orbitte/sys"),
        dev: PathBuf::from("/nonexistent/orbitte/dev"),
        access: AccessCheck::Recorded,
    });
    assert!(t.is_empty());
    assert!(t.problems().is_empty());
}

#[test]
fn provider_visibility_is_an_input() {
    let mut t = fixture("cx7-roce");
    t.set_provider_visibility(["mlx5_1"]);
    assert_eq!(
        t.slots()[0].nic().unwrap().provider,
        ProviderVisibility::NotVisible
    );
    assert_eq!(
        t.slots()[1].nic().unwrap().provider,
        ProviderVisibility::Visible
    );
}

#[test]
fn display_lists_slots_ports_gids_gpus_and_problems() {
    let text = fixture("lab-edge-cases").to_string();
    for needle in [
        "nic 0 mlx5_0 pci 0000:03:00.0, numa 0",
        "port 1 ACTIVE Ethernet 25 Gb/sec (1X EDR)",
        "gid 3 ::ffff:10.0.0.1 RoCE v2 on eth0",
        "gid table empty",
        "nic 2 mlx5_2 inert: discovery failed",
        "nic 7 rxe0 no pci, numa unknown",
        "problem: ",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    let gpus = fixture("dgx-8gpu").to_string();
    assert!(gpus.contains("gpu 7 pci 0000:b9:00.0, numa 1"), "{gpus}");
}
