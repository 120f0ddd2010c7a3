//! The peer table's epoch and version rules, and that errors change nothing.
#![forbid(unsafe_code)]

mod common;

use std::net::SocketAddr;

use common::*;
use orbitte_wire::*;

fn addr(port: u16) -> Option<SocketAddr> {
    Some(SocketAddr::from(([127, 0, 0, 1], port)))
}

fn table() -> PeerTable {
    PeerTable::new(source("local"))
}

fn publication(e: u64) -> SegmentPublication {
    SegmentPublication {
        epoch: epoch(e),
        ranges: vec![range(1, 2, false), range(2, 1, true)],
    }
}

#[test]
fn first_hello_is_new_and_equal_epoch_is_a_reconnect() {
    let mut t = table();
    let peer = identity("decode-1", 10);
    assert_eq!(t.admit(SessionId(1), addr(5000), &peer), Ok(Admission::New));
    t.record_publication(SessionId(1), &publication(10))
        .unwrap();
    assert_eq!(t.session_closed(SessionId(1)), Some(source("decode-1")));
    assert_eq!(
        t.admit(SessionId(2), addr(5001), &peer),
        Ok(Admission::Reconnect)
    );
    // The cache survived the reconnect.
    assert_eq!(t.source(&source("decode-1")).unwrap().ranges.len(), 2);
    assert_eq!(t.epoch_of(&source("decode-1")), Some(epoch(10)));
}

#[test]
fn older_epoch_is_rejected_also_from_the_same_address() {
    let mut t = table();
    t.admit(SessionId(1), addr(5000), &identity("p", 20))
        .unwrap();
    let before = t.clone();
    let err = t
        .admit(SessionId(2), addr(5000), &identity("p", 19))
        .unwrap_err();
    assert_eq!(
        err,
        AdmitError::StaleEpoch {
            source_id: source("p"),
            presented: epoch(19),
            recorded: epoch(20),
            from: addr(5000),
            same_address: true,
        }
    );
    assert_eq!(err.error_code(), ErrorCode::STALE_EPOCH);
    assert!(err.to_string().contains("epoch 19"), "{err}");
    assert_eq!(t, before, "nothing half-applied");
    // After the old session closed, the epoch still fences.
    t.session_closed(SessionId(1));
    let err = t
        .admit(SessionId(3), addr(5000), &identity("p", 1))
        .unwrap_err();
    assert!(matches!(
        err,
        AdmitError::StaleEpoch {
            same_address: false,
            ..
        }
    ));
}

#[test]
fn newer_epoch_replaces_and_lists_what_to_invalidate() {
    let mut t = table();
    t.admit(SessionId(1), addr(5000), &identity("p", 20))
        .unwrap();
    t.admit(SessionId(2), addr(5001), &identity("p", 20))
        .unwrap();
    t.record_publication(SessionId(1), &publication(20))
        .unwrap();
    t.record_rc_connection(SessionId(2), ConnectId(7)).unwrap();

    // The restarted engine comes back from the same address.
    let got = t
        .admit(SessionId(3), addr(5000), &identity("p", 21))
        .unwrap();
    let Admission::Replaced {
        previous,
        invalidated,
    } = got
    else {
        panic!("expected a replacement, got {got:?}");
    };
    assert_eq!(previous, epoch(20));
    assert_eq!(invalidated.sessions, vec![SessionId(1), SessionId(2)]);
    assert_eq!(
        invalidated.rc_connections,
        vec![(SessionId(2), ConnectId(7))]
    );
    assert_eq!(invalidated.descriptors, vec![RangeId(1), RangeId(2)]);
    assert_eq!(
        invalidated.rkeys,
        vec![
            CachedRkey {
                range_id: RangeId(1),
                nic_id: NicId(0),
                rkey: 0x100
            },
            CachedRkey {
                range_id: RangeId(1),
                nic_id: NicId(1),
                rkey: 0x101
            },
            CachedRkey {
                range_id: RangeId(2),
                nic_id: NicId(0),
                rkey: 0x100
            },
        ]
    );
    // Old sessions are gone; frames still arriving on them are refused.
    assert_eq!(t.source_of(SessionId(1)), None);
    assert_eq!(
        t.record_publication(SessionId(1), &publication(20)),
        Err(RecordError::UnknownSession {
            session: SessionId(1)
        })
    );
    let rec = t.source(&source("p")).unwrap();
    assert_eq!(rec.epoch, epoch(21));
    assert!(rec.ranges.is_empty());
    assert_eq!(rec.sessions.len(), 1);
    // The old incarnation reconnecting is now stale.
    assert!(matches!(
        t.admit(SessionId(4), addr(5000), &identity("p", 20)),
        Err(AdmitError::StaleEpoch {
            same_address: true,
            ..
        })
    ));
}

#[test]
fn other_protocol_version_is_rejected_naming_both() {
    let mut t = table();
    let mut peer = identity("p", 3);
    peer.protocol_version = 1;
    let before = t.clone();
    let err = t.admit(SessionId(1), None, &peer).unwrap_err();
    assert_eq!(
        err,
        AdmitError::VersionMismatch {
            source_id: source("p"),
            ours: PROTOCOL_VERSION,
            theirs: 1,
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("version 1") && text.contains(&format!("we speak {PROTOCOL_VERSION}")),
        "{text}"
    );
    assert_eq!(err.error_code(), ErrorCode::UNSUPPORTED_VERSION);
    assert_eq!(t, before);
}

#[test]
fn own_source_id_and_reused_sessions_are_rejected() {
    let mut t = table();
    assert!(matches!(
        t.admit(SessionId(1), None, &identity("local", 3)),
        Err(AdmitError::OwnSourceId { .. })
    ));
    t.admit(SessionId(1), None, &identity("a", 3)).unwrap();
    let before = t.clone();
    assert_eq!(
        t.admit(SessionId(1), None, &identity("b", 3)),
        Err(AdmitError::SessionInUse {
            session: SessionId(1)
        })
    );
    assert_eq!(t, before);
}

#[test]
fn publications_with_another_epoch_are_refused_whole() {
    let mut t = table();
    t.admit(SessionId(1), None, &identity("p", 5)).unwrap();
    let before = t.clone();
    assert_eq!(
        t.record_publication(SessionId(1), &publication(4)),
        Err(RecordError::EpochMismatch {
            source_id: source("p"),
            frame_epoch: epoch(4),
            current: epoch(5),
        })
    );
    assert_eq!(t, before);
    let retire = SegmentRetire {
        epoch: epoch(6),
        range_ids: vec![RangeId(1)],
    };
    assert!(t.record_retire(SessionId(1), &retire).is_err());
    assert_eq!(t, before);
}

#[test]
fn retire_returns_descriptors_and_rkeys_and_is_idempotent() {
    let mut t = table();
    t.admit(SessionId(1), None, &identity("p", 5)).unwrap();
    t.record_publication(SessionId(1), &publication(5)).unwrap();
    let retire = SegmentRetire {
        epoch: epoch(5),
        range_ids: vec![RangeId(1), RangeId(99)],
    };
    let inv = t.record_retire(SessionId(1), &retire).unwrap();
    assert_eq!(inv.descriptors, vec![RangeId(1)]);
    assert_eq!(inv.rkeys.len(), 2);
    assert!(inv.sessions.is_empty());
    let again = t.record_retire(SessionId(1), &retire).unwrap();
    assert_eq!(again, Invalidation::default());
}

#[test]
fn republishing_a_range_returns_dropped_rkeys() {
    let mut t = table();
    t.admit(SessionId(1), None, &identity("p", 5)).unwrap();
    t.record_publication(SessionId(1), &publication(5)).unwrap();
    let narrower = SegmentPublication {
        epoch: epoch(5),
        ranges: vec![range(1, 1, false)],
    };
    let inv = t.record_publication(SessionId(1), &narrower).unwrap();
    assert_eq!(
        inv.rkeys,
        vec![CachedRkey {
            range_id: RangeId(1),
            nic_id: NicId(1),
            rkey: 0x101
        }]
    );
}
