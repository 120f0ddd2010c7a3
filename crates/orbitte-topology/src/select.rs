//! Selection: which NICs, ports and GIDs a configuration and a device mask
//! pick from a topology, and why every other one was left out.

use std::fmt;

use crate::config::RdmaConfig;
use crate::error::DiscoveryError;
use crate::gid::{GidChoiceError, choose_gid};
use crate::model::{
    Gid, GidType, InertCause, LinkLayer, Nic, NicId, NicSlot, PortState, ProviderVisibility,
    Topology, UverbsAccess,
};

/// A set of NIC IDs: bit `n` names NIC ID `n`, inert slots included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct DeviceMask(pub u64);

impl DeviceMask {
    /// Every NIC ID (0..64).
    pub const ALL: Self = Self(u64::MAX);

    /// The mask of exactly these IDs (IDs of 64 and above cannot be named
    /// and are ignored).
    pub fn of(ids: impl IntoIterator<Item = NicId>) -> Self {
        Self(
            ids.into_iter()
                .filter(|id| id.0 < 64)
                .fold(0, |m, id| m | 1 << id.0),
        )
    }

    /// Whether the mask names this ID.
    pub fn contains(self, id: NicId) -> bool {
        id.0 < 64 && (self.0 >> id.0) & 1 == 1
    }
}

impl Default for DeviceMask {
    fn default() -> Self {
        Self::ALL
    }
}

impl fmt::Display for DeviceMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// One selected port: a rail the engine may use.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SelectedPort {
    /// The NIC ID.
    pub nic: NicId,
    /// The device name.
    pub device: String,
    /// The port number.
    pub port: u32,
    /// The port's link layer.
    pub link_layer: LinkLayer,
    /// The chosen GID.
    pub gid: Gid,
    /// The NIC's NUMA node, if known.
    pub numa_node: Option<u32>,
}

/// Why a whole device was left out.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DeviceExclusion {
    /// The slot is inert.
    Inert(InertCause),
    /// The device mask does not name this NIC ID.
    MaskedOut,
    /// Another device is pinned.
    NotPinnedDevice {
        /// The pinned device.
        pinned: String,
    },
    /// The whitelist is nonempty and does not name the device.
    NotInWhitelist,
    /// The blacklist names the device (and the whitelist is empty).
    InBlacklist,
    /// The verbs provider does not list the device.
    ProviderNotVisible,
    /// The uverbs node cannot be opened read-write.
    Uverbs {
        /// The node, if one exists.
        node: Option<String>,
        /// What access this process has.
        access: UverbsAccess,
    },
    /// The device has no ports.
    NoPorts,
}

impl fmt::Display for DeviceExclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Inert(cause) => write!(f, "inert slot: {cause}"),
            Self::MaskedOut => f.write_str("masked out by device_mask"),
            Self::NotPinnedDevice { pinned } => write!(f, "not the pinned device {pinned}"),
            Self::NotInWhitelist => f.write_str("not in the whitelist"),
            Self::InBlacklist => f.write_str("in the blacklist"),
            Self::ProviderNotVisible => f.write_str(
                "provider not visible: libibverbs does not list it (install its user-space \
                 provider, e.g. libmlx5 from rdma-core)",
            ),
            Self::Uverbs { node, access } => match (node, access) {
                (None, _) | (_, UverbsAccess::NoNode) => f.write_str(
                    "no uverbs node: no /dev/infiniband/uverbs* belongs to it (load ib_uverbs)",
                ),
                (Some(n), a) => write!(
                    f,
                    "uverbs node {n} not readable and writable ({a}); grant this user read-write \
                     access (udev rule or rdma group)"
                ),
            },
            Self::NoPorts => f.write_str("no ports"),
        }
    }
}

/// Why one port was left out.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PortExclusion {
    /// Another port number is pinned.
    NotPinnedPort {
        /// The pinned port.
        pinned: u32,
    },
    /// The port is not ACTIVE.
    #[serde(rename = "port_not_active", serialize_with = "crate::json::state")]
    NotActive(PortState),
    /// The port's link layer is not the configured one.
    LinkLayer {
        /// The configured link layer.
        wanted: LinkLayer,
        /// The port's link layer (`None`: unknown).
        found: Option<LinkLayer>,
    },
    /// No GID fits (the pinned one, or any in automatic choice).
    Gid(GidChoiceError),
}

impl fmt::Display for PortExclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotPinnedPort { pinned } => write!(f, "not the pinned port {pinned}"),
            Self::NotActive(state) => write!(f, "port not active (state {state})"),
            Self::LinkLayer { wanted, found } => match found {
                Some(l) => write!(f, "link layer {l}, configured {wanted}"),
                None => write!(f, "link layer unknown, configured {wanted}"),
            },
            Self::Gid(e) => write!(f, "gid invalid for link layer/type/netdev: {e}"),
        }
    }
}

/// What happened to one port.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PortOutcome {
    /// Selected, with this GID.
    #[serde(serialize_with = "crate::json::gid")]
    Selected(Gid),
    /// Usable, but another port of the same NIC was selected (one port per
    /// NIC: the lowest-numbered usable one).
    NotChosen {
        /// The GID it would have used.
        gid: Gid,
        /// The port selected instead.
        selected_port: u32,
    },
    /// Usable on its own, but its device was left out.
    #[serde(serialize_with = "crate::json::gid")]
    DeviceExcluded(Gid),
    /// Left out, for these reasons.
    #[serde(serialize_with = "crate::json::reasons")]
    Excluded(Vec<PortExclusion>),
}

/// One port's line in the report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PortReport {
    /// The port number.
    pub port: u32,
    /// What happened to it.
    pub outcome: PortOutcome,
    /// Problems discovery met reading this port's files.
    pub problems: Vec<DiscoveryError>,
}

/// One slot's entry in the report: device-level reasons and every port.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NicReport {
    /// The NIC ID.
    pub id: NicId,
    /// The device name.
    pub name: String,
    /// Why the whole device was left out (empty: it was not).
    pub excluded: Vec<DeviceExclusion>,
    /// Every port of the device.
    pub ports: Vec<PortReport>,
}

impl fmt::Display for NicReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.id, self.name)?;
        if self.excluded.is_empty() {
            f.write_str(": device ok")?;
        } else {
            let reasons: Vec<String> = self.excluded.iter().map(ToString::to_string).collect();
            write!(f, ": {}", reasons.join("; "))?;
        }
        for p in &self.ports {
            write!(f, "\n    port {}: ", p.port)?;
            match &p.outcome {
                PortOutcome::Selected(g) => write!(f, "selected, {g}")?,
                PortOutcome::NotChosen { gid, selected_port } => {
                    write!(f, "usable ({gid}) but port {selected_port} was selected")?;
                }
                PortOutcome::DeviceExcluded(g) => {
                    write!(f, "usable ({g}) but the device is left out")?;
                }
                PortOutcome::Excluded(r) => {
                    let r: Vec<String> = r.iter().map(ToString::to_string).collect();
                    f.write_str(&r.join("; "))?;
                }
            }
            for problem in &p.problems {
                write!(f, "\n      discovery problem: {problem}")?;
            }
        }
        Ok(())
    }
}

/// The result of a successful selection.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Selection {
    /// The selected ports, one per NIC, in NIC ID order.
    ///
    /// Invariant: nonempty.
    pub rails: Vec<SelectedPort>,
    /// Every slot and port with its outcome (for `orbitte doctor`).
    pub report: Vec<NicReport>,
}

/// Selection failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SelectionError {
    /// The configuration contradicts itself (the caller's fault).
    #[error("invalid rdma config: {0}")]
    #[serde(serialize_with = "crate::json::message")]
    InvalidConfig(String),
    /// The device mask names no active NIC: only inert or absent ones.
    #[error("{}", mask_message(*.mask, .inert, .absent))]
    MaskSelectsNoActiveNic {
        /// The mask.
        mask: DeviceMask,
        /// The inert slots it names, with their causes.
        inert: Vec<(NicId, String, InertCause)>,
        /// The NIC IDs it names that do not exist (below 64).
        absent: Vec<NicId>,
    },
    /// Nothing was selected; the report lists every device and port with
    /// the reason it was left out.
    #[error("{}", nothing_message(.config, *.mask, .report))]
    NothingSelected {
        /// The configuration used.
        config: Box<RdmaConfig>,
        /// The mask used.
        mask: DeviceMask,
        /// Every slot and port with its reasons.
        report: Vec<NicReport>,
    },
}

fn mask_message(
    mask: DeviceMask,
    inert: &[(NicId, String, InertCause)],
    absent: &[NicId],
) -> String {
    let mut parts = Vec::new();
    for (id, name, cause) in inert {
        parts.push(format!("{id} {name} is inert ({cause})"));
    }
    if !absent.is_empty() {
        let ids: Vec<String> = absent.iter().map(|i| i.0.to_string()).collect();
        parts.push(format!("nic {} absent", ids.join(",")));
    }
    if parts.is_empty() {
        parts.push("no bits set".to_owned());
    }
    format!(
        "device_mask {mask} selects only inert or absent nics: {}; device_mask bits name nic ids \
         in topology order, inert slots included",
        parts.join("; ")
    )
}

fn nothing_message(config: &RdmaConfig, mask: DeviceMask, report: &[NicReport]) -> String {
    let mut s = format!("no rdma port selected ({config}, device_mask {mask})");
    if report.is_empty() {
        s.push_str(": the topology has no rdma devices (is the kernel driver loaded?)");
        return s;
    }
    if let Some(pinned) = &config.device
        && !report.iter().any(|r| &r.name == pinned)
    {
        s.push_str(&format!("; pinned device {pinned} does not exist"));
    }
    s.push_str("; every device and port:");
    for r in report {
        s.push_str("\n  ");
        s.push_str(&r.to_string());
    }
    s
}

fn validate(config: &RdmaConfig) -> Result<(), SelectionError> {
    if let (Some(t), Some(l)) = (config.gid_type, config.link_layer)
        && !t.fits(l)
    {
        return Err(SelectionError::InvalidConfig(format!(
            "gid_type {t} cannot exist on link_layer {l}"
        )));
    }
    if config.port == Some(0) {
        return Err(SelectionError::InvalidConfig(
            "port 0 does not exist; ports are numbered from 1".to_owned(),
        ));
    }
    if config.netdev.is_some() && config.gid_type == Some(GidType::Ib) {
        return Err(SelectionError::InvalidConfig(
            "netdev given with gid_type IB; InfiniBand gids have no netdev".to_owned(),
        ));
    }
    Ok(())
}

fn device_exclusions(
    id: NicId,
    nic: &Nic,
    config: &RdmaConfig,
    mask: DeviceMask,
) -> Vec<DeviceExclusion> {
    let mut out = Vec::new();
    if !mask.contains(id) {
        out.push(DeviceExclusion::MaskedOut);
    }
    if let Some(pinned) = &config.device
        && pinned != &nic.name
    {
        out.push(DeviceExclusion::NotPinnedDevice {
            pinned: pinned.clone(),
        });
    }
    if !config.whitelist.is_empty() {
        if !config.whitelist.contains(&nic.name) {
            out.push(DeviceExclusion::NotInWhitelist);
        }
    } else if config.blacklist.contains(&nic.name) {
        out.push(DeviceExclusion::InBlacklist);
    }
    if nic.provider == ProviderVisibility::NotVisible {
        out.push(DeviceExclusion::ProviderNotVisible);
    }
    if !nic.uverbs_access.usable() {
        out.push(DeviceExclusion::Uverbs {
            node: nic.uverbs_node.as_ref().map(|p| p.display().to_string()),
            access: nic.uverbs_access.clone(),
        });
    }
    if nic.ports.is_empty() {
        out.push(DeviceExclusion::NoPorts);
    }
    out
}

fn port_outcome(port: &crate::model::Port, config: &RdmaConfig) -> Result<Gid, Vec<PortExclusion>> {
    let mut reasons = Vec::new();
    if let Some(pinned) = config.port
        && pinned != port.number
    {
        reasons.push(PortExclusion::NotPinnedPort { pinned });
    }
    if port.state != PortState::Active {
        reasons.push(PortExclusion::NotActive(port.state));
    }
    if let Some(wanted) = config.link_layer
        && port.link_layer != Some(wanted)
    {
        reasons.push(PortExclusion::LinkLayer {
            wanted,
            found: port.link_layer,
        });
    }
    match choose_gid(port, config) {
        Ok(gid) if reasons.is_empty() => Ok(gid.clone()),
        Ok(_) => Err(reasons),
        Err(e) => {
            reasons.push(PortExclusion::Gid(e));
            Err(reasons)
        }
    }
}

/// Selects the ports to use: for every active NIC named by `mask` that the
/// configuration admits, the lowest-numbered usable port with its GID.
///
/// A port is usable when it is ACTIVE, matches the pinned port and link
/// layer, and has a GID that fits ([`choose_gid`]). A NIC is admitted when
/// the mask names it, the device pin / whitelist / blacklist admit it
/// ([`RdmaConfig::admits_device`]), the provider does not report it
/// invisible, and its uverbs node is read-write (or unchecked).
pub fn select(
    topology: &Topology,
    config: &RdmaConfig,
    mask: DeviceMask,
) -> Result<Selection, SelectionError> {
    validate(config)?;
    if !topology.active().any(|(id, _)| mask.contains(id)) && !topology.is_empty() {
        let mut inert = Vec::new();
        for slot in topology.slots() {
            if let NicSlot::Inert {
                id, name, cause, ..
            } = slot
                && mask.contains(*id)
            {
                inert.push((*id, name.clone(), cause.clone()));
            }
        }
        let absent = (topology.len() as u32..64)
            .map(NicId)
            .filter(|id| mask.contains(*id))
            .collect();
        return Err(SelectionError::MaskSelectsNoActiveNic {
            mask,
            inert,
            absent,
        });
    }
    let mut rails = Vec::new();
    let mut report = Vec::new();
    for slot in topology.slots() {
        let (id, nic) = match slot {
            NicSlot::Active { id, nic } => (*id, nic),
            NicSlot::Inert {
                id, name, cause, ..
            } => {
                let mut excluded = vec![DeviceExclusion::Inert(cause.clone())];
                if !mask.contains(*id) {
                    excluded.push(DeviceExclusion::MaskedOut);
                }
                report.push(NicReport {
                    id: *id,
                    name: name.clone(),
                    excluded,
                    ports: Vec::new(),
                });
                continue;
            }
        };
        let excluded = device_exclusions(id, nic, config, mask);
        let mut selected_port = None;
        let mut ports = Vec::new();
        for port in &nic.ports {
            let outcome = match port_outcome(port, config) {
                Err(reasons) => PortOutcome::Excluded(reasons),
                Ok(gid) if !excluded.is_empty() => PortOutcome::DeviceExcluded(gid),
                Ok(gid) => match selected_port {
                    Some(selected_port) => PortOutcome::NotChosen { gid, selected_port },
                    None => {
                        selected_port = Some(port.number);
                        rails.push(SelectedPort {
                            nic: id,
                            device: nic.name.clone(),
                            port: port.number,
                            link_layer: port.link_layer.unwrap_or(LinkLayer::Ethernet),
                            gid: gid.clone(),
                            numa_node: nic.numa_node,
                        });
                        PortOutcome::Selected(gid)
                    }
                },
            };
            ports.push(PortReport {
                port: port.number,
                outcome,
                problems: port.problems.clone(),
            });
        }
        report.push(NicReport {
            id,
            name: nic.name.clone(),
            excluded,
            ports,
        });
    }
    if rails.is_empty() {
        tracing::debug!(%config, %mask, "no rdma port selected");
        return Err(SelectionError::NothingSelected {
            config: Box::new(config.clone()),
            mask,
            report,
        });
    }
    tracing::debug!(%config, %mask, rails = rails.len(), "rdma ports selected");
    Ok(Selection { rails, report })
}
