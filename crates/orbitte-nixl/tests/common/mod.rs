//! What the plugin's tests under NIXL's agent share: where cargo put the
//! plugin, the CI rule for what is missing, and the NIXL wheel's libraries.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/debug`, where cargo put the plugin.
pub(crate) fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    // target/debug/deps/TEST-HASH
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary lies in target/PROFILE/deps")
        .to_path_buf()
}

/// The plugin built for this run: cargo test copies no artifact up to
/// target/debug, so deps/ holds it.
pub(crate) fn built_plugin() -> PathBuf {
    build_dir().join("deps/libplugin_OrbitTE.so")
}

pub(crate) fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Skips (or, under CI=true, fails) with what is missing.
pub(crate) fn missing(what: &str) {
    if in_ci() {
        panic!("CI=true and {what}");
    }
    eprintln!("skipped: {what}");
}

/// The Pythons with NIXL to test with: (label, python).
fn pythons() -> Vec<(String, PathBuf)> {
    if let Some(p) = std::env::var_os("ORBITTE_NIXL_PYTHON").filter(|p| !p.is_empty()) {
        return vec![("ORBITTE_NIXL_PYTHON".into(), PathBuf::from(p))];
    }
    let target = build_dir().join("..");
    ["1.5.1", "1.4.0"]
        .iter()
        .map(|v| {
            (
                format!("nixl-cu12 {v}"),
                target.join(format!("nixl-venv-{v}/bin/python")),
            )
        })
        .filter(|(_, p)| p.is_file())
        .collect()
}

/// Whether the plugin was built with NIXL's entry point; `missing` says so
/// when not.
pub(crate) fn plugin_built() -> bool {
    if !cfg!(orbitte_nixl_plugin) {
        missing(
            "the plugin was built without NIXL's headers: set NIXL_INCLUDE_DIR (docs/nixl-plugin.md)",
        );
    }
    cfg!(orbitte_nixl_plugin)
}

/// The plugin built and the NIXL wheels to test with, as (label, python,
/// the wheel's `nixl_cu12.libs`); None, or fewer, once `missing` said what
/// is not there.
pub(crate) fn plugin_and_wheels() -> Option<Vec<(String, PathBuf, PathBuf)>> {
    if !plugin_built() {
        return None;
    }
    let found = pythons();
    if found.is_empty() {
        missing(
            "no Python with NIXL: set ORBITTE_NIXL_PYTHON, or create target/nixl-venv-1.5.1 \
             (python3 -m venv target/nixl-venv-1.5.1 && \
             target/nixl-venv-1.5.1/bin/pip install --no-deps nixl-cu12==1.5.1 numpy)",
        );
        return None;
    }
    let mut wheels = Vec::new();
    for (label, python) in found {
        match wheel_libs(&python) {
            Some(libs) => wheels.push((label, python, libs)),
            None => missing(&format!(
                "{label}: {} cannot import nixl_cu12",
                python.display()
            )),
        }
    }
    Some(wheels)
}

/// The folder of the wheel's own libraries and plugins (`nixl_cu12.libs`).
fn wheel_libs(python: &Path) -> Option<PathBuf> {
    let out = Command::new(python)
        .args([
            "-c",
            "import os, nixl_cu12; print(os.path.dirname(nixl_cu12.__file__) + '.libs')",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    dir.is_dir().then_some(dir)
}

/// The last `n` lines of `text`.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
