//! Open peers: what `peers()` reports, read from their table entries.

use orbitte_topology::NicId;

use super::peer_info::{PeerInfo, RailInfo};
use super::{State, TransferEngine};
use crate::transport::{PeerId, RangeId};

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
