//! Cluster metadata in a real etcd started on loopback by the test: records
//! under a key prefix with leases, so a dead engine's entry expires.
//!
//! The `etcd` feature is on by default. Without an `etcd` binary the test
//! prints `skipped: etcd not installed`, except under CI=true, where it
//! fails.
#![forbid(unsafe_code)]
#![cfg(feature = "etcd")]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use orbitte_engine::metadata::etcd::EtcdMetadata;
use orbitte_engine::metadata::{
    CacheUpdate, DescriptorCache, MetadataError, PeerRecord, RangeRecord,
};

struct Etcd {
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_etcd() -> Option<Etcd> {
    if Command::new("etcd").arg("--version").output().is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI must run the etcd test: etcd not installed"
        );
        println!("skipped: etcd not installed");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let c = format!("http://127.0.0.1:{client}");
    let p = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .args(["--name", "orbitte-test", "--data-dir"])
        .arg(dir.path())
        .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
        .args([
            "--listen-peer-urls",
            &p,
            "--initial-advertise-peer-urls",
            &p,
        ])
        .args(["--initial-cluster", &format!("orbitte-test={p}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd");
    Some(Etcd {
        child,
        endpoint: format!("127.0.0.1:{client}"),
        _dir: dir,
    })
}

fn connect(etcd: &Etcd, ttl: Duration) -> EtcdMetadata {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match EtcdMetadata::connect(std::slice::from_ref(&etcd.endpoint), "/orbitte/test", ttl) {
            // A first request proves the server is up (connect is lazy).
            Ok(m) if m.list().is_ok() => return m,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            Ok(m) => panic!("etcd not answering: {:?}", m.list()),
            Err(e) => panic!("etcd not reachable: {e}"),
        }
    }
}

fn record(source: &str, epoch: u64) -> PeerRecord {
    PeerRecord {
        source_id: source.into(),
        epoch,
        listen_addr: "127.0.0.1:7000".into(),
        host_id: "host-a".into(),
        ranges: vec![RangeRecord {
            range_id: 1,
            length: 4096,
            access: 6,
            token: 42,
            local_host: Some("host-a".into()),
        }],
        listener_token: None,
    }
}

#[test]
fn records_live_under_a_prefix_and_expire_with_their_lease() {
    let Some(etcd) = start_etcd() else { return };
    let mut a = connect(&etcd, Duration::from_secs(2));
    let b = connect(&etcd, Duration::from_secs(2));
    a.publish(&record("engine-a", 5)).unwrap();
    let seen = b
        .lookup("engine-a")
        .unwrap()
        .expect("record visible to another client");
    assert_eq!(seen, record("engine-a", 5));
    assert_eq!(b.list().unwrap().len(), 1);

    // Kept alive well past the TTL while the engine lives.
    std::thread::sleep(Duration::from_secs(4));
    assert!(b.lookup("engine-a").unwrap().is_some(), "lease kept alive");

    // A newer epoch replaces the old record; the cache follows the epoch rule.
    a.publish(&record("engine-a", 6)).unwrap();
    let mut cache = DescriptorCache::new();
    assert_eq!(cache.update(record("engine-a", 5)), CacheUpdate::Inserted);
    let newer = b.lookup("engine-a").unwrap().unwrap();
    assert_eq!(
        cache.update(newer),
        CacheUpdate::Replaced {
            old_epoch: 5,
            dropped: 1
        }
    );

    // The engine dies (keep-alives stop): the entry expires by itself.
    a.abandon();
    let deadline = Instant::now() + Duration::from_secs(60);
    while b.lookup("engine-a").unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "record of a dead engine did not expire"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // An orderly close revokes at once.
    let mut c = connect(&etcd, Duration::from_secs(30));
    c.publish(&record("engine-c", 1)).unwrap();
    assert!(b.lookup("engine-c").unwrap().is_some());
    c.close().unwrap();
    assert!(b.lookup("engine-c").unwrap().is_none());
}

#[test]
fn an_unreachable_etcd_is_an_error_not_a_hang() {
    let port = free_port();
    // Connecting asks the server for its status, so an unreachable one is
    // refused right there, naming the endpoint.
    let endpoint = format!("127.0.0.1:{port}");
    let err = EtcdMetadata::connect(
        std::slice::from_ref(&endpoint),
        "/orbitte/test",
        Duration::from_secs(2),
    )
    .map(|_| ())
    .unwrap_err();
    assert!(
        matches!(&err, MetadataError::Service { endpoint: e, .. } if e.contains(&endpoint)),
        "{err:?}"
    );
}

#[test]
fn an_engine_found_through_etcd_is_opened_and_serves_requests() {
    use orbitte_engine::metadata::MetadataMode;
    use orbitte_engine::{
        Access, ConnectError, ConnectOptions, EngineBuilder, PathKind, Request, Status,
    };
    use orbitte_memory::HostMemory;
    use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric};

    let Some(etcd) = start_etcd() else { return };
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("a0", [10, 1, 0, 1]),
            SimDeviceDesc::roce("b0", [10, 2, 0, 1]),
        ])
        .with_delivery(Delivery::Background),
        4,
    );
    // Waits until etcd answers.
    let reader = connect(&etcd, Duration::from_secs(2));
    let cluster = MetadataMode::Etcd {
        endpoints: vec![etcd.endpoint.clone()],
        prefix: "/orbitte/test".into(),
        lease_ttl: Duration::from_secs(2),
    };
    // The target stores its record (listen address, epoch, listener
    // token) in etcd at build; the client finds it there by source id and
    // proves the recorded token.
    let token = orbitte_engine::secret::new_listener_token().unwrap();
    let target = EngineBuilder::new("etcd-target")
        .provider(fabric.provider_for(&["a0"]))
        .host_memory_without_rdma()
        .listener_token(token)
        .listen("127.0.0.1:0".parse().unwrap())
        .metadata(cluster.clone())
        .build()
        .unwrap();
    let client = EngineBuilder::new("etcd-client")
        .provider(fabric.provider_for(&["b0"]))
        .host_memory_without_rdma()
        .metadata(cluster)
        .build()
        .unwrap();
    let remote = HostMemory::alloc(1 << 20).unwrap();
    remote.fill(0, 1 << 20, 0x5a).unwrap();
    target.register(&remote, Access::RemoteReadWrite).unwrap();
    let record = reader
        .lookup("etcd-target")
        .unwrap()
        .expect("published at build");
    assert_eq!(record.epoch, target.epoch().value());
    assert_eq!(
        record.listen_addr,
        target.listen_addr().unwrap().to_string()
    );
    assert_eq!(record.listener_token, Some(token.to_hex()));
    // By address, without the token: refused.
    let refused = client
        .connect_with(
            target.listen_addr().unwrap(),
            ConnectOptions::new().path(PathKind::Tcp),
        )
        .unwrap_err();
    assert!(refused.to_string().contains("authentication"), "{refused}");

    let peer = client
        .connect_by_name_with("etcd-target", ConnectOptions::new().path(PathKind::Tcp))
        .unwrap();
    assert_eq!(peer.path, PathKind::Tcp);
    let dst = HostMemory::alloc(1 << 20).unwrap();
    let d = client.register(&dst, Access::LocalOnly).unwrap();
    let ids = client
        .submit(&[Request::read(&d, 0..1 << 20).from(&peer.ranges()[0], 0)])
        .unwrap();
    assert_eq!(
        client.wait(ids[0], Duration::from_secs(30)).unwrap().status,
        Status::Complete
    );
    assert_eq!(
        dst.to_vec(0, 1 << 20).unwrap(),
        remote.to_vec(0, 1 << 20).unwrap()
    );

    // Unknown sources are an error naming the cause.
    let e = client.connect_by_name("nobody").unwrap_err();
    assert!(matches!(e, ConnectError::NotInMetadata { .. }), "{e}");
    assert!(e.to_string().contains("no record of nobody"), "{e}");
    let _ = client.shutdown(Duration::from_secs(5));
    let _ = target.shutdown(Duration::from_secs(5));
}
