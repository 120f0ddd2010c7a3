//! Progress bars of long bench runs: drawn on a terminal only, never with
//! `--quiet` or `--json`.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Whether a run draws progress bars: only on a terminal, and never with
/// `--quiet` or `--json` (whose reader wants the report alone).
pub(crate) fn shows_progress(quiet: bool, json: bool, terminal: bool) -> bool {
    terminal && !quiet && !json
}

/// A bar over one measurement of `seconds` at `block` bytes, in
/// milliseconds.
pub(crate) fn timed(show: bool, seconds: f64, block: u64) -> ProgressBar {
    if !show {
        return ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    }
    let ms = (seconds * 1000.0) as u64;
    let bar = ProgressBar::new(ms);
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {elapsed_precise} {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(format!("block {}", crate::chart::human_bytes(block)));
    bar
}

/// A bar over `steps` steps of a run named `what`, with the step under
/// way as its message.
pub(crate) fn steps(show: bool, steps: u64, what: &str) -> ProgressBar {
    if !show {
        return ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::new(steps);
    if let Ok(style) =
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {elapsed_precise} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(what.to_owned());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_drawn_only_on_a_terminal_and_never_with_quiet_or_json() {
        assert!(shows_progress(false, false, true));
        assert!(!shows_progress(false, false, false), "not a terminal");
        assert!(!shows_progress(true, false, true), "--quiet");
        assert!(!shows_progress(false, true, true), "--json");
    }

    #[test]
    fn a_hidden_bar_draws_nothing() {
        assert!(timed(false, 1.0, 4096).is_hidden());
        assert!(steps(false, 3, "peers").is_hidden());
    }
}
