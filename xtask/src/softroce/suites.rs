//! `cargo xtask softroce test`: the native test suites, built on the host
//! and run inside the guest against rxe0.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{guest, image, secs};

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
            Target::Bin { name, .. } => {
                (vec!["--bin".into(), name.into()], "bin", name.into(), false)
            }
        }
    }

    fn label(&self) -> String {
        match self.target {
            Target::Lib => format!("{} (unit tests)", self.package),
            Target::Test(t) => format!("{} tests/{t}.rs", self.package),
            Target::Bin { name, args, .. } => {
                format!("{} `{name} {}`", self.package, args.join(" "))
            }
        }
    }

    /// The shell condition that runs the suite in the guest and is true
    /// when it passed.
    fn check(&self, exe: &str, test_args: &[String]) -> String {
        let exe = quote(exe);
        match self.target {
            Target::Lib | Target::Test(_) => {
                let args: String = test_args.iter().map(|a| format!(" {}", quote(a))).collect();
                format!("{exe}{args}")
            }
            Target::Bin { args, expect, .. } => {
                let args: String = args.iter().map(|a| format!(" {}", quote(a))).collect();
                let out = "/tmp/softroce-out";
                let mut check =
                    format!("{{ {exe}{args} > {out} 2>&1; r=$?; cat {out}; [ $r = 0 ]; }}");
                for e in expect {
                    let q = quote(e);
                    let missing = quote(&format!("softroce: the output lacks `{e}`"));
                    let _ = write!(
                        check,
                        " && {{ grep -qF -- {q} {out} || {{ echo {missing}; false; }}; }}"
                    );
                }
                check
            }
        }
    }
}

/// The native suites, in the order the guest runs them. Add a line when a
/// crate gains tests or a command that talk to a real verbs device (the
/// engine's rdma path between two engines, `orbitte doctor`). An entry whose
/// target does not exist yet is reported as missing, not built.
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
    // differences (issue 10, item 3; docs/verbs.md "Sim versus rxe").
    Suite {
        package: "orbitte-verbs",
        target: Target::Test("scenarios"),
    },
    // The CLI's topology on rxe0, after one Host Direct registration through
    // the native provider (issue 10, item 4).
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
    // of READ, every request drained (issue 10, item 4; two processes once
    // the CLI has the control link for rdma). Correctness only: the rate
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
];

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
pub(crate) fn run(test_args: &[String], timeout: Duration) -> Result<i32, String> {
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
        let built = build_suites().map(|b| (b, cargo_started.elapsed()));
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
fn build_suites() -> Result<Built, String> {
    let targets = workspace_targets()?;
    let mut built = Built::default();
    // Suites sharing a target (several commands of one binary) build once.
    let mut done: HashMap<(&str, Vec<String>), Result<PathBuf, String>> = HashMap::new();
    for suite in NATIVE_SUITES {
        let (flags, kind, name, test) = suite.cargo_target();
        let label = suite.label();
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
        .current_dir(crate::workspace_root())
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
        .current_dir(crate::workspace_root())
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
