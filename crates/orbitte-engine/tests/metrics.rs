//! The engine's metrics: what `TransferEngine::metrics` counts moves with
//! the requests, outcomes and refusals the engine saw, and the Prometheus
//! text says the same.
#![forbid(unsafe_code)]

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use orbitte_engine::metrics::{MetricsSnapshot, OpMetrics};
use orbitte_engine::outcome::Status;
use orbitte_engine::{Access, ConnectOptions, EngineBuilder, PathKind, Request, TransferEngine};
use orbitte_memory::HostMemory;

const BOUND: Duration = Duration::from_secs(20);

fn target(name: &str) -> TransferEngine {
    EngineBuilder::new(name)
        .listen("127.0.0.1:0".parse().unwrap())
        .host_memory_without_rdma()
        .build()
        .unwrap()
}

fn op<'a>(m: &'a MetricsSnapshot, path: &str, peer: &str, op: &str) -> &'a OpMetrics {
    m.peers
        .iter()
        .find(|p| p.path == path && p.peer == peer)
        .unwrap_or_else(|| panic!("no row for {path}/{peer}: {m:#?}"))
        .ops
        .iter()
        .find(|o| o.op == op)
        .unwrap()
}

/// The counts of outcomes the test saw, as the metrics keep them.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    requests: u64,
    bytes: u64,
    complete: u64,
    failed: u64,
    timed_out: u64,
    cancelled: u64,
}

fn tally_of(o: &OpMetrics) -> Tally {
    Tally {
        requests: o.requests,
        bytes: o.bytes,
        complete: o.outcomes.complete,
        failed: o.outcomes.failed,
        timed_out: o.outcomes.timed_out,
        cancelled: o.outcomes.cancelled,
    }
}

fn transfers_are_counted_per_path_and_peer(path: PathKind) {
    let decode = target("decode");
    let prefill = EngineBuilder::new("prefill")
        .host_memory_without_rdma()
        .build()
        .unwrap();
    let dst = HostMemory::alloc(4 << 20).unwrap();
    decode.register(&dst, Access::REMOTE_READ_WRITE).unwrap();
    let src = HostMemory::alloc(4 << 20).unwrap();
    let local = prefill.register(&src, Access::LocalOnly).unwrap();
    let peer = prefill
        .connect_with(
            decode.listen_addr().unwrap(),
            ConnectOptions::new().path(path),
        )
        .unwrap();
    let range = &peer.ranges()[0];
    let before = prefill.metrics();
    assert!(
        before
            .peers
            .iter()
            .all(|p| p.ops.iter().all(|o| o.requests == 0)),
        "nothing counted before a request: {before:#?}"
    );

    let (mut writes, mut reads) = (Tally::default(), Tally::default());
    let mut record = |o: &orbitte_engine::Outcome| {
        let t = if o.op == orbitte_engine::Op::Write {
            &mut writes
        } else {
            &mut reads
        };
        t.requests += 1;
        t.bytes += o.completed_prefix;
        match o.status {
            Status::Complete => t.complete += 1,
            Status::Failed => t.failed += 1,
            Status::TimedOut => t.timed_out += 1,
            Status::Cancelled => t.cancelled += 1,
        }
    };
    let batch: Vec<Request> = (0..3u64)
        .map(|i| Request::write(&local, i << 20..(i + 1) << 20).to(range, i << 20))
        .chain([Request::read(&local, 3 << 20..(3 << 20) + 4096).from(range, 0)])
        .collect();
    let ids = prefill.submit(&batch).unwrap();
    for o in prefill.wait_all(&ids, BOUND).unwrap() {
        assert!(o.is_complete(), "{o:?}");
        record(&o);
    }
    // A cancel that comes first makes a cancelled outcome; one that comes
    // late finds the request complete: the metrics say which.
    let id = prefill
        .submit(&[Request::write(&local, 0..4 << 20).to(range, 0)])
        .unwrap()[0];
    prefill.cancel(id);
    let o = prefill.wait(id, BOUND).unwrap();
    record(&o);
    prefill.wait_drain(id, BOUND).unwrap();

    let m = prefill.metrics();
    let name = path.name();
    let (w, r) = (
        op(&m, name, "decode", "write"),
        op(&m, name, "decode", "read"),
    );
    assert_eq!(tally_of(w), writes, "{m:#?}");
    assert_eq!(tally_of(r), reads, "{m:#?}");
    assert_eq!((w.latency.count, r.latency.count), (writes.requests, 1));
    assert!(w.latency.sum_seconds > 0.0);
    let uncertain = u64::from(
        o.status != Status::Complete && o.remote_effect != orbitte_engine::RemoteEffect::None,
    );
    assert_eq!(w.outcomes.uncertain, uncertain);
    let row = m.peers.iter().find(|p| p.path == name).unwrap();
    assert!(row.rails_up >= 1, "{row:?}");
    assert_eq!(row.rails_down, 0);
    assert_eq!(
        m.registration.bytes_used, 0,
        "host memory off rdma charges nothing"
    );

    let text = m.to_prometheus();
    let labels = format!("path=\"{name}\",peer=\"decode\",op=\"write\"");
    let want = format!(
        "orbitte_transfer_bytes_total{{{labels},side=\"initiator\"}} {}",
        writes.bytes
    );
    assert!(text.lines().any(|l| l == want), "{want} not in\n{text}");
    let want = format!(
        "orbitte_transfer_latency_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
        writes.requests
    );
    assert!(text.lines().any(|l| l == want), "{want} not in\n{text}");

    let served = decode.metrics();
    if path == PathKind::Tcp {
        let (w, r) = (
            op(&served, "tcp", "prefill", "write"),
            op(&served, "tcp", "prefill", "read"),
        );
        assert_eq!(
            (r.served_bytes, r.served_requests),
            (4096, 1),
            "{served:#?}"
        );
        assert!(w.served_bytes >= writes.bytes, "{served:#?}");
        assert!(w.served_requests >= 3, "{served:#?}");
        assert_eq!(
            (w.requests, r.requests),
            (0, 0),
            "the target made no request"
        );
    } else {
        let row = served.peers.iter().find(|p| p.peer == "prefill");
        assert!(
            row.is_none_or(|p| p.ops.iter().all(|o| o.served_requests == 0)),
            "the target does not see local requests: {served:#?}"
        );
    }
    let l = served.listener.expect("the target listens");
    assert!(l.accepted >= 1 && l.admitted >= 1, "{l:?}");
    assert!(served.registration.max_bytes > 0);
    if path == PathKind::Tcp {
        every_metric_is_documented(&served);
    }
}

fn doc(name: &str) -> String {
    let at = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(name);
    std::fs::read_to_string(&at).unwrap_or_else(|e| panic!("{}: {e}", at.display()))
}

/// The keys of `v` and of every object in it, by place (an array's
/// elements share one place), each with the kind of its value.
fn shape(place: &str, v: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let kind = match x {
                    Value::Null => "null",
                    Value::Bool(_) => "bool",
                    Value::Number(_) => "number",
                    Value::String(_) => "string",
                    Value::Array(_) => "array",
                    Value::Object(_) => "object",
                };
                out.push(format!("{place}.{k}: {kind}"));
                shape(&format!("{place}.{k}"), x, out);
            }
        }
        Value::Array(items) => {
            for i in items {
                shape(&format!("{place}[]"), i, out);
            }
        }
        _ => {}
    }
    out.sort();
    out.dedup();
}

/// docs/configuration.md names every metric family the Prometheus text
/// has (and no other), and docs/json.md's example of the snapshot has
/// exactly its keys, each holding the same kind of value.
fn every_metric_is_documented(m: &MetricsSnapshot) {
    let text = m.to_prometheus();
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let config = doc("configuration.md");
    for f in &families {
        assert!(
            config.contains(&format!("| `{f}` |")),
            "docs/configuration.md has no table row for {f}"
        );
    }
    let rows: Vec<&str> = config
        .lines()
        .filter_map(|l| l.strip_prefix("| `orbitte_"))
        .filter_map(|l| l.split('`').next())
        .collect();
    assert_eq!(rows.len(), families.len(), "one row per family: {rows:?}");

    let json = doc("json.md");
    let block = json
        .split_once("<!-- json: metrics snapshot -->\n```json\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .map(|(b, _)| b)
        .expect("docs/json.md has the metrics snapshot example");
    let documented: serde_json::Value = serde_json::from_str(block).unwrap();
    let real = serde_json::to_value(m).unwrap();
    let (mut want, mut got) = (Vec::new(), Vec::new());
    shape("", &documented, &mut want);
    shape("", &real, &mut got);
    assert_eq!(
        got, want,
        "docs/json.md's snapshot example and the snapshot differ"
    );
}

#[test]
fn transfers_over_tcp_are_counted_per_peer() {
    transfers_are_counted_per_path_and_peer(PathKind::Tcp);
}

#[test]
fn transfers_over_the_local_path_are_counted_per_peer() {
    transfers_are_counted_per_path_and_peer(PathKind::Local);
}

/// Polls `engine.metrics()` until `done` says so (bounded by `BOUND`).
fn until(engine: &TransferEngine, done: impl Fn(&MetricsSnapshot) -> bool) -> MetricsSnapshot {
    let deadline = Instant::now() + BOUND;
    loop {
        let m = engine.metrics();
        if done(&m) || Instant::now() > deadline {
            return m;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn preauth_refusals_and_evictions_are_counted() {
    let refusing = EngineBuilder::new("refusing")
        .listen("127.0.0.1:0".parse().unwrap())
        .host_memory_without_rdma()
        .session_settings(|c| c.max_unauthenticated_per_address = 1)
        .build()
        .unwrap();
    let at = refusing.listen_addr().unwrap();
    let _first = TcpStream::connect(at).unwrap();
    let mut second = TcpStream::connect(at).unwrap();
    // The refusal is sent, then the socket closes.
    second.set_read_timeout(Some(BOUND)).unwrap();
    let _ = second.read_to_end(&mut Vec::new());
    let m = until(&refusing, |m| {
        m.listener.is_some_and(|l| l.preauth_refused >= 1)
    });
    let l = m.listener.unwrap();
    assert_eq!((l.preauth_refused, l.preauth_evicted), (1, 0), "{l:?}");
    assert!(
        m.to_prometheus()
            .lines()
            .any(|l| l == "orbitte_preauth_refusals_total 1")
    );

    let evicting = EngineBuilder::new("evicting")
        .listen("127.0.0.1:0".parse().unwrap())
        .host_memory_without_rdma()
        .session_settings(|c| {
            c.max_unauthenticated = 1;
            c.max_unauthenticated_per_address = 4;
        })
        .build()
        .unwrap();
    let at = evicting.listen_addr().unwrap();
    let mut oldest = TcpStream::connect(at).unwrap();
    let m = until(&evicting, |m| m.listener.is_some_and(|l| l.accepted >= 1));
    assert_eq!(m.listener.unwrap().preauth_evicted, 0);
    let _newcomer = TcpStream::connect(at).unwrap();
    // The oldest is closed for the newcomer.
    oldest.set_read_timeout(Some(BOUND)).unwrap();
    let _ = oldest.read_to_end(&mut Vec::new());
    let m = until(&evicting, |m| {
        m.listener.is_some_and(|l| l.preauth_evicted >= 1)
    });
    let l = m.listener.unwrap();
    assert_eq!((l.preauth_evicted, l.preauth_refused), (1, 0), "{l:?}");
}
