//! The sim provider end to end: lifecycle, data movement, key checks and
//! every injected fault, each with exact completions and errors.

use std::sync::Arc;
use std::time::Duration;

use orbitte_memory::HostMemory;
use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric, WrMatch};
use orbitte_verbs::{
    Access, AsyncEvent, Completion, CompletionQueue, Context, InitAttrs, MemoryRegion, Mtu,
    NativeError, ObjectKind, PostError, PostErrorKind, ProtectionDomain, Provider, QpCaps, QpState,
    QueuePair, RecvWr, RemoteAddr, Route, RtrAttrs, RtsAttrs, SendWr, Sge, UnquiescedCause,
    WcOpcode, WcStatus,
};

const EBUSY: i32 = 16;
const ENOMEM: i32 = 12;
const EFAULT: i32 = 14;
const EACCES: i32 = 13;
const EINVAL: i32 = 22;

fn fabric(seed: u64) -> SimFabric {
    SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("sim0", [10, 0, 0, 1]),
            SimDeviceDesc::roce("sim1", [10, 0, 0, 2]),
        ]),
        seed,
    )
}

/// One side of a connection: context, PD, CQ, QP, and a 4 KiB buffer
/// registered for remote read/write.
struct Side {
    qp: QueuePair,
    cq: CompletionQueue,
    mem: Arc<HostMemory>,
    mr: MemoryRegion,
    pd: ProtectionDomain,
    ctx: Context,
}

struct Half {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair<orbitte_verbs::qp_state::Reset>,
    mem: Arc<HostMemory>,
    mr: MemoryRegion,
}

fn half(p: &dyn Provider, dev: &str) -> Half {
    half_with(p, dev, QpCaps::default())
}

fn half_with(p: &dyn Provider, dev: &str, caps: QpCaps) -> Half {
    let ctx = p.open(dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = pd.create_qp(&cq, &cq, caps).unwrap();
    let mem = HostMemory::alloc(4096).unwrap();
    let mr = pd
        .register(mem.clone(), 0..4096, Access::remote_read_write())
        .unwrap();
    Half {
        ctx,
        pd,
        cq,
        qp,
        mem,
        mr,
    }
}

fn endpoint(h: &Half, psn: u32) -> orbitte_verbs::RemoteEndpoint {
    let gid = h.ctx.query_gid(1, 1).unwrap().gid;
    h.qp.endpoint(Route::Gid(gid), psn, Mtu::Mtu1024)
}

fn finish(h: Half, remote: orbitte_verbs::RemoteEndpoint, psn: u32, rts: RtsAttrs) -> Side {
    let _ = psn;
    let qp =
        h.qp.connect(InitAttrs::new(1), RtrAttrs::new(remote, 1), rts)
            .unwrap();
    Side {
        qp,
        cq: h.cq,
        mem: h.mem,
        mr: h.mr,
        pd: h.pd,
        ctx: h.ctx,
    }
}

fn pair_with(f: &SimFabric, rnr_retry: u8) -> (Side, Side) {
    let p = f.provider();
    let a = half(&*p, "sim0");
    let b = half(&*p, "sim1");
    let (ea, eb) = (endpoint(&a, 100), endpoint(&b, 200));
    let a = finish(
        a,
        eb,
        100,
        RtsAttrs {
            rnr_retry,
            ..RtsAttrs::new(100)
        },
    );
    let b = finish(
        b,
        ea,
        200,
        RtsAttrs {
            rnr_retry,
            ..RtsAttrs::new(200)
        },
    );
    (a, b)
}

fn pair(f: &SimFabric) -> (Side, Side) {
    pair_with(f, 7)
}

fn poll_all(cq: &CompletionQueue) -> Vec<Completion> {
    let mut out = vec![Completion::default(); 16];
    let mut all = Vec::new();
    loop {
        let n = cq.poll(&mut out).unwrap();
        if n == 0 {
            return all;
        }
        all.extend_from_slice(&out[..n]);
    }
}

fn ok(wr_id: u64, opcode: WcOpcode, byte_len: u32, qp_num: u32) -> Completion {
    Completion {
        wr_id,
        status: WcStatus::Success,
        opcode: Some(opcode),
        byte_len,
        imm: None,
        qp_num,
        vendor_err: 0,
    }
}

fn err(wr_id: u64, status: WcStatus, qp_num: u32) -> Completion {
    Completion {
        wr_id,
        status,
        opcode: None,
        byte_len: 0,
        imm: None,
        qp_num,
        vendor_err: 0,
    }
}

#[test]
fn devices_ports_gids_and_diagnostics() {
    let f = fabric(1);
    let p = f.provider();
    let devs = p.devices().unwrap();
    assert_eq!(
        devs.iter()
            .map(|d| d.identity.name.as_str())
            .collect::<Vec<_>>(),
        ["sim0", "sim1"]
    );
    assert_eq!(devs[0].driver.as_deref(), Some("sim"));
    let node = devs[0].uverbs.as_ref().unwrap();
    assert_eq!(node.path, "/dev/infiniband/uverbs0");
    assert_eq!(node.access, orbitte_verbs::NodeAccess::ReadWrite);

    let ctx = p.open("sim0").unwrap();
    let port = ctx.query_port(1).unwrap();
    assert_eq!(port.state, orbitte_verbs::PortState::Active);
    assert_eq!(port.link_layer, orbitte_verbs::LinkLayer::Ethernet);
    assert_eq!(port.active_mtu, Mtu::Mtu1024);
    assert_eq!(port.rate_mbps(), 100_000);
    let gids = ctx.gids(1).unwrap();
    assert_eq!(gids.len(), 2);
    assert_eq!(gids[1].gid_type, Some(orbitte_verbs::GidType::RoceV2));
    assert_eq!(gids[1].gid, orbitte_verbs::Gid::from_ipv4([10, 0, 0, 1]));
    assert_eq!(gids[1].netdev.as_deref(), Some("sim0-eth"));
    assert!(gids.iter().all(|g| g.valid));
    assert!(matches!(
        ctx.query_port(2),
        Err(orbitte_verbs::QueryError::InvalidPort { port: 2, ports: 1 })
    ));
    assert!(matches!(
        ctx.query_gid(1, 9),
        Err(orbitte_verbs::QueryError::InvalidGidIndex {
            index: 9,
            len: 2,
            ..
        })
    ));
    let diag = ctx.diagnostics().unwrap();
    assert_eq!(diag.ports.len(), 1);
    assert_eq!(diag.ports[0].gids, gids);
    assert!(diag.port_errors.is_empty());
    assert!(matches!(
        p.open("mlx5_9"),
        Err(orbitte_verbs::OpenError::NoSuchDevice { ref available, .. }) if available.len() == 2
    ));
    // A per-host provider sees only its devices.
    let host1 = f.provider_for(&["sim1"]);
    assert_eq!(host1.devices().unwrap().len(), 1);
    assert!(host1.open("sim0").is_err());
}

#[test]
fn write_read_send_with_imm_move_checked_bytes() {
    let f = fabric(2);
    let (mut a, mut b) = pair(&f);
    let (qa, qb) = (a.qp.qp_num(), b.qp.qp_num());
    a.mem.write_at(0, b"hello, remote!").unwrap();

    // WRITE a[0..14] -> b[100..114]; READ b[100..114] -> a[200..214].
    let src = [a.mr.sge(0, 14).unwrap()];
    let dst = [a.mr.sge(200, 14).unwrap()];
    a.qp.post_send(&[
        SendWr::write(1, &src, b.mr.remote(100).unwrap()),
        SendWr::read(2, &dst, b.mr.remote(100).unwrap()),
    ])
    .unwrap();
    // Nothing moves until the fabric runs (manual delivery).
    assert!(poll_all(&a.cq).is_empty());
    assert_eq!(f.pending(), 2);
    assert_eq!(f.drive(), 2);
    assert_eq!(
        poll_all(&a.cq),
        [
            ok(1, WcOpcode::RdmaWrite, 14, qa),
            ok(2, WcOpcode::RdmaRead, 14, qa)
        ]
    );
    assert_eq!(b.mem.to_vec(100, 14).unwrap(), b"hello, remote!");
    assert_eq!(a.mem.to_vec(200, 14).unwrap(), b"hello, remote!");
    assert_eq!(b.mem.to_vec(99, 1).unwrap(), [0]);
    assert_eq!(b.mem.to_vec(114, 1).unwrap(), [0]);

    // SEND with immediate, gathered from two SGEs, scattered into two.
    let recv_sges = [b.mr.sge(1000, 3).unwrap(), b.mr.sge(2000, 100).unwrap()];
    b.qp.post_recv(&[RecvWr {
        wr_id: 77,
        sges: &recv_sges,
    }])
    .unwrap();
    a.mem.write_at(300, b"abcdef").unwrap();
    let send_sges = [a.mr.sge(300, 2).unwrap(), a.mr.sge(302, 4).unwrap()];
    a.qp.post_send(&[SendWr::send(3, &send_sges, Some(0xfeed))])
        .unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [ok(3, WcOpcode::Send, 6, qa)]);
    assert_eq!(
        poll_all(&b.cq),
        [Completion {
            imm: Some(0xfeed),
            ..ok(77, WcOpcode::Recv, 6, qb)
        }]
    );
    assert_eq!(b.mem.to_vec(1000, 3).unwrap(), b"abc");
    assert_eq!(b.mem.to_vec(2000, 3).unwrap(), b"def");

    // WRITE with immediate consumes a receive at the peer.
    b.qp.post_recv(&[RecvWr {
        wr_id: 78,
        sges: &[],
    }])
    .unwrap();
    let w = SendWr {
        op: orbitte_verbs::SendOp::Write {
            remote: b.mr.remote(0).unwrap(),
            imm: Some(9),
        },
        ..SendWr::write(4, &src, b.mr.remote(0).unwrap())
    };
    a.qp.post_send(&[w]).unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [ok(4, WcOpcode::RdmaWrite, 14, qa)]);
    assert_eq!(
        poll_all(&b.cq),
        [Completion {
            imm: Some(9),
            ..ok(78, WcOpcode::RecvRdmaWithImm, 14, qb)
        }]
    );
    assert_eq!(b.mem.to_vec(0, 14).unwrap(), b"hello, remote!");
}

#[test]
fn counts_and_keys_per_device_follow_what_each_device_holds() {
    use orbitte_verbs::sim::SimCounts;
    let f = fabric(4);
    let p = f.provider();
    let h = half(&*p, "sim1");
    let one = SimCounts {
        contexts: 1,
        pds: 1,
        mrs: 1,
        cqs: 1,
        qps: 1,
    };
    assert_eq!(f.counts_on("sim1"), Some(one));
    assert_eq!(f.counts_on("sim0"), Some(SimCounts::default()));
    assert_eq!(f.counts_on("nope"), None);
    assert_eq!(f.mr_keys("sim1"), [h.mr.lkey()]);
    assert!(f.mr_keys("sim0").is_empty());
    let second =
        h.pd.register(h.mem.clone(), 0..4096, Access::local_only())
            .unwrap();
    let mut both = vec![h.mr.lkey(), second.lkey()];
    both.sort_unstable();
    assert_eq!(f.mr_keys("sim1"), both);
    let base = h.mem.as_ptr() as u64;
    let second_range = f
        .mr_ranges("sim1")
        .into_iter()
        .find(|&(_, len)| len == 4096)
        .expect("the second region is listed");
    assert_eq!(
        second_range,
        (base, 4096),
        "address of the buffer's first byte"
    );
    assert!(f.mr_ranges("sim0").is_empty());
    assert!(f.mr_ranges("nope").is_empty());
    second.close().unwrap();
    assert_eq!(f.mr_keys("sim1"), [h.mr.lkey()]);
    assert_eq!(f.mr_ranges("sim1").len(), 1);
    drop(h);
    assert_eq!(f.counts_on("sim1"), Some(SimCounts::default()));
}

#[test]
fn teardown_follows_ownership_and_close_reports() {
    let f = fabric(3);
    let (a, b) = pair(&f);
    assert_eq!(
        f.counts(),
        orbitte_verbs::sim::SimCounts {
            contexts: 2,
            pds: 2,
            mrs: 2,
            cqs: 2,
            qps: 2
        }
    );
    // Closing a parent still held by children reports InUse and destroys
    // nothing.
    let e = a.pd.clone().close().unwrap_err();
    assert_eq!(e.object, ObjectKind::ProtectionDomain);
    assert!(matches!(e.cause, UnquiescedCause::InUse { holders } if holders >= 3));
    assert!(!e.cleanup.retained);
    assert_eq!(f.counts().pds, 2);

    // Explicit close in order succeeds.
    let Side {
        qp,
        cq,
        mem,
        mr,
        pd,
        ctx,
    } = a;
    qp.close().unwrap();
    mr.close().unwrap();
    cq.close().unwrap();
    pd.close().unwrap();
    ctx.close().unwrap();
    assert_eq!(Arc::strong_count(&mem), 1, "the MR released its buffer");
    // Dropping in the "wrong" order still tears down child-first.
    let Side {
        qp,
        cq,
        mem: _,
        mr,
        pd,
        ctx,
    } = b;
    drop(ctx);
    drop(pd);
    drop(cq);
    drop(mr);
    assert_eq!(f.counts().contexts, 1);
    drop(qp);
    assert_eq!(f.counts(), orbitte_verbs::sim::SimCounts::default());
}

#[test]
fn bad_rkey_is_a_remote_access_error_and_flushes() {
    let f = fabric(4);
    let (mut a, b) = pair(&f);
    let (qa, qb) = (a.qp.qp_num(), b.qp.qp_num());
    a.mem.fill(0, 64, 0xaa).unwrap();
    let src = [a.mr.sge(0, 64).unwrap()];
    let bogus = RemoteAddr {
        addr: b.mr.addr(),
        rkey: b.mr.rkey() ^ 0x5500,
    };
    a.qp.post_send(&[
        SendWr::write(1, &src, bogus),
        SendWr::write(2, &src, b.mr.remote(0).unwrap()),
    ])
    .unwrap();
    f.drive();
    assert_eq!(
        poll_all(&a.cq),
        [
            err(1, WcStatus::RemoteAccess, qa),
            err(2, WcStatus::WrFlush, qa)
        ]
    );
    assert_eq!(
        b.mem.to_vec(0, 4096).unwrap(),
        vec![0; 4096],
        "no byte written"
    );
    assert_eq!(a.qp.state().unwrap(), QpState::Error);
    assert_eq!(b.qp.state().unwrap(), QpState::Error);
    assert_eq!(
        b.ctx.next_async_event(Duration::ZERO).unwrap(),
        Some(AsyncEvent::QpAccessError { qpn: qb })
    );
    // Posting on the errored QP flushes at once.
    a.qp.post_send(&[SendWr::write(3, &src, b.mr.remote(0).unwrap())])
        .unwrap();
    assert_eq!(poll_all(&a.cq), [err(3, WcStatus::WrFlush, qa)]);
}

#[test]
fn out_of_bounds_and_wrong_access_never_write_outside() {
    // Remote range past the end of the remote MR.
    let f = fabric(5);
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    a.mem.fill(0, 4096, 0xbb).unwrap();
    let src = [a.mr.sge(0, 64).unwrap()];
    let past = RemoteAddr {
        addr: b.mr.addr() + 4096 - 32,
        rkey: b.mr.rkey(),
    };
    a.qp.post_send(&[SendWr::write(1, &src, past)]).unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [err(1, WcStatus::RemoteAccess, qa)]);
    assert_eq!(b.mem.to_vec(0, 4096).unwrap(), vec![0; 4096]);

    // Local SGE past the end of its MR.
    let f = fabric(6);
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    let bad = [Sge::new(a.mr.addr() + 4000, 200, a.mr.lkey())];
    a.qp.post_send(&[SendWr::write(1, &bad, b.mr.remote(0).unwrap())])
        .unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [err(1, WcStatus::LocalProtection, qa)]);
    assert_eq!(
        b.qp.state().unwrap(),
        QpState::Rts,
        "the responder never saw it"
    );
    // The safe constructor refuses it up front.
    assert!(a.mr.sge(4000, 200).is_err());

    // A local-only MR cannot be written remotely.
    let f = fabric(7);
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    let local = HostMemory::alloc(4096).unwrap();
    let local_mr =
        b.pd.register(local.clone(), 0..4096, Access::local_only())
            .unwrap();
    let src = [a.mr.sge(0, 8).unwrap()];
    a.qp.post_send(&[SendWr::write(1, &src, local_mr.remote(0).unwrap())])
        .unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [err(1, WcStatus::RemoteAccess, qa)]);
    assert_eq!(local.to_vec(0, 8).unwrap(), vec![0; 8]);

    // READ into a local MR without LOCAL_WRITE.
    let f = fabric(8);
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    let ro = HostMemory::alloc(4096).unwrap();
    let ro_mr = a.pd.register(ro.clone(), 0..4096, Access::NONE).unwrap();
    let dst = [ro_mr.sge(0, 8).unwrap()];
    a.qp.post_send(&[SendWr::read(1, &dst, b.mr.remote(0).unwrap())])
        .unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [err(1, WcStatus::LocalProtection, qa)]);

    // An lkey of another PD is a protection error.
    let f = fabric(9);
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    let other_pd = a.ctx.alloc_pd().unwrap();
    let other = other_pd
        .register(a.mem.clone(), 0..4096, Access::local_only())
        .unwrap();
    let src = [other.sge(0, 8).unwrap()];
    a.qp.post_send(&[SendWr::write(1, &src, b.mr.remote(0).unwrap())])
        .unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [err(1, WcStatus::LocalProtection, qa)]);

    // A remote MR in another PD than the responder QP's.
    let f = fabric(10);
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    let b_pd2 = b.ctx.alloc_pd().unwrap();
    let b_mem2 = HostMemory::alloc(4096).unwrap();
    let b_mr2 = b_pd2
        .register(b_mem2.clone(), 0..4096, Access::remote_read_write())
        .unwrap();
    let src = [a.mr.sge(0, 8).unwrap()];
    a.qp.post_send(&[SendWr::write(1, &src, b_mr2.remote(0).unwrap())])
        .unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [err(1, WcStatus::RemoteAccess, qa)]);
    assert_eq!(b_mem2.to_vec(0, 8).unwrap(), vec![0; 8]);
}

#[test]
fn registration_checks_range_and_access() {
    let f = fabric(11);
    let ctx = f.provider().open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mem = HostMemory::alloc(4096).unwrap();
    assert!(matches!(
        pd.register(mem.clone(), 4000..4097, Access::local_only()),
        Err(orbitte_verbs::RegisterError::OutOfRange {
            start: 4000,
            end: 4097,
            len: 4096
        })
    ));
    assert!(matches!(
        pd.register(mem.clone(), 0..0, Access::local_only()),
        Err(orbitte_verbs::RegisterError::OutOfRange { .. })
    ));
    assert!(matches!(
        pd.register(mem.clone(), 0..10, Access::REMOTE_WRITE),
        Err(orbitte_verbs::RegisterError::InvalidAccess { .. })
    ));
    let mr = pd
        .register(mem.clone(), 100..200, Access::remote_read_write())
        .unwrap();
    assert_eq!(mr.addr(), mem.as_ptr() as u64 + 100);
    assert_eq!(mr.len(), 100);
    assert!(mr.sge(50, 51).is_err());
    assert!(mr.remote(101).is_err());
    assert_eq!(mr.sge(50, 50).unwrap().addr(), mr.addr() + 50);

    // A read-only mapping cannot be registered for writing (the NIC would
    // fault), but can be for remote reads.
    let fd = mem.memfd().unwrap().try_clone_to_owned().unwrap();
    let ro = HostMemory::map_shared(fd, 4096, false).unwrap();
    assert!(matches!(
        pd.register(ro.clone(), 0..4096, Access::local_only()),
        Err(orbitte_verbs::RegisterError::ReadOnlyBuffer { .. })
    ));
    pd.register(ro, 0..4096, Access::REMOTE_READ).unwrap();
}

#[test]
fn selective_signaling_and_queue_full() {
    let f = fabric(12);
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    let src = [a.mr.sge(0, 8).unwrap()];
    let r = b.mr.remote(0).unwrap();
    let wrs: Vec<SendWr<'_>> = (0..4)
        .map(|i| SendWr::write(i, &src, r).signaled(i == 3))
        .collect();
    a.qp.post_send(&wrs).unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [ok(3, WcOpcode::RdmaWrite, 8, qa)]);

    // A QP with 4 slots posting only unsignaled work fills up: the slots
    // are freed only by a polled signaled completion.
    let p = f.provider();
    let h = half(&*p, "sim0");
    let caps = QpCaps {
        max_send_wr: 4,
        ..QpCaps::default()
    };
    let qp = h.pd.create_qp(&h.cq, &h.cq, caps).unwrap();
    let gid = h.ctx.query_gid(1, 1).unwrap().gid;
    let peer = half(&*p, "sim1");
    let peer_gid = peer.ctx.query_gid(1, 1).unwrap().gid;
    let e_self = qp.endpoint(Route::Gid(gid), 5, Mtu::Mtu1024);
    let e_peer = peer.qp.endpoint(Route::Gid(peer_gid), 6, Mtu::Mtu1024);
    let mut qp = qp
        .connect(
            InitAttrs::new(1),
            RtrAttrs::new(e_peer, 1),
            RtsAttrs::new(5),
        )
        .unwrap();
    let _peer = peer
        .qp
        .connect(
            InitAttrs::new(1),
            RtrAttrs::new(e_self, 1),
            RtsAttrs::new(6),
        )
        .unwrap();
    let src = [h.mr.sge(0, 8).unwrap()];
    let r = peer.mr.remote(0).unwrap();
    let unsignaled: Vec<SendWr<'_>> = (0..5)
        .map(|i| SendWr::write(i, &src, r).signaled(false))
        .collect();
    let e = qp.post_send(&unsignaled).unwrap_err();
    assert_eq!(e.index, 4);
    assert_eq!(e.kind, PostErrorKind::QueueFull { depth: 4 });
    f.drive();
    assert!(poll_all(&h.cq).is_empty());
    // Still full: nothing signaled was polled.
    assert_eq!(
        qp.post_send(&[SendWr::write(9, &src, r)]).unwrap_err().kind,
        PostErrorKind::QueueFull { depth: 4 }
    );
    // Too many SGEs is refused at its index.
    let many = [src[0]; 5];
    let e =
        a.qp.post_send(&[SendWr::write(1, &src, r), SendWr::write(2, &many, r)])
            .unwrap_err();
    assert_eq!(
        (e.index, e.kind),
        (1, PostErrorKind::TooManySges { sges: 5, max: 4 })
    );
}

#[test]
fn send_errors_rnr_and_length() {
    // rnr_retry 0: SEND with no receive posted fails at once.
    let f = fabric(13);
    let (mut a, b) = pair_with(&f, 0);
    let qa = a.qp.qp_num();
    let src = [a.mr.sge(0, 16).unwrap()];
    a.qp.post_send(&[SendWr::send(1, &src, None)]).unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [err(1, WcStatus::RnrRetryExceeded, qa)]);
    assert_eq!(b.qp.state().unwrap(), QpState::Rts);

    // rnr_retry 7: the SEND waits for a receive.
    let f = fabric(14);
    let (mut a, mut b) = pair(&f);
    let (qa, qb) = (a.qp.qp_num(), b.qp.qp_num());
    let src = [a.mr.sge(0, 16).unwrap()];
    a.qp.post_send(&[SendWr::send(1, &src, None)]).unwrap();
    assert_eq!(f.drive(), 0);
    assert_eq!(f.pending(), 1);
    let dst = [b.mr.sge(0, 16).unwrap()];
    b.qp.post_recv(&[RecvWr {
        wr_id: 5,
        sges: &dst,
    }])
    .unwrap();
    assert_eq!(f.drive(), 1);
    assert_eq!(poll_all(&a.cq), [ok(1, WcOpcode::Send, 16, qa)]);
    assert_eq!(poll_all(&b.cq), [ok(5, WcOpcode::Recv, 16, qb)]);

    // A SEND larger than the receive: LocalLength at the responder,
    // RemoteInvalidRequest at the requester, both QPs in error.
    let small = [b.mr.sge(0, 4).unwrap()];
    b.qp.post_recv(&[
        RecvWr {
            wr_id: 6,
            sges: &small,
        },
        RecvWr {
            wr_id: 7,
            sges: &small,
        },
    ])
    .unwrap();
    a.qp.post_send(&[SendWr::send(2, &src, None)]).unwrap();
    f.drive();
    assert_eq!(
        poll_all(&a.cq),
        [err(2, WcStatus::RemoteInvalidRequest, qa)]
    );
    assert_eq!(
        poll_all(&b.cq),
        [
            err(6, WcStatus::LocalLength, qb),
            err(7, WcStatus::WrFlush, qb)
        ]
    );
}

#[test]
fn port_down_and_up_with_events() {
    let f = fabric(15);
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    f.faults().port_down("sim1", 1).unwrap();
    assert_eq!(
        b.ctx.next_async_event(Duration::ZERO).unwrap(),
        Some(AsyncEvent::PortError { port: 1 })
    );
    assert_eq!(
        b.ctx.query_port(1).unwrap().state,
        orbitte_verbs::PortState::Down
    );
    assert_eq!(a.ctx.next_async_event(Duration::ZERO).unwrap(), None);
    let src = [a.mr.sge(0, 8).unwrap()];
    let r = b.mr.remote(0).unwrap();
    a.qp.post_send(&[SendWr::write(1, &src, r), SendWr::write(2, &src, r)])
        .unwrap();
    f.drive();
    assert_eq!(
        poll_all(&a.cq),
        [
            err(1, WcStatus::RetryExceeded, qa),
            err(2, WcStatus::WrFlush, qa)
        ]
    );
    f.faults().port_up("sim1", 1).unwrap();
    assert_eq!(
        b.ctx.next_async_event(Duration::ZERO).unwrap(),
        Some(AsyncEvent::PortActive { port: 1 })
    );
    assert_eq!(
        b.ctx.query_port(1).unwrap().state,
        orbitte_verbs::PortState::Active
    );
    assert!(f.faults().port_down("sim1", 2).is_err());
}

#[test]
fn qp_fatal_flushes_posted_work() {
    let f = fabric(16);
    let (mut a, mut b) = pair(&f);
    let (qa, qb) = (a.qp.qp_num(), b.qp.qp_num());
    let src = [a.mr.sge(0, 8).unwrap()];
    let r = b.mr.remote(0).unwrap();
    b.qp.post_recv(&[RecvWr {
        wr_id: 50,
        sges: &[],
    }])
    .unwrap();
    a.qp.post_send(&[
        SendWr::write(1, &src, r),
        SendWr::write(2, &src, r).signaled(false),
    ])
    .unwrap();
    f.faults().qp_fatal("sim0", qa).unwrap();
    assert_eq!(
        a.ctx.next_async_event(Duration::ZERO).unwrap(),
        Some(AsyncEvent::QpFatal { qpn: qa })
    );
    assert_eq!(
        poll_all(&a.cq),
        [err(1, WcStatus::WrFlush, qa), err(2, WcStatus::WrFlush, qa)]
    );
    assert_eq!(f.drive(), 0);
    // Moving a QP to error on purpose flushes its receives.
    let b_err = b.qp.into_error().unwrap();
    assert_eq!(poll_all(&b.cq), [err(50, WcStatus::WrFlush, qb)]);
    assert_eq!(b_err.state().unwrap(), QpState::Error);
}

#[test]
fn a_stalled_request_never_completes_until_flushed() {
    let f = fabric(17);
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    f.faults()
        .stall_send(WrMatch::nth(2).on_device("sim0").on_qp(qa));
    let src = [a.mr.sge(0, 8).unwrap()];
    let r = b.mr.remote(0).unwrap();
    a.qp.post_send(&[
        SendWr::write(1, &src, r),
        SendWr::write(2, &src, r),
        SendWr::write(3, &src, r),
    ])
    .unwrap();
    assert_eq!(f.drive(), 1);
    f.advance(Duration::from_secs(3600));
    assert_eq!(poll_all(&a.cq), [ok(1, WcOpcode::RdmaWrite, 8, qa)]);
    assert_eq!(f.pending(), 2);
    // Drain: move to error; the stalled request and the one behind it flush.
    let a_err = a.qp.into_error().unwrap();
    assert_eq!(
        poll_all(&a.cq),
        [err(2, WcStatus::WrFlush, qa), err(3, WcStatus::WrFlush, qa)]
    );
    assert_eq!(f.pending(), 0);
    a_err.close().unwrap();
}

#[test]
fn recorded_and_outstanding_sends_follow_what_the_fabric_accepted_and_holds() {
    let f = fabric(19);
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    let src = [a.mr.sge(0, 8).unwrap()];
    let r = b.mr.remote(0).unwrap();
    a.qp.post_send(&[SendWr::write(1, &src, r)]).unwrap();
    assert!(f.take_sends().is_empty(), "not recording yet");
    f.record_sends(true);
    f.faults()
        .stall_send(WrMatch::nth(1).on_device("sim0").on_qp(qa));
    f.faults().fail_post(WrMatch::nth(3), 22);
    let err =
        a.qp.post_send(&[
            SendWr::write(2, &src, r),
            SendWr::write(3, &src, r),
            SendWr::write(4, &src, r),
            SendWr::write(5, &src, r),
        ])
        .unwrap_err();
    assert_eq!(err.index, 2, "the third of the batch is refused");
    let sent = f.take_sends();
    assert_eq!(
        sent.iter().map(|w| (w.wr_id, w.qpn)).collect::<Vec<_>>(),
        [(2, qa), (3, qa)],
        "the refused post and the rest of its batch are not recorded"
    );
    assert_eq!(sent[0].device, "sim0");
    assert_eq!(sent[0].sges, src);
    assert!(sent[0].touches(src[0].addr() + 7, 1));
    assert!(!sent[0].touches(src[0].addr() + 8, 100));
    assert!(f.take_sends().is_empty(), "taken once");
    assert_eq!(
        f.outstanding_sends()
            .iter()
            .map(|w| w.wr_id)
            .collect::<Vec<_>>(),
        [1, 2, 3]
    );
    f.drive();
    // 1 ran; 2 stalls and holds 3 behind it.
    assert_eq!(
        f.outstanding_sends()
            .iter()
            .map(|w| w.wr_id)
            .collect::<Vec<_>>(),
        [2, 3]
    );
    let _errored = a.qp.into_error().unwrap();
    assert!(f.outstanding_sends().is_empty(), "flushed");
    f.record_sends(false);
    assert!(f.take_sends().is_empty());
}

#[test]
fn a_chosen_error_status_with_and_without_remote_effect() {
    let f = fabric(18);
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    a.mem.fill(0, 8, 7).unwrap();
    f.faults()
        .fail_send(WrMatch::nth(1), WcStatus::RetryExceeded, true);
    let src = [a.mr.sge(0, 8).unwrap()];
    a.qp.post_send(&[
        SendWr::write(1, &src, b.mr.remote(0).unwrap()),
        SendWr::write(2, &src, b.mr.remote(8).unwrap()),
    ])
    .unwrap();
    f.drive();
    assert_eq!(
        poll_all(&a.cq),
        [
            err(1, WcStatus::RetryExceeded, qa),
            err(2, WcStatus::WrFlush, qa)
        ]
    );
    assert_eq!(
        b.mem.to_vec(0, 8).unwrap(),
        vec![7; 8],
        "remote effect happened"
    );
    assert_eq!(b.mem.to_vec(8, 8).unwrap(), vec![0; 8]);

    let f = fabric(19);
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    a.mem.fill(0, 8, 7).unwrap();
    f.faults()
        .fail_send(WrMatch::nth(1), WcStatus::General, false);
    let src = [a.mr.sge(0, 8).unwrap()];
    a.qp.post_send(&[SendWr::write(1, &src, b.mr.remote(0).unwrap())])
        .unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [err(1, WcStatus::General, qa)]);
    assert_eq!(b.mem.to_vec(0, 8).unwrap(), vec![0; 8], "no remote effect");
}

#[test]
fn a_post_refused_part_way_through_a_batch() {
    let f = fabric(30);
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    a.mem.fill(0, 64, 7).unwrap();
    f.faults().fail_post(WrMatch::nth(3).on_qp(qa), EINVAL);
    let src = [a.mr.sge(0, 8).unwrap()];
    let w = |id: u64, at: usize| SendWr::write(id, &src, b.mr.remote(at).unwrap());
    let e =
        a.qp.post_send(&[w(1, 0).signaled(false), w(2, 8), w(3, 16), w(4, 24)])
            .unwrap_err();
    assert_eq!(
        e,
        PostError {
            qpn: qa,
            index: 2,
            kind: PostErrorKind::Native(NativeError::new("ibv_post_send", EINVAL)),
        },
        "the index of the first request not posted"
    );
    assert!(e.to_string().contains("work request 2"), "{e}");
    // The two before it were really posted and run; 3 and 4 were not.
    assert_eq!(f.pending(), 2);
    f.drive();
    assert_eq!(poll_all(&a.cq), [ok(2, WcOpcode::RdmaWrite, 8, qa)]);
    assert_eq!(b.mem.to_vec(0, 16).unwrap(), vec![7; 16]);
    assert_eq!(b.mem.to_vec(16, 48).unwrap(), vec![0; 48]);
    assert_eq!(a.qp.state().unwrap(), QpState::Rts, "the qp is unaffected");
    // The fault fires once.
    a.qp.post_send(&[w(5, 16)]).unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [ok(5, WcOpcode::RdmaWrite, 8, qa)]);
    // ENOMEM is reported as a full queue, like the native provider does.
    f.faults()
        .fail_post(WrMatch::nth(1).on_device("sim0"), ENOMEM);
    let e = a.qp.post_send(&[w(6, 24), w(7, 32)]).unwrap_err();
    assert_eq!(
        (e.index, e.kind),
        (
            0,
            PostErrorKind::QueueFull {
                depth: QpCaps::default().max_send_wr
            }
        )
    );
    assert_eq!(f.pending(), 0, "nothing of that batch was posted");
    // A refused post on a qp moved to error: nothing posted, no flush.
    f.faults().fail_post(WrMatch::nth(2), EINVAL);
    let mut a_err = a.qp.into_error().unwrap();
    let e = a_err.post_send(&[w(8, 0), w(9, 8)]).unwrap_err();
    assert_eq!(e.index, 1);
    assert_eq!(poll_all(&a.cq), [err(8, WcStatus::WrFlush, qa)]);
    assert_eq!(b.mem.to_vec(16, 48).unwrap()[8..], vec![0; 40]);
    // A fault restricted to a ready QP ignores posts to one in error.
    f.faults()
        .fail_post(WrMatch::nth(1).in_state(QpState::Rts), EINVAL);
    a_err.post_send(&[w(10, 0)]).unwrap();
    assert_eq!(poll_all(&a.cq), [err(10, WcStatus::WrFlush, qa)]);
}

#[test]
fn registration_failure_at_the_nth() {
    let f = fabric(20);
    let p = f.provider();
    let c0 = p.open("sim0").unwrap();
    let c1 = p.open("sim1").unwrap();
    let (pd0, pd1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    let mem = HostMemory::alloc(4096).unwrap();
    f.faults()
        .fail_registration(Some("sim1"), 2, ENOMEM)
        .unwrap();
    f.faults().fail_registration(None, 3, EFAULT).unwrap();
    pd0.register(mem.clone(), 0..4096, Access::local_only())
        .unwrap(); // any #1
    pd1.register(mem.clone(), 0..4096, Access::local_only())
        .unwrap(); // sim1 #1, any #2
    let e = pd1
        .register(mem.clone(), 0..4096, Access::local_only())
        .unwrap_err(); // sim1 #2, any #3
    match e {
        orbitte_verbs::RegisterError::Native {
            device,
            len,
            source,
        } => {
            assert_eq!(device.name, "sim1");
            assert_eq!(len, 4096);
            assert_eq!(source, NativeError::new("ibv_reg_mr", ENOMEM));
        }
        other => panic!("unexpected {other:?}"),
    }
    // The EFAULT fault counted that attempt too and fired with it? No: only
    // the first fault that fires wins; EFAULT's counter reached 3 and is
    // spent as well, so the next registration succeeds.
    pd0.register(mem.clone(), 0..4096, Access::local_only())
        .unwrap();
    f.faults().fail_registration(None, 1, EFAULT).unwrap();
    assert!(matches!(
        pd0.register(mem, 0..4096, Access::local_only()),
        Err(orbitte_verbs::RegisterError::Native {
            source: NativeError { errno: EFAULT, .. },
            ..
        })
    ));
}

#[test]
fn device_open_failure_and_denied_uverbs() {
    let mut denied = SimDeviceDesc::roce("sim2", [10, 0, 0, 3]);
    denied.uverbs_access = orbitte_verbs::NodeAccess::Denied { errno: EACCES };
    let f = SimFabric::new(
        SimDescription::new(vec![SimDeviceDesc::roce("sim0", [10, 0, 0, 1]), denied]),
        21,
    );
    let p = f.provider();
    f.faults().fail_open(Some("sim0"), 1, ENOMEM).unwrap();
    match p.open("sim0") {
        Err(orbitte_verbs::OpenError::Native { device, source }) => {
            assert_eq!(device.name, "sim0");
            assert_eq!(source, NativeError::new("ibv_open_device", ENOMEM));
        }
        other => panic!("unexpected {other:?}"),
    }
    p.open("sim0").unwrap();
    let list = p.devices().unwrap();
    assert_eq!(
        list[1].uverbs.as_ref().unwrap().access,
        orbitte_verbs::NodeAccess::Denied { errno: EACCES }
    );
    assert!(matches!(
        p.open("sim2"),
        Err(orbitte_verbs::OpenError::Native {
            source: NativeError { errno: EACCES, .. },
            ..
        })
    ));
}

#[test]
fn destroy_ebusy_gives_unquiesced_and_retains() {
    let f = fabric(22);
    let (a, _b) = pair(&f);
    let Side {
        qp,
        cq,
        mem,
        mr,
        pd,
        ctx,
    } = a;
    let before = orbitte_verbs::retained().len();
    f.faults()
        .fail_destroy("sim0", ObjectKind::MemoryRegion, EBUSY)
        .unwrap();
    let lkey = mr.lkey();
    qp.close().unwrap();
    let e = mr.close().unwrap_err();
    assert_eq!(e.object, ObjectKind::MemoryRegion);
    assert_eq!(e.label, format!("lkey {lkey:#x}"));
    assert_eq!(e.device.name, "sim0");
    assert_eq!(
        e.cause,
        UnquiescedCause::Native(NativeError::new("ibv_dereg_mr", EBUSY))
    );
    assert_eq!(
        e.cleanup.tried,
        [format!("destroy memory region lkey {lkey:#x}")]
    );
    assert!(e.cleanup.retained);
    assert_eq!(e.cleanup.retained_bytes, 4096);
    assert!(e.to_string().contains("unquiesced"));
    // The buffer and the PD stay alive with the retained MR (held by the
    // retention and by the fabric's still-registered region).
    assert_eq!(Arc::strong_count(&mem), 3);
    let retained = orbitte_verbs::retained();
    assert!(retained.len() > before);
    assert!(
        retained
            .iter()
            .any(|r| r.label == format!("lkey {lkey:#x}") && r.bytes == 4096)
    );
    // The PD is still held by the retained MR.
    assert!(matches!(
        pd.close().unwrap_err().cause,
        UnquiescedCause::InUse { holders: 1 }
    ));
    cq.close().unwrap();
    assert!(matches!(
        ctx.close().unwrap_err().cause,
        UnquiescedCause::InUse { .. }
    ));
    assert_eq!(f.counts().mrs, 2);
    assert_eq!(f.counts().pds, 2);

    // A failed destroy on drop is retained too, never a panic.
    let f = fabric(23);
    let (a, _b) = pair(&f);
    f.faults()
        .fail_destroy("sim0", ObjectKind::QueuePair, EBUSY)
        .unwrap();
    let qpn = a.qp.qp_num();
    drop(a);
    assert!(
        orbitte_verbs::retained()
            .iter()
            .any(|r| r.label == format!("qpn {qpn}") && r.object == ObjectKind::QueuePair)
    );
    assert_eq!(f.counts().qps, 2);
    assert_eq!(f.counts().contexts, 2, "parents of a retained qp stay");
}

#[test]
fn unreachable_peers_fail_with_retry_exceeded() {
    // PSN mismatch.
    let f = fabric(24);
    let p = f.provider();
    let a = half(&*p, "sim0");
    let b = half(&*p, "sim1");
    let (ea, eb) = (endpoint(&a, 100), endpoint(&b, 200));
    let mut qa =
        a.qp.connect(InitAttrs::new(1), RtrAttrs::new(eb, 1), RtsAttrs::new(101))
            .unwrap();
    let _qb =
        b.qp.connect(InitAttrs::new(1), RtrAttrs::new(ea, 1), RtsAttrs::new(200))
            .unwrap();
    let src = [a.mr.sge(0, 8).unwrap()];
    qa.post_send(&[SendWr::write(1, &src, b.mr.remote(0).unwrap())])
        .unwrap();
    f.drive();
    assert_eq!(
        poll_all(&a.cq),
        [err(1, WcStatus::RetryExceeded, qa.qp_num())]
    );

    // Different networks.
    let mut d1 = SimDeviceDesc::roce("sim1", [10, 0, 0, 2]);
    d1.ports[0].network = 1;
    let f = SimFabric::new(
        SimDescription::new(vec![SimDeviceDesc::roce("sim0", [10, 0, 0, 1]), d1]),
        25,
    );
    let (mut a, b) = pair(&f);
    let src = [a.mr.sge(0, 8).unwrap()];
    a.qp.post_send(&[SendWr::write(1, &src, b.mr.remote(0).unwrap())])
        .unwrap();
    f.drive();
    assert_eq!(
        poll_all(&a.cq),
        [err(1, WcStatus::RetryExceeded, a.qp.qp_num())]
    );

    // RoCE v1 source GID against a RoCE v2 peer GID.
    let f = fabric(26);
    let p = f.provider();
    let a = half(&*p, "sim0");
    let b = half(&*p, "sim1");
    let (ea, eb) = (endpoint(&a, 1), endpoint(&b, 2));
    let mut qa =
        a.qp.connect(InitAttrs::new(1), RtrAttrs::new(eb, 0), RtsAttrs::new(1))
            .unwrap();
    let _qb =
        b.qp.connect(InitAttrs::new(1), RtrAttrs::new(ea, 1), RtsAttrs::new(2))
            .unwrap();
    let src = [a.mr.sge(0, 8).unwrap()];
    qa.post_send(&[SendWr::write(1, &src, b.mr.remote(0).unwrap())])
        .unwrap();
    f.drive();
    assert_eq!(
        poll_all(&a.cq),
        [err(1, WcStatus::RetryExceeded, qa.qp_num())]
    );
}

#[test]
fn transitions_reject_bad_attributes_and_hand_the_qp_back() {
    let f = fabric(27);
    let p = f.provider();
    let a = half(&*p, "sim0");
    let e = a.qp.init(InitAttrs::new(2)).unwrap_err();
    assert!(matches!(
        e.error,
        orbitte_verbs::ModifyError::InvalidAttr {
            to: QpState::Init,
            ..
        }
    ));
    let qp = e.qp.init(InitAttrs::new(1)).unwrap();
    let mut remote = endpoint(&half(&*p, "sim1"), 0);
    remote.mtu = Mtu::Mtu4096;
    let e = qp.rtr(RtrAttrs::new(remote, 1)).unwrap_err();
    assert!(e.error.to_string().contains("path mtu 4096"));
    remote.mtu = Mtu::Mtu1024;
    let e = e.qp.rtr(RtrAttrs::new(remote, 5)).unwrap_err();
    assert!(e.error.to_string().contains("gid index 5"));
    remote.route = Route::Lid(3);
    let e = e.qp.rtr(RtrAttrs::new(remote, 1)).unwrap_err();
    assert!(e.error.to_string().contains("gid route"));
    assert_eq!(e.qp.state().unwrap(), QpState::Init);
}

#[test]
fn infiniband_lid_routing() {
    let f = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::infiniband("ib0", 1),
            SimDeviceDesc::infiniband("ib1", 2),
        ]),
        28,
    );
    let p = f.provider();
    let a = half(&*p, "ib0");
    let b = half(&*p, "ib1");
    let ea = a.qp.endpoint(Route::Lid(1), 10, Mtu::Mtu4096);
    let eb = b.qp.endpoint(Route::Lid(2), 20, Mtu::Mtu4096);
    let mut qa =
        a.qp.connect(InitAttrs::new(1), RtrAttrs::new(eb, 0), RtsAttrs::new(10))
            .unwrap();
    let _qb =
        b.qp.connect(InitAttrs::new(1), RtrAttrs::new(ea, 0), RtsAttrs::new(20))
            .unwrap();
    a.mem.write_at(0, b"ib").unwrap();
    let src = [a.mr.sge(0, 2).unwrap()];
    qa.post_send(&[SendWr::write(1, &src, b.mr.remote(0).unwrap())])
        .unwrap();
    f.drive();
    assert_eq!(
        poll_all(&a.cq),
        [ok(1, WcOpcode::RdmaWrite, 2, qa.qp_num())]
    );
    assert_eq!(b.mem.to_vec(0, 2).unwrap(), b"ib");
    assert_eq!(
        a.ctx.query_gid(1, 0).unwrap().gid_type,
        Some(orbitte_verbs::GidType::Ib)
    );
}

#[test]
fn order_per_qp_and_virtual_time() {
    let f = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("sim0", [10, 0, 0, 1]),
            SimDeviceDesc::roce("sim1", [10, 0, 0, 2]),
        ])
        .with_timing(orbitte_verbs::sim::SimTiming {
            base_latency: Duration::from_micros(10),
            bytes_per_sec: 1_000_000_000,
            jitter: Duration::from_micros(5),
        }),
        29,
    );
    let (mut a, b) = pair(&f);
    let big = [a.mr.sge(0, 4000).unwrap()];
    let small = [a.mr.sge(0, 1).unwrap()];
    let r = b.mr.remote(0).unwrap();
    // A big write then a small one: the small one may not overtake.
    a.qp.post_send(&[SendWr::write(1, &big, r), SendWr::write(2, &small, r)])
        .unwrap();
    assert_eq!(f.advance(Duration::from_micros(1)), 0);
    assert!(poll_all(&a.cq).is_empty());
    f.drive();
    let ids: Vec<u64> = poll_all(&a.cq).iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [1, 2]);
    // 4000 bytes at 1 GB/s = 4 us, plus 10 us base, plus <= 5 us jitter.
    assert!(f.now() >= Duration::from_micros(15) && f.now() <= Duration::from_micros(40));
}

#[test]
fn same_seed_same_run() {
    fn run(seed: u64) -> (Vec<u32>, Vec<Completion>) {
        let f = fabric(seed);
        let (mut a, b) = pair(&f);
        let src = [a.mr.sge(0, 8).unwrap()];
        a.qp.post_send(&[SendWr::write(1, &src, b.mr.remote(0).unwrap())])
            .unwrap();
        f.drive();
        (
            vec![a.qp.qp_num(), b.qp.qp_num(), a.mr.lkey(), b.mr.rkey()],
            poll_all(&a.cq),
        )
    }
    assert_eq!(run(5), run(5));
    assert_ne!(run(5).0, run(6).0);
}

#[test]
fn background_delivery_wakes_waiters() {
    let f = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("sim0", [10, 0, 0, 1]),
            SimDeviceDesc::roce("sim1", [10, 0, 0, 2]),
        ])
        .with_delivery(Delivery::Background),
        30,
    );
    let (mut a, b) = pair(&f);
    let qa = a.qp.qp_num();
    a.mem.write_at(0, b"async").unwrap();
    let src = [a.mr.sge(0, 5).unwrap()];
    let cq = a.cq.clone();
    let waiter = std::thread::spawn(move || {
        let mut got = Vec::new();
        while got.len() < 2 {
            if cq.wait(Duration::from_secs(30)).unwrap() {
                got.extend(poll_all(&cq));
            } else {
                break;
            }
        }
        got
    });
    a.qp.post_send(&[
        SendWr::write(1, &src, b.mr.remote(0).unwrap()),
        SendWr::write(2, &src, b.mr.remote(5).unwrap()),
    ])
    .unwrap();
    let got = waiter.join().unwrap();
    assert_eq!(
        got,
        [
            ok(1, WcOpcode::RdmaWrite, 5, qa),
            ok(2, WcOpcode::RdmaWrite, 5, qa)
        ]
    );
    assert_eq!(b.mem.to_vec(0, 10).unwrap(), b"asyncasync");
}

#[test]
fn cq_overrun_raises_cq_error() {
    let f = fabric(31);
    let p = f.provider();
    let a = half(&*p, "sim0");
    let b = half(&*p, "sim1");
    let small_cq = a.ctx.create_cq(2).unwrap();
    let qp =
        a.pd.create_qp(&small_cq, &small_cq, QpCaps::default())
            .unwrap();
    let gid = a.ctx.query_gid(1, 1).unwrap().gid;
    let e_self = qp.endpoint(Route::Gid(gid), 1, Mtu::Mtu1024);
    let eb = endpoint(&b, 2);
    let mut qp = qp
        .connect(InitAttrs::new(1), RtrAttrs::new(eb, 1), RtsAttrs::new(1))
        .unwrap();
    let _qb =
        b.qp.connect(
            InitAttrs::new(1),
            RtrAttrs::new(e_self, 1),
            RtsAttrs::new(2),
        )
        .unwrap();
    let src = [a.mr.sge(0, 1).unwrap()];
    let r = b.mr.remote(0).unwrap();
    qp.post_send(&[
        SendWr::write(1, &src, r),
        SendWr::write(2, &src, r),
        SendWr::write(3, &src, r),
    ])
    .unwrap();
    f.drive();
    assert_eq!(
        a.ctx.next_async_event(Duration::ZERO).unwrap(),
        Some(AsyncEvent::CqError)
    );
    assert_eq!(poll_all_lossy(&small_cq), 2);
    assert!(small_cq.poll(&mut [Completion::default()]).is_err());
    assert!(matches!(
        a.ctx.create_cq(0),
        Err(orbitte_verbs::CreateCqError::InvalidDepth { depth: 0, .. })
    ));
}

fn poll_all_lossy(cq: &CompletionQueue) -> usize {
    let mut out = [Completion::default(); 8];
    cq.poll(&mut out).unwrap_or(0)
}

#[test]
fn foreign_cq_is_refused() {
    let f = fabric(32);
    let p = f.provider();
    let a = half(&*p, "sim0");
    let b = half(&*p, "sim1");
    assert!(matches!(
        a.pd.create_qp(&b.cq, &a.cq, QpCaps::default()),
        Err(orbitte_verbs::CreateQpError::ForeignCq { .. })
    ));
    assert!(matches!(
        a.pd.create_qp(
            &a.cq,
            &a.cq,
            QpCaps {
                max_send_sge: 99,
                ..QpCaps::default()
            }
        ),
        Err(orbitte_verbs::CreateQpError::InvalidCaps { .. })
    ));
}

#[test]
fn concurrent_posters_keep_order_per_qp_with_background_delivery() {
    let f = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("sim0", [10, 0, 0, 1]),
            SimDeviceDesc::roce("sim1", [10, 0, 0, 2]),
        ])
        .with_delivery(Delivery::Background)
        .with_timing(orbitte_verbs::sim::SimTiming {
            base_latency: Duration::from_micros(1),
            bytes_per_sec: 0,
            jitter: Duration::from_micros(50),
        }),
        33,
    );
    const PER_QP: u64 = 200;
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (mut a, b) = pair(&f);
            std::thread::spawn(move || {
                let src = [a.mr.sge(0, 8).unwrap()];
                let r = b.mr.remote(8 * t).unwrap();
                let mut got = Vec::new();
                let mut next = 0;
                while got.len() < PER_QP as usize {
                    // Post in small batches, then reap what has arrived.
                    if next < PER_QP {
                        let wrs: Vec<SendWr<'_>> = (next..(next + 10).min(PER_QP))
                            .map(|i| SendWr::write(i, &src, r))
                            .collect();
                        a.qp.post_send(&wrs).unwrap();
                        next += wrs.len() as u64;
                    }
                    if a.cq.wait(Duration::from_secs(30)).unwrap() {
                        got.extend(poll_all(&a.cq).into_iter().map(|c| (c.wr_id, c.status)));
                    } else {
                        break;
                    }
                }
                (got, b)
            })
        })
        .collect();
    for t in threads {
        let (got, _b) = t.join().unwrap();
        let want: Vec<(u64, WcStatus)> = (0..PER_QP).map(|i| (i, WcStatus::Success)).collect();
        assert_eq!(got, want);
    }
}

#[test]
fn qp_access_flags_and_stale_keys_are_enforced() {
    // The responder QP accepts remote reads only.
    let f = fabric(34);
    let p = f.provider();
    let a = half(&*p, "sim0");
    let b = half(&*p, "sim1");
    let (ea, eb) = (endpoint(&a, 1), endpoint(&b, 2));
    let mut qa =
        a.qp.connect(InitAttrs::new(1), RtrAttrs::new(eb, 1), RtsAttrs::new(1))
            .unwrap();
    let read_only = InitAttrs {
        access: Access::REMOTE_READ,
        ..InitAttrs::new(1)
    };
    let _qb =
        b.qp.connect(read_only, RtrAttrs::new(ea, 1), RtsAttrs::new(2))
            .unwrap();
    let qpn = qa.qp_num();
    b.mem.write_at(0, b"readable").unwrap();
    let dst = [a.mr.sge(0, 8).unwrap()];
    qa.post_send(&[SendWr::read(1, &dst, b.mr.remote(0).unwrap())])
        .unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [ok(1, WcOpcode::RdmaRead, 8, qpn)]);
    assert_eq!(a.mem.to_vec(0, 8).unwrap(), b"readable");
    qa.post_send(&[SendWr::write(2, &dst, b.mr.remote(100).unwrap())])
        .unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [err(2, WcStatus::RemoteAccess, qpn)]);
    assert_eq!(b.mem.to_vec(100, 8).unwrap(), vec![0; 8]);

    // A region registered for remote reads only refuses writes.
    let f = fabric(35);
    let (mut a, b) = pair(&f);
    let qpn = a.qp.qp_num();
    let mem = HostMemory::alloc(4096).unwrap();
    let mr =
        b.pd.register(
            mem.clone(),
            0..4096,
            Access::LOCAL_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let src = [a.mr.sge(0, 8).unwrap()];
    a.qp.post_send(&[
        SendWr::read(1, &src, mr.remote(0).unwrap()),
        SendWr::write(2, &src, mr.remote(0).unwrap()),
    ])
    .unwrap();
    f.drive();
    assert_eq!(
        poll_all(&a.cq),
        [
            ok(1, WcOpcode::RdmaRead, 8, qpn),
            err(2, WcStatus::RemoteAccess, qpn)
        ]
    );

    // Keys of a closed region are stale: remote use is an access error,
    // local use a protection error.
    let f = fabric(36);
    let (mut a, b) = pair(&f);
    let qpn = a.qp.qp_num();
    let mem = HostMemory::alloc(4096).unwrap();
    let mr =
        b.pd.register(mem.clone(), 0..4096, Access::remote_read_write())
            .unwrap();
    let stale = mr.remote(0).unwrap();
    mr.close().unwrap();
    let src = [a.mr.sge(0, 8).unwrap()];
    a.qp.post_send(&[SendWr::write(1, &src, stale)]).unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [err(1, WcStatus::RemoteAccess, qpn)]);
    assert_eq!(mem.to_vec(0, 8).unwrap(), vec![0; 8]);

    let f = fabric(37);
    let (mut a, b) = pair(&f);
    let qpn = a.qp.qp_num();
    let local =
        a.pd.register(a.mem.clone(), 0..4096, Access::local_only())
            .unwrap();
    let stale = [local.sge(0, 8).unwrap()];
    local.close().unwrap();
    a.qp.post_send(&[SendWr::write(1, &stale, b.mr.remote(0).unwrap())])
        .unwrap();
    f.drive();
    assert_eq!(poll_all(&a.cq), [err(1, WcStatus::LocalProtection, qpn)]);
}

#[test]
fn huge_timeouts_do_not_overflow() {
    let f = fabric(38);
    let (mut a, b) = pair(&f);
    let src = [a.mr.sge(0, 8).unwrap()];
    a.qp.post_send(&[SendWr::write(1, &src, b.mr.remote(0).unwrap())])
        .unwrap();
    f.drive();
    assert!(a.cq.wait(Duration::MAX).unwrap());
    f.faults().port_down("sim0", 1).unwrap();
    assert_eq!(
        a.ctx.next_async_event(Duration::MAX).unwrap(),
        Some(AsyncEvent::PortError { port: 1 })
    );
}

/// A fabric whose thread delivers in real time with no jitter: posts to a
/// QP in RTS skip the fabric lock. `latency` holds what is posted in the
/// send queues for that long.
fn lock_free_fabric(seed: u64, latency: Duration) -> SimFabric {
    SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("sim0", [10, 0, 0, 1]),
            SimDeviceDesc::roce("sim1", [10, 0, 0, 2]),
        ])
        .with_delivery(Delivery::Background)
        .with_timing(orbitte_verbs::sim::SimTiming {
            base_latency: latency,
            bytes_per_sec: 0,
            jitter: Duration::ZERO,
        }),
        seed,
    )
}

/// A connected pair whose first side has a send queue of 48 (and, as
/// every side, a completion queue of 64).
fn pair_of_48(f: &SimFabric) -> (Side, Side) {
    let p = f.provider();
    let caps = QpCaps {
        max_send_wr: 48,
        ..QpCaps::default()
    };
    let (a, b) = (half_with(&*p, "sim0", caps), half(&*p, "sim1"));
    let (ea, eb) = (endpoint(&a, 100), endpoint(&b, 200));
    let a = finish(a, eb, 100, RtsAttrs::new(100));
    let b = finish(b, ea, 200, RtsAttrs::new(200));
    (a, b)
}

#[test]
fn posts_without_the_fabric_lock_are_seen_at_once_bounded_and_flushed_in_order() {
    let f = lock_free_fabric(35, Duration::from_secs(3600));
    let (mut a, b) = pair_of_48(&f);
    let qa = a.qp.qp_num();
    let src = [a.mr.sge(0, 8).unwrap()];
    let r = b.mr.remote(0).unwrap();
    // The 49th of a batch is refused by index, the ones before it are
    // posted.
    let wrs: Vec<SendWr<'_>> = (0..60).map(|i| SendWr::write(i, &src, r)).collect();
    let e = a.qp.post_send(&wrs).unwrap_err();
    assert_eq!(e.index, 48);
    assert!(matches!(e.kind, PostErrorKind::QueueFull { depth: 48 }));
    // Every accepted post is in the fabric's send queue when `post_send`
    // returns, in posting order.
    let held: Vec<u64> = f.outstanding_sends().iter().map(|s| s.wr_id).collect();
    assert_eq!(held, (0..48).collect::<Vec<_>>());
    assert!(a.cq.poll(&mut [Completion::default()]).unwrap() == 0);
    // Moving the QP to the error state flushes them all, in order (the
    // queue of 64 completions is polled as they come).
    let mut qp = a.qp.into_error().unwrap();
    let mut got = Vec::new();
    while got.len() < 48 {
        assert!(a.cq.wait(Duration::from_secs(30)).unwrap());
        got.extend(poll_all(&a.cq));
    }
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..48).collect::<Vec<_>>());
    assert!(
        got.iter()
            .all(|c| c.status == WcStatus::WrFlush && c.qp_num == qa)
    );
    // A later post takes the locked path of a QP in error: flushed too.
    qp.post_send(&[SendWr::write(999, &src, r)]).unwrap();
    assert!(a.cq.wait(Duration::from_secs(30)).unwrap());
    let last = poll_all(&a.cq);
    assert_eq!(last.len(), 1);
    assert_eq!((last[0].wr_id, last[0].status), (999, WcStatus::WrFlush));
    assert!(f.outstanding_sends().is_empty());
}

#[test]
fn posts_without_the_fabric_lock_run_in_order_and_refill_freed_slots() {
    let f = lock_free_fabric(36, Duration::ZERO);
    const PER_QP: u64 = 2000;
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            // Batches of up to 20 stop at a full queue and go on once
            // slots are polled.
            let (mut a, b) = pair_of_48(&f);
            std::thread::spawn(move || {
                let r = b.mr.remote(8 * t as usize).unwrap();
                let mut got = Vec::new();
                let mut next = 0;
                let mut full = 0;
                while got.len() < PER_QP as usize {
                    if next < PER_QP {
                        let wrs: Vec<(u64, Sge)> = (next..(next + 20).min(PER_QP))
                            .map(|i| {
                                let at = (i % 512 * 8) as usize;
                                a.mem.write_at(at, &i.to_le_bytes()).unwrap();
                                (i, a.mr.sge(at, 8).unwrap())
                            })
                            .collect();
                        let sges: Vec<[Sge; 1]> = wrs.iter().map(|(_, s)| [*s]).collect();
                        let wrs: Vec<SendWr<'_>> = wrs
                            .iter()
                            .zip(&sges)
                            .map(|((i, _), s)| SendWr::write(*i, s, r))
                            .collect();
                        match a.qp.post_send(&wrs) {
                            Ok(()) => next += wrs.len() as u64,
                            Err(PostError {
                                index,
                                kind: PostErrorKind::QueueFull { depth: 48 },
                                ..
                            }) => {
                                next += index as u64;
                                full += 1;
                            }
                            Err(e) => panic!("post: {e}"),
                        }
                    }
                    if a.cq.wait(Duration::from_secs(30)).unwrap() {
                        got.extend(poll_all(&a.cq).into_iter().map(|c| (c.wr_id, c.status)));
                    } else {
                        break;
                    }
                }
                (got, b, full)
            })
        })
        .collect();
    for (t, h) in threads.into_iter().enumerate() {
        let (got, b, full) = h.join().unwrap();
        assert!(
            full > 0,
            "no post met a full queue: the test does not test that"
        );
        let want: Vec<(u64, WcStatus)> = (0..PER_QP).map(|i| (i, WcStatus::Success)).collect();
        assert_eq!(got, want);
        // The last WRITE to the thread's 8 bytes carried the last id.
        let mut last = [0u8; 8];
        b.mem.read_at(8 * t, &mut last).unwrap();
        assert_eq!(u64::from_le_bytes(last), PER_QP - 1);
    }
}
