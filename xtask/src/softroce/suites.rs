//! `cargo xtask softroce test`: the native test suites, built on the host
//! and run inside the guest against rxe0.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::host::{find_tool, secs};
use super::{guest, image};

/// Which target of a package a suite is.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// The library's unit tests.
    #[allow(dead_code)] // no suite is a unit test today; kept for the ones that will be
    Lib,
    /// An integration test (`tests/NAME.rs`), run with the test arguments
    /// given to `softroce test`.
    Test(&'static str),
    /// A binary run with `args`: passes when it exits 0 and its output
    /// contains every string of `expect`.
    Bin {
        name: &'static str,
        args: &'static [&'static str],
        expect: &'static [&'static str],
    },
    /// A shell snippet (POSIX sh) run with `$BIN` set to the package's
    /// binary `name`: passes when it exits 0. For what one command cannot
    /// show: two processes, output that must be counted.
    Script {
        name: &'static str,
        /// What it shows, for the report.
        label: &'static str,
        script: &'static str,
    },
    /// A Python script (workspace-relative path) run by the guest's python3
    /// with the package's wheel unpacked onto PYTHONPATH: passes when it
    /// exits 0 and its output contains every string of `expect`. The wheel
    /// is not built by cargo: see [`wheel`].
    Python {
        script: &'static str,
        label: &'static str,
        expect: &'static [&'static str],
    },
}

/// A test binary honouring `ORBITTE_TEST_DEVICE`, or a command, that the
/// guest runs against rxe0.
#[derive(Debug)]
struct Suite {
    package: &'static str,
    target: Target,
}

impl Suite {
    /// The cargo flags selecting the target, cargo's kind and name for it,
    /// and whether `cargo test --no-run` (rather than `cargo build`) builds it.
    fn cargo_target(&self) -> (Vec<String>, &'static str, String, bool) {
        match self.target {
            Target::Lib => (
                vec!["--lib".into()],
                "lib",
                self.package.replace('-', "_"),
                true,
            ),
            Target::Test(t) => (vec!["--test".into(), t.into()], "test", t.into(), true),
            Target::Bin { name, .. } | Target::Script { name, .. } => {
                (vec!["--bin".into(), name.into()], "bin", name.into(), false)
            }
            Target::Python { script, .. } => (Vec::new(), "python", script.into(), false),
        }
    }

    fn label(&self) -> String {
        match self.target {
            Target::Lib => format!("{} (unit tests)", self.package),
            Target::Test(t) => format!("{} tests/{t}.rs", self.package),
            Target::Bin { name, args, .. } => {
                format!("{} `{name} {}`", self.package, args.join(" "))
            }
            Target::Script { name, label, .. } => format!("{} `{name}`: {label}", self.package),
            Target::Python { script, label, .. } => {
                format!("{} `python3 {script}`: {label}", self.package)
            }
        }
    }

    /// The shell condition that runs the suite in the guest and is true
    /// when it passed: it exited 0, its output has every expected string,
    /// and no line of its output says `skipped:` (in the guest every native
    /// test must run; a test binary runs with `--show-output` so that the
    /// output of passing tests, where a skip is printed, is shown). For a
    /// Python suite `exe` is the wheel.
    fn check(&self, exe: &str, test_args: &[String]) -> String {
        let exe = quote(exe);
        let (command, expect) = match self.target {
            Target::Lib | Target::Test(_) => {
                let args: String = test_args.iter().map(|a| format!(" {}", quote(a))).collect();
                (format!("{exe}{args} --show-output"), &[][..])
            }
            Target::Bin { args, expect, .. } => {
                let args: String = args.iter().map(|a| format!(" {}", quote(a))).collect();
                (format!("{exe}{args}"), expect)
            }
            Target::Script { script, .. } => {
                (format!("BIN={exe} sh -c {}", quote(script)), &[][..])
            }
            Target::Python { script, expect, .. } => {
                let script = crate::workspace::root().join(script);
                (
                    format!(
                        "WHEEL={exe} SCRIPT={} sh -c {}",
                        quote(&script.to_string_lossy()),
                        quote(PYTHON_WITH_WHEEL)
                    ),
                    expect,
                )
            }
        };
        // The output streams as it comes (tee) and is kept in a file of its
        // own for the checks; the exit status travels through a second file
        // (POSIX sh has no pipefail).
        let mut check = format!(
            "{{ o=$(mktemp /tmp/softroce-out.XXXXXX); \
             {{ {command}; echo $? > \"$o.rc\"; }} 2>&1 | tee \"$o\"; \
             ok=$(cat \"$o.rc\" 2>/dev/null || echo 1); "
        );
        for e in expect {
            let missing = quote(&format!("softroce: the output lacks `{e}`"));
            let _ = write!(
                check,
                "grep -qF -- {} \"$o\" || {{ echo {missing}; ok=1; }}; ",
                quote(e)
            );
        }
        let skipped = quote(&format!(
            "softroce: `{SKIP_MARK}` in the output above: in the guest every native test must \
             run ({SKIP_RULE})"
        ));
        let _ = write!(
            check,
            "! grep -qF -- {} \"$o\" || {{ echo {skipped}; ok=1; }}; \
             rm -f \"$o\" \"$o.rc\"; [ \"$ok\" = 0 ]; }}",
            quote(SKIP_MARK)
        );
        check
    }
}

/// What a test prints when it does not run (docs/testing.md, "Skips").
const SKIP_MARK: &str = "skipped:";

/// Why a skip fails a suite in the guest, for its message.
const SKIP_RULE: &str =
    "ORBITTE_TEST_DEVICE=rxe0 is set and rxe0 is up; see docs/testing.md, Skips";

/// The native suites, in the order the guest runs them. Add a line when a
/// crate gains tests or a command that talk to a real verbs device. An
/// entry whose target does not exist yet is reported as missing, not built.
const NATIVE_SUITES: &[Suite] = &[
    Suite {
        package: "orbitte-verbs-sys",
        target: Target::Test("library"),
    },
    Suite {
        package: "orbitte-verbs",
        target: Target::Test("native"),
    },
    // The same scenarios on the sim and on rxe0, with the documented
    // differences (docs/verbs.md "Sim versus rxe").
    Suite {
        package: "orbitte-verbs",
        target: Target::Test("scenarios"),
    },
    // Two engines in two processes on the native provider: Host Direct registrations, open_peer / accept_peer over a TCP
    // control link, a mixed batch of WRITE and READ requests and a READ-back
    // batch over rxe0 loopback, every byte and every outcome field checked,
    // both engines shut down without anything Unquiesced.
    Suite {
        package: "orbitte-engine",
        target: Target::Test("native_rdma"),
    },
    // `orbitte doctor`: the rdma path's build, discovery, completion (a real
    // loopback WRITE and READ on rxe0) and drain checks all pass.
    Suite {
        package: "orbitte-cli",
        target: Target::Script {
            name: "orbitte",
            label: "doctor --path rdma --json: build, discovery, completion and drain pass",
            script: DOCTOR_RDMA,
        },
    },
    // The CLI's topology from sysfs: rxe0, its active port and its GIDs
    // (RoCE v2 on eth0, the IPv4-mapped one selected).
    Suite {
        package: "orbitte-cli",
        target: Target::Bin {
            name: "orbitte",
            args: &["topology"],
            expect: &[
                "rxe0",
                "port 1 ACTIVE",
                "::ffff:10.0.2.15 RoCE v2 on eth0",
                "selected nic 0 rxe0 port 1",
            ],
        },
    },
    // The CLI's topology on rxe0, after one Host Direct registration through
    // the native provider.
    Suite {
        package: "orbitte-cli",
        target: Target::Bin {
            name: "orbitte",
            args: &["topology", "--initialize"],
            expect: &["rxe0", "RoCE v2"],
        },
    },
    // Two engines (one process, loopback over rxe0) moving checked bytes
    // through the rdma path: Host Direct registration, batches of WRITE and
    // of READ, every request drained (two processes once the CLI has the
    // control link for rdma). Correctness only: the rate
    // under emulation means nothing.
    Suite {
        package: "orbitte-cli",
        target: Target::Bin {
            name: "orbitte",
            args: &[
                "bench",
                "--path",
                "rdma",
                "--op",
                "write",
                "--block-size",
                "4K",
                "--batch-size",
                "4",
                "--duration",
                "1",
                "--check",
                "--no-baseline",
            ],
            expect: &["all drained", "check passed"],
        },
    },
    Suite {
        package: "orbitte-cli",
        target: Target::Bin {
            name: "orbitte",
            args: &[
                "bench",
                "--path",
                "rdma",
                "--op",
                "read",
                "--block-size",
                "4K",
                "--batch-size",
                "4",
                "--duration",
                "1",
                "--check",
                "--no-baseline",
            ],
            expect: &["all drained", "check passed"],
        },
    },
    // The same through two processes: `orbitte bench --role target --path
    // rdma` and two initiators after it (READ while the target still holds
    // its initial pattern, then WRITE), each over its own control link.
    Suite {
        package: "orbitte-cli",
        target: Target::Script {
            name: "orbitte",
            label: "bench --role target / --role initiator --path rdma --check (read, write)",
            script: BENCH_TWO_PROCESSES,
        },
    },
    // The Python package on the rdma path: the orbitte wheel unpacked in
    // the guest, a target process (Host Direct registration on rxe0) and an
    // initiator through orbitte.Engine (WRITE with a notification, READ
    // back, the peer's path must be rdma: a fall back to tcp fails) and
    // through orbitte.mooncake.TransferEngine with protocol "rdma"
    // (transfer_sync_write/read and the batch calls) and through
    // orbitte.nixl's agent API (WRITE by prepared lists with a
    // notification, READ by initialize_xfer, send_notif), every byte
    // checked.
    Suite {
        package: "orbitte-py",
        target: Target::Python {
            script: "crates/orbitte-py/tests/rdma_guest.py",
            label: "the wheel on rxe0: Engine, mooncake.TransferEngine and nixl_agent, two processes, path rdma",
            expect: &[
                "rdma-guest: engine: ok",
                "rdma-guest: mooncake: ok",
                "rdma-guest: nixl: ok",
                "rdma-guest: all checks passed",
            ],
        },
    },
];

/// Unpacks `$WHEEL` (the orbitte wheel) into a fresh folder and runs
/// `$SCRIPT` with python3 and that folder first on PYTHONPATH: the guest
/// has no network, so no pip; a wheel is a zip of the installed files.
const PYTHON_WITH_WHEEL: &str = r#"command -v python3 >/dev/null || {
    echo "softroce: the guest image has no python3; rebuild it: cargo xtask softroce build --rebuild"
    exit 1
}
site=$(mktemp -d /tmp/orbitte-wheel.XXXXXX) || exit 1
python3 -m zipfile -e "$WHEEL" "$site" || { echo "softroce: cannot unpack $WHEEL"; exit 1; }
echo "softroce: $(python3 --version) with $(basename "$WHEEL") unpacked into $site"
PYTHONPATH="$site" python3 -u "$SCRIPT"
"#;

/// `orbitte doctor --path rdma --json` exits 0 (the path works) and its one
/// row has four passing checks and `"works": true`.
const DOCTOR_RDMA: &str = r#"out=/tmp/softroce-doctor.json
"$BIN" doctor --path rdma --json >"$out" 2>&1
r=$?
cat "$out"
[ $r = 0 ] || { echo "softroce: doctor exited with $r"; exit 1; }
for check in build discovery completion drain; do
    if ! grep -A1 "\"$check\": {" "$out" | grep -q '"status": "pass"'; then
        echo "softroce: the rdma $check check does not pass"
        exit 1
    fi
done
grep -q '"works": true' "$out" || { echo 'softroce: the rdma row lacks "works": true'; exit 1; }
"#;

/// A bench target in the background (killed on exit), then one initiator
/// per op, each passing on exit 0, `all drained` and `check passed`.
const BENCH_TWO_PROCESSES: &str = r#"sizes="--block-size 4K --batch-size 4"
out=/tmp/softroce-target.out
"$BIN" bench --role target --path rdma --listen 127.0.0.1:0 $sizes >"$out" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
i=0
until grep -q '^listening on ' "$out"; do
    if ! kill -0 $pid 2>/dev/null; then
        cat "$out"; echo "softroce: the bench target exited before listening"; exit 1
    fi
    i=$((i + 1))
    if [ $i -gt 1200 ]; then
        cat "$out"; echo "softroce: the bench target did not listen within 120 s"; exit 1
    fi
    sleep 0.1
done
addr=$(sed -n 's/^listening on \([^ ]*\) .*/\1/p' "$out")
echo "softroce: target process $pid: $(head -n 1 "$out")"
for op in read write; do
    init=/tmp/softroce-initiator.out
    "$BIN" bench --role initiator --peer "$addr" --path rdma --op $op $sizes \
        --duration 1 --check --no-baseline >"$init" 2>&1
    r=$?
    cat "$init"
    [ $r = 0 ] || { echo "softroce: the $op initiator exited with $r"; exit 1; }
    for want in 'all drained' 'check passed'; do
        grep -qF "$want" "$init" || { echo "softroce: the $op initiator's output lacks \`$want\`"; exit 1; }
    done
done
kill -0 $pid 2>/dev/null || { cat "$out"; echo "softroce: the bench target died"; exit 1; }
"#;

/// The guest's smoke check, run before the suites: rxe0 exists, its port is
/// active and it has a RoCE v2 GID (on eth0's IPv4 address).
const SMOKE: &str = r#"echo "softroce: smoke check: ibv_devinfo -v -d rxe0"
info=$(ibv_devinfo -v -d rxe0 2>&1)
echo "$info" | grep -E 'hca_id|transport|state:|link_layer|GID\['
if echo "$info" | grep -q PORT_ACTIVE && echo "$info" | grep -q 'RoCE v2'; then
    echo "softroce: smoke check: ok (PORT_ACTIVE, RoCE v2 GID)"
else
    echo "softroce: smoke check: FAILED (want PORT_ACTIVE and a RoCE v2 GID)"
    failed="$failed; smoke check"
fi
"#;

/// Builds the suites, boots the guest once and runs them all; returns the
/// guest's exit status (non-zero when the smoke check or any suite failed).
/// `wheel` is the orbitte wheel for the Python suite (see [`wheel`]).
pub(crate) fn run(
    test_args: &[String],
    timeout: Duration,
    wheel: Option<PathBuf>,
) -> Result<i32, String> {
    let started = Instant::now();
    guest::qemu()?;
    let prepared = image::prepare(false)?;
    // The image build (mostly downloads and dpkg) overlaps the suites' build
    // (mostly rustc); the image's failure is reported first.
    let (image, built) = std::thread::scope(|scope| {
        let image = scope.spawn(|| {
            let image = prepared.finish();
            (image, started.elapsed())
        });
        let cargo_started = Instant::now();
        let built = build_suites(wheel).map(|b| (b, cargo_started.elapsed()));
        let image = image
            .join()
            .unwrap_or_else(|_| (Err("the image build panicked".into()), started.elapsed()));
        (image, built)
    });
    let (image, image_took) = (image.0?, image.1);
    let (
        Built {
            binaries,
            missing,
            broken,
        },
        cargo_took,
    ) = built?;
    eprintln!(
        "softroce: built {} native suite{} in {}",
        binaries.len(),
        if binaries.len() == 1 { "" } else { "s" },
        secs(cargo_took)
    );
    for m in &missing {
        eprintln!("softroce: missing suite (not run): {m}");
    }
    for b in &broken {
        eprintln!("softroce: broken suite (not run): {b}");
    }

    let mut script = String::from("failed=\"\"\n");
    script.push_str(SMOKE);
    for (suite, label, exe) in &binaries {
        let label = quote(label);
        let check = suite.check(&exe.to_string_lossy(), test_args);
        let _ = write!(
            script,
            "echo; echo \"softroce: suite \"{label}\n\
             t0=$(date +%s)\n\
             if {check}; then r=ok; else r=FAILED; failed=\"$failed; \"{label}; fi\n\
             echo \"softroce: suite \"{label}\": $r ($(( $(date +%s) - t0 )) s)\"\n",
        );
    }
    for m in &missing {
        let _ = writeln!(
            script,
            "echo {}",
            quote(&format!("softroce: missing suite: {m}"))
        );
    }
    for b in &broken {
        let _ = writeln!(
            script,
            "echo {}; failed=\"$failed; \"{}",
            quote(&format!("softroce: broken suite: {b}")),
            quote(b.split(": ").next().unwrap_or(b))
        );
    }
    script.push_str(
        "echo\nif [ -n \"$failed\" ]; then echo \"softroce: FAILED:${failed#;}\"; exit 1; fi\n\
         echo \"softroce: all passed\"\n",
    );

    let guest_started = Instant::now();
    let rc = guest::run(&image, &script, timeout)?;
    eprintln!(
        "softroce: timings: image {}, cargo build {} (the two overlap), guest stage {}, total {}",
        secs(image_took),
        secs(cargo_took),
        secs(guest_started.elapsed()),
        secs(started.elapsed())
    );
    Ok(rc)
}

/// Builds every existing suite (`cargo test --no-run`, or `cargo build`
/// for a binary) and finds its executable in cargo's JSON messages. A suite
/// that does not build is recorded as broken and the others still run.
fn build_suites(mut wheel_given: Option<PathBuf>) -> Result<Built, String> {
    let targets = workspace_targets()?;
    let mut built = Built::default();
    // Suites sharing a target (several commands of one binary) build once.
    let mut done: HashMap<(&str, Vec<String>), Result<PathBuf, String>> = HashMap::new();
    let mut the_wheel: Option<Result<Option<PathBuf>, String>> = None;
    for suite in NATIVE_SUITES {
        let (flags, kind, name, test) = suite.cargo_target();
        let label = suite.label();
        if let Target::Python { script, .. } = suite.target {
            if !crate::workspace::root().join(script).is_file() {
                built
                    .missing
                    .push(format!("{label}: {script} does not exist yet"));
                continue;
            }
            match the_wheel
                .get_or_insert_with(|| wheel(wheel_given.take()))
                .clone()
            {
                Ok(Some(w)) => built.binaries.push((suite, label, w)),
                Ok(None) => built.missing.push(format!(
                    "{label}: no orbitte wheel ({NO_WHEEL}; under CI=true this fails)"
                )),
                Err(e) => built.broken.push(format!("{label}: {e}")),
            }
            continue;
        }
        let kind_matches = |k: &str| k == kind || (kind == "lib" && k.ends_with("lib"));
        let exists = targets.iter().any(|(p, kinds, n)| {
            p == suite.package && *n == name && kinds.iter().any(|k| kind_matches(k))
        });
        if !exists {
            built.missing.push(format!("{label} does not exist yet"));
            continue;
        }
        let result = done
            .entry((suite.package, flags.clone()))
            .or_insert_with(|| build_one(suite.package, &flags, &kind_matches, &name, test))
            .clone();
        match result {
            Ok(exe) => built.binaries.push((suite, label, exe)),
            Err(e) => built.broken.push(format!("{label}: {e}")),
        }
    }
    Ok(built)
}

/// How to give the Python suite a wheel.
const NO_WHEEL: &str = "pass --wheel PATH, set ORBITTE_WHEEL, or install maturin (pip install \
     maturin) so that one is built";

/// The orbitte wheel for the Python suite, copied where the guest sees it:
/// `given` (`--wheel`), else `ORBITTE_WHEEL`, else one built now with
/// maturin (`maturin build`: the host's glibc is the guest's, as for the
/// test binaries). None when there is none and maturin is not installed,
/// an error under `CI=true` then.
fn wheel(given: Option<PathBuf>) -> Result<Option<PathBuf>, String> {
    let from_env = std::env::var_os("ORBITTE_WHEEL")
        .filter(|w| !w.is_empty())
        .map(PathBuf::from);
    let dir = guest_visible_dir().join("softroce-py");
    let wheel = match given.or(from_env) {
        Some(w) => w,
        None => match find_tool("maturin") {
            Some(maturin) => build_wheel(&maturin, &dir.join("built"))?,
            None if std::env::var("CI").is_ok_and(|v| v == "true") => {
                return Err(format!("no orbitte wheel and no maturin: {NO_WHEEL}"));
            }
            None => return Ok(None),
        },
    };
    let name = wheel
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| n.starts_with("orbitte-") && n.ends_with(".whl"))
        .ok_or_else(|| {
            format!(
                "{} is not an orbitte wheel (orbitte-*.whl)",
                wheel.display()
            )
        })?;
    if !wheel.is_file() {
        return Err(format!(
            "the wheel {} does not exist; build it with maturin (docs/python.md)",
            wheel.display()
        ));
    }
    let copy = dir.join(&name);
    if fs_same(&wheel, &copy) {
        return Ok(Some(copy));
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    std::fs::copy(&wheel, &copy)
        .map_err(|e| format!("cannot copy {} to {}: {e}", wheel.display(), copy.display()))?;
    eprintln!("softroce: Python suite: wheel {}", wheel.display());
    Ok(Some(copy))
}

fn fs_same(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The cargo target folder: shared with the guest at the same path
/// (`guest::shares`), so what is put there is visible inside.
fn guest_visible_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) if !t.is_empty() => PathBuf::from(t),
        _ => crate::workspace::root().join("target"),
    }
}

/// Builds the wheel with `maturin build` into `out` (emptied first).
fn build_wheel(maturin: &Path, out: &Path) -> Result<PathBuf, String> {
    let _ = std::fs::remove_dir_all(out);
    let started = Instant::now();
    eprintln!(
        "softroce: building the orbitte wheel with {}",
        maturin.display()
    );
    let status = Command::new(maturin)
        .args([
            "build",
            "--quiet",
            "-m",
            "crates/orbitte-py/Cargo.toml",
            "-o",
        ])
        .arg(out)
        .current_dir(crate::workspace::root())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", maturin.display()))?;
    if !status.success() {
        return Err(format!(
            "`maturin build -m crates/orbitte-py/Cargo.toml` failed ({status}; its errors are above)"
        ));
    }
    let found = std::fs::read_dir(out)
        .map_err(|e| format!("cannot read {}: {e}", out.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("maturin built no wheel into {}", out.display()))?;
    eprintln!(
        "softroce: built {} in {}",
        found.display(),
        secs(started.elapsed())
    );
    Ok(found)
}

/// Builds one target and returns its executable.
fn build_one(
    package: &str,
    flags: &[String],
    kind_matches: &dyn Fn(&str) -> bool,
    name: &str,
    test: bool,
) -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(&cargo);
    if test {
        command.args(["test", "--no-run"]);
    } else {
        command.arg("build");
    }
    let mut child = command
        .args(["--message-format=json-render-diagnostics", "-p", package])
        .args(flags)
        .current_dir(crate::workspace::root())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot run `{cargo}`: {e}"))?;
    let mut found = None;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let target = &msg["target"];
            if msg["reason"] == "compiler-artifact"
                && msg["profile"]["test"] == test
                && target["name"]
                    .as_str()
                    .map(|n| n.replace('-', "_"))
                    .as_deref()
                    == Some(name)
                && target["kind"]
                    .as_array()
                    .is_some_and(|ks| ks.iter().filter_map(|k| k.as_str()).any(kind_matches))
                && let Some(exe) = msg["executable"].as_str()
            {
                found = Some(PathBuf::from(exe));
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for cargo: {e}"))?;
    if !status.success() {
        return Err("does not build (see cargo's errors above)".into());
    }
    found.ok_or_else(|| "cargo built it but named no executable".into())
}

/// The suites `build_suites` built, and the ones it could not.
#[derive(Debug, Default)]
struct Built {
    /// (suite, label, executable) in `NATIVE_SUITES` order.
    binaries: Vec<(&'static Suite, String, PathBuf)>,
    /// A description of each listed suite whose target does not exist yet.
    missing: Vec<String>,
    /// Each listed suite that exists but does not build, with why.
    broken: Vec<String>,
}

/// (package, target kinds, target name) of every workspace target.
fn workspace_targets() -> Result<Vec<(String, Vec<String>, String)>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(crate::workspace::root())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run `{cargo} metadata`: {e}"))?;
    if !out.status.success() {
        return Err("`cargo metadata` failed (see its errors above)".into());
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("cannot parse `cargo metadata` output: {e}"))?;
    let mut targets = Vec::new();
    for pkg in meta["packages"].as_array().into_iter().flatten() {
        let pname = pkg["name"].as_str().unwrap_or_default();
        for t in pkg["targets"].as_array().into_iter().flatten() {
            let kinds = t["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect();
            let tname = t["name"].as_str().unwrap_or_default().replace('-', "_");
            targets.push((pname.to_string(), kinds, tname));
        }
    }
    Ok(targets)
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passes(suite: &Suite, exe: &str, test_args: &[String]) -> bool {
        let check = suite.check(exe, test_args);
        Command::new("sh")
            .arg("-c")
            .arg(format!("if {check}; then exit 0; else exit 1; fi"))
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    #[test]
    fn a_command_suite_passes_on_exit_zero_with_every_expected_string() {
        let suite = |args, expect| Suite {
            package: "p",
            target: Target::Bin {
                name: "echo",
                args,
                expect,
            },
        };
        assert!(passes(
            &suite(&["rxe0 it's", "RoCE v2"], &["rxe0", "it's", "RoCE v2"]),
            "/bin/echo",
            &[]
        ));
        assert!(!passes(&suite(&["rxe0"], &["RoCE v2"]), "/bin/echo", &[]));
        assert!(!passes(&suite(&["rxe0"], &["rxe0"]), "/bin/false", &[]));
    }

    #[test]
    fn a_script_suite_runs_with_bin_set_and_passes_on_exit_zero() {
        let suite = |script| Suite {
            package: "p",
            target: Target::Script {
                name: "echo",
                label: "l",
                script,
            },
        };
        let ok = r#"[ "$("$BIN" "it's")" = "it's" ]"#;
        assert!(passes(&suite(ok), "/bin/echo", &[]));
        assert!(!passes(&suite(ok), "/bin/true", &[]));
        assert!(!passes(&suite("\"$BIN\"; exit 2"), "/bin/true", &[]));
        assert_eq!(suite(ok).label(), "p `echo`: l");
    }

    /// A fake `orbitte` printing `out` and exiting with `rc`.
    fn fake_bin(name: &str, out: &str, rc: i32) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-suites-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!("#!/bin/sh\ncat <<'EOF'\n{out}\nEOF\nexit {rc}\n"),
        )
        .unwrap();
        Command::new("chmod").arg("+x").arg(&path).status().unwrap();
        path
    }

    fn doctor_json(completion: &str, works: bool) -> String {
        let check = |s: &str| {
            format!("{{\n        \"status\": \"{s}\",\n        \"detail\": \"\"\n      }}")
        };
        format!(
            "{{\n  \"asked\": \"rdma\",\n  \"paths\": [\n    {{\n      \"path\": \"rdma\",\n      \"works\": {works},\n      \"build\": {},\n      \"discovery\": {},\n      \"completion\": {},\n      \"drain\": {}\n    }}\n  ]\n}}",
            check("pass"),
            check("pass"),
            check(completion),
            check("pass")
        )
    }

    #[test]
    fn the_doctor_suite_needs_all_four_rdma_checks_to_pass() {
        let suite = Suite {
            package: "orbitte-cli",
            target: Target::Script {
                name: "orbitte",
                label: "doctor",
                script: DOCTOR_RDMA,
            },
        };
        let run = |name: &str, out: &str, rc: i32| {
            passes(&suite, &fake_bin(name, out, rc).to_string_lossy(), &[])
        };
        assert!(run("all-pass", &doctor_json("pass", true), 0));
        assert!(!run("completion-fails", &doctor_json("fail", false), 0));
        assert!(!run("not-works", &doctor_json("pass", false), 0));
        assert!(!run("exit-1", &doctor_json("pass", true), 1));
        let dir = std::env::temp_dir().join(format!("xtask-suites-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_test_suite_gets_the_test_arguments_and_its_exit_status_counts() {
        let suite = Suite {
            package: "p",
            target: Target::Test("t"),
        };
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(passes(&suite, "/bin/sh", &args(&["-c", "exit 0"])));
        assert!(!passes(&suite, "/bin/sh", &args(&["-c", "exit 3"])));
    }

    #[test]
    fn a_skip_in_any_suite_fails_it_in_the_guest() {
        let test = Suite {
            package: "p",
            target: Target::Test("t"),
        };
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // `sh -c SCRIPT --show-output`: the script sees `--show-output` as $0.
        let run = |script: &str| passes(&test, "/bin/sh", &args(&["-c", script]));
        assert!(run("echo 'test a ... ok'; exit 0"));
        assert!(!run(
            "echo 'skipped: ORBITTE_TEST_DEVICE is not set'; exit 0"
        ));
        assert!(!run("echo 'test a ... skipped: no device'; exit 0"));
        assert!(!run("echo 'skipped: to stderr' >&2; exit 0"));
        assert!(
            run("[ \"$0\" = --show-output ]"),
            "the output of passing tests is shown"
        );

        let bin = Suite {
            package: "p",
            target: Target::Bin {
                name: "echo",
                args: &["rxe0 skipped: nothing"],
                expect: &["rxe0"],
            },
        };
        assert!(!passes(&bin, "/bin/echo", &[]));
        let script = Suite {
            package: "p",
            target: Target::Script {
                name: "echo",
                label: "l",
                script: "\"$BIN\" 'skipped: x'",
            },
        };
        assert!(!passes(&script, "/bin/echo", &[]));
        assert!(passes(
            &Suite {
                package: "p",
                target: Target::Script {
                    name: "echo",
                    label: "l",
                    script: "\"$BIN\" 'ran'",
                },
            },
            "/bin/echo",
            &[]
        ));
    }

    #[test]
    fn a_python_suite_runs_its_script_on_the_unpacked_wheel() {
        let dir = std::env::temp_dir().join(format!("xtask-pysuite-{}", std::process::id()));
        let pkg = dir.join("pkg/orbitte");
        std::fs::create_dir_all(&pkg).unwrap();
        std::fs::write(pkg.join("__init__.py"), "MARK = 'from the wheel'\n").unwrap();
        let wheel = dir.join("orbitte-0.0.0-py3-none-any.whl");
        let zipped = Command::new("python3")
            .args(["-m", "zipfile", "-c"])
            .arg(&wheel)
            .arg(&pkg)
            .status()
            .unwrap();
        assert!(zipped.success());
        let suite = |body: &str, expect: &'static [&'static str]| {
            let script = dir.join(format!("s{}.py", body.len()));
            std::fs::write(&script, body).unwrap();
            let script: &'static str = Box::leak(script.to_string_lossy().into_owned().into());
            Suite {
                package: "p",
                target: Target::Python {
                    script,
                    label: "l",
                    expect,
                },
            }
        };
        let w = wheel.to_string_lossy().into_owned();
        let from_wheel = "import os, orbitte\n\
            assert orbitte.__file__.startswith(os.environ['PYTHONPATH'])\n\
            print(orbitte.MARK)\n";
        assert!(passes(&suite(from_wheel, &["from the wheel"]), &w, &[]));
        assert!(!passes(&suite(from_wheel, &["all checks passed"]), &w, &[]));
        assert!(!passes(&suite("import sys; sys.exit(1)\n", &[]), &w, &[]));
        assert!(!passes(
            &suite("print('skipped: no device')\n", &[]),
            &w,
            &[]
        ));
        let missing = dir.join("orbitte-none.whl").to_string_lossy().into_owned();
        assert!(!passes(&suite("print('ran')\n", &[]), &missing, &[]));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_wheel_that_is_not_an_orbitte_wheel_or_is_missing_is_an_error() {
        let err = wheel(Some(PathBuf::from("/nonexistent/numpy-1.whl"))).unwrap_err();
        assert!(err.contains("is not an orbitte wheel"), "{err}");
        let err = wheel(Some(PathBuf::from("/nonexistent/orbitte-0.1.0.whl"))).unwrap_err();
        assert!(err.contains("does not exist"), "{err}");
    }

    #[test]
    fn every_native_suite_names_a_workspace_package() {
        let targets = workspace_targets().unwrap();
        for suite in NATIVE_SUITES {
            assert!(
                targets.iter().any(|(p, _, _)| p == suite.package),
                "NATIVE_SUITES names `{}`, which is not a workspace package",
                suite.package
            );
        }
    }
}
