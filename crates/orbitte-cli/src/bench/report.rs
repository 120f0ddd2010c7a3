//! What `orbitte bench` prints (text or `--json`) and the `--sweep` chart.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::backend::Backend;
use crate::Failure;
use crate::chart::{self, Series, human_bytes};
use crate::cli::{BenchArgs, Op, PathName, Role};
use crate::stats::LatencySummary;

/// A baseline figure measured in the same run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Baseline {
    pub(crate) name: String,
    pub(crate) gbps: f64,
    pub(crate) seconds: f64,
}

/// One block size's result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Point {
    pub(crate) block_size: u64,
    pub(crate) seconds: f64,
    pub(crate) bytes: u64,
    pub(crate) requests: u64,
    pub(crate) gbps: f64,
    pub(crate) ops_per_s: f64,
    /// From the batch's submission to the request's outcome.
    pub(crate) latency: Option<LatencySummary>,
    /// Bytes verified with `--check` (absent without it).
    pub(crate) checked_bytes: Option<u64>,
    /// Nothing outstanding on the local buffers after the last outcome.
    pub(crate) drained: bool,
    pub(crate) baseline: Option<Baseline>,
}

/// The bench's `--json` document (docs/json.md).
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    schema_version: u32,
    command: &'static str,
    /// `loopback`, `initiator`.
    role: &'static str,
    /// The role in words, and where the peer was found.
    role_note: String,
    op: Op,
    path: String,
    path_note: String,
    /// `source-id (epoch N)`, for people.
    peer: String,
    peer_source_id: String,
    /// Decimal, as a string: epochs exceed what JSON numbers hold exactly
    /// in many readers.
    peer_epoch: String,
    batch_size: u32,
    threads: u32,
    duration_s: f64,
    check: bool,
    points: Vec<Point>,
    chart: Option<String>,
}

pub(crate) fn path_name(p: PathName) -> &'static str {
    match p {
        PathName::Rdma => "rdma",
        PathName::Tcp => "tcp",
        PathName::Local => "local",
        PathName::CudaStaging => "cuda-staging",
        PathName::GpudirectRdma => "gpudirect-rdma",
        PathName::CudaIpc => "cuda-ipc",
        PathName::Nvlink => "nvlink",
    }
}

impl Report {
    pub(crate) fn new(
        args: &BenchArgs,
        backend: &Backend,
        role: &str,
        points: Vec<Point>,
        chart: Option<&PathBuf>,
    ) -> Self {
        Self {
            schema_version: crate::SCHEMA_VERSION,
            command: "bench",
            role: match args.role {
                Role::Loopback => "loopback",
                Role::Target => "target",
                Role::Initiator => "initiator",
            },
            role_note: role.to_owned(),
            op: args.op,
            path: backend.path().name().to_owned(),
            path_note: backend.path_note().to_owned(),
            peer: backend.peer().to_owned(),
            peer_source_id: backend.peer_identity().0.to_owned(),
            peer_epoch: backend.peer_identity().1.to_string(),
            batch_size: args.batch_size,
            threads: args.threads,
            duration_s: args.duration,
            check: args.check,
            points,
            chart: chart.map(|c| c.display().to_string()),
        }
    }

    /// Writes the chart through `handle`, opened on `file` before the
    /// sweep (so an unwritable path was refused before measuring).
    pub(crate) fn write_chart(
        &self,
        file: &Path,
        mut handle: std::fs::File,
    ) -> Result<(), Failure> {
        let op = match self.op {
            Op::Read => "READ",
            Op::Write => "WRITE",
        };
        let mut series = vec![Series {
            name: format!("orbitte {}", self.path),
            points: self.points.iter().map(|p| (p.block_size, p.gbps)).collect(),
        }];
        let base: Vec<(u64, f64)> = self
            .points
            .iter()
            .filter_map(|p| p.baseline.as_ref().map(|b| (p.block_size, b.gbps)))
            .collect();
        if !base.is_empty() {
            let name = if self.path == "local" {
                "memcpy"
            } else {
                "raw tcp socket"
            };
            series.push(Series {
                name: name.into(),
                points: base,
            });
        }
        let title = format!(
            "orbitte bench: {op} over {}, batch {}, {} thread(s)",
            self.path, self.batch_size, self.threads
        );
        std::io::Write::write_all(&mut handle, chart::svg(&title, &series).as_bytes()).map_err(
            |e| {
                Failure::failed(format!(
                    "cannot write the chart to {}: {e}; pick another file with --chart",
                    file.display()
                ))
            },
        )
    }

    pub(crate) fn print(&self, json: bool) -> Result<(), Failure> {
        if json {
            let text = serde_json::to_string_pretty(self)
                .map_err(|e| Failure::failed(format!("cannot write json: {e}")))?;
            println!("{text}");
            return Ok(());
        }
        let op = match self.op {
            Op::Read => "read",
            Op::Write => "write",
        };
        println!(
            "orbitte bench: {}, {op}, path {} ({}), peer {}, batch {}, {} thread(s), {} s per block size",
            self.role_note,
            self.path,
            self.path_note,
            self.peer,
            self.batch_size,
            self.threads,
            self.duration_s
        );
        for p in &self.points {
            let lat = p.latency.map_or_else(
                || "no latency samples".to_owned(),
                |l| {
                    format!(
                        "latency p50 {:.1} us, p99 {:.1} us, p999 {:.1} us",
                        l.p50_us, l.p99_us, l.p999_us
                    )
                },
            );
            println!(
                "  block {:>5}: {:8.3} GB/s {:>12.0} ops/s  {lat}  ({} requests, {}{})",
                human_bytes(p.block_size),
                p.gbps,
                p.ops_per_s,
                p.requests,
                if p.drained {
                    "all drained"
                } else {
                    "NOT drained"
                },
                match p.checked_bytes {
                    Some(b) => format!(", check passed on {b} bytes"),
                    None => String::new(),
                }
            );
            if let Some(b) = &p.baseline {
                println!(
                    "  {:>11}  {:8.3} GB/s baseline: {} ({:.0} % of it)",
                    "",
                    b.gbps,
                    b.name,
                    if b.gbps > 0.0 {
                        p.gbps / b.gbps * 100.0
                    } else {
                        0.0
                    }
                );
            }
        }
        if self.check {
            println!(
                "  (--check verifies every byte; verification time is included, so figures are lower than without it)"
            );
        }
        if let Some(c) = &self.chart {
            println!("  chart written to {c}");
        }
        Ok(())
    }
}
