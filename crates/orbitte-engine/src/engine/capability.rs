//! The capability matrix of this engine: the rdma row evaluated for real
//! on the engine's NIC contexts (a loopback WRITE then READ), the net
//! paths' rows from their own probes, the CUDA rows from the staging
//! lanes' evaluation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use orbitte_memory::{DmaBuffer, HostMemory};
use orbitte_verbs::qp_state::{Init, Reset, Rtr, Rts};
use orbitte_verbs::{self as verbs, InitAttrs, QpCaps, QueuePair, RtrAttrs, RtsAttrs, SendWr};

use crate::TransferEngine;
use crate::capability::{CapabilityMatrix, Check, PathRow};
use crate::transport::PathKind;

const FIX_DEVICES: &str = "install rdma-core (libibverbs1), load the RDMA kernel modules and check read/write access to /dev/infiniband/uverbs*";
const FIX_SELECTION: &str = "check that the port is ACTIVE and the GID matches the link layer, GID type and netdev; use RdmaConfig::default() with selectors instead of strict pins";

impl TransferEngine {
    /// The capability matrix with the rdma row evaluated for real (this
    /// initializes contexts: it is an RDMA use).
    pub fn capabilities(&self) -> CapabilityMatrix {
        let mut m = CapabilityMatrix::baseline();
        m.contribute(self.evaluate_rdma());
        // net: real loopback WRITE+READ through the tcp and local transports.
        m.contribute(crate::session::probe::tcp_row());
        m.contribute(crate::session::probe::local_row());
        crate::staging::contribute_cuda_rows(&mut m); // staging: CUDA rows (no engine round trip)
        m
    }

    /// Evaluates the rdma row: discovery through the provider and topology
    /// selection, completion as a loopback WRITE then READ on the first
    /// prepared NIC with an active port, drain as nothing outstanding
    /// afterwards. Uses its own CQ, QPs and two 8 KiB buffers, released
    /// before returning.
    pub fn evaluate_rdma(&self) -> PathRow {
        let mut row = PathRow {
            path: PathKind::Rdma,
            build: Check::Pass,
            discovery: Check::skipped("not reached"),
            completion: Check::skipped("discovery failed"),
            drain: Check::skipped("completion failed"),
            notes: vec![
                "a listed device is not a working route; completion proves this NIC's loopback only, not reachability of a peer".into(),
            ],
        };
        {
            let st = self.lock();
            if let Some(e) = &st.listing_error {
                row.discovery = Check::fail(e.to_string(), FIX_DEVICES);
                return row;
            }
            if st.listed.is_empty() {
                row.discovery = Check::fail("the provider lists no RDMA device", FIX_DEVICES);
                return row;
            }
        }
        if let Err(report) = self.ensure_contexts() {
            row.discovery = Check::fail(report.to_string(), FIX_SELECTION);
            return row;
        }
        let pick = {
            let st = self.lock();
            st.nic_order.iter().find_map(|id| {
                st.init
                    .as_ref()?
                    .nics
                    .iter()
                    .find(|n| n.id.0 == *id && n.port_active())
                    .map(|n| {
                        (
                            n.context.clone(),
                            n.pd.clone(),
                            n.port,
                            n.gid_index,
                            n.gid,
                            n.lid,
                            n.mtu,
                            n.link_layer,
                            n.id.0,
                        )
                    })
            })
        };
        let Some((ctx, pd, port, gid_index, gid, lid, mtu, ll, nic)) = pick else {
            row.discovery = Check::fail(
                "every prepared context's port is down or paused",
                "wait for port recovery or fix the link",
            );
            return row;
        };
        row.discovery = Check::Pass;
        let run = loopback(&ctx, &pd, port, gid_index, gid, lid, mtu, ll);
        match &run.completion {
            Ok(()) => row.completion = Check::Pass,
            Err(reason) => {
                row.completion = Check::fail(
                    format!(
                        "loopback WRITE+READ on NIC ID {nic} ({}): {reason}",
                        ctx.identity().name
                    ),
                    "check the port, the GID's reachability and the device's health (ibv_rc_pingpong)",
                );
            }
        }
        let mut problems = Vec::new();
        if run.extra != 0 {
            problems.push(format!("{} unexpected completion(s)", run.extra));
        }
        if !run.failures.is_empty() {
            // A native destroy failed: like any other native cleanup
            // failure, the objects stay retained (by verbs), the evidence
            // is kept and new admission is fenced.
            let u = self.unquiesced_from(
                format!(
                    "the rdma capability check's loopback on NIC ID {nic} ({})",
                    ctx.identity().name
                ),
                run.failures,
                crate::registration::Charges::default(),
            );
            problems.push(u.to_string());
            let mut st = self.lock();
            self.record_unquiesced(&mut st, &u);
        }
        row.drain = if !problems.is_empty() {
            Check::fail(
                problems.join("; "),
                "keep the evidence; the objects are retained and the engine is fenced (Unquiesced)",
            )
        } else if run.completion.is_ok() {
            Check::Pass
        } else {
            Check::skipped("completion failed")
        };
        row
    }
}

/// A loopback QP in whatever state it reached.
enum LoopQp {
    Reset(QueuePair<Reset>),
    Init(QueuePair<Init>),
    Rtr(QueuePair<Rtr>),
    Rts(QueuePair<Rts>),
    Taken,
}

impl LoopQp {
    /// Destroys the QP; the failure, if any.
    fn close(self) -> Option<verbs::Unquiesced> {
        match self {
            Self::Reset(q) => q.close().err(),
            Self::Init(q) => q.close().err(),
            Self::Rtr(q) => q.close().err(),
            Self::Rts(q) => q.close().err(),
            Self::Taken => None,
        }
    }
}

/// The loopback's native objects: every one is closed explicitly whatever
/// path the check took, so a failed destroy is reported, never hidden in a
/// drop.
#[derive(Default)]
struct LoopObjects {
    qps: Vec<LoopQp>,
    mrs: Vec<verbs::MemoryRegion>,
    cq: Option<verbs::CompletionQueue>,
}

impl LoopObjects {
    /// Destroys QPs, then MRs, then the CQ; returns the failures (the
    /// objects are retained by verbs).
    fn close(self) -> Vec<verbs::Unquiesced> {
        let qps = self.qps.into_iter().map(LoopQp::close);
        let mrs = self.mrs.into_iter().map(|m| m.close().err());
        let cq = self.cq.into_iter().map(|c| c.close().err());
        qps.chain(mrs).chain(cq).flatten().collect()
    }
}

/// What the loopback found.
struct Loopback {
    /// The WRITE+READ round trip.
    completion: Result<(), String>,
    /// Completions beyond the ones expected.
    extra: usize,
    /// Destroys that failed (on every path, early errors included).
    failures: Vec<verbs::Unquiesced>,
}

/// RESET -> INIT -> RTR -> RTS; on failure the QP comes back in the state
/// it reached.
fn to_rts(
    q: QueuePair<Reset>,
    port: u8,
    remote: verbs::RemoteEndpoint,
    sgid: u8,
    psn: u32,
) -> Result<QueuePair<Rts>, (LoopQp, String)> {
    let q = q
        .init(InitAttrs::new(port))
        .map_err(|e| (LoopQp::Reset(e.qp), e.error.to_string()))?;
    let q = q
        .rtr(RtrAttrs::new(remote, sgid))
        .map_err(|e| (LoopQp::Init(e.qp), e.error.to_string()))?;
    q.rts(RtsAttrs::new(psn))
        .map_err(|e| (LoopQp::Rtr(e.qp), e.error.to_string()))
}

/// Connects two QPs of one context to each other, WRITEs 4 KiB from `a` to
/// `b`, READs it back into `a`'s second half, compares, then destroys
/// every object it made (also after an early error) and reports the
/// destroys that failed.
#[allow(clippy::too_many_arguments)]
fn loopback(
    ctx: &verbs::Context,
    pd: &verbs::ProtectionDomain,
    port: u8,
    gid_index: u32,
    gid: verbs::Gid,
    lid: u16,
    mtu: verbs::Mtu,
    ll: orbitte_topology::LinkLayer,
) -> Loopback {
    let mut objects = LoopObjects::default();
    let mut extra = 0;
    let completion = round_trip(
        &mut objects,
        &mut extra,
        ctx,
        pd,
        port,
        gid_index,
        gid,
        lid,
        mtu,
        ll,
    );
    Loopback {
        completion,
        extra,
        failures: objects.close(),
    }
}

#[allow(clippy::too_many_arguments)]
fn round_trip(
    objects: &mut LoopObjects,
    extra: &mut usize,
    ctx: &verbs::Context,
    pd: &verbs::ProtectionDomain,
    port: u8,
    gid_index: u32,
    gid: verbs::Gid,
    lid: u16,
    mtu: verbs::Mtu,
    ll: orbitte_topology::LinkLayer,
) -> Result<(), String> {
    const N: usize = 4096;
    let cq = objects
        .cq
        .insert(ctx.create_cq(16).map_err(|e| e.to_string())?)
        .clone();
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
    };
    let a = HostMemory::alloc(2 * N).map_err(|e| e.to_string())?;
    let b = HostMemory::alloc(N).map_err(|e| e.to_string())?;
    let pattern: Vec<u8> = (0..N).map(|i| (i * 31 + 7) as u8).collect();
    a.write_at(0, &pattern).map_err(|e| e.to_string())?;
    let access = verbs::Access::remote_read_write();
    let ma = pd
        .register(a.clone() as Arc<dyn DmaBuffer>, 0..2 * N, access)
        .map_err(|e| e.to_string())?;
    let sge_w = ma.sge(0, N).map_err(|e| e.to_string());
    let sge_r = ma.sge(N, N).map_err(|e| e.to_string());
    objects.mrs.push(ma);
    let (sge_w, sge_r) = (sge_w?, sge_r?);
    let mb = pd
        .register(b.clone() as Arc<dyn DmaBuffer>, 0..N, access)
        .map_err(|e| e.to_string())?;
    let remote = mb.remote(0).map_err(|e| e.to_string());
    objects.mrs.push(mb);
    let remote = remote?;
    let route = match ll {
        orbitte_topology::LinkLayer::InfiniBand if lid != 0 => verbs::Route::Lid(lid),
        _ => verbs::Route::Gid(gid),
    };
    let q1 = pd.create_qp(&cq, &cq, caps).map_err(|e| e.to_string())?;
    let e1 = q1.endpoint(route, 11, mtu);
    objects.qps.push(LoopQp::Reset(q1));
    let q2 = pd.create_qp(&cq, &cq, caps).map_err(|e| e.to_string())?;
    let e2 = q2.endpoint(route, 22, mtu);
    objects.qps.push(LoopQp::Reset(q2));
    let sgid = u8::try_from(gid_index).unwrap_or(0);
    for (i, remote, psn) in [(0, e2, 11), (1, e1, 22)] {
        let LoopQp::Reset(q) = std::mem::replace(&mut objects.qps[i], LoopQp::Taken) else {
            return Err("loopback queue pair not in reset".into());
        };
        match to_rts(q, port, remote, sgid, psn) {
            Ok(q) => objects.qps[i] = LoopQp::Rts(q),
            Err((q, e)) => {
                objects.qps[i] = q;
                return Err(e);
            }
        }
    }
    let wait = |want: u64| -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut buf = [verbs::Completion::default(); 4];
        loop {
            let n = cq.poll(&mut buf).map_err(|e| e.to_string())?;
            if let Some(c) = buf[..n].iter().find(|c| c.wr_id == want) {
                return if c.is_success() {
                    Ok(())
                } else {
                    Err(format!("completion status {:?}", c.status))
                };
            }
            if Instant::now() >= deadline {
                return Err("no completion within 2 s".into());
            }
            let _ = cq.wait(Duration::from_millis(10));
        }
    };
    let LoopQp::Rts(q1) = &mut objects.qps[0] else {
        return Err("loopback queue pair not ready".into());
    };
    q1.post_send(&[SendWr::write(1, std::slice::from_ref(&sge_w), remote)])
        .map_err(|e| e.to_string())?;
    wait(1)?;
    q1.post_send(&[SendWr::read(2, std::slice::from_ref(&sge_r), remote)])
        .map_err(|e| e.to_string())?;
    wait(2)?;
    let back = a.to_vec(N, N).map_err(|e| e.to_string())?;
    if back != pattern {
        return Err("bytes read back differ from the bytes written".into());
    }
    // Drain: no further completion.
    let mut buf = [verbs::Completion::default(); 4];
    *extra = cq.poll(&mut buf).map_err(|e| e.to_string())?;
    Ok(())
}
