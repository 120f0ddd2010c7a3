//! The plugin under NIXL's own agent: each test runs
//! `tests/python/nixl_plugin_check.py SCENARIO` (two processes, NIXL's
//! Python API) with every NIXL wheel found, and requires its "ok" line.
//!
//! It needs the plugin built with NIXL's entry point (`NIXL_INCLUDE_DIR`)
//! and a Python with `nixl_cu12` and numpy: `$ORBITTE_NIXL_PYTHON`, or the
//! venvs `target/nixl-venv-1.5.1` and `target/nixl-venv-1.4.0` (`pip install
//! --no-deps nixl-cu12==VERSION numpy`). Under `CI=true` a missing one fails
//! the test; elsewhere the test says what is missing and passes.
#![forbid(unsafe_code)]

mod common;

use common::{build_dir, built_plugin, missing, plugin_and_wheels, tail};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The longest a scenario may take (its transfers bound themselves at 60 s).
const SCENARIO_LIMIT: Duration = Duration::from_secs(240);

/// A plugin folder holding the OrbitTE plugin and the wheel's UCX plugin
/// (NIXL_PLUGIN_DIR replaces NIXL's own folder), one per wheel and
/// scenario: the scenarios run at once, and one relinking a folder
/// another reads would race it.
fn plugin_dir(label: &str, scenario: &str, libs: &Path) -> PathBuf {
    let dir = build_dir().join(format!(
        "nixl-plugins-{}-{scenario}",
        label.replace(' ', "-")
    ));
    std::fs::create_dir_all(&dir).expect("create the plugin folder under target/");
    for (link, to) in [
        ("libplugin_OrbitTE.so", built_plugin()),
        ("libplugin_UCX.so", libs.join("nixl/libplugin_UCX.so")),
    ] {
        let at = dir.join(link);
        let _ = std::fs::remove_file(&at);
        std::os::unix::fs::symlink(&to, &at).expect("link a plugin into the plugin folder");
    }
    dir
}

/// Runs `scenario` with every NIXL wheel found; returns its "ok" lines.
fn run(scenario: &str) -> Vec<String> {
    let mut oks = Vec::new();
    let Some(wheels) = plugin_and_wheels() else {
        return oks;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/nixl_plugin_check.py");
    for (label, python, libs) in wheels {
        let plugins = plugin_dir(&label, scenario, &libs);
        let metrics = plugins.join(format!("metrics-{scenario}.txt"));
        let _ = std::fs::remove_file(&metrics);
        let mut child = Command::new(&python)
            .arg(&script)
            .arg(scenario)
            .env("NIXL_PLUGIN_DIR", &plugins)
            // The wheel's UCX plugin finds its libraries there.
            .env("LD_LIBRARY_PATH", &libs)
            .env("ORBITTE_NIXL_METRICS_FILE", &metrics)
            // The scenarios ending in -tcp set it themselves.
            .env_remove("ORBITTE_NIXL_CMA")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start python");
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait for python") {
                break Some(s);
            }
            if start.elapsed() > SCENARIO_LIMIT {
                let _ = child.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let out = child.wait_with_output().expect("collect python's output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stderr_tail = tail(&stderr, 40);
        let Some(status) = status else {
            panic!(
                "{label} {scenario}: still running after {SCENARIO_LIMIT:?} (a hang)\n{stdout}\n{stderr_tail}"
            );
        };
        assert!(
            status.success() && stdout.contains(&format!("ok {scenario}")),
            "{label} {scenario}: {status}\n{stdout}\n{stderr_tail}"
        );
        for line in stdout.lines().filter(|l| l.starts_with("ok ")) {
            eprintln!("{label}: {line}");
            oks.push(line.to_owned());
        }
    }
    oks
}

/// Why the kernel refuses same-host copies here, with the fix, if it does.
fn cma_refused() -> Option<String> {
    orbitte_capi::same_host_copies_refused()
        .map(|why| format!("{why}: sysctl -w kernel.yama.ptrace_scope=0 (.ci/run sets it)"))
}

#[test]
fn write_and_read_by_initialize_xfer_and_prepared_lists_with_notifications() {
    // On one host the bytes take the kernel's same-host copies.
    if let Some(why) = cma_refused() {
        return missing(&why);
    }
    run("xfer");
}

#[test]
fn the_same_bytes_over_tcp_with_same_host_copies_turned_off() {
    run("xfer-tcp");
}

/// What an "ok dies..." line says happened, without its timing.
fn outcome(line: &str) -> &str {
    let said = line.split_once(": ").map_or(line, |(_, s)| s);
    said.split_once(" after ").map_or(said, |(s, _)| s)
}

#[test]
fn a_remote_agent_that_dies_gives_an_error_not_a_hang() {
    // Same-host copies (the default on one host) and the tcp path end
    // the same way.
    let cma = run("dies");
    let tcp = run("dies-tcp");
    let said = |lines: &[String]| {
        lines
            .iter()
            .map(|l| outcome(l).to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        said(&cma),
        said(&tcp),
        "a dead remote: {cma:?} against {tcp:?}"
    );
}

#[test]
fn against_a_ucx_only_agent_nixl_uses_ucx() {
    run("ucx-only");
}

#[test]
fn against_an_agent_with_both_orbitte_moves_the_bytes() {
    run("both");
}
