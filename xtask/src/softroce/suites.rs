//! `cargo xtask softroce test`: the native test suites, built on the host
//! and run inside the guest against rxe0.

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
    /// An integration test (`tests/NAME.rs`).
    Test(&'static str),
}

/// A test binary honouring `ORBITTE_TEST_DEVICE` that the guest runs.
#[derive(Debug)]
struct Suite {
    package: &'static str,
    target: Target,
}

/// The native test suites, in the order the guest runs them. Add a line
/// when a crate gains tests that talk to a real verbs device (the engine's
/// rdma path, the CLI's doctor scenarios). An entry whose target does not
/// exist yet is reported as missing, not built.
const NATIVE_SUITES: &[Suite] = &[
    Suite {
        package: "orbitte-verbs-sys",
        target: Target::Test("library"),
    },
    Suite {
        package: "orbitte-verbs",
        target: Target::Test("native"),
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
    failed="$failed smoke"
fi
"#;

/// Builds the suites, boots the guest once and runs them all; returns the
/// guest's exit status (non-zero when the smoke check or any suite failed).
pub(crate) fn run(test_args: &[String], timeout: Duration) -> Result<i32, String> {
    let started = Instant::now();
    guest::qemu()?;
    let image = image::ensure(false)?;
    let image_done = Instant::now();

    let cargo_started = Instant::now();
    let Built { binaries, missing } = build_suites()?;
    eprintln!(
        "softroce: built {} native test binar{} in {}",
        binaries.len(),
        if binaries.len() == 1 { "y" } else { "ies" },
        secs(cargo_started.elapsed())
    );
    for m in &missing {
        eprintln!("softroce: missing suite (not run): {m}");
    }

    let mut script = String::from("failed=\"\"\n");
    script.push_str(SMOKE);
    let args: String = test_args.iter().map(|a| format!(" {}", quote(a))).collect();
    for (name, exe) in &binaries {
        let _ = write!(
            script,
            "echo; echo \"softroce: suite {name}\"\n\
             t0=$(date +%s)\n\
             if {exe}{args}; then r=ok; else r=FAILED; failed=\"$failed {name}\"; fi\n\
             echo \"softroce: suite {name}: $r ($(( $(date +%s) - t0 )) s)\"\n",
            exe = quote(&exe.to_string_lossy()),
        );
    }
    for m in &missing {
        let _ = writeln!(
            script,
            "echo {}",
            quote(&format!("softroce: missing suite: {m}"))
        );
    }
    script.push_str(
        "echo\nif [ -n \"$failed\" ]; then echo \"softroce: FAILED:$failed\"; exit 1; fi\n\
         echo \"softroce: all passed\"\n",
    );

    let guest_started = Instant::now();
    let rc = guest::run(&image, &script, timeout)?;
    eprintln!(
        "softroce: timings: image {}, cargo build {}, guest stage {}, total {}",
        secs(image_done.duration_since(started)),
        secs(guest_started.duration_since(cargo_started)),
        secs(guest_started.elapsed()),
        secs(started.elapsed())
    );
    Ok(rc)
}

/// Builds every existing suite with `cargo test --no-run`.
fn build_suites() -> Result<Built, String> {
    let targets = workspace_targets()?;
    let mut binaries = Vec::new();
    let mut missing = Vec::new();
    for suite in NATIVE_SUITES {
        let (flag, kind, name) = match suite.target {
            Target::Lib => (
                vec!["--lib".to_string()],
                "lib",
                suite.package.replace('-', "_"),
            ),
            Target::Test(t) => (
                vec!["--test".to_string(), t.to_string()],
                "test",
                t.to_string(),
            ),
        };
        let label = match suite.target {
            Target::Lib => format!("{} (unit tests)", suite.package),
            Target::Test(t) => format!("{} tests/{t}.rs", suite.package),
        };
        let exists = targets.iter().any(|(p, kinds, n)| {
            p == suite.package
                && kinds
                    .iter()
                    .any(|k| k == kind || (kind == "lib" && k.ends_with("lib")))
                && *n == name
        });
        if !exists {
            missing.push(format!("{label} does not exist yet"));
            continue;
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut child = Command::new(&cargo)
            .args([
                "test",
                "--no-run",
                "--message-format=json-render-diagnostics",
                "-p",
            ])
            .arg(suite.package)
            .args(&flag)
            .current_dir(crate::workspace_root())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot run `{cargo} test --no-run`: {e}"))?;
        let mut found = None;
        if let Some(out) = child.stdout.take() {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                if msg["reason"] == "compiler-artifact"
                    && msg["profile"]["test"] == true
                    && msg["target"]["name"] == name.as_str()
                    && msg["package_id"]
                        .as_str()
                        .is_some_and(|id| id.contains(suite.package))
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
            return Err(format!(
                "building the native suite {label} failed (see cargo's errors above)"
            ));
        }
        let exe =
            found.ok_or_else(|| format!("cargo built {label} but named no test executable"))?;
        binaries.push((label, exe));
    }
    Ok(Built { binaries, missing })
}

/// The suites `build_suites` built, and the ones it could not.
#[derive(Debug)]
struct Built {
    /// (label, executable) in `NATIVE_SUITES` order.
    binaries: Vec<(String, PathBuf)>,
    /// A description of each listed suite whose target does not exist yet.
    missing: Vec<String>,
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
