//! The capability matrix as data: for each path, four separate checks.
//!
//! - **build**: the path is compiled in;
//! - **discovery**: runtime library, devices, ports and GIDs are usable;
//! - **completion**: a real request completed (for rdma: a loopback WRITE
//!   then READ on the selected NIC, bytes compared);
//! - **drain**: afterwards nothing is outstanding on the local buffers.
//!
//! Each answers [`Check::Pass`], [`Check::Fail`] with the reason and the
//! fix, [`Check::Skipped`] with why, or [`Check::NotImplemented`]. A pass
//! of one check says nothing about the next: a listed device is not a
//! working route, and a completed request is not a drained buffer.
//!
//! [`TransferEngine::capabilities`](crate::TransferEngine::capabilities)
//! evaluates rdma for real; other paths
//! contribute their rows with [`CapabilityMatrix::contribute`].

use std::fmt;

use crate::transport::PathKind;

/// One check's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// It works.
    Pass,
    /// It does not.
    Fail {
        /// What went wrong.
        reason: String,
        /// What to do about it.
        fix: String,
    },
    /// Not evaluated.
    Skipped {
        /// Why.
        why: String,
    },
    /// The path does not exist in this build.
    NotImplemented,
}

impl Check {
    /// A failed check: what went wrong and how to fix it.
    pub(crate) fn fail(reason: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::Fail {
            reason: reason.into(),
            fix: fix.into(),
        }
    }

    /// A check not run, and why.
    pub(crate) fn skipped(why: impl Into<String>) -> Self {
        Self::Skipped { why: why.into() }
    }

    /// Whether the check passed.
    pub fn is_pass(&self) -> bool {
        matches!(self, Self::Pass)
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pass => f.write_str("pass"),
            Self::Fail { reason, fix } => write!(f, "fail: {reason} (fix: {fix})"),
            Self::Skipped { why } => write!(f, "skipped: {why}"),
            Self::NotImplemented => f.write_str("not implemented"),
        }
    }
}

/// The four checks of one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRow {
    /// The path.
    pub path: PathKind,
    /// Compiled in.
    pub build: Check,
    /// Library, devices, ports, GIDs usable.
    pub discovery: Check,
    /// A real request completed.
    pub completion: Check,
    /// Nothing outstanding afterwards.
    pub drain: Check,
    /// What a reader must not conclude from the row (e.g. "a CUDA compute
    /// probe proves nothing about transport").
    pub notes: Vec<String>,
}

impl PathRow {
    /// A row whose four checks are `NotImplemented`.
    pub fn not_implemented(path: PathKind) -> Self {
        Self {
            path,
            build: Check::NotImplemented,
            discovery: Check::NotImplemented,
            completion: Check::NotImplemented,
            drain: Check::NotImplemented,
            notes: Vec::new(),
        }
    }

    /// A row whose four checks are skipped for `why`.
    pub fn skipped(path: PathKind, why: &str) -> Self {
        Self {
            path,
            build: Check::skipped(why),
            discovery: Check::skipped(why),
            completion: Check::skipped(why),
            drain: Check::skipped(why),
            notes: Vec::new(),
        }
    }
}

/// Every path with its checks, in [`PathKind::ALL`] order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityMatrix {
    /// One row per path.
    pub rows: Vec<PathRow>,
}

impl CapabilityMatrix {
    /// Rows before evaluation: rdma/tcp/local/cuda-staging skipped (not
    /// evaluated yet), gpudirect-rdma, cuda-ipc and nvlink not implemented.
    pub fn baseline() -> Self {
        let rows = PathKind::ALL
            .iter()
            .map(|&p| match p {
                PathKind::GpudirectRdma | PathKind::CudaIpc | PathKind::Nvlink => {
                    PathRow::not_implemented(p)
                }
                PathKind::Rdma => PathRow::skipped(p, "not evaluated"),
                _ => PathRow::skipped(
                    p,
                    "not evaluated by the engine; the path contributes its own row",
                ),
            })
            .collect();
        Self { rows }
    }

    /// The row of a path.
    pub fn row(&self, path: PathKind) -> Option<&PathRow> {
        self.rows.iter().find(|r| r.path == path)
    }

    /// Replaces the row of `row.path` (a path contributing its evaluation).
    pub fn contribute(&mut self, row: PathRow) {
        match self.rows.iter_mut().find(|r| r.path == row.path) {
            Some(r) => *r = row,
            None => self.rows.push(row),
        }
    }
}

impl fmt::Display for CapabilityMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.rows {
            writeln!(f, "{:<15} build: {}", r.path.name(), r.build)?;
            writeln!(f, "{:<15} discovery: {}", "", r.discovery)?;
            writeln!(f, "{:<15} completion: {}", "", r.completion)?;
            writeln!(f, "{:<15} drain: {}", "", r.drain)?;
            for n in &r.notes {
                writeln!(f, "{:<15} note: {n}", "")?;
            }
        }
        Ok(())
    }
}
