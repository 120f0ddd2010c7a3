//! What the measurement loop runs batches on: the engine's core with its
//! tcp/local transports ([`CoreBackend`]), or two `TransferEngine`s on the
//! rdma path ([`RdmaBackend`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use orbitte::transport::{Op, PathKind, RangeId, RegistrationId};
use orbitte::verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric, SimTiming};
use orbitte::{
    Access, EngineBuilder, HostMemory, InProcessLink, Outcome, PeerInfo, TransferEngine,
    TransferRequest,
};

use super::fill_target_pattern;
use crate::Failure;
use crate::cli::BenchArgs;
use crate::net::{Initiator, Peer, request};

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

/// Two `TransferEngine`s in this process on the native provider, connected
/// over an in-process control link: Host Direct READ/WRITE on this host's
/// RDMA NIC (loopback through the NIC).
pub(crate) struct RdmaBackend {
    sim: bool,
    a: TransferEngine,
    b: TransferEngine,
    peer: PeerInfo,
    range: RangeId,
    range_len: u64,
    threads: Vec<ThreadMem>,
}

impl RdmaBackend {
    pub(crate) fn start(args: &BenchArgs, len: u64) -> Result<Self, Failure> {
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
        let build = |id: String, device: &str| {
            let mut b = EngineBuilder::new(id);
            if let Some(f) = &fabric {
                b = b.provider(f.provider_for(&[device]));
            }
            b.build()
                .map_err(|e| Failure::failed(format!("cannot build an engine: {e}")))
        };
        let pid = std::process::id();
        let a = build(format!("orbitte-bench-initiator-{pid}"), "sim_initiator")?;
        let b = build(format!("orbitte-bench-target-{pid}"), "sim_target")?;
        let no_rdma = |e: orbitte::RegisterError| {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default().to_owned();
            Failure::failed(format!(
                "rdma path: {first}; run `orbitte doctor --path rdma` for every check, or measure tcp/local (leave out --path)"
            ))
        };
        let remote = alloc(len)?;
        fill_target_pattern(&remote).map_err(Failure::failed)?;
        let published = b
            .register_host(remote, Access::REMOTE_READ_WRITE)
            .map_err(no_rdma)?;
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
        let (mut la, mut lb) = InProcessLink::pair();
        let peer = std::thread::scope(|s| {
            let accept = s.spawn(|| b.accept_peer(&mut lb));
            let opened = a.open_peer(&mut la);
            let accepted = accept.join();
            match (opened, accepted) {
                (Ok(p), Ok(Ok(_))) => Ok(p),
                (Err(e), _) | (_, Ok(Err(e))) => Err(Failure::failed(format!(
                    "rdma path: cannot connect the two engines: {e}; run `orbitte doctor --path rdma`"
                ))),
                (_, Err(_)) => Err(Failure::failed("rdma path: the accepting thread panicked")),
            }
        })?;
        Ok(Self {
            sim: args.sim,
            a,
            b,
            peer,
            range: RangeId(published.id.0),
            range_len: published.len,
            threads,
        })
    }
}

impl Drop for RdmaBackend {
    fn drop(&mut self) {
        for e in [&self.a, &self.b] {
            if let Err(u) = e.shutdown(Duration::from_secs(5)) {
                tracing::error!(error = %u, "engine shutdown");
            }
        }
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
