//! What the measurement loop runs batches on: the engine's core with its
//! tcp/local transports ([`CoreBackend`]), or two `TransferEngine`s on the
//! rdma path ([`RdmaBackend`]).

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use orbitte::session::TcpControlLink;
use orbitte::transport::{Op, PathKind, RangeId, RegistrationId};
use orbitte::verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric, SimTiming};
use orbitte::{
    Access, EngineBuilder, HostMemory, Outcome, PeerInfo, TransferEngine, TransferRequest,
};

use super::fill_target_pattern;
use crate::Failure;
use crate::cli::BenchArgs;
use crate::net::{Initiator, Peer, accept_rdma_peers, request};

/// Bound on one wait: far beyond the core's request timeout (10 s), so it
/// only ends a wait on a stuck core.
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

/// Runs batches for the measurement loop.
pub(crate) trait Backend: Sync {
    /// The path requests take.
    fn path(&self) -> PathKind;
    /// Why this path (the policy's choice, or `--path`).
    fn path_note(&self) -> String;
    /// The peer, as `source-id (epoch N)`.
    fn peer(&self) -> String;
    /// Bytes of the remote range.
    fn remote_len(&self) -> u64;
    /// Thread `t`'s local memory (source of WRITEs, destination of READs).
    fn local(&self, t: usize) -> &Arc<HostMemory>;
    /// Thread `t`'s scratch memory (where `--check` reads WRITEs back).
    fn scratch(&self, t: usize) -> &Arc<HostMemory>;
    /// Slices posted and not yet drained, over all requests.
    fn outstanding_slices(&self) -> u64;
    /// Submits `reqs` as one batch (on thread `t`'s scratch memory if
    /// `scratch`), waits for every outcome, and returns each with its
    /// latency from submission.
    fn batch(
        &self,
        t: usize,
        reqs: &[Req],
        scratch: bool,
    ) -> Result<Vec<(Outcome, Duration)>, Failure>;
}

struct ThreadMem {
    local: (RegistrationId, Arc<HostMemory>),
    scratch: (RegistrationId, Arc<HostMemory>),
}

fn thread_len(args: &BenchArgs) -> u64 {
    super::range_len(args) / u64::from(args.threads)
}

fn alloc(len: u64) -> Result<Arc<HostMemory>, Failure> {
    super::alloc(len)
}

/// tcp or local through the engine's core (see `crate::net`).
pub(crate) struct CoreBackend<'a> {
    initiator: &'a Initiator,
    peer: Peer,
    range: RangeId,
    range_len: u64,
    asked: bool,
    threads: Vec<ThreadMem>,
}

impl<'a> CoreBackend<'a> {
    pub(crate) fn connect(
        initiator: &'a Initiator,
        addr: SocketAddr,
        args: &BenchArgs,
        want: Option<PathKind>,
    ) -> Result<Self, Failure> {
        let rails = usize::try_from(args.threads).unwrap_or(1).clamp(1, 8);
        let peer = initiator
            .connect(addr, rails, want)
            .map_err(Failure::failed)?;
        let need = super::range_len(args);
        let Some(r) = peer
            .ranges
            .iter()
            .filter(|r| {
                r.access.contains(orbitte::wire::AccessFlags::REMOTE_READ)
                    && r.access.contains(orbitte::wire::AccessFlags::REMOTE_WRITE)
            })
            .max_by_key(|r| r.length)
        else {
            return Err(Failure::failed(format!(
                "the target {} publishes no read-write range: start it with `orbitte bench --role target` or publish one in `orbitte serve`'s config",
                peer.source_id
            )));
        };
        if r.length < need {
            return Err(Failure::failed(format!(
                "the target's largest read-write range is {} bytes; this run needs {need} (block size x batch size x threads{}): start the target with the same settings or lower them",
                r.length,
                if args.sweep {
                    ", 4M blocks for --sweep"
                } else {
                    ""
                }
            )));
        }
        let (range, range_len) = (RangeId(r.range_id.0), r.length);
        let per = thread_len(args);
        let mut threads = Vec::new();
        for _ in 0..args.threads {
            let l = alloc(per)?;
            let s = alloc(per)?;
            threads.push(ThreadMem {
                local: (initiator.driver.register(l.clone()), l),
                scratch: (initiator.driver.register(s.clone()), s),
            });
        }
        Ok(Self {
            initiator,
            peer,
            range,
            range_len,
            asked: want.is_some(),
            threads,
        })
    }
}

impl Drop for CoreBackend<'_> {
    fn drop(&mut self) {
        self.initiator.close(&self.peer);
    }
}

impl Backend for CoreBackend<'_> {
    fn path(&self) -> PathKind {
        self.peer.path
    }

    fn path_note(&self) -> String {
        let mut note = if self.asked {
            "asked for with --path".to_owned()
        } else {
            match self.peer.path {
                PathKind::Local => {
                    "chosen by the path policy: same host, the target's memory is mapped here"
                        .to_owned()
                }
                _ => "chosen by the path policy".to_owned(),
            }
        };
        for (p, why) in &self.peer.fell_back {
            note.push_str(&format!("; fell back from {p}: {why}"));
        }
        note
    }

    fn peer(&self) -> String {
        format!("{} (epoch {})", self.peer.source_id, self.peer.epoch)
    }

    fn remote_len(&self) -> u64 {
        self.range_len
    }

    fn local(&self, t: usize) -> &Arc<HostMemory> {
        &self.threads[t].local.1
    }

    fn outstanding_slices(&self) -> u64 {
        self.initiator.driver.outstanding_slices()
    }

    fn scratch(&self, t: usize) -> &Arc<HostMemory> {
        &self.threads[t].scratch.1
    }

    fn batch(
        &self,
        t: usize,
        reqs: &[Req],
        scratch: bool,
    ) -> Result<Vec<(Outcome, Duration)>, Failure> {
        let mem = &self.threads[t];
        let reg = if scratch { mem.scratch.0 } else { mem.local.0 };
        let batch = reqs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                request(
                    i as u64,
                    r.op,
                    reg,
                    r.local_offset,
                    &self.peer,
                    self.range,
                    r.remote_offset,
                    r.len,
                )
            })
            .collect();
        let t0 = Instant::now();
        let ids = self
            .initiator
            .driver
            .submit(batch)
            .map_err(|e| Failure::failed(format!("submit refused: {e}")))?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let o = self.initiator.driver.wait(id, WAIT_BOUND).ok_or_else(|| {
                Failure::failed(format!(
                    "no outcome for request {id} within {WAIT_BOUND:?}: the engine's core is stuck (a bug); rerun with --log debug"
                ))
            })?;
            out.push((o, t0.elapsed()));
        }
        Ok(out)
    }
}

/// The rdma path through `TransferEngine`s: the initiator engine here, the
/// target engine in this process (loopback, on this host's NICs or the
/// simulated fabric) or in another process or host. Either way the peer is
/// opened over a TCP control link (handshake, descriptors, RC connect).
pub(crate) struct RdmaBackend {
    sim: bool,
    a: TransferEngine,
    /// The loopback target, stopped after the initiator.
    target: Option<RdmaTarget>,
    _link: TcpControlLink,
    peer: PeerInfo,
    range: RangeId,
    range_len: u64,
    threads: Vec<ThreadMem>,
}

/// A target engine answering control links on a TCP listener: every
/// connection is a peer opened by an initiator.
pub(crate) struct RdmaTarget {
    pub(crate) engine: Arc<TransferEngine>,
    pub(crate) addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RdmaTarget {
    /// Publishes `len` bytes (read-write, the bench's pattern) and accepts
    /// peers on `listen`.
    pub(crate) fn start(
        engine: TransferEngine,
        len: u64,
        listen: SocketAddr,
    ) -> Result<(Self, RangeId), Failure> {
        let remote = alloc(len)?;
        fill_target_pattern(&remote).map_err(Failure::failed)?;
        let published = engine
            .register_host(remote, Access::REMOTE_READ_WRITE)
            .map_err(no_rdma)?;
        let listener = TcpListener::bind(listen).map_err(|e| {
            Failure::failed(format!(
                "cannot listen on {listen}: {e}; pick a free address with --listen"
            ))
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| Failure::failed(e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Failure::failed(e.to_string()))?;
        let engine = Arc::new(engine);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (engine, stop) = (engine.clone(), stop.clone());
            std::thread::Builder::new()
                .name("orbitte-bench-accept".into())
                .spawn(move || accept_rdma_peers(&listener, &engine, &stop))
                .map_err(|e| Failure::failed(e.to_string()))?
        };
        Ok((
            Self {
                engine,
                addr,
                stop,
                thread: Some(thread),
            },
            RangeId(published.id.0),
        ))
    }
}

impl Drop for RdmaTarget {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Err(u) = self.engine.shutdown(Duration::from_secs(5)) {
            tracing::error!(error = %u, "target engine shutdown");
        }
    }
}

fn no_rdma(e: orbitte::RegisterError) -> Failure {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default().to_owned();
    Failure::failed(format!(
        "rdma path: {first}; run `orbitte doctor --path rdma` for every check, or measure tcp/local (leave out --path)"
    ))
}

/// An engine on the native provider, or on `fabric`'s `device`.
fn engine(id: String, fabric: Option<&SimFabric>, device: &str) -> Result<TransferEngine, Failure> {
    let mut b = EngineBuilder::new(id);
    if let Some(f) = fabric {
        b = b.provider(f.provider_for(&[device]));
    }
    b.build()
        .map_err(|e| Failure::failed(format!("cannot build an engine: {e}")))
}

/// The bench's rdma target engine (native provider), for `--role target`.
pub(crate) fn rdma_target(
    args: &BenchArgs,
    len: u64,
    listen: SocketAddr,
) -> Result<(RdmaTarget, RangeId), Failure> {
    let id = super::source_id(args, "target");
    RdmaTarget::start(engine(id, None, "")?, len, listen)
}

impl RdmaBackend {
    /// Loopback: a target engine and an initiator engine in this process
    /// (on the simulated fabric with `--sim`).
    pub(crate) fn loopback(args: &BenchArgs, len: u64) -> Result<Self, Failure> {
        let fabric = args.sim.then(|| {
            SimFabric::new(
                SimDescription::new(vec![
                    SimDeviceDesc::roce("sim_initiator", [10, 0, 0, 1]),
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
        let b = engine(
            super::source_id(args, "target"),
            fabric.as_ref(),
            "sim_target",
        )?;
        let (target, _) = RdmaTarget::start(b, len, SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = target.addr;
        let a = engine(
            super::source_id(args, "initiator"),
            fabric.as_ref(),
            "sim_initiator",
        )?;
        Self::connect(args, a, addr, Some(target))
    }

    /// Initiator: connects to a target in another process or host.
    pub(crate) fn initiator(args: &BenchArgs, addr: SocketAddr) -> Result<Self, Failure> {
        let a = engine(super::source_id(args, "initiator"), None, "")?;
        Self::connect(args, a, addr, None)
    }

    fn connect(
        args: &BenchArgs,
        a: TransferEngine,
        addr: SocketAddr,
        target: Option<RdmaTarget>,
    ) -> Result<Self, Failure> {
        let per = thread_len(args);
        let mut threads = Vec::new();
        for _ in 0..args.threads {
            let l = alloc(per)?;
            let s = alloc(per)?;
            let rl = a
                .register_host(l.clone(), Access::LocalOnly)
                .map_err(no_rdma)?;
            let rs = a
                .register_host(s.clone(), Access::LocalOnly)
                .map_err(no_rdma)?;
            threads.push(ThreadMem {
                local: (rl.id, l),
                scratch: (rs.id, s),
            });
        }
        let mut link = TcpControlLink::connect(addr, Duration::from_secs(5)).map_err(|e| {
            Failure::failed(format!(
                "cannot reach the target at {addr}: {e}; check that `orbitte bench --role target --path rdma` runs there and the address is right"
            ))
        })?;
        let peer = a.open_peer(&mut link).map_err(|e| {
            Failure::failed(format!(
                "rdma path: cannot open the peer at {addr}: {e}; run `orbitte doctor --path rdma` on both hosts"
            ))
        })?;
        let need = super::range_len(args);
        let rw = |f: orbitte::wire::AccessFlags| {
            f.contains(orbitte::wire::AccessFlags::REMOTE_READ)
                && f.contains(orbitte::wire::AccessFlags::REMOTE_WRITE)
        };
        let Some(&(range, range_len, _)) =
            peer.ranges.iter().filter(|r| rw(r.2)).max_by_key(|r| r.1)
        else {
            return Err(Failure::failed(format!(
                "the target {} publishes no read-write range: start it with `orbitte bench --role target --path rdma`",
                peer.source_id
            )));
        };
        if range_len < need {
            return Err(Failure::failed(format!(
                "the target's largest read-write range is {range_len} bytes; this run needs {need}: start the target with the same settings or lower them"
            )));
        }
        Ok(Self {
            sim: args.sim,
            a,
            target,
            _link: link,
            peer,
            range,
            range_len,
            threads,
        })
    }
}

impl Drop for RdmaBackend {
    fn drop(&mut self) {
        if let Err(u) = self.a.shutdown(Duration::from_secs(5)) {
            tracing::error!(error = %u, "engine shutdown");
        }
        // Then the loopback target (its Drop shuts its engine down).
        self.target.take();
    }
}

impl Backend for RdmaBackend {
    fn path(&self) -> PathKind {
        PathKind::Rdma
    }

    fn path_note(&self) -> String {
        if self.sim {
            format!(
                "asked for with --path; {} rail(s) on the simulated fabric (--sim: zero latency, unlimited bandwidth: the engine's own overhead, not a NIC)",
                self.peer.rails.len()
            )
        } else {
            format!(
                "asked for with --path; {} rail(s) on this host's NIC(s)",
                self.peer.rails.len()
            )
        }
    }

    fn peer(&self) -> String {
        format!("{} (epoch {})", self.peer.source_id, self.peer.epoch)
    }

    fn remote_len(&self) -> u64 {
        self.range_len
    }

    fn local(&self, t: usize) -> &Arc<HostMemory> {
        &self.threads[t].local.1
    }

    fn outstanding_slices(&self) -> u64 {
        self.a.outstanding_slices()
    }

    fn scratch(&self, t: usize) -> &Arc<HostMemory> {
        &self.threads[t].scratch.1
    }

    fn batch(
        &self,
        t: usize,
        reqs: &[Req],
        scratch: bool,
    ) -> Result<Vec<(Outcome, Duration)>, Failure> {
        let mem = &self.threads[t];
        let reg = if scratch { mem.scratch.0 } else { mem.local.0 };
        let batch: Vec<TransferRequest> = reqs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let f = match r.op {
                    Op::Read => TransferRequest::read,
                    Op::Write => TransferRequest::write,
                };
                f(
                    reg,
                    r.local_offset,
                    self.peer.id,
                    self.range,
                    r.remote_offset,
                    r.len,
                )
                .label(i as u64)
            })
            .collect();
        let t0 = Instant::now();
        let ids = self
            .a
            .submit(&batch)
            .map_err(|e| Failure::failed(format!("submit refused: {e}")))?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let o = self
                .a
                .wait(id, WAIT_BOUND)
                .map_err(|e| Failure::failed(format!("waiting for request {id}: {e}")))?;
            out.push((o, t0.elapsed()));
        }
        Ok(out)
    }
}
