//! Per-type body bounds: a header announcing more than its frame type can
//! legally hold is refused before any body byte is read, and the largest
//! legal frame of every bounded type still fits its bound.
#![forbid(unsafe_code)]

mod common;

use common::{endpoint, samples, source};
use orbitte_wire::*;

fn header(frame_type: FrameType, body_len: u32) -> [u8; HEADER_LEN] {
    FrameHeader {
        version: PROTOCOL_VERSION,
        frame_type,
        body_len,
    }
    .encode()
}

#[test]
fn handshake_headers_announcing_more_than_their_bound_are_refused() {
    for t in [
        FrameType::CHALLENGE,
        FrameType::HELLO,
        FrameType::HELLO_ACK,
        FrameType::GOODBYE,
        FrameType::ERROR,
        FrameType::CONNECT_REQUEST,
        FrameType::CONNECT_ACCEPT,
        FrameType::CONNECT_REJECT,
    ] {
        assert_eq!(max_body_len(t), MAX_SMALL_BODY_LEN, "{t}");
        // What a peer that never authenticated may announce: 4 MiB.
        let e = FrameHeader::decode(&header(t, MAX_CONTROL_BODY_LEN)).unwrap_err();
        assert_eq!(e.field, "header.body_len", "{t}: {e}");
        assert_eq!(
            e.problem,
            Problem::TooLong {
                len: MAX_CONTROL_BODY_LEN.into(),
                max: MAX_SMALL_BODY_LEN.into(),
            },
            "{t}"
        );
        assert_eq!(e.error_code(), ErrorCode::FRAME_TOO_LARGE, "{t}");
        let e = FrameHeader::decode(&header(t, MAX_SMALL_BODY_LEN + 1)).unwrap_err();
        assert_eq!(e.field, "header.body_len", "{t}");
        FrameHeader::decode(&header(t, MAX_SMALL_BODY_LEN)).unwrap();
    }
}

#[test]
fn fixed_size_frames_accept_only_their_length() {
    for (t, len) in [
        (FrameType::READ_REQUEST, READ_REQUEST_LEN),
        (FrameType::WRITE_RESPONSE, WRITE_RESPONSE_LEN),
    ] {
        FrameHeader::decode(&header(t, len as u32)).unwrap();
        let e = FrameHeader::decode(&header(t, len as u32 + 1)).unwrap_err();
        assert_eq!(e.field, "header.body_len", "{t}");
    }
    let e = FrameHeader::decode(&header(FrameType::SEGMENT_RETIRE, MAX_RETIRE_BODY_LEN + 1))
        .unwrap_err();
    assert_eq!(e.field, "header.body_len");
    FrameHeader::decode(&header(
        FrameType::SEGMENT_PUBLICATION,
        MAX_CONTROL_BODY_LEN,
    ))
    .unwrap();
}

fn roundtrip_within_bound(f: &Frame) -> usize {
    let bytes = f.to_bytes().unwrap();
    let h = FrameHeader::decode(bytes.first_chunk().unwrap()).unwrap();
    assert!(h.body_len <= max_body_len(h.frame_type));
    assert_eq!(&decode_exact(&bytes).unwrap().0, f);
    h.body_len as usize
}

#[test]
fn the_largest_legal_frames_fit_their_bounds() {
    let long_id = source(&"s".repeat(255));
    let long_message = Message::new("m".repeat(Message::MAX_LEN)).unwrap();
    let mut checked = 0;
    for (f, _) in samples() {
        let f = match f {
            Frame::Hello(mut h) => {
                h.identity.source_id = long_id.clone();
                h.proof = Some(AuthTag([3; 32]));
                Frame::Hello(h)
            }
            Frame::HelloAck(mut h) => {
                h.identity.source_id = long_id.clone();
                h.proof = Some(AuthTag([3; 32]));
                Frame::HelloAck(h)
            }
            Frame::Error(mut e) => {
                e.message = long_message.clone();
                Frame::Error(e)
            }
            Frame::Goodbye(mut g) => {
                g.message = long_message.clone();
                Frame::Goodbye(g)
            }
            Frame::ConnectReject(mut r) => {
                r.message = long_message.clone();
                Frame::ConnectReject(r)
            }
            Frame::ConnectRequest(mut r) => {
                r.rails = (0..MAX_RAILS as u16)
                    .map(|n| RailRequest {
                        target_nic: NicId(n),
                        endpoint: endpoint(n, 1 + u32::from(n)),
                    })
                    .collect();
                Frame::ConnectRequest(r)
            }
            Frame::ConnectAccept(mut a) => {
                a.rails = (0..MAX_RAILS as u16)
                    .map(|n| endpoint(n, 1 + u32::from(n)))
                    .collect();
                Frame::ConnectAccept(a)
            }
            Frame::SegmentRetire(mut r) => {
                r.range_ids = (0..MAX_RANGES_PER_FRAME as u64).map(RangeId).collect();
                Frame::SegmentRetire(r)
            }
            _ => continue,
        };
        let len = roundtrip_within_bound(&f);
        if let Frame::Hello(_) = f {
            // A real hello is a few hundred bytes: the bound leaves room.
            assert!(len < 512, "{len}");
        }
        checked += 1;
    }
    assert!(checked >= 8, "samples lack some bounded frame types");
}
