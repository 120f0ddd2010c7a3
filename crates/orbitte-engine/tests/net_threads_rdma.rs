//! rdma control links hold no thread on the target while idle: after the
//! rails are set up, each accepted rdma peer's control link parks on the
//! target's I/O pool until its next frame. Counted by thread name: the
//! target serves each connection on threads named `orbitte-session-N`.
#![forbid(unsafe_code)]

mod net_support;

use net_support::eventually;
use orbitte_engine::{Access, ConnectOptions, EngineBuilder, PathKind};
use orbitte_memory::HostMemory;
use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric};

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
}
