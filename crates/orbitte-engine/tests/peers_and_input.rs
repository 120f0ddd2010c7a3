//! docs/troubleshooting.md's "A peer is rejected after a restart or a
//! protocol change" section, and the bad input docs/contract.md lists: a typed error at submit time
//! naming the request, nothing posted.
#![forbid(unsafe_code)]

mod common;

use std::time::Duration;

use common::*;
use orbitte_engine::{
    Access, ControlLink, InProcessLink, OpenPeerError, PeerId, RangeId, RegisterError,
    RegistrationId, RequestError, Status, SubmitError, TransferEngine, TransferRequest,
};
use orbitte_verbs::sim::{Delivery, FaultError, SimFabric};
use orbitte_wire::{self as wire, Frame};

fn b_incarnation(fabric: &SimFabric, epoch: u64) -> TransferEngine {
    builder(fabric, "b", 1).epoch(epoch).build().unwrap()
}

#[test]
fn use_the_source_owners_current_authoritative_epoch_a_newer_epoch_replaces_the_old_source() {
    let fabric = fabric(1, Delivery::Background, 50);
    let a = builder(&fabric, "a", 1).build().unwrap();
    let ra = register(&a, &region(4096, 1), Access::LocalOnly);
    let b1 = b_incarnation(&fabric, 10);
    register(&b1, &region(4096, 2), Access::REMOTE_READ_WRITE);
    let (old, _) = connect(&a, &b1);
    assert_eq!(old.epoch.value(), 10);
    // B restarts with a newer epoch and a new publication.
    drop(b1);
    let b2 = b_incarnation(&fabric, 20);
    let dst = region(4096, 3);
    let rb2 = register(&b2, &dst, Access::REMOTE_READ_WRITE);
    let (new, _) = connect(&a, &b2);
    assert_eq!(new.epoch.value(), 20);
    assert_ne!(new.id, old.id);
    assert_eq!(a.peers().len(), 1, "the old incarnation is gone");
    // Its queue pair was destroyed (the sim no longer knows it).
    let old_qpn = old.rails[0].qpn.unwrap();
    assert_eq!(
        fabric.faults().qp_fatal("a0", old_qpn),
        Err(FaultError::NoSuchQp {
            device: "a0".into(),
            qpn: old_qpn
        }),
        "old rail's qp destroyed"
    );
    // Everything cached from the old one is invalid, refused as made for
    // the incarnation that restarted.
    let err = a
        .submit(&[TransferRequest::write(ra.id, 0, old.id, RangeId(1), 0, 8)])
        .unwrap_err();
    assert!(
        matches!(
            err,
            SubmitError::Invalid {
                error: RequestError::PeerRestarted { handle, current, .. },
                ..
            } if handle.value() == 10 && current.value() == 20
        ),
        "{err}"
    );
    let ids = a
        .submit(&[TransferRequest::write(
            ra.id,
            0,
            new.id,
            RangeId(rb2.id.0),
            0,
            4096,
        )])
        .unwrap();
    assert_eq!(
        a.wait(ids[0], Duration::from_secs(5)).unwrap().status,
        Status::Complete
    );
    assert_eq!(dst.to_vec(0, 4096).unwrap(), pattern(4096, 1));
}

#[test]
fn reopening_the_same_tcp_address_with_an_old_epoch_cannot_adopt_a_replacement_source() {
    let fabric = fabric(1, Delivery::Background, 51);
    let a = builder(&fabric, "a", 1).build().unwrap();
    register(&a, &region(4096, 1), Access::LocalOnly);
    let addr: std::net::SocketAddr = "10.2.0.1:7000".parse().unwrap();
    let b_old = b_incarnation(&fabric, 10);
    let b_new = b_incarnation(&fabric, 20);
    for b in [&b_old, &b_new] {
        let (mut la, mut lb) = InProcessLink::pair();
        let mut la = la_with(&mut la, addr);
        std::thread::scope(|s| {
            let h = s.spawn(|| b.open_peer(&mut lb));
            a.accept_peer(&mut la).unwrap();
            h.join().unwrap().unwrap();
        });
    }
    // The old incarnation comes back from the same address.
    let (la, mut lb) = InProcessLink::pair();
    let mut la = la.with_peer_addr(addr);
    let (res_a, res_b) = std::thread::scope(|s| {
        let h = s.spawn(|| b_old.open_peer(&mut lb));
        let ra = a.accept_peer(&mut la);
        (ra, h.join().unwrap())
    });
    let err = res_a.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("older") && text.contains("10.2.0.1:7000"),
        "{text}"
    );
    assert!(
        matches!(res_b, Err(OpenPeerError::Handshake(_))),
        "the old incarnation hears why: {res_b:?}"
    );
    let peers = a.peers();
    assert_eq!(peers.len(), 1);
    assert_eq!(peers[0].epoch.value(), 20, "the replacement stays adopted");
}

fn la_with(l: &mut InProcessLink, addr: std::net::SocketAddr) -> InProcessLink {
    let (dummy, _) = InProcessLink::pair();
    std::mem::replace(l, dummy).with_peer_addr(addr)
}

#[test]
fn both_peers_must_use_the_current_protocol_version_no_legacy_fallback() {
    let fabric = fabric(1, Delivery::Background, 52);
    let a = builder(&fabric, "a", 1).build().unwrap();
    register(&a, &region(4096, 1), Access::LocalOnly);
    for version in [wire::PROTOCOL_VERSION + 1, 0] {
        let (mut la, mut lb) = InProcessLink::pair();
        let reply = std::thread::scope(|s| {
            let h = s.spawn(move || {
                // A peer speaking another version, by hand.
                let Frame::Challenge(_) = lb.recv(Duration::from_secs(5)).unwrap() else {
                    panic!()
                };
                let mut identity = wire::Identity::new(
                    wire::SourceId::new("other").unwrap(),
                    wire::Epoch::new(5).unwrap(),
                    wire::Capabilities::RDMA,
                );
                let _ = &mut identity;
                // The encoder refuses other versions, so patch the header.
                let mut bytes = Frame::Hello(wire::Hello {
                    identity,
                    nonce: wire::Nonce([1; 32]),
                    purpose: wire::SessionPurpose::RDMA_CONTROL,
                    proof: None,
                })
                .to_bytes()
                .unwrap();
                bytes[4..6].copy_from_slice(&version.to_be_bytes());
                lb.send_raw(bytes).unwrap();
                lb.recv(Duration::from_secs(5))
            });
            let err = a.accept_peer(&mut la).unwrap_err();
            assert!(err.to_string().contains("version"), "{err}");
            h.join().unwrap()
        });
        let Ok(Frame::Error(e)) = reply else {
            panic!("{reply:?}")
        };
        assert_eq!(e.code, wire::ErrorCode::UNSUPPORTED_VERSION);
    }
    // Something that is not an orbitte handshake at all is rejected too.
    let (mut la, mut lb) = InProcessLink::pair();
    std::thread::scope(|s| {
        s.spawn(move || {
            let _ = lb.recv(Duration::from_secs(5));
            let goodbye = wire::Goodbye {
                reason: wire::GoodbyeReason(0),
                message: wire::Message::truncating("legacy"),
            };
            let _ = lb.send(&Frame::Goodbye(goodbye));
        });
        let err = a.accept_peer(&mut la).unwrap_err();
        assert!(
            matches!(
                err,
                OpenPeerError::Handshake(wire::handshake::HandshakeError::UnexpectedFrame { .. })
            ),
            "{err:?}"
        );
    });
    assert!(a.peers().is_empty());
}

#[test]
fn bad_input_gives_a_typed_error_naming_the_request_and_posts_nothing() {
    let fabric = fabric(1, Delivery::Manual, 53);
    let a = builder(&fabric, "a", 1).build().unwrap();
    let b = builder(&fabric, "b", 1).build().unwrap();
    let ra = register(&a, &region(4096, 1), Access::LocalOnly);
    let retired = register(&a, &region(4096, 1), Access::LocalOnly);
    let dst = region(4096, 2);
    let rb = register(&b, &dst, Access::REMOTE_READ_WRITE);
    let ro = register(&b, &region(4096, 2), Access::RemoteRead);
    let (pb, _) = connect(&a, &b);
    a.retire(retired.id).unwrap();
    let good = TransferRequest::write(ra.id, 0, pb.id, RangeId(rb.id.0), 0, 4096);
    type Expect = fn(&RequestError) -> bool;
    let cases: Vec<(TransferRequest, Expect)> = vec![
        (
            TransferRequest {
                peer: PeerId(99),
                ..good
            },
            |e| matches!(e, RequestError::UnknownPeer(PeerId(99))),
        ),
        (
            TransferRequest {
                registration: RegistrationId(999),
                ..good
            },
            |e| matches!(e, RequestError::UnpublishedLocal(RegistrationId(999))),
        ),
        (
            TransferRequest {
                registration: retired.id,
                ..good
            },
            |e| matches!(e, RequestError::UnpublishedLocal(_)),
        ),
        (
            TransferRequest {
                range: RangeId(12345),
                ..good
            },
            |e| {
                matches!(
                    e,
                    RequestError::UnpublishedRemote {
                        range: RangeId(12345),
                        ..
                    }
                )
            },
        ),
        (
            TransferRequest {
                local_offset: 4000,
                len: 200,
                ..good
            },
            |e| matches!(e, RequestError::OutOfRange { side: "local", .. }),
        ),
        (
            TransferRequest {
                remote_offset: 4096,
                len: 1,
                ..good
            },
            |e| matches!(e, RequestError::OutOfRange { side: "remote", .. }),
        ),
        (
            TransferRequest {
                range: RangeId(ro.id.0),
                ..good
            },
            |e| matches!(e, RequestError::WrongAccess { side: "remote", .. }),
        ),
        (TransferRequest { len: 0, ..good }, |e| {
            matches!(e, RequestError::ZeroLength)
        }),
        (
            TransferRequest {
                local_offset: u64::MAX,
                ..good
            },
            |e| matches!(e, RequestError::Overflow { .. }),
        ),
    ];
    for (i, (bad, want)) in cases.into_iter().enumerate() {
        let err = a
            .submit(&[good.label(100), bad.label(200 + i as u64)])
            .unwrap_err();
        match &err {
            SubmitError::Invalid {
                index: 1,
                label,
                error,
            } => {
                assert_eq!(*label, 200 + i as u64);
                assert!(want(error), "case {i}: {error:?}");
            }
            other => panic!("case {i}: {other:?}"),
        }
        assert!(
            err.to_string()
                .contains(&format!("label {}", 200 + i as u64)),
            "{err}"
        );
    }
    assert!(matches!(
        a.submit::<TransferRequest>(&[]),
        Err(SubmitError::Empty)
    ));
    // Nothing of any refused batch was posted, not even the good request.
    assert_eq!(a.outstanding_slices(), 0);
    assert_eq!(fabric.pending(), 0);
    fabric.drive();
    assert_eq!(dst.to_vec(0, 4096).unwrap(), pattern(4096, 2));
    // A READ from a read-only range is fine.
    let ok = TransferRequest::read(ra.id, 0, pb.id, RangeId(ro.id.0), 0, 4096);
    let id = a.submit(&[ok]).unwrap()[0];
    assert!(drive_wait(&fabric, &a, id).is_complete());
}

#[test]
fn a_range_the_peer_retired_is_refused_and_a_later_publication_is_usable() {
    let fabric = fabric(1, Delivery::Background, 54);
    let a = builder(&fabric, "a", 1).build().unwrap();
    let b = builder(&fabric, "b", 1).build().unwrap();
    let ra = register(&a, &region(4096, 1), Access::LocalOnly);
    let rb = register(&b, &region(4096, 2), Access::REMOTE_READ_WRITE);
    let (pb, _) = connect(&a, &b);
    // B retires its range and tells A (over whatever carries its frames).
    b.retire(rb.id).unwrap();
    a.apply_retire(pb.id, &b.segment_retire(&[rb.id])).unwrap();
    let req = TransferRequest::read(ra.id, 0, pb.id, RangeId(rb.id.0), 0, 4096);
    let err = a.submit(&[req]).unwrap_err();
    assert!(
        matches!(
            err,
            SubmitError::Invalid {
                error: RequestError::UnpublishedRemote { .. },
                ..
            }
        ),
        "{err}"
    );
    // B publishes a new range; A learns it and can use it.
    let fresh = region(4096, 5);
    let rb2 = register(&b, &fresh, Access::REMOTE_READ_WRITE);
    a.apply_publication(pb.id, &b.segment_publication())
        .unwrap();
    let id = a
        .submit(&[TransferRequest::write(
            ra.id,
            0,
            pb.id,
            RangeId(rb2.id.0),
            0,
            4096,
        )])
        .unwrap()[0];
    assert!(a.wait(id, Duration::from_secs(5)).unwrap().is_complete());
    assert_eq!(fresh.to_vec(0, 4096).unwrap(), pattern(4096, 1));
    // A publication naming another epoch is refused.
    let mut stale = b.segment_publication();
    stale.epoch = wire::Epoch::new(1).unwrap();
    let err = a.apply_publication(pb.id, &stale).unwrap_err();
    assert!(
        matches!(&err, OpenPeerError::Record(e) if e.to_string().contains("names epoch 1")),
        "{err:?}"
    );
}

#[test]
fn reopening_a_peer_at_the_same_epoch_replaces_rails_that_went_down() {
    let fabric = fabric(1, Delivery::Background, 55);
    let a = builder(&fabric, "a", 1).build().unwrap();
    let b = builder(&fabric, "b", 1).build().unwrap();
    let ra = register(&a, &region(4096, 1), Access::LocalOnly);
    let dst = region(4096, 2);
    let rb = register(&b, &dst, Access::REMOTE_READ_WRITE);
    let (pb, _) = connect(&a, &b);
    let qpn = pb.rails[0].qpn.unwrap();
    fabric.faults().qp_fatal("a0", qpn).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while a.peers()[0].rails[0].up {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    let req = TransferRequest::write(ra.id, 0, pb.id, RangeId(rb.id.0), 0, 4096);
    let why = rail_refusals(a.submit(&[req]));
    assert!(
        matches!(why[..], [orbitte_engine::RailRefusal::Down { .. }]),
        "{why:?}"
    );
    // Same incarnation, new session: a reconnect keeps the PeerId and
    // replaces the rails.
    let (again, _) = connect(&a, &b);
    assert_eq!(again.id, pb.id);
    assert_eq!(again.rails.len(), 1);
    assert!(again.rails[0].up && again.rails[0].qpn != Some(qpn));
    let id = a.submit(&[req]).unwrap()[0];
    assert!(a.wait(id, Duration::from_secs(5)).unwrap().is_complete());
    assert_eq!(dst.to_vec(0, 4096).unwrap(), pattern(4096, 1));
}

/// Plays a peer's hello against `table` (what net's tcp session does).
fn admit(
    a: &TransferEngine,
    epoch: u64,
) -> Result<(wire::SessionId, wire::handshake::Established), wire::handshake::HandshakeError> {
    use wire::handshake::{Initiator, Responder};
    let local = wire::Identity::new(
        wire::SourceId::new(a.source_id()).unwrap(),
        a.epoch(),
        wire::Capabilities::TCP,
    );
    let remote = wire::Identity::new(
        wire::SourceId::new("remote").unwrap(),
        wire::Epoch::new(epoch).unwrap(),
        wire::Capabilities::TCP,
    );
    let mut resp = Responder::new(local, None, wire::Nonce([3; 32]));
    let mut init = Initiator::new(remote, None, wire::Nonce([4; 32]));
    let hello = init.handle_challenge(resp.challenge())?;
    let session = a.new_session_id();
    let table = a.peer_table();
    let mut table = table.lock().unwrap();
    let (_ack, est) = resp.handle_hello(hello, &mut table, session, None)?;
    Ok((session, est))
}

fn publication(epoch: u64, range: u64) -> wire::SegmentPublication {
    wire::SegmentPublication {
        epoch: wire::Epoch::new(epoch).unwrap(),
        ranges: vec![wire::RangeDescriptor {
            range_id: wire::RangeId(range),
            address: 0x1000,
            length: 4096,
            access: wire::AccessFlags::REMOTE_READ | wire::AccessFlags::REMOTE_WRITE,
            token: wire::AccessToken(9),
            rkeys: vec![],
            local: None,
        }],
    }
}

#[test]
fn a_peer_adopted_from_an_outside_session_needs_no_nic_and_follows_the_epoch_rules() {
    use orbitte_verbs::sim::SimDescription;
    let fabric = SimFabric::new(SimDescription::new(vec![]), 56);
    let a = orbitte_engine::EngineBuilder::new("a")
        .provider(fabric.provider())
        .build()
        .unwrap();
    // No RDMA here: Host Direct registration fails, the explicit tcp/local
    // registration works and is published without rkeys.
    let err = a
        .register_host(region(4096, 1), Access::LocalOnly)
        .unwrap_err();
    assert!(matches!(err, RegisterError::NoUsableNic { .. }), "{err:?}");
    let r = a
        .register_host_without_rdma(region(4096, 1), Access::REMOTE_READ_WRITE)
        .unwrap();
    assert_eq!(r.copies, 0);
    assert_eq!(a.charges(), orbitte_engine::Charges::default());
    let p = a.segment_publication();
    assert_eq!(p.ranges.len(), 1);
    assert!(p.ranges[0].rkeys.is_empty());

    let (s1, e1) = admit(&a, 10).unwrap();
    let old = a.adopt_peer(s1, &e1, &publication(10, 5)).unwrap();
    assert_eq!((old.epoch.value(), old.rails.len()), (10, 0));
    assert!(a.topology().contexts.is_empty(), "no NIC context needed");
    // A request to a peer without rails is refused at submit.
    let req = TransferRequest::write(r.id, 0, old.id, RangeId(5), 0, 16);
    let why = rail_refusals(a.submit(&[req]));
    assert_eq!(why, [orbitte_engine::RailRefusal::NoRails]);
    // Older epoch: refused by the shared table.
    let err = admit(&a, 9).unwrap_err();
    assert!(
        matches!(
            err,
            wire::handshake::HandshakeError::Admit(wire::AdmitError::StaleEpoch { .. })
        ),
        "{err:?}"
    );
    // Newer epoch: replaces, the old PeerId is gone.
    let (s2, e2) = admit(&a, 11).unwrap();
    let new = a.adopt_peer(s2, &e2, &publication(11, 6)).unwrap();
    assert_ne!(new.id, old.id);
    assert_eq!(a.peers().len(), 1);
    assert_eq!(a.peers()[0].ranges[0].range, RangeId(6));
    let err = a.submit(&[req]).unwrap_err();
    assert!(
        matches!(
            &err,
            SubmitError::Invalid {
                error: RequestError::PeerRestarted { peer, handle, current },
                ..
            } if *peer == old.id && handle.value() == 10 && current.value() == 11
        ),
        "{err}"
    );
}

/// The per-rail refusals of a submit refused with `NoRail`.
fn rail_refusals(
    submitted: Result<Vec<orbitte_engine::RequestId>, SubmitError>,
) -> Vec<orbitte_engine::RailRefusal> {
    match submitted {
        Err(SubmitError::Invalid {
            error: RequestError::NoRail { why, .. },
            ..
        }) => why,
        other => panic!("expected NoRail, got {other:?}"),
    }
}

/// Builds an engine with `adjust` applied to its session settings: the
/// setting `BuildError::Setting` refused and why, or `None` when the engine
/// was built (and it is shut down).
fn refused_setting(
    adjust: impl Fn(&mut orbitte_engine::SessionConfig) + Send + Sync + 'static,
) -> Option<(&'static str, String)> {
    let fabric = fabric(1, Delivery::Background, 50);
    match builder(&fabric, "a", 1).session_settings(adjust).build() {
        Err(orbitte_engine::BuildError::Setting { name, why }) => Some((name, why)),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(e) => {
            e.shutdown(Duration::from_secs(5)).unwrap();
            None
        }
    }
}

#[test]
fn a_socket_buffer_below_one_segment_is_refused_at_build_naming_the_floor() {
    use orbitte_engine::session::MIN_SOCKET_BUFFER;
    let with = |size: Option<usize>| refused_setting(move |c| c.socket_buffer = size);
    let (name, why) = with(Some(4096)).expect("a 4 KiB socket buffer was not refused");
    assert_eq!(name, "socket_buffer");
    assert!(why.contains("4096 bytes"), "{why}");
    assert!(why.contains(&MIN_SOCKET_BUFFER.to_string()), "{why}");
    assert!(with(Some(MIN_SOCKET_BUFFER - 1)).is_some());
    for ok in [None, Some(MIN_SOCKET_BUFFER), Some(4 << 20)] {
        assert_eq!(with(ok), None, "{ok:?} refused");
    }
}

/// An unsent limit of 0 would mean the kernel's default (no limit), not
/// "nothing unsent": refused, naming the setting and what to ask for.
#[test]
fn an_unsent_limit_of_zero_is_refused_at_build() {
    let with = |limit: Option<u32>| refused_setting(move |c| c.unsent_limit = limit);
    let (name, why) = with(Some(0)).expect("an unsent limit of 0 was not refused");
    assert_eq!(name, "unsent_limit");
    assert!(why.contains("at least 1 byte"), "{why}");
    for ok in [None, Some(1), Some(orbitte_engine::DEFAULT_UNSENT_LIMIT)] {
        assert_eq!(with(ok), None, "{ok:?} refused");
    }
}
