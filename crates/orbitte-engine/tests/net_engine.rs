//! The tcp and local targets serve a `TransferEngine`'s own registrations
//! (`TransferEngine::range_lookup`): exactly the published, remotely
//! accessible, not retired ranges, with the tokens of its descriptors.
#![forbid(unsafe_code)]

mod net_support;

use std::time::Duration;

use net_support::{Initiator, cfg, pattern, request};
use orbitte_engine::core::CoreConfig;
use orbitte_engine::outcome::Status;
use orbitte_engine::transport::{Op, PathKind, PeerId, SliceFailure};
use orbitte_engine::{Access, EngineBuilder};
use orbitte_memory::HostMemory;
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
        .register_host(
            rw.clone(),
            Access::Remote {
                read: true,
                write: true,
            },
        )
        .unwrap();
    let hidden = engine
        .register_host(local_only.clone(), Access::LocalOnly)
        .unwrap();

    let mut scfg = engine.session_config().unwrap();
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
    use orbitte_engine::session::{NetOpenError, PathPreference};
    use orbitte_engine::{DrainStatus, RemoteEffect, TransferRequest};
    net_support::logs();
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("a0", [10, 1, 0, 1]),
            SimDeviceDesc::roce("b0", [10, 2, 0, 1]),
        ])
        .with_delivery(Delivery::Background),
        3,
    );
    let target = EngineBuilder::new("net-target")
        .provider(fabric.provider_for(&["a0"]))
        .build()
        .unwrap();
    let client = EngineBuilder::new("net-client")
        .provider(fabric.provider_for(&["b0"]))
        .build()
        .unwrap();
    let remote = HostMemory::alloc(4 << 20).unwrap();
    pattern(&remote, 6);
    let range = target
        .register_host_without_rdma(
            remote.clone(),
            Access::Remote {
                read: true,
                write: true,
            },
        )
        .unwrap();
    let listener = target
        .serve_tcp(
            target.session_config().unwrap(),
            "127.0.0.1:0".parse().unwrap(),
        )
        .unwrap();

    let range_id = orbitte_engine::RangeId(range.id.0);
    let net = client.attach_net(client.session_config().unwrap());
    let src = HostMemory::alloc(4 << 20).unwrap();
    pattern(&src, 7);
    let dst = HostMemory::alloc(4 << 20).unwrap();
    let s = client
        .register_host_without_rdma(src.clone(), Access::LocalOnly)
        .unwrap();
    let d = client
        .register_host_without_rdma(dst.clone(), Access::LocalOnly)
        .unwrap();

    // Only rdma through here is refused with a reason.
    assert!(matches!(
        net.open_peer(
            &client,
            listener.local_addr(),
            1,
            PathPreference::Only(PathKind::Rdma)
        ),
        Err(NetOpenError::Unsupported(PathKind::Rdma))
    ));

    // tcp, explicitly (same host, but asked for): 3 connections.
    let peer = net
        .open_peer(
            &client,
            listener.local_addr(),
            3,
            PathPreference::Only(PathKind::Tcp),
        )
        .unwrap();
    assert_eq!(
        (peer.path, peer.rails.len(), peer.fell_back.len()),
        (PathKind::Tcp, 3, 0)
    );
    let before = listener.stats().data_requests;
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
    assert!(
        listener.stats().data_requests > before,
        "bytes went over tcp"
    );
    // Out of range: refused at submit time by the engine, nothing posted.
    assert!(
        client
            .submit(&[TransferRequest::read(
                d.id,
                0,
                peer.info.id,
                range_id,
                4 << 20,
                1
            )])
            .is_err()
    );

    // Auto on the same host: the local path (a reconnect of the same epoch).
    let local = net
        .open_peer(&client, listener.local_addr(), 2, PathPreference::Auto)
        .unwrap();
    assert_eq!(local.path, PathKind::Local, "{local:?}");
    let before = listener.stats();
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
    let after = listener.stats();
    assert_eq!(
        after.data_bytes, before.data_bytes,
        "no byte crossed the socket on the local path"
    );
    let _ = client.shutdown(Duration::from_secs(5));
    let _ = target.shutdown(Duration::from_secs(5));
}
