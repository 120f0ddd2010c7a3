//! The tcp and local targets serve a `TransferEngine`'s own registrations
//! (`TransferEngine::range_lookup`): exactly the published, remotely
//! accessible, not retired ranges, with the tokens of its descriptors.
#![forbid(unsafe_code)]

mod net_support;

use std::time::Duration;

use net_support::{Initiator, cfg, pattern, request};
use orbitte_engine::outcome::Status;
use orbitte_engine::transport::{Op, PathKind, PeerId, SliceFailure};
use orbitte_engine::{Access, EngineBuilder};
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;
use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric};

const BOUND: Duration = Duration::from_secs(30);

fn failed_with(o: &orbitte_engine::outcome::Outcome, needle: &str) -> bool {
    matches!(&o.failure.as_ref().map(|f| &f.status), Some(SliceFailure::Completion { status, .. }) if status.contains(needle))
}

#[test]
fn engine_registrations_are_served_over_tcp_and_local_and_retire_stops_new_requests() {
    net_support::logs();
    let fabric = SimFabric::new(
        SimDescription::new(vec![SimDeviceDesc::roce("e0", [10, 9, 0, 1])])
            .with_delivery(Delivery::Background),
        1,
    );
    let engine = EngineBuilder::new("engine-target")
        .provider(fabric.provider_for(&["e0"]))
        .build()
        .unwrap();
    let rw = HostMemory::alloc(1 << 20).unwrap();
    pattern(&rw, 4);
    let local_only = HostMemory::alloc(1 << 16).unwrap();
    let reg = engine
        .register_host(rw.clone(), Access::RemoteReadWrite)
        .unwrap();
    let hidden = engine
        .register_host(local_only.clone(), Access::LocalOnly)
        .unwrap();

    let mut scfg = engine.session_config();
    scfg.io_timeout = Duration::from_secs(5);
    let listener = engine
        .serve_tcp(scfg, "127.0.0.1:0".parse().unwrap())
        .unwrap();

    let i = Initiator::new(cfg("client", 1), CoreConfig::default());
    let (rails, link) = i.connect_tcp(PeerId(1), listener.local_addr(), 2).unwrap();
    let ids: Vec<u64> = link.ranges.iter().map(|r| r.range_id.0).collect();
    assert_eq!(
        ids,
        vec![reg.id.0],
        "a local-only registration is never published"
    );
    let published = engine.segment_publication();
    assert_eq!(
        link.ranges[0].token, published.ranges[0].token,
        "same token as the engine's descriptor"
    );

    let src = HostMemory::alloc(1 << 20).unwrap();
    pattern(&src, 5);
    let dst = HostMemory::alloc(1 << 20).unwrap();
    let (sreg, dreg) = (
        i.driver.register(src.clone()),
        i.driver.register(dst.clone()),
    );
    let w = i.driver.submit(vec![request(
        1,
        Op::Write,
        sreg,
        0,
        PeerId(1),
        reg.id.0,
        0,
        1 << 19,
        &rails,
    )])[0];
    assert_eq!(i.driver.wait(w, BOUND).status, Status::Complete);
    assert_eq!(
        rw.to_vec(0, 1 << 19).unwrap(),
        src.to_vec(0, 1 << 19).unwrap()
    );

    // Same host: the engine's memfd-backed range is also reachable locally.
    let lrails = i.driver.add_rails(PathKind::Local, PeerId(1), 1, 64);
    let attach = i
        .local
        .attach(&i.cfg, &i.peers, PeerId(1), &link.handshake.peer, &lrails)
        .unwrap();
    assert_eq!(
        attach.writable.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![reg.id.0]
    );
    let r = i.driver.submit(vec![request(
        2,
        Op::Read,
        dreg,
        0,
        PeerId(1),
        reg.id.0,
        0,
        1 << 20,
        &lrails,
    )])[0];
    assert_eq!(i.driver.wait(r, BOUND).status, Status::Complete);
    assert_eq!(
        dst.to_vec(0, 1 << 20).unwrap(),
        rw.to_vec(0, 1 << 20).unwrap()
    );

    // A local-only registration cannot be reached even with its id.
    let r = i.driver.submit(vec![request(
        3,
        Op::Read,
        dreg,
        0,
        PeerId(1),
        hidden.id.0,
        0,
        4096,
        &rails,
    )])[0];
    assert!(failed_with(&i.driver.wait(r, BOUND), "unknown-range"));

    // Retired: new tcp requests are refused.
    engine.retire(reg.id).unwrap();
    let r = i.driver.submit(vec![request(
        4,
        Op::Read,
        dreg,
        0,
        PeerId(1),
        reg.id.0,
        0,
        4096,
        &rails,
    )])[0];
    let o = i.driver.wait(r, BOUND);
    assert!(failed_with(&o, "unknown-range"), "{o:?}");
    drop(listener);
    let _ = engine.shutdown(Duration::from_secs(5));
}

#[test]
fn engines_open_rdma_peers_over_a_tcp_control_link() {
    use orbitte_engine::session::TcpControlLink;
    net_support::logs();
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("a0", [10, 1, 0, 1]),
            SimDeviceDesc::roce("b0", [10, 2, 0, 1]),
        ])
        .with_delivery(Delivery::Background),
        2,
    );
    let a = EngineBuilder::new("engine-a")
        .provider(fabric.provider_for(&["a0"]))
        .build()
        .unwrap();
    let b = EngineBuilder::new("engine-b")
        .provider(fabric.provider_for(&["b0"]))
        .build()
        .unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (pa, pb) = std::thread::scope(|s| {
        let hb = s.spawn(|| {
            let mut link = TcpControlLink::accept(&l, Duration::from_secs(5)).unwrap();
            b.accept_peer(&mut link)
        });
        let mut link = TcpControlLink::connect(addr, Duration::from_secs(5)).unwrap();
        let pa = a.open_peer(&mut link);
        (pa, hb.join().unwrap())
    });
    let (pa, pb) = (
        pa.expect("open_peer over tcp"),
        pb.expect("accept_peer over tcp"),
    );
    assert_eq!(pa.source_id, "engine-b");
    assert_eq!(pb.source_id, "engine-a");
    assert!(!pa.rails.is_empty());
    let _ = a.shutdown(Duration::from_secs(5));
    let _ = b.shutdown(Duration::from_secs(5));
}

#[test]
fn transfer_engines_run_requests_over_tcp_and_local_with_the_engine_contract() {
    use orbitte_engine::{
        ConnectError, ConnectOptions, DrainStatus, RemoteEffect, TransferRequest,
    };
    net_support::logs();
    let (target, client) = net_support::engines_without_rdma("net-target", "net-client", |b| b);
    let remote = HostMemory::alloc(4 << 20).unwrap();
    pattern(&remote, 6);
    let range = target.register(&remote, Access::RemoteReadWrite).unwrap();
    assert_eq!(range.path, orbitte_engine::MemoryPath::HostWithoutRdma);
    assert_eq!(range.copies, 0, "no MR for host memory kept off rdma");
    let addr = target.listen_addr().expect("the engine listens");
    let stats = || target.listener_stats().unwrap();

    let range_id = orbitte_engine::RangeId(range.id.0);
    let src = HostMemory::alloc(4 << 20).unwrap();
    pattern(&src, 7);
    let dst = HostMemory::alloc(4 << 20).unwrap();
    let s = client.register(&src, Access::LocalOnly).unwrap();
    let d = client.register(&dst, Access::LocalOnly).unwrap();

    // Only rdma to a target without Host Direct ranges is refused, naming
    // every path and why.
    match client.connect_with(addr, ConnectOptions::new().path(PathKind::Rdma).rails(1)) {
        Err(ConnectError::NoPath(e)) => {
            let text = e.to_string();
            assert!(
                text.contains("rdma: the peer publishes no range with rkeys"),
                "{text}"
            );
            assert!(
                text.contains("tcp: rdma was asked for explicitly"),
                "{text}"
            );
        }
        other => panic!("expected NoPath, got {other:?}"),
    }
    // Paths without a transport here are refused as such.
    assert!(matches!(
        client.connect_with(addr, ConnectOptions::new().path(PathKind::Nvlink)),
        Err(ConnectError::Unsupported(PathKind::Nvlink))
    ));

    // tcp, explicitly (same host, but asked for): 3 connections.
    let peer = client
        .connect_with(addr, ConnectOptions::new().path(PathKind::Tcp).rails(3))
        .unwrap();
    assert_eq!(
        (peer.path, peer.rails.len(), peer.fell_back.len()),
        (PathKind::Tcp, 3, 0)
    );
    let before = stats().data_requests;
    let ids = client
        .submit(&[TransferRequest::write(s.id, 0, peer.info.id, range_id, 0, 2 << 20).label(1)])
        .unwrap();
    let o = client.wait(ids[0], BOUND).unwrap();
    assert_eq!(
        (o.status, o.remote_effect.clone()),
        (Status::Complete, RemoteEffect::Complete),
        "{o:?}"
    );
    assert_eq!(
        remote.to_vec(0, 2 << 20).unwrap(),
        src.to_vec(0, 2 << 20).unwrap()
    );
    assert!(stats().data_requests > before, "bytes went over tcp");
    // Out of range: refused at submit time by the engine, nothing posted.
    let err = client
        .submit(&[TransferRequest::read(
            d.id,
            0,
            peer.info.id,
            range_id,
            4 << 20,
            1,
        )])
        .unwrap_err();
    assert!(
        matches!(
            &err,
            orbitte_engine::SubmitError::Invalid {
                error: orbitte_engine::RequestError::OutOfRange { side: "remote", .. },
                ..
            }
        ),
        "{err:?}"
    );

    // Auto on the same host: the local path (a reconnect of the same epoch).
    let local = client.connect(addr).unwrap();
    assert_eq!(local.path, PathKind::Local, "{local:?}");
    let before = stats();
    let ids = client
        .submit(&[TransferRequest::read(
            d.id,
            0,
            local.info.id,
            range_id,
            0,
            4 << 20,
        )])
        .unwrap();
    let o = client.wait(ids[0], BOUND).unwrap();
    assert_eq!(o.status, Status::Complete, "{o:?}");
    assert_eq!(client.drain_status(ids[0]), DrainStatus::Drained);
    assert!(dst.to_vec(0, 4 << 20).unwrap() == remote.to_vec(0, 4 << 20).unwrap());
    let after = stats();
    assert_eq!(
        after.data_bytes, before.data_bytes,
        "no byte crossed the socket on the local path"
    );
    let _ = client.shutdown(Duration::from_secs(5));
    let _ = target.shutdown(Duration::from_secs(5));
}

/// Two engines with sim rails, as on two hosts: the target publishes a Host
/// Direct range, serves sessions on loopback and (optionally) rdma control
/// links; the initiator's session config names another host, so the local
/// path does not apply.
struct RdmaPair {
    fabric: SimFabric,
    target: orbitte_engine::TransferEngine,
    client: orbitte_engine::TransferEngine,
    remote: std::sync::Arc<HostMemory>,
    range: orbitte_engine::RangeId,
    addr: std::net::SocketAddr,
    src: std::sync::Arc<HostMemory>,
    src_reg: orbitte_engine::RegistrationId,
}

fn rdma_pair(seed: u64) -> RdmaPair {
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("a0", [10, 1, 0, 1]),
            SimDeviceDesc::roce("b0", [10, 2, 0, 1]),
        ])
        .with_delivery(Delivery::Background),
        seed,
    );
    let target = EngineBuilder::new("auto-target")
        .provider(fabric.provider_for(&["a0"]))
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    let client = EngineBuilder::new("auto-client")
        .provider(fabric.provider_for(&["b0"]))
        .session_settings(|cfg| {
            cfg.host_id = orbitte_wire::HostId::new("another-host").unwrap();
        })
        .build()
        .unwrap();
    let remote = HostMemory::alloc(1 << 20).unwrap();
    pattern(&remote, 11);
    let reg = target.register(&remote, Access::REMOTE_READ_WRITE).unwrap();
    assert_eq!(reg.path, orbitte_engine::MemoryPath::HostDirect);
    let src = HostMemory::alloc(1 << 20).unwrap();
    pattern(&src, 12);
    let src_reg = client.register(&src, Access::LocalOnly).unwrap();
    RdmaPair {
        fabric,
        addr: target.listen_addr().unwrap(),
        target,
        client,
        remote,
        range: orbitte_engine::RangeId(reg.id.0),
        src,
        src_reg: src_reg.id,
    }
}

impl RdmaPair {
    fn stats(&self) -> orbitte_engine::session::ListenerStats {
        self.target.listener_stats().expect("the target listens")
    }
}

impl Drop for RdmaPair {
    fn drop(&mut self) {
        let _ = self.client.shutdown(Duration::from_secs(5));
        let _ = self.target.shutdown(Duration::from_secs(5));
    }
}

#[test]
fn auto_picks_rdma_when_both_engines_have_rails_over_the_one_listener() {
    use orbitte_engine::{ConnectOptions, TransferRequest};
    use orbitte_verbs::WcStatus;
    use orbitte_verbs::sim::WrMatch;
    net_support::logs();
    let p = rdma_pair(21);
    // One address: the data session and the rdma control link (a session
    // opened for that purpose) both go to the target's own listener.
    let peer = p.client.connect(p.addr).expect("auto over rdma");
    assert_eq!(peer.path, PathKind::Rdma, "{peer:?}");
    assert!(peer.fell_back.is_empty(), "{peer:?}");
    assert!(!peer.rails.is_empty());
    for r in &peer.rails {
        let info = peer.info.rails.iter().find(|i| i.rail == *r).unwrap();
        assert!(info.nic.is_some() && info.qpn.is_some(), "{info:?}");
    }
    let accepted = p.target.peers();
    assert_eq!(accepted.len(), 1, "the target accepted the rdma peer");
    assert_eq!(accepted[0].source_id, "auto-client");
    assert!(accepted[0].rails.iter().all(|r| r.nic.is_some()));
    let before = p.stats();
    let ids = p
        .client
        .submit(&[TransferRequest::write(
            p.src_reg,
            0,
            peer.info.id,
            p.range,
            0,
            256 << 10,
        )])
        .unwrap();
    let o = p.client.wait(ids[0], BOUND).unwrap();
    assert_eq!(o.status, Status::Complete, "{o:?}");
    assert_eq!(
        p.remote.to_vec(0, 256 << 10).unwrap(),
        p.src.to_vec(0, 256 << 10).unwrap()
    );
    assert_eq!(
        p.stats().data_requests,
        before.data_requests,
        "no byte went over tcp"
    );
    // A failing work request names the rdma path and the rail's NIC.
    p.fabric.faults().fail_send(
        WrMatch::nth(1).on_device("b0"),
        WcStatus::RemoteAccess,
        false,
    );
    let ids = p
        .client
        .submit(&[TransferRequest::write(
            p.src_reg,
            0,
            peer.info.id,
            p.range,
            0,
            64 << 10,
        )])
        .unwrap();
    let o = p.client.wait(ids[0], BOUND).unwrap();
    let f = o.failure.clone().expect("the injected failure");
    assert_eq!(f.path, PathKind::Rdma, "{f:?}");
    assert!(
        f.rail.is_some_and(|r| peer.rails.contains(&r)),
        "{f:?} {peer:?}"
    );
    assert!(f.nic.is_some(), "{f:?}");

    // One path per peer: asking for tcp closes the rdma rails...
    let tcp = p
        .client
        .connect_with(p.addr, ConnectOptions::new().path(PathKind::Tcp))
        .unwrap();
    assert_eq!((tcp.path, tcp.fell_back.len()), (PathKind::Tcp, 0));
    assert!(
        tcp.info.rails.iter().all(|r| r.nic.is_none()),
        "rdma rails closed: {tcp:?}"
    );
    let before = p.stats().data_requests;
    let ids = p
        .client
        .submit(&[TransferRequest::read(
            p.src_reg,
            0,
            tcp.info.id,
            p.range,
            0,
            64 << 10,
        )])
        .unwrap();
    let o = p.client.wait(ids[0], BOUND).unwrap();
    assert_eq!(o.status, Status::Complete, "{o:?}");
    assert!(p.stats().data_requests > before, "over tcp");
    // ... and asking for rdma closes the tcp rails.
    let again = p
        .client
        .connect_with(p.addr, ConnectOptions::new().path(PathKind::Rdma).rails(1))
        .expect("only rdma");
    assert_eq!(again.path, PathKind::Rdma);
    let before = p.stats().data_requests;
    let ids = p
        .client
        .submit(&[TransferRequest::write(
            p.src_reg,
            0,
            again.info.id,
            p.range,
            0,
            64 << 10,
        )])
        .unwrap();
    let o = p.client.wait(ids[0], BOUND).unwrap();
    assert_eq!(o.status, Status::Complete, "{o:?}");
    assert_eq!(p.stats().data_requests, before, "not over tcp");
}

#[test]
fn auto_falls_back_to_tcp_and_says_so_when_the_listener_serves_no_rdma_control_link() {
    use orbitte_engine::{ConnectError, ConnectOptions, TransferRequest};
    net_support::logs();
    let p = rdma_pair(22);
    // A second listener of the target that serves data sessions only
    // (as a target built without rdma control would): an rdma control
    // session is refused there.
    let data_only = p
        .target
        .serve_tcp(p.target.session_config(), "127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = data_only.local_addr();
    let moved_over_tcp = |peer: &orbitte_engine::Peer| {
        let before = data_only.stats().data_requests;
        let ids = p
            .client
            .submit(&[TransferRequest::write(
                p.src_reg,
                0,
                peer.info.id,
                p.range,
                0,
                64 << 10,
            )])
            .unwrap();
        let o = p.client.wait(ids[0], BOUND).unwrap();
        assert_eq!(o.status, Status::Complete, "{o:?}");
        assert!(
            data_only.stats().data_requests > before,
            "bytes went over tcp"
        );
    };

    // rdma applies (both sides have rails), so taking tcp is a reported
    // fallback naming the refusal.
    let peer = p.client.connect(addr).unwrap();
    assert_eq!(peer.path, PathKind::Tcp);
    assert_eq!(peer.fell_back.len(), 1, "{peer:?}");
    assert_eq!(peer.fell_back[0].0, PathKind::Rdma);
    assert!(
        peer.fell_back[0].1.contains("serves no rdma control links"),
        "{peer:?}"
    );
    moved_over_tcp(&peer);

    // Only rdma does not fall back: the error names every path.
    match p
        .client
        .connect_with(addr, ConnectOptions::new().path(PathKind::Rdma).rails(1))
    {
        Err(ConnectError::NoPath(e)) => {
            assert!(
                e.to_string().contains("serves no rdma control links"),
                "{e}"
            )
        }
        other => panic!("expected NoPath, got {other:?}"),
    }
    assert!(
        data_only
            .closed_sessions()
            .iter()
            .any(|c| c.reason.contains("serves no rdma control links")),
        "the refusal is recorded"
    );
}
