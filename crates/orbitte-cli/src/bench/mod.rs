//! `orbitte bench`: loopback (target and initiator in this process),
//! target, or initiator; one block size or a sweep with a chart; a
//! baseline measured in the same run.

mod backend;
mod baseline;
mod measure;
mod peers;
mod progress;
mod report;
mod rounds;
mod settings;
mod sim_verbs;
mod timed;

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::Duration;

use orbitte::PathKind;

use crate::cli::{BenchArgs, Role};
use crate::failure::Failure;
use backend::Backend;
use progress::shows_progress;
use report::{Point, Report};
use settings::{
    LOOPBACK_TARGET_SUFFIX, MAX_LOOPBACK_SOURCE_ID_LEN, SWEEP, engine_op, parse_addr, path_kind,
    range_len,
};

pub(crate) fn run(args: &BenchArgs) -> Result<(), Failure> {
    if args.role == Role::PeersWorker {
        return peers::worker(args);
    }
    if !args.peers.is_empty() {
        let show = shows_progress(args.quiet, args.json, std::io::stderr().is_terminal());
        return peers::run(args, show);
    }
    let want = args.path.map(path_kind).transpose()?;
    if args.sim && want != Some(PathKind::Rdma) {
        return Err(Failure::usage(
            "--sim runs the rdma path on the simulated fabric: add --path rdma",
        ));
    }
    if args.sim && args.role != Role::Loopback {
        return Err(Failure::usage(
            "--sim runs in one process: use it with --role loopback",
        ));
    }
    if let (Some(id), Role::Loopback) = (&args.source_id, args.role)
        && id.len() > MAX_LOOPBACK_SOURCE_ID_LEN
    {
        return Err(Failure::usage(format!(
            "--source-id: in loopback the target's id is ID{LOOPBACK_TARGET_SUFFIX}, so ID has at most {MAX_LOOPBACK_SOURCE_ID_LEN} bytes; this one has {}: pick a shorter one",
            id.len()
        )));
    }
    let len = range_len(args);
    if len > 64 << 30 {
        return Err(Failure::usage(format!(
            "block size x batch size x threads is {len} bytes, more than 64 GiB: lower one of them"
        )));
    }
    check_memory(args, len)?;
    // A chart that cannot be written is refused before the sweep runs. A
    // target measures nothing (its --sweep only sizes the range).
    if args.role == Role::Target && args.chart.is_some() {
        return Err(Failure::usage(
            "--chart: a target measures nothing and draws no chart; give --chart to the initiator",
        ));
    }
    let chart = if args.sweep && args.role != Role::Target {
        let file = args
            .chart
            .clone()
            .unwrap_or_else(|| PathBuf::from("orbitte-bench.svg"));
        let handle = std::fs::File::create(&file).map_err(|e| {
            Failure::usage(format!(
                "--chart {}: cannot write it: {e}; pick a writable file",
                file.display()
            ))
        })?;
        Some((file, handle))
    } else {
        None
    };
    match args.role {
        Role::Target => run_target(args, want == Some(PathKind::Rdma), len),
        Role::Initiator => {
            let peer = args.peer.as_deref().unwrap_or_default();
            let store = args.metadata.connect("--metadata")?;
            let (addr, epoch) = match &store {
                None => (parse_addr(peer, "--peer")?, None),
                Some(store) => {
                    crate::cli::parse_source_id(peer)
                        .map_err(|e| Failure::usage(format!("--peer: {e}")))?;
                    let (addr, epoch) = crate::metadata::resolve(store, peer)?;
                    (addr, Some(epoch))
                }
            };
            let backend = Backend::initiator(args, addr, want, epoch)?;
            let role = match &store {
                None => format!("initiator to {addr}"),
                Some(_) => format!("initiator to {peer} at {addr} (found in etcd)"),
            };
            // Baselines measure this host: they apply when the target is
            // on it too.
            let same_host = addr.ip().is_loopback() || backend.path() == PathKind::Local;
            bench_with(args, &backend, &role, same_host, chart)
        }
        Role::PeersWorker => peers::worker(args),
        Role::Loopback => {
            let backend = Backend::loopback(args, want, len)?;
            let role = if want == Some(PathKind::Rdma) {
                "loopback (target and initiator engines in this process, tcp control link)"
            } else {
                "loopback (target and initiator engines in this process)"
            };
            bench_with(args, &backend, role, true, chart)
        }
    }
}

/// The host memory this run allocates, against what the machine has.
fn check_memory(args: &BenchArgs, len: u64) -> Result<(), Failure> {
    // The target's range, and per initiator thread a local and a scratch
    // window (together twice the range).
    let (total, what) = match args.role {
        Role::Target => (
            len,
            format!("the target's range of {}", crate::memory::gib(len)),
        ),
        Role::Initiator | Role::PeersWorker => (
            len.saturating_mul(2),
            format!(
                "the initiator's buffers of {}",
                crate::memory::gib(len.saturating_mul(2))
            ),
        ),
        Role::Loopback => (
            len.saturating_mul(3),
            format!(
                "the target's range of {} and the initiator's buffers of {}",
                crate::memory::gib(len),
                crate::memory::gib(len.saturating_mul(2))
            ),
        ),
    };
    crate::memory::check(
        total,
        &format!(
            "block size {} x batch size {} x threads {}{}: {what}",
            crate::chart::human_bytes(if args.sweep {
                SWEEP[SWEEP.len() - 1].max(args.block_size)
            } else {
                args.block_size
            }),
            args.batch_size,
            args.threads,
            if args.sweep {
                " (4M blocks for --sweep)"
            } else {
                ""
            }
        ),
        "lower --block-size, --batch-size or --threads",
    )
}

/// `--role target`: publishes one range and serves initiators until it is
/// stopped (tcp and local; with `--path rdma`, rdma peers over control
/// links).
fn run_target(args: &BenchArgs, rdma: bool, len: u64) -> Result<(), Failure> {
    let target = backend::target(args, rdma, len)?;
    // The first line is for scripts and tests: the address initiators use.
    if rdma {
        println!(
            "listening on {} (rdma control link; range {} of {len} bytes, read-write, registered on {} NIC context(s))",
            target.addr,
            target.range.0,
            target.engine.topology().contexts.len()
        );
    } else {
        println!(
            "listening on {} (range {} of {len} bytes, read-write; tcp, local path {})",
            target.addr,
            target.range.0,
            if target.serves_local {
                "served"
            } else {
                "not served"
            }
        );
    }
    eprintln!("orbitte: target ready; stop it with Ctrl-C");
    let _target = target;
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Runs one point or the sweep on `backend` and prints the report.
/// `same_host`: the target runs on this host, so this host's baselines
/// apply.
fn bench_with(
    args: &BenchArgs,
    backend: &Backend,
    role: &str,
    same_host: bool,
    chart: Option<(PathBuf, std::fs::File)>,
) -> Result<(), Failure> {
    let sizes: Vec<u64> = if args.sweep {
        SWEEP.to_vec()
    } else {
        vec![args.block_size]
    };
    let show = shows_progress(args.quiet, args.json, std::io::stderr().is_terminal());
    let mut points = Vec::new();
    let kinds = if args.no_baseline || !same_host {
        Vec::new()
    } else {
        baseline::kinds(backend.path(), engine_op(args.op), args.sim)
    };
    // memcpy copies between the path's own pages where the bench holds
    // them (loopback).
    let own = backend.path_windows(args);
    for (k, &block) in sizes.iter().enumerate() {
        let shape = timed::Shape {
            block: usize::try_from(block).map_err(|_| Failure::usage("block size too large"))?,
            batch: args.batch_size as usize,
            threads: args.threads as usize,
            connections: backend.rails(),
            duration: baseline::duration(args.duration),
        };
        // The baselines' own windows come on top of the path's, which stay
        // allocated: skipped when they would not fit.
        let kinds = match crate::memory::check(
            baseline::bytes_needed(&kinds, shape, &own),
            "the baselines' buffers",
            "lower --block-size, --batch-size or --threads, or pass --no-baseline",
        ) {
            Ok(()) => kinds.clone(),
            Err(f) => {
                tracing::warn!(reason = %f.message, "baselines not measured");
                Vec::new()
            }
        };
        // Path and baselines alternate, round by round.
        let mut path_rounds = Vec::new();
        let mut samples = vec![Vec::new(); kinds.len()];
        for r in 0..args.rounds {
            let bar = progress::timed(show, args.duration, block);
            if sizes.len() > 1 || args.rounds > 1 {
                bar.set_prefix(format!(
                    "block {} (point {} of {}, round {} of {})",
                    crate::chart::human_bytes(block),
                    k + 1,
                    sizes.len(),
                    r + 1,
                    args.rounds
                ));
            }
            let point: Point = measure::run(backend, args, block, &bar)?;
            bar.finish_and_clear();
            path_rounds.push(point);
            for (kind, samples) in kinds.iter().zip(&mut samples) {
                match baseline::measure(*kind, shape, &own) {
                    Ok(s) => samples.push(s),
                    Err(e) => tracing::warn!(error = %e, ?kind, "baseline not measured"),
                }
            }
        }
        let mut point =
            rounds::point(path_rounds).ok_or_else(|| Failure::failed("no round measured"))?;
        let mut judged = samples.iter().map(|s| rounds::baseline(point.gbps, s));
        point.baseline = judged.next().flatten();
        point.limit = judged.next().flatten();
        points.push(point);
    }
    let report = Report::new(args, backend, role, points, chart.as_ref().map(|c| &c.0));
    if let Some((file, handle)) = chart {
        report.write_chart(&file, handle)?;
    }
    report.print(args.json)
}
