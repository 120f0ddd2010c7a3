//! Authentication: with a cluster secret, a peer that does not prove it can
//! neither read nor write, and the attempt is logged.
#![forbid(unsafe_code)]

mod net_support;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use net_support::{Initiator, RW, Target, cfg, pattern, raw, request, untouched};
use orbitte_engine::outcome::Status;
use orbitte_engine::session::SessionError;
use orbitte_engine::transport::{Op, PeerId};
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;
use orbitte_wire::auth::ClusterSecret;
use orbitte_wire::{AccessToken, ErrorCode, Frame, ReadRequest, RequestId, WriteRequest};

/// Everything the library logs, for checking that refusals are logged.
fn log() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
            .with_ansi(false)
            .with_writer(move || Sink(b.clone()))
            .try_init();
        buf
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);
impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logged(needle: &str) -> bool {
    for _ in 0..400 {
        if String::from_utf8_lossy(&log().lock().unwrap()).contains(needle) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    false
}

fn secret(s: &str) -> ClusterSecret {
    ClusterSecret::new(format!("{s}-cluster-secret-0123456789").into_bytes()).unwrap()
}

fn secured_target() -> (Target, Arc<HostMemory>, orbitte_wire::RangeId) {
    log();
    let mut c = cfg("vault", 1);
    c.cluster_secret = Some(secret("right"));
    c.handshake_timeout = Duration::from_millis(500);
    let t = Target::start(c);
    let mem = HostMemory::alloc(1 << 20).unwrap();
    pattern(&mem, 3);
    let id = t.ranges.publish(mem.clone(), RW).unwrap();
    (t, mem, id)
}

fn refused_code(e: &SessionError) -> ErrorCode {
    match e {
        SessionError::Refused { code, .. } => *code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_peer_without_the_proof_can_neither_read_nor_write_and_is_logged() {
    let (t, mem, range) = secured_target();

    // 1. An engine without a secret: refused at the handshake.
    let i = Initiator::new(cfg("intruder", 1), CoreConfig::default());
    let e = i.connect_tcp(PeerId(1), t.addr(), 1).unwrap_err();
    assert_eq!(refused_code(&e), ErrorCode::AUTH_REQUIRED, "{e}");
    assert!(
        logged("initiator failed authentication"),
        "refusal not logged"
    );

    // 2. A wrong secret.
    let mut c = cfg("intruder2", 1);
    c.cluster_secret = Some(secret("wrong"));
    let i = Initiator::new(c, CoreConfig::default());
    let e = i.connect_tcp(PeerId(1), t.addr(), 1).unwrap_err();
    assert_eq!(refused_code(&e), ErrorCode::AUTH_FAILED, "{e}");

    // 3. Skipping the handshake: raw READ and WRITE requests get no data and
    //    change nothing, even with the right range id and a guessed token.
    for write in [false, true] {
        let mut s = raw::connect(t.addr());
        raw::read_frame(&mut s).unwrap(); // challenge
        let mut buf = Vec::new();
        if write {
            Frame::WriteRequest(WriteRequest {
                request_id: RequestId(1),
                range_id: range,
                token: AccessToken(1),
                offset: 0,
                length: 4096,
            })
            .encode(&mut buf)
            .unwrap();
            buf.extend_from_slice(&[0xab; 4096]);
        } else {
            Frame::ReadRequest(ReadRequest {
                request_id: RequestId(1),
                range_id: range,
                token: AccessToken(1),
                offset: 0,
                length: 4096,
            })
            .encode(&mut buf)
            .unwrap();
        }
        let _ = s.write_all(&buf);
        let frames = raw::read_until_closed(&mut s);
        assert!(
            !frames
                .iter()
                .any(|f| matches!(f, Frame::ReadResponse(_) | Frame::WriteResponse(_))),
            "{frames:?}"
        );
    }
    // 4. A hello without a proof, sent by hand.
    raw::hello_is_refused_unproven(t.addr(), "raw", 1);
    untouched(&mem, 3);
    net_support::eventually("three refusals recorded", || {
        t.listener
            .closed_sessions()
            .iter()
            .filter(|c| c.abnormal && c.reason.contains("authentication"))
            .count()
            >= 3
    });
}

#[test]
fn a_peer_with_the_proof_reads_and_writes() {
    let (t, mem, range) = secured_target();
    let mut c = cfg("member", 1);
    c.cluster_secret = Some(secret("right"));
    let i = Initiator::new(c, CoreConfig::default());
    let local = HostMemory::alloc(64 << 10).unwrap();
    pattern(&local, 4);
    let reg = i.driver.register(local.clone());
    let (rails, _) = i.connect_tcp(PeerId(1), t.addr(), 2).unwrap();
    let w = i.driver.submit(vec![request(
        1,
        Op::Write,
        reg,
        0,
        PeerId(1),
        range.0,
        0,
        64 << 10,
        &rails,
    )])[0];
    assert_eq!(
        i.driver.wait(w, Duration::from_secs(30)).status,
        Status::Complete
    );
    assert_eq!(
        mem.to_vec(0, 64 << 10).unwrap(),
        local.to_vec(0, 64 << 10).unwrap()
    );
}

#[test]
fn an_initiator_with_a_secret_refuses_a_target_without_one() {
    log();
    let t = Target::start(cfg("open", 1));
    let mut c = cfg("careful", 1);
    c.cluster_secret = Some(secret("right"));
    let i = Initiator::new(c, CoreConfig::default());
    let e = i.connect_tcp(PeerId(1), t.addr(), 1).unwrap_err();
    // The target sees an unexpected proof and refuses; either way no session.
    assert!(
        matches!(e, SessionError::Refused { .. } | SessionError::Auth(_)),
        "{e:?}"
    );
}
