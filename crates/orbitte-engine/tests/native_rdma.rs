//! The rdma path for real: two engines in two processes on the native
//! provider (libibverbs), over one verbs device in loopback (`rxe0` inside
//! the Soft-RoCE guest, `cargo xtask softroce test`; any RDMA NIC
//! elsewhere). Runs where `ORBITTE_TEST_DEVICE` names the device and prints
//! `skipped: <reason>` otherwise.
//!
//! The test process is the initiator; it re-runs this test binary as the
//! target (the ignored `child_target` test, selected by
//! `ORBITTE_NATIVE_RDMA_ROLE=target`). Both make Host Direct registrations;
//! the initiator opens the target as a peer over a TCP control link
//! (handshake, segment descriptors, RC connect), then runs a mixed batch of
//! WRITE and READ requests and a batch of READs of what it wrote, checking
//! every byte (the target checks its own memory on request) and every
//! field of every outcome.
#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use orbitte_engine::session::TcpControlLink;
use orbitte_engine::transport::SliceFailure;
use orbitte_engine::{
    Access, DrainStatus, EngineBuilder, Op, Outcome, PathKind, PeerInfo, RangeId, RdmaConfig,
    Registration, RemoteEffect, Status, TransferEngine, TransferRequest,
};
use orbitte_memory::HostMemory;
use orbitte_wire::AccessFlags;

/// Held shared by every test that moves data over the device, and
/// exclusively by the one that takes its link down.
static LINK: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Env var that turns `child_target` into the target process.
const ROLE: &str = "ORBITTE_NATIVE_RDMA_ROLE";
/// Bytes of the target's published range (and of the initiator's memory).
const LEN: usize = 1 << 20;
/// Slice size: requests of up to 64 KiB are cut into several slices.
const SLICE: u32 = 16 << 10;
/// Requests per op in the mixed batch: WRITEs into the first half of the
/// range, READs from the second half.
const PER_OP: usize = 8;
/// Seed of the initiator's pattern (what it WRITEs).
const SEED_INITIATOR: u8 = 1;
/// Seed of the target's initial pattern (what the initiator READs).
const SEED_TARGET: u8 = 2;
/// Bound on anything the other process does. Soft-RoCE under software
/// emulation moves about 16 MB/s with milliseconds of latency: generous.
const BOUND: Duration = Duration::from_secs(120);
const TARGET_SOURCE: &str = "native-rdma-target";
const INITIATOR_SOURCE: &str = "native-rdma-initiator";

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect()
}

fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

/// The device under test, or `None` (after printing why) to skip.
fn device() -> Option<String> {
    match std::env::var("ORBITTE_TEST_DEVICE") {
        Ok(d) if !d.is_empty() => Some(d),
        _ => {
            println!(
                "skipped: ORBITTE_TEST_DEVICE is not set (name a verbs device, e.g. rxe0 in `cargo xtask softroce test`)"
            );
            None
        }
    }
}

/// The engine's RDMA configuration: only the device under test, with
/// `ORBITTE_TEST_PORT` / `ORBITTE_TEST_GID_INDEX` pinning port and GID when
/// set (otherwise the engine's own discovery picks them).
fn rdma_config(device: &str) -> RdmaConfig {
    let mut cfg = RdmaConfig::default().device(device);
    let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
    if let Some(p) = var("ORBITTE_TEST_PORT") {
        cfg = cfg.port(p);
    }
    if let Some(g) = var("ORBITTE_TEST_GID_INDEX") {
        cfg = cfg.gid_index(g);
    }
    cfg
}

fn engine(source: &str, device: &str) -> TransferEngine {
    EngineBuilder::new(source)
        .rdma(rdma_config(device))
        .slice_size(SLICE)
        .request_timeout(Duration::from_secs(60))
        .drain_timeout(Duration::from_secs(30))
        .handshake_timeout(Duration::from_secs(60))
        .build()
        .expect("build an engine on the native provider")
}

/// Entry point of the target process (does nothing in a normal run).
#[test]
#[ignore = "entry point for the target process of the other test"]
fn child_target() {
    if std::env::var(ROLE).as_deref() == Ok("target") {
        run_target();
    }
}

/// The target: publishes one read-write range (Host Direct), accepts one
/// peer over a TCP control link, then answers `check OFFSET LEN SEED`
/// (are these bytes of the range `pattern(LEN, SEED)`'s?) and `retire`
/// (unpublish the range, revoking its rkey) until `quit` or the end of its
/// input, and shuts its engine down.
fn run_target() {
    logs();
    let device = std::env::var("ORBITTE_TEST_DEVICE").expect("the parent names the device");
    let engine = engine(TARGET_SOURCE, &device);
    let mem = HostMemory::alloc(LEN).unwrap();
    mem.write_at(0, &pattern(LEN, SEED_TARGET)).unwrap();
    let reg = engine
        .register_host(mem.clone(), Access::REMOTE_READ_WRITE)
        .expect("Host Direct registration (target)");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    println!(
        "READY {} {} {} {}",
        listener.local_addr().unwrap(),
        reg.id.0,
        reg.len,
        reg.copies
    );
    // Blocking accept: the parent connects right after READY (and kills
    // this process if it fails before that).
    let mut link = TcpControlLink::accept(&listener, BOUND).expect("accept the control link");
    let peer = engine
        .accept_peer(&mut link)
        .expect("accept the initiator as a peer");
    println!(
        "ACCEPTED {} {} {}",
        peer.source_id,
        peer.epoch,
        peer.rails.len()
    );
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["check", off, len, seed] => {
                let (off, len, seed): (usize, usize, u8) = (
                    off.parse().unwrap(),
                    len.parse().unwrap(),
                    seed.parse().unwrap(),
                );
                let got = mem.to_vec(off, len).unwrap();
                let want = &pattern(LEN, seed)[off..off + len];
                match got.iter().zip(want).position(|(g, w)| g != w) {
                    None => println!("CHECK ok"),
                    Some(i) => println!(
                        "CHECK bad: byte {} of the range is {:#04x}, want {:#04x}",
                        off + i,
                        got[i],
                        want[i]
                    ),
                }
            }
            ["await", ms, off, len, seed] => {
                // Waits for the next notification, then checks the bytes
                // its batch wrote, as they are when it is read.
                let (ms, off, len, seed): (u64, usize, usize, u8) = (
                    ms.parse().unwrap(),
                    off.parse().unwrap(),
                    len.parse().unwrap(),
                    seed.parse().unwrap(),
                );
                match engine.wait_notification(Duration::from_millis(ms)) {
                    None => println!("NOTIFIED none"),
                    Some(n) => {
                        let bytes_ok =
                            mem.to_vec(off, len).unwrap() == pattern(LEN, seed)[off..off + len];
                        println!(
                            "NOTIFIED {} {} {:?} {} {}",
                            n.source_id,
                            n.epoch,
                            n.path,
                            String::from_utf8_lossy(&n.payload),
                            if bytes_ok { "bytes-ok" } else { "bytes-bad" }
                        );
                    }
                }
            }
            ["retire"] => match engine.retire(reg.id) {
                Ok(()) => println!("RETIRED ok"),
                Err(e) => println!("RETIRED failed: {e}"),
            },
            ["quit"] => break,
            _ => println!("CHECK bad: unknown command {line:?}"),
        }
        let _ = std::io::stdout().flush();
    }
    match engine.shutdown(BOUND) {
        Ok(()) => println!("SHUTDOWN ok"),
        Err(u) => println!("SHUTDOWN unquiesced: {u}"),
    }
    drop(link);
}

/// The target process, killed when dropped (a failing test leaves no
/// process behind).
struct TargetProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl TargetProcess {
    fn spawn() -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args([
                "child_target",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, "target")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the target process");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// The words after `prefix` on the next line that has it (other lines
    /// are skipped).
    fn expect(&self, prefix: &str) -> Vec<String> {
        let deadline = Instant::now() + BOUND;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                // The harness may print "test child_target ... " before it.
                Ok(l) => {
                    if let Some(at) = l.find(prefix) {
                        return l[at + prefix.len()..]
                            .split_whitespace()
                            .map(str::to_owned)
                            .collect();
                    }
                }
                Err(e) => {
                    panic!("the target process did not print {prefix:?} within {BOUND:?}: {e}")
                }
            }
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("the target's input is open");
        writeln!(stdin, "{line}").expect("write to the target process");
        stdin.flush().unwrap();
    }

    /// Asks the target whether `len` bytes at `off` of its range are
    /// `pattern(LEN, seed)`'s.
    fn check(&mut self, off: usize, len: usize, seed: u8) {
        self.send(&format!("check {off} {len} {seed}"));
        let answer = self.expect("CHECK ").join(" ");
        assert_eq!(
            answer,
            "ok",
            "target range bytes {off}..{} (want seed {seed})",
            off + len
        );
    }
}

impl Drop for TargetProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Checks every field of a finished request's outcome: complete, whole
/// length, every slice, no failure, nothing uncertain, the remote effect
/// the op implies, drained.
fn check_outcome(o: &Outcome, op: Op, len: u64, label: u64) {
    let what = format!("{op:?} labelled {label}: {o:?}");
    assert_eq!(o.label, label, "{what}");
    assert_eq!(o.op, op, "{what}");
    assert_eq!(o.len, len, "{what}");
    assert_eq!(o.status, Status::Complete, "{what}");
    assert!(o.is_complete(), "{what}");
    assert_eq!(o.completed_prefix, len, "{what}");
    let slices = len.div_ceil(u64::from(SLICE)) as u32;
    assert_eq!(o.slices, slices, "{what}");
    assert_eq!(o.completed_slices, slices, "{what}");
    assert_eq!(o.failure, None, "{what}");
    assert!(o.uncertain.is_empty(), "{what}");
    let effect = match op {
        Op::Write => RemoteEffect::Complete,
        Op::Read => RemoteEffect::None,
    };
    assert_eq!(o.remote_effect, effect, "{what}");
    assert_eq!(o.drain, DrainStatus::Drained, "{what}");
}

/// Request `i`'s length: whole 64 KiB chunks and ragged ones (a last
/// slice shorter than the slice size).
fn chunk_len(i: usize) -> usize {
    let chunk = LEN / (2 * PER_OP);
    chunk - 4093 * (i % 3)
}

/// Both processes with their Host Direct registrations, the target opened
/// as a peer of the initiator over a TCP control link, everything checked
/// so far.
struct Connected {
    target: TargetProcess,
    /// The initiator's engine (this process).
    a: TransferEngine,
    /// The initiator's memory (`pattern(LEN, SEED_INITIATOR)`) and its
    /// local-only registration.
    local: Arc<HostMemory>,
    reg: Registration,
    peer: PeerInfo,
    /// The target's published range (`pattern(LEN, SEED_TARGET)`).
    range: RangeId,
    _link: TcpControlLink,
}

fn connect(device: &str) -> Connected {
    let target = TargetProcess::spawn();
    let ready = target.expect("READY ");
    let (addr, range, range_len, target_copies) = (
        ready[0].clone(),
        RangeId(ready[1].parse().unwrap()),
        ready[2].parse::<u64>().unwrap(),
        ready[3].parse::<u64>().unwrap(),
    );
    assert_eq!(range_len, LEN as u64);

    let a = engine(INITIATOR_SOURCE, device);
    let local = HostMemory::alloc(LEN).unwrap();
    local.write_at(0, &pattern(LEN, SEED_INITIATOR)).unwrap();
    let reg = a
        .register_host(local.clone(), Access::LocalOnly)
        .expect("Host Direct registration (initiator)");
    assert_eq!((reg.len, reg.access), (LEN as u64, Access::LocalOnly));
    let topo = a.topology();
    assert!(topo.initialized, "{topo:?}");
    assert!(
        !topo.contexts.is_empty() && topo.contexts.iter().all(|c| c.device == device),
        "the engine prepared contexts on {device} only: {topo:?}"
    );
    // Both engines are pinned to the same device: local-only is one MR copy
    // per NIC context, read-write two (local and remote keys).
    let contexts = topo.contexts.len() as u64;
    assert_eq!(reg.copies, contexts, "{reg:?}");
    assert_eq!(
        target_copies,
        2 * contexts,
        "target registration: {ready:?}"
    );

    // Handshake, segment descriptors and RC connect over the control link.
    let mut link = TcpControlLink::connect(addr.as_str(), BOUND).expect("connect to the target");
    let peer = a.open_peer(&mut link).expect("open the target as a peer");
    let accepted = target.expect("ACCEPTED ");
    assert_eq!(accepted[0], INITIATOR_SOURCE);
    assert_eq!(accepted[1], a.epoch().to_string());
    assert_eq!(peer.source_id, TARGET_SOURCE);
    let published = peer
        .ranges
        .iter()
        .find(|r| r.range == range)
        .unwrap_or_else(|| panic!("the target's range {range:?} is published: {peer:?}"));
    assert_eq!(published.len, LEN as u64, "{peer:?}");
    assert!(
        published
            .access
            .contains(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE),
        "{peer:?}"
    );
    assert!(!peer.rails.is_empty(), "{peer:?}");
    assert_eq!(accepted[2], peer.rails.len().to_string());
    for r in &peer.rails {
        assert!(r.up, "{r:?}");
        assert_eq!(r.device.as_deref(), Some(device), "{r:?}");
        assert!(
            r.qpn.is_some() && r.nic.is_some() && r.remote_nic.is_some(),
            "{r:?}"
        );
    }

    Connected {
        target,
        a,
        local,
        reg,
        peer,
        range,
        _link: link,
    }
}

#[test]
fn host_direct_write_and_read_batches_between_two_processes() {
    let Some(device) = device() else { return };
    let _link = LINK.read().unwrap_or_else(|e| e.into_inner());
    logs();
    let Connected {
        mut target,
        a,
        local,
        reg,
        peer,
        range,
        _link: link,
    } = connect(&device);
    let back = HostMemory::alloc(LEN / 2).unwrap();
    let reg_back = a
        .register_host(back.clone(), Access::LocalOnly)
        .expect("Host Direct registration (initiator, read-back buffer)");

    // One batch: WRITEs into the first half of the target's range, READs
    // from its second half into the second half of local memory.
    let half = LEN / 2;
    let chunk = half / PER_OP;
    let mut batch = Vec::new();
    let mut expected = Vec::new();
    for i in 0..PER_OP {
        let (off, len) = (i * chunk, chunk_len(i));
        batch.push(
            TransferRequest::write(reg.id, off as u64, peer.id, range, off as u64, len as u64)
                .label(i as u64),
        );
        expected.push((Op::Write, off, len));
    }
    for i in 0..PER_OP {
        let (off, len) = (half + i * chunk, chunk_len(i));
        batch.push(
            TransferRequest::read(reg.id, off as u64, peer.id, range, off as u64, len as u64)
                .label((PER_OP + i) as u64),
        );
        expected.push((Op::Read, off, len));
    }
    let ids = a.submit(&batch).expect("submit the mixed batch");
    assert_eq!(ids.len(), batch.len());
    let outcomes = a.wait_all(&ids, BOUND).expect("every outcome");
    for (k, (o, &(op, _, len))) in outcomes.iter().zip(&expected).enumerate() {
        assert_eq!(o.request, ids[k]);
        check_outcome(o, op, len as u64, k as u64);
        a.wait_drain(ids[k], BOUND).expect("drained");
        assert_eq!(a.drain_status(ids[k]), DrainStatus::Drained);
    }
    assert_eq!(a.outstanding_slices(), 0);
    println!(
        "{} requests over {} rail(s) on {device}: all complete and drained",
        outcomes.len(),
        peer.rails.len()
    );

    // Bytes: READ destinations hold the target's pattern over the length
    // read and are untouched after it; nothing else of local memory moved.
    let now = local.to_vec(0, LEN).unwrap();
    let (mine, theirs) = (pattern(LEN, SEED_INITIATOR), pattern(LEN, SEED_TARGET));
    assert_eq!(now[..half], mine[..half], "WRITE sources are unchanged");
    for &(op, off, len) in &expected {
        if op == Op::Read {
            assert_eq!(now[off..off + len], theirs[off..off + len], "READ at {off}");
            assert_eq!(
                now[off + len..off + chunk],
                mine[off + len..off + chunk],
                "after the READ at {off}"
            );
        }
    }
    // The target checks its own memory: WRITE destinations hold the
    // initiator's pattern over the length written and nothing beyond it
    // changed; the half that was only read is untouched.
    for &(op, off, len) in &expected {
        if op == Op::Write {
            target.check(off, len, SEED_INITIATOR);
            if len < chunk {
                target.check(off + len, chunk - len, SEED_TARGET);
            }
        }
    }
    target.check(half, half, SEED_TARGET);

    // READ back what was written, in one batch, into a cleared buffer.
    let batch: Vec<TransferRequest> = (0..PER_OP)
        .map(|i| {
            let off = (i * chunk) as u64;
            TransferRequest::read(reg_back.id, off, peer.id, range, off, chunk as u64)
                .label(100 + i as u64)
        })
        .collect();
    let ids = a.submit(&batch).expect("submit the read-back batch");
    let outcomes = a.wait_all(&ids, BOUND).expect("every read-back outcome");
    for (i, o) in outcomes.iter().enumerate() {
        check_outcome(o, Op::Read, chunk as u64, 100 + i as u64);
    }
    let got = back.to_vec(0, half).unwrap();
    for i in 0..PER_OP {
        let (off, len) = (i * chunk, chunk_len(i));
        assert_eq!(
            got[off..off + len],
            mine[off..off + len],
            "read back at {off}"
        );
        assert_eq!(
            got[off + len..off + chunk],
            theirs[off + len..off + chunk],
            "read back after the WRITE at {off}"
        );
    }
    assert_eq!(a.outstanding_slices(), 0);

    // Both engines quiesce: every native object destroyed, nothing
    // Unquiesced.
    a.shutdown(BOUND).expect("initiator shutdown");
    assert!(a.unquiesced().is_empty(), "{:?}", a.unquiesced());
    drop(link);
    target.send("quit");
    assert_eq!(target.expect("SHUTDOWN ").join(" "), "ok");
    let status = target.child.wait().expect("the target process ends");
    assert!(status.success(), "target process: {status}");
}

/// A batch's notification crosses the device as a SEND behind its WRITEs:
/// the target reads it once, with every byte of the batch in place,
/// tagged with the initiator's source id and epoch; after the target
/// revoked its rkey a failing batch sends none, and its outcome says so.
#[test]
fn a_notification_arrives_after_every_byte_of_its_batch_between_two_processes() {
    let Some(device) = device() else { return };
    let _link = LINK.read().unwrap_or_else(|e| e.into_inner());
    logs();
    let mut c = connect(&device);
    let half = LEN / 2;
    let chunk = half / PER_OP;
    let batch: Vec<TransferRequest> = (0..PER_OP)
        .map(|i| {
            let off = (i * chunk) as u64;
            TransferRequest::write(c.reg.id, off, c.peer.id, c.range, off, chunk as u64)
                .label(i as u64)
        })
        .collect();
    let await_written = |ms: u128| format!("await {ms} 0 {half} {SEED_INITIATOR}");
    c.target.send(&await_written(BOUND.as_millis()));
    let ids =
        c.a.submit_with_notification(&batch, orbitte_engine::Notification::new(b"native-done"))
            .expect("submit the notifying batch");
    // The initiator does not poll: the target's answer comes first.
    assert_eq!(
        c.target.expect("NOTIFIED "),
        [
            INITIATOR_SOURCE.to_owned(),
            c.a.epoch().to_string(),
            "Rdma".to_owned(),
            "native-done".to_owned(),
            "bytes-ok".to_owned()
        ]
    );
    for (i, o) in c.a.wait_all(&ids, BOUND).unwrap().iter().enumerate() {
        check_outcome(o, Op::Write, chunk as u64, i as u64);
        assert_eq!(
            o.notification,
            orbitte_engine::NotificationStatus::Sent,
            "{o:?}"
        );
    }
    // Once.
    c.target.send(&await_written(500));
    assert_eq!(c.target.expect("NOTIFIED ").join(" "), "none");

    // A batch that fails on the device sends nothing.
    c.target.send("retire");
    assert_eq!(c.target.expect("RETIRED ").join(" "), "ok");
    let ids =
        c.a.submit_with_notification(&batch[..1], orbitte_engine::Notification::new(b"never"))
            .expect("submit the failing batch");
    let o = c.a.wait(ids[0], BOUND).expect("its outcome");
    assert_eq!(o.status, Status::Failed, "{o:?}");
    assert!(
        matches!(&o.notification, orbitte_engine::NotificationStatus::NotSent { why } if why.contains("Failed")),
        "{o:?}"
    );
    c.target.send(&await_written(1000));
    assert_eq!(c.target.expect("NOTIFIED ").join(" "), "none");
    c.a.wait_drain(ids[0], BOUND).expect("drained");
    c.close();
}

impl Connected {
    /// Shuts both engines down (nothing Unquiesced) and waits for the
    /// target process to end well.
    fn close(mut self) {
        self.a.shutdown(BOUND).expect("initiator shutdown");
        drop(self._link);
        self.target.send("quit");
        assert_eq!(self.target.expect("SHUTDOWN ").join(" "), "ok");
        let status = self.target.child.wait().expect("the target process ends");
        assert!(status.success(), "target process: {status}");
    }
}

/// The error path on the device: the target retires its range (its remote
/// MR is deregistered, so the rkey the initiator holds is stale) and a
/// WRITE to it fails with the device's remote access error, reported in
/// the outcome; nothing of the target's memory changed and the request
/// drains. A WRITE before the retire proves the route worked.
#[test]
fn a_write_with_a_revoked_rkey_fails_with_the_device_status() {
    let Some(device) = device() else { return };
    let _link = LINK.read().unwrap_or_else(|e| e.into_inner());
    logs();
    let Connected {
        mut target,
        a,
        local: _local,
        reg,
        peer,
        range,
        _link: link,
    } = connect(&device);
    let len = 4 * SLICE as usize;
    let ids = a
        .submit(&[TransferRequest::write(reg.id, 0, peer.id, range, 0, len as u64).label(1)])
        .expect("submit the first WRITE");
    let o = a.wait(ids[0], BOUND).expect("its outcome");
    check_outcome(&o, Op::Write, len as u64, 1);
    target.check(0, len, SEED_INITIATOR);

    target.send("retire");
    assert_eq!(target.expect("RETIRED ").join(" "), "ok");
    // The initiator still holds the old descriptor: the engine posts, the
    // target's device refuses.
    let off = 2 * len;
    let ids = a
        .submit(&[TransferRequest::write(
            reg.id, off as u64, peer.id, range, off as u64, len as u64,
        )
        .label(2)])
        .expect("submit the WRITE on the revoked rkey");
    let o = a.wait(ids[0], BOUND).expect("its outcome");
    println!("the WRITE on the revoked rkey: {o:?}");
    let what = format!("{o:?}");
    assert_eq!(o.status, Status::Failed, "{what}");
    assert_eq!((o.label, o.op, o.len), (2, Op::Write, len as u64), "{what}");
    assert_eq!(o.slices, 4, "{what}");
    assert_eq!((o.completed_prefix, o.completed_slices), (0, 0), "{what}");
    let failure = o.failure.as_ref().expect("failure information");
    assert_eq!((failure.slice, failure.offset), (0, 0), "{what}");
    assert_eq!(failure.path, PathKind::Rdma, "{what}");
    assert!(failure.nic.is_some(), "{what}");
    match &failure.status {
        // IBV_WC_REM_ACCESS_ERR
        SliceFailure::Completion { code, status } => {
            assert_eq!(*code, 10, "{what}");
            assert!(status.contains("RemoteAccess"), "{what}");
        }
        other => panic!("want the device's completion status, got {other:?} ({what})"),
    }
    // Something was posted, so the engine cannot claim that nothing
    // changed remotely; whatever it allows is inside the request.
    match &o.remote_effect {
        RemoteEffect::Possible { bytes } => {
            assert!(bytes.end <= len as u64 && !bytes.is_empty(), "{what}")
        }
        other => panic!("want a possible remote effect, got {other:?} ({what})"),
    }
    assert!(o.uncertain.end <= len as u64, "{what}");
    a.wait_drain(ids[0], BOUND)
        .expect("the failed WRITE drains");
    assert_eq!(a.drain_status(ids[0]), DrainStatus::Drained);
    assert_eq!(a.outstanding_slices(), 0);
    // rxe checks the rkey before writing: no byte moved.
    target.check(off, len, SEED_TARGET);
    target.check(len, LEN - len, SEED_TARGET);

    a.shutdown(BOUND).expect("initiator shutdown");
    drop(link);
    target.send("quit");
    assert_eq!(target.expect("SHUTDOWN ").join(" "), "ok");
    let status = target.child.wait().expect("the target process ends");
    assert!(status.success(), "target process: {status}");
}

/// A destroy the device refuses: the engine's context on the device gets
/// a memory region no handle owns (leaked on purpose through the
/// `testing` hook), so at shutdown the kernel refuses to deallocate the
/// protection domain (EBUSY). The shutdown is `Unquiesced` with the
/// source, device identity, native error and cleanup evidence; verbs
/// retains the PD (and the context it holds); nothing the engine charged
/// is released wrongly; new admission is fenced. The same test runs on
/// the sim in `tests/cleanup.rs`.
#[test]
fn a_pd_the_device_refuses_to_destroy_is_unquiesced_and_retained() {
    let Some(device) = device() else { return };
    let _link = LINK.read().unwrap_or_else(|e| e.into_inner());
    logs();
    let a = engine(INITIATOR_SOURCE, &device);
    let memory = HostMemory::alloc(LEN).expect("memory");
    let reg = a
        .register(&memory, Access::REMOTE_READ_WRITE)
        .expect("Host Direct registration");
    assert_eq!(reg.copies, 2);
    let nic = a.topology().contexts[0].nic;
    a.leak_registration_on(nic, HostMemory::alloc(4096).expect("memory"))
        .expect("a region no handle owns");
    a.unregister(reg.id)
        .expect("the engine's own regions deregister");
    let u = a
        .shutdown(BOUND)
        .expect_err("the device refuses to deallocate a PD holding a region");
    println!("{u}");
    assert_eq!(
        (u.source_id.as_str(), u.epoch, u.during.as_str()),
        (INITIATOR_SOURCE, a.epoch(), "shutdown")
    );
    let pd = u
        .failures
        .iter()
        .find(|f| f.object == orbitte_verbs::ObjectKind::ProtectionDomain)
        .unwrap_or_else(|| panic!("no PD failure: {u}"));
    assert_eq!(pd.device.name, device);
    assert_eq!(
        pd.cause,
        orbitte_verbs::UnquiescedCause::Native(orbitte_verbs::NativeError::new(
            "ibv_dealloc_pd",
            16 // EBUSY
        )),
        "{pd}"
    );
    assert!(pd.cleanup.retained, "{pd}");
    assert!(
        pd.cleanup.tried.iter().any(|t| t.contains("destroy")),
        "{pd}"
    );
    assert!(
        orbitte_verbs::retained().iter().any(|o| {
            o.object == orbitte_verbs::ObjectKind::ProtectionDomain
                && o.label == pd.label
                && o.device.name == device
        }),
        "verbs retains the PD"
    );
    assert_eq!(u.retained, a.charges(), "no charge released wrongly");
    assert_eq!(a.unquiesced().len(), 1);
    assert!(a.fenced().is_some());
    assert!(matches!(
        a.register(HostMemory::alloc(4096).expect("memory"), Access::LocalOnly),
        Err(orbitte_engine::RegisterError::Fenced { .. })
    ));
}

/// Brings the link back up when dropped (also when the test fails).
struct LinkUp(String);

impl Drop for LinkUp {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "set", &self.0, "up"])
            .status();
    }
}

/// Rail recovery on the device: two engines in this process over the
/// device in loopback, the rdma path over the target's listener. The
/// RoCE netdev goes down: the rail goes down, recovery attempts fail while
/// the port is not active, and a new request has no rail; the link comes
/// back: the rail recovers and a batch completes with every byte right.
/// Needs root and `ip` (the Soft-RoCE guest has both).
#[test]
fn a_rail_recovers_after_a_port_flap() {
    let Some(device) = device() else { return };
    let _exclusive = LINK.write().unwrap_or_else(|e| e.into_inner());
    logs();
    if !std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    }) {
        println!("skipped: flapping the link needs root");
        return;
    }
    let target = EngineBuilder::new(TARGET_SOURCE)
        .rdma(rdma_config(&device))
        .listen("127.0.0.1:0".parse().expect("address"))
        .handshake_timeout(Duration::from_secs(60))
        .build()
        .expect("target engine");
    let a = EngineBuilder::new(INITIATOR_SOURCE)
        .rdma(rdma_config(&device))
        .slice_size(SLICE)
        .request_timeout(Duration::from_secs(60))
        .handshake_timeout(Duration::from_secs(60))
        .rail_recovery(orbitte_engine::RecoveryPolicy {
            max_attempts: 1000,
            first_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
            cooldown: Duration::from_secs(5),
        })
        .session_settings(|cfg| {
            cfg.host_id = orbitte_wire::HostId::new("another-host").expect("host id");
        })
        .build()
        .expect("initiator engine");
    let remote = HostMemory::alloc(LEN).expect("memory");
    let range = target
        .register(&remote, Access::REMOTE_READ_WRITE)
        .expect("target registration");
    let local = HostMemory::alloc(LEN).expect("memory");
    local
        .write_at(0, &pattern(LEN, SEED_INITIATOR))
        .expect("pattern");
    let reg = a.register(&local, Access::LocalOnly).expect("registration");
    let peer = a
        .connect_with(
            target.listen_addr().expect("listening"),
            orbitte_engine::ConnectOptions::new().path(PathKind::Rdma),
        )
        .expect("rdma peer over the target's listener");
    let range = RangeId(range.id.0);
    let write = |offset: usize| {
        a.submit(&[TransferRequest::write(
            reg.id,
            offset as u64,
            peer.id(),
            range,
            offset as u64,
            64 << 10,
        )])
    };
    let ids = write(0).expect("submit");
    check_outcome(
        &a.wait(ids[0], BOUND).expect("outcome"),
        Op::Write,
        64 << 10,
        0,
    );
    let rail = |a: &TransferEngine| a.peers()[0].rails[0].clone();
    let until = |what: &str, ok: &dyn Fn(&orbitte_engine::RailInfo) -> bool| {
        let deadline = Instant::now() + BOUND;
        loop {
            let r = rail(&a);
            if ok(&r) {
                return r;
            }
            assert!(Instant::now() < deadline, "the rail never {what}: {r:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let netdev = a.topology().topology.and_then(|t| {
        t.slots().iter().find_map(|s| {
            s.nic().and_then(|n| {
                n.ports
                    .iter()
                    .flat_map(|p| p.gids.iter())
                    .find_map(|g| g.netdev.clone())
            })
        })
    });
    let Some(netdev) = netdev else {
        println!("skipped: {device} has no netdev (not RoCE)");
        return;
    };
    let down = Command::new("ip")
        .args(["link", "set", &netdev, "down"])
        .status()
        .expect("run ip");
    assert!(down.success(), "ip link set {netdev} down: {down}");
    let up = LinkUp(netdev.clone());
    let r = until("went down and retried", &|r| {
        !r.up
            && matches!(
                r.recovery,
                Some(orbitte_engine::RecoveryState::Recovering { attempt, .. }) if attempt >= 2
            )
    });
    println!("while the link is down: {r:?}");
    assert_eq!(r.recoveries, 0);
    match write(LEN / 2) {
        Err(orbitte_engine::SubmitError::Invalid { .. }) => {}
        other => panic!("a request with its only rail down: {other:?}"),
    }
    drop(up);
    let r = until("recovered", &|r| r.up && r.recoveries >= 1);
    println!("after the link came back: {r:?}");
    // Let the GID table refill, then move bytes again.
    let mut last = None;
    for _ in 0..100 {
        let ids = write(LEN / 2).expect("submit after recovery");
        let o = a.wait(ids[0], BOUND).expect("outcome");
        if o.status == Status::Complete {
            last = Some(o);
            break;
        }
        println!("not yet: {o:?}");
        a.wait_drain(ids[0], BOUND).expect("drain");
        until("recovered again", &|r| r.up);
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = last.expect("a batch completes after the port came back");
    check_outcome(&o, Op::Write, 64 << 10, 0);
    assert_eq!(
        remote.to_vec(LEN / 2, 64 << 10).expect("read"),
        local.to_vec(LEN / 2, 64 << 10).expect("read")
    );
    assert_eq!(rail(&a).recovery, Some(orbitte_engine::RecoveryState::Up));
    a.shutdown(BOUND).expect("initiator shutdown");
    target.shutdown(BOUND).expect("target shutdown");
}
