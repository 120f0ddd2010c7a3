//! Affinity: ranking NICs for a memory location, by PCIe distance first and
//! NUMA distance second.

use std::fmt;

use crate::model::{NicId, Topology};
use crate::pci::{PciAddress, PciLocation, PcieDistance};

/// Where the memory of a transfer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MemoryLocation {
    /// Host memory on this NUMA node (`None`: unknown, so every NIC ranks
    /// equal on NUMA and only NIC ID order remains).
    Host {
        /// The NUMA node, if known.
        numa_node: Option<u32>,
    },
    /// Memory of the CUDA device with this index, the index counted in PCI
    /// bus order (`CUDA_DEVICE_ORDER=PCI_BUS_ID`, all devices visible); see
    /// [`Topology::gpus`].
    Cuda {
        /// The CUDA device index.
        device: u32,
    },
    /// Memory of the GPU at this PCI address (when the caller knows it,
    /// e.g. from `cuDeviceGetPCIBusId`; independent of device ordering).
    #[serde(serialize_with = "crate::json::address")]
    GpuAt(PciAddress),
}

impl fmt::Display for MemoryLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Host { numa_node: Some(n) } => write!(f, "host memory on numa node {n}"),
            Self::Host { numa_node: None } => f.write_str("host memory"),
            Self::Cuda { device } => write!(f, "cuda device {device}"),
            Self::GpuAt(a) => write!(f, "gpu at {a}"),
        }
    }
}

/// The location names a GPU the topology does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AffinityError {
    /// The CUDA index is out of range.
    #[error(
        "cuda device {device} not found: the topology has {count} nvidia gpus (index 0..{count} in pci bus order)"
    )]
    NoSuchCudaDevice {
        /// The requested index.
        device: u32,
        /// How many GPUs were found.
        count: usize,
    },
    /// No GPU at this PCI address.
    #[error("no nvidia gpu at pci address {0}")]
    #[serde(serialize_with = "crate::json::address")]
    NoGpuAt(PciAddress),
}

/// One NIC's affinity to a memory location.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NicAffinity {
    /// The NIC ID.
    pub nic: NicId,
    /// The device name.
    pub name: String,
    /// PCIe distance between the NIC and the GPU (`Unknown` for host
    /// memory, or where either side has no PCI location).
    pub pcie: PcieDistance,
    /// NUMA distance between the memory's node and the NIC's node (from the
    /// node distance table; 10 for the same node when the table is absent,
    /// 20 otherwise); `None` when either node is unknown.
    pub numa_distance: Option<u32>,
}

impl Topology {
    /// The active NICs ranked for `location`, best first: by
    /// [`PcieDistance`] (for GPU memory), then by NUMA distance (unknown
    /// last), then by NIC ID. Inert slots are not ranked.
    pub fn rank_nics(&self, location: MemoryLocation) -> Result<Vec<NicAffinity>, AffinityError> {
        let (gpu_pci, mem_numa): (Option<&PciLocation>, Option<u32>) = match location {
            MemoryLocation::Host { numa_node } => (None, numa_node),
            MemoryLocation::Cuda { device } => {
                let gpu =
                    self.gpus()
                        .get(device as usize)
                        .ok_or(AffinityError::NoSuchCudaDevice {
                            device,
                            count: self.gpus().len(),
                        })?;
                (Some(&gpu.pci), gpu.numa_node)
            }
            MemoryLocation::GpuAt(addr) => {
                let gpu = self
                    .gpus()
                    .iter()
                    .find(|g| g.pci.address() == addr)
                    .ok_or(AffinityError::NoGpuAt(addr))?;
                (Some(&gpu.pci), gpu.numa_node)
            }
        };
        let mut ranked: Vec<NicAffinity> = self
            .active()
            .map(|(id, nic)| {
                let pcie = match (gpu_pci, &nic.pci) {
                    (Some(g), Some(n)) => g.distance_to(n),
                    _ => PcieDistance::Unknown,
                };
                let numa_distance = match (mem_numa, nic.numa_node) {
                    (Some(a), Some(b)) => {
                        Some(
                            self.numa_distance(a, b)
                                .unwrap_or(if a == b { 10 } else { 20 }),
                        )
                    }
                    _ => None,
                };
                NicAffinity {
                    nic: id,
                    name: nic.name.clone(),
                    pcie,
                    numa_distance,
                }
            })
            .collect();
        ranked.sort_by_key(|a| (a.pcie, a.numa_distance.unwrap_or(u32::MAX), a.nic));
        Ok(ranked)
    }
}
