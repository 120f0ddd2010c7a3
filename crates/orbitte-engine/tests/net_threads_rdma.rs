//! rdma control links hold no thread on the target, idle or while their
//! rails are set up: each accepted rdma peer's control link lives on the
//! target's I/O pool, from the peer's publication and connect request to
//! its requests to re-establish a rail. Counted by thread name while
//! engines in this process connect (their pollers are threads too), and
//! exactly while raw peers stall in their setup.
#![forbid(unsafe_code)]

mod net_support;

use std::time::{Duration, Instant};

use net_support::{eventually, raw, threads};
use orbitte_engine::{Access, ConnectOptions, EngineBuilder, PathKind};
use orbitte_memory::HostMemory;
use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric};
use orbitte_wire::{Frame, SessionPurpose};

/// Threads of this process serving a listener's connection.
fn session_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("orbitte-session"))
        .count()
}

#[test]
fn idle_rdma_peers_hold_no_session_thread_on_the_target() {
    net_support::logs();
    const MOST: usize = 24;
    let mut devs = vec![SimDeviceDesc::roce("a0", [10, 1, 0, 1])];
    for i in 0..MOST {
        devs.push(SimDeviceDesc::roce(&format!("b{i}"), [10, 2, i as u8, 1]));
    }
    let fabric = SimFabric::new(
        SimDescription::new(devs).with_delivery(Delivery::Background),
        7,
    );
    let target = EngineBuilder::new("rdma-threads-target")
        .provider(fabric.provider_for(&["a0"]))
        .handshake_timeout(SETUP_BOUND)
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    let remote = HostMemory::alloc(1 << 16).unwrap();
    target.register(&remote, Access::REMOTE_READ_WRITE).unwrap();
    let addr = target.listen_addr().unwrap();
    let mut clients = Vec::new();
    for n in [1, 8, MOST] {
        while clients.len() < n {
            let i = clients.len();
            let dev = format!("b{i}");
            let client = EngineBuilder::new(format!("rdma-threads-client-{i}"))
                .provider(fabric.provider_for(&[dev.as_str()]))
                .session_settings(|cfg| {
                    cfg.host_id = orbitte_wire::HostId::new("another-host").unwrap();
                })
                .build()
                .unwrap();
            let peer = client
                .connect_with(addr, ConnectOptions::new().path(PathKind::Rdma))
                .unwrap_or_else(|e| panic!("rdma peer {i}: {e}"));
            assert_eq!(peer.path, PathKind::Rdma);
            clients.push((client, peer));
        }
        eventually(
            &format!("no session thread with {n} idle rdma peers"),
            || session_threads() == 0,
        );
        // The connect's metadata session closes on the loop soon after
        // the peer leaves it; every control link stays open.
        eventually(&format!("{n} control links open"), || {
            target.listener_stats().map(|s| s.live) == Some(n as u64)
        });
    }
    // Raw peers admitted for rdma control that never send their
    // publication: no thread waits for them, and each is closed once the
    // handshake timeout passed without its rails set up.
    // Settled: no thread of the engines' connects still ending.
    let mut before = threads();
    eventually("the thread count settled", || {
        std::thread::sleep(Duration::from_millis(200));
        let now = threads();
        std::mem::replace(&mut before, now) == now
    });
    let opened = Instant::now();
    let mut stalled: Vec<_> = (0..STALLED)
        .map(|i| {
            let mut s = raw::connect(addr);
            let first = raw::read_frame(&mut s).unwrap();
            assert!(matches!(first, Frame::Challenge(_)), "{i}: {first:?}");
            let hello = raw::hello_for(&format!("rdma-stalled-{i}"), SessionPurpose::RDMA_CONTROL);
            raw::send(&mut s, &hello);
            let ack = raw::read_frame(&mut s).unwrap();
            assert!(matches!(ack, Frame::HelloAck(_)), "{i}: {ack:?}");
            s
        })
        .collect();
    let setting_up = threads();
    assert_eq!(
        setting_up, before,
        "threads made for control links in their setup"
    );
    for (i, s) in stalled.iter_mut().enumerate() {
        let frames = raw::read_until_closed(s);
        assert!(frames.is_empty(), "{i}: {frames:?}");
    }
    assert!(
        opened.elapsed() >= SETUP_BOUND,
        "closed before the handshake timeout: {:?}",
        opened.elapsed()
    );
    eventually("the stalled links gone", || {
        target.listener_stats().map(|s| s.live) == Some(MOST as u64)
    });
}

/// The handshake timeout of the target, which bounds a control link's
/// setup.
const SETUP_BOUND: Duration = Duration::from_millis(600);
/// Raw control links that stall in their setup.
const STALLED: usize = 32;
