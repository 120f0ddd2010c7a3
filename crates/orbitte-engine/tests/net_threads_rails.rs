//! An initiator's threads do not grow with its idle rails: every rail is
//! served on the transport's fixed pool of I/O threads. This
//! binary holds this one test, so `/proc/self/task` counts the initiator's
//! and the target's threads and the test's own only.
#![forbid(unsafe_code)]

mod net_support;

use std::time::Duration;

use net_support::{Initiator, RW, Target, cfg, descriptors, eventually, pattern, request, threads};
use orbitte_engine::outcome::Status;
use orbitte_engine::transport::{Op, PeerId};
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;

#[test]
fn the_threads_are_the_same_with_1_100_and_1000_idle_rails() {
    net_support::logs();
    const MOST: usize = 1000;
    // Four descriptors a rail: the initiator's socket and the rail's
    // handle of it, the target's socket and its duplicate.
    let need = 4 * MOST + 256;
    if net_support::skip_unless_ready("this test", net_support::descriptors_short_of(need)) {
        return;
    }
    let mut c = cfg("rails-target", 1);
    c.max_sessions = MOST + 1;
    c.max_connections_per_source = MOST + 1;
    let t = Target::start(c);
    let mem = HostMemory::alloc(1 << 20).unwrap();
    pattern(&mem, 9);
    let range = t.ranges.publish(mem.clone(), RW).unwrap();
    let i = Initiator::new(cfg("rails-initiator", 1), CoreConfig::default());
    let local = HostMemory::alloc(1 << 20).unwrap();
    let reg = i.driver.register(local.clone());
    // The initiator's pool starts with its first rail.
    let idle = threads() + orbitte_engine::DEFAULT_IO_THREADS;
    let fds0 = descriptors();
    let mut links = Vec::new();
    let mut last = Vec::new();
    for (peer, n, more) in [(1, 1, 1), (2, 100, 99), (3, MOST, MOST - 100)] {
        let (rails, link) = i
            .connect_tcp(PeerId(peer), t.addr(), more)
            .unwrap_or_else(|e| panic!("{n} rails: {e}"));
        links.push(link);
        last = rails;
        eventually(&format!("{idle} threads with {n} idle rails"), || {
            threads() == idle
        });
        println!(
            "{n} idle rails: {} threads; per rail {:.2} descriptors (both ends)",
            threads(),
            (descriptors() - fds0) as f64 / n as f64,
        );
    }
    // Parked rails carry requests again: a READ over the last peer's
    // rails gets the target's bytes, then the rails park again.
    let id = i.driver.submit(vec![request(
        1,
        Op::Read,
        reg,
        0,
        PeerId(3),
        range.0,
        0,
        1 << 20,
        &last,
    )])[0];
    let o = i.driver.wait(id, Duration::from_secs(30));
    assert_eq!(o.status, Status::Complete, "{o:?}");
    assert!(local.to_vec(0, 1 << 20).unwrap() == mem.to_vec(0, 1 << 20).unwrap());
    eventually("the rails park again", || threads() == idle);
    drop(links);
}
