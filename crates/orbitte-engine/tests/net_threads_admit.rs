//! Data sessions admitted at once hold no thread while their publications
//! go out: the target queues them on the session's loop and sends them as
//! the socket takes them, so peers that are slow to read them (here: they
//! read nothing until all are admitted, and the publications are far more
//! than the sockets buffer) leave the target with its idle threads. This
//! binary holds this one test, so `/proc/self/task` counts the target's
//! threads and the test's own thread only (the raw initiators run on the
//! test's thread).
#![forbid(unsafe_code)]

mod net_support;

use std::time::Duration;

use net_support::{RW, Target, cfg, raw, threads};
use orbitte_memory::HostMemory;
use orbitte_wire::Frame;

const SESSIONS: usize = 48;
/// Published views: their descriptors come to more than a MiB per session.
const VIEWS: u64 = 32_768;

#[test]
fn data_sessions_whose_publications_wait_for_the_peer_hold_no_thread() {
    net_support::logs();
    if net_support::skip_unless_ready(
        "this test",
        net_support::descriptors_short_of(3 * SESSIONS + 256),
    ) {
        return;
    }
    let mut c = cfg("admit-target", 1);
    c.max_sessions = SESSIONS + 8;
    c.handshake_timeout = Duration::from_secs(60);
    c.io_timeout = Duration::from_secs(60);
    // The smallest send buffer the target takes: the publications cannot
    // all wait in the kernel.
    c.socket_buffer = Some(64 << 10);
    let t = Target::start(c);
    let mem = HostMemory::alloc((VIEWS * 16) as usize).unwrap();
    for v in 0..VIEWS {
        t.ranges.publish_view(mem.clone(), v * 16, 16, RW).unwrap();
    }
    let idle = threads();
    let mut open: Vec<_> = (0..SESSIONS)
        .map(|i| {
            let mut s = raw::connect(t.addr());
            let first = raw::read_frame(&mut s).unwrap();
            assert!(matches!(first, Frame::Challenge(_)), "{i}: {first:?}");
            raw::send(&mut s, &raw::hello(&format!("admit-peer-{i}")));
            s
        })
        .collect();
    // Every session admitted (its hello-ack read), no publication read yet.
    for (i, s) in open.iter_mut().enumerate() {
        let ack = raw::read_frame(s).unwrap();
        assert!(matches!(ack, Frame::HelloAck(_)), "{i}: {ack:?}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let admitted = threads();
    // Then each peer reads all of its publications.
    let mut bytes = 0u64;
    for (i, s) in open.iter_mut().enumerate() {
        let mut ranges = 0u64;
        while ranges < VIEWS {
            match raw::read_frame(s).unwrap() {
                Frame::SegmentPublication(p) => {
                    if i == 0 {
                        let mut b = Vec::new();
                        Frame::SegmentPublication(p.clone()).encode(&mut b).unwrap();
                        bytes += b.len() as u64;
                    }
                    ranges += p.ranges.len() as u64;
                }
                other => panic!("{i}: a publication expected, got {other:?}"),
            }
        }
        assert_eq!(ranges, VIEWS, "{i}: every published range");
    }
    let read = threads();
    println!(
        "{SESSIONS} data sessions with {bytes} bytes of publications each: {idle} threads idle, \
         {admitted} admitted with their publications waiting, {read} after they were read"
    );
    assert!(
        bytes > 1 << 20,
        "the publications ({bytes} bytes) must be more than the sockets buffer"
    );
    assert_eq!((admitted, read), (idle, idle));
    drop(open);
}
