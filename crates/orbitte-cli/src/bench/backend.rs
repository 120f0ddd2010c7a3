//! What the measurement loop runs batches on: an initiator
//! `TransferEngine` with one open peer. The target engine runs in this
//! process (loopback) or in another process or host.
//!
//! The target engine listens (`EngineBuilder::listen`): its one listener
//! serves tcp data sessions, same-host mapping and rdma control links. The
//! initiator opens the peer with `TransferEngine::connect_with`: a tcp
//! session, the target's publications, then the path the policy picks or
//! the one asked for (rdma: queue pairs set up over a control session to
//! the same address).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use orbitte::{
    Access, ConnectOptions, EngineBuilder, HostMemory, Op, Outcome, PathKind, PeerId, RangeId,
    RegistrationId, TransferEngine,
};
use orbitte_engine::TransferRequest;
use orbitte_engine::metadata::etcd::EtcdMetadata;
use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric, SimTiming};

use super::baseline::PathWindows;
use super::settings::{parse_addr, range_len, secret, source_id};
use super::sim_verbs::SIGNAL_EVERY;
use crate::cli::BenchArgs;
use crate::failure::Failure;
use crate::pattern::fill_target_pattern;

/// Bound on one wait: far beyond the engine's request timeout (10 s), so
/// it only ends a wait on a stuck engine.
const WAIT_BOUND: Duration = Duration::from_secs(60);

/// One request of a batch, relative to the thread's memory and window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Req {
    pub(crate) op: Op,
    /// Into the thread's local (or scratch) memory.
    pub(crate) local_offset: u64,
    /// Into the remote range.
    pub(crate) remote_offset: u64,
    pub(crate) len: u64,
}

struct ThreadMem {
    local: (RegistrationId, Arc<HostMemory>),
    scratch: (RegistrationId, Arc<HostMemory>),
}

fn thread_len(args: &BenchArgs) -> u64 {
    range_len(args) / u64::from(args.threads)
}

pub(crate) fn alloc(len: u64) -> Result<Arc<HostMemory>, Failure> {
    let n = usize::try_from(len).map_err(|_| Failure::usage("range too large for this machine"))?;
    HostMemory::alloc(n).map_err(|e| {
        Failure::failed(format!(
            "cannot allocate {len} bytes of host memory: {e}; lower --block-size, --batch-size or --threads"
        ))
    })
}

fn no_rdma(e: &orbitte::RegisterError) -> Failure {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default().to_owned();
    Failure::failed(format!(
        "rdma path: {first}; run `orbitte doctor --path rdma` for every check, or measure tcp/local (leave out --path)"
    ))
}

pub(crate) fn shutdown(engine: &TransferEngine, what: &str) {
    if let Err(u) = engine.shutdown(Duration::from_secs(5)) {
        tracing::error!(error = %u, "{what} engine shutdown");
    }
}

/// An engine builder on the native provider, or on `fabric`'s `device`.
pub(crate) fn engine(
    id: String,
    fabric: Option<&SimFabric>,
    device: &str,
) -> Result<EngineBuilder, Failure> {
    // The CLI, not the library, applies the ORBITTE_RDMA_* variables.
    let rdma = orbitte::RdmaConfig::resolve(Default::default(), None)
        .map_err(|e| Failure::usage(e.to_string()))?;
    // A pinned device must exist here, as `serve` requires (the sim
    // fabric has its own devices).
    if let (None, Some(device)) = (fabric, &rdma.device) {
        crate::topology::check_device(device, "environment variable ORBITTE_RDMA_DEVICE")?;
    }
    let mut b = EngineBuilder::new(id).rdma(rdma);
    if let Some(f) = fabric {
        b = b.provider(f.provider_for(&[device]));
    }
    Ok(b)
}

pub(crate) fn build(b: EngineBuilder) -> Result<TransferEngine, Failure> {
    b.build()
        .map_err(|e| Failure::failed(format!("cannot build an engine: {e}")))
}

/// A bench target: an engine publishing one read-write range (the bench's
/// pattern), served by the engine's own listener (tcp, local, and rdma
/// control links).
pub(crate) struct Target {
    pub(crate) engine: Arc<TransferEngine>,
    pub(crate) addr: SocketAddr,
    pub(crate) range: RangeId,
    /// The published range's memory.
    pub(crate) memory: Arc<HostMemory>,
    /// Local path served.
    pub(crate) serves_local: bool,
    /// The record in etcd, kept alive while the target runs.
    _published: Option<EtcdMetadata>,
}

impl Target {
    /// `rdma`: a Host Direct registration; otherwise host memory kept off
    /// rdma (tcp and local only).
    pub(crate) fn start(
        engine: EngineBuilder,
        rdma: bool,
        len: u64,
        listen: SocketAddr,
        args: &BenchArgs,
    ) -> Result<Self, Failure> {
        let mut engine = engine.listen(listen);
        if let Some(secret) = secret(args)? {
            engine = engine.cluster_secret(secret);
        }
        if !rdma {
            engine = engine.host_memory_without_rdma();
        }
        let engine = engine.build().map_err(|e| match e {
            orbitte::BuildError::Listen(_) => {
                Failure::failed(format!("{e}; pick a free address with --listen"))
            }
            other => Failure::failed(format!("cannot build an engine: {other}")),
        })?;
        let store = args.metadata.connect("--metadata")?;
        let remote = alloc(len)?;
        fill_target_pattern(&remote).map_err(Failure::failed)?;
        let published = engine
            .register(remote.clone(), Access::REMOTE_READ_WRITE)
            .map_err(|e| {
                if rdma {
                    no_rdma(&e)
                } else {
                    Failure::failed(format!("cannot publish the target range: {e}"))
                }
            })?;
        let range = RangeId(published.id.0);
        let engine = Arc::new(engine);
        let host_id = engine.host_id().to_owned();
        let publish = |store: Option<EtcdMetadata>, addr: SocketAddr| {
            store
                .map(|mut s| {
                    let at = crate::metadata::advertised(addr, &args.metadata);
                    crate::metadata::publish(&mut s, &engine, at, &host_id).map(|()| s)
                })
                .transpose()
        };
        let addr = engine
            .listen_addr()
            .ok_or_else(|| Failure::failed("the target engine does not listen"))?;
        Ok(Self {
            _published: publish(store, addr)?,
            addr,
            serves_local: engine.serves_local(),
            engine,
            range,
            memory: remote,
        })
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        shutdown(&self.engine, "target");
    }
}

/// The bench's target engine on this host (native provider).
pub(crate) fn target(args: &BenchArgs, rdma: bool, len: u64) -> Result<Target, Failure> {
    let listen = parse_addr(&args.listen, "--listen")?;
    let id = source_id(args, "target");
    Target::start(engine(id, None, "")?, rdma, len, listen, args)
}

/// The fewest tcp connections (rails) a `--path tcp` run opens (one per
/// initiator thread, and at least this many): one batch in flight on one
/// connection leaves the wire idle while the answers of its last requests
/// come back; striped over two, the connections' writers, readers and
/// target sessions work side by side (docs/performance.md has the
/// measurements).
pub(crate) const TCP_MIN_RAILS: usize = 2;

/// The initiator engine with one open peer.
pub(crate) struct Backend {
    a: TransferEngine,
    /// The loopback target, stopped after the initiator.
    target: Option<Target>,
    peer: PeerId,
    peer_name: String,
    /// The peer's source id and epoch.
    peer_identity: (String, u64),
    path: PathKind,
    path_note: String,
    /// Rails the peer got.
    rails: usize,
    range: RangeId,
    range_len: u64,
    threads: Vec<ThreadMem>,
}

impl Backend {
    /// Loopback: a target engine and an initiator engine in this process
    /// (rdma on the simulated fabric with `--sim`).
    pub(crate) fn loopback(
        args: &BenchArgs,
        want: Option<PathKind>,
        len: u64,
    ) -> Result<Self, Failure> {
        let rdma = want == Some(PathKind::Rdma);
        let initiator = SimDeviceDesc::roce("sim_initiator", [10, 0, 0, 1]);
        // Half the device's queue-pair limit leaves room for the rail's
        // notification slots.
        let max_depth = initiator.max_qp_wr / 2;
        let fabric = (rdma && args.sim).then(|| {
            SimFabric::new(
                SimDescription::new(vec![
                    initiator,
                    SimDeviceDesc::roce("sim_target", [10, 0, 0, 2]),
                ])
                .with_delivery(Delivery::Background)
                .with_timing(SimTiming {
                    base_latency: Duration::ZERO,
                    bytes_per_sec: 0,
                    jitter: Duration::ZERO,
                }),
                1,
            )
        });
        let b = engine(source_id(args, "target"), fabric.as_ref(), "sim_target")?;
        let listen = parse_addr(&args.listen, "--listen")?;
        let target = Target::start(b, rdma, len, listen, args)?;
        // With etcd, the initiator finds the target by its source id.
        let (addr, epoch) = match args.metadata.connect("--metadata")? {
            None => (target.addr, None),
            Some(store) => {
                let (addr, epoch) = crate::metadata::resolve(&store, target.engine.source_id())?;
                (addr, Some(epoch))
            }
        };
        let mut a = engine(
            source_id(args, "initiator"),
            fabric.as_ref(),
            "sim_initiator",
        )?;
        if fabric.is_some() {
            // The raw-verbs baseline posts a whole batch to a queue pair
            // that deep; the engine's rail gets the same depth (as far as
            // the simulated device allows).
            let depth = args.batch_size.max(SIGNAL_EVERY as u32);
            a = a.max_in_flight(depth.min(max_depth));
        }
        let a = build(a)?;
        Self::connect(args, a, addr, want, Some(target), epoch)
    }

    /// Initiator: connects to a target in another process or host.
    /// `epoch`: the target's epoch as etcd records it (the target must
    /// answer with it or a newer one).
    pub(crate) fn initiator(
        args: &BenchArgs,
        addr: SocketAddr,
        want: Option<PathKind>,
        epoch: Option<u64>,
    ) -> Result<Self, Failure> {
        let mut b = engine(source_id(args, "initiator"), None, "")?;
        if let Some(secret) = secret(args)? {
            b = b.cluster_secret(secret);
        }
        Self::connect(args, build(b)?, addr, want, None, epoch)
    }

    fn connect(
        args: &BenchArgs,
        a: TransferEngine,
        addr: SocketAddr,
        want: Option<PathKind>,
        target: Option<Target>,
        recorded_epoch: Option<u64>,
    ) -> Result<Self, Failure> {
        let rdma = want == Some(PathKind::Rdma);
        let per = thread_len(args);
        let mut threads = Vec::new();
        for _ in 0..args.threads {
            let l = alloc(per)?;
            let s = alloc(per)?;
            let reg = |m: &Arc<HostMemory>| {
                if rdma {
                    a.register_host(m.clone(), Access::LocalOnly)
                        .map_err(|e| no_rdma(&e))
                } else {
                    // Kept off rdma: no MR is made (an explicit choice for
                    // the tcp and local paths).
                    a.register_host_without_rdma(m.clone(), Access::LocalOnly)
                        .map_err(|e| Failure::failed(format!("cannot register memory: {e}")))
                }
            };
            let (rl, rs) = (reg(&l)?, reg(&s)?);
            threads.push(ThreadMem {
                local: (rl.id, l),
                scratch: (rs.id, s),
            });
        }
        let unreachable = |session: &orbitte_engine::SessionError, e: &dyn std::fmt::Display| {
            Failure::failed(format!(
                "cannot reach the target at {addr}: {e}; {}",
                unreachable_fix(session, rdma)
            ))
        };
        let prefer = want.map_or(ConnectOptions::new(), |p| ConnectOptions::new().path(p));
        let initiators = usize::try_from(args.threads).unwrap_or(1).clamp(1, 8);
        let rails = if want == Some(PathKind::Tcp) {
            initiators.max(TCP_MIN_RAILS)
        } else {
            initiators
        };
        let peer = a.connect_with(addr, prefer.rails(rails)).map_err(|e| {
            use orbitte::ConnectError;
            use orbitte_engine::SessionError;
            let text = e.to_string();
            if let ConnectError::Session(SessionError::Refused { code, .. }) = &e
                && *code == orbitte_wire::ErrorCode::AUTH_REQUIRED
            {
                Failure::failed(format!(
                    "the target at {addr} requires the cluster secret: pass --secret-file FILE with the same secret as the target ({text})"
                ))
            } else if let ConnectError::Session(SessionError::Auth(_)) = &e {
                Failure::failed(format!(
                    "authentication with the target at {addr} failed: {text}; give --secret-file the same secret as the target's"
                ))
            } else if let ConnectError::Session(session) = &e {
                if target_may_be_down(session) {
                    unreachable(session, &text)
                } else {
                    session_refused(addr, session)
                }
            } else if rdma {
                Failure::failed(format!(
                    "rdma path: cannot open the peer at {addr}: {text}; run `orbitte doctor --path rdma` on both hosts"
                ))
            } else {
                Failure::failed(format!(
                    "cannot open the peer at {addr} on the {} path: {text}; run `orbitte doctor` or pick another --path",
                    want.map_or("chosen", PathKind::name)
                ))
            }
        })?;
        let mut note = if want.is_some() {
            "asked for with --path".to_owned()
        } else if peer.path == PathKind::Local {
            "chosen by the path policy: same host, the target's memory is mapped here".to_owned()
        } else {
            "chosen by the path policy".to_owned()
        };
        if peer.path == PathKind::Rdma {
            note.push_str(&if args.sim {
                format!(
                    "; {} rail(s) on the simulated fabric (--sim: zero latency, unlimited bandwidth: the engine's own overhead, not a NIC)",
                    peer.rails.len()
                )
            } else {
                format!("; {} rail(s) on this host's NIC(s)", peer.rails.len())
            });
        }
        for (p, why) in &peer.fell_back {
            note.push_str(&format!("; fell back from {p}: {why}"));
        }
        let (info, path, path_note, rails) = (peer.info, peer.path, note, peer.rails.len());
        if let Some(recorded) = recorded_epoch
            && info.epoch.value() < recorded
        {
            return Err(Failure::failed(format!(
                "{} at {addr} answered with epoch {}, older than its record's {recorded} in etcd: an old incarnation holds the address",
                info.source_id, info.epoch
            )));
        }
        let need = range_len(args);
        let rw = |f: orbitte_wire::AccessFlags| {
            f.contains(orbitte_wire::AccessFlags::REMOTE_READ)
                && f.contains(orbitte_wire::AccessFlags::REMOTE_WRITE)
        };
        let Some(&orbitte::RemoteRange {
            range,
            len: range_len,
            ..
        }) = info
            .ranges
            .iter()
            .filter(|r| rw(r.access))
            .max_by_key(|r| r.len)
        else {
            return Err(Failure::failed(format!(
                "the target {} publishes no read-write range: start it with `orbitte bench --role target` or publish one in `orbitte serve`'s config",
                info.source_id
            )));
        };
        if range_len < need {
            return Err(Failure::failed(format!(
                "the target's largest read-write range is {range_len} bytes; this run needs {need} (block size x batch size x threads{}): start the target with the same settings or lower them",
                if args.sweep {
                    ", 4M blocks for --sweep"
                } else {
                    ""
                }
            )));
        }
        Ok(Self {
            peer: info.id,
            peer_name: format!("{} (epoch {})", info.source_id, info.epoch),
            peer_identity: (info.source_id.to_string(), info.epoch.value()),
            a,
            target,
            path,
            path_note,
            rails,
            range,
            range_len,
            threads,
        })
    }

    /// The path requests take.
    pub(crate) fn path(&self) -> PathKind {
        self.path
    }

    /// Rails (tcp connections, local copy threads, rdma queue pairs) the
    /// peer got.
    pub(crate) fn rails(&self) -> usize {
        self.rails
    }

    /// Why this path (the policy's choice, or `--path`).
    pub(crate) fn path_note(&self) -> &str {
        &self.path_note
    }

    /// The peer, as `source-id (epoch N)`.
    pub(crate) fn peer(&self) -> &str {
        &self.peer_name
    }

    /// The peer's source id and epoch.
    pub(crate) fn peer_identity(&self) -> (&str, u64) {
        (&self.peer_identity.0, self.peer_identity.1)
    }

    /// Bytes of the remote range.
    pub(crate) fn remote_len(&self) -> u64 {
        self.range_len
    }

    /// Thread `t`'s local memory (source of WRITEs, destination of READs).
    pub(crate) fn local(&self, t: usize) -> &Arc<HostMemory> {
        &self.threads[t].local.1
    }

    /// The memory each thread's local-path copies move between, where
    /// this process holds both sides (loopback on the local path): its
    /// local window and its part of the target's range. Empty otherwise.
    pub(crate) fn path_windows(&self, args: &BenchArgs) -> Vec<PathWindows> {
        let Some(target) = self
            .target
            .as_ref()
            .filter(|_| self.path == PathKind::Local)
        else {
            return Vec::new();
        };
        (0..self.threads.len())
            .filter_map(|t| {
                Some(PathWindows {
                    local: self.local(t).clone(),
                    remote: target.memory.clone(),
                    remote_base: usize::try_from(thread_base(self, args, t)).ok()?,
                })
            })
            .collect()
    }

    /// Thread `t`'s scratch memory (where `--check` reads WRITEs back).
    pub(crate) fn scratch(&self, t: usize) -> &Arc<HostMemory> {
        &self.threads[t].scratch.1
    }

    /// Slices posted and not yet drained, over all requests.
    pub(crate) fn outstanding_slices(&self) -> u64 {
        self.a.outstanding_slices()
    }

    /// The engine requests of `reqs` on thread `t`'s local (or scratch)
    /// registration, labelled by position: built once, submitted every
    /// batch.
    pub(crate) fn transfer_requests(
        &self,
        t: usize,
        reqs: &[Req],
        scratch: bool,
    ) -> Vec<TransferRequest> {
        let mem = &self.threads[t];
        let reg = if scratch { mem.scratch.0 } else { mem.local.0 };
        reqs.iter()
            .enumerate()
            .map(|(i, r)| {
                let f = match r.op {
                    Op::Read => TransferRequest::read,
                    Op::Write => TransferRequest::write,
                };
                f(
                    reg,
                    r.local_offset,
                    self.peer,
                    self.range,
                    r.remote_offset,
                    r.len,
                )
                .label(i as u64)
            })
            .collect()
    }

    /// Submits one batch and waits for all of it, as callers of a batch
    /// wait ([`TransferEngine::wait_all`]), handing each outcome to `seen`
    /// with when the caller had the whole batch. `got` is scratch space,
    /// kept between batches.
    pub(crate) fn run(
        &self,
        batch: &[TransferRequest],
        got: &mut Vec<Outcome>,
        mut seen: impl FnMut(&Outcome, Duration),
    ) -> Result<(), Failure> {
        let t0 = Instant::now();
        let ids = self
            .a
            .submit(batch)
            .map_err(|e| Failure::failed(format!("submit refused: {e}")))?;
        got.clear();
        got.extend(
            self.a
                .wait_all(&ids, WAIT_BOUND)
                .map_err(|e| Failure::failed(format!("waiting for the batch: {e}")))?,
        );
        let at = t0.elapsed();
        for o in got.iter() {
            seen(o, at);
        }
        got.clear();
        Ok(())
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        shutdown(&self.a, "initiator");
        // Then the loopback target (its Drop stops its engine).
        self.target.take();
    }
}

/// Whether a failed session says nothing about the target but that it did
/// not answer as one: nothing listens (connection refused), it timed out,
/// closed mid-handshake, or spoke something else than the protocol. Only
/// then is "check that the target runs there" the fix.
fn target_may_be_down(e: &orbitte_engine::SessionError) -> bool {
    use orbitte_engine::SessionError as E;
    matches!(
        e,
        E::Io(_) | E::Timeout { .. } | E::Closed { .. } | E::Malformed(_) | E::Protocol(_)
    )
}

/// The likely cause of a session that failed before the target answered
/// as one, from how it failed: refused (nothing listens), closed or reset
/// during the handshake (a target at its session or descriptor limit, or
/// one that refused our authentication, drops the connection), no answer
/// in time, or bytes that are not the protocol.
fn unreachable_fix(e: &orbitte_engine::SessionError, rdma: bool) -> String {
    use orbitte_engine::SessionError as E;
    use std::io::ErrorKind as K;
    let start = format!(
        "`orbitte bench --role target{}` or `orbitte serve`",
        if rdma { " --path rdma" } else { "" }
    );
    match e {
        E::Io(io) if io.kind() == K::ConnectionRefused => {
            format!("nothing listens there: check that {start} runs there and the address is right")
        }
        E::Io(io)
            if matches!(
                io.kind(),
                K::ConnectionReset | K::ConnectionAborted | K::UnexpectedEof | K::BrokenPipe
            ) =>
        {
            closed_during_handshake()
        }
        E::Closed { .. } => closed_during_handshake(),
        E::Timeout { .. } => format!(
            "the target did not answer in time: one out of descriptors (its soft RLIMIT_NOFILE) leaves new connections unanswered, as does an overloaded one, and a firewall may drop the packets; check that {start} runs there, that the port is reachable from here, and the target's log"
        ),
        E::Malformed(_) | E::Protocol(_) => {
            "what answers there does not speak the OrbitTE protocol: check the address and port"
                .to_owned()
        }
        _ => format!("check that {start} runs there and the address is right"),
    }
}

/// The fix when a target accepted the connection and closed it before
/// the handshake finished.
fn closed_during_handshake() -> String {
    "a target accepted the connection and closed it during the handshake: it is likely at its \
     session limit (engine.max_sessions) or out of descriptors (its soft RLIMIT_NOFILE), or it \
     refused our authentication (a cluster secret: --secret-file); its log names the reason"
        .to_owned()
}

/// A session a running target answered and refused (or that failed here
/// after it answered): what it said, and the fix for the codes that have
/// one.
fn session_refused(addr: SocketAddr, e: &orbitte_engine::SessionError) -> Failure {
    use orbitte_engine::SessionError as E;
    use orbitte_wire::ErrorCode;
    let E::Refused { code, message } = e else {
        return Failure::failed(format!("the session with the target at {addr} failed: {e}"));
    };
    let fix = match *code {
        ErrorCode::RESOURCE_EXHAUSTED => {
            "; the target is at one of its limits (sessions, connections from one source): retry once some of its sessions have closed"
        }
        ErrorCode::STALE_EPOCH => {
            "; the target knows this source id with a newer epoch: give --source-id an id no other engine uses"
        }
        _ => "",
    };
    Failure::failed(format!(
        "the target at {addr} refused the session: {code}: {message}{fix}"
    ))
}

/// Where thread `t`'s window starts in the remote range.
pub(crate) fn thread_base(backend: &Backend, args: &BenchArgs, t: usize) -> u64 {
    t as u64 * (backend.remote_len() / u64::from(args.threads))
}
