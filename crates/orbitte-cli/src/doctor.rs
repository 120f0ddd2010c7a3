//! `orbitte doctor`: the capability matrix. For every path four separate
//! checks (build, discovery, completion, drain), each with its reason and
//! fix.
//!
//! Sources: the engine's own matrix ([`orbitte::TransferEngine::capabilities`],
//! which evaluates rdma for real); tcp and local evaluated here with a real
//! loopback WRITE and READ through the engine's core and transports, unless
//! the engine's matrix already evaluates them; the CUDA rows from
//! [`orbitte::cuda::probe()`].

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use orbitte::core::CoreConfig;
use orbitte::transport::{Op, PathKind, RangeId};
use orbitte::{DrainStatus, EngineBuilder, HostMemory, Status};
use serde::Serialize;

use crate::Failure;
use crate::cli::{DoctorArgs, PathName};
use crate::net::{Initiator, RW, Target, request, session_config};

/// One check's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub(crate) enum Check {
    Pass { detail: String },
    Fail { reason: String, fix: String },
    Skipped { why: String },
    NotImplemented { note: String },
}

impl Check {
    fn pass(detail: impl Into<String>) -> Self {
        Self::Pass {
            detail: detail.into(),
        }
    }
    fn fail(reason: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::Fail {
            reason: reason.into(),
            fix: fix.into(),
        }
    }
    fn skipped(why: impl Into<String>) -> Self {
        Self::Skipped { why: why.into() }
    }
    fn is_pass(&self) -> bool {
        matches!(self, Self::Pass { .. })
    }
    fn word(&self) -> &'static str {
        match self {
            Self::Pass { .. } => "pass",
            Self::Fail { .. } => "FAIL",
            Self::Skipped { .. } => "skipped",
            Self::NotImplemented { .. } => "not implemented",
        }
    }
    fn text(&self) -> String {
        match self {
            Self::Pass { detail } if detail.is_empty() => "pass".into(),
            Self::Pass { detail } => format!("pass: {detail}"),
            Self::Fail { reason, fix } => format!("FAIL: {reason}\n      fix: {fix}"),
            Self::Skipped { why } => format!("skipped: {why}"),
            Self::NotImplemented { note } if note.is_empty() => "not implemented".into(),
            Self::NotImplemented { note } => format!("not implemented: {note}"),
        }
    }
}

impl From<orbitte::Check> for Check {
    fn from(c: orbitte::Check) -> Self {
        match c {
            orbitte::Check::Pass => Self::pass(""),
            orbitte::Check::Fail { reason, fix } => Self::Fail { reason, fix },
            orbitte::Check::Skipped { why } => Self::Skipped { why },
            orbitte::Check::NotImplemented => Self::NotImplemented {
                note: "this path does not exist in this build".into(),
            },
        }
    }
}

impl From<orbitte::cuda::probe::Check> for Check {
    fn from(c: orbitte::cuda::probe::Check) -> Self {
        use orbitte::cuda::probe::Check as C;
        match c {
            C::Pass { detail } => Self::Pass { detail },
            C::Fail { reason, fix } => Self::Fail { reason, fix },
            C::Skipped { why } => Self::Skipped { why },
            C::NotImplemented { note } => Self::NotImplemented { note },
        }
    }
}

/// One path's row.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    path: String,
    works: bool,
    build: Check,
    discovery: Check,
    completion: Check,
    drain: Check,
    notes: Vec<String>,
    /// Who evaluated the row.
    source: &'static str,
}

impl Row {
    fn new(path: &str, source: &'static str, checks: [Check; 4], notes: Vec<String>) -> Self {
        let [build, discovery, completion, drain] = checks;
        Self {
            path: path.to_owned(),
            works: build.is_pass()
                && discovery.is_pass()
                && completion.is_pass()
                && drain.is_pass(),
            build,
            discovery,
            completion,
            drain,
            notes,
            source,
        }
    }

    fn checks(&self) -> [(&'static str, &Check); 4] {
        [
            ("build", &self.build),
            ("discovery", &self.discovery),
            ("completion", &self.completion),
            ("drain", &self.drain),
        ]
    }
}

#[derive(Debug, Serialize)]
struct Matrix {
    asked: Option<String>,
    paths: Vec<Row>,
}

fn path_of(p: PathName) -> PathKind {
    match p {
        PathName::Rdma => PathKind::Rdma,
        PathName::Tcp => PathKind::Tcp,
        PathName::Local => PathKind::Local,
        PathName::CudaStaging => PathKind::CudaStaging,
        PathName::GpudirectRdma => PathKind::GpudirectRdma,
        PathName::CudaIpc => PathKind::CudaIpc,
        PathName::Nvlink => PathKind::Nvlink,
    }
}

pub(crate) fn run(args: &DoctorArgs) -> Result<(), Failure> {
    let only = args.path.map(path_of);
    let wanted = |p: PathKind| only.is_none_or(|o| o == p);
    let engine_rows = engine_matrix(only);
    let cuda = if wanted(PathKind::CudaStaging)
        || wanted(PathKind::GpudirectRdma)
        || wanted(PathKind::CudaIpc)
        || wanted(PathKind::Nvlink)
    {
        orbitte::cuda::probe::probe()
    } else {
        Vec::new()
    };
    let mut rows = Vec::new();
    for p in PathKind::ALL {
        if !wanted(p) {
            continue;
        }
        let engine_row = engine_rows.iter().find(|r| r.path == p).cloned();
        let row = match p {
            PathKind::Rdma => match engine_row {
                Some(r) => from_engine(r),
                None => Row::new(
                    "rdma",
                    "orbitte doctor",
                    [
                        Check::pass("compiled in"),
                        Check::fail("the engine could not be built", "see the log above"),
                        Check::skipped("discovery failed"),
                        Check::skipped("discovery failed"),
                    ],
                    Vec::new(),
                ),
            },
            PathKind::Tcp | PathKind::Local => match engine_row {
                Some(r) if evaluated(&r) => from_engine(r),
                _ => evaluate_net(p),
            },
            _ => match cuda.iter().find(|c| c.path == p.name()) {
                Some(c) => Row::new(
                    p.name(),
                    "orbitte-cuda probe",
                    [
                        c.build.clone().into(),
                        c.discovery.clone().into(),
                        c.completion.clone().into(),
                        c.drain.clone().into(),
                    ],
                    c.notes.clone(),
                ),
                None => match engine_row {
                    Some(r) => from_engine(r),
                    None => continue,
                },
            },
        };
        rows.push(row);
    }
    let matrix = Matrix {
        asked: only.map(|p| p.name().to_owned()),
        paths: rows,
    };
    if args.json {
        let text = serde_json::to_string_pretty(&matrix)
            .map_err(|e| Failure::failed(format!("cannot write json: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", human(&matrix));
    }
    match only {
        Some(p) => match matrix.paths.iter().find(|r| r.path == p.name()) {
            Some(r) if r.works => Ok(()),
            Some(r) => {
                let (name, check) = r
                    .checks()
                    .into_iter()
                    .find(|(_, c)| !c.is_pass())
                    .unwrap_or(("build", &r.build));
                let why = match check {
                    Check::Fail { reason, fix } => format!("{reason}; fix: {fix}"),
                    Check::Skipped { why } => format!("skipped: {why}"),
                    Check::NotImplemented { note } => format!("not implemented: {note}"),
                    Check::Pass { .. } => "pass".into(),
                };
                let why = why.lines().next().unwrap_or_default().to_owned();
                Err(Failure::failed(format!(
                    "path {} does not work: {name} check: {why}",
                    r.path
                )))
            }
            None => Err(Failure::failed(format!("path {p} was not evaluated"))),
        },
        None => Ok(()),
    }
}

/// The engine's matrix (it evaluates rdma for real: an RDMA use, so it
/// initializes contexts).
fn engine_matrix(only: Option<PathKind>) -> Vec<orbitte::PathRow> {
    if only.is_some_and(|p| p != PathKind::Rdma && p != PathKind::Tcp && p != PathKind::Local) {
        return orbitte::CapabilityMatrix::baseline().rows;
    }
    let engine = match EngineBuilder::new(format!("orbitte-doctor-{}", std::process::id())).build()
    {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "cannot build an engine for the capability matrix");
            return Vec::new();
        }
    };
    let m = engine.capabilities();
    if let Err(u) = engine.shutdown(Duration::from_secs(5)) {
        tracing::error!(error = %u, "engine shutdown after the capability matrix");
    }
    m.rows
}

/// Whether the engine evaluated a row (rather than leaving it to the path).
fn evaluated(r: &orbitte::PathRow) -> bool {
    !matches!(&r.completion, orbitte::Check::Skipped { why } if why.contains("not evaluated"))
}

fn from_engine(r: orbitte::PathRow) -> Row {
    let name = r.path.name();
    Row::new(
        name,
        "engine",
        [
            r.build.into(),
            r.discovery.into(),
            r.completion.into(),
            r.drain.into(),
        ],
        Vec::new(),
    )
}

const PROBE: usize = 64 << 10;

/// tcp or local: a target and an initiator in this process, a 64 KiB WRITE
/// then READ back, bytes compared, then drain.
fn evaluate_net(path: PathKind) -> Row {
    let name = path.name();
    let build = Check::pass("compiled in (orbitte-engine transport::tcp / transport::local)");
    let mut checks = [
        build,
        Check::skipped("not reached"),
        Check::skipped("discovery did not pass"),
        Check::skipped("completion did not pass"),
    ];
    let notes = match path {
        PathKind::Local => vec![
            "same host, different process: bytes move through shared memory (memfd), never a socket"
                .into(),
        ],
        _ => {
            vec!["evaluated over 127.0.0.1: a pass says nothing about reaching other hosts".into()]
        }
    };
    let row = |checks| Row::new(name, "orbitte doctor (loopback)", checks, notes.clone());
    let cfg = match session_config(
        &format!("orbitte-doctor-target-{}", std::process::id()),
        None,
    ) {
        Ok(c) => c,
        Err(e) => {
            checks[1] = Check::fail(e, "report this: the doctor's source id is invalid");
            return row(checks);
        }
    };
    let addr: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
    let target = match Target::start(cfg, addr) {
        Ok(t) => t,
        Err(e) => {
            checks[1] = Check::fail(e, "allow this process to listen on 127.0.0.1");
            return row(checks);
        }
    };
    let result = (|| -> Result<(), ()> {
        let remote = HostMemory::alloc(PROBE).map_err(|e| {
            checks[1] = Check::fail(
                format!("cannot allocate shared host memory: {e}"),
                "check memfd_create and mmap limits (ulimit -l, vm.max_map_count)",
            );
        })?;
        if path == PathKind::Local && !target.listener.serves_local() {
            checks[1] = Check::fail(
                "the local path's unix socket could not be bound",
                "run where abstract unix sockets are allowed (same network namespace)",
            );
            return Err(());
        }
        let range = target.ranges.publish(remote.clone(), RW).map_err(|e| {
            checks[1] = Check::fail(format!("cannot publish a range: {e}"), "see the log");
        })?;
        checks[1] = Check::pass(match path {
            PathKind::Local => "loopback listener and the local path's unix socket are up",
            _ => "loopback listener is up",
        });
        let icfg = session_config(&format!("orbitte-doctor-{}", std::process::id()), None)
            .map_err(|_| ())?;
        let init = Initiator::new(
            icfg,
            CoreConfig {
                slice_size: 16 << 10,
                request_timeout: Duration::from_secs(5),
                drain_timeout: Duration::from_secs(2),
            },
        );
        let peer = init
            .connect(target.listener.local_addr(), 1, Some(path))
            .map_err(|e| {
                checks[2] = Check::fail(
                    e,
                    format!("run with --log debug; the {name} path's sessions log why"),
                );
            })?;
        let result = probe_transfer(&init, &peer, RangeId(range.0), &remote);
        init.close(&peer);
        match result {
            Ok(ids) => {
                checks[2] = Check::pass(format!(
                    "{PROBE} B WRITE then READ back over {name}, bytes compared"
                ));
                let undrained: Vec<_> = ids
                    .iter()
                    .filter(|id| {
                        init.driver.wait_drain(**id, Duration::from_secs(5)) != DrainStatus::Drained
                    })
                    .collect();
                let outstanding = init.driver.outstanding_slices();
                checks[3] = if undrained.is_empty() && outstanding == 0 {
                    Check::pass("no slice outstanding on the local buffers afterwards")
                } else {
                    Check::fail(
                        format!(
                            "{} request(s) undrained, {outstanding} slice(s) outstanding after 5 s",
                            undrained.len()
                        ),
                        "report this with the log (--log debug): a completed request must drain",
                    )
                };
                Ok(())
            }
            Err((reason, fix)) => {
                checks[2] = Check::fail(reason, fix);
                Err(())
            }
        }
    })();
    let _ = result;
    target.listener.shutdown();
    row(checks)
}

fn probe_transfer(
    init: &Initiator,
    peer: &crate::net::Peer,
    range: RangeId,
    remote: &Arc<HostMemory>,
) -> Result<Vec<orbitte::RequestId>, (String, String)> {
    let io = |e: orbitte::memory::MemoryError| (e.to_string(), "see the log".to_owned());
    let src = HostMemory::alloc(PROBE).map_err(io)?;
    let dst = HostMemory::alloc(PROBE).map_err(io)?;
    let pattern: Vec<u8> = (0..PROBE).map(|i| (i * 7 + 3) as u8).collect();
    src.write_at(0, &pattern).map_err(io)?;
    let (rs, rd) = (init.driver.register(src), init.driver.register(dst.clone()));
    let mut ids = Vec::new();
    for (op, reg) in [(Op::Write, rs), (Op::Read, rd)] {
        let id = init
            .driver
            .submit(vec![request(1, op, reg, 0, peer, range, 0, PROBE as u64)])
            .map_err(|e| (format!("submit refused: {e}"), "report this".to_owned()))?;
        let o = init
            .driver
            .wait(id[0], Duration::from_secs(30))
            .ok_or_else(|| {
                (
                    "no outcome within 30 s".to_owned(),
                    "report this with --log debug".to_owned(),
                )
            })?;
        if o.status != Status::Complete {
            let f = o
                .failure
                .map_or_else(|| format!("{:?}", o.status), |f| f.to_string());
            return Err((
                format!("{op} of {PROBE} B did not complete: {f}"),
                "run with --log debug to see why the session failed".into(),
            ));
        }
        ids.push(id[0]);
    }
    if remote.to_vec(0, PROBE).map_err(io)? != pattern
        || dst.to_vec(0, PROBE).map_err(io)? != pattern
    {
        return Err((
            "bytes read back differ from the bytes written".into(),
            "report this: a completed request moved wrong bytes".into(),
        ));
    }
    Ok(ids)
}

fn human(m: &Matrix) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<15} {:<16} {:<16} {:<16} {:<16}",
        "path", "build", "discovery", "completion", "drain"
    );
    for r in &m.paths {
        let _ = writeln!(
            out,
            "{:<15} {:<16} {:<16} {:<16} {:<16}",
            r.path,
            r.build.word(),
            r.discovery.word(),
            r.completion.word(),
            r.drain.word()
        );
    }
    for r in &m.paths {
        let _ = writeln!(
            out,
            "\n{} ({}; {}):",
            r.path,
            if r.works { "works" } else { "does not work" },
            r.source
        );
        for (name, c) in r.checks() {
            let _ = writeln!(out, "  {name}: {}", c.text());
        }
        for n in &r.notes {
            let _ = writeln!(out, "  note: {n}");
        }
    }
    let _ = writeln!(
        out,
        "\nEach check is separate: a listed device is not a working route, and a completed request is not a drained buffer."
    );
    out
}
