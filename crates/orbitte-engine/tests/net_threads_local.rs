//! Same-host mapping sessions hold no thread while idle: the target's
//! sessions park on its listener's I/O pool once their handout is done and
//! no notification comes, and the initiator's local rails share at most
//! `io_threads` copy workers, which run only while work is queued. This
//! binary holds this one test, so
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
    // Peers whose rails copy at once at the end, each this many bytes
    // (beyond what a post copies on its own thread).
    const BUSY: usize = 16;
    const BUSY_BYTES: u64 = 4 << 20;
    let need = 6 * MOST + 256;
    if net_support::skip_unless_ready("this test", net_support::descriptors_short_of(need)) {
        return;
    }
    let mut c = cfg("local-target", 1);
    c.max_sessions = MOST + 8;
    let t = Target::start(c);
    let mem = HostMemory::alloc(BUSY * BUSY_BYTES as usize).unwrap();
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
    eventually("the rail's copy worker ends again", || threads() == idle);

    // Many busy rails at once share the bounded copy workers: the
    // threads never pass the idle count plus `io_threads` workers, while
    // the copies run and while the workers idle after them, and every
    // rail's bytes land where it wrote them. (A source is mapped for one
    // peer at a time, so the busy rails are a fresh peer's.)
    let bound = idle + orbitte_engine::DEFAULT_IO_THREADS;
    let peer = PeerId(open as u32 + 1);
    let busy = i.driver.add_rails(PathKind::Local, peer, BUSY, 64);
    i.local
        .attach(&i.cfg, &i.peers, peer, &identity, &busy)
        .expect("the busy peer's mapping session");
    i.driver.set_remote(peer, &link.ranges);
    let big = HostMemory::alloc(BUSY * BUSY_BYTES as usize).unwrap();
    for k in 0..BUSY {
        big.write_at(
            k * BUSY_BYTES as usize,
            &vec![k as u8 + 1; BUSY_BYTES as usize],
        )
        .unwrap();
    }
    let reg = i.driver.register(big.clone());
    let reqs = (0..BUSY)
        .map(|k| {
            let off = k as u64 * BUSY_BYTES;
            request(
                10 + k as u64,
                Op::Write,
                reg,
                off,
                peer,
                range.0,
                off,
                BUSY_BYTES,
                &busy[k..=k],
            )
        })
        .collect();
    let ids = i.driver.submit(reqs);
    let mut most = threads();
    let mut pending = ids.clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !pending.is_empty() {
        most = most.max(threads());
        pending.retain(|id| match i.driver.try_outcome(*id) {
            Some(o) => {
                assert_eq!(o.status, Status::Complete, "{o:?}");
                false
            }
            None => true,
        });
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {BUSY} busy writes have no outcome",
            pending.len()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    for _ in 0..100 {
        most = most.max(threads());
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("{BUSY} busy local rails: at most {most} threads (bound {bound})");
    assert!(
        most <= bound,
        "{most} threads with {BUSY} busy local rails: more than {bound}"
    );
    assert!(
        mem.to_vec(0, BUSY * BUSY_BYTES as usize).unwrap()
            == big.to_vec(0, BUSY * BUSY_BYTES as usize).unwrap(),
        "a busy rail's bytes are not where it wrote them"
    );
    eventually("the copy workers end again", || threads() == idle);
}
