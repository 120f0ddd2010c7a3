//! Sample frames shared by the tests and the stable fuzz harness: at least
//! one of every frame type, with small and large field values.
#![allow(dead_code, unreachable_pub)]

use orbitte_wire::*;

pub fn source(s: &str) -> SourceId {
    SourceId::new(s).expect("valid source id")
}

pub fn epoch(v: u64) -> Epoch {
    Epoch::new(v).expect("non-zero epoch")
}

pub fn identity(s: &str, e: u64) -> Identity {
    Identity::new(source(s), epoch(e), Capabilities::RDMA | Capabilities::TCP)
}

pub fn endpoint(nic: u16, qpn: u32) -> RailEndpoint {
    RailEndpoint {
        nic_id: NicId(nic),
        qpn: Qpn::new(qpn).expect("24-bit qpn"),
        psn: Psn::new(0x00ab_cdef).expect("24-bit psn"),
        mtu: Mtu::MTU_4096,
        lid: 7,
        gid: Gid([0xfe; 16]),
    }
}

pub fn range(id: u64, nics: u16, local: bool) -> RangeDescriptor {
    RangeDescriptor {
        range_id: RangeId(id),
        address: 0x7f00_0000_0000 + id * 0x1000,
        length: 1 << 20,
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        token: AccessToken(0x1234_5678_9abc_def0 ^ id),
        rkeys: (0..nics)
            .map(|n| NicRkey {
                nic_id: NicId(n),
                rkey: 0x100 + u32::from(n),
                lid: 0,
                gid: Gid([n as u8; 16]),
            })
            .collect(),
        local: local.then(|| LocalHint {
            host_id: HostId::new("host-a/boot-1").expect("valid host id"),
            mechanism: LocalMechanism::MEMFD,
            file_offset: 4096 * id,
        }),
    }
}

/// (frame, payload) pairs; the payload is empty except for data frames.
pub fn samples() -> Vec<(Frame, Vec<u8>)> {
    let id = identity("prefill-0", 1_700_000_000_000_000_000);
    let mut v: Vec<(Frame, Vec<u8>)> = vec![
        (
            Challenge {
                nonce: Nonce([9; 32]),
            }
            .into(),
            vec![],
        ),
        (
            Hello {
                identity: id.clone(),
                nonce: Nonce([1; 32]),
                purpose: SessionPurpose::DATA,
                proof: None,
            }
            .into(),
            vec![],
        ),
        (
            Hello {
                identity: Identity::new(
                    source(&"x".repeat(255)),
                    epoch(u64::MAX),
                    Capabilities(u64::MAX),
                ),
                nonce: Nonce([2; 32]),
                purpose: SessionPurpose(0xff),
                proof: Some(AuthTag([3; 32])),
            }
            .into(),
            vec![],
        ),
        (
            HelloAck {
                identity: id.clone(),
                proof: Some(AuthTag([4; 32])),
            }
            .into(),
            vec![],
        ),
        (
            HelloAck {
                identity: identity("d", 1),
                proof: None,
            }
            .into(),
            vec![],
        ),
        (
            Goodbye {
                reason: GoodbyeReason::RESTART,
                message: Message::new("restarting for upgrade").expect("short"),
            }
            .into(),
            vec![],
        ),
        (
            Goodbye {
                reason: GoodbyeReason(999),
                message: Message::default(),
            }
            .into(),
            vec![],
        ),
        (
            ErrorFrame {
                code: ErrorCode::STALE_EPOCH,
                frame_type: FrameType::HELLO,
                request_id: RequestId(0),
                message: Message::new("é".repeat(512)).expect("1024 bytes"),
            }
            .into(),
            vec![],
        ),
        (
            ErrorFrame {
                code: ErrorCode(0xffff),
                frame_type: FrameType(0xbeef),
                request_id: RequestId(u64::MAX),
                message: Message::default(),
            }
            .into(),
            vec![],
        ),
        (
            SegmentPublication {
                epoch: epoch(5),
                ranges: vec![],
            }
            .into(),
            vec![],
        ),
        (
            SegmentPublication {
                epoch: epoch(5),
                ranges: vec![range(1, 0, false), range(2, 3, true), range(3, 1, false)],
            }
            .into(),
            vec![],
        ),
        (
            SegmentRetire {
                epoch: epoch(5),
                range_ids: vec![RangeId(1), RangeId(3)],
            }
            .into(),
            vec![],
        ),
        (
            ConnectRequest {
                connect_id: ConnectId(77),
                rails: vec![
                    RailRequest {
                        target_nic: NicId(0),
                        endpoint: endpoint(1, 0x11),
                    },
                    RailRequest {
                        target_nic: NicId(1),
                        endpoint: endpoint(1, 0xff_ffff),
                    },
                ],
            }
            .into(),
            vec![],
        ),
        (
            ConnectAccept {
                connect_id: ConnectId(77),
                rails: vec![endpoint(0, 0x22), endpoint(0, 0x23)],
            }
            .into(),
            vec![],
        ),
        (
            ConnectReject {
                connect_id: ConnectId(78),
                code: ErrorCode::UNKNOWN_NIC,
                message: Message::new("nic 9 is an inert slot").expect("short"),
            }
            .into(),
            vec![],
        ),
        (
            ReadRequest {
                request_id: RequestId(1),
                range_id: RangeId(2),
                token: AccessToken(3),
                offset: 4,
                length: 5,
            }
            .into(),
            vec![],
        ),
        (
            WriteResponse {
                request_id: RequestId(1),
                range_id: RangeId(2),
                offset: 4,
                status: Status::OK,
                length: 5,
            }
            .into(),
            vec![],
        ),
        (
            WriteResponse {
                request_id: RequestId(1),
                range_id: RangeId(2),
                offset: 4,
                status: Status::BAD_TOKEN,
                length: 0,
            }
            .into(),
            vec![],
        ),
        (
            ReadResponse {
                request_id: RequestId(9),
                range_id: RangeId(2),
                offset: 0,
                status: Status::OUT_OF_BOUNDS,
                length: 0,
            }
            .into(),
            vec![],
        ),
    ];
    let payload: Vec<u8> = (0..200u8).collect();
    v.push((
        WriteRequest {
            request_id: RequestId(10),
            range_id: RangeId(2),
            token: AccessToken(3),
            offset: 4096,
            length: payload.len() as u32,
        }
        .into(),
        payload.clone(),
    ));
    v.push((
        ReadResponse {
            request_id: RequestId(11),
            range_id: RangeId(2),
            offset: 4096,
            status: Status::OK,
            length: payload.len() as u32,
        }
        .into(),
        payload,
    ));
    v.push((
        WriteRequest {
            request_id: RequestId(12),
            range_id: RangeId(2),
            token: AccessToken(3),
            offset: 0,
            length: 0,
        }
        .into(),
        vec![],
    ));
    v.push((
        Notification {
            notification_id: 7,
            payload: vec![1, 2, 3],
        }
        .into(),
        vec![],
    ));
    v.push((
        Notification {
            notification_id: u64::MAX,
            payload: (0..MAX_NOTIFICATION_LEN).map(|i| i as u8).collect(),
        }
        .into(),
        vec![],
    ));
    v.push((
        Notification {
            notification_id: 0,
            payload: vec![],
        }
        .into(),
        vec![],
    ));
    v.push((
        NotificationAnswer {
            notification_id: 7,
            verdict: NotificationVerdict::INBOX_FULL,
            limit: 1024,
        }
        .into(),
        vec![],
    ));
    v
}

/// Every sample encoded with its payload.
pub fn encoded_samples() -> Vec<Vec<u8>> {
    samples()
        .into_iter()
        .map(|(f, p)| {
            let mut out = Vec::new();
            f.encode_with_payload(&p, &mut out).expect("samples encode");
            out
        })
        .collect()
}
