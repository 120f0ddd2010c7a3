//! The tcp target serves its sessions on its I/O loops without ever
//! waiting for one peer: answers it holds go out before it waits for a
//! payload, and a peer that stops reading its answers is cut off after
//! `io_timeout` while the loop keeps serving the other sessions.
#![forbid(unsafe_code)]

mod net_support;

use std::io::Write;
use std::time::Duration;

use net_support::{RW, Target, cfg, pattern, raw};
use orbitte_memory::HostMemory;
use orbitte_wire::{Frame, ReadRequest, RequestId, Status, WriteRequest};

/// A peer that sends a WRITE whole and the next one's header and half its
/// payload, then waits for the first one's answer before it sends the
/// rest: the target sent it before waiting for the payload.
#[test]
fn answers_held_go_out_before_a_payload_waits_for_the_peer() {
    net_support::logs();
    let t = Target::start(cfg("held-target", 1));
    let mem = HostMemory::alloc(1 << 16).unwrap();
    let range = t.ranges.publish(mem.clone(), RW).unwrap();
    let (mut s, publication) = raw::handshake(t.addr(), "held-peer", 1, None);
    let Frame::SegmentPublication(p) = publication else {
        panic!("{publication:?}")
    };
    let token = p.ranges[0].token;
    let write = |id: u64, offset: u64| {
        let mut b = Vec::new();
        Frame::WriteRequest(WriteRequest {
            request_id: RequestId(id),
            range_id: range,
            token,
            offset,
            length: 4096,
        })
        .encode(&mut b)
        .unwrap();
        b
    };
    let mut bytes = write(1, 0);
    bytes.extend_from_slice(&[1u8; 4096]);
    bytes.extend_from_slice(&write(2, 4096));
    bytes.extend_from_slice(&[2u8; 2048]);
    s.write_all(&bytes).unwrap();
    // The read times out (failing the test) if the answer was held.
    match raw::read_frame(&mut s).unwrap() {
        Frame::WriteResponse(w) => {
            assert_eq!((w.request_id, w.status), (RequestId(1), Status::OK));
        }
        other => panic!("{other:?}"),
    }
    s.write_all(&[2u8; 2048]).unwrap();
    match raw::read_frame(&mut s).unwrap() {
        Frame::WriteResponse(w) => {
            assert_eq!((w.request_id, w.status), (RequestId(2), Status::OK));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(mem.to_vec(0, 4096).unwrap(), vec![1u8; 4096]);
    assert_eq!(mem.to_vec(4096, 4096).unwrap(), vec![2u8; 4096]);
}

/// A peer that sends READs and never reads their answers: the target's
/// one I/O loop keeps serving another peer meanwhile, and the stalled
/// session is closed once an answer has waited `io_timeout`.
#[test]
fn a_peer_that_stops_reading_is_cut_off_and_never_holds_the_loop() {
    net_support::logs();
    let mut c = cfg("stall-target", 1);
    c.io_threads = 1;
    c.io_timeout = Duration::from_secs(3);
    let t = Target::start(c);
    let mem = HostMemory::alloc(1 << 20).unwrap();
    pattern(&mem, 4);
    let range = t.ranges.publish(mem.clone(), RW).unwrap();
    let (mut stalled, publication) = raw::handshake(t.addr(), "stalled-peer", 1, None);
    let Frame::SegmentPublication(p) = publication else {
        panic!("{publication:?}")
    };
    let token = p.ranges[0].token;
    let mut reads = Vec::new();
    for k in 0..64 {
        Frame::ReadRequest(ReadRequest {
            request_id: RequestId(k),
            range_id: range,
            token,
            offset: 0,
            length: 1 << 20,
        })
        .encode(&mut reads)
        .unwrap();
    }
    // 64 MiB of answers: far more than the socket buffers hold.
    stalled.write_all(&reads).unwrap();
    // Another peer on the same loop is served while the first stalls.
    for _ in 0..3 {
        net_support::legitimate_read(&t, "served-peer", 1, range.0, &mem);
    }
    assert!(
        !t.listener
            .closed_sessions()
            .iter()
            .any(|c| c.reason.contains("peer stalled")),
        "served before the stalled session's answer ran out of time"
    );
    let closed = (0..400)
        .find_map(|_| {
            let c = t
                .listener
                .closed_sessions()
                .into_iter()
                .find(|c| c.reason.contains("peer stalled"));
            if c.is_none() {
                std::thread::sleep(Duration::from_millis(25));
            }
            c
        })
        .unwrap_or_else(|| panic!("no stall: {:?}", t.listener.closed_sessions()));
    assert!(closed.abnormal, "{closed:?}");
    assert!(closed.reason.contains("3s"), "{closed:?}");
    drop(stalled);
}

/// A WRITE's payload that pauses before its last bytes, then a small READ:
/// the target, which waits for a payload's rest with a receive mark, is
/// woken by the last bytes and then by the READ's few bytes. (The kernel
/// also wakes a socket below its mark when the receive window runs short
/// or the send side frees, so this guards the path against a stall; the
/// mark's values are `serve::receive_mark`'s unit test.)
#[test]
fn a_payload_paused_before_its_last_bytes_completes_and_the_next_request_is_served() {
    net_support::logs();
    const LEN: usize = 1 << 20;
    const LAST: usize = 1000;
    let t = Target::start(cfg("mark-target", 1));
    let mem = HostMemory::alloc(LEN).unwrap();
    pattern(&mem, 3);
    let range = t.ranges.publish(mem.clone(), RW).unwrap();
    let (mut s, publication) = raw::handshake(t.addr(), "mark-peer", 1, None);
    // A session left waiting fails here, well before the target's
    // io_timeout would close it.
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let Frame::SegmentPublication(p) = publication else {
        panic!("{publication:?}")
    };
    let token = p.ranges[0].token;
    let mut bytes = Vec::new();
    Frame::WriteRequest(WriteRequest {
        request_id: RequestId(1),
        range_id: range,
        token,
        offset: 0,
        length: LEN as u32,
    })
    .encode(&mut bytes)
    .unwrap();
    let payload: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    bytes.extend_from_slice(&payload[..LEN - LAST]);
    s.write_all(&bytes).unwrap();
    // The target reads what came and waits for the rest.
    std::thread::sleep(Duration::from_millis(200));
    s.write_all(&payload[LEN - LAST..]).unwrap();
    match raw::read_frame(&mut s).unwrap() {
        Frame::WriteResponse(w) => {
            assert_eq!((w.request_id, w.status), (RequestId(1), Status::OK));
        }
        other => panic!("{other:?}"),
    }
    assert!(mem.to_vec(0, LEN).unwrap() == payload, "the payload landed");
    let mut read = Vec::new();
    Frame::ReadRequest(ReadRequest {
        request_id: RequestId(2),
        range_id: range,
        token,
        offset: 0,
        length: 16,
    })
    .encode(&mut read)
    .unwrap();
    s.write_all(&read).unwrap();
    match raw::read_frame(&mut s).unwrap() {
        Frame::ReadResponse(r) => {
            assert_eq!((r.request_id, r.status), (RequestId(2), Status::OK));
        }
        other => panic!("{other:?}"),
    }
}

/// READ requests that arrive together are answered in order, each with
/// its own status and its own bytes: refused ones in the middle of a run
/// (a wrong token, a range past the memory's end) answer with their
/// status and no payload, and the answers around them carry exactly the
/// bytes they asked for, whatever the target gathers into one send.
#[test]
fn reads_sent_together_are_answered_in_order_with_refusals_between() {
    use orbitte_wire::AccessToken;
    net_support::logs();
    let t = Target::start(cfg("gather-target", 1));
    let mem = HostMemory::alloc(1 << 20).unwrap();
    pattern(&mem, 7);
    let range = t.ranges.publish(mem.clone(), RW).unwrap();
    let (mut s, publication) = raw::handshake(t.addr(), "gather-peer", 1, None);
    let Frame::SegmentPublication(p) = publication else {
        panic!("{publication:?}")
    };
    let token = p.ranges[0].token;
    // (id, token, offset, length, expected status)
    let asks: Vec<(u64, AccessToken, u64, u32, Status)> = (1..=40u64)
        .map(|id| {
            let offset = (id * 20_011) % (1 << 19);
            let length = [4096u32, 65_536, 1000, 131_072][id as usize % 4];
            match id {
                7 | 23 => (
                    id,
                    AccessToken(token.0 ^ 1),
                    offset,
                    length,
                    Status::BAD_TOKEN,
                ),
                12 | 31 => (id, token, (1 << 20) - 10, 4096, Status::OUT_OF_BOUNDS),
                _ => (id, token, offset, length, Status::OK),
            }
        })
        .collect();
    let mut bytes = Vec::new();
    for &(id, tok, offset, length, _) in &asks {
        Frame::ReadRequest(ReadRequest {
            request_id: RequestId(id),
            range_id: range,
            token: tok,
            offset,
            length,
        })
        .encode(&mut bytes)
        .unwrap();
    }
    s.write_all(&bytes).unwrap();
    for &(id, _, offset, length, status) in &asks {
        let mut h = [0u8; orbitte_wire::HEADER_LEN];
        std::io::Read::read_exact(&mut s, &mut h).unwrap();
        let h = orbitte_wire::FrameHeader::decode(&h).unwrap();
        let mut body = vec![0u8; h.fixed_len()];
        std::io::Read::read_exact(&mut s, &mut body).unwrap();
        let Frame::ReadResponse(r) = orbitte_wire::decode_body(&h, &body).unwrap() else {
            panic!("request {id}: not a READ answer")
        };
        assert_eq!(
            (r.request_id, r.status),
            (RequestId(id), status),
            "request {id}"
        );
        let mut payload = vec![0u8; h.payload_len() as usize];
        std::io::Read::read_exact(&mut s, &mut payload).unwrap();
        if status == Status::OK {
            assert_eq!(r.length, length, "request {id}");
            assert!(
                payload == mem.to_vec(offset as usize, length as usize).unwrap(),
                "request {id}: the payload is not the range's bytes"
            );
        } else {
            assert!(
                payload.is_empty(),
                "request {id}: a refusal carries no payload"
            );
        }
    }
}
