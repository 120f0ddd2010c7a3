//! Queue pair setup for rdma rails: a queue pair made and taken to INIT on
//! a NIC with its endpoint for the peer ([`make_qp`]), then connected to
//! the peer's endpoint through RTR to RTS ([`connect_qp`]), and the MTU
//! conversions between the wire and verbs.

use orbitte_verbs::{self as verbs, InitAttrs, QpCaps, RtrAttrs, RtsAttrs};
use orbitte_wire as wire;

use crate::error::OpenPeerError;
use crate::nic::NicCtx;

pub(crate) fn to_verbs_mtu(m: wire::Mtu) -> verbs::Mtu {
    match m.bytes() {
        256 => verbs::Mtu::Mtu256,
        512 => verbs::Mtu::Mtu512,
        1024 => verbs::Mtu::Mtu1024,
        2048 => verbs::Mtu::Mtu2048,
        _ => verbs::Mtu::Mtu4096,
    }
}

pub(crate) fn to_wire_mtu(m: verbs::Mtu) -> wire::Mtu {
    wire::Mtu::new(m.bytes() as u16).unwrap_or(wire::Mtu::MTU_1024)
}

pub(crate) fn min_mtu(a: verbs::Mtu, b: verbs::Mtu) -> verbs::Mtu {
    if a.bytes() <= b.bytes() { a } else { b }
}

fn remote_endpoint(e: &wire::RailEndpoint, ll_ib: bool) -> verbs::RemoteEndpoint {
    let route = if ll_ib && e.lid != 0 {
        verbs::Route::Lid(e.lid)
    } else {
        verbs::Route::Gid(verbs::Gid(e.gid.0))
    };
    verbs::RemoteEndpoint {
        qpn: e.qpn.value(),
        psn: e.psn.value(),
        route,
        mtu: to_verbs_mtu(e.mtu),
    }
}

fn verbs_err(n: &NicCtx, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> OpenPeerError {
    OpenPeerError::Verbs {
        nic: n.id,
        device: n.identity.name.clone(),
        source: e.into(),
    }
}

/// A queue pair after INIT, with its endpoint.
pub(crate) struct HalfRail {
    pub(crate) nic: u32,
    qp: verbs::QueuePair<verbs::qp_state::Init>,
    pub(crate) endpoint: wire::RailEndpoint,
}

pub(crate) fn make_qp(n: &NicCtx, caps: QpCaps, psn: u32) -> Result<HalfRail, OpenPeerError> {
    let qp =
        n.pd.create_qp(&n.cq, &n.cq, caps)
            .map_err(|e| verbs_err(n, e))?;
    let qp = qp
        .init(InitAttrs::new(n.port))
        .map_err(|e| verbs_err(n, e.error))?;
    let endpoint = wire::RailEndpoint {
        nic_id: wire::NicId(u16::try_from(n.id.0).unwrap_or(u16::MAX)),
        qpn: wire::Qpn::new(qp.qp_num())
            .ok_or_else(|| verbs_err(n, "queue pair number wider than 24 bits"))?,
        psn: wire::Psn::new(psn & 0xff_ffff)
            .ok_or_else(|| verbs_err(n, "psn wider than 24 bits"))?,
        mtu: to_wire_mtu(n.mtu),
        lid: n.lid,
        gid: wire::Gid(n.gid.0),
    };
    Ok(HalfRail {
        nic: n.id.0,
        qp,
        endpoint,
    })
}

pub(crate) fn connect_qp(
    n: &NicCtx,
    half: HalfRail,
    remote: &wire::RailEndpoint,
) -> Result<verbs::QueuePair<verbs::qp_state::Rts>, OpenPeerError> {
    let ib = matches!(n.link_layer, orbitte_topology::LinkLayer::InfiniBand);
    let remote_ep = remote_endpoint(remote, ib);
    let mut rtr = RtrAttrs::new(remote_ep, u8::try_from(n.gid_index).unwrap_or(0));
    rtr.path_mtu = min_mtu(n.mtu, remote_ep.mtu);
    let qp = half.qp.rtr(rtr).map_err(|e| verbs_err(n, e.error))?;
    let qp = qp
        .rts(RtsAttrs::new(half.endpoint.psn.value()))
        .map_err(|e| verbs_err(n, e.error))?;
    Ok(qp)
}
