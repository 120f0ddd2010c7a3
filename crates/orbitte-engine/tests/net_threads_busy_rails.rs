//! An initiator's threads do not grow with its busy rails: every tcp rail
//! is served on the transport's fixed pool of I/O threads, with requests
//! in flight or not. The target runs in a child process, so
//! `/proc/self/task` counts the initiator's threads and the test's own
//! only (the harness's, and the one that reads the child's output).
#![forbid(unsafe_code)]

mod net_support;

use std::time::{Duration, Instant};

use net_support::child::{self, ROLE};
use net_support::{Initiator, cfg, eventually, request, threads};
use orbitte_engine::outcome::Status;
use orbitte_engine::transport::{Op, PeerId};
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;

const BOUND: Duration = Duration::from_secs(60);

/// Slices a busy rail carries: with the target's delay per request, the
/// requests stay in flight for about half a second.
const SLICES_PER_RAIL: u64 = 100;

const SLICE: u64 = 4096;

/// Entry point of the child target (does nothing in a normal run).
#[test]
#[ignore = "entry point for the child target of the other test"]
fn child_entry() {
    if std::env::var(ROLE).as_deref() == Ok("target") {
        net_support::run_child_target();
    }
}

#[test]
fn the_threads_are_the_same_with_1_and_100_busy_rails_as_idle() {
    net_support::logs();
    const MOST: u64 = 100;
    let size = MOST * SLICES_PER_RAIL * SLICE;
    let p = child::spawn(
        "child_entry",
        &[],
        &[
            (ROLE, "target".into()),
            ("NET_SOURCE", "busy-target".into()),
            ("NET_EPOCH", "1".into()),
            ("NET_ADDR", "127.0.0.1:0".into()),
            // Each request waits this long before it is served, so that
            // requests are in flight on every rail while threads are counted.
            ("NET_DELAY_MS", "5".into()),
            ("NET_SIZE", size.to_string()),
            ("NET_MAX_CONNECTIONS", (2 * MOST).to_string()),
        ],
    );
    let ready = p.expect("READY", BOUND);
    let mut it = ready.split_whitespace().skip(1);
    let addr = it.next().unwrap().parse().unwrap();
    let range: u64 = it.next().unwrap().parse().unwrap();

    let core = CoreConfig {
        slice_size: SLICE as u32,
        tcp_slice_size: 0,
        request_timeout: BOUND,
        drain_timeout: Duration::from_secs(5),
    };
    let i = Initiator::new(cfg("busy-initiator", 1), core);
    let local = HostMemory::alloc(size as usize).unwrap();
    let reg = i.driver.register(local.clone());
    // The initiator's pool starts with its first rail.
    let idle = threads() + orbitte_engine::DEFAULT_IO_THREADS;
    let mut links = Vec::new();
    for (peer, n) in [(1u32, 1u64), (2, MOST)] {
        let (rails, link) = i
            .connect_tcp(PeerId(peer), addr, n as usize)
            .unwrap_or_else(|e| panic!("{n} rails: {e}"));
        links.push(link);
        eventually(&format!("{idle} threads with {n} idle rails"), || {
            threads() == idle
        });
        // Half READs, half WRITEs, striped over the rails.
        let len = n * SLICES_PER_RAIL * SLICE / 2;
        let ids = i.driver.submit(vec![
            request(1, Op::Read, reg, 0, PeerId(peer), range, 0, len, &rails),
            request(
                2,
                Op::Write,
                reg,
                len,
                PeerId(peer),
                range,
                len,
                len,
                &rails,
            ),
        ]);
        let (mut samples, mut most) = (0, 0);
        let mut outcomes = [None, None];
        let deadline = Instant::now() + BOUND;
        while outcomes.iter().any(Option::is_none) {
            assert!(
                Instant::now() < deadline,
                "{n} rails: no outcome within {BOUND:?}"
            );
            let count = threads();
            for (o, id) in outcomes.iter_mut().zip(&ids) {
                if o.is_none() {
                    *o = i.driver.try_outcome(*id);
                }
            }
            // Counted while a request was still outstanding afterwards.
            if outcomes.iter().any(Option::is_none) {
                samples += 1;
                most = most.max(count);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for o in outcomes.into_iter().flatten() {
            assert_eq!(o.status, Status::Complete, "{n} rails: {o:?}");
        }
        println!("{n} busy rails: {samples} counts while busy, at most {most} threads");
        assert!(
            samples >= 5,
            "{n} rails: the requests were done before the counts"
        );
        assert_eq!(most, idle, "{n} busy rails hold threads of their own");
    }
    // The rails close before the target goes.
    for rail in links.iter().flat_map(|l| &l.rails) {
        i.tcp.close(*rail);
    }
    drop(p);
}
