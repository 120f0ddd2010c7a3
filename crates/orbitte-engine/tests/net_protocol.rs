//! The tcp path follows docs/protocol.md where a second implementation
//! would: either side publishes and retires after the handshake, and
//! answers are matched to requests by request id, in any order.
#![forbid(unsafe_code)]

mod net_support;

use std::net::TcpListener;
use std::time::Duration;

use net_support::{Initiator, RW, Target, cfg, pattern, raw, request};
use orbitte_engine::outcome::Status;
use orbitte_engine::transport::{Op, PeerId};
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;
use orbitte_wire::{
    AccessToken, Capabilities, Challenge, Epoch, ErrorCode, Frame, HelloAck, Identity, Nonce,
    RangeDescriptor, RangeId, ReadRequest, ReadResponse, RequestId, SegmentPublication,
    SegmentRetire, SourceId, Status as WireStatus,
};

const BOUND: Duration = Duration::from_secs(30);

#[test]
fn the_target_accepts_publications_and_retires_of_the_session_epoch() {
    net_support::logs();
    let t = Target::start(cfg("target", 1));
    let mem = HostMemory::alloc(1 << 20).unwrap();
    pattern(&mem, 9);
    let range = t.ranges.publish(mem.clone(), RW).unwrap();
    let (mut s, publication) = raw::handshake(t.addr(), "publisher", 4, None);
    let Frame::SegmentPublication(p) = publication else {
        panic!("{publication:?}")
    };
    let epoch = Epoch::new(4).unwrap();
    raw::send(
        &mut s,
        &Frame::SegmentPublication(SegmentPublication {
            epoch,
            ranges: Vec::new(),
        }),
    );
    raw::send(
        &mut s,
        &Frame::SegmentRetire(SegmentRetire {
            epoch,
            range_ids: vec![RangeId(77)],
        }),
    );
    // The session goes on: a READ after them is answered.
    raw::send(
        &mut s,
        &Frame::ReadRequest(ReadRequest {
            request_id: RequestId(5),
            range_id: range,
            token: p.ranges[0].token,
            offset: 0,
            length: 4096,
        }),
    );
    match raw::read_frame(&mut s).unwrap() {
        Frame::ReadResponse(r) => {
            assert_eq!(r.request_id, RequestId(5));
            assert_eq!(r.status, WireStatus::OK);
        }
        other => panic!("expected the read answer, got {other:?}"),
    }
    // A publication naming another epoch than the session's is refused.
    raw::send(
        &mut s,
        &Frame::SegmentPublication(SegmentPublication {
            epoch: Epoch::new(3).unwrap(),
            ranges: Vec::new(),
        }),
    );
    let frames = raw::read_until_closed(&mut s);
    assert!(
        frames
            .iter()
            .any(|f| matches!(f, Frame::Error(e) if e.code == ErrorCode::STALE_EPOCH)),
        "{frames:?}"
    );
}

/// A responder written from the document: it answers the two READs it
/// receives in reverse order.
fn reversing_target(listener: TcpListener, payload: [u8; 2], done: std::sync::mpsc::Receiver<()>) {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    raw::send(
        &mut s,
        &Frame::Challenge(Challenge {
            nonce: Nonce([1; 32]),
        }),
    );
    let Frame::Hello(_) = raw::read_frame(&mut s).unwrap() else {
        panic!("no hello")
    };
    raw::send(
        &mut s,
        &Frame::HelloAck(HelloAck {
            identity: Identity::new(
                SourceId::new("reverser").unwrap(),
                Epoch::new(1).unwrap(),
                Capabilities::TCP,
            ),
            proof: None,
        }),
    );
    raw::send(
        &mut s,
        &Frame::SegmentPublication(SegmentPublication {
            epoch: Epoch::new(1).unwrap(),
            ranges: vec![RangeDescriptor {
                range_id: RangeId(1),
                address: 0,
                length: 1 << 20,
                access: RW,
                token: AccessToken(42),
                rkeys: Vec::new(),
                local: None,
            }],
        }),
    );
    let mut asked = Vec::new();
    while asked.len() < 2 {
        match raw::read_frame(&mut s).unwrap() {
            Frame::ReadRequest(r) => asked.push(r),
            other => panic!("{other:?}"),
        }
    }
    for r in asked.iter().rev() {
        let fill = if r.offset == 0 {
            payload[0]
        } else {
            payload[1]
        };
        let answer = Frame::ReadResponse(ReadResponse {
            request_id: r.request_id,
            range_id: r.range_id,
            offset: r.offset,
            status: WireStatus::OK,
            length: r.length,
        });
        let mut bytes = Vec::new();
        answer
            .encode_with_payload(&vec![fill; r.length as usize], &mut bytes)
            .unwrap();
        std::io::Write::write_all(&mut s, &bytes).unwrap();
    }
    // Hold the session until the initiator has checked its bytes.
    let _ = done.recv_timeout(BOUND);
}

#[test]
fn the_initiator_matches_answers_that_arrive_in_any_order() {
    net_support::logs();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (done, wait) = std::sync::mpsc::channel();
    let target = std::thread::spawn(move || reversing_target(listener, [0xa1, 0xb2], wait));
    let i = Initiator::new(cfg("initiator", 1), CoreConfig::default());
    let local = HostMemory::alloc(128 << 10).unwrap();
    let reg = i.driver.register(local.clone());
    let (rails, _) = i.connect_tcp(PeerId(1), addr, 1).unwrap();
    let slice = 64 << 10;
    let ids = i.driver.submit(vec![
        request(1, Op::Read, reg, 0, PeerId(1), 1, 0, slice, &rails),
        request(2, Op::Read, reg, slice, PeerId(1), 1, slice, slice, &rails),
    ]);
    for id in ids {
        let o = i.driver.wait(id, BOUND);
        assert_eq!(o.status, Status::Complete, "{o:?}");
    }
    // Each request got the bytes of its own answer (compared whole, shown
    // by the first byte that differs).
    for (at, want) in [(0, 0xa1u8), (64 << 10, 0xb2)] {
        let got = local.to_vec(at, 64 << 10).unwrap();
        let wrong = got.iter().position(|b| *b != want);
        assert_eq!(
            wrong,
            None,
            "at {at}: byte {wrong:?} is {:?}, not {want:#x}",
            wrong.map(|w| got[w])
        );
    }
    done.send(()).unwrap();
    drop(i);
    target.join().unwrap();
}
