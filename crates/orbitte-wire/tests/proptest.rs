//! Property tests: arbitrary valid frames round-trip, canonically, through
//! both receive paths; arbitrary bytes never break the decoder's invariants.
#![forbid(unsafe_code)]

use orbitte_wire::*;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

fn text(max: usize) -> impl Strategy<Value = String> {
    // Mix ASCII and multi-byte characters, then cut to `max` bytes.
    "[a-zA-Z0-9_./é€-]{0,300}".prop_map(move |s| {
        let mut s: String = s;
        while s.len() > max {
            s.pop();
        }
        s
    })
}

fn source_id() -> impl Strategy<Value = SourceId> {
    text(255)
        .prop_filter("non-empty", |s| !s.is_empty())
        .prop_map(|s| SourceId::new(s).unwrap())
}

fn host_id() -> impl Strategy<Value = HostId> {
    text(255)
        .prop_filter("non-empty", |s| !s.is_empty())
        .prop_map(|s| HostId::new(s).unwrap())
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        text(1024).prop_map(|s| Message::new(s).unwrap()),
        "[a-z]{1000,1100}".prop_map(Message::truncating),
    ]
}

fn epoch() -> impl Strategy<Value = Epoch> {
    (1..=u64::MAX).prop_map(|v| Epoch::new(v).unwrap())
}

fn identity() -> impl Strategy<Value = Identity> {
    (source_id(), epoch(), any::<u64>()).prop_map(|(s, e, c)| Identity::new(s, e, Capabilities(c)))
}

fn bytes32() -> impl Strategy<Value = [u8; 32]> {
    any::<[u8; 32]>()
}

fn gid() -> impl Strategy<Value = Gid> {
    any::<[u8; 16]>().prop_map(Gid)
}

fn endpoint() -> impl Strategy<Value = RailEndpoint> {
    (
        any::<u16>(),
        0..=0xff_ffffu32,
        0..=0xff_ffffu32,
        prop::sample::select(vec![256u16, 512, 1024, 2048, 4096]),
        any::<u16>(),
        gid(),
    )
        .prop_map(|(nic, qpn, psn, mtu, lid, gid)| RailEndpoint {
            nic_id: NicId(nic),
            qpn: Qpn::new(qpn).unwrap(),
            psn: Psn::new(psn).unwrap(),
            mtu: Mtu::new(mtu).unwrap(),
            lid,
            gid,
        })
}

fn range() -> impl Strategy<Value = RangeDescriptor> {
    (
        any::<u64>(),
        any::<u64>(),
        1..=u64::MAX,
        any::<u32>(),
        any::<u64>(),
        vec((any::<u32>(), any::<u16>(), gid()), 0..8),
        option::of((host_id(), any::<u8>(), any::<u64>())),
    )
        .prop_map(|(id, address, length, access, token, keys, local)| {
            let length = length.min(u64::MAX - address).max(1);
            let address = address.min(u64::MAX - length);
            RangeDescriptor {
                range_id: RangeId(id),
                address,
                length,
                access: AccessFlags(access),
                token: AccessToken(token),
                rkeys: keys
                    .into_iter()
                    .enumerate()
                    .map(|(i, (rkey, lid, gid))| NicRkey {
                        nic_id: NicId(i as u16 * 3),
                        rkey,
                        lid,
                        gid,
                    })
                    .collect(),
                local: local.map(|(host_id, m, file_offset)| LocalHint {
                    host_id,
                    mechanism: LocalMechanism(m),
                    file_offset,
                }),
            }
        })
}

fn dedup_ranges(mut ranges: Vec<RangeDescriptor>) -> Vec<RangeDescriptor> {
    let mut seen = std::collections::HashSet::new();
    ranges.retain(|r| seen.insert(r.range_id));
    ranges
}

fn status() -> impl Strategy<Value = Status> {
    prop_oneof![Just(Status::OK), any::<u16>().prop_map(Status)]
}

fn payload_len() -> impl Strategy<Value = u32> {
    prop_oneof![0..64u32, Just(MAX_PAYLOAD_LEN), 0..=MAX_PAYLOAD_LEN]
}

/// Any valid frame (payloads are represented by their length only).
fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        bytes32().prop_map(|n| Challenge { nonce: Nonce(n) }.into()),
        (identity(), bytes32(), any::<u8>(), option::of(bytes32())).prop_map(
            |(identity, n, purpose, p)| Hello {
                identity,
                nonce: Nonce(n),
                purpose: SessionPurpose(purpose),
                proof: p.map(AuthTag),
            }
            .into()
        ),
        (identity(), option::of(bytes32())).prop_map(|(identity, p)| HelloAck {
            identity,
            proof: p.map(AuthTag),
        }
        .into()),
        (any::<u16>(), message()).prop_map(|(r, message)| Goodbye {
            reason: GoodbyeReason(r),
            message,
        }
        .into()),
        (any::<u16>(), any::<u16>(), any::<u64>(), message()).prop_map(|(c, t, r, message)| {
            ErrorFrame {
                code: ErrorCode(c),
                frame_type: FrameType(t),
                request_id: RequestId(r),
                message,
            }
            .into()
        }),
        (epoch(), vec(range(), 0..6)).prop_map(|(epoch, ranges)| SegmentPublication {
            epoch,
            ranges: dedup_ranges(ranges),
        }
        .into()),
        (epoch(), prop::collection::hash_set(any::<u64>(), 0..50)).prop_map(|(epoch, ids)| {
            SegmentRetire {
                epoch,
                range_ids: ids.into_iter().map(RangeId).collect(),
            }
            .into()
        }),
        (any::<u64>(), vec((any::<u16>(), endpoint()), 1..8)).prop_map(|(id, rails)| {
            let mut seen = std::collections::HashSet::new();
            let rails = rails
                .into_iter()
                .filter(|(t, e)| seen.insert((*t, e.nic_id)))
                .map(|(t, endpoint)| RailRequest {
                    target_nic: NicId(t),
                    endpoint,
                })
                .collect();
            ConnectRequest {
                connect_id: ConnectId(id),
                rails,
            }
            .into()
        }),
        (any::<u64>(), vec(endpoint(), 1..8)).prop_map(|(id, rails)| ConnectAccept {
            connect_id: ConnectId(id),
            rails,
        }
        .into()),
        (any::<u64>(), any::<u16>(), message()).prop_map(|(id, c, message)| ConnectReject {
            connect_id: ConnectId(id),
            code: ErrorCode(c),
            message,
        }
        .into()),
        (any::<[u64; 4]>(), payload_len()).prop_map(|([r, g, t, o], length)| {
            ReadRequest {
                request_id: RequestId(r),
                range_id: RangeId(g),
                token: AccessToken(t),
                offset: o.min(u64::MAX - u64::from(length)),
                length,
            }
            .into()
        }),
        (any::<[u64; 3]>(), status(), payload_len()).prop_map(|([r, g, o], status, len)| {
            ReadResponse {
                request_id: RequestId(r),
                range_id: RangeId(g),
                offset: o,
                status,
                length: if status.is_ok() { len } else { 0 },
            }
            .into()
        }),
        (any::<[u64; 4]>(), payload_len()).prop_map(|([r, g, t, o], length)| {
            WriteRequest {
                request_id: RequestId(r),
                range_id: RangeId(g),
                token: AccessToken(t),
                offset: o.min(u64::MAX - u64::from(length)),
                length,
            }
            .into()
        }),
        (any::<[u64; 3]>(), status(), payload_len()).prop_map(|([r, g, o], status, len)| {
            WriteResponse {
                request_id: RequestId(r),
                range_id: RangeId(g),
                offset: o,
                status,
                length: if status.is_ok() { len } else { 0 },
            }
            .into()
        }),
        (
            any::<u64>(),
            prop_oneof![
                vec(any::<u8>(), 0..300),
                (0..=MAX_NOTIFICATION_LEN).prop_map(|n| vec![0x5a; n]),
            ]
        )
            .prop_map(|(notification_id, payload)| Notification {
                notification_id,
                payload,
            }
            .into()),
        (any::<u64>(), any::<u16>(), any::<u64>()).prop_map(|(id, v, limit)| {
            NotificationAnswer {
                notification_id: id,
                verdict: NotificationVerdict(v),
                limit,
            }
            .into()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// encode → header-first decode gives the same frame, and the header
    /// announces exactly the payload the frame declares.
    #[test]
    fn arbitrary_frames_round_trip(f in frame()) {
        let mut head = Vec::new();
        f.encode(&mut head).unwrap();
        let header = FrameHeader::decode(head.first_chunk().unwrap()).unwrap();
        prop_assert_eq!(header.payload_len(), f.payload_len());
        prop_assert_eq!(head.len(), HEADER_LEN + header.fixed_len());
        let back = decode_body(&header, &head[HEADER_LEN..]).unwrap();
        prop_assert_eq!(&back, &f);
        // Small payloads: the buffered path and the conformance oracle too.
        if f.payload_len() <= 4096 {
            let payload = vec![0xa5; f.payload_len() as usize];
            let mut full = Vec::new();
            f.encode_with_payload(&payload, &mut full).unwrap();
            let (back, p) = decode_exact(&full).unwrap();
            prop_assert_eq!(&back, &f);
            prop_assert_eq!(p, &payload[..]);
            prop_assert_eq!(conformance::check(&full), Ok(Some(f)));
        }
    }

    /// Arbitrary bytes behind a valid header never violate the oracle.
    #[test]
    fn arbitrary_bodies_keep_the_invariants(
        ft in prop::sample::select(FrameType::ALL.to_vec()),
        body in vec(any::<u8>(), 0..600),
    ) {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
        b.extend_from_slice(&ft.0.to_be_bytes());
        b.extend_from_slice(&(body.len() as u32).to_be_bytes());
        b.extend_from_slice(&body);
        let r = conformance::check(&b);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    /// Arbitrary bytes, no header help.
    #[test]
    fn arbitrary_bytes_keep_the_invariants(b in vec(any::<u8>(), 0..200)) {
        let r = conformance::check(&b);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    /// Flipping one byte of a valid frame either fails with a typed error or
    /// gives a frame that re-encodes canonically (the oracle checks both).
    #[test]
    fn mutated_frames_keep_the_invariants(f in frame(), at in any::<usize>(), x in 1..=255u8) {
        let payload = vec![0; f.payload_len().min(64) as usize];
        let mut bytes = Vec::new();
        if f.encode_with_payload(&payload, &mut bytes).is_ok() {
            let i = at % bytes.len();
            bytes[i] ^= x;
            let r = conformance::check(&bytes);
        prop_assert!(r.is_ok(), "{:?}", r);
        }
    }
}
