//! `orbitte bench --peers N,...`: many initiator engines against one
//! target. The target lives in this process; the initiators are engines in
//! `--processes` child processes (`--role peers-worker`), which take their
//! orders as JSON lines on stdin and answer on stdout. For each count the
//! children connect every engine, the target's threads, memory and
//! descriptors are read while the peers are idle, then every engine keeps
//! one batch in flight for `--duration` per op and block size. With
//! `--rounds R` the counts take turns R times (each round connects every
//! count anew), and each cell is its median round, so that a slow minute
//! of a shared machine does not land on one count only.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use orbitte::{
    ConnectOptions, HostMemory, Outcome, PathKind, PeerId, RangeId, RegistrationId, Status,
    TransferEngine,
};
use orbitte_engine::TransferRequest;
use serde::{Deserialize, Serialize};

use super::backend::{self, Target};
use super::rounds::median_index;
use super::settings::secret;
use crate::cli::{BenchArgs, Op};
use crate::failure::Failure;
use crate::stats::{CpuTicks, CpuUse, Latencies, LatencySummary, gbps};

/// How long after connecting the idle usage is read: tcp sessions and
/// rails hold no thread at all, and the local path's copy workers end once quiet
/// for [`orbitte_engine::PARK_AFTER`] (its wait can stretch that by up to
/// twice its 200 ms poll interval), so the usage read after this is the
/// idle one on every path.
const IDLE_SETTLE: Duration = orbitte_engine::PARK_AFTER.saturating_add(Duration::from_millis(600));

/// An order from the coordinator to a worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "order", rename_all = "kebab-case")]
enum Order {
    /// Build and connect every engine of this worker.
    Connect,
    /// Keep one batch in flight on every engine for `seconds`.
    Run {
        write: bool,
        block: u64,
        seconds: f64,
    },
    /// Shut the engines down and exit.
    Quit,
}

/// A worker's answer to one order.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "kebab-case")]
enum Answer {
    Connected {
        seconds: f64,
        usage: Usage,
    },
    Ran {
        bytes: u64,
        requests: u64,
        seconds: f64,
        latencies_ns: Vec<u64>,
    },
    Failed {
        reason: String,
    },
}

/// What a process holds, from `/proc/self`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Usage {
    pub(crate) threads: u64,
    pub(crate) rss_bytes: u64,
    pub(crate) descriptors: u64,
}

impl Usage {
    fn now() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let descriptors = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
        Self {
            threads: field("Threads:"),
            rss_bytes: field("VmRSS:") * 1024,
            descriptors,
        }
    }

    fn add(self, o: Self) -> Self {
        Self {
            threads: self.threads + o.threads,
            rss_bytes: self.rss_bytes + o.rss_bytes,
            descriptors: self.descriptors + o.descriptors,
        }
    }
}

/// The CPU time this process has used, all its threads (ended ones
/// included): `CLOCK_PROCESS_CPUTIME_ID`.
fn process_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// Per peer: what the held resources grew by over `peers` peers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct PerPeer {
    pub(crate) threads: f64,
    pub(crate) rss_bytes: f64,
    pub(crate) descriptors: f64,
}

impl PerPeer {
    fn of(before: Usage, after: Usage, peers: u32) -> Self {
        let d = |a: u64, b: u64| (a as f64 - b as f64) / f64::from(peers);
        Self {
            threads: d(after.threads, before.threads),
            rss_bytes: d(after.rss_bytes, before.rss_bytes),
            descriptors: d(after.descriptors, before.descriptors),
        }
    }
}

/// One op and block size at one peer count.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Cell {
    pub(crate) op: Op,
    pub(crate) block_size: u64,
    pub(crate) bytes: u64,
    pub(crate) requests: u64,
    pub(crate) seconds: f64,
    /// Every peer's bytes over the longest worker's time.
    pub(crate) gbps: f64,
    /// This figure over the one-peer figure of the same op and block, when
    /// the run measured one peer (medians over medians with rounds).
    pub(crate) of_one_peer: Option<f64>,
    /// Every round's `gbps`, in the order measured; the cell's other
    /// figures are those of its median round.
    pub(crate) rounds_gbps: Vec<f64>,
    pub(crate) latency: Option<LatencySummary>,
    /// The target process's CPU time over the cell's wall time (1.0 is one
    /// core busy).
    pub(crate) target_cpu_cores: f64,
    /// The whole machine's CPUs over the cell (every process's work, and
    /// what the hypervisor took); `None` without `/proc/stat`.
    pub(crate) cpu: Option<CpuUse>,
    /// What the target process held at the end of the cell.
    pub(crate) target_busy: Usage,
}

/// One peer count.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Count {
    pub(crate) peers: u32,
    pub(crate) processes: u32,
    /// Until every engine had its peer open: the longest any worker took
    /// to connect its engines (they all start at the same order); the
    /// median round's with rounds.
    pub(crate) connect_seconds: f64,
    /// The target process with no peer, and with every peer connected and
    /// idle (in the first round).
    pub(crate) target_before: Usage,
    pub(crate) target_idle: Usage,
    pub(crate) target_per_peer: PerPeer,
    /// Every initiator process together, peers connected and idle.
    pub(crate) initiators_idle: Usage,
    pub(crate) initiator_per_peer: PerPeer,
    pub(crate) cells: Vec<Cell>,
}

/// The report of a `--peers` run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PeersReport {
    pub(crate) schema_version: u32,
    /// `bench_peers`.
    pub(crate) command: &'static str,
    pub(crate) path: &'static str,
    pub(crate) batch_size: u32,
    pub(crate) threads_per_process: u32,
    pub(crate) duration_seconds: f64,
    /// `--rounds`: how many times every count was measured.
    pub(crate) rounds: u32,
    pub(crate) counts: Vec<Count>,
}

impl Count {
    /// One count's rounds as one: the first round's usage, the median
    /// round's connect time, and for each cell its median round with every
    /// round's GB/s.
    fn of_rounds(rounds: Vec<Self>) -> Option<Self> {
        let connects: Vec<f64> = rounds.iter().map(|c| c.connect_seconds).collect();
        let connect_seconds = rounds.get(median_index(&connects)?)?.connect_seconds;
        let cells = (0..rounds.first()?.cells.len())
            .map(|j| {
                let gbps: Vec<f64> = rounds.iter().map(|c| c.cells[j].gbps).collect();
                let mut cell = rounds[median_index(&gbps)?].cells[j].clone();
                cell.rounds_gbps = gbps;
                Some(cell)
            })
            .collect::<Option<Vec<_>>>()?;
        let first = rounds.into_iter().next()?;
        Some(Self {
            connect_seconds,
            cells,
            ..first
        })
    }
}

/// Sets every cell's `of_one_peer` from the one-peer count's cell of the
/// same op and block, when the run measured one peer.
fn relate_to_one_peer(counts: &mut [Count]) {
    let one: Vec<(Op, u64, f64)> = counts
        .iter()
        .filter(|c| c.peers == 1)
        .flat_map(|c| c.cells.iter().map(|x| (x.op, x.block_size, x.gbps)))
        .collect();
    for cell in counts.iter_mut().flat_map(|c| c.cells.iter_mut()) {
        cell.of_one_peer = one
            .iter()
            .find(|(o, b, _)| *o == cell.op && *b == cell.block_size)
            .map(|&(_, _, g)| cell.gbps / g)
            .filter(|r| r.is_finite());
    }
}

/// The path a `--peers` run measures: `--path`, else tcp (the path many
/// hosts' peers take; local would map the target's memory once per peer).
fn peers_path(args: &BenchArgs) -> Result<PathKind, Failure> {
    match args.path.map(super::settings::path_kind).transpose()? {
        None | Some(PathKind::Tcp) => Ok(PathKind::Tcp),
        Some(PathKind::Local) => Ok(PathKind::Local),
        Some(other) => Err(Failure::usage(format!(
            "--peers measures the tcp and local paths, not {}: leave out --path or pick tcp or local",
            other.name()
        ))),
    }
}

fn bad_answer(worker: usize, what: &str) -> Failure {
    Failure::failed(format!(
        "peers worker {worker} {what}; its log above says why (rerun with --log debug for more)"
    ))
}

/// A child process running `--role peers-worker`.
struct Worker {
    index: usize,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn(
        index: usize,
        args: &BenchArgs,
        target: SocketAddr,
        peers: u32,
        path: PathKind,
    ) -> Result<Self, Failure> {
        let exe = std::env::current_exe().map_err(|e| {
            Failure::failed(format!(
                "cannot find this program to start peers workers: {e}"
            ))
        })?;
        let mut cmd = Command::new(exe);
        cmd.arg("bench")
            .args(["--role", "peers-worker"])
            .args(["--peer", &target.to_string()])
            .args(["--peers", &peers.to_string()])
            .args(["--path", path.name()])
            .args(["--batch-size", &args.batch_size.to_string()])
            .args(["--threads", &args.threads.to_string()])
            .arg("--blocks")
            .arg(
                args.blocks
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(f) = &args.secret_file {
            cmd.arg("--secret-file").arg(f);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| Failure::failed(format!("cannot start peers worker {index}: {e}")))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(Failure::failed(format!(
                "peers worker {index} started without pipes"
            )));
        };
        Ok(Self {
            index,
            child,
            stdin,
            stdout: BufReader::new(stdout),
        })
    }

    fn send(&mut self, order: &Order) -> Result<(), Failure> {
        let line = serde_json::to_string(order)
            .map_err(|e| Failure::failed(format!("cannot encode an order: {e}")))?;
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| bad_answer(self.index, &format!("stopped taking orders ({e})")))
    }

    fn answer(&mut self) -> Result<Answer, Failure> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) => {
                let status = self
                    .child
                    .wait()
                    .map_or_else(|e| e.to_string(), |s| s.to_string());
                Err(bad_answer(self.index, &format!("exited ({status})")))
            }
            Ok(_) => match serde_json::from_str(&line) {
                Ok(Answer::Failed { reason }) => {
                    Err(bad_answer(self.index, &format!("failed: {reason}")))
                }
                Ok(a) => Ok(a),
                Err(e) => Err(bad_answer(
                    self.index,
                    &format!("answered {:?}, not an answer ({e})", line.trim_end()),
                )),
            },
            Err(e) => Err(bad_answer(self.index, &format!("cannot be read ({e})"))),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.send(&Order::Quit).is_ok() {
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Splits `n` engines over `m` processes as evenly as possible.
fn shares(n: u32, m: u32) -> Vec<u32> {
    let m = m.clamp(1, n.max(1));
    (0..m).map(|i| n / m + u32::from(i < n % m)).collect()
}

/// Runs the coordinator: the target here, the workers as children.
pub(crate) fn run(args: &BenchArgs, show: bool) -> Result<(), Failure> {
    let path = peers_path(args)?;
    if args.role != crate::cli::Role::Loopback {
        return Err(Failure::usage(
            "--peers starts its own target and initiators on this host: leave out --role",
        ));
    }
    if args.sweep || args.sim {
        return Err(Failure::usage(
            "--peers measures its own matrix (counts x READ/WRITE x --blocks): leave out --sweep and --sim",
        ));
    }
    let max_block = args.blocks.iter().copied().max().unwrap_or(64 << 10);
    let len = max_block * u64::from(args.batch_size);
    crate::memory::check(
        len.saturating_mul(1 + u64::from(args.processes.unwrap_or(4))),
        &format!("the target's range and each initiator process's buffer of {len} bytes"),
        "lower --blocks or --batch-size",
    )?;
    let listen = super::settings::parse_addr(&args.listen, "--listen")?;
    let id = super::settings::source_id(args, "target");
    // Every peer holds a session at the target at once: its limit is
    // raised to the largest count (with room for a session per process).
    let most = args.peers.iter().copied().max().unwrap_or(1) as usize;
    let builder = backend::engine(id, None, "")?.session_settings(move |c| {
        c.max_sessions = c.max_sessions.max(most + 64);
    });
    let target = Target::start(builder, false, len, listen, args)?;
    let rounds = args.rounds.max(1);
    let cells_total = rounds as usize * args.peers.len() * 2 * args.blocks.len();
    let bar = super::progress::steps(show, cells_total as u64, "peers");
    let mut measured: Vec<Vec<Count>> = args.peers.iter().map(|_| Vec::new()).collect();
    for round in 1..=rounds {
        for (&n, kept) in args.peers.iter().zip(&mut measured) {
            let m = args.processes.unwrap_or(4).min(n);
            let at = if rounds > 1 {
                format!("round {round}/{rounds}, {n} peer(s)")
            } else {
                format!("{n} peer(s)")
            };
            bar.set_message(format!("{at}: connecting"));
            kept.push(measure_count(args, &target, path, n, m, &bar, &at)?);
        }
    }
    bar.finish_and_clear();
    let mut counts: Vec<Count> = measured.into_iter().filter_map(Count::of_rounds).collect();
    relate_to_one_peer(&mut counts);
    let report = PeersReport {
        schema_version: crate::schema::SCHEMA_VERSION,
        command: "bench_peers",
        path: path.name(),
        batch_size: args.batch_size,
        threads_per_process: args.threads,
        duration_seconds: args.duration,
        rounds,
        counts,
    };
    drop(target);
    print(&report, args.json)
}

fn measure_count(
    args: &BenchArgs,
    target: &Target,
    path: PathKind,
    n: u32,
    m: u32,
    bar: &ProgressBar,
    at: &str,
) -> Result<Count, Failure> {
    let target_before = Usage::now();
    let mut workers = shares(n, m)
        .into_iter()
        .enumerate()
        .map(|(i, k)| Worker::spawn(i, args, target.addr, k, path))
        .collect::<Result<Vec<_>, _>>()?;
    for w in &mut workers {
        w.send(&Order::Connect)?;
    }
    let mut initiators_idle = Usage::default();
    // The workers connect at once; each says how long its engines took
    // (before it let them settle).
    let mut connect_seconds = 0f64;
    for w in &mut workers {
        match w.answer()? {
            Answer::Connected { usage, seconds } => {
                initiators_idle = initiators_idle.add(usage);
                connect_seconds = connect_seconds.max(seconds);
            }
            other => {
                return Err(bad_answer(
                    w.index,
                    &format!("answered {other:?} to connect"),
                ));
            }
        }
    }
    // The sessions settle on the target's side after the initiators have
    // their peers open.
    std::thread::sleep(IDLE_SETTLE);
    let target_idle = Usage::now();
    let mut cells = Vec::new();
    for op in [Op::Write, Op::Read] {
        for &block in &args.blocks {
            bar.set_message(format!(
                "{at}: {} {}",
                match op {
                    Op::Write => "WRITE",
                    Op::Read => "READ",
                },
                crate::chart::human_bytes(block)
            ));
            let cpu0 = process_cpu();
            let ticks0 = CpuTicks::now();
            let wall = Instant::now();
            for w in &mut workers {
                w.send(&Order::Run {
                    write: op == Op::Write,
                    block,
                    seconds: args.duration,
                })?;
            }
            let (mut bytes, mut requests, mut seconds) = (0u64, 0u64, 0f64);
            let mut lat = Latencies::default();
            for w in &mut workers {
                match w.answer()? {
                    Answer::Ran {
                        bytes: b,
                        requests: r,
                        seconds: s,
                        latencies_ns,
                    } => {
                        bytes += b;
                        requests += r;
                        seconds = seconds.max(s);
                        lat.merge(Latencies::from_nanos(latencies_ns));
                    }
                    other => {
                        return Err(bad_answer(w.index, &format!("answered {other:?} to run")));
                    }
                }
            }
            let target_cpu_cores =
                process_cpu().saturating_sub(cpu0).as_secs_f64() / wall.elapsed().as_secs_f64();
            let cpu = CpuTicks::now()
                .zip(ticks0)
                .and_then(|(now, then)| now.since(&then));
            let rate = gbps(bytes, Duration::from_secs_f64(seconds));
            cells.push(Cell {
                op,
                block_size: block,
                bytes,
                requests,
                seconds,
                gbps: rate,
                of_one_peer: None,
                rounds_gbps: vec![rate],
                latency: lat.summary(),
                target_cpu_cores,
                cpu,
                target_busy: Usage::now(),
            });
            bar.inc(1);
        }
    }
    drop(workers);
    Ok(Count {
        peers: n,
        processes: m,
        connect_seconds,
        target_before,
        target_idle,
        target_per_peer: PerPeer::of(target_before, target_idle, n),
        initiators_idle,
        // Against no process at all: what the initiator processes hold per
        // peer, their fixed part included.
        initiator_per_peer: PerPeer::of(Usage::default(), initiators_idle, n),
        cells,
    })
}

fn print(report: &PeersReport, json: bool) -> Result<(), Failure> {
    if json {
        let text = serde_json::to_string_pretty(report)
            .map_err(|e| Failure::failed(format!("cannot encode the report: {e}")))?;
        println!("{text}");
        return Ok(());
    }
    println!(
        "orbitte bench --peers: {} path, batch {} per peer, {} driver thread(s) per process, {} s per cell{}",
        report.path,
        report.batch_size,
        report.threads_per_process,
        report.duration_seconds,
        if report.rounds > 1 {
            format!(
                ", median of {} rounds (the counts taking turns)",
                report.rounds
            )
        } else {
            String::new()
        }
    );
    for c in &report.counts {
        println!(
            "\n{} peer(s) in {} process(es): all connected in {:.3} s",
            c.peers, c.processes, c.connect_seconds
        );
        println!(
            "  target idle: {} threads, {:.1} MiB RSS, {} descriptors ({:+.2} threads, {:+.1} KiB, {:+.2} descriptors per peer)",
            c.target_idle.threads,
            c.target_idle.rss_bytes as f64 / f64::from(1 << 20),
            c.target_idle.descriptors,
            c.target_per_peer.threads,
            c.target_per_peer.rss_bytes / 1024.0,
            c.target_per_peer.descriptors
        );
        println!(
            "  initiators idle: {} threads, {:.1} MiB RSS, {} descriptors ({:.2} threads, {:.1} KiB, {:.2} descriptors per peer)",
            c.initiators_idle.threads,
            c.initiators_idle.rss_bytes as f64 / f64::from(1 << 20),
            c.initiators_idle.descriptors,
            c.initiator_per_peer.threads,
            c.initiator_per_peer.rss_bytes / 1024.0,
            c.initiator_per_peer.descriptors
        );
        for cell in &c.cells {
            let lat = cell.latency.map_or_else(
                || "no latency samples".to_owned(),
                |l| {
                    format!(
                        "p50/p99/p999 {:.0}/{:.0}/{:.0} us",
                        l.p50_us, l.p99_us, l.p999_us
                    )
                },
            );
            let rounds = if cell.rounds_gbps.len() > 1 {
                let each: Vec<String> =
                    cell.rounds_gbps.iter().map(|g| format!("{g:.2}")).collect();
                format!(" [rounds {}]", each.join(" "))
            } else {
                String::new()
            };
            let taken = cell
                .cpu
                .filter(|c| c.steal >= 0.005)
                .map_or_else(String::new, |c| {
                    format!(
                        " ({:.0} % of the CPUs taken by the hypervisor)",
                        c.steal * 100.0
                    )
                });
            println!(
                "  {:<5} {:>6}: {:6.2} GB/s{}{} {}, target {:.2} cores, {} threads{}",
                match cell.op {
                    Op::Write => "WRITE",
                    Op::Read => "READ",
                },
                crate::chart::human_bytes(cell.block_size),
                cell.gbps,
                cell.of_one_peer
                    .map_or_else(String::new, |r| format!(" ({r:.2} of one peer)")),
                rounds,
                lat,
                cell.target_cpu_cores,
                cell.target_busy.threads,
                taken
            );
        }
    }
    Ok(())
}

/// One engine of a worker with its open peer.
struct Conn {
    engine: TransferEngine,
    peer: PeerId,
    range: RangeId,
    local: RegistrationId,
}

/// `--role peers-worker`: `--peers K` engines to `--peer`, driven by the
/// orders on stdin.
pub(crate) fn worker(args: &BenchArgs) -> Result<(), Failure> {
    let addr = super::settings::parse_addr(args.peer.as_deref().unwrap_or_default(), "--peer")?;
    let path = peers_path(args)?;
    let k = args.peers.first().copied().unwrap_or(1);
    let max_block = args.blocks.iter().copied().max().unwrap_or(64 << 10);
    let local = backend::alloc(max_block * u64::from(args.batch_size))?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut conns: Vec<Conn> = Vec::new();
    let mut say = |a: &Answer| -> Result<(), Failure> {
        let line = serde_json::to_string(a)
            .map_err(|e| Failure::failed(format!("cannot encode an answer: {e}")))?;
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|e| Failure::failed(format!("the coordinator went away: {e}")))
    };
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| Failure::failed(format!("cannot read an order: {e}")))?;
        let order: Order = serde_json::from_str(&line).map_err(|e| {
            Failure::usage(format!(
                "{line:?} is not an order ({e}): --role peers-worker is started by `orbitte bench --peers`"
            ))
        })?;
        let answer = match order {
            Order::Quit => break,
            Order::Connect => {
                let t0 = Instant::now();
                match connect_all(args, addr, path, k, &local) {
                    Ok(c) => {
                        conns = c;
                        let seconds = t0.elapsed().as_secs_f64();
                        // Idle as the target's side is read: a rail's
                        // reader parks on the engine's I/O pool once quiet
                        // for its poll interval.
                        std::thread::sleep(IDLE_SETTLE);
                        Answer::Connected {
                            seconds,
                            usage: Usage::now(),
                        }
                    }
                    Err(f) => Answer::Failed { reason: f.message },
                }
            }
            Order::Run {
                write,
                block,
                seconds,
            } => match drive(args, &conns, write, block, Duration::from_secs_f64(seconds)) {
                Ok(a) => a,
                Err(f) => Answer::Failed { reason: f.message },
            },
        };
        say(&answer)?;
    }
    std::thread::scope(|s| {
        for chunk in conns.chunks(conns.len().div_ceil(4).max(1)) {
            s.spawn(move || {
                for c in chunk {
                    backend::shutdown(&c.engine, "peers worker");
                }
            });
        }
    });
    Ok(())
}

/// Builds and connects `k` engines on `--threads` threads.
fn connect_all(
    args: &BenchArgs,
    addr: SocketAddr,
    path: PathKind,
    k: u32,
    local: &Arc<HostMemory>,
) -> Result<Vec<Conn>, Failure> {
    let threads = args.threads.clamp(1, k.max(1)) as usize;
    let pid = std::process::id();
    let secret = secret(args)?;
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let secret = secret.clone();
                s.spawn(move || -> Result<Vec<(u32, Conn)>, Failure> {
                    let mut mine = Vec::new();
                    for i in (t as u32..k).step_by(threads) {
                        mine.push((i, connect_one(addr, path, pid, i, local, secret.clone())?));
                    }
                    Ok(mine)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Failure::failed("a connecting thread panicked")))
            })
            .collect::<Vec<_>>()
    });
    let mut all = Vec::with_capacity(k as usize);
    for r in results {
        all.extend(r?);
    }
    all.sort_by_key(|(i, _)| *i);
    Ok(all.into_iter().map(|(_, c)| c).collect())
}

fn connect_one(
    addr: SocketAddr,
    path: PathKind,
    pid: u32,
    i: u32,
    local: &Arc<HostMemory>,
    secret: Option<orbitte::ClusterSecret>,
) -> Result<Conn, Failure> {
    let mut b = backend::engine(format!("orbitte-bench-peer-{pid}-{i}"), None, "")?
        .host_memory_without_rdma();
    if let Some(secret) = secret {
        b = b.cluster_secret(secret);
    }
    let engine = backend::build(b)?;
    let reg = engine
        .register_host_without_rdma(local.clone(), orbitte::Access::LocalOnly)
        .map_err(|e| Failure::failed(format!("cannot register memory: {e}")))?;
    let peer = engine
        .connect_with(addr, ConnectOptions::new().path(path).rails(1))
        .map_err(|e| {
            Failure::failed(format!(
                "engine {i} cannot open the target at {addr} on the {} path: {e}",
                path.name()
            ))
        })?;
    let range = peer
        .info
        .ranges
        .iter()
        .filter(|r| {
            r.access.contains(orbitte_wire::AccessFlags::REMOTE_READ)
                && r.access.contains(orbitte_wire::AccessFlags::REMOTE_WRITE)
        })
        .max_by_key(|r| r.len)
        .map(|r| r.range)
        .ok_or_else(|| Failure::failed("the target publishes no read-write range"))?;
    Ok(Conn {
        peer: peer.info.id,
        engine,
        range,
        local: reg.id,
    })
}

/// Every engine keeps one batch in flight until `duration` has passed;
/// `--threads` threads share the engines, each waiting on its engines in
/// turn and resubmitting at once.
fn drive(
    args: &BenchArgs,
    conns: &[Conn],
    write: bool,
    block: u64,
    duration: Duration,
) -> Result<Answer, Failure> {
    if conns.is_empty() {
        return Err(Failure::failed("run before connect"));
    }
    let batch = u64::from(args.batch_size);
    let requests = |c: &Conn| -> Vec<TransferRequest> {
        (0..batch)
            .map(|i| {
                let f = if write {
                    TransferRequest::write
                } else {
                    TransferRequest::read
                };
                f(c.local, i * block, c.peer, c.range, i * block, block).label(i)
            })
            .collect()
    };
    let threads = (args.threads as usize).clamp(1, conns.len());
    let start = Instant::now();
    let deadline = start + duration;
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mine: Vec<&Conn> = conns.iter().skip(t).step_by(threads).collect();
                s.spawn(move || drive_thread(&mine, &requests, deadline))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Failure::failed("a driving thread panicked")))
            })
            .collect::<Vec<_>>()
    });
    let seconds = start.elapsed().as_secs_f64();
    let (mut bytes, mut done, mut lat) = (0, 0, Latencies::default());
    for r in results {
        let (b, n, l) = r?;
        bytes += b;
        done += n;
        lat.merge(l);
    }
    Ok(Answer::Ran {
        bytes,
        requests: done,
        seconds,
        latencies_ns: lat.into_nanos(),
    })
}

type Built<'a> = dyn Fn(&Conn) -> Vec<TransferRequest> + Sync + 'a;

fn drive_thread(
    conns: &[&Conn],
    requests: &Built<'_>,
    deadline: Instant,
) -> Result<(u64, u64, Latencies), Failure> {
    let batches: Vec<Vec<TransferRequest>> = conns.iter().map(|c| requests(c)).collect();
    let submit = |c: &Conn, b: &[TransferRequest]| {
        c.engine
            .submit(b)
            .map(|ids| (Instant::now(), ids))
            .map_err(|e| Failure::failed(format!("submit refused: {e}")))
    };
    let mut inflight = conns
        .iter()
        .zip(&batches)
        .map(|(c, b)| submit(c, b).map(Some))
        .collect::<Result<Vec<_>, _>>()?;
    let (mut bytes, mut done, mut lat) = (0u64, 0u64, Latencies::default());
    let mut got: Vec<Outcome> = Vec::new();
    while inflight.iter().any(Option::is_some) {
        for ((c, b), slot) in conns.iter().zip(&batches).zip(inflight.iter_mut()) {
            let Some((t0, ids)) = slot.take() else {
                continue;
            };
            let mut rest = &ids[..];
            while let Some(first) = rest.first() {
                got.clear();
                let taken = c
                    .engine
                    .wait_ready(rest, Duration::from_secs(60), &mut got)
                    .map_err(|e| Failure::failed(format!("waiting for request {first}: {e}")))?;
                let at = t0.elapsed();
                for o in &got {
                    if o.status != Status::Complete {
                        return Err(Failure::failed(format!(
                            "request {} ended {:?}: {}",
                            o.request,
                            o.status,
                            o.failure.as_ref().map_or_else(
                                || "no failure information".to_owned(),
                                ToString::to_string
                            )
                        )));
                    }
                    bytes += o.len;
                    done += 1;
                    lat.record(at);
                }
                rest = &rest[taken..];
            }
            if Instant::now() < deadline {
                *slot = Some(submit(c, b)?);
            }
        }
    }
    Ok((bytes, done, lat))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_are_split_evenly_over_processes() {
        assert_eq!(shares(1000, 4), vec![250, 250, 250, 250]);
        assert_eq!(shares(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(shares(1, 4), vec![1]);
        assert_eq!(shares(3, 1), vec![3]);
    }

    #[test]
    fn orders_and_answers_round_trip_as_json_lines() {
        let o = serde_json::to_string(&Order::Run {
            write: true,
            block: 65536,
            seconds: 1.5,
        })
        .unwrap();
        assert_eq!(
            o,
            r#"{"order":"run","write":true,"block":65536,"seconds":1.5}"#
        );
        let a: Answer = serde_json::from_str(
            r#"{"answer":"ran","bytes":10,"requests":2,"seconds":0.5,"latencies_ns":[1,2]}"#,
        )
        .unwrap();
        assert!(matches!(
            a,
            Answer::Ran {
                bytes: 10,
                requests: 2,
                ..
            }
        ));
    }

    /// A cell whose median latency is its GB/s times 10 (so that which
    /// round a figure came from shows).
    fn cell(op: Op, gbps: f64) -> Cell {
        let p50_us = gbps * 10.0;
        Cell {
            op,
            block_size: 65536,
            bytes: 1,
            requests: 1,
            seconds: 1.0,
            gbps,
            of_one_peer: None,
            rounds_gbps: vec![gbps],
            latency: Some(LatencySummary {
                p50_us,
                p99_us: p50_us,
                p999_us: p50_us,
                max_us: p50_us,
            }),
            target_cpu_cores: 0.5,
            cpu: None,
            target_busy: Usage::default(),
        }
    }

    /// A count with `threads` idle at the target and a WRITE and a READ
    /// cell.
    fn count(peers: u32, connect_seconds: f64, threads: u64, write: f64, read: f64) -> Count {
        let idle = Usage {
            threads,
            ..Usage::default()
        };
        Count {
            peers,
            processes: 1,
            connect_seconds,
            target_before: Usage::default(),
            target_idle: idle,
            target_per_peer: PerPeer::of(Usage::default(), idle, peers),
            initiators_idle: Usage::default(),
            initiator_per_peer: PerPeer::of(Usage::default(), Usage::default(), peers),
            cells: vec![cell(Op::Write, write), cell(Op::Read, read)],
        }
    }

    /// Each cell is its own median round (its latency goes with it), the
    /// connect time the median round's, the usage the first round's.
    #[test]
    fn rounds_give_each_cell_its_median_round() {
        let rounds = vec![
            count(16, 0.3, 4, 3.0, 9.0),
            count(16, 0.1, 5, 1.0, 7.0),
            count(16, 0.2, 6, 2.0, 8.0),
        ];
        let c = Count::of_rounds(rounds).unwrap();
        assert_eq!(c.connect_seconds, 0.2);
        assert_eq!(c.target_idle.threads, 4);
        assert_eq!(c.cells[0].gbps, 2.0);
        assert_eq!(c.cells[0].latency.unwrap().p50_us, 20.0);
        assert_eq!(c.cells[0].rounds_gbps, [3.0, 1.0, 2.0]);
        assert_eq!(c.cells[1].gbps, 8.0);
        assert_eq!(c.cells[1].latency.unwrap().p50_us, 80.0);
        assert_eq!(c.cells[1].rounds_gbps, [9.0, 7.0, 8.0]);
        assert!(Count::of_rounds(Vec::new()).is_none());
    }

    #[test]
    fn every_count_is_related_to_the_one_peer_cell_of_its_op() {
        let mut counts = vec![count(1, 0.1, 4, 4.0, 2.0), count(256, 0.1, 4, 3.0, 3.0)];
        relate_to_one_peer(&mut counts);
        let ratios: Vec<Option<f64>> = counts
            .iter()
            .flat_map(|c| c.cells.iter().map(|x| x.of_one_peer))
            .collect();
        assert_eq!(ratios, [Some(1.0), Some(1.0), Some(0.75), Some(1.5)]);
        // Without a one-peer count there is no ratio.
        let mut counts = vec![count(16, 0.1, 4, 3.0, 3.0)];
        relate_to_one_peer(&mut counts);
        assert_eq!(counts[0].cells[0].of_one_peer, None);
    }

    #[test]
    fn per_peer_figures_divide_the_growth() {
        let before = Usage {
            threads: 10,
            rss_bytes: 1000,
            descriptors: 20,
        };
        let after = Usage {
            threads: 210,
            rss_bytes: 3000,
            descriptors: 220,
        };
        let p = PerPeer::of(before, after, 100);
        assert_eq!(p.threads, 2.0);
        assert_eq!(p.rss_bytes, 20.0);
        assert_eq!(p.descriptors, 2.0);
    }

    #[test]
    fn this_process_usage_is_read() {
        let u = Usage::now();
        assert!(u.threads >= 1, "{u:?}");
        assert!(u.rss_bytes > 0, "{u:?}");
        assert!(u.descriptors >= 3, "{u:?}");
        assert!(process_cpu() > Duration::ZERO);
    }
}
