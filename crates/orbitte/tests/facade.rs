//! The facade exposes what the Quick Start needs, and the Quick Start's
//! flow works end to end through it (two engines on the sim fabric,
//! register, connect, write, read back, every byte compared).
#![forbid(unsafe_code)]

use std::time::Duration;

use orbitte::verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric};
use orbitte::{
    Access, DrainStatus, EngineBuilder, HostMemory, InProcessLink, PathKind, RangeId, RemoteEffect,
    Status, TransferRequest,
};

#[test]
fn quickstart_flow_through_the_facade() {
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("p0", [10, 0, 0, 1]),
            SimDeviceDesc::roce("d0", [10, 0, 0, 2]),
        ])
        .with_delivery(Delivery::Background),
        3,
    );
    let a = EngineBuilder::new("prefill-t")
        .provider(fabric.provider_for(&["p0"]))
        .build()
        .unwrap();
    let b = EngineBuilder::new("decode-t")
        .provider(fabric.provider_for(&["d0"]))
        .build()
        .unwrap();
    // Not initialized before the first Host Direct registration.
    assert!(!a.topology().initialized);
    let len = 300_000;
    let src = HostMemory::alloc(len).unwrap();
    let pattern: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    src.write_at(0, &pattern).unwrap();
    let dst = HostMemory::alloc(len).unwrap();
    let local = a.register_host(src.clone(), Access::LocalOnly).unwrap();
    let remote = b
        .register_host(dst.clone(), Access::REMOTE_READ_WRITE)
        .unwrap();
    assert!(a.topology().initialized);
    assert_eq!((local.copies, remote.copies), (1, 2));

    let (mut la, mut lb) = InProcessLink::pair();
    let peer = std::thread::scope(|s| {
        let h = s.spawn(|| b.accept_peer(&mut lb));
        let p = a.open_peer(&mut la).unwrap();
        h.join().unwrap().unwrap();
        p
    });
    assert_eq!(peer.source_id, "decode-t");
    let range = RangeId(remote.id.0);

    let w = a
        .submit(&[TransferRequest::write(
            local.id, 0, peer.id, range, 0, len as u64,
        )])
        .unwrap();
    let o = a.wait(w[0], Duration::from_secs(30)).unwrap();
    assert_eq!(o.status, Status::Complete, "{o:?}");
    assert_eq!(o.completed_prefix, len as u64);
    assert_eq!(o.remote_effect, RemoteEffect::Complete);
    assert_eq!(dst.to_vec(0, len).unwrap(), pattern);

    src.fill(0, len, 0).unwrap();
    let r = a
        .submit(&[TransferRequest::read(
            local.id, 0, peer.id, range, 0, len as u64,
        )])
        .unwrap();
    let o = a.wait(r[0], Duration::from_secs(30)).unwrap();
    assert!(o.is_complete(), "{o:?}");
    a.wait_drain(r[0], Duration::from_secs(30)).unwrap();
    assert_eq!(a.drain_status(r[0]), DrainStatus::Drained);
    assert_eq!(src.to_vec(0, len).unwrap(), pattern);

    // The capability matrix is data, with every path.
    let m = orbitte::CapabilityMatrix::baseline();
    assert_eq!(m.rows.len(), PathKind::ALL.len());
    a.shutdown(Duration::from_secs(5)).unwrap();
    b.shutdown(Duration::from_secs(5)).unwrap();
}

#[test]
fn facade_reexports_memory_and_topology_types() {
    let t: orbitte::Topology = orbitte::Topology::from_nics(Vec::new());
    assert!(t.is_empty());
    let _mask = orbitte::DeviceMask::ALL;
    let _cfg = orbitte::RdmaConfig::default();
    assert!(!orbitte::topology::ENV_VARS.is_empty());
    // The memory crate is reachable as a module too.
    let m = HostMemory::alloc(4096).unwrap();
    assert!(m.is_shareable());
    let e: Result<(), orbitte::memory::MemoryError> = m.write_at(4096, &[1]);
    assert!(e.is_err(), "bounds-checked");
}

/// The Quick Start example's flow (examples/quickstart.rs), through the
/// facade: two engines on loopback over real sockets, one listener, one
/// connect, a WRITE with a notification the target waits for, a READ back
/// by address, every byte compared.
#[test]
fn quickstart_example_flow_over_loopback_sockets() {
    use orbitte::{Notification, NotificationStatus, Request};
    const LEN: usize = 1 << 20;
    let wait = Duration::from_secs(30);
    let decode = EngineBuilder::new("decode-q")
        .listen("127.0.0.1:0".parse().unwrap())
        .host_memory_without_rdma()
        .build()
        .unwrap();
    let prefill = EngineBuilder::new("prefill-q")
        .host_memory_without_rdma()
        .build()
        .unwrap();
    let kv = HostMemory::alloc(LEN).unwrap();
    decode.register(&kv, Access::RemoteReadWrite).unwrap();
    let src = HostMemory::alloc(LEN).unwrap();
    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    src.write_at(0, &pattern).unwrap();
    let local = prefill.register(&src, Access::LocalOnly).unwrap();

    let peer = prefill.connect(decode.listen_addr().unwrap()).unwrap();
    assert_eq!((peer.source_id(), peer.path), ("decode-q", PathKind::Local));
    assert!(peer.fell_back.is_empty(), "{peer:?}");
    let remote = peer.ranges()[0];

    let write = Request::write(&local, 0..LEN as u64).to(&remote, 0);
    let ids = prefill
        .submit_with_notification(&[write], Notification::new("kv ready"))
        .unwrap();
    let wrote = prefill.wait(ids[0], wait).unwrap();
    assert_eq!(
        (
            wrote.status,
            wrote.remote_effect.clone(),
            wrote.notification.clone()
        ),
        (
            Status::Complete,
            RemoteEffect::Complete,
            NotificationStatus::Sent
        ),
        "{wrote:?}"
    );
    let note = decode.wait_notification(wait).expect("the notification");
    assert_eq!(
        (note.payload.as_slice(), note.source_id.as_str()),
        (&b"kv ready"[..], "prefill-q")
    );
    assert!(
        kv.to_vec(0, LEN).unwrap() == pattern,
        "every byte placed before the notification"
    );

    src.fill(0, LEN, 0).unwrap();
    let back = Request::read(&local, 0..LEN as u64).from_address(&peer, remote.address);
    let ids = prefill.submit(&[back]).unwrap();
    assert!(prefill.wait(ids[0], wait).unwrap().is_complete());
    prefill.wait_drain(ids[0], wait).unwrap();
    assert!(src.to_vec(0, LEN).unwrap() == pattern);
    prefill.shutdown(wait).unwrap();
    decode.shutdown(wait).unwrap();
}
