//! What the host gives the softroce tasks: the cache folder, the tools on
//! PATH, whether boot messages are shown, and how durations are written.

use std::path::PathBuf;
use std::time::Duration;

/// The folder the image cache and per-run control folders live in.
pub(crate) fn cache_dir() -> PathBuf {
    match std::env::var_os("SOFTROCE_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => crate::workspace::root().join(".softroce-cache"),
    }
}

/// Whether the guest's boot messages should be shown as they arrive.
pub(crate) fn verbose() -> bool {
    std::env::var("SOFTROCE_VERBOSE").is_ok_and(|v| v == "1")
}

/// Finds `name` on PATH (or the sbin folders, which a non-login root shell
/// may lack).
pub(crate) fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Formats a duration as seconds with one decimal.
pub(crate) fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}
