//! `cargo xtask perf [--seconds S] [--rounds N] [--docs] [--no-build]
//! [--from FILE]`: the
//! throughput matrix of the release `orbitte`, each figure next to the
//! baselines `orbitte bench` measures in the same run.
//!
//! tcp and local run as users run them: one `orbitte bench --role target`
//! process, and one `--role initiator` process per cell over 127.0.0.1.
//! rdma runs on the zero-latency simulated fabric, which `--sim` keeps in
//! one process. Every cell runs `--rounds N` (path and baselines
//! alternating) for S seconds a round. The table goes to target/perf/
//! (perf.json with every cell's bench report, the machine and the load;
//! perf.md) and, with `--docs`, into docs/performance.md between its
//! `perf:begin` and `perf:end` marks. `--from FILE` measures nothing: it
//! writes the table of a perf.json kept from an earlier run.

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BEGIN: &str = "<!-- perf:begin -->";
const END: &str = "<!-- perf:end -->";
const BATCH: u32 = 16;

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Cell {
    path: &'static str,
    op: &'static str,
    block: &'static str,
    threads: u32,
    batch: u32,
}

impl Cell {
    fn sim(&self) -> bool {
        self.path == "rdma"
    }
}

/// The matrix: {tcp, local} x {read, write} x {64K, 1M}, tcp 64K with two
/// threads, rdma-sim 4K with batch 256.
fn cells() -> Vec<Cell> {
    let mut v = Vec::new();
    for path in ["tcp", "local"] {
        for op in ["read", "write"] {
            for block in ["64K", "1M"] {
                v.push(Cell {
                    path,
                    op,
                    block,
                    threads: 1,
                    batch: BATCH,
                });
            }
        }
    }
    for op in ["read", "write"] {
        v.push(Cell {
            path: "tcp",
            op,
            block: "64K",
            threads: 2,
            batch: BATCH,
        });
    }
    for op in ["read", "write"] {
        v.push(Cell {
            path: "rdma",
            op,
            block: "4K",
            threads: 1,
            batch: 256,
        });
    }
    v
}

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let mut seconds = 1.0f64;
    let mut rounds = 3u32;
    let mut docs = false;
    let mut build = true;
    let mut from = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|s: &f64| *s > 0.0 && *s <= 600.0)
                    .ok_or("--seconds takes seconds per round, above 0 and at most 600")?;
            }
            "--rounds" => {
                rounds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|r| (1..=100).contains(r))
                    .ok_or("--rounds takes 1 to 100")?;
            }
            "--docs" => docs = true,
            "--no-build" => build = false,
            "--from" => from = Some(PathBuf::from(it.next().ok_or("--from takes a perf.json")?)),
            other => {
                return Err(format!(
                    "unknown argument `{other}` (--seconds S, --rounds N, --docs, --no-build, --from FILE)"
                ));
            }
        }
    }
    let root = crate::workspace::root();
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let out = target_dir.join("perf");
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let (doc, failed) = match from {
        Some(file) => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            let doc: Value = serde_json::from_str(&text)
                .map_err(|e| format!("{} is not a perf.json: {e}", file.display()))?;
            (doc, 0)
        }
        None => {
            let (doc, failed) = measure(&root, &target_dir, build, seconds, rounds)?;
            let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
            write(&out.join("perf.json"), &text)?;
            (doc, failed)
        }
    };
    let table = markdown(&doc);
    write(&out.join("perf.md"), &table)?;
    print!("{table}");
    if docs {
        let page = root.join("docs/performance.md");
        let old = std::fs::read_to_string(&page)
            .map_err(|e| format!("cannot read {}: {e}", page.display()))?;
        write(&page, &replace_section(&old, &table)?)?;
        eprintln!("xtask perf: table written to {}", page.display());
    }
    eprintln!("xtask perf: written to {}", out.display());
    if failed > 0 {
        return Err(format!(
            "{failed} cell(s) failed; their error is in the table"
        ));
    }
    Ok(())
}

/// Runs the matrix; returns the perf document and how many cells failed.
fn measure(
    root: &Path,
    target_dir: &Path,
    build: bool,
    seconds: f64,
    rounds: u32,
) -> Result<(Value, usize), String> {
    if build {
        build_release(root)?;
    }
    let bin = target_dir.join("release").join("orbitte");
    if !bin.exists() {
        return Err(format!(
            "no release binary at {}: run without --no-build",
            bin.display()
        ));
    }
    let load_before = load_average();
    let start = Instant::now();
    let target = Target::start(&bin)?;
    let mut results = Vec::new();
    let mut failed = 0;
    for cell in cells() {
        eprintln!(
            "xtask perf: {} {} {} x{} threads {} ...",
            cell.path, cell.op, cell.block, cell.batch, cell.threads
        );
        let r = run_cell(&bin, &cell, &target.addr, seconds, rounds);
        if r.is_err() {
            failed += 1;
        }
        results.push(cell_json(&cell, r));
    }
    drop(target);
    let doc = json!({
        "date": command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        "commit": commit(root),
        "machine": machine(),
        "load_before": load_before,
        "load_after": load_average(),
        "seconds_per_round": seconds,
        "rounds": rounds,
        "wall_s": start.elapsed().as_secs_f64(),
        "cells": results,
    });
    Ok((doc, failed))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn build_release(root: &Path) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .current_dir(root)
        .args(["build", "--release", "--quiet", "-p", "orbitte-cli"])
        .status()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err("building the release orbitte failed".into())
    }
}

/// A `orbitte bench --role target` process, killed when dropped.
struct Target {
    child: Child,
    addr: String,
}

impl Target {
    /// A target whose range serves every cell: 1 MiB x 16 x 2 threads.
    fn start(bin: &Path) -> Result<Self, String> {
        let mut child = Command::new(bin)
            .args([
                "bench",
                "--role",
                "target",
                "--listen",
                "127.0.0.1:0",
                "--block-size",
                "1M",
                "--batch-size",
                &BATCH.to_string(),
                "--threads",
                "2",
            ])
            .env("ORBITTE_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(out).lines();
        let line = lines
            .find_map(|l| l.ok().filter(|l| l.starts_with("listening on ")))
            .ok_or("the target exited before its address line")?;
        // Keep reading so that later lines never meet a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let addr = line
            .split_whitespace()
            .nth(2)
            .ok_or_else(|| format!("no address in `{line}`"))?
            .to_owned();
        Ok(Self { child, addr })
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one cell; returns its bench report.
fn run_cell(
    bin: &Path,
    cell: &Cell,
    addr: &str,
    seconds: f64,
    rounds: u32,
) -> Result<Value, String> {
    let mut args: Vec<String> = vec!["bench".into()];
    if cell.sim() {
        args.extend(["--path", "rdma", "--sim"].map(String::from));
    } else {
        args.extend(["--role", "initiator", "--peer", addr, "--path", cell.path].map(String::from));
    }
    args.extend([
        "--op".into(),
        cell.op.into(),
        "--block-size".into(),
        cell.block.into(),
        "--batch-size".into(),
        cell.batch.to_string(),
        "--threads".into(),
        cell.threads.to_string(),
        "--duration".into(),
        seconds.to_string(),
        "--rounds".into(),
        rounds.to_string(),
        "--json".into(),
        "--quiet".into(),
    ]);
    let mut child = Command::new(bin)
        .args(&args)
        .env("ORBITTE_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let mut stderr = child.stderr.take().ok_or("no stderr")?;
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    // Rounds of path and baselines, plus setup; far beyond, the cell hung.
    let bound = Duration::from_secs_f64(f64::from(rounds) * seconds * 3.0 + 120.0);
    let deadline = Instant::now() + bound;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no result within {} s", bound.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(e.to_string()),
        }
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    if !status.success() {
        let last = err.lines().last().unwrap_or_default().to_owned();
        return Err(format!("orbitte {} ({status}): {last}", args.join(" ")));
    }
    serde_json::from_str(&out).map_err(|e| format!("the bench printed no report: {e}"))
}

fn cell_json(cell: &Cell, r: Result<Value, String>) -> Value {
    let mut v = json!({
        "path": cell.path,
        "sim": cell.sim(),
        "op": cell.op,
        "block": cell.block,
        "batch_size": cell.batch,
        "threads": cell.threads,
        "processes": if cell.sim() { "one (loopback; --sim runs in one process)" } else { "two (target and initiator)" },
    });
    match r {
        Ok(report) => v["report"] = report,
        Err(e) => v["error"] = Value::String(e),
    }
    v
}

/// The first line of a command's output, or `unknown`.
fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// HEAD's short hash, and whether the built sources differ from it (other
/// work in progress in the same checkout is measured too).
fn commit(root: &Path) -> String {
    let head = command_line("git", &["rev-parse", "--short", "HEAD"]);
    let clean = Command::new("git")
        .current_dir(root)
        .args(["diff", "--quiet", "HEAD", "--", "crates", "Cargo.lock"])
        .status()
        .is_ok_and(|s| s.success());
    if clean {
        head
    } else {
        format!("{head} with uncommitted changes under crates/")
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

fn machine() -> Value {
    let lscpu = Command::new("lscpu")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let field = |name: &str| {
        lscpu
            .lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
            .unwrap_or_else(|| "unknown".into())
    };
    json!({
        "cpu": field("Model name:"),
        "cpus": field("CPU(s):"),
        "cores_available": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into()),
    })
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// A baseline's cell in the table: GB/s and ratio, or `suspect [n]` with
/// the reason collected as note n.
fn judged(b: &Value, notes: &mut Vec<String>, what: &str) -> (String, String) {
    let Some(gbps) = f(&b["gbps"]) else {
        return ("—".into(), "—".into());
    };
    let ratio = match b["suspect"].as_str() {
        Some(why) => {
            notes.push(format!("{what}: {why}"));
            format!("suspect [{}]", notes.len())
        }
        None => f(&b["ratio"]).map_or("—".into(), |r| format!("{r:.2}")),
    };
    (format!("{gbps:.2}"), ratio)
}

/// A note when the 1-minute load average before the run was above the
/// number of available cores: other work shared the machine. (The load
/// after it includes the run's own threads.)
fn busy(doc: &Value) -> &'static str {
    let cores = doc["machine"]["cores_available"].as_f64().unwrap_or(0.0);
    let load1 = |k: &str| {
        doc[k]
            .as_str()
            .and_then(|l| l.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    if load1("load_before").is_some_and(|l| cores > 0.0 && l > cores) {
        " (busy: other work shared the cores, so figures are low and rounds vary)"
    } else {
        ""
    }
}

/// The Markdown table of a perf document.
fn markdown(doc: &Value) -> String {
    let m = &doc["machine"];
    let s = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
    let mut out = format!(
        "Measured {} by `cargo xtask perf` (release build): {}, {} CPU(s) ({} available here), \
         Linux {}. Load average before {}{}, after {} (the run's own threads included). {} round(s) of {} s per cell, batch as listed, \
         loopback over 127.0.0.1; tcp and local with target and initiator in two processes, \
         rdma on the zero-latency simulated fabric in one. GB/s = 1e9 B/s, medians over rounds.\n\n",
        s(&doc["date"]),
        s(&m["cpu"]),
        s(&m["cpus"]),
        s(&m["cores_available"]),
        s(&m["kernel"]),
        s(&doc["load_before"]),
        busy(doc),
        s(&doc["load_after"]),
        s(&doc["rounds"]),
        s(&doc["seconds_per_round"]),
    );
    out.push_str(
        "| path | op | block | batch | threads | GB/s | rounds GB/s | req/s | p50 / p99 / p999 µs | CPUs busy | initiator CPU µs / req | baseline GB/s | path / baseline | loopback limit GB/s | path / limit |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut notes = Vec::new();
    for c in doc["cells"].as_array().into_iter().flatten() {
        let path = if c["sim"].as_bool() == Some(true) {
            format!("{} (sim)", s(&c["path"]))
        } else {
            s(&c["path"])
        };
        let head = format!(
            "| {path} | {} | {} | {} | {} ",
            s(&c["op"]).to_uppercase(),
            s(&c["block"]),
            s(&c["batch_size"]),
            s(&c["threads"])
        );
        let what = format!("{path} {} {}", s(&c["op"]).to_uppercase(), s(&c["block"]));
        if let Some(e) = c["error"].as_str() {
            notes.push(format!("{what}: failed: {e}"));
            out.push_str(&format!(
                "{head}| failed [{}] | | | | | | | | | |\n",
                notes.len()
            ));
            continue;
        }
        let p = &c["report"]["points"][0];
        let rounds = p["rounds_gbps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(f)
            .map(|g| format!("{g:.2}"))
            .collect::<Vec<_>>()
            .join(" ");
        let l = &p["latency"];
        let lat = match (f(&l["p50_us"]), f(&l["p99_us"]), f(&l["p999_us"])) {
            (Some(a), Some(b), Some(c)) => format!("{a:.0} / {b:.0} / {c:.0}"),
            _ => "—".into(),
        };
        let cpu = f(&p["cpu"]["busy"]).map_or("—".into(), |b| format!("{:.0} %", b * 100.0));
        let per_req =
            f(&p["initiator_cpu"]["us_per_request"]).map_or("—".into(), |u| format!("{u:.2}"));
        let (bg, br) = judged(&p["baseline"], &mut notes, &format!("{what} baseline"));
        let (lg, lr) = judged(&p["limit"], &mut notes, &format!("{what} limit"));
        out.push_str(&format!(
            "{head}| {:.2} | {rounds} | {:.0} | {lat} | {cpu} | {per_req} | {bg} | {br} | {lg} | {lr} |\n",
            f(&p["gbps"]).unwrap_or(0.0),
            f(&p["ops_per_s"]).unwrap_or(0.0),
        ));
    }
    out.push_str(
        "\nbaseline: memcpy for local, the same exchange on raw sockets for tcp, raw verbs on the same \
         simulated fabric for rdma (sim); \
         loopback limit: the best raw-socket setting (performance.md says how each is measured); \
         CPUs busy: the share of all the machine's CPU time spent working while the path was measured, \
         both processes and everything else on the machine included; initiator CPU µs / req: the CPU time \
         of the initiator threads themselves (they submit and wait; copies made on them included) per \
         request completed.\n",
    );
    if !notes.is_empty() {
        out.push('\n');
        for (i, n) in notes.iter().enumerate() {
            out.push_str(&format!("{}. {n}\n", i + 1));
        }
    }
    out
}

/// `page` with the text between its perf marks replaced by `table`.
fn replace_section(page: &str, table: &str) -> Result<String, String> {
    let (Some(b), Some(e)) = (page.find(BEGIN), page.find(END)) else {
        return Err(format!(
            "docs/performance.md lacks the marks {BEGIN} and {END} around its table"
        ));
    };
    if e < b {
        return Err(format!("docs/performance.md has {END} before {BEGIN}"));
    }
    Ok(format!(
        "{}{BEGIN}\n{}{}",
        &page[..b],
        table.trim_end().to_owned() + "\n",
        &page[e..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matrix_has_every_cell() {
        let c = cells();
        assert_eq!(c.len(), 12);
        for path in ["tcp", "local"] {
            for op in ["read", "write"] {
                for block in ["64K", "1M"] {
                    assert!(c.iter().any(|x| x.path == path
                        && x.op == op
                        && x.block == block
                        && x.threads == 1
                        && x.batch == 16));
                }
            }
        }
        assert!(
            c.iter()
                .any(|x| x.path == "tcp" && x.threads == 2 && x.block == "64K")
        );
        assert!(c.iter().filter(|x| x.sim()).all(|x| x.batch == 256));
    }

    fn doc() -> Value {
        let baseline = |gbps: f64, ratio: f64, suspect: Value| json!({"name": "n", "gbps": gbps, "seconds": 1.5, "rounds_gbps": [gbps], "ratio": ratio, "suspect": suspect});
        json!({
            "date": "2026-12-01 11:00 UTC",
            "commit": "abc1234",
            "machine": {"cpu": "AMD EPYC", "cpus": "2", "cores_available": 2, "kernel": "6.1.0"},
            "load_before": "1.0 1.0 1.0",
            "load_after": "1.2 1.0 1.0",
            "seconds_per_round": 1.0,
            "rounds": 3,
            "cells": [
                cell_json(&cells()[0], Ok(json!({"points": [{
                    "gbps": 1.5, "ops_per_s": 22888.0, "rounds_gbps": [1.4, 1.5, 1.6],
                    "latency": {"p50_us": 600.0, "p99_us": 900.0, "p999_us": 1500.0},
                    "cpu": {"cpus": 2, "busy": 0.846, "steal": 0.0},
                    "initiator_cpu": {"seconds": 0.9, "busy": 0.9, "us_per_request": 13.107},
                    "baseline": baseline(2.0, 0.75, Value::Null),
                    "limit": baseline(1.2, 1.25, json!("the path ran 1.25x its baseline")),
                }]}))),
                cell_json(&cells()[1], Err("refused".into())),
            ],
        })
    }

    #[test]
    fn the_table_gives_ratios_and_flags_suspect_ones_with_their_reason() {
        let t = markdown(&doc());
        assert!(t.contains("AMD EPYC, 2 CPU(s)"), "{t}");
        // The commit is in the JSON record, not in the user page.
        assert!(!t.contains("abc1234"), "{t}");
        assert!(
            t.contains("Load average before 1.0 1.0 1.0, after 1.2 1.0 1.0 "),
            "{t}"
        );
        let mut busy = doc();
        busy["load_after"] = json!("3.5 2.0 1.0");
        assert!(!markdown(&busy).contains("(busy:"));
        busy["load_before"] = json!("2.5 2.0 1.0");
        assert!(markdown(&busy).contains("before 2.5 2.0 1.0 (busy:"));
        assert!(
            t.contains("| tcp | READ | 64K | 16 | 1 | 1.50 | 1.40 1.50 1.60 | 22888 | 600 / 900 / 1500 | 85 % | 13.11 | 2.00 | 0.75 | 1.20 | suspect [1] |"),
            "{t}"
        );
        assert!(
            t.contains("1. tcp READ 64K limit: the path ran 1.25x its baseline"),
            "{t}"
        );
        assert!(t.contains("| failed [2] |"), "{t}");
        assert!(t.contains("2. tcp READ 1M: failed: refused"), "{t}");
        // A bench that could not read the CPU counters: no figure.
        let mut blind = doc();
        blind["cells"][0]["report"]["points"][0]["cpu"] = Value::Null;
        blind["cells"][0]["report"]["points"][0]["initiator_cpu"] = Value::Null;
        let t = markdown(&blind);
        assert!(t.contains("| 600 / 900 / 1500 | — | — | 2.00 |"), "{t}");
    }

    #[test]
    fn the_docs_section_is_replaced_between_the_marks() {
        let page = format!("# P\n\n{BEGIN}\nold\n{END}\nafter\n");
        let new = replace_section(&page, "| new |\n\n").unwrap();
        assert_eq!(new, format!("# P\n\n{BEGIN}\n| new |\n{END}\nafter\n"));
        assert!(replace_section("# P\n", "x").is_err());
        assert!(replace_section(&format!("{END}\n{BEGIN}\n"), "x").is_err());
    }
}
