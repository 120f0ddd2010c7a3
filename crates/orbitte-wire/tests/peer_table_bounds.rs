//! The peer table stays bounded however many source ids peers present, and
//! still refuses every older incarnation of a source it has evicted.
#![forbid(unsafe_code)]

mod common;

use common::{epoch, identity, source};
use orbitte_wire::*;

fn limits(max_sources: usize, max_fences: usize) -> PeerTableLimits {
    PeerTableLimits {
        max_sources,
        max_fences,
    }
}

/// Admits `name` at `e` on a fresh session and closes it again.
fn visit(t: &mut PeerTable, next: &mut u64, name: &str, e: u64) -> Result<Admission, AdmitError> {
    *next += 1;
    let s = SessionId(*next);
    let a = t.admit(s, None, &identity(name, e))?;
    t.session_closed(s);
    Ok(a)
}

#[test]
fn a_flood_of_source_ids_keeps_the_table_bounded() {
    let mut t = PeerTable::with_limits(source("me"), limits(8, 16));
    let mut next = 0;
    for i in 0..5_000u64 {
        visit(&mut t, &mut next, &format!("flood-{i}"), 1 + i).unwrap();
        let (records, fences, floors) = t.footprint();
        assert!(records <= 8, "{records} records after {i}");
        assert!(fences <= 16, "{fences} fences after {i}");
        assert!(floors == 0 || floors == FLOOR_BUCKETS);
    }
    assert_eq!(t.sources().count(), 8);
}

#[test]
fn an_evicted_source_is_judged_by_its_fence() {
    let mut t = PeerTable::with_limits(source("me"), limits(2, 64));
    let mut next = 0;
    assert_eq!(visit(&mut t, &mut next, "a", 5), Ok(Admission::New));
    for other in ["b", "c", "d"] {
        visit(&mut t, &mut next, other, 1).unwrap();
    }
    assert!(t.source(&source("a")).is_none(), "a stayed a full record");
    assert_eq!(t.fence_of(&source("a")), Some(epoch(5)));
    // An older incarnation is refused exactly as before eviction.
    let err = visit(&mut t, &mut next, "a", 4).unwrap_err();
    assert_eq!(
        err,
        AdmitError::StaleEpoch {
            source_id: source("a"),
            presented: epoch(4),
            recorded: epoch(5),
            from: None,
            same_address: false,
        }
    );
    assert_eq!(err.error_code(), ErrorCode::STALE_EPOCH);
    // The same incarnation reconnects; it is a full record again.
    assert_eq!(visit(&mut t, &mut next, "a", 5), Ok(Admission::Reconnect));
    assert_eq!(t.epoch_of(&source("a")), Some(epoch(5)));
    assert_eq!(t.fence_of(&source("a")), None);
    // Evicted again, a newer incarnation replaces the fenced one.
    for other in ["e", "f", "g"] {
        visit(&mut t, &mut next, other, 1).unwrap();
    }
    assert_eq!(t.fence_of(&source("a")), Some(epoch(5)));
    assert_eq!(
        visit(&mut t, &mut next, "a", 6),
        Ok(Admission::Replaced {
            previous: epoch(5),
            invalidated: Invalidation::default(),
        })
    );
    assert_eq!(t.epoch_of(&source("a")), Some(epoch(6)));
}

#[test]
fn a_folded_fence_still_refuses_older_epochs() {
    let mut t = PeerTable::with_limits(source("me"), limits(1, 2));
    let mut next = 0;
    visit(&mut t, &mut next, "old-owner", 1_000).unwrap();
    for i in 0..50u64 {
        visit(&mut t, &mut next, &format!("later-{i}"), 1_001 + i).unwrap();
    }
    assert_eq!(t.footprint().1, 2, "fences stay at their bound");
    // Folded into its bucket's floor: older incarnations stay refused.
    assert!(t.fence_of(&source("old-owner")).unwrap() >= epoch(1_000));
    assert!(matches!(
        visit(&mut t, &mut next, "old-owner", 999),
        Err(AdmitError::StaleEpoch { .. })
    ));
    let floor = t.fence_of(&source("old-owner")).unwrap().value();
    assert!(visit(&mut t, &mut next, "old-owner", floor).is_ok());
}

#[test]
fn sources_in_use_are_never_evicted() {
    let mut t = PeerTable::with_limits(source("me"), limits(1, 4));
    t.admit(SessionId(1), None, &identity("live-a", 3)).unwrap();
    t.admit(SessionId(2), None, &identity("live-b", 3)).unwrap();
    assert_eq!(t.footprint().0, 2, "both have a session");
    // A cached descriptor keeps its source too, session or not.
    t.record_publication(
        SessionId(1),
        &SegmentPublication {
            epoch: epoch(3),
            ranges: vec![common::range(7, 1, false)],
        },
    )
    .unwrap();
    t.session_closed(SessionId(1));
    assert!(t.source(&source("live-a")).is_some());
    // live-b becomes idle: the table is over its bound, it goes.
    t.session_closed(SessionId(2));
    assert!(t.source(&source("live-b")).is_none());
    assert_eq!(t.fence_of(&source("live-b")), Some(epoch(3)));
    assert!(t.source(&source("live-a")).is_some());
}
