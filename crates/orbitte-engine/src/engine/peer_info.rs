//! What the engine reports about an open peer ([`PeerInfo`]) and each of
//! its rails ([`RailInfo`]).

use orbitte_topology::NicId;
use orbitte_wire::Epoch;

use crate::request::{PeerRef, RemoteRange};
use crate::transport::{PeerId, RailId};

/// One rail of an open peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailInfo {
    /// The rail.
    pub rail: RailId,
    /// Local NIC ID (rdma).
    pub nic: Option<NicId>,
    /// Remote NIC ID (rdma).
    pub remote_nic: Option<NicId>,
    /// Queue pair number (rdma), for diagnostics.
    pub qpn: Option<u32>,
    /// Local device name (rdma).
    pub device: Option<String>,
    /// Whether it takes new work now.
    pub up: bool,
    /// Why it is down, if it is.
    pub down_reason: Option<String>,
    /// Its recovery (rdma rails): up, down since, recovering (attempt n)
    /// or cooling down until; `None` for tcp and local rails.
    pub recovery: Option<crate::recovery::RecoveryState>,
    /// How many times it came back after going down.
    pub recoveries: u32,
}

/// An open peer (remote source owner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// Handle for requests.
    pub id: PeerId,
    /// The peer's source id.
    pub source_id: String,
    /// Its authoritative epoch.
    pub epoch: Epoch,
    /// Ranges it published, in range id order.
    pub ranges: Vec<RemoteRange>,
    /// Rails to it.
    pub rails: Vec<RailInfo>,
}

impl From<&PeerInfo> for PeerRef {
    fn from(p: &PeerInfo) -> Self {
        Self {
            id: p.id,
            epoch: Some(p.epoch),
        }
    }
}
