//! `orbitte doctor`: the capability matrix. For every path four separate
//! checks (build, discovery, completion, drain), each with its reason and
//! fix.
//!
//! Source: the engine's own matrix ([`orbitte::TransferEngine::capabilities`]):
//! rdma evaluated for real (a loopback WRITE and READ on the selected NIC),
//! tcp and local with a loopback request through each transport, the CUDA
//! rows from the engine's staging module. When rdma works, the doctor opens
//! a second engine as a loopback peer so that cuda-staging's completion
//! check (GPU -> peer -> GPU through the engine) runs for real. Rows the
//! engine leaves unevaluated fall back to [`orbitte_cuda::probe()`] (CUDA)
//! or are shown as the engine gives them.

use std::fmt::Write as _;
use std::time::Duration;

use orbitte::{EngineBuilder, HostMemory, PathKind, RangeId, RdmaConfig};
use serde::Serialize;

use crate::cli::{DoctorArgs, PathName};
use crate::failure::Failure;

/// One check's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
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

impl From<orbitte_cuda::probe::Check> for Check {
    fn from(c: orbitte_cuda::probe::Check) -> Self {
        use orbitte_cuda::probe::Check as C;
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

/// The `--json` document (docs/json.md).
#[derive(Debug, Serialize)]
struct Matrix {
    schema_version: u32,
    command: &'static str,
    asked: Option<String>,
    /// The RDMA selection the engine ran with (defaults, then the
    /// `ORBITTE_RDMA_*` variables).
    rdma_config: String,
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
    // The CLI, not the library, reads the environment: code defaults, then
    // the ORBITTE_RDMA_* variables (doctor has no config file).
    let rdma = RdmaConfig::resolve(RdmaConfig::default(), None)
        .map_err(|e| Failure::usage(e.to_string()))?;
    let engine_rows = engine_matrix(only, &rdma);
    let cuda_wanted = [
        PathKind::CudaStaging,
        PathKind::GpudirectRdma,
        PathKind::CudaIpc,
        PathKind::Nvlink,
    ]
    .into_iter()
    .any(wanted);
    // The probe only where the engine's matrix has no CUDA rows of its own.
    let engine_has_cuda = engine_rows
        .iter()
        .any(|r| r.path == PathKind::CudaStaging && evaluated(r));
    let cuda = if cuda_wanted && !engine_has_cuda {
        orbitte_cuda::probe::probe()
    } else {
        Vec::new()
    };
    let mut rows = Vec::new();
    for p in PathKind::ALL {
        if !wanted(p) {
            continue;
        }
        let engine_row = engine_rows.iter().find(|r| r.path == p).cloned();
        let row = match (p, engine_row) {
            // The engine's own evaluation comes first.
            (_, Some(r)) if evaluated(&r) => from_engine(r),
            (PathKind::Rdma, _) => Row::new(
                "rdma",
                "orbitte doctor",
                [
                    Check::pass("compiled in"),
                    Check::fail(
                        "the engine could not be built",
                        "run with --log debug to see why",
                    ),
                    Check::skipped("discovery failed"),
                    Check::skipped("discovery failed"),
                ],
                Vec::new(),
            ),
            (_, engine_row) => match cuda.iter().find(|c| c.path == p.name()) {
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
        schema_version: crate::schema::SCHEMA_VERSION,
        command: "doctor",
        asked: only.map(|p| p.name().to_owned()),
        rdma_config: rdma.to_string(),
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
fn engine_matrix(only: Option<PathKind>, rdma: &RdmaConfig) -> Vec<orbitte::PathRow> {
    let engine = match EngineBuilder::new(format!("orbitte-doctor-{}", std::process::id()))
        .rdma(rdma.clone())
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "cannot build an engine for the capability matrix");
            return Vec::new();
        }
    };
    let mut m = engine.capabilities();
    let rdma_works = m.row(PathKind::Rdma).is_some_and(|r| {
        r.build.is_pass() && r.discovery.is_pass() && r.completion.is_pass() && r.drain.is_pass()
    });
    if rdma_works && only.is_none_or(|p| p == PathKind::CudaStaging) {
        // cuda-staging's completion is a GPU -> remote -> GPU round trip
        // through the engine: it needs a loopback peer, which rdma gives.
        if let Some(cap) = cuda_through_loopback(&engine, rdma) {
            cap.contribute_to(&mut m);
        }
    }
    if let Err(u) = engine.shutdown(Duration::from_secs(5)) {
        tracing::error!(error = %u, "engine shutdown after the capability matrix");
    }
    m.rows
}

/// A second engine with a scratch range, listening on loopback and opened
/// as an rdma peer of `engine`, for the staged round trip.
fn cuda_through_loopback(
    engine: &orbitte::TransferEngine,
    rdma: &RdmaConfig,
) -> Option<orbitte_engine::staging::CudaCapability> {
    use orbitte_engine::staging::{LOOPBACK_BYTES, LoopbackTarget, evaluate_cuda_staging};
    let peer_engine = EngineBuilder::new(format!("orbitte-doctor-peer-{}", std::process::id()))
        .rdma(rdma.clone())
        .listen(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .build()
        .ok()?;
    let result = (|| {
        let scratch = HostMemory::alloc(usize::try_from(LOOPBACK_BYTES).ok()?).ok()?;
        let reg = peer_engine
            .register_host(scratch, orbitte::Access::REMOTE_READ_WRITE)
            .ok()?;
        let peer = engine
            .connect_with(
                peer_engine.listen_addr()?,
                orbitte::ConnectOptions::new().path(PathKind::Rdma),
            )
            .ok()?;
        Some(evaluate_cuda_staging(
            engine,
            0,
            Some(LoopbackTarget {
                peer: peer.id(),
                range: RangeId(reg.id.0),
                offset: 0,
            }),
        ))
    })();
    if let Err(u) = peer_engine.shutdown(Duration::from_secs(5)) {
        tracing::error!(error = %u, "loopback peer shutdown");
    }
    result
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
        r.notes,
    )
}

fn human(m: &Matrix) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "rdma selection: {}", m.rdma_config);
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
