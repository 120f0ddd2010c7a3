//! Test support for the net tests: a minimal driver that pumps the engine's
//! sans-IO core with the tcp and local transports (the engine's own driver
//! does the same with more policy), plus helpers to spawn engines.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use orbitte_engine::outcome::{DrainStatus, Outcome, RequestId};
use orbitte_engine::session::{Listener, PublicationTable, SessionConfig, SharedPeerTable};
use orbitte_engine::transport::local::LocalTransport;
use orbitte_engine::transport::tcp::TcpTransport;
use orbitte_engine::transport::{
    EventSink, Op, PathKind, PeerId, PostContext, RailId, RailSpec, RangeId, RegistrationId,
    Transport, TransportEvent, WorkItem,
};
use orbitte_memory::HostMemory;
use orbitte_proto::core::{Core, CoreConfig, CoreRequest};
use orbitte_wire::{AccessFlags, Epoch, PeerTable, RangeDescriptor, SourceId};

pub const RW: AccessFlags = AccessFlags(AccessFlags::REMOTE_READ.0 | AccessFlags::REMOTE_WRITE.0);

pub fn cfg(source: &str, epoch: u64) -> SessionConfig {
    SessionConfig::new(SourceId::new(source).unwrap(), Epoch::new(epoch).unwrap())
}

pub fn table(cfg: &SessionConfig) -> SharedPeerTable {
    Arc::new(Mutex::new(PeerTable::new(cfg.source_id.clone())))
}

/// A target engine: a listener over a publication table.
pub struct Target {
    pub cfg: SessionConfig,
    pub peers: SharedPeerTable,
    pub ranges: Arc<PublicationTable>,
    pub listener: Listener,
}

impl Target {
    pub fn start(cfg: SessionConfig) -> Self {
        Self::start_at(cfg, "127.0.0.1:0".parse().unwrap())
    }

    pub fn start_at(cfg: SessionConfig, addr: SocketAddr) -> Self {
        let peers = table(&cfg);
        let ranges = PublicationTable::new();
        let listener = Listener::bind(cfg.clone(), peers.clone(), ranges.clone(), addr).unwrap();
        Self {
            cfg,
            peers,
            ranges,
            listener,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }
}

/// Fills memory with a pattern that depends on `seed` and the offset.
pub fn pattern(mem: &HostMemory, seed: u8) {
    let mut buf = vec![0u8; mem.len()];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[i % 4] ^ seed;
    }
    mem.write_at(0, &buf).unwrap();
}

struct Inner {
    core: Core,
    transports: HashMap<PathKind, Box<dyn Transport>>,
    regs: HashMap<RegistrationId, Arc<HostMemory>>,
    remote: HashMap<(PeerId, RangeId), RangeDescriptor>,
    outcomes: HashMap<RequestId, Outcome>,
    work: Vec<WorkItem>,
    next_reg: u64,
}

struct Ctx<'a> {
    regs: &'a HashMap<RegistrationId, Arc<HostMemory>>,
    remote: &'a HashMap<(PeerId, RangeId), RangeDescriptor>,
}

impl PostContext for Ctx<'_> {
    fn memory(&self, r: RegistrationId) -> Option<&Arc<HostMemory>> {
        self.regs.get(&r)
    }
    fn local_key(&self, _: RegistrationId, _: u32) -> Option<(u64, u32)> {
        None
    }
    fn remote_range(&self, peer: PeerId, range: RangeId) -> Option<&RangeDescriptor> {
        self.remote.get(&(peer, range))
    }
}

/// The minimal driver.
pub struct Driver {
    inner: Mutex<Inner>,
    cv: Condvar,
}

impl Driver {
    pub fn new(config: CoreConfig) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner {
                core: Core::new(config),
                transports: HashMap::new(),
                regs: HashMap::new(),
                remote: HashMap::new(),
                outcomes: HashMap::new(),
                work: Vec::new(),
                next_reg: 1,
            }),
            cv: Condvar::new(),
        })
    }

    pub fn sink(self: &Arc<Self>) -> Arc<dyn EventSink> {
        self.clone()
    }

    pub fn add_transport(&self, t: Box<dyn Transport>) {
        let mut g = self.inner.lock().unwrap();
        g.transports.insert(t.path(), t);
    }

    pub fn add_rails(
        &self,
        path: PathKind,
        peer: PeerId,
        n: usize,
        max_in_flight: u32,
    ) -> Vec<RailId> {
        let mut g = self.inner.lock().unwrap();
        (0..n)
            .map(|_| {
                g.core.add_rail(RailSpec {
                    path,
                    peer,
                    nic: None,
                    remote_nic: None,
                    max_in_flight,
                    signal_interval: 1,
                })
            })
            .collect()
    }

    pub fn register(&self, mem: Arc<HostMemory>) -> RegistrationId {
        let mut g = self.inner.lock().unwrap();
        let id = RegistrationId(g.next_reg);
        g.next_reg += 1;
        g.regs.insert(id, mem);
        id
    }

    pub fn set_remote(&self, peer: PeerId, ranges: &[RangeDescriptor]) {
        let mut g = self.inner.lock().unwrap();
        g.remote.retain(|(p, _), _| *p != peer);
        for r in ranges {
            g.remote.insert((peer, RangeId(r.range_id.0)), r.clone());
        }
    }

    pub fn rail_is_up(&self, rail: RailId) -> bool {
        self.inner.lock().unwrap().core.rail_is_up(rail)
    }

    fn pump(g: &mut Inner) {
        let now = Instant::now();
        while let Some(at) = g.core.poll_timeout() {
            if at > now {
                break;
            }
            g.core.handle_timeout(now);
        }
        while let Some((rail, marker)) = g.core.poll_flush(now) {
            let path = g.core.rail_spec(rail).map(|s| s.path);
            let fate = path
                .and_then(|p| g.transports.get_mut(&p))
                .map(|t| t.flush_marked(rail, marker));
            match fate {
                Some(Ok(orbitte_engine::transport::MarkerFate::Posted)) => {}
                Some(Ok(orbitte_engine::transport::MarkerFate::Released)) => {
                    g.core.marker_dropped(rail, marker);
                    g.core.release_rail(now, rail);
                }
                // tcp and local report every item: the marker is not posted.
                _ => g.core.marker_dropped(rail, marker),
            }
        }
        loop {
            let mut work = std::mem::take(&mut g.work);
            work.clear();
            g.core.poll_work(&mut work);
            if work.is_empty() {
                g.work = work;
                break;
            }
            let mut done = Vec::new();
            let mut start = 0;
            while start < work.len() {
                let rail = work[start].rail;
                let end = start + work[start..].iter().take_while(|w| w.rail == rail).count();
                let items = &work[start..end];
                let path = g.core.rail_spec(rail).map(|s| s.path);
                let Inner {
                    transports,
                    regs,
                    remote,
                    core,
                    ..
                } = &mut *g;
                let ctx = Ctx { regs, remote };
                let res = match path.and_then(|p| transports.get_mut(&p)) {
                    Some(t) => t.post_inline(rail, items, &ctx, &mut done),
                    None => Err(orbitte_engine::transport::PostError {
                        rail,
                        posted: 0,
                        reason: "no transport".into(),
                    }),
                };
                if let Err(e) = res {
                    core.handle_post_error(now, &e, items);
                }
                start = end;
            }
            g.work = work;
            // What the transports executed while posting, as the engine does.
            for e in done.drain(..) {
                g.core.handle_event(now, e);
            }
        }
        while let Some(o) = g.core.poll_outcome() {
            g.outcomes.insert(o.request, o);
        }
    }

    pub fn submit(&self, reqs: Vec<CoreRequest>) -> Vec<RequestId> {
        let mut g = self.inner.lock().unwrap();
        let ids = g.core.submit(Instant::now(), reqs).unwrap();
        Self::pump(&mut g);
        ids
    }

    /// Waits for the outcome of `id`, at most `bound` (then panics: the
    /// contract says every wait ends).
    pub fn wait(&self, id: RequestId, bound: Duration) -> Outcome {
        let deadline = Instant::now() + bound;
        let mut g = self.inner.lock().unwrap();
        loop {
            Self::pump(&mut g);
            if let Some(o) = g.outcomes.remove(&id) {
                return o;
            }
            let now = Instant::now();
            assert!(now < deadline, "no outcome for {id} within {bound:?}");
            let wake = g
                .core
                .poll_timeout()
                .map(|t| t.saturating_duration_since(now))
                .unwrap_or(bound);
            let wait = wake
                .min(deadline - now)
                .min(Duration::from_millis(50))
                .max(Duration::from_millis(1));
            g = self.cv.wait_timeout(g, wait).unwrap().0;
        }
    }

    /// The outcome of `id` if it has one now (never waits).
    pub fn try_outcome(&self, id: RequestId) -> Option<Outcome> {
        let mut g = self.inner.lock().unwrap();
        Self::pump(&mut g);
        g.outcomes.remove(&id)
    }

    pub fn drain_status(&self, id: RequestId) -> DrainStatus {
        self.inner.lock().unwrap().core.drain_status(id)
    }

    pub fn wait_drain(&self, id: RequestId, bound: Duration) -> DrainStatus {
        let deadline = Instant::now() + bound;
        let mut g = self.inner.lock().unwrap();
        loop {
            Self::pump(&mut g);
            let s = g.core.drain_status(id);
            if s == DrainStatus::Drained || Instant::now() >= deadline {
                return s;
            }
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(20))
                .unwrap()
                .0;
        }
    }
}

impl EventSink for Driver {
    fn deliver(&self, events: &mut Vec<TransportEvent>) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        for e in events.drain(..) {
            g.core.handle_event(now, e);
        }
        Self::pump(&mut g);
        drop(g);
        self.cv.notify_all();
    }
}

pub fn request(
    label: u64,
    op: Op,
    reg: RegistrationId,
    local_offset: u64,
    peer: PeerId,
    range: u64,
    remote_offset: u64,
    len: u64,
    rails: &[RailId],
) -> CoreRequest {
    CoreRequest {
        label,
        op,
        registration: reg,
        local_offset,
        peer,
        range: RangeId(range),
        remote_offset,
        len,
        rails: rails.into(),
        keepalive: None,
    }
}

/// An initiator engine with tcp and local transports.
pub struct Initiator {
    pub cfg: SessionConfig,
    pub peers: SharedPeerTable,
    pub driver: Arc<Driver>,
    pub tcp: Arc<TcpTransport>,
    pub local: Arc<LocalTransport>,
}

impl Initiator {
    pub fn new(cfg: SessionConfig, core: CoreConfig) -> Self {
        let peers = table(&cfg);
        let driver = Driver::new(core);
        let tcp = TcpTransport::new(cfg.clone(), peers.clone(), driver.sink());
        let local = LocalTransport::new(driver.sink(), cfg.io_threads);
        driver.add_transport(Box::new(tcp.clone()));
        driver.add_transport(Box::new(local.clone()));
        Self {
            cfg,
            peers,
            driver,
            tcp,
            local,
        }
    }

    /// Opens `n` tcp rails to `addr` for `peer`.
    pub fn connect_tcp(
        &self,
        peer: PeerId,
        addr: SocketAddr,
        n: usize,
    ) -> Result<
        (Vec<RailId>, orbitte_engine::transport::tcp::TcpPeerLink),
        orbitte_engine::session::SessionError,
    > {
        let rails = self.driver.add_rails(
            PathKind::Tcp,
            peer,
            n,
            self.cfg.max_in_flight_per_connection * 2,
        );
        let link = self.tcp.open_rails(peer, addr, &rails)?;
        self.driver.set_remote(peer, &link.ranges);
        Ok((rails, link))
    }
}

/// A target that admits `most` raw tcp peers at once, with one published
/// read-write range of `bytes` (filled with `pattern` seed 3); `None`
/// when this machine has too few descriptors for them (three a peer: the
/// raw peer's socket, and the target's socket and its duplicate kept to
/// close it), as `skip_unless_ready` says.
pub fn target_for_peers(
    source: &str,
    most: usize,
    bytes: usize,
) -> Option<(Target, orbitte_wire::RangeId)> {
    if skip_unless_ready("this test", descriptors_short_of(3 * most + 256)) {
        return None;
    }
    let mut c = cfg(source, 1);
    c.max_sessions = most + 1;
    let t = Target::start(c);
    let mem = HostMemory::alloc(bytes).unwrap();
    pattern(&mem, 3);
    let range = t.ranges.publish(mem, RW).unwrap();
    Some((t, range))
}

/// A legitimate initiator `source` opens `rails` tcp rails to `t`, reads
/// 256 KiB of `range` at offset 4096 and gets exactly the bytes of `mem`
/// there: what an attack must never stop.
pub fn legitimate_read(t: &Target, source: &str, rails: usize, range: u64, mem: &HostMemory) {
    let i = Initiator::new(cfg(source, 1), CoreConfig::default());
    let local = HostMemory::alloc(256 << 10).unwrap();
    let reg = i.driver.register(local.clone());
    let (rails, _) = i
        .connect_tcp(PeerId(1), t.addr(), rails)
        .unwrap_or_else(|e| panic!("{source} was refused: {e}"));
    let id = i.driver.submit(vec![request(
        1,
        Op::Read,
        reg,
        0,
        PeerId(1),
        range,
        4096,
        256 << 10,
        &rails,
    )])[0];
    let o = i.driver.wait(id, Duration::from_secs(30));
    assert_eq!(o.status, orbitte_engine::outcome::Status::Complete, "{o:?}");
    assert!(
        local.to_vec(0, 256 << 10).unwrap() == mem.to_vec(4096, 256 << 10).unwrap(),
        "{source} read other bytes than the target holds"
    );
}

/// Two engines on a simulated fabric that keep host memory off rdma (so
/// they talk tcp or local): `target` listening on loopback, and `client`
/// as `tune` sets it up.
pub fn engines_without_rdma(
    target: &str,
    client: &str,
    tune: impl FnOnce(orbitte_engine::EngineBuilder) -> orbitte_engine::EngineBuilder,
) -> (
    orbitte_engine::TransferEngine,
    orbitte_engine::TransferEngine,
) {
    use orbitte_engine::EngineBuilder;
    use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric};
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("a0", [10, 1, 0, 1]),
            SimDeviceDesc::roce("b0", [10, 2, 0, 1]),
        ])
        .with_delivery(Delivery::Background),
        3,
    );
    let target = EngineBuilder::new(target)
        .provider(fabric.provider_for(&["a0"]))
        .host_memory_without_rdma()
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    let client = tune(
        EngineBuilder::new(client)
            .provider(fabric.provider_for(&["b0"]))
            .host_memory_without_rdma(),
    )
    .build()
    .unwrap();
    (target, client)
}

/// Asserts that `mem` still holds exactly [`pattern`]`(seed)`: the target
/// memory a refused request must not have touched.
pub fn untouched(mem: &HostMemory, seed: u8) {
    let fresh = HostMemory::alloc(mem.len()).unwrap();
    pattern(&fresh, seed);
    assert!(
        mem.to_vec(0, mem.len()).unwrap() == fresh.to_vec(0, mem.len()).unwrap(),
        "target memory changed"
    );
}

/// Installs a test subscriber once so that warnings show with --nocapture.
pub fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// A hand-driven client speaking raw frames (to misbehave on purpose).
pub mod raw {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    use orbitte_wire::auth::ClusterSecret;
    use orbitte_wire::{
        Capabilities, Epoch, Frame, FrameHeader, HEADER_LEN, Hello, Identity, Nonce, SourceId,
    };

    pub fn connect(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        // The bound for every wait of a test: a target that failed to close
        // would make the read time out and the test fail.
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    /// Reads one frame (and drops a data frame's payload).
    pub fn read_frame(s: &mut impl Read) -> std::io::Result<Frame> {
        let mut h = [0u8; HEADER_LEN];
        s.read_exact(&mut h)?;
        let h = FrameHeader::decode(&h).map_err(std::io::Error::other)?;
        let mut body = vec![0u8; h.fixed_len()];
        s.read_exact(&mut body)?;
        let f = orbitte_wire::decode_body(&h, &body).map_err(std::io::Error::other)?;
        let mut payload = vec![0u8; h.payload_len() as usize];
        s.read_exact(&mut payload)?;
        Ok(f)
    }

    /// Reads until the peer closes; returns the frames seen.
    pub fn read_until_closed(s: &mut TcpStream) -> Vec<Frame> {
        let mut out = Vec::new();
        loop {
            match read_frame(s) {
                Ok(f) => out.push(f),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return out,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
                Err(e) => {
                    panic!("target did not close the session within the bound: {e}; frames {out:?}")
                }
            }
        }
    }

    /// The hello of a tcp-capable data session of `source` at epoch 1,
    /// without a proof.
    pub fn hello(source: &str) -> Frame {
        hello_for(source, orbitte_wire::SessionPurpose::DATA)
    }

    /// The hello of a session of `source` at epoch 1 for `purpose`,
    /// without a proof.
    pub fn hello_for(source: &str, purpose: orbitte_wire::SessionPurpose) -> Frame {
        Frame::Hello(Hello {
            identity: Identity::new(
                SourceId::new(source).unwrap(),
                Epoch::new(1).unwrap(),
                Capabilities::TCP,
            ),
            nonce: Nonce([7; 32]),
            purpose,
            proof: None,
        })
    }

    /// Sends the hello of a data session of `source` at `epoch`, without
    /// a proof, to a target that requires one, and checks what an outsider
    /// gets: `auth-required`, the session closed, no publication.
    pub fn hello_is_refused_unproven(addr: SocketAddr, source: &str, epoch: u64) {
        let mut s = connect(addr);
        read_frame(&mut s).unwrap(); // challenge
        send(
            &mut s,
            &Frame::Hello(Hello {
                identity: Identity::new(
                    SourceId::new(source).unwrap(),
                    Epoch::new(epoch).unwrap(),
                    Capabilities::TCP,
                ),
                nonce: Nonce([1; 32]),
                purpose: orbitte_wire::SessionPurpose::DATA,
                proof: None,
            }),
        );
        let frames = read_until_closed(&mut s);
        assert!(
            frames.iter().any(
                |f| matches!(f, Frame::Error(e) if e.code == orbitte_wire::ErrorCode::AUTH_REQUIRED)
            ),
            "{frames:?}"
        );
        assert!(
            !frames
                .iter()
                .any(|f| matches!(f, Frame::SegmentPublication(_))),
            "publications leaked: {frames:?}"
        );
    }

    pub fn send(s: &mut impl Write, f: &Frame) {
        let mut buf = Vec::new();
        f.encode(&mut buf).unwrap();
        s.write_all(&buf).unwrap();
    }

    /// Does the handshake by hand; returns the stream after the target's
    /// publication and the publication.
    pub fn handshake(
        addr: SocketAddr,
        source: &str,
        epoch: u64,
        secret: Option<&ClusterSecret>,
    ) -> (TcpStream, Frame) {
        let mut s = connect(addr);
        let Frame::Challenge(ch) = read_frame(&mut s).unwrap() else {
            panic!("no challenge")
        };
        let mut hello = Hello {
            identity: Identity::new(
                SourceId::new(source).unwrap(),
                Epoch::new(epoch).unwrap(),
                Capabilities::TCP,
            ),
            nonce: Nonce([7; 32]),
            purpose: orbitte_wire::SessionPurpose::DATA,
            proof: None,
        };
        if let Some(sec) = secret {
            hello.proof = Some(orbitte_wire::auth::hello_proof(sec, &ch, &hello));
        }
        send(&mut s, &Frame::Hello(hello));
        let ack = read_frame(&mut s).unwrap();
        assert!(matches!(ack, Frame::HelloAck(_)), "{ack:?}");
        let publication = read_frame(&mut s).unwrap();
        (s, publication)
    }
}

/// Child processes: the test binary re-runs itself as a peer engine.
pub mod child {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Child, ChildStdin, Command, Stdio};
    use std::sync::mpsc::{Receiver, channel};
    use std::time::Duration;

    /// Env var that turns the entry test into a peer process.
    pub const ROLE: &str = "ORBITTE_NET_CHILD_ROLE";

    pub struct Peer {
        pub child: Child,
        stdin: Option<ChildStdin>,
        lines: Receiver<String>,
    }

    /// Runs this test binary's `entry` test as a child with `env`;
    /// `wrapper` (e.g. `ip netns exec NS`) goes in front.
    pub fn spawn(entry: &str, wrapper: &[&str], env: &[(&str, String)]) -> Peer {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = if wrapper.is_empty() {
            Command::new(&exe)
        } else {
            let mut c = Command::new(wrapper[0]);
            c.args(&wrapper[1..]).arg(&exe);
            c
        };
        cmd.args([
            entry,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Peer {
            child,
            stdin,
            lines: rx,
        }
    }

    impl Peer {
        /// The next line starting with `prefix` (other lines are skipped),
        /// within `bound`.
        pub fn expect(&self, prefix: &str, bound: Duration) -> String {
            let deadline = std::time::Instant::now() + bound;
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match self.lines.recv_timeout(left) {
                    // The harness may print "test name ... " before our line.
                    Ok(l) if l.contains(prefix) => {
                        return l[l.find(prefix).unwrap_or(0)..].to_owned();
                    }
                    Ok(_) => {}
                    Err(e) => panic!("child did not print {prefix:?} within {bound:?}: {e}"),
                }
            }
        }

        pub fn send(&mut self, line: &str) {
            if let Some(s) = &mut self.stdin {
                let _ = writeln!(s, "{line}");
                let _ = s.flush();
            }
        }

        pub fn kill(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    impl Drop for Peer {
        fn drop(&mut self) {
            self.stdin.take();
            self.kill();
        }
    }

    /// A free loopback port (bound then released).
    pub fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }
}

/// What a child target does: listen, publish one range, print
/// `READY <addr> <range>`, answer `stats` lines, exit when stdin closes.
pub fn run_child_target() {
    use std::io::BufRead;
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let mut c = cfg(&var("NET_SOURCE"), var("NET_EPOCH").parse().unwrap());
    c.serve_delay = Duration::from_millis(var("NET_DELAY_MS").parse().unwrap_or(0));
    if let Ok(io) = var("NET_IO_TIMEOUT_MS").parse() {
        c.io_timeout = Duration::from_millis(io);
    }
    if let Ok(n) = var("NET_MAX_CONNECTIONS").parse() {
        c.max_connections_per_source = n;
        c.max_sessions = c.max_sessions.max(n);
    }
    let addr: SocketAddr = var("NET_ADDR").parse().unwrap();
    let t = Target::start_at(c.clone(), addr);
    let size: usize = var("NET_SIZE").parse().unwrap_or(1 << 20);
    let mem = HostMemory::alloc(size).unwrap();
    pattern(&mem, c.epoch.value() as u8);
    let range = t.ranges.publish(mem.clone(), RW).unwrap();
    println!("READY {} {}", t.addr(), range.0);
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line == "stats" {
            let s = t.listener.stats();
            println!("STATS {} {}", s.data_requests, s.data_bytes);
        }
    }
}

/// Polls `f` until it holds, at most ten seconds (then panics naming `what`).
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("not within the bound: {what}");
}

/// Whether a test that needs what `missing` names (`Some(why)` when it is
/// missing) must stop here: it prints `skipped: <why>`, except under
/// CI=true, where a missing requirement fails the test.
pub fn skip_unless_ready(test: &str, missing: Option<String>) -> bool {
    let Some(why) = missing else {
        return false;
    };
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI must run {test}: {why}"
    );
    println!("skipped: {why}");
    true
}

/// This process's threads (`/proc/self/task`).
pub fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// This process's open descriptors (`/proc/self/fd`).
pub fn descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// This process's resident memory, in KiB (`VmRSS`).
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Why this process cannot hold `need` descriptors at once (its soft
/// `RLIMIT_NOFILE` is lower; raise it with `ulimit -n`), for
/// [`skip_unless_ready`].
pub fn descriptors_short_of(need: usize) -> Option<String> {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    (soft < need as u64).then(|| {
        format!("the descriptor limit is {soft}, below the {need} this test holds (raise it with ulimit -n)")
    })
}
