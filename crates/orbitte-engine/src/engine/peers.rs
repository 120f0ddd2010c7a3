//! Open peers: their table entries and what `peers()` reports.

use orbitte_topology::NicId;
use orbitte_wire::Epoch;

use super::{State, TransferEngine};
use crate::transport::{PeerId, RailId, RangeId};

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
    pub ranges: Vec<crate::RemoteRange>,
    /// Rails to it.
    pub rails: Vec<RailInfo>,
}

impl TransferEngine {
    /// Open peers.
    pub fn peers(&self) -> Vec<PeerInfo> {
        let st = self.lock();
        let mut v: Vec<_> = st
            .engine
            .tables()
            .peers
            .keys()
            .map(|id| peer_info(&st, PeerId(*id)))
            .collect();
        v.sort_by_key(|p| p.id);
        v
    }
}

pub(crate) fn peer_info(st: &State, id: PeerId) -> PeerInfo {
    let p = &st.engine.tables().peers[&id.0];
    let mut ranges: Vec<_> = p
        .ranges
        .values()
        .map(|d| crate::RemoteRange {
            peer: id,
            epoch: p.epoch,
            range: RangeId(d.range_id.0),
            address: d.address,
            len: d.length,
            access: d.access,
        })
        .collect();
    ranges.sort_by_key(|r| r.range);
    PeerInfo {
        id,
        source_id: p.source_id.as_str().to_owned(),
        epoch: p.epoch,
        ranges,
        rails: p
            .rails
            .iter()
            .map(|&rail| {
                let spec = st.engine.core().rail_spec(rail);
                let (qpn, device) = st
                    .rdma
                    .rail(rail)
                    .map_or((None, None), |r| (r.qpn(), Some(r.device.clone())));
                RailInfo {
                    rail,
                    nic: spec.and_then(|s| s.nic).map(NicId),
                    remote_nic: spec.and_then(|s| s.remote_nic).map(NicId),
                    qpn,
                    device,
                    up: st.engine.core().rail_is_up(rail),
                    down_reason: st
                        .engine
                        .core()
                        .rail_down_reason(rail)
                        .map(|r| r.to_string()),
                    recovery: st.recovery.state(rail).map(|(s, _)| s),
                    recoveries: st.recovery.state(rail).map_or(0, |(_, n)| n),
                }
            })
            .collect(),
    }
}
