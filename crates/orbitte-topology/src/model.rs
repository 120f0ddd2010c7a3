//! The data model: NICs with ports and GIDs, GPUs, NUMA, and the topology
//! that holds them in stable NIC ID order.
//!
//! Everything here is plain data with public fields, so a caller that knows
//! its devices some other way (the engine, from the verbs provider's device
//! list; a test, from a table) builds a [`Topology`] with
//! [`Topology::builder`] exactly as discovery does.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv6Addr;
use std::path::PathBuf;

use crate::error::DiscoveryError;
use crate::pci::PciLocation;

/// A NIC ID: the position of a NIC in topology order.
///
/// Invariant: once a [`Topology`] is built, the slot at each ID never moves
/// and is never removed; a NIC that fails keeps its ID as an inert slot.
/// Bit `n` of a [`DeviceMask`](crate::DeviceMask) names NIC ID `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct NicId(pub u32);

impl NicId {
    /// The slot index as `usize`.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nic {}", self.0)
    }
}

/// The logical state of a port, as `ports/<n>/state` reports it
/// (`4: ACTIVE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PortState {
    /// 1: DOWN.
    Down,
    /// 2: INIT.
    Init,
    /// 3: ARMED.
    Armed,
    /// 4: ACTIVE: the only state in which a port is selected.
    Active,
    /// 5: ACTIVE_DEFER.
    ActiveDefer,
    /// Another numeric state (0: NOP, or a value newer than this crate).
    Other(u8),
    /// The state file was missing or malformed (the port's `problems` says
    /// why).
    #[default]
    Unknown,
}

impl PortState {
    /// The state for the kernel's numeric code.
    pub fn from_code(code: u8) -> Self {
        match code {
            1 => Self::Down,
            2 => Self::Init,
            3 => Self::Armed,
            4 => Self::Active,
            5 => Self::ActiveDefer,
            other => Self::Other(other),
        }
    }
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Down => f.write_str("DOWN"),
            Self::Init => f.write_str("INIT"),
            Self::Armed => f.write_str("ARMED"),
            Self::Active => f.write_str("ACTIVE"),
            Self::ActiveDefer => f.write_str("ACTIVE_DEFER"),
            Self::Other(code) => write!(f, "state {code}"),
            Self::Unknown => f.write_str("unknown"),
        }
    }
}

/// The link layer of a port (`ports/<n>/link_layer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkLayer {
    /// InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE, or iWARP).
    Ethernet,
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InfiniBand => f.write_str("InfiniBand"),
            Self::Ethernet => f.write_str("Ethernet"),
        }
    }
}

/// The type of a GID table entry (`ports/<n>/gid_attrs/types/<i>`).
///
/// sysfs writes `IB/RoCE v1` for both InfiniBand GIDs and RoCE v1 GIDs; the
/// port's link layer tells them apart, and discovery stores the resolved
/// type here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GidType {
    /// An InfiniBand GID (InfiniBand link layer).
    Ib,
    /// RoCE v1: Ethernet, not routable over IP.
    RoceV1,
    /// RoCE v2: RoCE over UDP/IP, routable.
    RoceV2,
}

impl GidType {
    /// Whether GIDs of this type can exist on a port with this link layer.
    pub fn fits(self, link_layer: LinkLayer) -> bool {
        matches!(
            (self, link_layer),
            (Self::Ib, LinkLayer::InfiniBand) | (Self::RoceV1 | Self::RoceV2, LinkLayer::Ethernet)
        )
    }
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ib => f.write_str("IB"),
            Self::RoceV1 => f.write_str("RoCE v1"),
            Self::RoceV2 => f.write_str("RoCE v2"),
        }
    }
}

/// The address family a GID value encodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GidFamily {
    /// An IPv4-mapped address (`::ffff:a.b.c.d`).
    Ipv4,
    /// A global (or unique local) IPv6 address.
    Ipv6Global,
    /// An IPv6 link-local address (`fe80::/10`); InfiniBand port GIDs have
    /// this form too (default subnet prefix plus port GUID).
    Ipv6LinkLocal,
    /// The all-zero GID: an empty table entry.
    Zero,
}

/// One entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Gid {
    /// The index in the port's GID table (what verbs calls `sgid_index`).
    pub index: u32,
    /// The 128-bit GID value.
    pub value: Ipv6Addr,
    /// The entry's type; `None` when sysfs did not say (an empty entry, or
    /// an old kernel without `gid_attrs`).
    pub gid_type: Option<GidType>,
    /// The network interface the entry belongs to (`gid_attrs/ndevs/<i>`);
    /// `None` for InfiniBand GIDs and empty entries.
    pub netdev: Option<String>,
}

impl Gid {
    /// The address family of the value.
    pub fn family(&self) -> GidFamily {
        if self.value.is_unspecified() {
            GidFamily::Zero
        } else if self.value.to_ipv4_mapped().is_some() {
            GidFamily::Ipv4
        } else if self.value.segments()[0] & 0xffc0 == 0xfe80 {
            GidFamily::Ipv6LinkLocal
        } else {
            GidFamily::Ipv6Global
        }
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gid {} {}", self.index, self.value)?;
        if let Some(t) = self.gid_type {
            write!(f, " {t}")?;
        }
        if let Some(n) = &self.netdev {
            write!(f, " on {n}")?;
        }
        Ok(())
    }
}

/// One port of a NIC.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct Port {
    /// The port number (1-based, as verbs numbers ports).
    pub number: u32,
    /// The logical port state.
    pub state: PortState,
    /// The link layer; `None` when the file was missing or malformed.
    pub link_layer: Option<LinkLayer>,
    /// The rate as sysfs prints it (`200 Gb/sec (4X HDR)`), if known.
    pub rate: Option<String>,
    /// The nonzero GID table entries, by ascending index. Empty entries are
    /// not kept; entries with a broken type or netdev file are kept with
    /// `gid_type`/`netdev` set to `None` and the error in `problems`.
    pub gids: Vec<Gid>,
    /// Problems found while reading this port (malformed state, GID files).
    pub problems: Vec<DiscoveryError>,
}

impl Port {
    /// An active port with the given link layer and GIDs, for records.
    pub fn active(number: u32, link_layer: LinkLayer, gids: Vec<Gid>) -> Self {
        Self {
            number,
            state: PortState::Active,
            link_layer: Some(link_layer),
            rate: None,
            gids,
            problems: Vec::new(),
        }
    }

    /// The entry at a GID table index, if nonempty.
    pub fn gid(&self, index: u32) -> Option<&Gid> {
        self.gids.iter().find(|g| g.index == index)
    }
}

/// Whether this process can open the NIC's uverbs character device
/// (`/dev/infiniband/uverbsN`) for reading and writing, as
/// `ibv_open_device` needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(tag = "access", content = "detail", rename_all = "snake_case")]
pub enum UverbsAccess {
    /// Readable and writable.
    ReadWrite,
    /// Readable, not writable.
    ReadOnly,
    /// Writable, not readable.
    WriteOnly,
    /// Neither readable nor writable.
    Denied,
    /// No uverbs node belongs to this device (no
    /// `/sys/class/infiniband_verbs/uverbs*/ibdev` names it), or the
    /// `/dev` node is absent.
    NoNode,
    /// Opening the node failed for another reason (the text says which).
    Failed(String),
    /// Not checked (records built by a caller that has no such node, e.g.
    /// the simulated fabric). Selection does not exclude for it.
    #[default]
    Unchecked,
}

impl UverbsAccess {
    /// Whether selection accepts the NIC on this ground.
    pub fn usable(&self) -> bool {
        matches!(self, Self::ReadWrite | Self::Unchecked)
    }
}

impl fmt::Display for UverbsAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ReadWrite => f.write_str("read-write"),
            Self::ReadOnly => f.write_str("read-only"),
            Self::WriteOnly => f.write_str("write-only"),
            Self::Denied => f.write_str("neither readable nor writable"),
            Self::NoNode => f.write_str("no uverbs node"),
            Self::Failed(m) => write!(f, "open failed: {m}"),
            Self::Unchecked => f.write_str("unchecked"),
        }
    }
}

/// Whether the verbs provider (libibverbs, or the simulated fabric) lists
/// the device. Discovery from sysfs alone cannot know and says
/// [`Unknown`](Self::Unknown); the caller that holds the provider supplies it
/// with [`Topology::set_provider_visibility`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderVisibility {
    /// The provider lists the device.
    Visible,
    /// The provider does not list it (missing user-space driver, e.g. no
    /// `libmlx5` for an mlx5 device). Selection excludes the NIC.
    NotVisible,
    /// Not known. Selection does not exclude for it.
    #[default]
    Unknown,
}

/// An RDMA NIC (an entry of `/sys/class/infiniband`), as plain data.
///
/// This is also the record type for building a topology programmatically:
/// fill the fields you know and leave the rest at [`Default`].
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct Nic {
    /// The verbs device name (`mlx5_0`).
    pub name: String,
    /// The node GUID (`node_guid`, `b859:9f03:00d4:e8e2`), if known.
    #[serde(serialize_with = "crate::json::guid")]
    pub node_guid: Option<u64>,
    /// The ports, by ascending port number.
    pub ports: Vec<Port>,
    /// The uverbs character node (`/dev/infiniband/uverbs0`), if one belongs
    /// to the device.
    pub uverbs_node: Option<PathBuf>,
    /// Whether this process can open the uverbs node read-write.
    pub uverbs_access: UverbsAccess,
    /// Whether the verbs provider lists the device.
    pub provider: ProviderVisibility,
    /// The PCI function the device sits on and its PCIe path; `None` for
    /// software devices (rxe, siw) and records without PCI data.
    pub pci: Option<PciLocation>,
    /// The NUMA node of the PCI device; `None` when unknown (sysfs `-1`).
    pub numa_node: Option<u32>,
}

impl Nic {
    /// A NIC record with a name and ports; everything else default.
    pub fn new(name: impl Into<String>, ports: Vec<Port>) -> Self {
        Self {
            name: name.into(),
            ports,
            ..Self::default()
        }
    }

    /// The port with this number.
    pub fn port(&self, number: u32) -> Option<&Port> {
        self.ports.iter().find(|p| p.number == number)
    }
}

/// Why a slot is inert.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[serde(tag = "cause", content = "detail", rename_all = "snake_case")]
pub enum InertCause {
    /// Discovery could not read the device's essential files.
    #[error("discovery failed: {0}")]
    Discovery(#[from] DiscoveryError),
    /// The caller failed to construct the NIC (open the device, allocate its
    /// protection domain...). The text is the caller's error.
    #[error("construction failed: {0}")]
    Construction(String),
}

/// One position in topology order: an active NIC, or an inert slot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "slot", rename_all = "snake_case")]
pub enum NicSlot {
    /// A NIC that can be selected.
    Active {
        /// Its NIC ID.
        id: NicId,
        /// The NIC.
        nic: Nic,
    },
    /// A NIC whose discovery or construction failed. It keeps its NIC ID so
    /// the IDs after it never shift, and is never selected.
    Inert {
        /// Its NIC ID.
        id: NicId,
        /// The device name.
        name: String,
        /// What was known before it failed, if anything.
        last_known: Option<Nic>,
        /// Why it is inert.
        cause: InertCause,
    },
}

impl NicSlot {
    /// The NIC ID of the slot.
    pub fn id(&self) -> NicId {
        match self {
            Self::Active { id, .. } | Self::Inert { id, .. } => *id,
        }
    }

    /// The device name.
    pub fn name(&self) -> &str {
        match self {
            Self::Active { nic, .. } => &nic.name,
            Self::Inert { name, .. } => name,
        }
    }

    /// The NIC, for an active slot.
    pub fn nic(&self) -> Option<&Nic> {
        match self {
            Self::Active { nic, .. } => Some(nic),
            Self::Inert { .. } => None,
        }
    }

    /// Whether the slot is inert.
    pub fn is_inert(&self) -> bool {
        matches!(self, Self::Inert { .. })
    }

    /// Why the slot is inert, for an inert slot.
    pub fn inert_cause(&self) -> Option<&InertCause> {
        match self {
            Self::Active { .. } => None,
            Self::Inert { cause, .. } => Some(cause),
        }
    }
}

/// An NVIDIA GPU found on the PCI bus (vendor `0x10de`, class 3D or VGA
/// controller).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Gpu {
    /// Where it sits in the PCIe tree.
    pub pci: PciLocation,
    /// Its NUMA node, if known.
    pub numa_node: Option<u32>,
    /// The PCI device id (`device` file), if known.
    pub device_id: Option<u16>,
}

/// A GPU cannot be found or a NIC ID does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[error("{id} does not exist; the topology has {slots} slots (nic 0..{slots})")]
pub struct NoSuchNic {
    /// The requested ID.
    pub id: NicId,
    /// How many slots the topology has.
    pub slots: usize,
}

/// The machine's RDMA NICs in stable NIC ID order, its GPUs, and its NUMA
/// distances.
///
/// Built by [`discover`](crate::discover) from sysfs or by
/// [`Topology::builder`] from records. Slots are never removed or reordered
/// after building; [`mark_inert`](Self::mark_inert) turns an active slot
/// inert in place.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct Topology {
    slots: Vec<NicSlot>,
    /// Invariant: sorted by PCI address; the index is the CUDA device index
    /// under `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
    gpus: Vec<Gpu>,
    numa_distances: BTreeMap<u32, Vec<u32>>,
    problems: Vec<DiscoveryError>,
}

impl Topology {
    /// A builder for a topology from records.
    pub fn builder() -> TopologyBuilder {
        TopologyBuilder::default()
    }

    /// A topology of these NICs, in this order (NIC ID = position).
    pub fn from_nics(nics: impl IntoIterator<Item = Nic>) -> Self {
        let mut b = Self::builder();
        for nic in nics {
            b = b.nic(nic);
        }
        b.build()
    }

    /// Every slot, in NIC ID order.
    pub fn slots(&self) -> &[NicSlot] {
        &self.slots
    }

    /// The slot with this ID.
    pub fn slot(&self, id: NicId) -> Option<&NicSlot> {
        self.slots.get(id.index())
    }

    /// The NIC of an active slot, to edit in place (port states after a
    /// port event, a refreshed GID table). The slot keeps its NIC ID.
    pub fn nic_mut(&mut self, id: NicId) -> Option<&mut Nic> {
        match self.slots.get_mut(id.index())? {
            NicSlot::Active { nic, .. } => Some(nic),
            NicSlot::Inert { .. } => None,
        }
    }

    /// The slot of the device with this name.
    pub fn slot_by_name(&self, name: &str) -> Option<&NicSlot> {
        self.slots.iter().find(|s| s.name() == name)
    }

    /// The active NICs with their IDs, in NIC ID order.
    pub fn active(&self) -> impl Iterator<Item = (NicId, &Nic)> {
        self.slots.iter().filter_map(|s| match s {
            NicSlot::Active { id, nic } => Some((*id, nic)),
            NicSlot::Inert { .. } => None,
        })
    }

    /// The number of slots, inert ones included.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are no slots at all.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The GPUs in PCI bus order; the index is the CUDA device index when
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID` and `CUDA_VISIBLE_DEVICES` is unset.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// The NUMA distance between two nodes (`/sys/devices/system/node/
    /// node<a>/distance`, 10 = local), if known.
    pub fn numa_distance(&self, a: u32, b: u32) -> Option<u32> {
        self.numa_distances.get(&a)?.get(b as usize).copied()
    }

    /// Problems discovery met outside any NIC (GPU and NUMA files). Problems
    /// of a NIC are on its inert slot or its ports.
    pub fn problems(&self) -> &[DiscoveryError] {
        &self.problems
    }

    /// Turns a slot inert in place (the caller failed to construct it). The
    /// slot keeps its NIC ID; a slot already inert keeps its first cause.
    pub fn mark_inert(&mut self, id: NicId, cause: InertCause) -> Result<(), NoSuchNic> {
        let slots = self.slots.len();
        let slot = self
            .slots
            .get_mut(id.index())
            .ok_or(NoSuchNic { id, slots })?;
        if let NicSlot::Active { nic, .. } = slot {
            let nic = std::mem::take(nic);
            tracing::debug!(%id, name = %nic.name, %cause, "nic slot marked inert");
            *slot = NicSlot::Inert {
                id,
                name: nic.name.clone(),
                last_known: Some(nic),
                cause,
            };
        }
        Ok(())
    }

    /// Records which devices the verbs provider lists: NICs named in
    /// `visible` become [`ProviderVisibility::Visible`], every other active
    /// NIC [`ProviderVisibility::NotVisible`].
    pub fn set_provider_visibility<'a>(&mut self, visible: impl IntoIterator<Item = &'a str>) {
        let visible: Vec<&str> = visible.into_iter().collect();
        for slot in &mut self.slots {
            if let NicSlot::Active { nic, .. } = slot {
                nic.provider = if visible.contains(&nic.name.as_str()) {
                    ProviderVisibility::Visible
                } else {
                    ProviderVisibility::NotVisible
                };
            }
        }
    }
}

/// Builds a [`Topology`] from records; NIC IDs follow the order of the
/// [`nic`](Self::nic) and [`inert`](Self::inert) calls.
#[derive(Debug, Clone, Default)]
pub struct TopologyBuilder {
    slots: Vec<NicSlot>,
    gpus: Vec<Gpu>,
    numa_distances: BTreeMap<u32, Vec<u32>>,
    problems: Vec<DiscoveryError>,
}

impl TopologyBuilder {
    fn next_id(&self) -> NicId {
        NicId(self.slots.len() as u32)
    }

    /// Appends an active NIC.
    pub fn nic(mut self, nic: Nic) -> Self {
        let id = self.next_id();
        self.slots.push(NicSlot::Active { id, nic });
        self
    }

    /// Appends an inert slot.
    pub fn inert(
        mut self,
        name: impl Into<String>,
        last_known: Option<Nic>,
        cause: InertCause,
    ) -> Self {
        let id = self.next_id();
        self.slots.push(NicSlot::Inert {
            id,
            name: name.into(),
            last_known,
            cause,
        });
        self
    }

    /// Adds a GPU (GPUs are ordered by PCI address at build time).
    pub fn gpu(mut self, gpu: Gpu) -> Self {
        self.gpus.push(gpu);
        self
    }

    /// Sets the distances from NUMA node `node` to nodes 0, 1, ...
    pub fn numa_distances(mut self, node: u32, distances: Vec<u32>) -> Self {
        self.numa_distances.insert(node, distances);
        self
    }

    /// Records a problem found outside any NIC.
    pub fn problem(mut self, problem: DiscoveryError) -> Self {
        self.problems.push(problem);
        self
    }

    /// The topology.
    pub fn build(mut self) -> Topology {
        self.gpus.sort_by_key(|g| g.pci.address());
        Topology {
            slots: self.slots,
            gpus: self.gpus,
            numa_distances: self.numa_distances,
            problems: self.problems,
        }
    }
}

impl fmt::Display for ProviderVisibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Visible => "visible",
            Self::NotVisible => "not visible",
            Self::Unknown => "unknown",
        })
    }
}

impl fmt::Display for Nic {
    /// Several lines: the device, then each port and its GIDs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)?;
        match &self.pci {
            Some(p) => write!(f, " pci {}", p.address())?,
            None => f.write_str(" no pci")?,
        }
        match self.numa_node {
            Some(n) => write!(f, ", numa {n}")?,
            None => f.write_str(", numa unknown")?,
        }
        match &self.uverbs_node {
            Some(p) => write!(f, ", {} {}", p.display(), self.uverbs_access)?,
            None => write!(f, ", {}", self.uverbs_access)?,
        }
        write!(f, ", provider {}", self.provider)?;
        for port in &self.ports {
            let ll = port
                .link_layer
                .map_or_else(|| "link layer unknown".to_owned(), |l| l.to_string());
            write!(f, "\n  port {} {} {ll}", port.number, port.state)?;
            if let Some(rate) = &port.rate {
                write!(f, " {rate}")?;
            }
            if port.gids.is_empty() {
                f.write_str("\n    gid table empty")?;
            }
            for gid in &port.gids {
                write!(f, "\n    {gid}")?;
            }
            for p in &port.problems {
                write!(f, "\n    problem: {p}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for Topology {
    /// A readable listing: every slot by NIC ID, then GPUs and problems.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.slots.is_empty() {
            f.write_str("no rdma devices")?;
        }
        for (i, slot) in self.slots.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            match slot {
                NicSlot::Active { id, nic } => write!(f, "{id} {nic}")?,
                NicSlot::Inert {
                    id, name, cause, ..
                } => write!(f, "{id} {name} inert: {cause}")?,
            }
        }
        for (i, gpu) in self.gpus.iter().enumerate() {
            write!(f, "\ngpu {i} pci {}", gpu.pci.address())?;
            if let Some(n) = gpu.numa_node {
                write!(f, ", numa {n}")?;
            }
        }
        for p in &self.problems {
            write!(f, "\nproblem: {p}")?;
        }
        Ok(())
    }
}
