//! `orbitte serve --metrics` scraped by a real Prometheus server (Debian's
//! `prometheus` package): the counters it stores rise with a bench run
//! against the serve. And a scrape after 5,000 peers, each with its own
//! source id, handshook and were served one READ stays within a bound in
//! bytes (peer rows are bounded and leave with their peers); the test
//! prints the scrape's size and serve's resident memory.
#![forbid(unsafe_code)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::cargo::CommandCargoExt as _;
use orbitte_wire::{
    Capabilities, Epoch, Frame, FrameHeader, HEADER_LEN, Hello, Identity, Nonce, ReadRequest,
    RequestId, SessionPurpose, SourceId,
};

const PROMETHEUS: &str = "/usr/bin/prometheus";
/// How long Prometheus gets to scrape what is asked of it.
const BOUND: Duration = Duration::from_secs(30);

fn orbitte() -> Command {
    let mut c = Command::cargo_bin("orbitte").expect("the orbitte binary is built");
    c.env_remove("ORBITTE_LOG").env("ORBITTE_LOG", "error");
    for v in orbitte_topology::ENV_VARS {
        c.env_remove(v);
    }
    c
}

/// Kills the child when dropped (a failing test leaves no process behind).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first address in `line` (`127.0.0.1:PORT`, trailing punctuation
/// and a URL path cut off).
fn address_in(line: &str) -> Option<String> {
    line.split_whitespace()
        .map(|w| w.trim_start_matches("http://"))
        .find(|w| w.starts_with("127.0.0.1:"))
        .map(|w| {
            w.trim_end_matches("/metrics")
                .trim_end_matches([';', ','])
                .to_owned()
        })
}

/// A port free on loopback now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `GET path` on `at`; the body of a 200 answer.
fn get(at: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&at, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {at}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// The value of the instant query `q` (one series expected; `None`: no
/// answer or no series yet).
fn query(prometheus: SocketAddr, q: &str) -> Option<f64> {
    let body = get(prometheus, &format!("/api/v1/query?query={}", encode(q)))?;
    // Chunked answers carry the JSON between size lines: the document
    // is the part from the first `{` to the last `}`.
    let json = &body[body.find('{')?..=body.rfind('}')?];
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let result = v["data"]["result"].as_array()?;
    result.first()?["value"][1].as_str()?.parse().ok()
}

/// `q` percent-encoded for a URL query (every byte but letters, digits
/// and `_`).
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Polls `q` until `ok` holds for its value, up to [`BOUND`].
fn poll(prometheus: SocketAddr, q: &str, ok: impl Fn(f64) -> bool) -> Option<f64> {
    let deadline = Instant::now() + BOUND;
    loop {
        let v = query(prometheus, q);
        if v.is_some_and(&ok) || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn prometheus_scrapes_serve_and_sees_the_counters_rise_with_a_bench_run() {
    if !Path::new(PROMETHEUS).exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{PROMETHEUS} is missing: install Debian's prometheus package (.ci/run does)"
        );
        println!("skipped: {PROMETHEUS} is missing (apt-get install prometheus)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        "[engine]\nsource_id = \"metrics-test\"\nlisten = \"127.0.0.1:0\"\n\n[[range]]\nname = \"kv\"\nsize = \"2M\"\naccess = \"read-write\"\n",
    )
    .unwrap();
    let mut serve = KillOnDrop(
        orbitte()
            .args(["serve", "--config", config.to_str().unwrap()])
            .args(["--metrics", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn orbitte serve"),
    );
    let mut lines = BufReader::new(serve.0.stdout.take().unwrap()).lines();
    let (mut metrics, mut data) = (None, None);
    for line in lines.by_ref() {
        let line = line.expect("serve's stdout");
        if line.starts_with("metrics at ") {
            metrics = address_in(&line);
        } else if line.starts_with("serving as ") {
            data = address_in(&line);
        }
        if metrics.is_some() && data.is_some() {
            break;
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    let metrics: SocketAddr = metrics
        .expect("serve prints its metrics address")
        .parse()
        .unwrap();
    let data = data.expect("serve prints its address");
    let text = get(metrics, "/metrics").expect("serve answers GET /metrics");
    assert!(
        text.contains("# TYPE orbitte_transfer_bytes_total counter"),
        "{text}"
    );

    let web: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let yml = dir.path().join("prometheus.yml");
    std::fs::write(
        &yml,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: orbitte\n    static_configs:\n      - targets: ['{metrics}']\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let _prometheus = KillOnDrop(
        Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", yml.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus"),
    );
    let log = || std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
    let up = poll(web, "up", |v| v == 1.0);
    assert_eq!(
        up,
        Some(1.0),
        "prometheus never scraped {metrics}; its log:\n{}",
        log()
    );
    // No request served yet: no series, or all of them 0.
    let before = query(web, "sum(orbitte_transfer_bytes_total)").unwrap_or(0.0);
    let requests_before = query(web, "sum(orbitte_transfer_requests_total)").unwrap_or(0.0);

    let bench = orbitte()
        .args([
            "bench",
            "--json",
            "--quiet",
            "--role",
            "initiator",
            "--peer",
            &data,
        ])
        .args(["--path", "tcp", "--duration", "0.5", "--check"])
        .output()
        .expect("orbitte bench runs");
    assert!(
        bench.status.success(),
        "bench: {}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&bench.stdout).unwrap();
    let moved = report["points"][0]["bytes"].as_f64();

    let after = poll(web, "sum(orbitte_transfer_bytes_total)", |v| v > before);
    assert!(
        after.is_some_and(|v| v > before),
        "orbitte_transfer_bytes_total did not rise from {before} (now {after:?}); bench moved {moved:?}; prometheus log:\n{}",
        log()
    );
    // Everything the bench timed was served (and its warm-up and check
    // besides).
    let moved = moved.expect("bench reports the bytes it moved");
    let served = poll(
        web,
        "sum(orbitte_transfer_bytes_total{side=\"target\",path=\"tcp\"})",
        |v| v >= moved,
    );
    assert!(
        served.is_some_and(|v| v >= moved),
        "served {served:?} < moved {moved}"
    );
    let requests = query(web, "sum(orbitte_transfer_requests_total)").unwrap_or(0.0);
    assert!(
        requests > requests_before,
        "{requests_before} -> {requests}"
    );
}

/// Peers that come and go.
const PEERS: usize = 5000;
/// Peers whose sessions stay open while the metrics are read.
const HELD: usize = 200;
/// The most a scrape may take, in bytes: 64 peer rows and the other
/// peers' row, each a few samples, and the engine-wide families.
const SCRAPE_BOUND: usize = 64 << 10;

fn send(s: &mut TcpStream, f: &Frame) {
    let mut buf = Vec::new();
    f.encode(&mut buf).unwrap();
    s.write_all(&buf).unwrap();
}

/// One frame (a data frame's payload is left on the socket).
fn read_frame(s: &mut TcpStream) -> Frame {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = FrameHeader::decode(&h).unwrap();
    let mut body = vec![0u8; h.fixed_len()];
    s.read_exact(&mut body).unwrap();
    orbitte_wire::decode_body(&h, &body).unwrap()
}

/// A session as `source` that reads one byte of the first range.
fn peer(at: SocketAddr, source: &str) -> TcpStream {
    let mut s = TcpStream::connect(at).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let Frame::Challenge(_) = read_frame(&mut s) else {
        panic!("the first frame is not a challenge");
    };
    send(
        &mut s,
        &Frame::Hello(Hello {
            identity: Identity::new(
                SourceId::new(source).unwrap(),
                Epoch::MIN,
                Capabilities::TCP,
            ),
            nonce: Nonce([7; 32]),
            purpose: SessionPurpose::DATA,
            proof: None,
        }),
    );
    let Frame::HelloAck(_) = read_frame(&mut s) else {
        panic!("handshake refused");
    };
    let Frame::SegmentPublication(p) = read_frame(&mut s) else {
        panic!("no publication");
    };
    let range = &p.ranges[0];
    send(
        &mut s,
        &Frame::ReadRequest(ReadRequest {
            request_id: RequestId(1),
            range_id: range.range_id,
            token: range.token,
            offset: 0,
            length: 1,
        }),
    );
    // The answer's frame: the READ was served (and counted).
    read_frame(&mut s);
    s
}

fn scrape(at: SocketAddr) -> String {
    let mut s = TcpStream::connect(at).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

/// serve's resident memory (VmRSS), in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `orbitte serve --config CONFIG --metrics 127.0.0.1:0`, its metrics
/// address and its engine's address.
fn start_serve(config: &Path) -> (KillOnDrop, SocketAddr, SocketAddr) {
    let mut serve = KillOnDrop(
        orbitte()
            .args(["serve", "--config", config.to_str().unwrap()])
            .args(["--metrics", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn orbitte serve"),
    );
    let mut lines = BufReader::new(serve.0.stdout.take().unwrap()).lines();
    let (mut metrics, mut data) = (None, None);
    for line in lines.by_ref() {
        let line = line.expect("serve's stdout");
        if line.starts_with("metrics at ") {
            metrics = address_in(&line);
        } else if line.starts_with("serving as ") {
            data = address_in(&line);
        }
        if metrics.is_some() && data.is_some() {
            break;
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    let addr = |a: Option<String>, what: &str| -> SocketAddr {
        a.unwrap_or_else(|| panic!("serve prints its {what}"))
            .parse()
            .unwrap()
    };
    (
        serve,
        addr(metrics, "metrics address"),
        addr(data, "address"),
    )
}

#[test]
fn a_scrape_after_five_thousand_peers_stays_within_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        "[engine]\nsource_id = \"bound-test\"\nlisten = \"127.0.0.1:0\"\n\n[[range]]\nname = \"kv\"\nsize = \"64K\"\naccess = \"read\"\n",
    )
    .unwrap();
    let (serve, metrics, data) = start_serve(&config);
    let pid = serve.0.id();
    let rss_before = rss_kib(pid);

    let mut held = Vec::new();
    for i in 0..PEERS {
        let s = peer(data, &format!("peer-{i}"));
        if i % (PEERS / HELD) == 0 {
            held.push(s);
        }
    }
    let first = scrape(metrics);
    let second = scrape(metrics);
    let rss_after = rss_kib(pid);
    let rows = |text: &str| {
        let mut peers: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("orbitte_transfer_requests_total{"))
            .filter_map(|l| l.split("peer=\"").nth(1)?.split('"').next())
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers.len()
    };
    println!(
        "after {PEERS} peers ({HELD} held): scrapes of {} and {} bytes, {} and {} peer rows; serve VmRSS {rss_before:?} KiB at start, {rss_after:?} KiB after",
        first.len(),
        second.len(),
        rows(&first),
        rows(&second)
    );
    for text in [&first, &second] {
        assert!(
            text.len() <= SCRAPE_BOUND,
            "a scrape of {} bytes, over {SCRAPE_BOUND}",
            text.len()
        );
        assert!(rows(text) <= 65, "{} peer rows", rows(text));
    }
    // The peers past the bound are counted, together.
    assert!(
        second.contains(
            "orbitte_transfer_requests_total{path=\"tcp\",peer=\"\",op=\"read\",side=\"target\"}"
        ),
        "{second}"
    );
    drop(held);
}
