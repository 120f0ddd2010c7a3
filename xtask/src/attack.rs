//! `cargo xtask attack [--seconds N] [--keep]`: an adversarial suite against
//! a real `orbitte serve`.
//!
//! It builds the `orbitte` binary, starts `orbitte serve` on a loopback
//! port with a pattern-filled range (what the legitimate bench reads back)
//! and a scratch range, and runs each attack in turn: connections that
//! never authenticate, headers announcing huge bodies (before and after the
//! handshake), source ids carrying newlines and terminal escapes, a flood
//! of refused connections, peers that never read a 16 MiB READ answer, a
//! flood of new source ids, 50,000 notifications to a queue nobody reads
//! (the log must stay within its budget and under 1/50 of the bytes sent),
//! a churn of connections that never authenticate while a legitimate peer
//! measures its handshakes (p50, p99 and max; the p99 must stay under
//! 500 ms), every session slot held by idle sessions while a legitimate
//! peer needs one, slow, oversized and malformed request heads on the
//! metrics port (`serve --metrics`) while a scraper must be answered, and
//! random mutations of valid frames aimed at
//! the scratch range (for `--seconds`, default 20). Attackers connect from
//! other loopback addresses (127.0.0.2 and up) than the legitimate bench.
//! After each attack it checks that the server still runs, that its
//! resident memory and its open descriptors came back within bounds of
//! where they started, that its log holds no forged line and no terminal
//! escape, and that a legitimate `orbitte bench --check` still passes.
//!
//! Every wait is bounded; a failed check names the attack and the
//! measurement. The server's log is kept (and its path printed) on failure
//! or with `--keep`.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use orbitte_wire::{
    Capabilities, Epoch, Frame, FrameHeader, FrameType, HEADER_LEN, Hello, Identity,
    MAX_CONTROL_BODY_LEN, Nonce, PROTOCOL_VERSION, RangeId, ReadRequest, RequestId,
    SegmentPublication, SegmentRetire, SessionPurpose, SourceId, WriteRequest,
};

/// Resident memory the server may keep above its starting point.
const RSS_SLACK: u64 = 256 << 20;
/// Open descriptors it may keep above its starting point (after the
/// attackers left and their sessions were closed).
const FD_SLACK: usize = 32;
/// Refusal lines the server may log per second (its default budget).
const REFUSAL_LOGS_PER_SECOND: u64 = 10;

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let mut seconds = 20u64;
    let mut keep = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--seconds takes a whole number of seconds")?;
            }
            "--keep" => keep = true,
            other => return Err(format!("unknown argument `{other}` (--seconds N, --keep)")),
        }
    }
    let orbitte = build()?;
    let dir = std::env::temp_dir().join(format!("orbitte-attack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut server = Server::start(&orbitte, &dir)?;
    let result = attacks(&mut server, seconds);
    server.stop();
    match &result {
        Ok(()) if !keep => {
            let _ = std::fs::remove_dir_all(&dir);
        }
        _ => eprintln!("xtask attack: server log kept in {}", server.log.display()),
    }
    result
}

fn attacks(server: &mut Server, seconds: u64) -> Result<(), String> {
    // Warm up with one legitimate run, so that what the engine allocates
    // once is in the starting point.
    server.bench("at the start")?;
    let base = server.measure()?;
    println!(
        "xtask attack: server pid {} on {}: {} MiB resident, {} descriptors",
        server.pid,
        server.addr,
        base.rss >> 20,
        base.fds
    );
    type Attack = fn(&Server, &Measure) -> Result<(), String>;
    let list: [(&str, Attack); 11] = [
        ("silent connections", silent_connections),
        ("announced hello", announced_hello),
        ("announced publication", announced_publication),
        ("log injection", log_injection),
        ("refusal flood", refusal_flood),
        ("slow readers", slow_readers),
        ("source id flood", source_id_flood),
        ("notification flood", notification_flood),
        ("pre-auth churn", preauth_churn),
        ("idle sessions", idle_sessions),
        ("metrics port", metrics_port),
    ];
    for (name, attack) in list {
        let started = Instant::now();
        attack(server, &base).map_err(|e| format!("{name}: {e}"))?;
        server.after(name, &base)?;
        println!(
            "xtask attack: {name}: held ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
    }
    let started = Instant::now();
    let sent = mutation(server, Duration::from_secs(seconds))?;
    server.after("frame mutation", &base)?;
    println!(
        "xtask attack: frame mutation: held {sent} mutated frames ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Builds the `orbitte` binary; returns its path.
fn build() -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = crate::workspace::root();
    let status = Command::new(&cargo)
        .current_dir(&root)
        .args(["build", "--quiet", "-p", "orbitte-cli"])
        .status()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    if !status.success() {
        return Err("building orbitte-cli failed".into());
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join("debug").join("orbitte");
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!("no binary at {} after the build", bin.display()))
    }
}

#[derive(Debug, Clone, Copy)]
struct Measure {
    rss: u64,
    fds: usize,
}

struct Server {
    orbitte: PathBuf,
    child: Child,
    pid: u32,
    addr: SocketAddr,
    /// Where `orbitte serve --metrics` answers scrapes.
    metrics: SocketAddr,
    log: PathBuf,
}

impl Server {
    fn start(orbitte: &Path, dir: &Path) -> Result<Self, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let metrics = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port for the metrics: {e}"))?;
        let config = dir.join("serve.toml");
        std::fs::write(
            &config,
            format!(
                "[engine]\nsource_id = \"attack-target\"\nlisten = \"{addr}\"\n\
                 metadata = \"p2p\"\n\n[[range]]\nname = \"data\"\nsize = \"64M\"\n\
                 access = \"read-write\"\nfill = \"pattern\"\n\n[[range]]\n\
                 name = \"scratch\"\nsize = \"1M\"\naccess = \"read-write\"\n"
            ),
        )
        .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
        let log = dir.join("serve.log");
        let out = std::fs::File::create(&log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(orbitte)
            .args(["serve", "--config"])
            .arg(&config)
            .arg("--metrics")
            .arg(metrics.to_string())
            .env("ORBITTE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", orbitte.display()))?;
        let mut server = Self {
            orbitte: orbitte.to_path_buf(),
            pid: child.id(),
            child,
            addr,
            metrics,
            log,
        };
        // It listens first, then publishes its ranges, then says it serves.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            server.alive("start")?;
            let log = std::fs::read(&server.log).unwrap_or_default();
            if String::from_utf8_lossy(&log).contains("serving as") {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "orbitte serve did not start serving on {addr} within 120 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(server)
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn alive(&mut self, what: &str) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("after {what}: orbitte serve exited ({status})")),
            Err(e) => Err(format!("after {what}: cannot wait for orbitte serve: {e}")),
        }
    }

    fn measure(&self) -> Result<Measure, String> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .map_err(|e| format!("cannot read the server's status: {e}"))?;
        let rss = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .ok_or("no VmRSS in the server's status")?
            * 1024;
        let fds = std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .map_err(|e| format!("cannot list the server's descriptors: {e}"))?
            .count();
        Ok(Measure { rss, fds })
    }

    /// The checks after an attack: alive, descriptors and memory back
    /// within bounds (waiting for sessions to be closed), log clean, and a
    /// legitimate bench passes.
    fn after(&mut self, what: &str, base: &Measure) -> Result<(), String> {
        self.alive(what)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let now = loop {
            let m = self.measure()?;
            if m.fds <= base.fds + FD_SLACK || Instant::now() > deadline {
                break m;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        if now.fds > base.fds + FD_SLACK {
            return Err(format!(
                "after {what}: the server holds {} descriptors, {} at the start",
                now.fds, base.fds
            ));
        }
        within(&now, base, &format!("after {what}"))?;
        let log = std::fs::read(&self.log).map_err(|e| format!("cannot read the log: {e}"))?;
        if log.contains(&0x1b) {
            return Err(format!(
                "after {what}: a terminal escape reached the server's log"
            ));
        }
        if String::from_utf8_lossy(&log)
            .lines()
            .any(|l| l.starts_with("FORGED"))
        {
            return Err(format!(
                "after {what}: a peer forged a line of the server's log"
            ));
        }
        self.bench(&format!("after {what}"))
    }

    /// A legitimate initiator reads the pattern back over tcp and checks
    /// every byte.
    fn bench(&self, when: &str) -> Result<(), String> {
        let out = Command::new(&self.orbitte)
            .args(["bench", "--role", "initiator", "--peer"])
            .arg(self.addr.to_string())
            .args([
                "--op",
                "read",
                "--check",
                "--path",
                "tcp",
                "--duration",
                "1",
                "--quiet",
                "--no-baseline",
            ])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run orbitte bench: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{when}: a legitimate `orbitte bench --check` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

fn connect(addr: SocketAddr) -> Result<TcpStream, String> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("cannot connect: {e}"))?;
    timeouts(s)
}

/// A connection from the loopback address `127.0.0.<from>`: attackers come
/// from other addresses than the legitimate bench (127.0.0.1), as they
/// would on a network.
fn connect_from(from: u8, addr: SocketAddr) -> Result<TcpStream, String> {
    use rustix::net::{AddressFamily, SocketType};
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None)
        .map_err(|e| format!("no socket: {e}"))?;
    // A blocking connect waits at most the send timeout.
    rustix::net::sockopt::set_socket_timeout(
        &fd,
        rustix::net::sockopt::Timeout::Send,
        Some(Duration::from_secs(5)),
    )
    .map_err(|e| format!("cannot set a connect timeout: {e}"))?;
    rustix::net::bind(&fd, &SocketAddr::from(([127, 0, 0, from], 0)))
        .map_err(|e| format!("cannot bind 127.0.0.{from}: {e}"))?;
    rustix::net::connect(&fd, &addr).map_err(|e| format!("cannot connect: {e}"))?;
    timeouts(TcpStream::from(fd))
}

fn timeouts(s: TcpStream) -> Result<TcpStream, String> {
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .and_then(|()| s.set_write_timeout(Some(Duration::from_secs(5))))
        .map_err(|e| e.to_string())?;
    Ok(s)
}

fn send(s: &mut TcpStream, f: &Frame) -> std::io::Result<()> {
    let mut buf = Vec::new();
    f.encode(&mut buf).map_err(std::io::Error::other)?;
    s.write_all(&buf)
}

/// Reads one frame (a data frame's payload is left on the socket).
fn read_frame(s: &mut TcpStream) -> Result<Frame, String> {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).map_err(|e| e.to_string())?;
    let h = FrameHeader::decode(&h).map_err(|e| e.to_string())?;
    let mut body = vec![0u8; h.fixed_len()];
    s.read_exact(&mut body).map_err(|e| e.to_string())?;
    orbitte_wire::decode_body(&h, &body).map_err(|e| e.to_string())
}

fn hello(source: &str) -> Result<Frame, String> {
    let source_id = SourceId::new(source).map_err(|e| e.to_string())?;
    Ok(Frame::Hello(Hello {
        identity: Identity::new(source_id, Epoch::MIN, Capabilities::TCP),
        nonce: Nonce([7; 32]),
        purpose: SessionPurpose::DATA,
        proof: None,
    }))
}

/// A session as `source`; returns it and the server's first publication.
fn handshake(addr: SocketAddr, source: &str) -> Result<(TcpStream, SegmentPublication), String> {
    let mut s = connect(addr)?;
    let Frame::Challenge(_) = read_frame(&mut s)? else {
        return Err("the server's first frame is not a challenge".into());
    };
    send(&mut s, &hello(source)?).map_err(|e| e.to_string())?;
    match read_frame(&mut s)? {
        Frame::HelloAck(_) => {}
        other => return Err(format!("handshake refused: {other:?}")),
    }
    match read_frame(&mut s)? {
        Frame::SegmentPublication(p) => Ok((s, p)),
        other => Err(format!("expected the publication, got {other:?}")),
    }
}

fn header(frame_type: FrameType, body_len: u32) -> [u8; HEADER_LEN] {
    FrameHeader {
        version: PROTOCOL_VERSION,
        frame_type,
        body_len,
    }
    .encode()
}

/// 300 connections that never say a word, held while a legitimate peer
/// needs a session.
fn silent_connections(server: &Server, _: &Measure) -> Result<(), String> {
    let held: Vec<TcpStream> = (0..300)
        .filter_map(|i| connect_from(2 + (i % 40) as u8, server.addr).ok())
        .collect();
    let served = server.bench("while 300 unauthenticated connections were held");
    drop(held);
    served
}

/// 250 connections each announce a 4 MiB hello and send nothing more.
fn announced_hello(server: &Server, base: &Measure) -> Result<(), String> {
    let mut held = Vec::new();
    for i in 0..250 {
        let Ok(mut s) = connect_from(2 + (i % 40) as u8, server.addr) else {
            continue;
        };
        if read_frame(&mut s).is_ok()
            && s.write_all(&header(FrameType::HELLO, MAX_CONTROL_BODY_LEN))
                .is_ok()
        {
            held.push(s);
        }
    }
    let m = server.measure()?;
    println!(
        "xtask attack:   with 250 announced hellos held: {} MiB resident",
        m.rss >> 20
    );
    within(&m, base, "while 250 announced hellos were held")
}

/// 100 authenticated sessions each announce a 4 MiB publication and send
/// 16 bytes of it.
fn announced_publication(server: &Server, base: &Measure) -> Result<(), String> {
    let mut held = Vec::new();
    for i in 0..100 {
        let (mut s, _) = handshake(server.addr, &format!("announcer-{i}"))?;
        let _ = s.write_all(&header(
            FrameType::SEGMENT_PUBLICATION,
            MAX_CONTROL_BODY_LEN,
        ));
        let _ = s.write_all(&[0u8; 16]);
        held.push(s);
    }
    std::thread::sleep(Duration::from_secs(1));
    let m = server.measure()?;
    println!(
        "xtask attack:   with 100 announced publications held: {} MiB resident",
        m.rss >> 20
    );
    within(&m, base, "while 100 announced publications were held")
}

/// Resident memory within [`RSS_SLACK`] of the start.
fn within(m: &Measure, base: &Measure, when: &str) -> Result<(), String> {
    if m.rss > base.rss + RSS_SLACK {
        return Err(format!(
            "{} MiB resident {when}, {} MiB at the start",
            m.rss >> 20,
            base.rss >> 20
        ));
    }
    Ok(())
}

/// Source ids that would forge log lines and drive a terminal.
fn log_injection(server: &Server, _: &Measure) -> Result<(), String> {
    for i in 0..20 {
        let Ok(mut s) = connect(server.addr) else {
            continue;
        };
        if read_frame(&mut s).is_err() {
            continue;
        }
        let id = format!("evil-{i}\nFORGED admin logged in\x1b[2J\x1b[31m");
        let _ = send(&mut s, &hello(&id)?);
        let _ = read_frame(&mut s);
        // An admitted one says goodbye with the same text in its message.
        let _ = send(
            &mut s,
            &Frame::Goodbye(orbitte_wire::Goodbye {
                reason: orbitte_wire::GoodbyeReason::NORMAL,
                message: orbitte_wire::Message::truncating("bye\nFORGED goodbye\x1b[0m"),
            }),
        );
    }
    Ok(())
}

/// 2000 connections that speak HTTP: every one is refused; the log keeps
/// to its budget.
fn refusal_flood(server: &Server, _: &Measure) -> Result<(), String> {
    let count = |log: &str| log.lines().filter(|l| l.contains("bad magic")).count() as u64;
    let before = count(&String::from_utf8_lossy(
        &std::fs::read(&server.log).map_err(|e| e.to_string())?,
    ));
    let started = Instant::now();
    for i in 0..2000 {
        let Ok(mut s) = connect_from(2 + (i % 40) as u8, server.addr) else {
            continue;
        };
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    std::thread::sleep(Duration::from_secs(2));
    let elapsed = started.elapsed().as_secs();
    let logged = count(&String::from_utf8_lossy(
        &std::fs::read(&server.log).map_err(|e| e.to_string())?,
    )) - before;
    let budget = REFUSAL_LOGS_PER_SECOND * (elapsed + 2);
    if logged > budget {
        return Err(format!(
            "{logged} refusal lines in {elapsed} s, more than the budget of {budget}"
        ));
    }
    Ok(())
}

/// Peers that ask for a 16 MiB READ and never read the answer: the server
/// closes them within its io_timeout (10 s) and lets go of their sockets.
fn slow_readers(server: &Server, _: &Measure) -> Result<(), String> {
    let mut held = Vec::new();
    for i in 0..4 {
        let (mut s, p) = handshake(server.addr, &format!("slow-reader-{i}"))?;
        let Some(range) = p.ranges.iter().max_by_key(|r| r.length) else {
            return Err("the server published no range".into());
        };
        send(
            &mut s,
            &Frame::ReadRequest(ReadRequest {
                request_id: RequestId(1),
                range_id: range.range_id,
                token: range.token,
                offset: 0,
                length: 16 << 20,
            }),
        )
        .map_err(|e| e.to_string())?;
        held.push(s);
    }
    // `after` waits for the descriptors while these are still held.
    std::thread::sleep(Duration::from_secs(15));
    drop(held);
    Ok(())
}

/// 1500 handshakes, each with a new source id.
fn source_id_flood(server: &Server, _: &Measure) -> Result<(), String> {
    for i in 0..1500 {
        let (s, _) = handshake(server.addr, &format!("flood-{i}"))?;
        drop(s);
    }
    Ok(())
}

/// Notifications sent by [`notification_flood`]: far more than the
/// server's queue holds (1024), which it never reads.
const FLOOD_NOTIFICATIONS: u64 = 50_000;
/// Lines the server may log per second about refused notifications (the
/// inbox's budget).
const NOTIFICATION_LOGS_PER_SECOND: u64 = 10;
/// The most log the server may write for the notifications it refused,
/// as a fraction of the bytes they took on the wire.
const NOTIFICATION_LOG_FRACTION: u64 = 50;

/// 50,000 small notifications on one session to a server whose queue
/// fills at 1024: it answers each (queued or refused, and they add up),
/// logs the refusals within its budget, and its log grows by at most 1/50
/// of the bytes sent.
fn notification_flood(server: &Server, _: &Measure) -> Result<(), String> {
    let log = || std::fs::read(&server.log).map_err(|e| format!("cannot read the log: {e}"));
    let refused = |log: &[u8]| {
        String::from_utf8_lossy(log)
            .lines()
            .filter(|l| l.contains("notification refused"))
            .count() as u64
    };
    let before = log()?;
    let (mut s, _) = handshake(server.addr, "notification-flood")?;
    let mut wire = Vec::new();
    for i in 0..FLOOD_NOTIFICATIONS {
        Frame::Notification(orbitte_wire::Notification {
            notification_id: i,
            payload: i.to_le_bytes().to_vec(),
        })
        .encode(&mut wire)
        .map_err(|e| e.to_string())?;
    }
    let started = Instant::now();
    // Every notification is answered (queued or refused), in order: read
    // the answers while sending, or the server waits for this reader.
    let mut answers = s.try_clone().map_err(|e| e.to_string())?;
    answers
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let reader = std::thread::spawn(move || {
        let (mut queued, mut turned) = (0u64, 0u64);
        while queued + turned < FLOOD_NOTIFICATIONS {
            match read_frame(&mut answers) {
                Ok(Frame::NotificationAnswer(a)) if a.verdict.is_queued() => queued += 1,
                Ok(Frame::NotificationAnswer(_)) => turned += 1,
                Ok(other) => return Err(format!("{} instead of an answer", other.frame_type())),
                Err(e) => {
                    return Err(format!("{e} after {} answers", queued + turned));
                }
            }
        }
        Ok((queued, turned))
    });
    s.set_write_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    s.write_all(&wire)
        .map_err(|e| format!("the server stopped reading notifications: {e}"))?;
    let (queued, turned) = reader
        .join()
        .map_err(|_| "the answer reader panicked".to_owned())??;
    // serve takes its notifications as they come, so more than its inbox
    // bound may be queued over the flood; none may go unanswered.
    if queued + turned != FLOOD_NOTIFICATIONS {
        return Err(format!(
            "{queued} notifications queued and {turned} refused of {FLOOD_NOTIFICATIONS} sent"
        ));
    }
    drop(s);
    std::thread::sleep(Duration::from_millis(500));
    let elapsed = started.elapsed().as_secs();
    let after = log()?;
    let grown = after.len().saturating_sub(before.len()) as u64;
    let lines = refused(&after).saturating_sub(refused(&before));
    let budget = NOTIFICATION_LOGS_PER_SECOND * (elapsed + 2);
    if lines > budget {
        return Err(format!(
            "{lines} lines about refused notifications in {elapsed} s, more than the budget of {budget}"
        ));
    }
    let sent = wire.len() as u64;
    if grown * NOTIFICATION_LOG_FRACTION > sent {
        return Err(format!(
            "the log grew by {grown} bytes for {sent} bytes of notifications, more than 1/{NOTIFICATION_LOG_FRACTION}"
        ));
    }
    println!(
        "xtask attack: notification flood: {sent} bytes sent, {queued} queued, {turned} refused \
         and told, {grown} bytes logged ({lines} lines)"
    );
    Ok(())
}

/// Legitimate handshakes [`preauth_churn`] measures.
const CHURN_HANDSHAKES: usize = 200;
/// The pause between two of them, so that the churn lasts seconds.
const CHURN_PACE: Duration = Duration::from_millis(10);
/// Threads that churn unauthenticated connections meanwhile.
const CHURN_ATTACKERS: u8 = 2;
/// Each starts this many connections at once, then pauses for
/// [`CHURN_TICK`]: bursts far larger than a listener's default queue of
/// 128, at an average rate the server takes in.
const CHURN_BURST: usize = 256;
/// The pause between two bursts.
const CHURN_TICK: Duration = Duration::from_millis(100);
/// Connections each attacker keeps open (silent) across bursts.
const CHURN_HELD: usize = 64;
/// The p99 of the legitimate handshakes under the churn must stay under
/// this. A correctness bound, not a speed claim: a listener that lets its
/// backlog fill drops the legitimate peer's SYN, which the kernel sends
/// again only after a second.
const CHURN_P99_BOUND: Duration = Duration::from_millis(500);

/// A connection from `127.0.0.<from>` started without waiting for it to
/// be established (a SYN sent; the kernel finishes the handshake).
fn start_connect(from: u8, addr: SocketAddr) -> Option<rustix::fd::OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
    .ok()?;
    rustix::net::bind(&fd, &SocketAddr::from(([127, 0, 0, from], 0))).ok()?;
    match rustix::net::connect(&fd, &addr) {
        Ok(()) | Err(rustix::io::Errno::INPROGRESS) => Some(fd),
        Err(_) => None,
    }
}

/// Attackers start connections that never authenticate in bursts of
/// [`CHURN_BURST`], without waiting for any (each keeps its last
/// [`CHURN_HELD`] open, silent, and drops the older), while a legitimate peer does
/// [`CHURN_HANDSHAKES`] handshakes one after the other, each timed from
/// connect to the server's first publication.
fn preauth_churn(server: &Server, _: &Measure) -> Result<(), String> {
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let attackers: Vec<_> = (0..CHURN_ATTACKERS)
        .map(|t| {
            let (stop, opened, addr) = (stop.clone(), opened.clone(), server.addr);
            std::thread::spawn(move || {
                let mut held = VecDeque::with_capacity(CHURN_HELD);
                let mut n = 0u8;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..CHURN_BURST {
                        n = n.wrapping_add(1);
                        let Some(s) = start_connect(2 + t * 20 + n % 20, addr) else {
                            continue;
                        };
                        opened.fetch_add(1, Ordering::Relaxed);
                        if held.len() == CHURN_HELD {
                            held.pop_front();
                        }
                        held.push_back(s);
                    }
                    std::thread::sleep(CHURN_TICK);
                }
            })
        })
        .collect();
    // The churn runs before the first measurement.
    std::thread::sleep(Duration::from_millis(200));
    let mut took = Vec::with_capacity(CHURN_HANDSHAKES);
    let mut failed = None;
    for i in 0..CHURN_HANDSHAKES {
        let started = Instant::now();
        match handshake(server.addr, &format!("churn-legit-{i}")) {
            Ok(_) => took.push(started.elapsed()),
            Err(e) => {
                failed = Some(format!(
                    "legitimate handshake {i} under the churn failed: {e}"
                ));
                break;
            }
        }
        std::thread::sleep(CHURN_PACE);
    }
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        let _ = a.join();
    }
    if let Some(e) = failed {
        return Err(e);
    }
    let q = quantiles(&mut took);
    println!(
        "xtask attack:   {} legitimate handshakes among {} unauthenticated connections: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        took.len(),
        opened.load(Ordering::Relaxed),
        ms(q.p50),
        ms(q.p99),
        ms(q.max)
    );
    if q.p99 > CHURN_P99_BOUND {
        return Err(format!(
            "the p99 of legitimate handshakes was {:.1} ms (max {:.1} ms), over the {} ms bound: the churn starved the listener's backlog",
            ms(q.p99),
            ms(q.max),
            CHURN_P99_BOUND.as_millis()
        ));
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Quantiles {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

/// The median, 99th percentile (nearest rank) and maximum of a nonempty
/// sample.
fn quantiles(sample: &mut [Duration]) -> Quantiles {
    sample.sort_unstable();
    let rank = |q: f64| {
        let r = (sample.len() as f64 * q).ceil() as usize;
        sample[r.clamp(1, sample.len()) - 1]
    };
    Quantiles {
        p50: rank(0.5),
        p99: rank(0.99),
        max: sample.last().copied().unwrap_or_default(),
    }
}

/// Sessions the server serves at once by default (`max_sessions`).
const SERVER_MAX_SESSIONS: usize = 256;
/// How long a session must be idle before a newcomer may take its slot
/// (`evict_idle_after`), with a margin.
const IDLE_ENOUGH: Duration = Duration::from_millis(1500);

/// Idle authenticated sessions, each from its own source, take every one
/// of the server's session slots; once they are idle long enough, a
/// legitimate `orbitte bench --check` is still served.
fn idle_sessions(server: &Server, _: &Measure) -> Result<(), String> {
    let mut held = Vec::with_capacity(SERVER_MAX_SESSIONS);
    for i in 0..SERVER_MAX_SESSIONS {
        let (s, _) = handshake(server.addr, &format!("idler-{i}"))
            .map_err(|e| format!("idle session {i}: {e}"))?;
        held.push(s);
    }
    std::thread::sleep(IDLE_ENOUGH);
    let served = server.bench(&format!(
        "while {SERVER_MAX_SESSIONS} idle sessions held every slot"
    ));
    drop(held);
    served
}

/// Slow request heads held on the metrics port, more than it serves at
/// once.
const METRICS_SLOW_HEADS: u8 = 100;

/// One scrape of `GET /metrics`; returns the whole answer.
fn scrape(addr: SocketAddr) -> Result<String, String> {
    let mut s = connect(addr)?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: attack\r\n\r\n")
        .map_err(|e| format!("cannot send the scrape: {e}"))?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .map_err(|e| format!("no answer to the scrape: {e}"))?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// Sends `bytes` to the metrics port from `127.0.0.<from>`: the answer
/// must be `status`, or none (the server closed the connection).
fn refused(from: u8, at: SocketAddr, bytes: &[u8], status: &str, what: &str) -> Result<(), String> {
    let mut s = connect_from(from, at)?;
    // A server that closes the connection mid-write has refused it too.
    let _ = s.write_all(bytes);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let line = String::from_utf8_lossy(&answer);
    let line = line.lines().next().unwrap_or("");
    if answer.is_empty() || line.starts_with(&format!("HTTP/1.1 {status}")) {
        Ok(())
    } else {
        Err(format!("{what} was answered with `{line}`, not {status}"))
    }
}

/// The metrics port under slow and malformed clients: a hundred heads
/// that never end, one head over the size bound, and bytes that are not
/// HTTP (with a terminal escape); a scraper must still be answered while
/// they are held, each bad request must get its status, and the log must
/// stay clean (the checks after every attack).
fn metrics_port(server: &Server, _: &Measure) -> Result<(), String> {
    let at = server.metrics;
    let mut slow = Vec::with_capacity(usize::from(METRICS_SLOW_HEADS));
    for i in 0..METRICS_SLOW_HEADS {
        let mut s = connect_from(2 + i % 50, at).map_err(|e| format!("slow head {i}: {e}"))?;
        // Every failure counts: a server that closes the connection has
        // fended the attacker off.
        let _ = s.write_all(b"GET /metr");
        slow.push(s);
    }
    let mut head = b"GET /metrics HTTP/1.1\r\nX-Pad: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 16 * 1024));
    refused(60, at, &head, "431", "a 16 KiB request head")?;
    refused(
        61,
        at,
        b"\x1b[31mFORGED\r\n\r\n",
        "400",
        "bytes that are not HTTP",
    )?;
    let answer =
        scrape(at).map_err(|e| format!("while {METRICS_SLOW_HEADS} slow heads were held: {e}"))?;
    if !answer.starts_with("HTTP/1.1 200") || !answer.contains("orbitte_") {
        return Err(format!(
            "while {METRICS_SLOW_HEADS} slow heads were held, the scrape got `{}`",
            answer.lines().next().unwrap_or("")
        ));
    }
    drop(slow);
    Ok(())
}

/// A small xorshift generator: the mutations need variety, not quality.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Valid frames to mutate, given the range the server published.
fn seeds(range: RangeId, token: orbitte_wire::AccessToken) -> Vec<Vec<u8>> {
    let epoch = Epoch::MIN;
    let frames = [
        Frame::ReadRequest(ReadRequest {
            request_id: RequestId(9),
            range_id: range,
            token,
            offset: 4096,
            length: 4096,
        }),
        Frame::WriteRequest(WriteRequest {
            request_id: RequestId(10),
            range_id: range,
            token,
            offset: 8192,
            length: 64,
        }),
        Frame::SegmentPublication(SegmentPublication {
            epoch,
            ranges: Vec::new(),
        }),
        Frame::SegmentRetire(SegmentRetire {
            epoch,
            range_ids: vec![RangeId(3)],
        }),
    ];
    frames
        .iter()
        .filter_map(|f| {
            let mut b = Vec::new();
            f.encode(&mut b).ok()?;
            // A write-request's payload follows its fixed part.
            b.resize(b.len() + f.payload_len() as usize, 0x5a);
            Some(b)
        })
        .collect()
}

fn mutate(rng: &mut Rng, mut b: Vec<u8>) -> Vec<u8> {
    match rng.below(5) {
        0 => {
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
        }
        1 => b.truncate(rng.below(b.len())),
        2 => {
            // The body length: anywhere, including huge.
            let len = (rng.next() as u32).to_be_bytes();
            if b.len() >= HEADER_LEN {
                b[8..12].copy_from_slice(&len);
            }
        }
        3 => b.extend((0..rng.below(64)).map(|_| rng.next() as u8)),
        _ => {
            // The frame type.
            if b.len() >= HEADER_LEN {
                b[6..8].copy_from_slice(&(rng.next() as u16 % 0x40).to_be_bytes());
            }
        }
    }
    b
}

/// Mutated frames for `bound`, half before and half after a handshake.
fn mutation(server: &mut Server, bound: Duration) -> Result<u64, String> {
    let (_s, p) = handshake(server.addr, "mutator-seed")?;
    // The small range: the bench reads the large one back and checks it.
    let Some(range) = p.ranges.iter().min_by_key(|r| r.length) else {
        return Err("the server published no range".into());
    };
    let mut pool = seeds(range.range_id, range.token);
    let mut pre = Vec::new();
    hello("mutator")?
        .encode(&mut pre)
        .map_err(|e| e.to_string())?;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x9e37_79b9_7f4a_7c15)
        | 1;
    println!("xtask attack: frame mutation seed {seed}");
    let mut rng = Rng(seed);
    let started = Instant::now();
    let mut sent = 0u64;
    let mut n = 0u64;
    while started.elapsed() < bound {
        n += 1;
        let mut s = if n.is_multiple_of(2) {
            let Ok((s, _)) = handshake(server.addr, &format!("mutator-{}", n % 64)) else {
                continue;
            };
            s
        } else {
            let Ok(mut s) = connect(server.addr) else {
                continue;
            };
            if read_frame(&mut s).is_err() {
                continue;
            }
            s
        };
        let base = if n.is_multiple_of(2) {
            pool[rng.below(pool.len())].clone()
        } else {
            pre.clone()
        };
        let frame = mutate(&mut rng, base);
        let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
        if s.write_all(&frame).is_ok() {
            sent += 1;
        }
        let mut sink = [0u8; 4096];
        let _ = s.read(&mut sink);
        if n.is_multiple_of(256) {
            server.alive("frame mutation")?;
            pool.push(frame);
            if pool.len() > 64 {
                pool.remove(4);
            }
        }
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut sample: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let q = quantiles(&mut sample);
        assert_eq!(q.p50, Duration::from_millis(50));
        assert_eq!(q.p99, Duration::from_millis(99));
        assert_eq!(q.max, Duration::from_millis(100));
        let q = quantiles(&mut [Duration::from_millis(7)]);
        assert_eq!(
            (q.p50, q.p99, q.max),
            (
                Duration::from_millis(7),
                Duration::from_millis(7),
                Duration::from_millis(7)
            )
        );
    }
}
