//! What a target logs about peers it refuses: peer-supplied text escaped
//! (no forged lines, no terminal escapes), and refusals rate-limited.
//!
//! This binary installs its own global subscriber that writes into a
//! buffer, so its tests read exactly what an operator's log would show.
#![forbid(unsafe_code)]

mod net_support;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use net_support::{Target, cfg, raw};
use orbitte_wire::auth::ClusterSecret;
use orbitte_wire::{
    Capabilities, Epoch, ErrorCode, Frame, Hello, Identity, Nonce, SessionPurpose, SourceId,
};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The log of this test binary (every test shares it: each looks for its
/// own markers).
fn log() -> &'static Captured {
    static LOG: OnceLock<Captured> = OnceLock::new();
    LOG.get_or_init(|| {
        let c = Captured::default();
        let w = c.clone();
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("orbitte_engine=debug"))
            .with_ansi(false)
            .with_writer(move || w.clone())
            .init();
        c
    })
}

fn text() -> String {
    String::from_utf8_lossy(&log().0.lock().unwrap()).into_owned()
}

fn secret() -> ClusterSecret {
    ClusterSecret::new(vec![0x5a; 32]).unwrap()
}

#[test]
fn a_source_id_with_newlines_and_escapes_cannot_forge_log_lines() {
    log();
    let mut c = cfg("target", 1);
    c.cluster_secret = Some(secret());
    let t = Target::start(c);
    let evil = "evil-7\nWARN forged: admin logged in\x1b[2J\x1b[31m";
    // No proof: the target refuses it, and logs who it was.
    let mut s = raw::connect(t.addr());
    let Frame::Challenge(_) = raw::read_frame(&mut s).unwrap() else {
        panic!("no challenge")
    };
    raw::send(
        &mut s,
        &Frame::Hello(Hello {
            identity: Identity::new(
                SourceId::new(evil).unwrap(),
                Epoch::new(1).unwrap(),
                Capabilities::TCP,
            ),
            nonce: Nonce([3; 32]),
            purpose: SessionPurpose::DATA,
            proof: None,
        }),
    );
    let frames = raw::read_until_closed(&mut s);
    assert!(
        frames.iter().any(
            |f| matches!(f, Frame::Error(e) if e.code == ErrorCode::AUTH_REQUIRED
                || e.code == ErrorCode::AUTH_FAILED)
        ),
        "{frames:?}"
    );
    net_support::eventually("the refusal is logged", || text().contains("evil-7"));
    let log = text();
    assert!(
        !log.lines().any(|l| l.starts_with("WARN forged")),
        "a peer forged a log line:\n{log}"
    );
    assert!(
        !log.contains('\x1b'),
        "a peer wrote a terminal escape:\n{log}"
    );
    assert!(log.contains("evil-7\\\\nWARN forged") || log.contains("evil-7\\nWARN forged"));
}

/// A target that logs 5 lines a second of each kind.
fn target_with_budget(source: &str) -> Target {
    log();
    let mut c = cfg(source, 1);
    c.refusal_logs_per_second = 5;
    Target::start(c)
}

#[test]
fn refusals_are_logged_within_a_budget_and_the_rest_counted() {
    let t = target_with_budget("budget-target");
    let started = Instant::now();
    const REFUSED: u64 = 200;
    for _ in 0..REFUSED {
        let mut s = raw::connect(t.addr());
        let _ = raw::read_frame(&mut s);
        let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n");
        let _ = raw::read_until_closed(&mut s);
    }
    net_support::eventually("every refusal counted", || {
        t.listener.stats().refused >= REFUSED
    });
    let elapsed = started.elapsed();
    // Only this test's peers send HTTP.
    let logged = text()
        .lines()
        .filter(|l| l.contains("session closed") && l.contains("bad magic"))
        .count() as u64;
    let stats = t.listener.stats();
    // At most the budget per second (plus one window for the edges),
    // whatever the machine's speed; the rest is counted, none is lost.
    let budget = 5 * (elapsed.as_secs() + 2);
    assert!(
        logged <= budget,
        "{logged} refusal lines in {elapsed:?} (budget {budget})"
    );
    assert_eq!(
        logged + stats.refusals_not_logged,
        stats.refused,
        "{stats:?}"
    );
}

/// The count a budgeted line carries (`left_out=N`).
fn left_out(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("left_out="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no left_out in {line:?}"))
}

/// The lines of the log that hold both `what` and `who`.
fn lines_with(what: &str, who: &str) -> Vec<String> {
    text()
        .lines()
        .filter(|l| l.contains(what) && l.contains(who))
        .map(str::to_owned)
        .collect()
}

/// One authenticated session that says goodbye: a normal close.
fn polite_session(t: &Target, source: &str) {
    let (mut s, _) = raw::handshake(t.addr(), source, 1, None);
    raw::send(
        &mut s,
        &Frame::Goodbye(orbitte_wire::Goodbye {
            reason: orbitte_wire::GoodbyeReason::NORMAL,
            message: orbitte_wire::Message::truncating("done"),
        }),
    );
    let _ = raw::read_until_closed(&mut s);
}

#[test]
fn sessions_that_close_normally_are_logged_within_a_budget_and_the_rest_counted() {
    let t = target_with_budget("polite-target");
    let closed = |t: &Target| {
        t.listener
            .closed_sessions()
            .iter()
            .filter(|c| {
                !c.abnormal
                    && c.source_id
                        .as_ref()
                        .is_some_and(|s| s.as_str() == "polite-peer")
            })
            .count() as u64
    };
    let lines = || lines_with("session closed", "polite-peer");
    const SESSIONS: u64 = 300;
    let started = Instant::now();
    for _ in 0..SESSIONS {
        polite_session(&t, "polite-peer");
    }
    net_support::eventually("every session closed", || closed(&t) == SESSIONS);
    let elapsed = started.elapsed();
    let flood = lines();
    let budget = 5 * (elapsed.as_secs() + 2);
    assert!(
        (flood.len() as u64) <= budget,
        "{} lines for {SESSIONS} sessions in {elapsed:?} (budget {budget})",
        flood.len()
    );
    // Once the budget has a token again (one each 200 ms), the next
    // session's line carries the count of those left out.
    std::thread::sleep(std::time::Duration::from_millis(250));
    polite_session(&t, "polite-peer");
    net_support::eventually("the later session closed", || closed(&t) == SESSIONS + 1);
    let all = lines();
    assert_eq!(all.len(), flood.len() + 1, "{all:#?}");
    let counted: u64 = all.iter().map(|l| left_out(l)).sum();
    assert_eq!(counted + all.len() as u64, SESSIONS + 1, "{all:#?}");
    // The later line reports exactly the flood's lines left out after its
    // last logged one (none when that last one was the flood's last).
    let reported_in_flood: u64 = flood.iter().map(|l| left_out(l)).sum();
    let unreported = SESSIONS - flood.len() as u64 - reported_in_flood;
    assert_eq!(left_out(&all[all.len() - 1]), unreported, "{all:#?}");
}

/// An rdma peer that connects again and again (each a control session
/// the target accepts) is logged within the target's budget; the lines
/// left out are counted in the next one.
#[test]
fn rdma_peers_accepted_over_and_over_are_logged_within_a_budget() {
    use orbitte_engine::transport::PathKind;
    use orbitte_engine::{Access, ConnectOptions, EngineBuilder};
    use orbitte_memory::HostMemory;
    use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric};
    log();
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("a0", [10, 1, 0, 1]),
            SimDeviceDesc::roce("b0", [10, 2, 0, 1]),
        ])
        .with_delivery(Delivery::Background),
        5,
    );
    let target = EngineBuilder::new("logs-rdma-target")
        .provider(fabric.provider_for(&["a0"]))
        .session_settings(|c| c.refusal_logs_per_second = 1)
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    let client = EngineBuilder::new("logs-rdma-client")
        .provider(fabric.provider_for(&["b0"]))
        .session_settings(|c| {
            c.host_id = orbitte_wire::HostId::new("another-host").unwrap();
        })
        .build()
        .unwrap();
    let remote = HostMemory::alloc(1 << 20).unwrap();
    target.register(&remote, Access::REMOTE_READ_WRITE).unwrap();
    let addr = target.listen_addr().unwrap();
    let lines = || lines_with("rdma peer accepted", "logs-rdma-client");
    const CONNECTS: u64 = 12;
    let started = Instant::now();
    for _ in 0..CONNECTS {
        let peer = client
            .connect_with(addr, ConnectOptions::new().path(PathKind::Rdma).rails(1))
            .unwrap();
        assert_eq!(peer.path, PathKind::Rdma);
    }
    let elapsed = started.elapsed();
    let flood = lines();
    // One a second (plus the first), whatever the machine's speed.
    let budget = elapsed.as_secs() + 2;
    assert!(
        (flood.len() as u64) <= budget,
        "{} lines for {CONNECTS} accepted peers in {elapsed:?} (budget {budget})",
        flood.len()
    );
    // A second later the budget has a line again: the next accepted peer
    // is logged with the count of those left out.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    client
        .connect_with(addr, ConnectOptions::new().path(PathKind::Rdma).rails(1))
        .unwrap();
    net_support::eventually("the later peer is logged", || {
        lines().len() == flood.len() + 1
    });
    let all = lines();
    let counted: u64 = all.iter().map(|l| left_out(l)).sum();
    assert_eq!(counted + all.len() as u64, CONNECTS + 1, "{all:#?}");
    let _ = client.shutdown(std::time::Duration::from_secs(5));
    let _ = target.shutdown(std::time::Duration::from_secs(5));
}
