//! RDMA topology discovery, NIC IDs and selection for OrbitTE.
//!
//! A [`Topology`] holds the machine's RDMA NICs in stable NIC ID order
//! (active or inert slots), their ports and GID tables, the uverbs access
//! and provider visibility of each, their PCI location and NUMA node, and the
//! machine's NVIDIA GPUs. It is plain data, built either way:
//! - [`discover`] reads sysfs (and `/dev`) under injectable roots
//!   ([`SysfsRoots`]), so recorded trees serve as test fixtures;
//! - [`Topology::builder`] / [`Topology::from_nics`] take [`Nic`] records
//!   (the engine builds one from the verbs provider's device list).
//!
//! [`select`] applies an [`RdmaConfig`] and a [`DeviceMask`] and returns the
//! [`Selection`] (one port and GID per NIC), or a [`SelectionError`] that
//! lists every device and port with the reason it was left out.
//! [`Topology::rank_nics`] ranks NICs for a [`MemoryLocation`].
//!
//! Building from records and selecting (what the engine does with the
//! simulated fabric's device list):
//!
//! ```
//! use orbitte_topology::{
//!     DeviceMask, Gid, GidType, InertCause, LinkLayer, Nic, NicId, Port, RdmaConfig, Topology,
//!     select,
//! };
//!
//! let gid = |i: u32| Gid {
//!     index: 0,
//!     value: format!("::ffff:10.0.0.{i}").parse().unwrap(),
//!     gid_type: Some(GidType::RoceV2),
//!     netdev: Some(format!("eth{i}")),
//! };
//! let nics = (0..2).map(|i| {
//!     Nic::new(format!("sim{i}"), vec![Port::active(1, LinkLayer::Ethernet, vec![gid(i)])])
//! });
//! let mut topology = Topology::from_nics(nics);
//! // The engine failed to open sim0: it stays in slot 0, inert.
//! topology.mark_inert(NicId(0), InertCause::Construction("open failed".into()))?;
//! let selection = select(&topology, &RdmaConfig::default(), DeviceMask::ALL)?;
//! assert_eq!(selection.rails[0].nic, NicId(1));
//! assert_eq!(selection.rails[0].gid.netdev.as_deref(), Some("eth1"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Discovering this machine:
//!
//! ```no_run
//! use orbitte_topology::{DeviceMask, RdmaConfig, SysfsRoots, discover, select};
//!
//! let topology = discover(&SysfsRoots::host());
//! println!("{topology}");
//! let config = RdmaConfig::resolve(RdmaConfig::default(), None)?;
//! match select(&topology, &config, DeviceMask::ALL) {
//!     Ok(selection) => println!("{} rails", selection.rails.len()),
//!     Err(e) => eprintln!("{e}"),
//! }
//! # Ok::<(), orbitte_topology::ConfigError>(())
//! ```
//!
//! Matching GID families or NIC names does not prove that two fabric ports
//! can connect: selection is local, reachability is only known once a
//! connection is made.
//!
//! The design is written up in `docs/topology.md`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod affinity;
mod config;
mod discover;
mod error;
mod gid;
mod json;
mod model;
mod pci;
mod select;

pub use affinity::{AffinityError, MemoryLocation, NicAffinity};
pub use config::{ConfigError, ConfigOverrides, ENV_VARS, RdmaConfig};
pub use discover::{AccessCheck, SysfsRoots, discover, nic_name_order};
pub use error::DiscoveryError;
pub use gid::{GidChoiceError, GidProblem, choose_gid};
pub use model::{
    Gid, GidFamily, GidType, Gpu, InertCause, LinkLayer, Nic, NicId, NicSlot, NoSuchNic, Port,
    PortState, ProviderVisibility, Topology, TopologyBuilder, UverbsAccess,
};
pub use pci::{PciAddress, PciAddressError, PciLocation, PcieDistance};
pub use select::{
    DeviceExclusion, DeviceMask, NicReport, PortExclusion, PortOutcome, PortReport, SelectedPort,
    Selection, SelectionError, select,
};
