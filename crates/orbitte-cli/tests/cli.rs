//! The `orbitte` command as users run it: exit statuses, one-line errors,
//! topology on recorded sysfs trees, doctor's JSON, bench in loopback and
//! as two processes, serve from a config file.
#![forbid(unsafe_code)]

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use assert_cmd::cargo::CommandCargoExt as _;

fn orbitte() -> Command {
    let mut c = Command::cargo_bin("orbitte").expect("the orbitte binary is built");
    // The tests decide the log filter and the RDMA selectors themselves.
    c.env_remove("ORBITTE_LOG").env("ORBITTE_LOG", "error");
    for v in orbitte_topology::ENV_VARS {
        c.env_remove(v);
    }
    c
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Run {
    run_cmd(orbitte().args(args))
}

fn run_cmd(c: &mut Command) -> Run {
    let out = c.output().expect("orbitte runs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Exit status 2 and exactly one line on stderr, starting `orbitte: ` and
/// containing every `needle`; no backtrace.
fn assert_usage_error(r: &Run, needles: &[&str]) {
    assert_eq!(r.code, 2, "exit status; stderr: {}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr, got: {:?}", r.stderr);
    assert!(lines[0].starts_with("orbitte: "), "{}", lines[0]);
    assert!(!r.stderr.contains("panicked") && !r.stderr.contains("backtrace"));
    for n in needles {
        assert!(lines[0].contains(n), "`{n}` missing from: {}", lines[0]);
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../orbitte-topology/tests/fixtures")
        .join(name)
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not json ({e}): {text}"))
}

// ---- bad flags ----

#[test]
fn bad_flag_values_give_one_line_and_status_2() {
    assert_usage_error(
        &run(&["bench", "--block-size", "12X"]),
        &["--block-size", "use K, M, G or T"],
    );
    assert_usage_error(&run(&["bench", "--op", "erase"]), &["erase", "--op"]);
    assert_usage_error(
        &run(&["bench", "--duration", "0"]),
        &["--duration", "between 0 and 86400"],
    );
    assert_usage_error(&run(&["bench", "--batch-size", "0"]), &["--batch-size"]);
    assert_usage_error(&run(&["bench", "--role", "initiator"]), &["--peer"]);
    assert_usage_error(&run(&["doctor", "--path", "warp"]), &["warp"]);
    assert_usage_error(&run(&["frobnicate"]), &["frobnicate"]);
    assert_usage_error(
        &run(&["topology", "--sysfs-root", "/nonexistent-dir"]),
        &["--sysfs-root", "sys"],
    );
    assert_usage_error(
        &run(&["bench", "--path", "nvlink"]),
        &["nvlink", "orbitte doctor --path nvlink"],
    );
    assert_usage_error(&run(&["--log", "[[[", "doctor"]), &["--log"]);
}

#[test]
fn help_and_version_exit_0() {
    let r = run(&["--help"]);
    assert_eq!(r.code, 0);
    for cmd in ["doctor", "topology", "bench", "serve"] {
        assert!(r.stdout.contains(cmd), "{cmd} in help");
    }
    assert_eq!(run(&["--version"]).code, 0);
}

#[test]
fn unreachable_peer_is_one_line_naming_the_fix() {
    // Port 1 on loopback: nothing listens there.
    let r = run(&[
        "bench",
        "--role",
        "initiator",
        "--peer",
        "127.0.0.1:1",
        "--duration",
        "0.2",
    ]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let last = r.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("orbitte: cannot reach the target at 127.0.0.1:1"),
        "{last}"
    );
    assert!(last.contains("orbitte bench --role target"), "{last}");
}

// ---- bad config files ----

fn config(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    f
}

fn serve_check(text: &str) -> Run {
    let f = config(text);
    run(&["serve", "--config", f.path().to_str().unwrap(), "--check"])
}

#[test]
fn bad_config_files_give_one_line_naming_the_key_and_status_2() {
    assert_usage_error(
        &serve_check("[engine]\nsource_id = \"a\"\nslice_size = \"12X\"\n"),
        &["key engine.slice_size", "expected a size", "\"12X\""],
    );
    assert_usage_error(
        &serve_check("[engine]\nsource_id = \"a\"\nslise_size = 1\n"),
        &["unknown key engine.slise_size", "known: source_id"],
    );
    assert_usage_error(
        &serve_check("[engine]\nlisten = \"0.0.0.0:1\"\n"),
        &["engine.source_id is missing"],
    );
    assert_usage_error(&serve_check("[engine\nsource_id = 1\n"), &["invalid toml"]);
    assert_usage_error(
        &serve_check("[engine]\nsource_id = \"a\"\n[[range]]\nsize = \"1M\"\naccess = \"all\"\n"),
        &["key range.access", "\"read-write\""],
    );
    assert_usage_error(
        &serve_check("[engine]\nsource_id = \"a\"\n[rdma]\nport = 0\n"),
        &["key rdma.port", "1..=255"],
    );
    assert_usage_error(
        &serve_check("[engine]\nsource_id = \"a\"\nmax_in_flight = 0\n"),
        &["key engine.max_in_flight"],
    );
    assert_usage_error(
        &run(&["serve", "--config", "/nonexistent/orbitte.toml"]),
        &[
            "cannot read config file /nonexistent/orbitte.toml",
            "--config",
        ],
    );
}

#[test]
fn a_config_naming_a_missing_device_is_one_line_with_the_fix() {
    let r = serve_check("[engine]\nsource_id = \"a\"\n[rdma]\ndevice = \"mlx5_99\"\n");
    assert_usage_error(
        &r,
        &[
            "key rdma.device",
            "no RDMA device named mlx5_99",
            "orbitte topology",
        ],
    );
    // The same pin from the environment names the variable.
    let f = config("[engine]\nsource_id = \"a\"\n");
    let r = run_cmd(
        orbitte()
            .args(["serve", "--config", f.path().to_str().unwrap(), "--check"])
            .env("ORBITTE_RDMA_DEVICE", "mlx5_99"),
    );
    assert_usage_error(&r, &["environment variable ORBITTE_RDMA_DEVICE", "mlx5_99"]);
    // A misspelt variable is refused, not ignored.
    let r = run_cmd(
        orbitte()
            .args(["serve", "--config", f.path().to_str().unwrap(), "--check"])
            .env("ORBITTE_RDMA_PROT", "1"),
    );
    assert_usage_error(&r, &["ORBITTE_RDMA_PROT"]);
}

// ---- topology ----

#[test]
fn topology_lists_nic_ids_ports_gids_and_selection_on_fixtures() {
    let r = run(&[
        "topology",
        "--sysfs-root",
        fixture("cx7-roce").to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("nic 0 mlx5_0"), "{}", r.stdout);
    assert!(r.stdout.contains("port 1 DOWN"), "{}", r.stdout);
    assert!(
        r.stdout
            .contains("gid 3 ::ffff:192.168.10.11 RoCE v2 on ens1f0np0"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("selected nic 0 mlx5_0 port 1 gid 3"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("initialized: not initialized: no engine running in this process"),
        "{}",
        r.stdout
    );
}

/// A recorded tree is not this machine's devices: the provider is not
/// asked, each NIC's visibility is unknown, and the report says why.
#[test]
fn topology_reports_provider_visibility_unknown_with_the_reason_on_fixtures() {
    let r = run(&[
        "topology",
        "--sysfs-root",
        fixture("cx7-roce").to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let nic0 = r
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("nic 0 mlx5_0"))
        .expect("mlx5_0's line");
    assert!(nic0.ends_with("provider unknown"), "{nic0}");
    assert!(
        r.stdout.lines().any(|l| l
            == "provider visibility unknown: not asked: --sysfs-root is a recorded tree, not this machine's devices"),
        "{}",
        r.stdout
    );
}

/// On this machine the native provider is asked: either it lists devices
/// (each discovered NIC is then visible or not visible), or visibility is
/// unknown with the device list's failure.
#[test]
fn topology_asks_the_native_provider_on_this_machine() {
    let r = run(&["topology"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("provider"))
        .unwrap_or_else(|| panic!("no provider line: {}", r.stdout));
    assert!(
        line.starts_with("provider (libibverbs) lists")
            || line.starts_with("provider visibility unknown: device list failed: "),
        "{line}"
    );
}

#[test]
fn topology_shows_inert_slots_with_their_error() {
    let r = run(&[
        "topology",
        "--sysfs-root",
        fixture("lab-edge-cases").to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("nic 2 mlx5_2 inert: discovery failed"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("not-a-guid"), "{}", r.stdout);
    assert!(r.stdout.contains("nic 7 rxe0"), "{}", r.stdout);
}

#[test]
fn topology_says_why_a_device_is_left_out_when_others_are_selected() {
    let r = run(&[
        "topology",
        "--sysfs-root",
        fixture("ib-hdr").to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("selected nic 0 mlx5_0 port 1 gid 0"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("gid 0 fe80::c42:a103:65:4a10 IB"),
        "{}",
        r.stdout
    );
    let why = r
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("nic 1 mlx5_1:"))
        .expect("mlx5_1's line");
    assert!(why.contains("not readable and writable"), "{why}");
}

#[test]
fn topology_json_has_slots_affinity_and_selection() {
    let r = run(&[
        "topology",
        "--json",
        "--sysfs-root",
        fixture("dgx-8gpu").to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = json(&r.stdout);
    let text = v.to_string();
    for dev in ["mlx5_0", "mlx5_3", "mlx5_11"] {
        assert!(text.contains(dev), "{dev}");
    }
    let affinity = v["affinity"].as_array().expect("affinity array");
    // Two NUMA nodes with NICs, eight GPUs.
    assert_eq!(affinity.len(), 10, "{affinity:?}");
    assert_eq!(affinity[2]["location"], "cuda device 0");
    assert_eq!(affinity[2]["ranking"][0]["name"], "mlx5_0");
    assert!(
        v["selection"]["rails"]
            .as_array()
            .is_some_and(|r| r.len() == 8),
        "{}",
        v["selection"]
    );
    assert_eq!(v["selection"]["outcome"], "selected");
    assert_eq!(v["initialized"]["status"], "not_initialized");
}

#[test]
fn topology_config_selectors_apply() {
    let f = config("[rdma]\ndevice = \"mlx5_1\"\n");
    let r = run(&[
        "topology",
        "--sysfs-root",
        fixture("cx7-roce").to_str().unwrap(),
        "--config",
        f.path().to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // mlx5_1's port is down: the strict pin selects nothing and says why.
    assert!(r.stdout.contains("no rdma port selected"), "{}", r.stdout);
    assert!(r.stdout.contains("not active"), "{}", r.stdout);
}

// ---- doctor ----

const PATHS: [&str; 7] = [
    "rdma",
    "tcp",
    "local",
    "cuda-staging",
    "gpudirect-rdma",
    "cuda-ipc",
    "nvlink",
];

#[test]
fn doctor_json_has_every_path_with_four_checks() {
    let r = run(&["doctor", "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = json(&r.stdout);
    let rows = v["paths"].as_array().expect("paths");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["path"].as_str()).collect();
    assert_eq!(names, PATHS);
    for row in rows {
        for check in ["build", "discovery", "completion", "drain"] {
            let status = row[check]["status"].as_str().unwrap_or_default();
            assert!(
                ["pass", "fail", "skipped", "not_implemented"].contains(&status),
                "{}: {check} = {status}",
                row["path"]
            );
            if status == "fail" {
                assert!(
                    row[check]["reason"].is_string() && row[check]["fix"].is_string(),
                    "{row}"
                );
            }
        }
        let works = ["build", "discovery", "completion", "drain"]
            .iter()
            .all(|c| row[c]["status"] == "pass");
        assert_eq!(row["works"], works, "{row}");
    }
    for p in ["gpudirect-rdma", "cuda-ipc", "nvlink"] {
        let row = rows.iter().find(|r| r["path"] == p).unwrap();
        assert_eq!(row["completion"]["status"], "not_implemented");
    }
}

#[test]
fn doctor_exit_status_follows_the_path_asked_for() {
    // tcp over loopback works wherever the tests run.
    let r = run(&["doctor", "--path", "tcp", "--json"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(json(&r.stdout)["paths"][0]["works"], true);
    // A path that is not implemented never works.
    let r = run(&["doctor", "--path", "nvlink"]);
    assert_eq!(r.code, 1);
    let last = r.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("orbitte: path nvlink does not work: build check: not implemented"),
        "{last}"
    );
}

/// The CLI applies the ORBITTE_RDMA_* variables to every engine it builds:
/// doctor runs with the pin and says so (and a listed machine's discovery
/// failure names it), and a misspelt variable is refused, not ignored.
#[test]
fn doctor_and_bench_apply_the_rdma_environment() {
    let r = run_cmd(
        orbitte()
            .args(["doctor", "--path", "rdma"])
            .env("ORBITTE_RDMA_DEVICE", "nosuch"),
    );
    assert_eq!(
        r.code, 1,
        "a pin to a missing device never works: {}",
        r.stdout
    );
    assert!(
        r.stdout
            .lines()
            .next()
            .is_some_and(|l| l.starts_with("rdma selection: device=nosuch ")),
        "{}",
        r.stdout
    );
    let r = run_cmd(
        orbitte()
            .args(["doctor", "--path", "tcp", "--json"])
            .env("ORBITTE_RDMA_DEVICE", "nosuch"),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = json(&r.stdout);
    assert!(
        v["rdma_config"]
            .as_str()
            .is_some_and(|c| c.contains("device=nosuch")),
        "{v}"
    );
    let r = run_cmd(
        orbitte()
            .args(["doctor", "--path", "tcp"])
            .env("ORBITTE_RDMA_PROT", "1"),
    );
    assert_usage_error(&r, &["ORBITTE_RDMA_PROT"]);
    let r = run_cmd(
        orbitte()
            .args(["bench", "--duration", "0.1", "--quiet"])
            .env("ORBITTE_RDMA_PROT", "1"),
    );
    assert_usage_error(&r, &["ORBITTE_RDMA_PROT"]);
}

// ---- bench ----

fn bench_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["bench", "--json", "--quiet"];
    all.extend_from_slice(args);
    let r = run(&all);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    json(&r.stdout)
}

/// The report names a peer whose id starts with `prefix`.
fn assert_peer(v: &serde_json::Value, prefix: &str) {
    assert!(
        v["peer"].as_str().is_some_and(|p| p.starts_with(prefix)),
        "{v}"
    );
}

fn assert_point_ok(p: &serde_json::Value, checked: bool) {
    assert!(p["gbps"].as_f64().is_some_and(|g| g > 0.0), "{p}");
    assert!(p["ops_per_s"].as_f64().is_some_and(|g| g > 0.0), "{p}");
    assert!(p["requests"].as_u64().is_some_and(|n| n > 0), "{p}");
    for q in ["p50_us", "p99_us", "p999_us"] {
        assert!(
            p["latency"][q].as_f64().is_some_and(|l| l > 0.0),
            "{q}: {p}"
        );
    }
    if checked {
        assert!(p["checked_bytes"].as_u64().is_some_and(|n| n > 0), "{p}");
    }
}

#[test]
fn bench_loopback_with_check_reports_numbers_and_the_path() {
    for op in ["write", "read"] {
        let v = bench_json(&[
            "--duration",
            "0.3",
            "--check",
            "--op",
            op,
            "--block-size",
            "16K",
            "--batch-size",
            "4",
        ]);
        assert!(
            ["local", "tcp"].contains(&v["path"].as_str().unwrap_or_default()),
            "{v}"
        );
        assert!(
            v["path_note"]
                .as_str()
                .is_some_and(|n| n.contains("path policy")),
            "{v}"
        );
        assert_point_ok(&v["points"][0], true);
        assert!(
            v["points"][0]["baseline"]["gbps"]
                .as_f64()
                .is_some_and(|g| g > 0.0),
            "{v}"
        );
    }
}

#[test]
fn bench_loopback_on_tcp_with_threads() {
    let v = bench_json(&[
        "--duration",
        "0.3",
        "--check",
        "--path",
        "tcp",
        "--threads",
        "2",
        "--block-size",
        "100000",
        "--rounds",
        "2",
    ]);
    assert_eq!(v["path"], "tcp");
    assert_eq!(v["rounds"], 2);
    let p = &v["points"][0];
    assert_point_ok(p, true);
    assert_eq!(p["rounds_gbps"].as_array().map(Vec::len), Some(2), "{p}");
    // The same exchange on raw sockets, and the loopback limit, each
    // measured once per round.
    assert!(
        p["baseline"]["name"]
            .as_str()
            .is_some_and(|n| n.contains("WRITE exchange") && n.contains("2 connection(s)")),
        "{p}"
    );
    for b in ["baseline", "limit"] {
        assert_eq!(p[b]["rounds_gbps"].as_array().map(Vec::len), Some(2), "{p}");
        assert!(p[b]["gbps"].as_f64().is_some_and(|g| g > 0.0), "{p}");
    }
    assert!(
        p["limit"]["name"]
            .as_str()
            .is_some_and(|n| n.contains("loopback limit")),
        "{p}"
    );
}

#[test]
fn bench_sweep_writes_an_svg_chart() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("sweep.svg");
    let v = bench_json(&[
        "--duration",
        "0.1",
        "--sweep",
        "--chart",
        chart.to_str().unwrap(),
        "--batch-size",
        "2",
    ]);
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 6);
    for p in points {
        assert_point_ok(p, false);
    }
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<svg"));
    assert_eq!(
        svg.matches("<polyline").count(),
        2,
        "orbitte and the baseline"
    );
    assert!(svg.contains(">4M<"));
}

/// Kills the child when dropped (a failing test leaves no process behind).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a long-running `orbitte` and returns it with the address from
/// its first stdout line matching `marker`.
#[test]
fn bench_peers_runs_many_initiator_engines_in_several_processes_against_one_target() {
    let v = bench_json(&[
        "--peers",
        "1,3",
        "--processes",
        "2",
        "--duration",
        "0.2",
        "--blocks",
        "4K,16K",
        "--batch-size",
        "2",
        "--rounds",
        "2",
    ]);
    assert_eq!(v["command"], "bench_peers", "{v}");
    assert_eq!(v["rounds"], 2, "{v}");
    assert_eq!(v["path"], "tcp", "{v}");
    let counts = v["counts"].as_array().expect("counts");
    assert_eq!(counts.len(), 2, "{v}");
    for (c, (peers, processes)) in counts.iter().zip([(1, 1), (3, 2)]) {
        assert_eq!(c["peers"], peers, "{c}");
        assert_eq!(c["processes"], processes, "{c}");
        assert!(
            c["connect_seconds"].as_f64().is_some_and(|s| s > 0.0),
            "{c}"
        );
        // Every peer holds at least one socket at the target.
        let before = c["target_before"]["descriptors"].as_u64().unwrap();
        let idle = c["target_idle"]["descriptors"].as_u64().unwrap();
        assert!(idle >= before + peers, "{c}");
        assert!(
            c["initiators_idle"]["threads"].as_u64().unwrap() >= processes,
            "{c}"
        );
        let cells = c["cells"].as_array().expect("cells");
        let shapes: Vec<(String, u64)> = cells
            .iter()
            .map(|x| {
                (
                    x["op"].as_str().unwrap().to_owned(),
                    x["block_size"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            shapes,
            [
                ("write", 4096),
                ("write", 16384),
                ("read", 4096),
                ("read", 16384)
            ]
            .map(|(o, b)| (o.to_owned(), b)),
            "{c}"
        );
        for x in cells {
            let (bytes, requests) = (
                x["bytes"].as_u64().unwrap(),
                x["requests"].as_u64().unwrap(),
            );
            assert!(requests > 0, "{x}");
            assert_eq!(bytes, requests * x["block_size"].as_u64().unwrap(), "{x}");
            assert!(x["gbps"].as_f64().is_some_and(|g| g > 0.0), "{x}");
            assert!(
                x["latency"]["p999_us"].as_f64().is_some_and(|l| l > 0.0),
                "{x}"
            );
            assert!(x["of_one_peer"].as_f64().is_some_and(|r| r > 0.0), "{x}");
            // Each cell is one of its two rounds, the lower one.
            let rounds: Vec<f64> = x["rounds_gbps"]
                .as_array()
                .expect("rounds_gbps")
                .iter()
                .map(|g| g.as_f64().unwrap())
                .collect();
            assert_eq!(rounds.len(), 2, "{x}");
            assert_eq!(x["gbps"].as_f64(), Some(rounds[0].min(rounds[1])), "{x}");
            assert!(
                x["target_cpu_cores"].as_f64().is_some_and(|r| r > 0.0),
                "{x}"
            );
            // The machine was busy with the cell, and steal is a share.
            assert!(x["cpu"]["busy"].as_f64().is_some_and(|b| b > 0.0), "{x}");
            assert!(
                x["cpu"]["steal"]
                    .as_f64()
                    .is_some_and(|s| (0.0..=1.0).contains(&s)),
                "{x}"
            );
        }
    }
    for x in counts[0]["cells"].as_array().unwrap() {
        assert_eq!(x["of_one_peer"], 1.0, "{x}");
    }
}

#[test]
fn bench_peers_refuses_what_it_cannot_measure_in_one_line() {
    let r = run(&["bench", "--peers", "2", "--path", "rdma"]);
    assert_usage_error(&r, &["--peers", "tcp", "local"]);
    let r = run(&["bench", "--peers", "2", "--sweep"]);
    assert_usage_error(&r, &["--peers", "--sweep"]);
    let r = run(&["bench", "--peers", "2", "--role", "target"]);
    assert_usage_error(&r, &["--peers", "--role"]);
    // clap's own errors: exit status 2 and the flag named.
    for args in [
        &["bench", "--peers", "0"][..],
        &["bench", "--peers", "5000"],
        &["bench", "--processes", "2"],
    ] {
        let r = run(args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains("--p"), "{args:?}: {}", r.stderr);
    }
}

fn spawn_with_addr(args: &[&str], marker: &str) -> (KillOnDrop, String) {
    let mut child = KillOnDrop(
        orbitte()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn orbitte"),
    );
    let out = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let line = lines
        .find_map(|l| l.ok().filter(|l| l.contains(marker)))
        .expect("the address line");
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .expect("an address")
        .trim_end_matches([';', ','])
        .to_owned();
    // Keep reading so that later lines never meet a closed pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, addr)
}

#[test]
fn bench_target_and_initiator_as_two_processes() {
    let (_target, addr) = spawn_with_addr(
        &[
            "bench",
            "--role",
            "target",
            "--listen",
            "127.0.0.1:0",
            "--block-size",
            "64K",
        ],
        "listening on",
    );
    for path in ["tcp", "local"] {
        let v = bench_json(&[
            "--role",
            "initiator",
            "--peer",
            &addr,
            "--path",
            path,
            "--duration",
            "0.3",
            "--check",
            "--op",
            "read",
        ]);
        assert_eq!(v["path"], path, "{v}");
        assert!(
            v["peer"]
                .as_str()
                .is_some_and(|p| p.starts_with("orbitte-bench-target-")),
            "{v}"
        );
        assert_point_ok(&v["points"][0], true);
    }
    // A block size the target's range cannot hold: one line, the fix.
    let r = run(&[
        "bench",
        "--role",
        "initiator",
        "--peer",
        &addr,
        "--block-size",
        "1M",
        "--duration",
        "0.2",
    ]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr
            .lines()
            .last()
            .unwrap_or_default()
            .contains("start the target with the same settings"),
        "{}",
        r.stderr
    );
}

#[test]
fn serve_publishes_configured_ranges_to_initiators() {
    let f = config(
        "[engine]\nsource_id = \"serve-test\"\nlisten = \"127.0.0.1:0\"\n\n[[range]]\nname = \"kv\"\nsize = \"2M\"\naccess = \"read-write\"\n",
    );
    let (_serve, addr) = spawn_with_addr(
        &["serve", "--config", f.path().to_str().unwrap()],
        "serving as",
    );
    let v = bench_json(&[
        "--role",
        "initiator",
        "--peer",
        &addr,
        "--path",
        "tcp",
        "--duration",
        "0.3",
        "--check",
    ]);
    assert_eq!(
        v["peer"].as_str().map(|p| p.starts_with("serve-test")),
        Some(true),
        "{v}"
    );
    assert_point_ok(&v["points"][0], true);
}

#[test]
fn bench_rdma_on_the_simulated_fabric_moves_checked_bytes() {
    let v = bench_json(&[
        "--path",
        "rdma",
        "--sim",
        "--duration",
        "0.3",
        "--check",
        "--batch-size",
        "4",
        "--block-size",
        "16K",
    ]);
    assert_eq!(v["path"], "rdma");
    assert!(
        v["path_note"]
            .as_str()
            .is_some_and(|n| n.contains("simulated fabric")),
        "{v}"
    );
    assert_point_ok(&v["points"][0], true);
    assert_eq!(v["points"][0]["drained"], true);
    // Judged against raw verbs on the same kind of fabric.
    let b = &v["points"][0]["baseline"];
    assert!(
        b["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("raw sim verbs")),
        "{v}"
    );
    assert!(b["gbps"].as_f64().is_some_and(|g| g > 0.0), "{v}");
    assert_usage_error(&run(&["bench", "--sim"]), &["--path rdma"]);
}

#[test]
fn bench_rdma_on_this_machine_runs_exactly_when_doctor_says_rdma_works() {
    let works = run(&["doctor", "--path", "rdma"]).code == 0;
    let r = run(&[
        "bench",
        "--path",
        "rdma",
        "--duration",
        "0.3",
        "--check",
        "--json",
        "--quiet",
    ]);
    if works {
        assert_eq!(r.code, 0, "{}", r.stderr);
        assert_point_ok(&json(&r.stdout)["points"][0], true);
    } else {
        assert_eq!(r.code, 1, "{}", r.stderr);
        let last = r.stderr.lines().last().unwrap_or_default();
        assert!(last.starts_with("orbitte: rdma path: "), "{last}");
        assert!(last.contains("orbitte doctor --path rdma"), "{last}");
        println!(
            "skipped: no usable rdma device here ({last}); checked the one-line refusal instead"
        );
    }
}

#[test]
fn topology_initialize_reports_what_an_engine_initialized() {
    let r = run(&["topology", "--initialize", "--json"]);
    let v = json(&r.stdout);
    let state = v["initialized"]["status"].as_str().unwrap_or_default();
    assert!(["initialized", "not_initialized"].contains(&state), "{v}");
    let failed = if state == "initialized" {
        assert!(
            v["initialized"]["trigger"]
                .as_str()
                .is_some_and(|t| t.contains("Host Direct registration"))
        );
        !v["initialized"]["registration_error"].is_null()
    } else {
        assert!(v["initialized"]["why"].is_string());
        true
    };
    // The report is printed either way; the exit status says whether the
    // registration worked, and the error line says why not.
    if failed {
        assert_eq!(r.code, 1, "{}", r.stderr);
        let last = r.stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("orbitte: --initialize: ")
                && last.contains("orbitte doctor --path rdma"),
            "{last}"
        );
    } else {
        assert_eq!(r.code, 0, "{}", r.stderr);
    }
    assert_usage_error(
        &run(&[
            "topology",
            "--initialize",
            "--sysfs-root",
            fixture("cx7-roce").to_str().unwrap(),
        ]),
        &["--initialize", "--sysfs-root"],
    );
}

#[test]
fn serve_with_an_rdma_table_registers_for_host_direct_or_says_why_not() {
    let f = config(
        "[engine]\nsource_id = \"serve-rdma\"\nlisten = \"127.0.0.1:0\"\n\n[[range]]\nsize = \"1M\"\n\n[rdma]\n",
    );
    let path = f.path().to_str().unwrap();
    if run(&["doctor", "--path", "rdma"]).code == 0 {
        let (_serve, addr) = spawn_with_addr(&["serve", "--config", path], "serving as");
        let v = bench_json(&[
            "--role",
            "initiator",
            "--peer",
            &addr,
            "--path",
            "tcp",
            "--duration",
            "0.3",
            "--check",
            "--block-size",
            "16K",
        ]);
        assert_point_ok(&v["points"][0], true);
    } else {
        let r = run(&["serve", "--config", path]);
        assert_eq!(r.code, 1, "{}", r.stderr);
        let last = r.stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("orbitte: range range-0: host direct registration failed: "),
            "{last}"
        );
        assert!(last.contains("[rdma] table"), "{last}");
        println!("skipped: no usable rdma device here; checked the one-line refusal instead");
    }
}

#[test]
fn bench_rdma_target_and_initiator_as_two_processes_when_rdma_works() {
    if run(&["doctor", "--path", "rdma"]).code != 0 {
        let r = run(&[
            "bench",
            "--role",
            "target",
            "--path",
            "rdma",
            "--listen",
            "127.0.0.1:0",
        ]);
        assert_eq!(r.code, 1, "{}", r.stderr);
        let last = r.stderr.lines().last().unwrap_or_default();
        assert!(last.starts_with("orbitte: rdma path: "), "{last}");
        println!(
            "skipped: no usable rdma device here; checked the target's one-line refusal instead"
        );
        return;
    }
    let (_target, addr) = spawn_with_addr(
        &[
            "bench",
            "--role",
            "target",
            "--path",
            "rdma",
            "--listen",
            "127.0.0.1:0",
        ],
        "listening on",
    );
    let v = bench_json(&[
        "--role",
        "initiator",
        "--peer",
        &addr,
        "--path",
        "rdma",
        "--duration",
        "0.3",
        "--check",
        "--op",
        "read",
    ]);
    assert_eq!(v["path"], "rdma");
    assert_point_ok(&v["points"][0], true);
}

// ---- what the docs promise, tried as a new user would ----

/// `--source-id X` in loopback: the initiator is X and the target
/// X-target (one id for both is a source conflict); control characters
/// are refused.
#[test]
fn bench_source_id_names_two_distinct_engines_and_refuses_control_characters() {
    let v = bench_json(&["--source-id", "kv-a", "--duration", "0.2"]);
    assert_peer(&v, "kv-a-target ");
    assert_point_ok(&v["points"][0], false);
    for bad in ["a\nb", "x\u{1b}[31m", ""] {
        let r = run(&["bench", "--source-id", bad, "--duration", "0.2"]);
        assert_usage_error(&r, &["--source-id"]);
    }
}

/// In loopback the target's id is the initiator's with `-target`: an id
/// too long for that is refused up front with the most it may have, and
/// the longest one that fits runs.
#[test]
fn bench_loopback_refuses_a_source_id_the_target_suffix_would_push_over_255_bytes() {
    for len in [249, 255] {
        let id = "k".repeat(len);
        let r = run(&["bench", "--source-id", &id, "--duration", "0.2"]);
        assert_usage_error(
            &r,
            &["--source-id", "at most 248 bytes", &format!("has {len}")],
        );
    }
    let id = "k".repeat(248);
    let v = bench_json(&["--source-id", &id, "--duration", "0.2"]);
    assert_peer(&v, &format!("{id}-target "));
}

/// A stand-in target that answers every connection with an `error` frame
/// carrying `code` instead of the handshake's challenge.
fn refusing_target(code: orbitte_wire::ErrorCode) -> String {
    use std::io::{Read as _, Write as _};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let mut frame = Vec::new();
    orbitte_wire::Frame::Error(orbitte_wire::ErrorFrame {
        code,
        frame_type: orbitte_wire::FrameType(0),
        request_id: orbitte_wire::RequestId(0),
        message: orbitte_wire::Message::truncating("refused by the stand-in"),
    })
    .encode(&mut frame)
    .unwrap();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let _ = s.write_all(&frame);
            let _ = s.shutdown(std::net::Shutdown::Write);
            let _ = s.read_to_end(&mut Vec::new());
        }
    });
    addr
}

/// "Check that the target runs" is the fix only when no target answered:
/// a running target that refuses with resource-exhausted or stale-epoch
/// gets its own fix, and nothing running there gets the hint.
#[test]
fn a_target_that_refuses_is_not_told_to_check_that_it_runs() {
    use orbitte_wire::ErrorCode;
    for (code, name, fix) in [
        (
            ErrorCode::RESOURCE_EXHAUSTED,
            "resource-exhausted",
            "retry once",
        ),
        (ErrorCode::STALE_EPOCH, "stale-epoch", "--source-id"),
    ] {
        let addr = refusing_target(code);
        let last = tcp_initiator_failure(&addr);
        assert!(
            last.starts_with(&format!(
                "orbitte: the target at {addr} refused the session: {name}"
            )),
            "{last}"
        );
        assert!(last.contains("refused by the stand-in"), "{last}");
        assert!(last.contains(fix), "{last}");
        assert!(!last.contains("runs there"), "{last}");
    }
    // Nothing listens: the hint stays.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let last = tcp_initiator_failure(&free.to_string());
    assert!(last.contains("runs there"), "{last}");
}

/// A target that accepts and then closes the connection
/// before the handshake, as one at its session or descriptor limit does,
/// is not reported as "nothing runs there": the hint names the limits and
/// its log; nothing listening is told so.
#[test]
fn a_connection_closed_during_the_handshake_names_the_targets_limits() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || l.incoming().flatten().for_each(drop));
    let last = tcp_initiator_failure(&addr);
    for names in [
        "during the handshake",
        "engine.max_sessions",
        "RLIMIT_NOFILE",
        "its log",
    ] {
        assert!(last.contains(names), "{names}: {last}");
    }
    assert!(!last.contains("runs there"), "{last}");
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let last = tcp_initiator_failure(&free.to_string());
    assert!(last.contains("nothing listens there"), "{last}");
}

/// `bench --help` offers only the paths bench measures; the others are
/// refused with a pointer at doctor.
#[test]
fn bench_help_lists_only_the_paths_bench_measures() {
    for flag in ["-h", "--help"] {
        let r = run(&["bench", flag]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        for other in ["cuda-staging", "gpudirect-rdma", "cuda-ipc", "nvlink"] {
            assert!(
                !r.stdout.contains(other),
                "{flag} offers {other}: {}",
                r.stdout
            );
        }
        for ok in ["rdma", "tcp", "local"] {
            assert!(r.stdout.contains(ok), "{flag}: {}", r.stdout);
        }
    }
    assert!(
        run(&["bench", "-h"])
            .stdout
            .contains("[possible values: rdma, tcp, local]")
    );
    assert_usage_error(
        &run(&["bench", "--path", "cuda-staging"]),
        &[
            "bench measures the rdma, tcp and local paths",
            "orbitte doctor --path cuda-staging",
        ],
    );
}

/// `serve` with `engine.epoch` pinned warns (in --check and at start)
/// that a restart presents the same epoch, and names engine.last_epoch.
#[test]
fn serve_warns_that_a_pinned_epoch_is_reused_by_a_restart() {
    let pinned = serve_check("[engine]\nsource_id = \"p\"\nlisten = \"127.0.0.1:0\"\nepoch = 5\n");
    assert_eq!(pinned.code, 0, "{}", pinned.stderr);
    let w = pinned
        .stdout
        .lines()
        .find(|l| l.contains("WARNING: engine.epoch is pinned to 5"))
        .unwrap_or_else(|| panic!("{}", pinned.stdout));
    for names in ["same incarnation", "engine.last_epoch", "read and write"] {
        assert!(w.contains(names), "{names}: {w}");
    }
    let chosen =
        serve_check("[engine]\nsource_id = \"p\"\nlisten = \"127.0.0.1:0\"\nlast_epoch = 5\n");
    assert_eq!(chosen.code, 0, "{}", chosen.stderr);
    assert!(!chosen.stdout.contains("pinned"), "{}", chosen.stdout);
}

/// `serve --check --json` prints the values the engine runs with, not
/// null, for the keys the file leaves out.
#[test]
fn serve_check_json_fills_in_the_defaults() {
    let f = config("[engine]\nsource_id = \"d\"\nlisten = \"127.0.0.1:0\"\n");
    let r = run(&[
        "serve",
        "--config",
        f.path().to_str().unwrap(),
        "--check",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = json(&r.stdout);
    let e = &v["config"]["engine"];
    assert_eq!(e["max_sessions"], 256, "{e}");
    assert_eq!(e["evict_idle_after_ms"], 1000, "{e}");
    for key in [
        "device",
        "port",
        "gid_index",
        "gid_type",
        "netdev",
        "link_layer",
    ] {
        assert_eq!(v["config"]["rdma"][key], "auto", "{key}: {v}");
    }
    assert_eq!(v["config"]["rdma"]["whitelist"], serde_json::json!([]));
    // What the file sets is what is printed.
    let f = config(
        "[engine]\nsource_id = \"d\"\nlisten = \"127.0.0.1:0\"\nmax_sessions = 7\nevict_idle_after_ms = 0\n",
    );
    let v = json(
        &run(&[
            "serve",
            "--config",
            f.path().to_str().unwrap(),
            "--check",
            "--json",
        ])
        .stdout,
    );
    assert_eq!(v["config"]["engine"]["max_sessions"], 7);
    assert_eq!(v["config"]["engine"]["evict_idle_after_ms"], 0);
}

/// `orbitte ARGS` started by `sh` after `limits` (ulimit commands), so
/// that the descriptor limits it inherits are the ones the test sets.
fn orbitte_under(limits: &str, args: &[&str]) -> Command {
    let plain = orbitte();
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg(format!("{limits} && exec \"$0\" \"$@\""))
        .arg(plain.get_program())
        .args(args);
    for (k, v) in plain.get_envs() {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    sh
}

/// The soft and hard "Max open files" of process `pid`.
fn open_files_limits(pid: u32) -> (String, String) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[3].to_owned(), f[4].to_owned())
}

/// `serve` raises its soft descriptor limit to the hard one at start and
/// logs both; when even the hard limit is below what its caps need, it
/// warns with the number and the fix.
#[test]
fn serve_raises_its_descriptor_limit_and_warns_when_the_hard_one_is_too_low() {
    let f = config("[engine]\nsource_id = \"fd\"\nlisten = \"127.0.0.1:0\"\n");
    let file = f.path().to_str().unwrap();
    let (soft, hard) = open_files_limits(std::process::id());
    assert!(
        hard == "unlimited" || hard.parse::<u64>().is_ok_and(|h| h > 64),
        "this test needs a hard limit above 64, not {hard} (soft {soft})"
    );
    let mut child = KillOnDrop(
        orbitte_under("ulimit -Sn 64", &["serve", "--config", file])
            .env("ORBITTE_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = child.0.stdout.take().unwrap();
    BufReader::new(out)
        .lines()
        .find_map(|l| l.ok().filter(|l| l.contains("serving as")))
        .expect("serve starts");
    let (soft_now, hard_now) = open_files_limits(child.0.id());
    assert_eq!(
        soft_now, hard_now,
        "the soft limit is raised to the hard one"
    );
    drop(child.0.stdout.take());
    let _ = child.0.kill();
    let _ = child.0.wait();
    let mut log = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut log).unwrap();
    assert!(
        log.contains(&format!(
            "descriptor limit: soft 64 -> {hard_now} (hard {hard_now})"
        )),
        "{log}"
    );
    // A hard limit below the need: the number and the fix, in --check.
    let r = run_cmd(&mut orbitte_under(
        "ulimit -Sn 100 && ulimit -Hn 128",
        &["serve", "--config", file, "--check"],
    ));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let w = r
        .stdout
        .lines()
        .find(|l| l.contains("WARNING: the descriptor limit is 128"))
        .unwrap_or_else(|| panic!("{}", r.stdout));
    for names in ["need up to 704", "ulimit -n 704", "LimitNOFILE=704"] {
        assert!(w.contains(names), "{names}: {w}");
    }
}

/// `serve` stops on SIGTERM: it drains, prints a last line with what it
/// served, and exits 0; `--report-every` prints throughput lines.
#[test]
fn serve_drains_on_sigterm_with_a_last_line_and_reports_throughput() {
    let f = config(
        "[engine]\nsource_id = \"term\"\nlisten = \"127.0.0.1:0\"\n\n[[range]]\nname = \"kv\"\nsize = \"2M\"\n",
    );
    let mut child = KillOnDrop(
        orbitte()
            .args([
                "serve",
                "--config",
                f.path().to_str().unwrap(),
                "--report-every",
                "0.2",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let wait = std::time::Duration::from_secs(20);
    let mut lines = Vec::new();
    let next = |lines: &mut Vec<String>| {
        let l = rx
            .recv_timeout(wait)
            .unwrap_or_else(|e| panic!("{e}: {lines:?}"));
        lines.push(l.clone());
        l
    };
    let addr = loop {
        let l = next(&mut lines);
        if l.starts_with("serving as") {
            break l
                .split_whitespace()
                .find(|w| w.starts_with("127.0.0.1:"))
                .unwrap()
                .trim_end_matches(';')
                .to_owned();
        }
    };
    let v = bench_json(&[
        "--role",
        "initiator",
        "--peer",
        &addr,
        "--path",
        "tcp",
        "--duration",
        "0.3",
    ]);
    assert_point_ok(&v["points"][0], false);
    // A throughput line that saw the bench's bytes.
    while !next(&mut lines).starts_with("throughput:")
        || lines
            .last()
            .is_some_and(|l| l.contains(" 0.0 MB/s served (0 bytes"))
    {}
    let killed = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + wait;
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "serve did not stop: {lines:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    while let Ok(l) = rx.recv_timeout(std::time::Duration::from_secs(5)) {
        lines.push(l);
    }
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("SIGTERM: shutting down")),
        "{lines:?}"
    );
    let last = lines.last().unwrap();
    assert!(last.starts_with("stopped after "), "{lines:?}");
    let served: u64 = last
        .split("served ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{last}"));
    assert!(served > 0, "{last}");
    assert!(
        last.contains("1 sessions admitted") || last.contains("sessions admitted"),
        "{last}"
    );
}

/// A second stop signal, while `serve` has not finished stopping, exits
/// at once with 128 + its number and no last line (SIGINT then SIGTERM:
/// two kinds, which the kernel never merges into one).
#[test]
fn a_second_stop_signal_exits_serve_at_once() {
    let f = config("[engine]\nsource_id = \"twice\"\nlisten = \"127.0.0.1:0\"\n");
    let mut child = KillOnDrop(
        orbitte()
            .args(["serve", "--config", f.path().to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    lines
        .by_ref()
        .find_map(|l| l.ok().filter(|l| l.starts_with("serving as")))
        .expect("serve starts");
    // The shell's own kill sends both within microseconds, long before
    // serve's loop (which looks every 50 ms) starts to stop.
    let sent = Command::new("sh")
        .args(["-c", "kill -INT $0; kill -TERM $0"])
        .arg(child.0.id().to_string())
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.0.wait().unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    // Both may be pending at once, and then handled in either order:
    // the exit status is that of the one handled second.
    assert!(
        [Some(128 + 2), Some(128 + 15)].contains(&status.code()),
        "{status:?} {rest:?}"
    );
    assert!(
        !rest.iter().any(|l| l.starts_with("stopped after")),
        "{rest:?}"
    );
}

/// A tcp bench initiator to `addr` that fails: its one-line error.
fn tcp_initiator_failure(addr: &str) -> String {
    let r = run(&[
        "bench",
        "--role",
        "initiator",
        "--peer",
        addr,
        "--path",
        "tcp",
        "--duration",
        "0.2",
    ]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    r.stderr.lines().last().unwrap_or_default().to_owned()
}

fn secret_file(dir: &Path) -> PathBuf {
    let f = dir.join("secret");
    std::fs::write(&f, b"0123456789abcdef0123456789abcdef").unwrap();
    f
}

/// A target with a cluster secret: an initiator without it is told that a
/// secret is needed (not that no target runs); with `--secret-file` (or
/// ORBITTE_SECRET_FILE) it passes.
#[test]
fn bench_passes_a_cluster_secret_and_says_when_one_is_needed() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path());
    let f = config(&format!(
        "[engine]\nsource_id = \"secret-serve\"\nlisten = \"127.0.0.1:0\"\ncluster_secret_file = {:?}\n[[range]]\nsize = \"1M\"\n",
        secret.to_str().unwrap()
    ));
    let (_serve, addr) = spawn_with_addr(
        &["serve", "--config", f.path().to_str().unwrap()],
        "serving as",
    );
    let last = tcp_initiator_failure(&addr);
    assert!(last.contains("requires the cluster secret"), "{last}");
    assert!(last.contains("--secret-file"), "{last}");
    assert!(!last.contains("check that"), "{last}");
    let v = bench_json(&[
        "--role",
        "initiator",
        "--peer",
        &addr,
        "--path",
        "tcp",
        "--duration",
        "0.2",
        "--secret-file",
        secret.to_str().unwrap(),
        "--check",
    ]);
    assert_point_ok(&v["points"][0], true);
    let r = run_cmd(
        orbitte()
            .args([
                "bench",
                "--role",
                "initiator",
                "--peer",
                &addr,
                "--path",
                "tcp",
            ])
            .args(["--duration", "0.2", "--json", "--quiet"])
            .env("ORBITTE_SECRET_FILE", &secret),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
}

/// Sizes are checked against this machine's memory before anything is
/// allocated: the error names the total and what is available.
#[test]
fn bench_sizes_beyond_this_machines_memory_are_refused_before_allocating() {
    let avail: u64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let l = m
                .lines()
                .find(|l| l.starts_with("MemAvailable:"))?
                .to_owned();
            l.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(u64::MAX, |k| k * 1024);
    if avail >= 192 << 30 {
        println!("skipped: this machine has 192 GiB available, enough for 1G x 64 in loopback");
        return;
    }
    let r = run(&["bench", "--block-size", "1G", "--batch-size", "64"]);
    assert_usage_error(
        &r,
        &[
            "block size 1G x batch size 64",
            "need 192 GiB",
            "available",
            "--block-size",
        ],
    );
}

#[test]
fn config_files_over_1_mib_are_refused() {
    let f = config(&"#".repeat((1 << 20) + 1));
    let r = run(&["serve", "--config", f.path().to_str().unwrap(), "--check"]);
    assert_usage_error(&r, &["is 1048577 bytes", "at most 1 MiB"]);
}

#[test]
fn a_chart_path_is_checked_before_the_sweep_and_needs_sweep() {
    let r = run(&[
        "bench",
        "--sweep",
        "--chart",
        "/nonexistent-dir/sweep.svg",
        "--duration",
        "0.1",
    ]);
    assert_usage_error(
        &r,
        &["--chart /nonexistent-dir/sweep.svg", "cannot write it"],
    );
    assert!(r.stdout.is_empty(), "nothing was measured: {}", r.stdout);
    let r = run(&["bench", "--chart", "x.svg", "--duration", "0.1"]);
    assert_usage_error(&r, &["--sweep"]);
    // A target's --sweep sizes its range; it draws (and creates) no chart.
    let r = run(&[
        "bench",
        "--role",
        "target",
        "--sweep",
        "--chart",
        "x.svg",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_usage_error(&r, &["--chart", "a target measures nothing"]);
}

#[test]
fn the_sweep_chart_marks_each_measured_point() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("sweep.svg");
    bench_json(&[
        "--duration",
        "0.05",
        "--sweep",
        "--chart",
        chart.to_str().unwrap(),
        "--batch-size",
        "2",
        "--no-baseline",
    ]);
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert_eq!(svg.matches("<circle").count(), 6, "{svg}");
    // Ticks at the measured sizes only.
    assert!(svg.contains(">16K<") && !svg.contains(">8K<"), "{svg}");
}

/// `serve` ranges with `fill = "pattern"` hold what a READ check expects;
/// other ranges make the check fail with the reason and the fix.
#[test]
fn bench_read_check_against_serve_passes_on_a_pattern_range_and_says_why_otherwise() {
    for (fill, ok) in [("fill = \"pattern\"\n", true), ("", false)] {
        let f = config(&format!(
            "[engine]\nsource_id = \"read-check\"\nlisten = \"127.0.0.1:0\"\n[[range]]\nsize = \"1M\"\n{fill}"
        ));
        let (_serve, addr) = spawn_with_addr(
            &["serve", "--config", f.path().to_str().unwrap()],
            "serving as",
        );
        let r = run(&[
            "bench",
            "--role",
            "initiator",
            "--peer",
            &addr,
            "--op",
            "read",
            "--check",
            "--duration",
            "0.2",
            "--quiet",
        ]);
        if ok {
            assert_eq!(r.code, 0, "{}", r.stderr);
        } else {
            assert_eq!(r.code, 1, "{}", r.stderr);
            let last = r.stderr.lines().last().unwrap_or_default();
            assert!(last.contains("data check failed"), "{last}");
            assert!(last.contains("fill = \"pattern\""), "{last}");
        }
    }
}

#[test]
fn bench_refuses_a_pinned_device_that_does_not_exist_like_serve() {
    let r = run_cmd(
        orbitte()
            .args(["bench", "--duration", "0.2", "--quiet"])
            .env("ORBITTE_RDMA_DEVICE", "mlx5_99"),
    );
    assert_usage_error(
        &r,
        &[
            "environment variable ORBITTE_RDMA_DEVICE",
            "no RDMA device named mlx5_99",
        ],
    );
}

#[test]
fn config_syntax_sizes_and_epochs_are_checked_as_documented() {
    let r = serve_check("[engine]\nsource_id = \"a\"\nlisten = \"127.0.0.1:0\" x\n");
    assert_usage_error(
        &r,
        &[
            "invalid toml at line 3, column 24",
            "`listen = \"127.0.0.1:0\" x`",
            "expected",
        ],
    );
    assert!(r.stderr.contains(".toml"), "names the file: {}", r.stderr);
    let r = serve_check("[engine]\nsource_id = \"a\"\n[[range]]\nsize = \"1T\"\n");
    assert_eq!(r.code, 0, "1T is the documented maximum: {}", r.stderr);
    assert_usage_error(
        &serve_check("[engine]\nsource_id = \"a\"\n[[range]]\nsize = \"2T\"\n"),
        &["key range.size", "at most 1T"],
    );
    assert_usage_error(
        &serve_check("[engine]\nsource_id = \"a\"\nepoch = 100\nlast_epoch = 200\n"),
        &["key engine.epoch", "not newer than engine.last_epoch 200"],
    );
}

// ---- etcd metadata ----

/// An etcd started on loopback for one test, stopped when dropped.
struct Etcd {
    child: KillOnDrop,
    url: String,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `None` (and a `skipped:` line) without an etcd binary, except under
/// CI=true, where the test fails.
fn start_etcd() -> Option<Etcd> {
    if Command::new("etcd").arg("--version").output().is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI must run the etcd tests: etcd not installed (apt-get install etcd-server)"
        );
        println!("skipped: etcd not installed");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let (c, p) = (
        format!("http://127.0.0.1:{client}"),
        format!("http://127.0.0.1:{peer}"),
    );
    let child = Command::new("etcd")
        .args(["--name", "cli-test", "--data-dir"])
        .arg(dir.path())
        .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
        .args([
            "--listen-peer-urls",
            &p,
            "--initial-advertise-peer-urls",
            &p,
        ])
        .args(["--initial-cluster", &format!("cli-test={p}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd");
    let etcd = Etcd {
        child: KillOnDrop(child),
        url: format!("etcd://127.0.0.1:{client}/orbitte/cli-test"),
        _dir: dir,
    };
    // Ready when it accepts connections.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
        assert!(std::time::Instant::now() < deadline, "etcd did not start");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = &etcd.child;
    Some(etcd)
}

/// Loopback through etcd: the target publishes its record, the initiator
/// finds it by source id.
#[test]
fn bench_loopback_finds_its_target_through_etcd() {
    let Some(etcd) = start_etcd() else { return };
    let v = bench_json(&[
        "--metadata",
        &etcd.url,
        "--source-id",
        "etcd-bench",
        "--duration",
        "0.2",
        "--check",
    ]);
    assert!(
        v["role_note"]
            .as_str()
            .is_some_and(|n| n.contains("loopback")),
        "{v}"
    );
    assert_peer(&v, "etcd-bench-target ");
    assert_point_ok(&v["points"][0], true);
}

/// `orbitte serve` with `engine.metadata` publishes itself; an initiator
/// names it by source id; an unknown name is one line with the fix.
#[test]
fn serve_publishes_to_etcd_and_initiators_name_it_by_source_id() {
    let Some(etcd) = start_etcd() else { return };
    let f = config(&format!(
        "[engine]\nsource_id = \"etcd-serve\"\nlisten = \"127.0.0.1:0\"\nmetadata = {:?}\n[[range]]\nsize = \"1M\"\nfill = \"pattern\"\n",
        etcd.url
    ));
    let (_serve, _addr) = spawn_with_addr(
        &["serve", "--config", f.path().to_str().unwrap()],
        "serving as",
    );
    let v = bench_json(&[
        "--role",
        "initiator",
        "--metadata",
        &etcd.url,
        "--peer",
        "etcd-serve",
        "--op",
        "read",
        "--check",
        "--duration",
        "0.2",
    ]);
    assert_peer(&v, "etcd-serve ");
    assert_point_ok(&v["points"][0], true);
    let r = run(&[
        "bench",
        "--role",
        "initiator",
        "--metadata",
        &etcd.url,
        "--peer",
        "nobody",
        "--duration",
        "0.2",
    ]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let last = r.stderr.lines().last().unwrap_or_default();
    assert!(last.contains("etcd has no engine named nobody"), "{last}");
}

#[test]
fn an_unreachable_etcd_is_one_line_naming_the_setting() {
    let url = format!("etcd://127.0.0.1:{}", free_port());
    let r = run(&["bench", "--metadata", &url, "--duration", "0.2"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let last = r.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("orbitte: --metadata: metadata service"),
        "{last}"
    );
    assert_usage_error(
        &run(&["bench", "--metadata", "zk://h:1"]),
        &["--metadata", "etcd://HOST:PORT"],
    );
}

#[test]
fn serve_closes_a_session_idle_longer_than_engine_idle_timeout_ms() {
    let f = config(
        "[engine]\nsource_id = \"idle-test\"\nlisten = \"127.0.0.1:0\"\nidle_timeout_ms = 300\n\n[[range]]\nsize = \"64K\"\n",
    );
    let (_serve, addr) = spawn_with_addr(
        &["serve", "--config", f.path().to_str().unwrap()],
        "serving as",
    );
    let engine = orbitte::EngineBuilder::new("idle-client".to_owned())
        .host_memory_without_rdma()
        .build()
        .expect("engine");
    let peer = engine
        .connect_with(
            addr.parse().unwrap(),
            orbitte::ConnectOptions::new().path(orbitte::PathKind::Tcp),
        )
        .expect("connect over tcp");
    let rails = |up: bool| {
        engine
            .peers()
            .iter()
            .filter(|p| p.id == peer.id())
            .flat_map(|p| p.rails.iter())
            .filter(|r| r.up == up)
            .map(|r| r.down_reason.clone().unwrap_or_default())
            .collect::<Vec<_>>()
    };
    assert!(!rails(true).is_empty(), "a fresh session is up");
    // The server closes it once it has been idle for 300 ms; wait far
    // longer than that before calling it a failure.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !rails(true).is_empty() && std::time::Instant::now() < give_up {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let down = rails(false);
    assert!(
        rails(true).is_empty() && down.iter().all(|r| r.contains("idle")),
        "every tcp rail closed by the server as idle: {down:?}"
    );
}

/// Without a cluster secret, `serve` warns (log and printed summary) when
/// other hosts can reach its listener, and says nothing on loopback.
#[test]
fn serve_without_a_secret_warns_only_when_other_hosts_reach_it() {
    let check = |listen: &str| {
        let f = config(&format!(
            "[engine]\nsource_id = \"open\"\nlisten = \"{listen}\"\n"
        ));
        let r = run_cmd(
            orbitte()
                .args(["serve", "--config", f.path().to_str().unwrap(), "--check"])
                .env("ORBITTE_LOG", "warn"),
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
        r
    };
    let open = check("0.0.0.0:0");
    for out in [&open.stdout, &open.stderr] {
        assert!(out.contains("no cluster secret"), "{out}");
        assert!(out.contains("engine.cluster_secret_file"), "{out}");
    }
    let lo = check("127.0.0.1:0");
    assert!(!lo.stdout.contains("no cluster secret"), "{}", lo.stdout);
    assert!(!lo.stderr.contains("no cluster secret"), "{}", lo.stderr);
}

/// Without `engine.listen`, `serve` listens on every interface only with a
/// cluster secret (from the config or ORBITTE_SECRET_FILE).
#[test]
fn serve_listens_beyond_this_host_by_default_only_with_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, [9u8; 32]).unwrap();
    let check = |env_secret: Option<&Path>| {
        let f = config("[engine]\nsource_id = \"default-listen\"\n");
        let mut cmd = orbitte();
        cmd.args(["serve", "--config", f.path().to_str().unwrap(), "--check"])
            .env_remove("ORBITTE_SECRET_FILE");
        if let Some(p) = env_secret {
            cmd.env("ORBITTE_SECRET_FILE", p);
        }
        let r = run_cmd(&mut cmd);
        assert_eq!(r.code, 0, "{}", r.stderr);
        r.stdout
    };
    let open = check(None);
    assert!(open.contains("listen 127.0.0.1:7400"), "{open}");
    let closed = check(Some(&secret));
    assert!(closed.contains("listen 0.0.0.0:7400"), "{closed}");
    assert!(!closed.contains("no cluster secret"), "{closed}");
    let missing = dir.path().join("missing");
    let f = config("[engine]\nsource_id = \"default-listen\"\n");
    let r = run_cmd(
        orbitte()
            .args(["serve", "--config", f.path().to_str().unwrap(), "--check"])
            .env("ORBITTE_SECRET_FILE", &missing),
    );
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.stderr.contains("ORBITTE_SECRET_FILE") && r.stderr.contains("missing"),
        "{}",
        r.stderr
    );
}
