//! Same-host mapping sessions hold no thread while idle: the target's
//! sessions park on its listener's I/O pool once their handout is done and
//! no notification comes, and the initiator's local rails have a worker
//! only while work is queued. This binary holds this one test, so
//! `/proc/self/task` counts the target's, the initiator's and the test's
//! own threads only.
#![forbid(unsafe_code)]

mod net_support;

use std::time::Duration;

use net_support::{Initiator, RW, Target, cfg, descriptors, eventually, pattern, request, threads};
use orbitte_engine::outcome::Status;
use orbitte_engine::transport::{Op, PathKind, PeerId};
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;

#[test]
fn the_threads_are_the_same_with_1_100_and_1000_idle_mapping_sessions() {
    net_support::logs();
    const MOST: usize = 1000;
    let need = 6 * MOST + 256;
    if net_support::skip_unless_ready("this test", net_support::descriptors_short_of(need)) {
        return;
    }
    let mut c = cfg("local-target", 1);
    c.max_sessions = MOST + 8;
    let t = Target::start(c);
    let mem = HostMemory::alloc(1 << 20).unwrap();
    pattern(&mem, 4);
    let range = t.ranges.publish(mem.clone(), RW).unwrap();
    let before = threads();
    let i = Initiator::new(cfg("local-initiator", 1), CoreConfig::default());
    // One tcp rail tells the initiator who the target is; with it the
    // initiator's pool started.
    let (_tcp, link) = i.connect_tcp(PeerId(0), t.addr(), 1).unwrap();
    let identity = link.handshake.peer.clone();
    let idle = before + orbitte_engine::DEFAULT_IO_THREADS;
    let fds0 = descriptors();
    let mut last = Vec::new();
    let mut open = 0;
    for n in [1, 100, MOST] {
        while open < n {
            open += 1;
            let peer = PeerId(open as u32);
            let rails = i.driver.add_rails(PathKind::Local, peer, 1, 64);
            let attach = i
                .local
                .attach(&i.cfg, &i.peers, peer, &identity, &rails)
                .unwrap_or_else(|e| panic!("mapping session {open}: {e}"));
            assert_eq!(attach.ranges, vec![range]);
            i.driver.set_remote(peer, &link.ranges);
            last = rails;
        }
        eventually(
            &format!("{idle} threads with {n} idle mapping sessions"),
            || threads() == idle,
        );
        println!(
            "{n} idle mapping sessions: {} threads; per session {:.2} descriptors (both ends)",
            threads(),
            (descriptors() - fds0) as f64 / n as f64,
        );
    }
    // The last peer's rail copies again: 1 MiB written into the mapping
    // lands in the target's memory.
    let src = HostMemory::alloc(1 << 20).unwrap();
    pattern(&src, 8);
    let reg = i.driver.register(src.clone());
    let id = i.driver.submit(vec![request(
        1,
        Op::Write,
        reg,
        0,
        PeerId(open as u32),
        range.0,
        0,
        1 << 20,
        &last,
    )])[0];
    let o = i.driver.wait(id, Duration::from_secs(30));
    assert_eq!(o.status, Status::Complete, "{o:?}");
    assert!(mem.to_vec(0, 1 << 20).unwrap() == src.to_vec(0, 1 << 20).unwrap());
    eventually("the rail's worker ends again", || threads() == idle);
}
