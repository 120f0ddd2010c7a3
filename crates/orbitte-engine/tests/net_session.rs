//! Bad input on sessions: garbage, truncated frames, silent peers, floods,
//! frames out of order, connection limits. Each is closed with a logged
//! reason within a bound, memory stays untouched, other sessions keep
//! working.
#![forbid(unsafe_code)]

mod net_support;

use std::io::Write;
use std::time::Duration;

use net_support::{Initiator, RW, Target, cfg, pattern, raw, untouched};
use orbitte_engine::session::SessionError;
use orbitte_engine::transport::PeerId;
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;
use orbitte_wire::{AccessToken, ErrorCode, Frame, RangeId, ReadRequest, RequestId, WriteRequest};

fn strict_target() -> (Target, std::sync::Arc<HostMemory>, RangeId) {
    net_support::logs();
    let mut c = cfg("target", 1);
    c.handshake_timeout = Duration::from_millis(300);
    c.frame_timeout = Duration::from_millis(300);
    c.io_timeout = Duration::from_millis(500);
    c.max_connections_per_source = 2;
    let t = Target::start(c);
    let mem = HostMemory::alloc(1 << 20).unwrap();
    pattern(&mem, 5);
    let id = t.ranges.publish(mem.clone(), RW).unwrap();
    (t, mem, id)
}

fn error_code(frames: &[Frame]) -> Option<ErrorCode> {
    frames.iter().find_map(|f| match f {
        Frame::Error(e) => Some(e.code),
        _ => None,
    })
}

/// Waits (bounded) until the listener recorded a close whose reason
/// contains `needle`.
fn closed_with(t: &Target, needle: &str) -> String {
    for _ in 0..400 {
        if let Some(c) = t
            .listener
            .closed_sessions()
            .into_iter()
            .find(|c| c.reason.contains(needle))
        {
            assert!(c.abnormal, "{c:?}");
            return c.reason;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!(
        "no close with {needle:?}: {:?}",
        t.listener.closed_sessions()
    );
}

/// A legitimate initiator still gets its bytes.
fn others_keep_working(t: &Target, range: RangeId, mem: &HostMemory) {
    net_support::legitimate_read(t, "good", 1, range.0, mem);
}

#[test]
fn a_peer_that_connects_and_says_nothing_is_closed_within_the_handshake_bound() {
    let (t, mem, range) = strict_target();
    let mut s = raw::connect(t.addr());
    let frames = raw::read_until_closed(&mut s);
    assert!(
        matches!(frames.first(), Some(Frame::Challenge(_))),
        "{frames:?}"
    );
    assert_eq!(error_code(&frames), Some(ErrorCode::TIMEOUT));
    closed_with(&t, "did not send a hello");
    others_keep_working(&t, range, &mem);
    untouched(&mem, 5);
}

#[test]
fn garbage_bytes_close_the_session_with_a_reason() {
    let (t, mem, range) = strict_target();
    let mut s = raw::connect(t.addr());
    raw::read_frame(&mut s).unwrap(); // challenge
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let frames = raw::read_until_closed(&mut s);
    assert_eq!(error_code(&frames), Some(ErrorCode::NOT_ORBITTE));
    closed_with(&t, "bad magic");
    others_keep_working(&t, range, &mem);
    untouched(&mem, 5);
}

#[test]
fn a_data_request_instead_of_a_hello_is_refused_and_reads_nothing() {
    let (t, mem, range) = strict_target();
    let mut s = raw::connect(t.addr());
    raw::read_frame(&mut s).unwrap(); // challenge
    raw::send(
        &mut s,
        &Frame::ReadRequest(ReadRequest {
            request_id: RequestId(1),
            range_id: range,
            token: AccessToken(0),
            offset: 0,
            length: 4096,
        }),
    );
    let frames = raw::read_until_closed(&mut s);
    assert_eq!(error_code(&frames), Some(ErrorCode::UNEXPECTED_FRAME));
    assert!(!frames.iter().any(|f| matches!(f, Frame::ReadResponse(_))));
    closed_with(&t, "expected hello");
    untouched(&mem, 5);
}

#[test]
fn a_truncated_frame_after_the_handshake_is_cut_off_within_the_frame_bound() {
    let (t, mem, range) = strict_target();
    let (mut s, _) = raw::handshake(t.addr(), "trunc", 1, None);
    let mut buf = Vec::new();
    Frame::WriteRequest(WriteRequest {
        request_id: RequestId(1),
        range_id: range,
        token: AccessToken(0),
        offset: 0,
        length: 4096,
    })
    .encode(&mut buf)
    .unwrap();
    s.write_all(&buf[..20]).unwrap();
    let frames = raw::read_until_closed(&mut s);
    assert_eq!(error_code(&frames), Some(ErrorCode::TIMEOUT));
    closed_with(&t, "truncated frame");
    others_keep_working(&t, range, &mem);
    untouched(&mem, 5);
}

#[test]
fn a_malformed_body_closes_the_session() {
    let (t, mem, range) = strict_target();
    let (mut s, _) = raw::handshake(t.addr(), "malformed", 1, None);
    let mut buf = Vec::new();
    Frame::ReadRequest(ReadRequest {
        request_id: RequestId(1),
        range_id: range,
        token: AccessToken(0),
        offset: 0,
        length: 1,
    })
    .encode(&mut buf)
    .unwrap();
    // offset = u64::MAX so that offset + length overflows.
    let off = orbitte_wire::HEADER_LEN + 24;
    buf[off..off + 8].copy_from_slice(&u64::MAX.to_be_bytes());
    s.write_all(&buf).unwrap();
    let frames = raw::read_until_closed(&mut s);
    assert_eq!(error_code(&frames), Some(ErrorCode::MALFORMED_FRAME));
    closed_with(&t, "malformed frame");
    others_keep_working(&t, range, &mem);
    untouched(&mem, 5);
}

#[test]
fn a_flooding_peer_is_bounded_and_closed_while_others_keep_working() {
    let (t, mem, range) = strict_target();
    let (s, publication) = raw::handshake(t.addr(), "flood", 1, None);
    let Frame::SegmentPublication(p) = publication else {
        panic!()
    };
    let token = p.ranges[0].token;
    // Valid READs as fast as possible, never reading an answer, plus WRITEs
    // with a wrong token (their payload must be dropped, not written).
    let mut w = s.try_clone().unwrap();
    w.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let flooder = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let payload = vec![0xeeu8; 64 << 10];
        for n in 0..100_000u64 {
            buf.clear();
            let f = if n % 2 == 0 {
                Frame::ReadRequest(ReadRequest {
                    request_id: RequestId(n),
                    range_id: range,
                    token,
                    offset: 0,
                    length: 64 << 10,
                })
            } else {
                Frame::WriteRequest(WriteRequest {
                    request_id: RequestId(n),
                    range_id: range,
                    token: AccessToken(token.0 ^ 0xff),
                    offset: 0,
                    length: 64 << 10,
                })
            };
            f.encode(&mut buf).unwrap();
            if n % 2 == 1 {
                buf.extend_from_slice(&payload);
            }
            if w.write_all(&buf).is_err() {
                return n;
            }
        }
        100_000
    });
    // While the flood is held back, a legitimate peer is served.
    others_keep_working(&t, range, &mem);
    let reason = closed_with(&t, "stalled");
    let sent = flooder.join().unwrap();
    assert!(
        sent < 100_000,
        "the flood was never pushed back ({sent} requests sent)"
    );
    assert!(reason.contains("not reading answers"), "{reason}");
    untouched(&mem, 5);
    others_keep_working(&t, range, &mem);
}

#[test]
fn connections_beyond_the_per_source_bound_are_refused() {
    let (t, _mem, _range) = strict_target();
    let i = Initiator::new(cfg("greedy", 1), CoreConfig::default());
    let err = i.connect_tcp(PeerId(1), t.addr(), 3).unwrap_err();
    assert!(
        matches!(&err, SessionError::Refused { code, .. } if *code == ErrorCode::RESOURCE_EXHAUSTED),
        "{err:?}"
    );
    closed_with(&t, "too many connections from greedy");
}
