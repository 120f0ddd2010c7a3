//! `--rounds N`: the path and its baselines are measured alternately N
//! times. A figure is the median round; a baseline is judged against the
//! path's median, and one that cannot be trusted is flagged as suspect
//! instead of giving a ratio.

use super::report::{Baseline, Point};
use super::timed::Sample;

/// A path faster than its baseline by more than this factor means the
/// baseline does not measure what the path does.
pub(crate) const MAX_RATIO: f64 = 1.1;
/// A baseline whose fastest round is more than this factor above its
/// slowest measured a busy machine, not a ceiling.
pub(crate) const MAX_SPREAD: f64 = 2.0;

/// The index of the median of `v` (the lower middle for an even count).
pub(crate) fn median_index(v: &[f64]) -> Option<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    idx.get(v.len().saturating_sub(1) / 2).copied()
}

/// The median of `v` (the lower middle for an even count), 0 when empty.
pub(crate) fn median(v: &[f64]) -> f64 {
    median_index(v).map_or(0.0, |i| v[i])
}

/// Why the ratio of a path at `path_gbps` (median) to a baseline with
/// these rounds is not a result, or `None` when it is one.
pub(crate) fn suspect(path_gbps: f64, rounds: &[f64]) -> Option<String> {
    let base = median(rounds);
    if base <= 0.0 {
        return Some("the baseline moved no bytes".to_owned());
    }
    let ratio = path_gbps / base;
    let (lo, hi) = rounds.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &g| {
        (lo.min(g), hi.max(g))
    });
    let mut why = Vec::new();
    if ratio > MAX_RATIO {
        why.push(format!(
            "the path ran {ratio:.2}x its baseline (above {MAX_RATIO}): the baseline does not measure the path's ceiling"
        ));
    }
    if lo <= 0.0 || hi / lo > MAX_SPREAD {
        why.push(format!(
            "the baseline varied from {lo:.3} to {hi:.3} GB/s between rounds (more than {MAX_SPREAD}x): the machine was not quiet"
        ));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// One block size's rounds as one point: the median round's figures, with
/// every round's GB/s. `None` when there are no rounds.
pub(crate) fn point(rounds: Vec<Point>) -> Option<Point> {
    let gbps: Vec<f64> = rounds.iter().map(|p| p.gbps).collect();
    let i = median_index(&gbps)?;
    let mut p = rounds.into_iter().nth(i)?;
    p.rounds_gbps = gbps;
    Some(p)
}

/// A baseline's rounds judged against the path's median GB/s. `None`
/// when it was never measured.
pub(crate) fn baseline(path_gbps: f64, samples: &[Sample]) -> Option<Baseline> {
    let rounds: Vec<f64> = samples.iter().map(|s| s.gbps).collect();
    // Named after its median round (the loopback limit keeps the best
    // setting of each round, which may differ between rounds).
    let mid = samples.get(median_index(&rounds)?)?;
    let gbps = mid.gbps;
    Some(Baseline {
        name: mid.name.clone(),
        gbps,
        seconds: samples.iter().map(|s| s.seconds).sum(),
        ratio: if gbps > 0.0 { path_gbps / gbps } else { 0.0 },
        suspect: suspect(path_gbps, &rounds),
        rounds_gbps: rounds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(gbps: f64) -> Sample {
        Sample {
            name: "memcpy".into(),
            gbps,
            seconds: 0.5,
        }
    }

    #[test]
    fn medians_take_the_middle_round() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.0);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn a_path_close_to_a_steady_baseline_is_a_result() {
        let b = baseline(8.0, &[sample(10.0), sample(11.0), sample(9.5)]).unwrap();
        assert_eq!(b.gbps, 10.0);
        assert_eq!(b.ratio, 0.8);
        assert_eq!(b.suspect, None);
        assert_eq!(b.rounds_gbps, vec![10.0, 11.0, 9.5]);
        assert_eq!(b.seconds, 1.5);
        // At the bound itself, still a result.
        assert_eq!(suspect(11.0, &[10.0]), None);
    }

    #[test]
    fn a_path_faster_than_its_baseline_is_suspect() {
        // A broken memcpy baseline: the path at 3.94x of it.
        let b = baseline(8.936, &[sample(2.268)]).unwrap();
        let why = b.suspect.unwrap();
        assert!(why.contains("3.94x its baseline"), "{why}");
        assert!(!why.contains("varied"), "{why}");
    }

    #[test]
    fn a_baseline_varying_more_than_twice_between_rounds_is_suspect() {
        let why = suspect(1.0, &[4.0, 1.9, 4.2]).unwrap();
        assert!(why.contains("varied from 1.900 to 4.200"), "{why}");
        assert!(!why.contains("its baseline"), "{why}");
        // Exactly 2x is still steady.
        assert_eq!(suspect(1.0, &[2.0, 4.0]), None);
    }

    #[test]
    fn a_baseline_that_moved_nothing_is_suspect() {
        assert!(suspect(1.0, &[0.0]).is_some());
        assert!(suspect(1.0, &[0.0, 1.0, 1.0]).unwrap().contains("varied"));
        assert!(baseline(1.0, &[]).is_none());
    }
}
