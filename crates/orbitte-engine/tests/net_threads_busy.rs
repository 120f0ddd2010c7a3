//! The target's threads do not grow with its busy peers either: every tcp
//! data session is served on the listener's fixed pool of I/O threads, so
//! the count is the same with 1, 100 and 1000 peers that keep writing and
//! reading while it is taken. This binary holds this one test, so
//! `/proc/self/task` counts the target's threads, the test's own thread
//! and the one thread that drives every raw peer.
#![forbid(unsafe_code)]

mod net_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use net_support::{eventually, raw, threads};
use orbitte_wire::{
    AccessToken, Frame, FrameHeader, HEADER_LEN, RangeId, ReadRequest, RequestId, Status,
    WriteRequest,
};

/// Bytes each peer writes and reads back per round.
const PIECE: u32 = 4096;

/// Reads one frame and its payload.
fn read_with_payload(s: &mut TcpStream) -> (Frame, Vec<u8>) {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = FrameHeader::decode(&h).unwrap();
    let mut body = vec![0u8; h.fixed_len()];
    s.read_exact(&mut body).unwrap();
    let f = orbitte_wire::decode_body(&h, &body).unwrap();
    let mut payload = vec![0u8; h.payload_len() as usize];
    s.read_exact(&mut payload).unwrap();
    (f, payload)
}

/// One round over every peer: each gets a WRITE of its own piece and a
/// READ of it sent before any answer is read (so all are served at once),
/// then the answers are read and checked.
fn round(peers: &mut [TcpStream], range: RangeId, token: AccessToken, n: u64) {
    let mut buf = Vec::new();
    for (k, s) in peers.iter_mut().enumerate() {
        let offset = k as u64 * u64::from(PIECE);
        let byte = (n as u8) ^ (k as u8);
        buf.clear();
        Frame::WriteRequest(WriteRequest {
            request_id: RequestId(2 * n),
            range_id: range,
            token,
            offset,
            length: PIECE,
        })
        .encode(&mut buf)
        .unwrap();
        buf.resize(buf.len() + PIECE as usize, byte);
        Frame::ReadRequest(ReadRequest {
            request_id: RequestId(2 * n + 1),
            range_id: range,
            token,
            offset,
            length: PIECE,
        })
        .encode(&mut buf)
        .unwrap();
        s.write_all(&buf).unwrap();
    }
    for (k, s) in peers.iter_mut().enumerate() {
        let byte = (n as u8) ^ (k as u8);
        match read_with_payload(s) {
            (Frame::WriteResponse(w), _) => {
                assert_eq!((w.status, w.length), (Status::OK, PIECE), "peer {k}");
            }
            other => panic!("peer {k}: {other:?}"),
        }
        match read_with_payload(s) {
            (Frame::ReadResponse(r), payload) => {
                assert_eq!((r.status, r.length), (Status::OK, PIECE), "peer {k}");
                assert!(payload.iter().all(|&b| b == byte), "peer {k} read back");
            }
            other => panic!("peer {k}: {other:?}"),
        }
    }
}

#[test]
fn the_targets_threads_are_the_same_with_1_100_and_1000_busy_peers() {
    net_support::logs();
    const MOST: usize = 1000;
    let Some((t, range)) =
        net_support::target_for_peers("busy-target", MOST, MOST * PIECE as usize)
    else {
        return;
    };

    // One thread drives every peer, round after round, from before the
    // count is first taken until the end.
    let (add, added) = crossbeam_channel::unbounded::<(TcpStream, AccessToken)>();
    let rounds = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let (rounds, stop) = (rounds.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut peers = Vec::new();
            let mut token = None;
            while !stop.load(Ordering::Acquire) {
                while let Ok((s, t)) = added.try_recv() {
                    peers.push(s);
                    token = Some(t);
                }
                let Some(token) = token else {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                let n = rounds.load(Ordering::Relaxed);
                round(&mut peers, range, token, n);
                rounds.fetch_add(1, Ordering::Release);
            }
            peers
        })
    };
    let base = threads();
    let mut connected = 0;
    for n in [1, 100, MOST] {
        while connected < n {
            let (s, publication) =
                raw::handshake(t.addr(), &format!("busy-peer-{connected}"), 1, None);
            let Frame::SegmentPublication(p) = publication else {
                panic!("{publication:?}")
            };
            add.send((s, p.ranges[0].token)).unwrap();
            connected += 1;
        }
        // Once every handshake's thread ended, and while every peer keeps
        // the target busy: the count, taken again and again, stays put.
        eventually(
            &format!("the target's threads back to {base} with {n} busy peers"),
            || threads() == base,
        );
        let first = rounds.load(Ordering::Acquire);
        let mut samples = 0;
        while rounds.load(Ordering::Acquire) < first + 3 || samples < 20 {
            assert!(
                !driver.is_finished(),
                "the peers' driver stopped (a failed check)"
            );
            assert_eq!(threads(), base, "{n} busy peers");
            samples += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(t.listener.stats().live, n as u64);
        println!(
            "{n} busy peers: {} threads, {} rounds while counted",
            threads(),
            rounds.load(Ordering::Acquire) - first
        );
    }
    stop.store(true, Ordering::Release);
    let peers = driver.join().expect("every answer was right");
    drop(peers);
    eventually("every closed session is gone", || {
        t.listener.stats().live == 0
    });
    // The driver's thread ended.
    assert_eq!(threads(), base - 1);
}
