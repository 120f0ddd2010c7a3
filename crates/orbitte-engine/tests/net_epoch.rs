//! Epochs, in one process: an older epoch is rejected (also from the same
//! address), a newer one is adopted and what belonged to the old one is
//! dropped, an equal one is a reconnect. Both directions: the target judges
//! initiators, the initiator judges targets.
#![forbid(unsafe_code)]

mod net_support;

use std::time::Duration;

use net_support::{Initiator, RW, Target, cfg, eventually, pattern, request};
use orbitte_engine::outcome::Status;
use orbitte_engine::session::SessionError;
use orbitte_engine::transport::{Op, PeerId};
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;
use orbitte_wire::{AdmitError, ErrorCode};

const BOUND: Duration = Duration::from_secs(30);

#[test]
fn target_rejects_an_older_initiator_epoch_and_replaces_on_a_newer_one() {
    net_support::logs();
    let t = Target::start(cfg("target", 1));
    let mem = HostMemory::alloc(1 << 20).unwrap();
    pattern(&mem, 1);
    let range = t.ranges.publish(mem.clone(), RW).unwrap();

    let b10 = Initiator::new(cfg("b", 10), CoreConfig::default());
    let (old_rails, _) = b10.connect_tcp(PeerId(1), t.addr(), 2).unwrap();
    // Same epoch again: a reconnect, both kept.
    let b10_again = Initiator::new(cfg("b", 10), CoreConfig::default());
    b10_again.connect_tcp(PeerId(1), t.addr(), 1).unwrap();

    // An older epoch of the same source, from the same address: rejected.
    let b5 = Initiator::new(cfg("b", 5), CoreConfig::default());
    match b5.connect_tcp(PeerId(1), t.addr(), 1).unwrap_err() {
        SessionError::Refused { code, message } => {
            assert_eq!(code, ErrorCode::STALE_EPOCH);
            assert!(message.contains("older than its recorded"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    eventually("stale epoch refusal recorded", || {
        t.listener
            .closed_sessions()
            .iter()
            .any(|c| c.abnormal && c.reason.contains("epoch 5"))
    });
    assert_eq!(
        t.peers
            .lock()
            .unwrap()
            .epoch_of(&b10.cfg.source_id)
            .unwrap()
            .value(),
        10
    );

    // A newer epoch: adopted, the old epoch's sessions are closed by the
    // target, so the old incarnation's rails go down.
    let b20 = Initiator::new(cfg("b", 20), CoreConfig::default());
    let local = HostMemory::alloc(4096).unwrap();
    let reg = b20.driver.register(local.clone());
    let (rails, _) = b20.connect_tcp(PeerId(1), t.addr(), 1).unwrap();
    eventually("old rails down", || {
        old_rails.iter().all(|r| !b10.tcp.rail_is_up(*r))
    });
    let o = b20.driver.wait(
        b20.driver.submit(vec![request(
            1,
            Op::Read,
            reg,
            0,
            PeerId(1),
            range.0,
            0,
            4096,
            &rails,
        )])[0],
        BOUND,
    );
    assert_eq!(o.status, Status::Complete);
    assert_eq!(local.to_vec(0, 4096).unwrap(), mem.to_vec(0, 4096).unwrap());
    assert_eq!(
        t.peers
            .lock()
            .unwrap()
            .epoch_of(&b10.cfg.source_id)
            .unwrap()
            .value(),
        20
    );
}

#[test]
fn initiator_adopts_a_restarted_target_and_rejects_a_replayed_old_epoch_at_the_same_address() {
    net_support::logs();
    let t10 = Target::start(cfg("svc", 10));
    let addr = t10.addr();
    let m10 = HostMemory::alloc(1 << 16).unwrap();
    pattern(&m10, 10);
    let r10 = t10.ranges.publish(m10.clone(), RW).unwrap();

    let i = Initiator::new(cfg("client", 1), CoreConfig::default());
    let (old_rails, link) = i.connect_tcp(PeerId(1), addr, 2).unwrap();
    assert_eq!(link.ranges[0].range_id, r10);
    drop(t10); // the target process "dies"

    // Something at the same address presents the old epoch 9: rejected.
    let t9 = Target::start_at(cfg("svc", 9), addr);
    match i.connect_tcp(PeerId(2), addr, 1).unwrap_err() {
        SessionError::Admit(AdmitError::StaleEpoch {
            presented,
            recorded,
            same_address,
            ..
        }) => {
            assert_eq!((presented.value(), recorded.value()), (9, 10));
            assert!(same_address, "the table knew this address from epoch 10");
        }
        other => panic!("{other:?}"),
    }
    // The stale target was told why.
    eventually("stale target saw the refusal", || {
        t9.listener
            .closed_sessions()
            .iter()
            .any(|c| c.reason.contains("stale-epoch"))
    });
    drop(t9);

    // The restarted target with a newer epoch: adopted; the old rails and
    // the old epoch's descriptors are dropped.
    let t11 = Target::start_at(cfg("svc", 11), addr);
    let m11 = HostMemory::alloc(1 << 16).unwrap();
    pattern(&m11, 11);
    let r11 = t11.ranges.publish(m11.clone(), RW).unwrap();
    let (rails, link) = i.connect_tcp(PeerId(3), addr, 1).unwrap();
    let mut closed = link.closed_rails.clone();
    closed.sort();
    assert_eq!(closed, old_rails);
    assert!(
        i.tcp.range(PeerId(1), r10).is_none(),
        "descriptors of epoch 10 dropped"
    );
    assert_eq!(
        i.peers
            .lock()
            .unwrap()
            .epoch_of(&t11.cfg.source_id)
            .unwrap()
            .value(),
        11
    );
    let local = HostMemory::alloc(1 << 16).unwrap();
    let reg = i.driver.register(local.clone());
    let o = i.driver.wait(
        i.driver.submit(vec![request(
            1,
            Op::Read,
            reg,
            0,
            PeerId(3),
            r11.0,
            0,
            1 << 16,
            &rails,
        )])[0],
        BOUND,
    );
    assert_eq!(o.status, Status::Complete);
    assert_eq!(
        local.to_vec(0, 1 << 16).unwrap(),
        m11.to_vec(0, 1 << 16).unwrap()
    );
}
