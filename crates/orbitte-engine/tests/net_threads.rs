//! The target's threads do not grow with its idle peers: its accept loop
//! and every idle tcp data session wait on the listener's fixed pool of I/O
//! threads. This binary holds this one test, so `/proc/self/task` counts
//! the target's threads and the test's own thread only (the raw peers run
//! on the test's thread).
#![forbid(unsafe_code)]

mod net_support;

use std::net::TcpStream;

use net_support::{descriptors, eventually, raw, rss_kib, threads};
use orbitte_wire::{Frame, ReadRequest, RequestId, Status};

/// Reads `range` through `s` and checks the answer (a session that parked
/// is served again).
fn read_once(s: &mut TcpStream, range: orbitte_wire::RangeId, token: orbitte_wire::AccessToken) {
    raw::send(
        s,
        &Frame::ReadRequest(ReadRequest {
            request_id: RequestId(1),
            range_id: range,
            token,
            offset: 0,
            length: 4096,
        }),
    );
    match raw::read_frame(s).unwrap() {
        Frame::ReadResponse(r) => {
            assert_eq!(r.status, Status::OK);
            assert_eq!(r.length, 4096);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_targets_threads_are_the_same_with_1_100_and_1000_idle_peers() {
    net_support::logs();
    const MOST: usize = 1000;
    let Some((t, range)) = net_support::target_for_peers("threads-target", MOST, 1 << 20) else {
        return;
    };
    let base = threads();
    let (fds0, rss0) = (descriptors(), rss_kib());
    let mut peers: Vec<TcpStream> = Vec::with_capacity(MOST);
    let mut token = None;
    for n in [1, 100, MOST] {
        while peers.len() < n {
            let (s, publication) =
                raw::handshake(t.addr(), &format!("idle-peer-{}", peers.len()), 1, None);
            let Frame::SegmentPublication(p) = publication else {
                panic!("{publication:?}")
            };
            token = Some(p.ranges[0].token);
            peers.push(s);
        }
        eventually(
            &format!("the target's threads back to {base} with {n} idle peers"),
            || threads() == base,
        );
        assert_eq!(t.listener.stats().live, n as u64);
        println!(
            "{n} idle peers: {} threads; per peer {:.2} descriptors (both ends), {:.1} KiB RSS",
            threads(),
            (descriptors() - fds0) as f64 / n as f64,
            (rss_kib().saturating_sub(rss0)) as f64 / n as f64
        );
    }
    // Parked sessions are served again, each on a thread while it is
    // busy, and park again once quiet.
    let token = token.unwrap();
    for s in peers.iter_mut().step_by(97) {
        read_once(s, range, token);
    }
    eventually("the served sessions park again", || threads() == base);
    drop(peers);
    eventually("every closed session is gone", || {
        t.listener.stats().live == 0
    });
    assert_eq!(threads(), base);
}
