//! Listener tokens: an engine that listens with a token admits only peers
//! that connect with it (from its metadata); everyone else reads nothing,
//! writes nothing, notifies nothing and fences nobody out.
#![forbid(unsafe_code)]

mod net_support;

use std::net::SocketAddr;
use std::time::Duration;

use net_support::{pattern, raw, untouched};
use orbitte_engine::outcome::Status;
use orbitte_engine::secret::new_listener_token;
use orbitte_engine::{
    Access, ConnectError, ConnectOptions, EngineBuilder, PathKind, RangeId, TransferEngine,
    TransferRequest,
};
use orbitte_memory::HostMemory;
use orbitte_wire::auth::{ClusterSecret, ListenerToken};

const BOUND: Duration = Duration::from_secs(30);

fn engine(name: &str, tune: impl FnOnce(EngineBuilder) -> EngineBuilder) -> TransferEngine {
    tune(
        EngineBuilder::new(name)
            .host_memory_without_rdma()
            .secret_from_env(false)
            .handshake_timeout(Duration::from_secs(2))
            .listen("127.0.0.1:0".parse().unwrap()),
    )
    .build()
    .unwrap()
}

struct Vault {
    engine: TransferEngine,
    token: ListenerToken,
    mem: std::sync::Arc<HostMemory>,
    range: RangeId,
    addr: SocketAddr,
}

fn vault(secret: Option<ClusterSecret>) -> Vault {
    let token = new_listener_token().unwrap();
    let engine = engine("vault", |b| {
        let b = b.listener_token(token);
        match secret {
            Some(s) => b.cluster_secret(s),
            None => b,
        }
    });
    let mem = HostMemory::alloc(1 << 20).unwrap();
    pattern(&mem, 3);
    let reg = engine.register(&mem, Access::RemoteReadWrite).unwrap();
    let addr = engine.listen_addr().unwrap();
    Vault {
        engine,
        token,
        range: RangeId(reg.id.0),
        mem,
        addr,
    }
}

fn refused(e: &ConnectError) -> bool {
    let text = e.to_string();
    text.contains("authentication") || text.contains("proof")
}

#[test]
fn an_engine_without_the_token_is_refused_and_touches_nothing() {
    net_support::logs();
    let v = vault(None);
    assert_eq!(
        v.engine.open_listener(),
        None,
        "a token closes the listener"
    );
    // No token, and a wrong one: refused at the handshake, on every path.
    let outsider = engine("outsider", |b| b);
    for path in [PathKind::Tcp, PathKind::Local] {
        let e = outsider
            .connect_with(v.addr, ConnectOptions::new().path(path))
            .unwrap_err();
        assert!(refused(&e), "{path:?}: {e}");
        let wrong = new_listener_token().unwrap();
        let e = outsider
            .connect_with(v.addr, ConnectOptions::new().path(path).token(wrong))
            .unwrap_err();
        assert!(refused(&e), "{path:?}: {e}");
    }
    // A hand-made hello naming a real peer's source with the newest epoch
    // there is: refused, so the real peer is not fenced out.
    raw::hello_is_refused_unproven(v.addr, "member", u64::MAX);
    untouched(&v.mem, 3);
    assert_eq!(v.engine.notifications().len(), 0, "nothing was notified");

    // The member the fence aimed at still gets in, with the token.
    let member = engine("member", |b| b);
    let peer = member
        .connect_with(
            v.addr,
            ConnectOptions::new().path(PathKind::Tcp).token(v.token),
        )
        .unwrap();
    assert_eq!(peer.source_id(), "vault");
}

#[test]
fn the_token_opens_tcp_and_local_and_later_sessions_keep_it() {
    net_support::logs();
    let v = vault(None);
    let member = engine("member", |b| b);
    let src = HostMemory::alloc(1 << 20).unwrap();
    pattern(&src, 9);
    let s = member.register(&src, Access::LocalOnly).unwrap();
    for (path, len) in [(PathKind::Tcp, 256 << 10), (PathKind::Local, 1 << 20)] {
        let peer = member
            .connect_with(
                v.addr,
                ConnectOptions::new().path(path).rails(2).token(v.token),
            )
            .unwrap();
        assert_eq!(peer.path, path);
        let ids = member
            .submit(&[TransferRequest::write(
                s.id,
                0,
                peer.info.id,
                v.range,
                0,
                len,
            )])
            .unwrap();
        let o = member.wait(ids[0], BOUND).unwrap();
        assert_eq!(o.status, Status::Complete, "{path:?}: {o:?}");
        assert_eq!(
            v.mem.to_vec(0, len as usize).unwrap(),
            src.to_vec(0, len as usize).unwrap(),
            "{path:?}"
        );
    }
    // A later connect to the same address without the token still proves it.
    let again = member.connect_with(v.addr, ConnectOptions::new().path(PathKind::Tcp));
    assert!(again.is_ok(), "{again:?}");
}

#[test]
fn with_a_cluster_secret_the_token_alone_does_not_open() {
    net_support::logs();
    let secret = ClusterSecret::new(b"cluster-secret-of-this-test-0123".to_vec()).unwrap();
    let v = vault(Some(secret.clone()));
    let no_secret = engine("no-secret", |b| b);
    let e = no_secret
        .connect_with(
            v.addr,
            ConnectOptions::new().path(PathKind::Tcp).token(v.token),
        )
        .unwrap_err();
    assert!(refused(&e), "{e}");
    let both = engine("both", |b| b.cluster_secret(secret));
    let e = both
        .connect_with(v.addr, ConnectOptions::new().path(PathKind::Tcp))
        .unwrap_err();
    assert!(refused(&e), "the secret alone: {e}");
    both.connect_with(
        v.addr,
        ConnectOptions::new().path(PathKind::Tcp).token(v.token),
    )
    .unwrap();
}

#[test]
fn an_open_listener_beyond_this_host_says_what_it_exposes() {
    let open = EngineBuilder::new("open")
        .host_memory_without_rdma()
        .secret_from_env(false)
        .listen("0.0.0.0:0".parse().unwrap())
        .build()
        .unwrap();
    let w = open.open_listener().expect("open on every interface");
    assert!(w.contains("ORBITTE_SECRET_FILE"), "{w}");
    let closed = EngineBuilder::new("closed")
        .host_memory_without_rdma()
        .secret_from_env(false)
        .listener_token(new_listener_token().unwrap())
        .listen("0.0.0.0:0".parse().unwrap())
        .build()
        .unwrap();
    assert_eq!(closed.open_listener(), None);
    let loopback = engine("loopback", |b| b);
    assert_eq!(loopback.open_listener(), None);
}

#[test]
fn a_secret_file_is_read_and_a_bad_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, b"too short").unwrap();
    let e = EngineBuilder::new("x")
        .host_memory_without_rdma()
        .cluster_secret_file(&short)
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("short") && e.contains("16 random bytes"), "{e}");
    let missing = dir.path().join("missing");
    let e = EngineBuilder::new("x")
        .host_memory_without_rdma()
        .cluster_secret_file(&missing)
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing") && e.contains("cannot read"), "{e}");
    let good = dir.path().join("good");
    std::fs::write(&good, [7u8; 32]).unwrap();
    let secured = engine("secured", |b| b.cluster_secret_file(&good));
    let member = engine("member", |b| b.cluster_secret_file(&good));
    let outsider = engine("outsider", |b| b);
    let addr = secured.listen_addr().unwrap();
    assert!(
        member
            .connect_with(addr, ConnectOptions::new().path(PathKind::Tcp))
            .is_ok()
    );
    let e = outsider
        .connect_with(addr, ConnectOptions::new().path(PathKind::Tcp))
        .unwrap_err();
    assert!(refused(&e), "{e}");
}
