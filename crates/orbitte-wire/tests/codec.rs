//! Round trips, truncated prefixes, the zero-copy path and malformed input.
#![forbid(unsafe_code)]

mod common;

use common::*;
use orbitte_wire::*;

#[test]
fn samples_cover_every_frame_type() {
    let mut seen: Vec<FrameType> = samples().iter().map(|(f, _)| f.frame_type()).collect();
    seen.sort();
    seen.dedup();
    let mut all = FrameType::ALL.to_vec();
    all.sort();
    assert_eq!(seen, all);
}

#[test]
fn every_sample_round_trips() {
    for (frame, payload) in samples() {
        let mut bytes = Vec::new();
        frame.encode_with_payload(&payload, &mut bytes).unwrap();
        let (decoded, got_payload) = decode_exact(&bytes).unwrap();
        assert_eq!(decoded, frame);
        assert_eq!(got_payload, &payload[..]);
        assert_eq!(conformance::check(&bytes), Ok(Some(frame)));
    }
}

#[test]
fn every_truncated_prefix_of_every_frame_is_a_truncation() {
    for bytes in encoded_samples() {
        for len in 0..bytes.len() {
            let err = decode(&bytes[..len]).unwrap_err();
            assert!(err.is_truncation(), "prefix {len} of {bytes:02x?}: {err}");
        }
        // And the body decoder alone, for every short fixed part.
        let header = FrameHeader::decode(bytes.first_chunk().unwrap()).unwrap();
        let fixed = &bytes[HEADER_LEN..HEADER_LEN + header.fixed_len()];
        for len in 0..fixed.len() {
            let err = decode_body(&header, &fixed[..len]).unwrap_err();
            assert!(err.is_truncation(), "fixed prefix {len}: {err}");
        }
    }
}

#[test]
fn frames_follow_each_other_in_a_stream() {
    let all: Vec<u8> = encoded_samples().concat();
    let mut rest = &all[..];
    let mut frames = Vec::new();
    while !rest.is_empty() {
        let d = decode(rest).unwrap();
        frames.push(d.frame);
        rest = &rest[d.frame_len..];
    }
    let expected: Vec<Frame> = samples().into_iter().map(|(f, _)| f).collect();
    assert_eq!(frames, expected);
}

#[test]
fn zero_copy_write_request_send_and_receive() {
    // Sender: header + fixed part in a small buffer, payload from user memory.
    let user_memory: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    let req = WriteRequest {
        request_id: RequestId(42),
        range_id: RangeId(7),
        token: AccessToken(99),
        offset: 128,
        length: 4000,
    };
    let mut head = Vec::new();
    Frame::from(req).encode(&mut head).unwrap();
    assert_eq!(head.len(), HEADER_LEN + WRITE_REQUEST_FIXED_LEN);
    let payload = &user_memory[1000..5000];
    // What a vectored write puts on the wire.
    let wire: Vec<u8> = [&head[..], payload].concat();

    // Receiver: header, fixed part, then the payload straight into place.
    let header = FrameHeader::decode(wire[..HEADER_LEN].try_into().unwrap()).unwrap();
    assert_eq!(header.frame_type, FrameType::WRITE_REQUEST);
    let fixed_end = HEADER_LEN + header.fixed_len();
    let frame = decode_body(&header, &wire[HEADER_LEN..fixed_end]).unwrap();
    assert_eq!(frame, Frame::WriteRequest(req));
    assert_eq!(header.payload_len(), 4000);
    let mut destination = vec![0u8; 8192];
    let at = req.offset as usize;
    destination[at..at + header.payload_len() as usize]
        .copy_from_slice(&wire[fixed_end..fixed_end + header.payload_len() as usize]);
    assert_eq!(&destination[at..at + 4000], payload);
    assert_eq!(fixed_end + 4000, header.frame_len());
}

#[test]
fn golden_bytes_of_a_read_request() {
    // Pins the byte layout documented in docs/protocol.md.
    let f = Frame::from(ReadRequest {
        request_id: RequestId(0x0102_0304_0506_0708),
        range_id: RangeId(0x11),
        token: AccessToken(0x22),
        offset: 0x33,
        length: 0x44,
    });
    let bytes = f.to_bytes().unwrap();
    let expected: Vec<u8> = [
        &b"OBTE"[..],
        &[0x00, 0x03],             // version 3
        &[0x00, 0x30],             // read-request
        &[0x00, 0x00, 0x00, 0x24], // body 36
        &[1, 2, 3, 4, 5, 6, 7, 8],
        &[0, 0, 0, 0, 0, 0, 0, 0x11],
        &[0, 0, 0, 0, 0, 0, 0, 0x22],
        &[0, 0, 0, 0, 0, 0, 0, 0x33],
        &[0, 0, 0, 0x44],
    ]
    .concat();
    assert_eq!(bytes, expected);
}

#[test]
fn golden_bytes_of_a_hello() {
    let f = Frame::from(Hello {
        identity: Identity::new(source("ab"), epoch(2), Capabilities::TCP),
        nonce: Nonce([7; 32]),
        purpose: SessionPurpose::RDMA_CONTROL,
        proof: None,
    });
    let bytes = f.to_bytes().unwrap();
    let mut expected = b"OBTE\x00\x03\x00\x02".to_vec();
    expected.extend_from_slice(&(2u32 + 8 + 8 + 1 + 2 + 32 + 1 + 1).to_be_bytes());
    expected.extend_from_slice(&[0, 3]); // protocol version
    expected.extend_from_slice(&2u64.to_be_bytes()); // epoch
    expected.extend_from_slice(&2u64.to_be_bytes()); // capabilities: tcp
    expected.extend_from_slice(&[2, b'a', b'b']); // source id
    expected.extend_from_slice(&[7; 32]); // nonce
    expected.push(1); // purpose: rdma-control
    expected.push(0); // no proof
    assert_eq!(bytes, expected);
}

fn sample_bytes(ft: FrameType) -> Vec<u8> {
    let (f, p) = samples()
        .into_iter()
        .find(|(f, _)| f.frame_type() == ft)
        .unwrap();
    let mut out = Vec::new();
    f.encode_with_payload(&p, &mut out).unwrap();
    out
}

fn set_body_len(bytes: &mut [u8], len: u32) {
    bytes[8..12].copy_from_slice(&len.to_be_bytes());
}

#[test]
fn bad_magic_names_the_field_and_fails_early() {
    let mut b = sample_bytes(FrameType::HELLO);
    b[0] = b'X';
    let e = decode(&b).unwrap_err();
    assert_eq!(e.field, "header.magic");
    assert!(matches!(e.problem, Problem::BadMagic { .. }));
    assert_eq!(e.error_code(), ErrorCode::NOT_ORBITTE);
    // A 2-byte prefix that already disagrees is not "wait for more".
    let e = decode(b"GE").unwrap_err();
    assert!(!e.is_truncation());
}

#[test]
fn other_protocol_version_names_both() {
    let mut b = sample_bytes(FrameType::HELLO);
    b[4..6].copy_from_slice(&1u16.to_be_bytes());
    let e = decode(&b).unwrap_err();
    assert_eq!(
        e.problem,
        Problem::UnsupportedVersion { ours: 3, theirs: 1 }
    );
    assert_eq!(e.error_code(), ErrorCode::UNSUPPORTED_VERSION);
    let text = e.to_string();
    assert!(
        text.contains("version 1") && text.contains("we speak 3"),
        "{text}"
    );
}

#[test]
fn hello_body_version_must_match() {
    let mut b = sample_bytes(FrameType::HELLO);
    b[HEADER_LEN..HEADER_LEN + 2].copy_from_slice(&7u16.to_be_bytes());
    let e = decode(&b).unwrap_err();
    assert_eq!(e.frame, FrameType::HELLO);
    assert_eq!(e.field, "identity.protocol_version");
    assert_eq!(
        e.problem,
        Problem::UnsupportedVersion { ours: 3, theirs: 7 }
    );
}

#[test]
fn error_frames_of_any_version_decode() {
    let mut b = sample_bytes(FrameType::ERROR);
    b[4..6].copy_from_slice(&9u16.to_be_bytes());
    let (f, _) = decode_exact(&b).unwrap();
    assert!(matches!(f, Frame::Error(e) if e.code == ErrorCode::STALE_EPOCH));
}

#[test]
fn unknown_frame_type_is_rejected_with_its_number() {
    let mut b = sample_bytes(FrameType::GOODBYE);
    b[6..8].copy_from_slice(&0x7777u16.to_be_bytes());
    let e = decode(&b).unwrap_err();
    assert_eq!(e.problem, Problem::UnknownFrameType);
    assert_eq!(e.frame, FrameType(0x7777));
    assert_eq!(e.error_code(), ErrorCode::UNKNOWN_FRAME_TYPE);
    assert!(e.to_string().contains("unknown(0x7777)"));
}

#[test]
fn trailing_bytes_in_a_body_are_rejected() {
    for bytes in encoded_samples() {
        let header = FrameHeader::decode(bytes.first_chunk().unwrap()).unwrap();
        if header.frame_type.carries_payload() {
            continue; // extra bytes there are payload; see the next test
        }
        let mut b = bytes.clone();
        b.push(0);
        set_body_len(&mut b, header.body_len + 1);
        let e = decode(&b).unwrap_err();
        if header.body_len == max_body_len(header.frame_type) {
            // A fixed-size frame: its header bound refuses the longer body.
            assert_eq!(e.field, "header.body_len", "{e}");
            assert!(matches!(e.problem, Problem::TooLong { .. }), "{e}");
        } else {
            assert_eq!(e.problem, Problem::TrailingBytes { count: 1 }, "{e}");
            assert_eq!(e.field, "body");
        }
        // decode_exact: bytes after a complete frame.
        let mut b = bytes.clone();
        b.push(0);
        let e = decode_exact(&b).unwrap_err();
        assert_eq!(e.problem, Problem::TrailingBytes { count: 1 });
    }
}

#[test]
fn payload_length_must_match_the_header() {
    let mut b = sample_bytes(FrameType::WRITE_REQUEST);
    b.push(0);
    let len = u32::from_be_bytes(b[8..12].try_into().unwrap());
    set_body_len(&mut b, len + 1);
    let e = decode(&b).unwrap_err();
    assert_eq!(e.frame, FrameType::WRITE_REQUEST);
    assert_eq!(e.field, "length");
    assert!(matches!(e.problem, Problem::Inconsistent { .. }));
}

#[test]
fn oversized_lengths_are_rejected_from_the_header() {
    // Control frame announcing more than the bound: rejected before any
    // body byte is buffered.
    let mut h = sample_bytes(FrameType::SEGMENT_PUBLICATION)[..HEADER_LEN].to_vec();
    set_body_len(&mut h, MAX_CONTROL_BODY_LEN + 1);
    let e = FrameHeader::decode(h[..].try_into().unwrap()).unwrap_err();
    assert_eq!(e.field, "header.body_len");
    assert_eq!(e.error_code(), ErrorCode::FRAME_TOO_LARGE);
    // Data frame announcing more than the payload bound.
    let mut h = sample_bytes(FrameType::WRITE_REQUEST)[..HEADER_LEN].to_vec();
    set_body_len(&mut h, WRITE_REQUEST_FIXED_LEN as u32 + MAX_PAYLOAD_LEN + 1);
    assert!(FrameHeader::decode(h[..].try_into().unwrap()).is_err());
    set_body_len(&mut h, u32::MAX);
    assert!(FrameHeader::decode(h[..].try_into().unwrap()).is_err());
    // Data frame shorter than its fixed part.
    set_body_len(&mut h, 3);
    let e = FrameHeader::decode(h[..].try_into().unwrap()).unwrap_err();
    assert!(matches!(e.problem, Problem::TooShort { .. }));
    // The largest legal data frame header is accepted.
    set_body_len(&mut h, WRITE_REQUEST_FIXED_LEN as u32 + MAX_PAYLOAD_LEN);
    let ok = FrameHeader::decode(h[..].try_into().unwrap()).unwrap();
    assert_eq!(ok.frame_len(), MAX_FRAME_LEN);
}

#[test]
fn huge_counts_do_not_allocate_and_are_reported() {
    // A publication claiming 1024 ranges in a 10-byte body.
    let mut body = 5u64.to_be_bytes().to_vec();
    body.extend_from_slice(&1024u16.to_be_bytes());
    let mut b = b"OBTE\x00\x03\x00\x10".to_vec();
    b.extend_from_slice(&(body.len() as u32).to_be_bytes());
    b.extend_from_slice(&body);
    let e = decode(&b).unwrap_err();
    assert_eq!(e.frame, FrameType::SEGMENT_PUBLICATION);
    assert_eq!(e.field, "ranges");
    assert!(e.is_truncation());
    // More than the protocol maximum.
    let n = (MAX_RANGES_PER_FRAME + 1) as u16;
    b[HEADER_LEN + 8..HEADER_LEN + 10].copy_from_slice(&n.to_be_bytes());
    let e = decode(&b).unwrap_err();
    assert!(matches!(e.problem, Problem::TooMany { .. }));
}

/// Replaces bytes at `at` of the sample of `ft` and expects an error naming
/// `field`.
fn expect_field_error(ft: FrameType, at: usize, bytes: &[u8], field: &str) -> DecodeError {
    let mut b = sample_bytes(ft);
    b[HEADER_LEN + at..HEADER_LEN + at + bytes.len()].copy_from_slice(bytes);
    let e = decode(&b).unwrap_err();
    assert_eq!(e.frame, ft);
    assert_eq!(e.field, field, "{e}");
    assert_eq!(e.error_code(), ErrorCode::MALFORMED_FRAME);
    e
}

#[test]
fn notification_payload_is_bounded_at_1_mib() {
    assert_eq!(MAX_NOTIFICATION_LEN, 1 << 20);
    let f = Frame::from(Notification {
        notification_id: 1,
        payload: vec![9; MAX_NOTIFICATION_LEN],
    });
    let bytes = f.to_bytes().unwrap();
    assert_eq!(bytes.len(), MAX_NOTIFICATION_FRAME_LEN);
    assert_eq!(decode_exact(&bytes).unwrap().0, f);
    let e = Frame::from(Notification {
        notification_id: 1,
        payload: vec![9; MAX_NOTIFICATION_LEN + 1],
    })
    .to_bytes()
    .unwrap_err();
    assert_eq!(e.field, "payload");
    let e = expect_field_error(
        FrameType::NOTIFICATION,
        8,
        &(MAX_NOTIFICATION_LEN as u32 + 1).to_be_bytes(),
        "payload",
    );
    assert!(matches!(
        e.problem,
        Problem::TooLong {
            len: 1_048_577,
            max: 1_048_576
        }
    ));
    // The header bounds the body before any of it is read.
    let mut head = bytes[..HEADER_LEN].to_vec();
    head[8..12].copy_from_slice(&(max_body_len(FrameType::NOTIFICATION) + 1).to_be_bytes());
    let e = FrameHeader::decode(head.as_slice().try_into().unwrap()).unwrap_err();
    assert_eq!(e.field, "header.body_len");
}

#[test]
fn a_notification_answer_is_a_fixed_18_byte_body() {
    let a = NotificationAnswer {
        notification_id: 9,
        verdict: NotificationVerdict::BYTES_FULL,
        limit: 16 << 20,
    };
    let bytes = Frame::from(a).to_bytes().unwrap();
    assert_eq!(bytes.len(), HEADER_LEN + NOTIFICATION_ANSWER_LEN);
    assert_eq!(
        decode_exact(&bytes).unwrap().0,
        Frame::NotificationAnswer(a)
    );
    assert_eq!(
        max_body_len(FrameType::NOTIFICATION_ANSWER) as usize,
        NOTIFICATION_ANSWER_LEN
    );
    assert!(!NotificationVerdict(7).is_queued());
    assert_eq!(NotificationVerdict::INBOX_FULL.to_string(), "inbox-full");
}

#[test]
fn malformed_fields_are_named() {
    // hello: epoch 0.
    let e = expect_field_error(FrameType::HELLO, 2, &[0; 8], "identity.epoch");
    assert_eq!(e.problem, Problem::Empty);
    // hello: empty source id (length byte at 18) -> following bytes shift,
    // but the id itself is the first error.
    let e = expect_field_error(FrameType::HELLO, 18, &[0], "identity.source_id");
    assert_eq!(e.problem, Problem::Empty);
    // hello: source id not utf-8.
    let e = expect_field_error(FrameType::HELLO, 19, &[0xff], "identity.source_id");
    assert_eq!(e.problem, Problem::InvalidUtf8);
    // hello: proof tag 2 (source id "prefill-0" is 9 bytes: 19 + 9 + 32,
    // then the purpose byte).
    let e = expect_field_error(FrameType::HELLO, 61, &[2], "proof");
    assert_eq!(e.problem, Problem::InvalidTag { tag: 2 });
    // connect-request: qpn above 24 bits (connect_id 8, count 1, target 2, nic 2).
    let e = expect_field_error(FrameType::CONNECT_REQUEST, 13, &[1, 0, 0, 0], "rail.qpn");
    assert!(matches!(e.problem, Problem::OutOfRange { .. }));
    // connect-request: mtu 1500 (qpn 4, psn 4 after).
    let e = expect_field_error(
        FrameType::CONNECT_REQUEST,
        21,
        &1500u16.to_be_bytes(),
        "rail.mtu",
    );
    assert!(matches!(e.problem, Problem::OutOfRange { value: 1500, .. }));
    // connect-request: no rails.
    let mut b = b"OBTE\x00\x03\x00\x20\x00\x00\x00\x09".to_vec();
    b.extend_from_slice(&[0; 9]);
    let e = decode(&b).unwrap_err();
    assert_eq!((e.field, e.problem), ("rails", Problem::Empty));
    // read-request: length above the payload bound.
    let e = expect_field_error(
        FrameType::READ_REQUEST,
        32,
        &(MAX_PAYLOAD_LEN + 1).to_be_bytes(),
        "length",
    );
    assert!(matches!(e.problem, Problem::TooLong { .. }));
    // read-request: offset + length overflows.
    let e = expect_field_error(FrameType::READ_REQUEST, 24, &[0xff; 8], "length");
    assert!(matches!(e.problem, Problem::Inconsistent { .. }));
    // write-response: failed status with a length.
    let e = expect_field_error(
        FrameType::WRITE_RESPONSE,
        24,
        &Status::BAD_TOKEN.0.to_be_bytes(),
        "length",
    );
    assert!(matches!(e.problem, Problem::Inconsistent { .. }));
    // goodbye: message length above 1024.
    let e = expect_field_error(FrameType::GOODBYE, 2, &2000u16.to_be_bytes(), "message");
    assert!(matches!(e.problem, Problem::TooLong { .. }));
    // retire: epoch 0.
    let e = expect_field_error(FrameType::SEGMENT_RETIRE, 0, &[0; 8], "epoch");
    assert_eq!(e.problem, Problem::Empty);
    // retire: duplicate id.
    let e = expect_field_error(
        FrameType::SEGMENT_RETIRE,
        18,
        &1u64.to_be_bytes(),
        "range_ids",
    );
    assert_eq!(e.problem, Problem::Duplicate { value: 1 });
}

#[test]
fn malformed_publications_are_named() {
    let good = SegmentPublication {
        epoch: epoch(3),
        ranges: vec![range(1, 2, true)],
    };
    let base = Frame::from(good.clone()).to_bytes().unwrap();
    let range_at = HEADER_LEN + 8 + 2;
    let patch = |off: usize, bytes: &[u8]| {
        let mut b = base.clone();
        b[range_at + off..range_at + off + bytes.len()].copy_from_slice(bytes);
        decode(&b).unwrap_err()
    };
    // length 0
    let e = patch(16, &[0; 8]);
    assert_eq!((e.field, e.problem), ("range.length", Problem::Empty));
    // address + length overflow
    let e = patch(8, &[0xff; 8]);
    assert_eq!(e.field, "range.length");
    // rkey count above the maximum
    let e = patch(36, &[65]);
    assert!(matches!(e.problem, Problem::TooMany { count: 65, max: 64 }));
    // duplicate NIC: second rkey's nic_id = first's (0)
    let e = patch(37 + 24, &[0, 0]);
    assert_eq!(
        (e.field, e.problem),
        ("range.rkey.nic_id", Problem::Duplicate { value: 0 })
    );
    // local tag 3
    let e = patch(37 + 48, &[3]);
    assert_eq!(e.problem, Problem::InvalidTag { tag: 3 });
    // duplicate range ids
    let dup = SegmentPublication {
        epoch: epoch(3),
        ranges: vec![range(1, 0, false), range(1, 0, false)],
    };
    let e = Frame::from(dup).to_bytes().unwrap_err();
    assert_eq!(e.problem, Problem::Duplicate { value: 1 });
}

#[test]
fn encoder_rejects_what_the_decoder_rejects_and_leaves_the_buffer() {
    let mut out = vec![1, 2, 3];
    let too_long = Frame::from(ReadRequest {
        request_id: RequestId(1),
        range_id: RangeId(1),
        token: AccessToken(1),
        offset: 0,
        length: MAX_PAYLOAD_LEN + 1,
    });
    let e = too_long.encode(&mut out).unwrap_err();
    assert_eq!(e.field, "length");
    assert_eq!(out, [1, 2, 3]);
    let too_many = Frame::from(SegmentRetire {
        epoch: epoch(1),
        range_ids: (0..=MAX_RANGES_PER_FRAME as u64).map(RangeId).collect(),
    });
    assert!(matches!(
        too_many.encode(&mut out).unwrap_err().problem,
        Problem::TooMany { .. }
    ));
    assert_eq!(out, [1, 2, 3]);
    let wrong_payload = Frame::from(WriteRequest {
        request_id: RequestId(1),
        range_id: RangeId(1),
        token: AccessToken(1),
        offset: 0,
        length: 10,
    });
    assert!(
        wrong_payload
            .encode_with_payload(&[0; 9], &mut out)
            .is_err()
    );
    assert_eq!(out, [1, 2, 3]);
}

#[test]
fn the_largest_legal_publication_fits_the_control_bound() {
    let big_range = |id: u64| {
        let mut r = range(id, MAX_RKEYS_PER_RANGE as u16, true);
        r.local.as_mut().unwrap().host_id = HostId::new("h".repeat(255)).unwrap();
        r
    };
    let p = SegmentPublication {
        epoch: epoch(1),
        ranges: (0..MAX_RANGES_PER_FRAME as u64).map(big_range).collect(),
    };
    let bytes = Frame::from(p.clone()).to_bytes().unwrap();
    assert!(bytes.len() - HEADER_LEN <= MAX_CONTROL_BODY_LEN as usize);
    assert_eq!(
        decode_exact(&bytes).unwrap().0,
        Frame::SegmentPublication(p)
    );
}

#[test]
fn wire_enums_keep_unknown_values() {
    let mut b = sample_bytes(FrameType::ERROR);
    b[HEADER_LEN..HEADER_LEN + 2].copy_from_slice(&0x4242u16.to_be_bytes());
    let (f, _) = decode_exact(&b).unwrap();
    let Frame::Error(e) = f else {
        panic!("not an error frame")
    };
    assert_eq!(e.code, ErrorCode(0x4242));
    assert_eq!(e.code.to_string(), "unknown(16962)");
    assert_eq!(ErrorCode::STALE_EPOCH.to_string(), "stale-epoch");
    // And they re-encode unchanged.
    assert_eq!(Frame::Error(e).to_bytes().unwrap(), b);
}

#[test]
fn error_frame_from_a_decode_error() {
    let mut b = sample_bytes(FrameType::HELLO);
    b[4..6].copy_from_slice(&4u16.to_be_bytes());
    let e = decode(&b).unwrap_err();
    let f = ErrorFrame::from_decode_error(&e);
    assert_eq!(f.code, ErrorCode::UNSUPPORTED_VERSION);
    assert_eq!(f.frame_type, FrameType::HELLO);
    assert!(f.message.as_str().contains("version 4"));
    Frame::from(f).to_bytes().unwrap();
}

#[test]
fn decoded_elements_hold_at_most_four_times_their_minimum_wire_size() {
    // The decoder reserves list capacity only for `count` elements whose
    // minimum wire size fits the bytes left, so these ratios bound the heap
    // a decoded frame holds (docs/protocol.md, "Bounds").
    use std::mem::size_of;
    assert!(
        size_of::<RangeDescriptor>() <= 4 * 38,
        "{}",
        size_of::<RangeDescriptor>()
    );
    assert!(size_of::<NicRkey>() <= 4 * 24);
    assert!(size_of::<RailRequest>() <= 4 * 32);
    assert!(size_of::<RailEndpoint>() <= 4 * 30);
    assert!(size_of::<RangeId>() <= 4 * 8);
}

#[test]
fn code_tables_are_stable() {
    // docs/protocol.md, "Code tables": values are never renumbered.
    let frame_types: Vec<(u16, &str)> = FrameType::ALL
        .iter()
        .map(|t| (t.0, t.name().unwrap()))
        .collect();
    assert_eq!(
        frame_types,
        [
            (0x0001, "challenge"),
            (0x0002, "hello"),
            (0x0003, "hello-ack"),
            (0x0004, "goodbye"),
            (0x0005, "error"),
            (0x0010, "segment-publication"),
            (0x0011, "segment-retire"),
            (0x0020, "connect-request"),
            (0x0021, "connect-accept"),
            (0x0022, "connect-reject"),
            (0x0030, "read-request"),
            (0x0031, "read-response"),
            (0x0032, "write-request"),
            (0x0033, "write-response"),
            (0x0034, "notification"),
            (0x0035, "notification-answer"),
        ]
    );
    let errors: Vec<String> = (1..=16).map(|c| ErrorCode(c).to_string()).collect();
    assert_eq!(
        errors,
        [
            "malformed-frame",
            "unsupported-version",
            "unknown-frame-type",
            "unexpected-frame",
            "frame-too-large",
            "not-orbitte",
            "auth-required",
            "auth-failed",
            "stale-epoch",
            "source-conflict",
            "resource-exhausted",
            "shutting-down",
            "no-usable-rail",
            "unknown-nic",
            "timeout",
            "internal",
        ]
    );
    let statuses: Vec<String> = (0..=7).map(|c| Status(c).to_string()).collect();
    assert_eq!(
        statuses,
        [
            "ok",
            "unknown-range",
            "bad-token",
            "out-of-bounds",
            "access-denied",
            "retired",
            "busy",
            "internal"
        ]
    );
    let reasons: Vec<String> = (0..=3).map(|c| GoodbyeReason(c).to_string()).collect();
    assert_eq!(reasons, ["normal", "shutdown", "restart", "idle"]);
    assert_eq!(Capabilities::RDMA.0, 1);
    assert_eq!(Capabilities::TCP.0, 2);
    assert_eq!(Capabilities::LOCAL.0, 4);
    assert_eq!(Capabilities::CUDA_STAGING.0, 8);
    assert_eq!(AccessFlags::LOCAL_WRITE.0, 1);
    assert_eq!(AccessFlags::REMOTE_READ.0, 2);
    assert_eq!(AccessFlags::REMOTE_WRITE.0, 4);
    assert_eq!(LocalMechanism::MEMFD.0, 1);
    assert_eq!((MAGIC, PROTOCOL_VERSION), (*b"OBTE", 3));
    assert_eq!((MAX_CONTROL_BODY_LEN, MAX_PAYLOAD_LEN), (4 << 20, 16 << 20));
}

#[test]
fn other_engines_bytes_are_not_orbitte() {
    // An HTTP probe, a TLS ClientHello, zeros: rejected on the magic.
    for bytes in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[0x16, 0x03, 0x01, 0x02, 0x00][..],
        &[0; 16][..],
    ] {
        let e = decode(bytes).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::NOT_ORBITTE, "{e}");
    }
}
