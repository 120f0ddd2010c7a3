//! local path: bytes move through the peer's memfd mapping, never a
//! socket; read-only publications are handed out read-only; the path
//! policy picks local where it applies and says so when it falls back.
#![forbid(unsafe_code)]

mod net_support;

use std::time::Duration;

use net_support::{Initiator, RW, Target, cfg, pattern, request};
use orbitte_engine::outcome::{RemoteEffect, Status};
use orbitte_engine::session::path::{PathInputs, choose_path};
use orbitte_engine::transport::{Op, PathKind, PeerId, SliceFailure};
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;
use orbitte_wire::AccessFlags;

const BOUND: Duration = Duration::from_secs(30);

#[test]
fn same_host_peers_move_bytes_through_shared_memory_and_read_only_stays_read_only() {
    net_support::logs();
    let t = Target::start(cfg("target", 4));
    assert!(t.listener.serves_local());
    let rw_mem = HostMemory::alloc(4 << 20).unwrap();
    pattern(&rw_mem, 1);
    let ro_mem = HostMemory::alloc(1 << 20).unwrap();
    pattern(&ro_mem, 2);
    let wo_mem = HostMemory::alloc(1 << 20).unwrap();
    // A peer's mapping has no memfd of its own: not shareable.
    let owner = HostMemory::alloc(1 << 20).unwrap();
    let unshareable = HostMemory::map_shared(
        owner.memfd().unwrap().try_clone_to_owned().unwrap(),
        1 << 20,
        true,
    )
    .unwrap();
    let rw = t.ranges.publish(rw_mem.clone(), RW).unwrap();
    let ro = t
        .ranges
        .publish(ro_mem.clone(), AccessFlags::REMOTE_READ)
        .unwrap();
    let wo = t
        .ranges
        .publish(wo_mem.clone(), AccessFlags::REMOTE_WRITE)
        .unwrap();
    let un = t.ranges.publish(unshareable.clone(), RW).unwrap();

    let i = Initiator::new(cfg("initiator", 1), CoreConfig::default());
    let peer = PeerId(1);
    let (_tcp_rails, link) = i.connect_tcp(peer, t.addr(), 1).unwrap();
    let local_rails = i.driver.add_rails(PathKind::Local, peer, 2, 64);
    let attach = i
        .local
        .attach(&i.cfg, &i.peers, peer, &link.handshake.peer, &local_rails)
        .unwrap();
    let mut mapped = attach.ranges.clone();
    mapped.sort();
    assert_eq!(
        mapped,
        vec![rw, ro],
        "only memfd-backed, remotely readable ranges are handed out"
    );
    assert_eq!(
        attach.writable,
        vec![rw],
        "a read-only publication is mapped read-only"
    );

    // The policy, per range.
    for d in &link.ranges {
        let same_host = d.local.as_ref().is_some_and(|h| h.host_id == i.cfg.host_id);
        let inputs = PathInputs {
            same_host: same_host || d.range_id == wo || d.range_id == un,
            local: if i.local.is_mapped(peer, d.range_id) {
                Ok(())
            } else {
                Err("range is not mappable".into())
            },
            rdma_applies: false,
            rdma: Err("no rdma device".into()),
            tcp: Ok(()),
        };
        let c = choose_path("target", Some(d.range_id.0), &inputs).unwrap();
        if d.range_id == rw || d.range_id == ro {
            assert_eq!((c.path, c.fell_back.len()), (PathKind::Local, 0));
        } else {
            assert_eq!(c.path, PathKind::Tcp);
            assert_eq!(
                c.fell_back[0].0,
                PathKind::Local,
                "falling back is listed: {c:?}"
            );
        }
    }

    let src = HostMemory::alloc(4 << 20).unwrap();
    pattern(&src, 3);
    let dst = HostMemory::alloc(4 << 20).unwrap();
    let (sreg, dreg) = (
        i.driver.register(src.clone()),
        i.driver.register(dst.clone()),
    );
    let before = t.listener.stats();
    let w = i.driver.submit(vec![request(
        1,
        Op::Write,
        sreg,
        0,
        peer,
        rw.0,
        0,
        4 << 20,
        &local_rails,
    )])[0];
    let o = i.driver.wait(w, BOUND);
    assert_eq!(
        (o.status, o.remote_effect.clone()),
        (Status::Complete, RemoteEffect::Complete),
        "{o:?}"
    );
    assert_eq!(
        rw_mem.to_vec(0, 4 << 20).unwrap(),
        src.to_vec(0, 4 << 20).unwrap()
    );
    let r = i.driver.submit(vec![request(
        2,
        Op::Read,
        dreg,
        0,
        peer,
        ro.0,
        0,
        1 << 20,
        &local_rails,
    )])[0];
    assert_eq!(i.driver.wait(r, BOUND).status, Status::Complete);
    assert_eq!(
        dst.to_vec(0, 1 << 20).unwrap(),
        ro_mem.to_vec(0, 1 << 20).unwrap()
    );
    // No byte crossed the tcp session.
    let after = t.listener.stats();
    assert_eq!(
        (after.data_requests, after.data_bytes),
        (before.data_requests, before.data_bytes)
    );

    // WRITE into the read-only range over the local path: refused, untouched.
    let w = i.driver.submit(vec![request(
        3,
        Op::Write,
        sreg,
        0,
        peer,
        ro.0,
        0,
        4096,
        &local_rails,
    )])[0];
    let o = i.driver.wait(w, BOUND);
    assert_eq!(o.status, Status::Failed);
    let f = o.failure.unwrap();
    assert_eq!(f.path, PathKind::Local);
    assert!(
        matches!(&f.status, SliceFailure::Completion { status, .. } if status.contains("access-denied")),
        "{f:?}"
    );
    let fresh = HostMemory::alloc(1 << 20).unwrap();
    pattern(&fresh, 2);
    assert!(ro_mem.to_vec(0, 1 << 20).unwrap() == fresh.to_vec(0, 1 << 20).unwrap());
    // Past the end of a mapped range: refused before any copy.
    let r = i.driver.submit(vec![request(
        4,
        Op::Read,
        dreg,
        0,
        peer,
        ro.0,
        (1 << 20) - 10,
        4096,
        &local_rails,
    )])[0];
    let o = i.driver.wait(r, BOUND);
    assert!(
        matches!(&o.failure.unwrap().status, SliceFailure::Completion { status, .. } if status.contains("out-of-bounds"))
    );
}

#[test]
fn the_local_server_requires_the_cluster_secret_too() {
    net_support::logs();
    let mut c = cfg("vault", 1);
    c.cluster_secret =
        Some(orbitte_wire::auth::ClusterSecret::new(b"local-secret-0123456789".to_vec()).unwrap());
    let t = Target::start(c.clone());
    let mem = HostMemory::alloc(1 << 16).unwrap();
    t.ranges.publish(mem, RW).unwrap();
    let identity = orbitte_engine::session::PeerIdentity {
        source_id: c.source_id.clone(),
        epoch: c.epoch,
        capabilities: c.capabilities,
        addr: None,
    };
    let i = Initiator::new(cfg("intruder", 1), CoreConfig::default());
    let rails = i.driver.add_rails(PathKind::Local, PeerId(1), 1, 8);
    let e = i
        .local
        .attach(&i.cfg, &i.peers, PeerId(1), &identity, &rails)
        .unwrap_err();
    assert!(e.to_string().contains("auth-required"), "{e}");
    assert!(!i.local.is_mapped(PeerId(1), orbitte_wire::RangeId(1)));
}

#[test]
fn garbage_on_the_local_socket_is_closed_and_others_still_map() {
    use std::io::{Read, Write};
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixStream};
    net_support::logs();
    let mut c = cfg("local-target", 9);
    c.handshake_timeout = Duration::from_millis(300);
    let t = Target::start(c.clone());
    let mem = HostMemory::alloc(1 << 16).unwrap();
    let range = t.ranges.publish(mem, RW).unwrap();
    let name = orbitte_engine::transport::local::socket_name(&c.source_id, c.epoch);
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    // Garbage, and a silent client: both closed within the handshake bound.
    for garbage in [&b"not a frame at all, just bytes"[..], &b""[..]] {
        let mut s = UnixStream::connect_addr(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(garbage).unwrap();
        let mut sink = Vec::new();
        // Ends with EOF or a reset (the server closed); a hang would time
        // out and fail.
        match s.read_to_end(&mut sink) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("local server did not close the session: {e}"),
        }
    }
    let i = Initiator::new(cfg("neighbour", 1), CoreConfig::default());
    let (_, link) = i.connect_tcp(PeerId(1), t.addr(), 1).unwrap();
    let rails = i.driver.add_rails(PathKind::Local, PeerId(1), 1, 8);
    let att = i
        .local
        .attach(&i.cfg, &i.peers, PeerId(1), &link.handshake.peer, &rails)
        .unwrap();
    assert_eq!(att.ranges, vec![range]);
}
