//! NIXL's own examples, run unmodified with the plugin chosen.
//!
//! The C++ example `nixl_example`, which the `nixl-cu12` wheels ship, takes
//! its backend as its argument: it runs with `OrbitTE` under every wheel the
//! plugin's other tests use (`target/nixl-venv-1.5.1`, `target/nixl-venv-
//! 1.4.0`, or `$ORBITTE_NIXL_PYTHON`).
//!
//! The Python examples are NIXL's `examples/python` at v1.4.0, which no
//! wheel ships, kept outside the project: `$NIXL_EXAMPLES_DIR`, or
//! `../shared/third_party/nixl-1.4.0/examples/python` beside the workspace.
//! Each file is checked against its v1.4.0 digest, so the test runs exactly
//! NIXL's code. Of those on host memory, only `expanded_two_peers.py` lets
//! its caller choose the backend (`--backend`): the test runs its target and
//! initiator as two processes with `--backend OrbitTE`. The others name UCX
//! themselves or need no network backend (docs/nixl-plugin.md lists why).
//! They need a Python with the `nixl` and `nixl-cu12` packages, torch and
//! numpy: `$ORBITTE_NIXL_EXAMPLES_PYTHON`, or the venv
//! `target/nixl-venv-examples`; they run again with nixl 1.4.0 from
//! `target/nixl-examples-1.4.0` first on PYTHONPATH.
//!
//! Every run uses a plugin folder that holds OrbitTE's plugin alone, and
//! requires the example's own success lines, a clean exit, and the plugin
//! engine's metrics counting exactly the bytes the example moves. All need
//! the plugin built with NIXL's entry point (`NIXL_INCLUDE_DIR`). Under
//! `CI=true` a missing piece fails the test; elsewhere the test says what is
//! missing and passes. The Python examples' tests are ignored by default:
//! neither NIXL's source nor a CUDA-12 torch (about 7 GB) is on a package
//! index CI reaches; `cargo test -p orbitte-nixl --test nixl_examples --
//! --ignored` runs them where both are.
#![forbid(unsafe_code)]

mod common;

use common::{build_dir, built_plugin, missing, plugin_and_wheels, plugin_built, tail};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest one example may take (it runs in a few seconds).
const EXAMPLE_LIMIT: Duration = Duration::from_secs(240);

/// The longest the target may take to start its agent (torch's import
/// included).
const START_LIMIT: Duration = Duration::from_secs(120);

/// NIXL's `examples/python`, as the test expects it.
struct Example {
    file: &'static str,
    /// sha256 of the file at NIXL v1.4.0.
    sha256: &'static str,
}

const EXPANDED_TWO_PEERS: Example = Example {
    file: "expanded_two_peers.py",
    sha256: "693b7fbd279c5ecf9ece3fee7edd81099a07aaf92e2e0c7f120a1b50c13ff86d",
};

/// The host-memory examples that choose their backend themselves, each
/// with what keeps it from running on the plugin unmodified.
const NOT_RUNNABLE: [(Example, &str); 2] = [
    (
        Example {
            file: "basic_two_peers.py",
            sha256: "df9e3b63b7b6438209ed72bd2d77bb0626644043079b84601cc5b7173236d26a",
        },
        // NIXL's default backend list, ["UCX"].
        "nixl_agent_config(True, True, listen_port)\n",
    ),
    (
        Example {
            file: "partial_md_example.py",
            sha256: "9ab8d1fd40b8ee92cb1dc293e96a2f08350b52a4459eb816dd86304bfa3ff954",
        },
        "[\"UCX\"]",
    ),
];

/// Bytes the example's initiator moves: four prepared READs of three
/// 128-byte rows, posted twice, and two WRITEs of two 64-byte halves.
const READ_BYTES: u64 = 2 * 4 * 3 * 128;
const WRITE_BYTES: u64 = 2 * 2 * 64;

/// The folder of NIXL's Python examples, or why there is none.
fn examples_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("NIXL_EXAMPLES_DIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        return if dir.join(EXPANDED_TWO_PEERS.file).is_file() {
            Ok(dir)
        } else {
            Err(format!(
                "NIXL_EXAMPLES_DIR={} holds no {}: name NIXL's examples/python folder",
                dir.display(),
                EXPANDED_TWO_PEERS.file
            ))
        };
    }
    let beside = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/third_party/nixl-1.4.0/examples/python");
    if beside.join(EXPANDED_TWO_PEERS.file).is_file() {
        Ok(beside)
    } else {
        Err(format!(
            "NIXL's Python examples are not at {} and NIXL_EXAMPLES_DIR is not set: \
             take examples/python of NIXL's source at tag v1.4.0",
            beside.display()
        ))
    }
}

/// The Python to run the examples with, or why there is none.
fn python() -> Result<PathBuf, String> {
    let python = match std::env::var_os("ORBITTE_NIXL_EXAMPLES_PYTHON").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => build_dir().join("../nixl-venv-examples/bin/python"),
    };
    let usable = Command::new(&python)
        .args(["-c", "import nixl, nixl_cu12, numpy, torch"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if usable {
        Ok(python)
    } else {
        Err(format!(
            "{} cannot import nixl, nixl_cu12, numpy and torch: set ORBITTE_NIXL_EXAMPLES_PYTHON, \
             or create target/nixl-venv-examples (python3 -m venv target/nixl-venv-examples && \
             target/nixl-venv-examples/bin/pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1 && \
             target/nixl-venv-examples/bin/pip install numpy torch==2.9.1)",
            python.display()
        ))
    }
}

/// The examples' folder and the Python to run them, or None once
/// `missing` said what is not there.
fn examples_and_python() -> Option<(PathBuf, PathBuf)> {
    match examples_dir().and_then(|dir| Ok((dir, python()?))) {
        Ok(found) => Some(found),
        Err(why) => {
            missing(&why);
            None
        }
    }
}

/// Fails unless `dir/example.file` is NIXL v1.4.0's file, byte for byte.
fn check_unmodified(python: &Path, dir: &Path, example: &Example) -> String {
    let path = dir.join(example.file);
    let out = Command::new(python)
        .args([
            "-c",
            "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())",
        ])
        .arg(&path)
        .output()
        .expect("run python to hash the example");
    let digest = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(
        digest,
        example.sha256,
        "{} is not NIXL v1.4.0's {}: the test runs NIXL's examples unmodified; \
         point NIXL_EXAMPLES_DIR at examples/python of NIXL's v1.4.0 tag",
        path.display(),
        example.file
    );
    std::fs::read_to_string(&path).expect("read the example")
}

/// A plugin folder holding the OrbitTE plugin alone: no other backend can
/// move the example's bytes.
fn orbitte_only_plugin_dir(name: &str) -> PathBuf {
    let dir = build_dir().join(format!("nixl-plugins-{}", name.replace(' ', "-")));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the plugin folder under target/");
    std::os::unix::fs::symlink(built_plugin(), dir.join("libplugin_OrbitTE.so"))
        .expect("link the plugin into the plugin folder");
    dir
}

/// A port free on the loopback now, for the example's target to listen on.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

/// Collects a pipe's text on a thread.
fn collect(mut pipe: impl Read + Send + 'static) -> (Arc<Mutex<String>>, JoinHandle<()>) {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&text);
    let reader = std::thread::spawn(move || {
        let mut lines = BufReader::new(&mut pipe);
        let mut line = String::new();
        while lines.read_line(&mut line).is_ok_and(|n| n > 0) {
            sink.lock().expect("output lock").push_str(&line);
            line.clear();
        }
    });
    (text, reader)
}

/// One side of the example, running.
struct Side {
    role: &'static str,
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

impl Side {
    /// Starts `cmd` with its output collected.
    fn spawn(role: &'static str, mut cmd: Command) -> Self {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        let (stdout, out_reader) = collect(child.stdout.take().expect("piped stdout"));
        let (stderr, err_reader) = collect(child.stderr.take().expect("piped stderr"));
        Self {
            role,
            child,
            stdout,
            stderr,
            readers: vec![out_reader, err_reader],
        }
    }

    /// One side of `expanded_two_peers.py` with `--backend OrbitTE`.
    fn start(
        python: &Path,
        script: &Path,
        role: &'static str,
        port: u16,
        env: &[(&str, &Path)],
    ) -> Self {
        let mut cmd = Command::new(python);
        cmd.arg(script)
            .args(["--mode", role, "--ip", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .args(["--backend", "OrbitTE"])
            .env("PYTHONUNBUFFERED", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self::spawn(role, cmd)
    }

    fn stdout(&self) -> String {
        self.stdout.lock().expect("output lock").clone()
    }

    /// Waits until the side exits, or kills it past `deadline`.
    fn wait(&mut self, deadline: Instant) -> Option<ExitStatus> {
        loop {
            if let Some(s) = self.child.try_wait().expect("wait for the example") {
                return Some(s);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its whole output, once it ended.
    fn output(mut self) -> (String, String) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        (
            self.stdout(),
            self.stderr.lock().expect("output lock").clone(),
        )
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Bytes the plugin copied with same-host peers through the kernel,
/// (read, write).
fn same_host_bytes(metrics: &str) -> (u64, u64) {
    let count = |op: &str| {
        let key = format!("orbitte_capi_cma_bytes_total{{op=\"{op}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .map_or(0, |v| {
                v.trim()
                    .parse::<f64>()
                    .unwrap_or_else(|_| panic!("a metrics line without a number: {key}{v}"))
                    as u64
            })
    };
    (count("read"), count("write"))
}

/// Bytes the plugin engine counted for its own requests, by op.
fn initiator_bytes(metrics: &str) -> (u64, u64) {
    let (mut read, mut write) = (0, 0);
    for line in metrics.lines().filter(|l| {
        l.starts_with("orbitte_transfer_bytes_total{") && l.contains("side=\"initiator\"")
    }) {
        let n = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("a metrics line without a number: {line}"))
            as u64;
        if line.contains("op=\"read\"") {
            read += n;
        } else if line.contains("op=\"write\"") {
            write += n;
        }
    }
    (read, write)
}

/// The `nixl-cu12` version `python` imports with `pythonpath` first.
fn nixl_version(python: &Path, pythonpath: Option<&Path>) -> String {
    let mut cmd = Command::new(python);
    cmd.args([
        "-c",
        "import importlib.metadata as m, nixl; print(m.version('nixl-cu12'))",
    ]);
    if let Some(p) = pythonpath {
        cmd.env("PYTHONPATH", p);
    }
    let out = cmd.output().expect("run python to ask nixl's version");
    assert!(
        out.status.success(),
        "{} cannot import nixl (PYTHONPATH {pythonpath:?}): {}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Where 1.4.0's `nixl` and `nixl-cu12` lie for PYTHONPATH (`pip install
/// --no-deps --target`), so the examples' venv runs them instead of its own.
fn nixl_1_4_0() -> PathBuf {
    build_dir().join("../nixl-examples-1.4.0")
}

#[test]
#[ignore = "needs NIXL's Python examples (v1.4.0 source, NIXL_EXAMPLES_DIR) and a venv with torch, which no package index CI reaches ships; run with --ignored"]
fn expanded_two_peers_runs_unmodified_with_backend_orbitte() {
    if !plugin_built() {
        return;
    }
    let Some((dir, python)) = examples_and_python() else {
        return;
    };
    check_unmodified(&python, &dir, &EXPANDED_TWO_PEERS);
    run_expanded_two_peers(&dir, &python, None);
    let overlay = nixl_1_4_0();
    if overlay.join("nixl_cu12").is_dir() {
        assert_eq!(nixl_version(&python, Some(&overlay)), "1.4.0");
        run_expanded_two_peers(&dir, &python, Some(&overlay));
    } else {
        missing(&format!(
            "nixl 1.4.0 is not at {}: target/nixl-venv-examples/bin/pip install --no-deps \
             --target target/nixl-examples-1.4.0 nixl==1.4.0 nixl-cu12==1.4.0",
            overlay.display()
        ));
    }
}

/// Runs the example's target and initiator with `--backend OrbitTE`, with
/// `pythonpath` first on their path.
fn run_expanded_two_peers(dir: &Path, python: &Path, pythonpath: Option<&Path>) {
    let version = nixl_version(python, pythonpath);
    let plugins = orbitte_only_plugin_dir(&format!("examples-python-{version}"));
    let script = dir.join(EXPANDED_TWO_PEERS.file);
    let target_metrics = plugins.join("metrics-target.txt");
    let init_metrics = plugins.join("metrics-initiator.txt");
    let port = free_port();

    // The target listens first (NIXL's listener thread starts with its
    // agent, before the example logs its tensor); then the initiator.
    let start = |role, metrics: &Path| {
        // Over tcp, whose counters show exactly the example's bytes (the
        // kernel copies between same-host agents are the C example's).
        let mut env = vec![
            ("NIXL_PLUGIN_DIR", plugins.as_path()),
            ("ORBITTE_NIXL_METRICS_FILE", metrics),
            ("ORBITTE_NIXL_CMA", Path::new("0")),
        ];
        env.extend(pythonpath.map(|p| ("PYTHONPATH", p)));
        Side::start(python, &script, role, port, &env)
    };
    let mut target = start("target", &target_metrics);
    let started = Instant::now();
    while !target.stdout().contains("Running test with tensor shape") {
        if let Some(status) = target.child.try_wait().expect("wait for the target") {
            let (out, err) = target.output();
            panic!(
                "nixl-cu12 {version}: the example's target ended at start: {status}\n{out}\n{}",
                tail(&err, 40)
            );
        }
        assert!(
            started.elapsed() < START_LIMIT,
            "the example's target did not start its agent within {START_LIMIT:?}\n{}",
            target.stdout()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut initiator = start("initiator", &init_metrics);

    let deadline = Instant::now() + EXAMPLE_LIMIT;
    let init_status = initiator.wait(deadline);
    // A target whose initiator failed waits for notifications that never
    // come: it gets a short while to end.
    let target_deadline = if init_status.is_some_and(|s| s.success()) {
        deadline
    } else {
        deadline.min(Instant::now() + Duration::from_secs(10))
    };
    let target_status = target.wait(target_deadline);
    let mut report = String::new();
    let mut outputs = Vec::new();
    for (side, status) in [(initiator, init_status), (target, target_status)] {
        let role = side.role;
        let (out, err) = side.output();
        report.push_str(&format!(
            "--- {role}: {}\n{out}{}\n",
            status.map_or("still running after the limit (a hang)".into(), |s| s
                .to_string()),
            tail(&err, 30)
        ));
        outputs.push((role, status, out));
    }
    for (role, status, out) in &outputs {
        let passed = match *role {
            "initiator" => "Initiator final data verification passed",
            _ => "Target data verification passed",
        };
        assert!(
            status.is_some_and(|s| s.success()) && out.contains(passed) && !out.contains(" ERROR "),
            "nixl-cu12 {version}: the example's {role} did not pass\n{report}"
        );
        assert!(
            out.contains("Initialized NIXL agent"),
            "the example's {role} made no agent\n{report}"
        );
    }

    // OrbitTE moved every byte: it is the only plugin the agents could load,
    // and its engine counted exactly what the example moves.
    let metrics = std::fs::read_to_string(&init_metrics).unwrap_or_else(|e| {
        panic!(
            "the plugin wrote no metrics at {}: {e}\n{report}",
            init_metrics.display()
        )
    });
    assert_eq!(
        initiator_bytes(&metrics),
        (READ_BYTES, WRITE_BYTES),
        "the plugin engine's bytes (read, write) are not the example's\n{metrics}"
    );
    eprintln!(
        "ok: nixl-cu12 {version}: NIXL's {} with --backend OrbitTE: both sides verified, the plugin engine read {READ_BYTES} and wrote {WRITE_BYTES} bytes",
        EXPANDED_TWO_PEERS.file
    );
}

#[test]
#[ignore = "needs NIXL's Python examples (v1.4.0 source, NIXL_EXAMPLES_DIR); run with --ignored"]
fn the_other_host_memory_examples_name_their_backend_themselves() {
    let Some((dir, python)) = examples_and_python() else {
        return;
    };
    for (example, names) in &NOT_RUNNABLE {
        let text = check_unmodified(&python, &dir, example);
        assert!(
            !text.contains("\"--backend\""),
            "{} now takes --backend: run it with the plugin, and list it as runnable",
            example.file
        );
        assert!(
            text.contains(names),
            "{} no longer has {names}: see whether it runs with the plugin",
            example.file
        );
    }
}

/// The dynamic loader that starts the wheel's example: pip installs it
/// without the execute bit.
const LOADER: &str = "/lib64/ld-linux-x86-64.so.2";

/// NIXL's C++ example `nixl_example`, which every `nixl-cu12` wheel ships
/// in `nixl_cu12.scripts/`, takes its backend as its first argument: two
/// agents in one process, one WRITE with a notification.
#[test]
fn the_wheels_nixl_example_runs_unmodified_with_backend_orbitte() {
    let Some(wheels) = plugin_and_wheels() else {
        return;
    };
    if !Path::new(LOADER).is_file() {
        return missing(&format!(
            "no dynamic loader at {LOADER} to start NIXL's example"
        ));
    }
    for (label, _, libs) in wheels {
        let site = libs.parent().expect("nixl_cu12.libs lies in site-packages");
        let example = site.join("nixl_cu12.scripts/nixl_example");
        assert!(
            example.is_file(),
            "{label}: the wheel has no {}",
            example.display()
        );
        // Its two agents share a process, so the plugin copies through
        // the kernel (same host); with that turned off, over tcp.
        for cma in ["1", "0"] {
            let plugins = orbitte_only_plugin_dir(&format!("cpp-example-{label}-cma{cma}"));
            let metrics = plugins.join("metrics.txt");
            let mut cmd = Command::new(LOADER);
            cmd.arg(&example)
                .arg("OrbitTE")
                .env("NIXL_PLUGIN_DIR", &plugins)
                // libnixl.so and the libraries it needs.
                .env(
                    "LD_LIBRARY_PATH",
                    std::env::join_paths([site.join(".nixl_cu12.mesonpy.libs"), libs.clone()])
                        .expect("library folders join"),
                )
                .env("ORBITTE_NIXL_METRICS_FILE", &metrics)
                .env("ORBITTE_NIXL_CMA", cma);
            let mut side = Side::spawn("nixl_example", cmd);
            let status = side.wait(Instant::now() + EXAMPLE_LIMIT);
            let (out, err) = side.output();
            let report = format!(
                "{label} nixl_example: {status:?}\n{out}\n{}",
                tail(&err, 30)
            );
            assert!(
                status.is_some_and(|s| s.success())
                    && out.contains("Using backend: OrbitTE")
                    && out.contains("Transfer verified")
                    && out.contains("Test done"),
                "NIXL's example did not pass\n{report}"
            );
            let counted = std::fs::read_to_string(&metrics).unwrap_or_else(|e| {
                panic!(
                    "the plugin wrote no metrics at {}: {e}\n{report}",
                    metrics.display()
                )
            });
            // Its one WRITE of 8 bytes, through the kernel or over tcp.
            let moved = if cma == "1" {
                same_host_bytes(&counted)
            } else {
                initiator_bytes(&counted)
            };
            assert_eq!(
                moved,
                (0, 8),
                "ORBITTE_NIXL_CMA={cma}: the plugin's bytes (read, write) are not the example's\n{counted}"
            );
        }
        eprintln!("ok: {label}: NIXL's nixl_example OrbitTE: the plugin engine wrote its 8 bytes");
    }
}
