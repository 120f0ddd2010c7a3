//! Model-based property test of the peer table: random sequences of admits,
//! publications, retires, RC connections and closes, checked against a
//! plain model of the epoch rules; every rejected step must leave the table
//! exactly as it was.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use orbitte_wire::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Admit {
        session: u64,
        source: u8,
        epoch: u64,
        version: u16,
        port: u16,
    },
    Publish {
        session: u64,
        epoch: u64,
        ranges: Vec<u64>,
    },
    Retire {
        session: u64,
        epoch: u64,
        ranges: Vec<u64>,
    },
    Rc {
        session: u64,
        id: u64,
    },
    Close {
        session: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..10u64, 0..4u8, 1..6u64, prop_oneof![9 => Just(PROTOCOL_VERSION), 1 => Just(1u16)], 0..3u16)
            .prop_map(|(session, source, epoch, version, port)| Op::Admit {
                session,
                source,
                epoch,
                version,
                port,
            }),
        2 => (0..10u64, 1..6u64, prop::collection::btree_set(0..6u64, 0..4))
            .prop_map(|(session, epoch, r)| Op::Publish {
                session,
                epoch,
                ranges: r.into_iter().collect(),
            }),
        1 => (0..10u64, 1..6u64, prop::collection::btree_set(0..6u64, 0..4))
            .prop_map(|(session, epoch, r)| Op::Retire {
                session,
                epoch,
                ranges: r.into_iter().collect(),
            }),
        1 => (0..10u64, 0..3u64).prop_map(|(session, id)| Op::Rc { session, id }),
        1 => (0..10u64).prop_map(|session| Op::Close { session }),
    ]
}

fn source_name(i: u8) -> SourceId {
    // Source 0 is the local engine itself.
    SourceId::new(if i == 0 {
        "local".to_owned()
    } else {
        format!("peer-{i}")
    })
    .unwrap()
}

fn rkeys(range: u64) -> Vec<NicRkey> {
    (0..(range % 3) as u16)
        .map(|n| NicRkey {
            nic_id: NicId(n),
            rkey: (range as u32) << 8 | u32::from(n),
            lid: 0,
            gid: Gid::default(),
        })
        .collect()
}

#[derive(Default)]
struct Model {
    epochs: BTreeMap<SourceId, u64>,
    sessions: BTreeMap<u64, SourceId>,
    ranges: BTreeMap<SourceId, BTreeSet<u64>>,
    rc: BTreeMap<SourceId, BTreeSet<(u64, u64)>>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn peer_table_follows_the_model(ops in prop::collection::vec(op(), 1..60)) {
        let mut table = PeerTable::new(source_name(0));
        let mut m = Model::default();
        for op in ops {
            let before = table.clone();
            match op {
                Op::Admit { session, source, epoch, version, port } => {
                    let src = source_name(source);
                    let mut id = Identity::new(
                        src.clone(),
                        Epoch::new(epoch).unwrap(),
                        Capabilities::TCP,
                    );
                    id.protocol_version = version;
                    let from = Some(SocketAddr::from(([10, 0, 0, 1], 4000 + port)));
                    let got = table.admit(SessionId(session), from, &id);
                    if version != PROTOCOL_VERSION {
                        prop_assert!(
                            matches!(got, Err(AdmitError::VersionMismatch { ours: PROTOCOL_VERSION, theirs: 1, .. })),
                            "{:?}",
                            got
                        );
                    } else if source == 0 {
                        prop_assert!(matches!(got, Err(AdmitError::OwnSourceId { .. })), "{:?}", got);
                    } else if m.sessions.contains_key(&session) {
                        prop_assert!(matches!(got, Err(AdmitError::SessionInUse { .. })), "{:?}", got);
                    } else {
                        match m.epochs.get(&src).copied() {
                            None => prop_assert_eq!(got, Ok(Admission::New)),
                            Some(rec) if epoch < rec => {
                                prop_assert!(matches!(got, Err(AdmitError::StaleEpoch { .. })), "{:?}", got);
                            }
                            Some(rec) if epoch == rec => prop_assert_eq!(got, Ok(Admission::Reconnect)),
                            Some(rec) => {
                                let Ok(Admission::Replaced { previous, invalidated }) = got else {
                                    return Err(TestCaseError::fail(format!("expected replaced, got {got:?}")));
                                };
                                prop_assert_eq!(previous.value(), rec);
                                let old_sessions: Vec<SessionId> = m.sessions.iter()
                                    .filter(|(_, s)| **s == src)
                                    .map(|(k, _)| SessionId(*k))
                                    .collect();
                                prop_assert_eq!(&invalidated.sessions, &old_sessions);
                                let old_ranges: Vec<RangeId> = m.ranges.remove(&src)
                                    .unwrap_or_default().into_iter().map(RangeId).collect();
                                prop_assert_eq!(&invalidated.descriptors, &old_ranges);
                                let old_rkeys: usize = old_ranges.iter().map(|r| rkeys(r.0).len()).sum();
                                prop_assert_eq!(invalidated.rkeys.len(), old_rkeys);
                                let old_rc: Vec<(SessionId, ConnectId)> = m.rc.remove(&src)
                                    .unwrap_or_default().into_iter()
                                    .map(|(s, c)| (SessionId(s), ConnectId(c))).collect();
                                prop_assert_eq!(&invalidated.rc_connections, &old_rc);
                                m.sessions.retain(|_, s| *s != src);
                            }
                        }
                        if table != before {
                            m.epochs.insert(src.clone(), epoch.max(m.epochs.get(&src).copied().unwrap_or(0)));
                            m.sessions.insert(session, src);
                        }
                    }
                }
                Op::Publish { session, epoch, ranges } => {
                    let p = SegmentPublication {
                        epoch: Epoch::new(epoch).unwrap(),
                        ranges: ranges.iter().map(|&r| RangeDescriptor {
                            range_id: RangeId(r),
                            address: 0,
                            length: 1,
                            access: AccessFlags::REMOTE_READ,
                            token: AccessToken(r),
                            rkeys: rkeys(r),
                            local: None,
                        }).collect(),
                    };
                    let got = table.record_publication(SessionId(session), &p);
                    match m.sessions.get(&session) {
                        None => prop_assert!(matches!(got, Err(RecordError::UnknownSession { .. })), "{:?}", got),
                        Some(src) if m.epochs[src] != epoch => {
                            prop_assert!(matches!(got, Err(RecordError::EpochMismatch { .. })), "{:?}", got);
                        }
                        Some(src) => {
                            prop_assert!(got.is_ok());
                            m.ranges.entry(src.clone()).or_default().extend(ranges);
                        }
                    }
                }
                Op::Retire { session, epoch, ranges } => {
                    let r = SegmentRetire {
                        epoch: Epoch::new(epoch).unwrap(),
                        range_ids: ranges.iter().copied().map(RangeId).collect(),
                    };
                    let got = table.record_retire(SessionId(session), &r);
                    match m.sessions.get(&session) {
                        None => prop_assert!(matches!(got, Err(RecordError::UnknownSession { .. })), "{:?}", got),
                        Some(src) if m.epochs[src] != epoch => {
                            prop_assert!(matches!(got, Err(RecordError::EpochMismatch { .. })), "{:?}", got);
                        }
                        Some(src) => {
                            let held = m.ranges.entry(src.clone()).or_default();
                            let expected: Vec<RangeId> = ranges.iter()
                                .filter(|r| held.remove(r))
                                .copied()
                                .map(RangeId)
                                .collect();
                            prop_assert_eq!(got.unwrap().descriptors, expected);
                        }
                    }
                }
                Op::Rc { session, id } => {
                    let got = table.record_rc_connection(SessionId(session), ConnectId(id));
                    match m.sessions.get(&session) {
                        None => prop_assert!(got.is_err()),
                        Some(src) => {
                            prop_assert!(got.is_ok());
                            m.rc.entry(src.clone()).or_default().insert((session, id));
                        }
                    }
                }
                Op::Close { session } => {
                    let got = table.session_closed(SessionId(session));
                    prop_assert_eq!(got, m.sessions.remove(&session));
                }
            }
            // Shared invariants after every step.
            for (src, epoch) in &m.epochs {
                prop_assert_eq!(table.epoch_of(src).map(Epoch::value), Some(*epoch));
            }
            for (s, src) in &m.sessions {
                prop_assert_eq!(table.source_of(SessionId(*s)), Some(src));
            }
            let empty = BTreeSet::new();
            for (src, rec) in table.sources() {
                let ids: BTreeSet<u64> = rec.ranges.keys().map(|r| r.0).collect();
                prop_assert_eq!(&ids, m.ranges.get(src).unwrap_or(&empty));
            }
        }
    }

    /// A rejected step never changes the table.
    #[test]
    fn rejections_change_nothing(ops in prop::collection::vec(op(), 1..40)) {
        let mut table = PeerTable::new(source_name(0));
        for op in ops {
            let before = table.clone();
            let failed = match op {
                Op::Admit { session, source, epoch, version, .. } => {
                    let mut id = Identity::new(source_name(source), Epoch::new(epoch).unwrap(), Capabilities::TCP);
                    id.protocol_version = version;
                    table.admit(SessionId(session), None, &id).is_err()
                }
                Op::Publish { session, epoch, .. } => table
                    .record_publication(
                        SessionId(session),
                        &SegmentPublication { epoch: Epoch::new(epoch).unwrap(), ranges: vec![] },
                    )
                    .is_err(),
                Op::Retire { session, epoch, ranges } => table
                    .record_retire(
                        SessionId(session),
                        &SegmentRetire {
                            epoch: Epoch::new(epoch).unwrap(),
                            range_ids: ranges.into_iter().map(RangeId).collect(),
                        },
                    )
                    .is_err(),
                Op::Rc { session, id } => table.record_rc_connection(SessionId(session), ConnectId(id)).is_err(),
                Op::Close { session } => table.session_closed(SessionId(session)).is_none(),
            };
            if failed {
                prop_assert_eq!(&table, &before);
            }
        }
    }
}
