//! Affinity ranking on the 8-GPU, 8-NIC, two-NUMA fixture.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use orbitte_topology::{
    AffinityError, InertCause, MemoryLocation, NicId, PcieDistance, SysfsRoots, Topology, discover,
};

fn dgx() -> Topology {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dgx-8gpu");
    discover(&SysfsRoots::fixture(root))
}

#[test]
fn each_gpu_ranks_its_leaf_switch_nic_first_then_pcie_then_numa() {
    let t = dgx();
    let names = [
        "mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11",
    ];
    for (gpu, name) in names.iter().enumerate() {
        let ranked = t
            .rank_nics(MemoryLocation::Cuda { device: gpu as u32 })
            .unwrap();
        assert_eq!(ranked.len(), 8);
        assert_eq!(ranked[0].name, *name, "cuda {gpu}");
        assert_eq!(ranked[0].pcie, PcieDistance::SharedBridge { hops: 2 });
        assert_eq!(ranked[0].numa_distance, Some(10));
        // Next: the other NIC under the same top-level switch.
        assert_eq!(ranked[1].nic.0, (gpu as u32) ^ 1);
        assert_eq!(ranked[1].pcie, PcieDistance::SharedBridge { hops: 6 });
        // Then the other host bridge of the same NUMA node, then the far node.
        let same_node: Vec<u32> = ranked[2..4]
            .iter()
            .map(|a| a.numa_distance.unwrap())
            .collect();
        assert_eq!(same_node, [10, 10]);
        assert!(
            ranked[2..]
                .iter()
                .all(|a| a.pcie == PcieDistance::CrossHostBridge)
        );
        assert!(ranked[4..].iter().all(|a| a.numa_distance == Some(21)));
        let far_first = ranked[4].nic.0;
        assert!(
            ranked[4..].iter().all(|a| a.nic.0 >= far_first),
            "ties broken by nic id"
        );
    }
}

#[test]
fn gpu_by_pci_address_matches_cuda_index() {
    let t = dgx();
    let addr = t.gpus()[6].pci.address();
    assert_eq!(
        t.rank_nics(MemoryLocation::GpuAt(addr)).unwrap(),
        t.rank_nics(MemoryLocation::Cuda { device: 6 }).unwrap()
    );
}

#[test]
fn host_memory_ranks_by_numa_then_nic_id() {
    let t = dgx();
    let ranked = t
        .rank_nics(MemoryLocation::Host { numa_node: Some(1) })
        .unwrap();
    let ids: Vec<u32> = ranked.iter().map(|a| a.nic.0).collect();
    assert_eq!(ids, [4, 5, 6, 7, 0, 1, 2, 3]);
    assert!(ranked.iter().all(|a| a.pcie == PcieDistance::Unknown));
    let unknown = t
        .rank_nics(MemoryLocation::Host { numa_node: None })
        .unwrap();
    let ids: Vec<u32> = unknown.iter().map(|a| a.nic.0).collect();
    assert_eq!(ids, [0, 1, 2, 3, 4, 5, 6, 7]);
}

#[test]
fn inert_nics_are_not_ranked_and_missing_gpus_are_errors() {
    let mut t = dgx();
    t.mark_inert(NicId(0), InertCause::Construction("failed".into()))
        .unwrap();
    let ranked = t.rank_nics(MemoryLocation::Cuda { device: 0 }).unwrap();
    assert_eq!(ranked.len(), 7);
    assert_eq!(ranked[0].name, "mlx5_3");
    let err = t.rank_nics(MemoryLocation::Cuda { device: 8 }).unwrap_err();
    assert_eq!(
        err,
        AffinityError::NoSuchCudaDevice {
            device: 8,
            count: 8
        }
    );
    assert!(err.to_string().contains("8 nvidia gpus"));
    let err = t
        .rank_nics(MemoryLocation::GpuAt("0000:01:00.0".parse().unwrap()))
        .unwrap_err();
    assert!(matches!(err, AffinityError::NoGpuAt(_)));
}
