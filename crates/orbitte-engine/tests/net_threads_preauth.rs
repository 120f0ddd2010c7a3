//! Connections being accepted hold no thread: a target's handshakes run
//! on its listener's I/O loops, so 200 connections that never send a
//! hello (up to the pre-auth budget) leave the target with the threads it
//! has idle, and the budget's eviction of the oldest still works there.
//! This binary holds this one test, so `/proc/self/task` counts the
//! target's threads and the test's own thread only (the raw peers run on
//! the test's thread).
#![forbid(unsafe_code)]

mod net_support;

use std::time::Duration;

use net_support::{Target, cfg, eventually, raw, threads};
use orbitte_wire::Frame;

#[test]
fn two_hundred_connections_without_a_hello_hold_no_thread() {
    net_support::logs();
    const HELD: usize = 200;
    if net_support::skip_unless_ready(
        "this test",
        net_support::descriptors_short_of(3 * HELD + 256),
    ) {
        return;
    }
    let mut c = cfg("preauth-target", 1);
    c.max_unauthenticated = HELD;
    c.max_unauthenticated_per_address = HELD + 1;
    // Longer than the test: none of them times out meanwhile.
    c.preauth_timeout = Duration::from_secs(60);
    c.handshake_timeout = Duration::from_secs(60);
    let t = Target::start(c);
    let idle = threads();
    let mut held = Vec::with_capacity(HELD);
    for i in 0..HELD {
        let mut s = raw::connect(t.addr());
        let first = raw::read_frame(&mut s).unwrap();
        assert!(matches!(first, Frame::Challenge(_)), "{i}: {first:?}");
        held.push(s);
    }
    // Every one got its challenge, so every one is in its handshake now.
    let during = threads();
    println!("{HELD} connections in their handshake: {during} threads, {idle} idle");
    assert_eq!(during, idle, "threads made for connections without a hello");
    let stats = t.listener.stats();
    assert_eq!((stats.accepted, stats.live), (HELD as u64, HELD as u64));
    // One more: the budget is full, so the oldest is closed for it, on
    // the loop too.
    let mut newcomer = raw::connect(t.addr());
    let first = raw::read_frame(&mut newcomer).unwrap();
    assert!(matches!(first, Frame::Challenge(_)), "{first:?}");
    let frames = raw::read_until_closed(&mut held[0]);
    assert!(frames.is_empty(), "{frames:?}");
    assert_eq!(t.listener.stats().preauth_evicted, 1);
    assert_eq!(threads(), idle);
    drop(held);
    drop(newcomer);
    eventually("every closed connection is gone", || {
        t.listener.stats().live == 0
    });
    assert_eq!(threads(), idle);
}
