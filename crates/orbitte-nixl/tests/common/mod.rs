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

/// The folder of the wheel's own libraries and plugins (`nixl_cu12.libs`).
pub(crate) fn wheel_libs(python: &Path) -> Option<PathBuf> {
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
