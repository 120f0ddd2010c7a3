//! NIC contexts: listing, lazy initialization, the topology the engine saw
//! and the per-context objects (PD, CQ) every registration and rail uses.
//!
//! Contexts initialize lazily, at the first Host Direct registration or the
//! first RDMA use (opening a peer, the capability check). Until then
//! [`EngineTopology`] shows only the device list. Initialization opens every
//! listed device; a device whose open fails keeps its NIC ID as an inert
//! slot. Every opened device the [`RdmaConfig`] admits is *prepared* (PD,
//! CQ) whatever its port state, so that Host Direct registration covers
//! paused ports too; whether a port can carry a rail is checked when a rail
//! is made and when it is used.

use std::net::Ipv6Addr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use orbitte_topology as topo;
use orbitte_topology::{DeviceMask, InertCause, NicId, RdmaConfig, Selection, Topology};
use orbitte_verbs as verbs;
use orbitte_verbs::{CompletionQueue, Context, DeviceIdentity, ProtectionDomain, Provider};

/// One prepared NIC context.
#[derive(Debug)]
pub(crate) struct NicCtx {
    pub(crate) id: NicId,
    pub(crate) identity: DeviceIdentity,
    pub(crate) driver: Option<String>,
    pub(crate) context: Context,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    /// Threads that wait for a request by polling `cq` themselves
    /// (`TransferEngine::wait`); while there are any, the context's poller
    /// thread leaves the queue to them.
    pub(crate) cq_waiters: Arc<AtomicUsize>,
    pub(crate) port: u8,
    pub(crate) gid_index: u32,
    pub(crate) gid: verbs::Gid,
    pub(crate) lid: u16,
    pub(crate) mtu: verbs::Mtu,
    pub(crate) link_layer: topo::LinkLayer,
}

impl NicCtx {
    /// Whether the selected port is ACTIVE right now.
    pub(crate) fn port_active(&self) -> bool {
        self.context
            .query_port(self.port)
            .is_ok_and(|a| matches!(a.state, verbs::PortState::Active))
    }
}

/// What [`TransferEngine::topology`](crate::TransferEngine::topology)
/// returns: what was discovered and what was initialized so far.
#[derive(Debug, Clone)]
pub struct EngineTopology {
    /// Devices the provider lists, in NIC ID order (known from the start).
    pub listed: Vec<String>,
    /// Whether contexts were initialized (first Host Direct registration
    /// or first RDMA use).
    pub initialized: bool,
    /// The topology built at initialization (ports, GIDs, inert slots).
    pub topology: Option<Topology>,
    /// The selection the contexts were prepared from (ports considered
    /// active, so paused ports are prepared too).
    pub selection: Option<Selection>,
    /// Why no context could be prepared, if so: the device listing failed,
    /// or selection found no usable device and port (every one with its
    /// reason).
    pub selection_error: Option<crate::NicsUnavailable>,
    /// Per prepared context: NIC ID, device, port, GID index and whether the
    /// port is ACTIVE now.
    pub contexts: Vec<ContextStatus>,
}

/// One initialized NIC context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextStatus {
    /// NIC ID (topology position; bit of the dispatch mask).
    pub nic: NicId,
    /// Device name.
    pub device: String,
    /// Kernel driver / provider the device list reported (`mlx5_core`,
    /// `rxe`, `sim`), if known.
    pub driver: Option<String>,
    /// Selected port.
    pub port: u8,
    /// Selected GID index.
    pub gid_index: u32,
    /// Whether the port is ACTIVE now (a paused port is prepared but not
    /// routable).
    pub port_active: bool,
}

/// The result of initializing contexts.
pub(crate) struct Initialized {
    pub(crate) topology: Topology,
    pub(crate) selection: Option<Selection>,
    pub(crate) selection_error: Option<topo::SelectionError>,
    pub(crate) nics: Vec<NicCtx>,
}

fn port_state(s: verbs::PortState) -> topo::PortState {
    topo::PortState::from_code(s.as_raw().min(255) as u8)
}

fn link_layer(l: verbs::LinkLayer) -> Option<topo::LinkLayer> {
    match l {
        verbs::LinkLayer::InfiniBand => Some(topo::LinkLayer::InfiniBand),
        verbs::LinkLayer::Ethernet => Some(topo::LinkLayer::Ethernet),
        _ => None,
    }
}

fn gid_type(t: verbs::GidType) -> topo::GidType {
    match t {
        verbs::GidType::Ib => topo::GidType::Ib,
        verbs::GidType::RoceV1 => topo::GidType::RoceV1,
        verbs::GidType::RoceV2 => topo::GidType::RoceV2,
    }
}

fn uverbs(info: &verbs::DeviceInfo) -> (Option<std::path::PathBuf>, topo::UverbsAccess) {
    match &info.uverbs {
        None => (None, topo::UverbsAccess::NoNode),
        Some(n) => {
            let access = match &n.access {
                verbs::NodeAccess::ReadWrite => topo::UverbsAccess::ReadWrite,
                verbs::NodeAccess::Denied { .. } => topo::UverbsAccess::Denied,
                verbs::NodeAccess::Missing => topo::UverbsAccess::NoNode,
            };
            (Some(n.path.clone().into()), access)
        }
    }
}

/// A topology record of an opened device.
fn nic_record(d: &verbs::DeviceDiagnostics) -> topo::Nic {
    let ports = d
        .ports
        .iter()
        .map(|p| topo::Port {
            number: u32::from(p.attr.port),
            state: port_state(p.attr.state),
            link_layer: link_layer(p.attr.link_layer),
            rate: Some(format!("{} Mb/s", p.attr.rate_mbps())),
            gids: p
                .gids
                .iter()
                .filter(|g| g.valid && !g.gid.is_zero())
                .map(|g| topo::Gid {
                    index: g.index,
                    value: Ipv6Addr::from(g.gid.0),
                    gid_type: g.gid_type.map(gid_type),
                    netdev: g.netdev.clone(),
                })
                .collect(),
            problems: Vec::new(),
        })
        .collect();
    let mut nic = topo::Nic::new(d.info.identity.name.clone(), ports);
    nic.node_guid = Some(d.info.identity.guid);
    (nic.uverbs_node, nic.uverbs_access) = uverbs(&d.info);
    nic.provider = topo::ProviderVisibility::Visible;
    nic
}

/// Opens every listed device, builds the topology, prepares the admitted
/// ones. `cq_depth` sizes each context's completion queue.
pub(crate) fn initialize(
    provider: &dyn Provider,
    listed: &[verbs::DeviceInfo],
    config: &RdmaConfig,
    cq_depth: u32,
) -> Initialized {
    let mut builder = Topology::builder();
    let mut opened = Vec::new();
    for info in listed {
        let name = info.identity.name.clone();
        match provider
            .open(&name)
            .map_err(|e| e.to_string())
            .and_then(|ctx| {
                let d = ctx.diagnostics().map_err(|e| e.to_string())?;
                Ok((ctx, d))
            }) {
            Ok((ctx, d)) => {
                builder = builder.nic(nic_record(&d));
                opened.push(Some((ctx, d)));
            }
            Err(e) => {
                tracing::warn!(device = %name, error = %e, "device open failed: inert slot");
                let mut last = topo::Nic::new(name.clone(), Vec::new());
                (last.uverbs_node, last.uverbs_access) = uverbs(info);
                last.provider = topo::ProviderVisibility::Visible;
                builder = builder.inert(name, Some(last), InertCause::Construction(e));
                opened.push(None);
            }
        }
    }
    let mut topology = builder.build();
    // Prepare as if every port were active: registration must cover paused
    // ports; routability is checked per rail.
    let mut forced = topology.clone();
    let ids: Vec<NicId> = forced.slots().iter().map(|s| s.id()).collect();
    let mut nics_forced = Vec::new();
    for id in &ids {
        if let Some(nic) = forced.slot(*id).and_then(|s| s.nic()).cloned() {
            let mut nic = nic;
            for p in &mut nic.ports {
                p.state = topo::PortState::Active;
            }
            nics_forced.push((*id, Some(nic)));
        } else {
            nics_forced.push((*id, None));
        }
    }
    let mut b = Topology::builder();
    for (id, nic) in nics_forced {
        b = match nic {
            Some(n) => b.nic(n),
            None => {
                let slot = topology.slot(id);
                let name = slot.map(|s| s.name().to_owned()).unwrap_or_default();
                let cause = slot
                    .and_then(|s| s.inert_cause().cloned())
                    .unwrap_or_else(|| InertCause::Construction("unknown".into()));
                b.inert(name, None, cause)
            }
        };
    }
    forced = b.build();
    let (selection, selection_error) = match topo::select(&forced, config, DeviceMask::ALL) {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(e)),
    };
    let mut nics = Vec::new();
    if let Some(sel) = &selection {
        for rail in &sel.rails {
            let Some(Some((ctx, diag))) = opened.get_mut(rail.nic.index()).map(Option::take) else {
                continue;
            };
            let port = u8::try_from(rail.port).unwrap_or(1);
            let pattr = diag
                .ports
                .iter()
                .find(|p| p.attr.port == port)
                .map(|p| p.attr.clone());
            let gid = diag
                .ports
                .iter()
                .find(|p| p.attr.port == port)
                .and_then(|p| p.gids.iter().find(|g| g.index == rail.gid.index))
                .map(|g| g.gid)
                .unwrap_or(verbs::Gid::ZERO);
            let made = ctx.alloc_pd().map_err(|e| e.to_string()).and_then(|pd| {
                let cq = ctx.create_cq(cq_depth).map_err(|e| e.to_string())?;
                Ok((pd, cq))
            });
            match made {
                Ok((pd, cq)) => nics.push(NicCtx {
                    id: rail.nic,
                    identity: ctx.identity().clone(),
                    driver: diag.info.driver.clone(),
                    context: ctx,
                    pd,
                    cq,
                    cq_waiters: Arc::default(),
                    port,
                    gid_index: rail.gid.index,
                    gid,
                    lid: pattr.as_ref().map_or(0, |a| a.lid),
                    mtu: pattr.as_ref().map_or(verbs::Mtu::Mtu1024, |a| a.active_mtu),
                    link_layer: rail.link_layer,
                }),
                Err(e) => {
                    tracing::warn!(nic = rail.nic.0, error = %e, "context preparation failed: inert slot");
                    let _ = topology.mark_inert(rail.nic, InertCause::Construction(e));
                }
            }
        }
    }
    Initialized {
        topology,
        selection,
        selection_error,
        nics,
    }
}
