//! Latency and throughput statistics for `orbitte bench`.

use std::time::Duration;

/// Latency samples of one run, in nanoseconds.
///
/// Samples are kept exactly (one `u64` each) and sorted once at the end, so
/// the percentiles are exact rather than bucketed: a bench of a few million
/// operations costs a few tens of MB, which is fine for a tool run by hand.
#[derive(Debug, Default, Clone)]
pub(crate) struct Latencies {
    samples: Vec<u64>,
}

/// Summary of a latency distribution.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct LatencySummary {
    /// Median.
    pub(crate) p50_us: f64,
    /// 99th percentile.
    pub(crate) p99_us: f64,
    /// 99.9th percentile.
    pub(crate) p999_us: f64,
    /// Largest sample.
    pub(crate) max_us: f64,
}

impl Latencies {
    pub(crate) fn record(&mut self, d: Duration) {
        self.samples
            .push(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    pub(crate) fn merge(&mut self, other: Self) {
        self.samples.extend(other.samples);
    }

    /// Nearest-rank percentiles; `None` when there are no samples.
    pub(crate) fn summary(&mut self) -> Option<LatencySummary> {
        if self.samples.is_empty() {
            return None;
        }
        self.samples.sort_unstable();
        let n = self.samples.len();
        let rank = |q: f64| {
            let r = (q * n as f64).ceil() as usize;
            self.samples[r.clamp(1, n) - 1] as f64 / 1000.0
        };
        Some(LatencySummary {
            p50_us: rank(0.50),
            p99_us: rank(0.99),
            p999_us: rank(0.999),
            max_us: self.samples[n - 1] as f64 / 1000.0,
        })
    }
}

/// Bytes per second as decimal GB/s.
pub(crate) fn gbps(bytes: u64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 { bytes as f64 / s / 1e9 } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut l = Latencies::default();
        for us in 1..=1000 {
            l.record(Duration::from_micros(us));
        }
        let s = l.summary().unwrap();
        assert_eq!(s.p50_us, 500.0);
        assert_eq!(s.p99_us, 990.0);
        assert_eq!(s.p999_us, 999.0);
        assert_eq!(s.max_us, 1000.0);
    }

    #[test]
    fn empty_has_no_summary() {
        assert!(Latencies::default().summary().is_none());
    }

    #[test]
    fn gbps_of_a_second() {
        assert_eq!(gbps(2_000_000_000, Duration::from_secs(1)), 2.0);
        assert_eq!(gbps(1, Duration::ZERO), 0.0);
    }
}
