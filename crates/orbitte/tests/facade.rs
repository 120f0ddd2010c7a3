//! The facade names the curated entry path, and the Quick Start's flow
//! works end to end through `orbitte::` alone (two engines on the sim
//! fabric, and two on loopback sockets: register, connect, write, read back,
//! every byte compared).
#![forbid(unsafe_code)]

use std::collections::BTreeSet;
use std::time::Duration;

use orbitte::{
    Access, ConnectOptions, DrainStatus, EngineBuilder, HostMemory, PathKind, RemoteEffect,
    Request, Status,
};
// The fabric is the test's hardware, not part of the facade.
use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric};

/// Every name `orbitte` re-exports, by group.
const CURATED: &[&str] = &[
    // builder and engine
    "EngineBuilder",
    "TransferEngine",
    "ConnectOptions",
    "PathPreference",
    "PeerInfo",
    "RailInfo",
    "ContextStatus",
    "EngineTopology",
    "RdmaConfig",
    "DeviceMask",
    "MemoryLocation",
    "Budgets",
    "ClusterSecret",
    "ListenerToken",
    "secret",
    "SECRET_FILE_ENV",
    "SecretFileError",
    "new_listener_token",
    "MetadataMode",
    "SessionConfig",
    "StagingConfig",
    "RecoveryPolicy",
    "ListenerStats",
    "StagingStatus",
    // metrics
    "metrics",
    "MetricsSnapshot",
    // memory and registration
    "HostMemory",
    "Memory",
    "MemoryPath",
    "Access",
    "Charges",
    "Registration",
    // peer and request
    "Peer",
    "RemoteRange",
    "PeerRef",
    "Request",
    "LocalRead",
    "LocalWrite",
    "RemoteTarget",
    "RequestId",
    "Op",
    "PathKind",
    "PeerId",
    "RangeId",
    "RegistrationId",
    "RailId",
    "Epoch",
    "Posting",
    "SubmitOptions",
    // outcome
    "Outcome",
    "Status",
    "DrainStatus",
    "RemoteEffect",
    "FailureInfo",
    "ChunkFailure",
    "RailRefusal",
    "SliceFailure",
    // notification
    "Notification",
    "NotificationStatus",
    "NotificationError",
    "ReceivedNotification",
    "NotificationStats",
    "MAX_NOTIFICATION_LEN",
    // errors
    "BuildError",
    "RegisterError",
    "UnregisterError",
    "ConnectError",
    "ListenError",
    "SubmitError",
    "RequestError",
    "WaitError",
    "DrainTimeout",
    "Unquiesced",
    "NicsUnavailable",
    "InactivePort",
    "NoRdmaRail",
    // capability
    "CapabilityMatrix",
    "PathRow",
    "Check",
];

/// The names of the `pub use` items of the facade's source: the last path
/// segment of each, or each name in its braces. A glob is `*`, a renamed
/// or whole-crate re-export keeps its `as`.
fn reexported_names() -> Vec<String> {
    let src = include_str!("../src/lib.rs");
    let mut names = Vec::new();
    for item in src.split(';') {
        let Some(at) = item.find("pub use ") else {
            continue;
        };
        let path: String = item[at + "pub use ".len()..]
            .chars()
            .filter(|c| !c.is_whitespace() || *c == ' ')
            .collect();
        let leaves = match path.find('{') {
            Some(open) => path[open + 1..path.rfind('}').unwrap()].to_owned(),
            None => path.rsplit("::").next().unwrap().to_owned(),
        };
        names.extend(
            leaves
                .split(',')
                .map(|n| n.trim().to_owned())
                .filter(|n| !n.is_empty()),
        );
    }
    names
}

#[test]
fn the_facade_reexports_the_curated_list_by_name() {
    let names = reexported_names();
    assert!(
        names.iter().all(|n| n != "*" && !n.contains(" as ")),
        "no glob and no whole-crate module: {names:?}"
    );
    let got: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(
        got.len(),
        names.len(),
        "a name re-exported twice: {names:?}"
    );
    let want: BTreeSet<&str> = CURATED.iter().copied().collect();
    assert_eq!(
        got.difference(&want).collect::<Vec<_>>(),
        Vec::<&&str>::new(),
        "re-exported but not in the curated list"
    );
    assert_eq!(
        want.difference(&got).collect::<Vec<_>>(),
        Vec::<&&str>::new(),
        "in the curated list but not re-exported"
    );
}

/// The entry path with rdma rails: two engines on the sim fabric, one
/// listener, a connect that asks for rdma, a WRITE and a READ back.
#[test]
fn quickstart_flow_over_sim_rdma_through_the_facade() {
    let wait = Duration::from_secs(30);
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("p0", [10, 0, 0, 1]),
            SimDeviceDesc::roce("d0", [10, 0, 0, 2]),
        ])
        .with_delivery(Delivery::Background),
        3,
    );
    let a = EngineBuilder::new("prefill-t")
        .provider(fabric.provider_for(&["p0"]))
        .build()
        .unwrap();
    let b = EngineBuilder::new("decode-t")
        .provider(fabric.provider_for(&["d0"]))
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    // Not initialized before the first Host Direct registration.
    assert!(!a.topology().initialized);
    let len = 300_000;
    let src = HostMemory::alloc(len).unwrap();
    let pattern: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    src.write_at(0, &pattern).unwrap();
    let dst = HostMemory::alloc(len).unwrap();
    let local = a.register(&src, Access::LocalOnly).unwrap();
    let remote = b.register(&dst, Access::REMOTE_READ_WRITE).unwrap();
    assert!(a.topology().initialized);
    assert_eq!((local.copies, remote.copies), (1, 2));

    let peer = a
        .connect_with(
            b.listen_addr().unwrap(),
            ConnectOptions::new().path(PathKind::Rdma).rails(1),
        )
        .unwrap();
    assert_eq!((peer.source_id(), peer.path), ("decode-t", PathKind::Rdma));
    let range = peer.ranges()[0];

    let w = a
        .submit(&[Request::write(&local, 0..len as u64).to(&range, 0)])
        .unwrap();
    let o = a.wait(w[0], wait).unwrap();
    assert_eq!(o.status, Status::Complete, "{o:?}");
    assert_eq!(o.completed_prefix, len as u64);
    assert_eq!(o.remote_effect, RemoteEffect::Complete);
    assert_eq!(dst.to_vec(0, len).unwrap(), pattern);

    src.fill(0, len, 0).unwrap();
    let r = a
        .submit(&[Request::read(&local, 0..len as u64).from(&range, 0)])
        .unwrap();
    let o = a.wait(r[0], wait).unwrap();
    assert!(o.is_complete(), "{o:?}");
    a.wait_drain(r[0], wait).unwrap();
    assert_eq!(a.drain_status(r[0]), DrainStatus::Drained);
    assert_eq!(src.to_vec(0, len).unwrap(), pattern);

    // The capability matrix is data, with every path.
    let m = orbitte::CapabilityMatrix::baseline();
    assert_eq!(m.rows.len(), PathKind::ALL.len());
    a.shutdown(Duration::from_secs(5)).unwrap();
    b.shutdown(Duration::from_secs(5)).unwrap();
}

/// The Quick Start example's flow (examples/quickstart.rs), through the
/// facade: two engines on loopback over real sockets, one listener, one
/// connect, a WRITE with a notification the target waits for, a READ back
/// by address, every byte compared.
#[test]
fn quickstart_example_flow_over_loopback_sockets() {
    use orbitte::{Notification, NotificationStatus};
    const LEN: usize = 1 << 20;
    let wait = Duration::from_secs(30);
    let decode = EngineBuilder::new("decode-q")
        .listen("127.0.0.1:0".parse().unwrap())
        .host_memory_without_rdma()
        .build()
        .unwrap();
    let prefill = EngineBuilder::new("prefill-q")
        .host_memory_without_rdma()
        .build()
        .unwrap();
    let kv = HostMemory::alloc(LEN).unwrap();
    decode.register(&kv, Access::RemoteReadWrite).unwrap();
    let src = HostMemory::alloc(LEN).unwrap();
    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    src.write_at(0, &pattern).unwrap();
    let local = prefill.register(&src, Access::LocalOnly).unwrap();

    let peer = prefill.connect(decode.listen_addr().unwrap()).unwrap();
    assert_eq!((peer.source_id(), peer.path), ("decode-q", PathKind::Local));
    assert!(peer.fell_back.is_empty(), "{peer:?}");
    let remote = peer.ranges()[0];

    let write = Request::write(&local, 0..LEN as u64).to(&remote, 0);
    let ids = prefill
        .submit_with_notification(&[write], Notification::new("kv ready"))
        .unwrap();
    let wrote = prefill.wait(ids[0], wait).unwrap();
    assert_eq!(
        (
            wrote.status,
            wrote.remote_effect.clone(),
            wrote.notification.clone()
        ),
        (
            Status::Complete,
            RemoteEffect::Complete,
            NotificationStatus::Sent
        ),
        "{wrote:?}"
    );
    let note = decode.wait_notification(wait).expect("the notification");
    assert_eq!(
        (note.payload.as_slice(), note.source_id.as_str()),
        (&b"kv ready"[..], "prefill-q")
    );
    assert!(
        kv.to_vec(0, LEN).unwrap() == pattern,
        "every byte placed before the notification"
    );

    src.fill(0, LEN, 0).unwrap();
    let back = Request::read(&local, 0..LEN as u64).from_address(&peer, remote.address);
    let ids = prefill.submit(&[back]).unwrap();
    assert!(prefill.wait(ids[0], wait).unwrap().is_complete());
    prefill.wait_drain(ids[0], wait).unwrap();
    assert!(src.to_vec(0, LEN).unwrap() == pattern);
    prefill.shutdown(wait).unwrap();
    decode.shutdown(wait).unwrap();
}
