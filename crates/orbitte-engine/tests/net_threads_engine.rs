//! An engine's I/O threads end with it: engines that connect over tcp and
//! are dropped leave no thread behind, so a process that makes engines
//! again and again does not gather threads. This binary holds this one
//! test, so `/proc/self/task` counts the engines' threads and the test's.
#![forbid(unsafe_code)]

mod net_support;

use net_support::{engines_without_rdma, eventually, threads};
use orbitte_engine::{Access, ConnectOptions, PathKind};
use orbitte_memory::HostMemory;

#[test]
fn dropped_engines_leave_no_io_thread_behind() {
    net_support::logs();
    let base = threads();
    for round in 0..3 {
        let (target, client) = engines_without_rdma(
            &format!("drop-target-{round}"),
            &format!("drop-client-{round}"),
            |b| b,
        );
        let mem = HostMemory::alloc(1 << 16).unwrap();
        target.register(&mem, Access::REMOTE_READ_WRITE).unwrap();
        let addr = target.listen_addr().unwrap();
        let peer = client
            .connect_with(addr, ConnectOptions::new().path(PathKind::Tcp).rails(4))
            .unwrap();
        assert_eq!(peer.rails.len(), 4);
        // Both engines have started their pools (the target with its
        // listener, the client with its first rail).
        assert!(threads() >= base + 2 * orbitte_engine::DEFAULT_IO_THREADS);
        drop(client);
        drop(target);
        eventually(&format!("round {round}: back to {base} threads"), || {
            threads() == base
        });
    }
}
