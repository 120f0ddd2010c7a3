//! Host memory the command is about to allocate, checked against what
//! this machine has available before anything is allocated or touched.

use crate::failure::Failure;

/// `MemAvailable` of /proc/meminfo in bytes (`None` where unreadable).
pub(crate) fn available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_available(&text)
}

fn parse_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses `total` bytes (made of `parts`, for the message) when this
/// machine has less memory available; `fix` says what to lower.
pub(crate) fn check(total: u64, parts: &str, fix: &str) -> Result<(), Failure> {
    check_against(total, available(), parts, fix)
}

fn check_against(
    total: u64,
    available: Option<u64>,
    parts: &str,
    fix: &str,
) -> Result<(), Failure> {
    match available {
        Some(avail) if total > avail => Err(Failure::usage(format!(
            "{parts} need {} ({total} bytes) of host memory, but this machine has {} ({avail} bytes) available (MemAvailable in /proc/meminfo): {fix}",
            gib(total),
            gib(avail)
        ))),
        _ => Ok(()),
    }
}

/// `64 GiB`, `1.5 GiB`, `512 MiB`.
pub(crate) fn gib(n: u64) -> String {
    for (unit, name) in [(1u64 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB")] {
        if n >= unit {
            return if n.is_multiple_of(unit) {
                format!("{} {name}", n / unit)
            } else {
                format!("{:.1} {name}", n as f64 / unit as f64)
            };
        }
    }
    format!("{n} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:  1 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_available(text), Some(20_000_000 * 1024));
        assert_eq!(parse_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn too_much_is_refused_with_both_figures() {
        let e = check_against(64 << 30, Some(20 << 30), "the ranges", "lower them").unwrap_err();
        assert_eq!(e.code, 2);
        assert!(e.message.contains("need 64 GiB"), "{}", e.message);
        assert!(e.message.contains("has 20 GiB"), "{}", e.message);
        assert!(check_against(1 << 30, Some(20 << 30), "x", "y").is_ok());
        assert!(check_against(1 << 50, None, "x", "y").is_ok());
    }
}
