//! What `orbitte bench` prints (text or `--json`) and the `--sweep` chart.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::backend::Backend;
use crate::chart::{self, Series, human_bytes};
use crate::cli::{BenchArgs, Op, Role};
use crate::failure::Failure;
use crate::stats::{CpuUse, LatencySummary, ThreadCpu};

/// A baseline figure measured in the same run, alternating with the path
/// (`--rounds`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Baseline {
    pub(crate) name: String,
    /// The median round.
    pub(crate) gbps: f64,
    /// Over all rounds.
    pub(crate) seconds: f64,
    /// Each round's figure, in order.
    pub(crate) rounds_gbps: Vec<f64>,
    /// The path's median over this baseline's median.
    pub(crate) ratio: f64,
    /// Why `ratio` is not a result (the path beat the baseline by more
    /// than 10 %, or the baseline varied more than 2x between rounds);
    /// `None` when it is one.
    pub(crate) suspect: Option<String>,
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
    /// Each round's GB/s, in order; the other figures are the median
    /// round's.
    pub(crate) rounds_gbps: Vec<f64>,
    /// How busy the machine's CPUs were while the path was measured
    /// (every process's work: on one host, the target's too); `None`
    /// where the counters cannot be read.
    pub(crate) cpu: Option<CpuUse>,
    /// What the initiator threads themselves spent (`None` when no
    /// request completed).
    pub(crate) initiator_cpu: Option<ThreadCpu>,
    /// What the path is judged against: memcpy (local), the same exchange
    /// on raw sockets (tcp).
    pub(crate) baseline: Option<Baseline>,
    /// The loopback limit (tcp): the best raw-socket setting.
    pub(crate) limit: Option<Baseline>,
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
    /// Path and baselines measured alternately this many times.
    rounds: u32,
    check: bool,
    points: Vec<Point>,
    chart: Option<String>,
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
            schema_version: crate::schema::SCHEMA_VERSION,
            command: "bench",
            role: match args.role {
                Role::Loopback => "loopback",
                Role::Target => "target",
                Role::Initiator => "initiator",
                Role::PeersWorker => "peers-worker",
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
            rounds: args.rounds,
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
            if p.rounds_gbps.len() > 1 {
                println!(
                    "  {:>11}  rounds: {} GB/s (the median round is shown)",
                    "",
                    gbps_list(&p.rounds_gbps)
                );
            }
            if let Some(c) = p.cpu {
                println!(
                    "  {:>11}  CPUs busy {:.0} % of {} while measured{}",
                    "",
                    c.busy * 100.0,
                    c.cpus,
                    if c.steal >= 0.005 {
                        format!(" ({:.0} % taken by the hypervisor)", c.steal * 100.0)
                    } else {
                        String::new()
                    }
                );
            }
            if let Some(c) = p.initiator_cpu {
                println!(
                    "  {:>11}  initiator thread(s) busy {:.0} %, {:.2} µs of their CPU per request",
                    "",
                    c.busy * 100.0,
                    c.us_per_request
                );
            }
            for (what, b) in [("baseline", &p.baseline), ("limit", &p.limit)] {
                let Some(b) = b else { continue };
                match &b.suspect {
                    None => println!(
                        "  {:>11}  {:8.3} GB/s {what}: {} (ratio {:.2})",
                        "", b.gbps, b.name, b.ratio
                    ),
                    Some(why) => println!(
                        "  {:>11}  {:8.3} GB/s {what}: {}: SUSPECT, no ratio: {why} (rounds {} GB/s)",
                        "",
                        b.gbps,
                        b.name,
                        gbps_list(&b.rounds_gbps)
                    ),
                }
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

/// `1.234 1.300 1.198`.
fn gbps_list(v: &[f64]) -> String {
    v.iter()
        .map(|g| format!("{g:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}
