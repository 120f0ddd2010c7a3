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

    /// Samples in nanoseconds, as [`into_nanos`](Self::into_nanos) gives
    /// them (another process's, say).
    pub(crate) fn from_nanos(samples: Vec<u64>) -> Self {
        Self { samples }
    }

    /// The samples in nanoseconds, in the order recorded.
    pub(crate) fn into_nanos(self) -> Vec<u64> {
        self.samples
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

/// The machine's CPU time counters (the `cpu` line of `/proc/stat`, in
/// clock ticks summed over every CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CpuTicks {
    /// user, nice, system, irq and softirq (guest time is inside user).
    busy: u64,
    /// idle and iowait.
    idle: u64,
    /// Time the hypervisor ran something else on this VM's CPUs.
    steal: u64,
    /// Online CPUs (the `cpuN` lines).
    cpus: usize,
}

/// How the machine's CPUs were used over a span of time, every process's
/// work included.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct CpuUse {
    /// Online CPUs.
    pub(crate) cpus: usize,
    /// Share of all CPU time spent working, 0 to 1.
    pub(crate) busy: f64,
    /// Share taken by the hypervisor for other guests, 0 to 1.
    pub(crate) steal: f64,
}

/// CPU time the calling thread has used: the first field of
/// `/proc/thread-self/schedstat`, the scheduler's run time of the thread
/// in nanoseconds (what `CLOCK_THREAD_CPUTIME_ID` reports, less the
/// current tick's share not yet accounted). Read from `/proc` rather than
/// through the vDSO so that the bench also runs under valgrind, whose
/// guests have no vDSO mapping to parse. `None` where the file cannot be
/// read or parsed.
pub(crate) fn thread_cpu_time() -> Option<Duration> {
    parse_schedstat(&std::fs::read_to_string("/proc/thread-self/schedstat").ok()?)
}

/// The run time in the text of a `schedstat` file.
fn parse_schedstat(text: &str) -> Option<Duration> {
    let ns = text.split_whitespace().next()?.parse::<u64>().ok()?;
    Some(Duration::from_nanos(ns))
}

/// What the initiator threads themselves (the ones that submit batches
/// and wait for their outcomes, copies made on them included) spent over
/// the timed window; the engine's other threads are not in it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct ThreadCpu {
    /// CPU seconds, summed over the threads.
    pub(crate) seconds: f64,
    /// `seconds` over the threads' wall time (threads x the window), 0 to 1.
    pub(crate) busy: f64,
    /// CPU microseconds per request completed.
    pub(crate) us_per_request: f64,
}

impl ThreadCpu {
    /// `cpu` spent by `threads` threads over `elapsed` for `requests`;
    /// `None` when nothing was measured.
    pub(crate) fn new(
        cpu: Duration,
        threads: usize,
        elapsed: Duration,
        requests: u64,
    ) -> Option<Self> {
        let wall = elapsed.as_secs_f64() * threads as f64;
        (wall > 0.0 && requests > 0).then(|| Self {
            seconds: cpu.as_secs_f64(),
            busy: (cpu.as_secs_f64() / wall).min(1.0),
            us_per_request: cpu.as_secs_f64() * 1e6 / requests as f64,
        })
    }
}

impl CpuTicks {
    /// The counters now; `None` where `/proc/stat` cannot be read or
    /// parsed (not Linux).
    pub(crate) fn now() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Parses the text of `/proc/stat`.
    fn parse(text: &str) -> Option<Self> {
        let line = text.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        if v.len() < 4 {
            return None;
        }
        let sum = |idx: &[usize]| idx.iter().try_fold(0u64, |acc, &i| acc.checked_add(at(i)));
        let cpus = text
            .lines()
            .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .count();
        Some(Self {
            busy: sum(&[0, 1, 2, 5, 6])?,
            idle: sum(&[3, 4])?,
            steal: at(7),
            cpus,
        })
    }

    /// The use between `earlier` and `self`; `None` when no tick passed
    /// (or the counters went back).
    pub(crate) fn since(&self, earlier: &Self) -> Option<CpuUse> {
        let busy = self.busy.checked_sub(earlier.busy)?;
        let idle = self.idle.checked_sub(earlier.idle)?;
        let steal = self.steal.checked_sub(earlier.steal)?;
        let total = (busy + idle + steal) as f64;
        (total > 0.0).then(|| CpuUse {
            cpus: self.cpus,
            busy: busy as f64 / total,
            steal: steal as f64 / total,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_cpu_time_counts_this_threads_work_not_its_sleep() {
        let now = || thread_cpu_time().expect("/proc/thread-self/schedstat");
        let t0 = now();
        std::thread::sleep(Duration::from_millis(50));
        let slept = now() - t0;
        let t1 = now();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let worked = now() - t1;
        assert!(slept < Duration::from_millis(20), "{slept:?} while asleep");
        assert!(worked > slept, "{worked:?} working, {slept:?} asleep");
    }

    #[test]
    fn schedstat_gives_the_run_time_or_nothing() {
        assert_eq!(
            parse_schedstat("353049158 157660 20\n"),
            Some(Duration::from_nanos(353_049_158))
        );
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("-1 0 0"), None);
        assert_eq!(parse_schedstat("abc 0 0"), None);
    }

    #[test]
    fn initiator_cpu_is_per_request_and_per_thread_wall_time() {
        let c =
            ThreadCpu::new(Duration::from_secs(3), 2, Duration::from_secs(2), 1_500_000).unwrap();
        assert_eq!(c.seconds, 3.0);
        assert_eq!(c.busy, 0.75);
        assert_eq!(c.us_per_request, 2.0);
        assert!(ThreadCpu::new(Duration::from_secs(1), 1, Duration::from_secs(1), 0).is_none());
        assert!(ThreadCpu::new(Duration::from_secs(1), 1, Duration::ZERO, 5).is_none());
    }

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

    #[test]
    fn cpu_use_comes_from_the_cpu_line_of_proc_stat() {
        let before = CpuTicks::parse(
            "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\nintr 1 2\n",
        )
        .unwrap();
        let after = CpuTicks::parse(
            "cpu  250 10 100 900 60 5 5 20 0 0\ncpu0 1 1 1 1\ncpu1 1 1 1 1\ncpufreq 1\n",
        )
        .unwrap();
        assert_eq!(before.cpus, 1);
        let u = after.since(&before).unwrap();
        // busy 150 + 10 + 50 + 5 + 5 = 220, idle 100 + 10, steal 20.
        assert_eq!(u.cpus, 2);
        assert!((u.busy - 220.0 / 350.0).abs() < 1e-12, "{u:?}");
        assert!((u.steal - 20.0 / 350.0).abs() < 1e-12, "{u:?}");
        // No tick passed, or the counters went back: no figure.
        assert_eq!(after.since(&after), None);
        assert_eq!(before.since(&after), None);
    }

    #[test]
    fn a_malformed_proc_stat_gives_no_figure() {
        assert_eq!(CpuTicks::parse(""), None);
        assert_eq!(CpuTicks::parse("cpu  1 2\n"), None);
        assert_eq!(CpuTicks::parse("cpu  1 2 x 4\n"), None);
        assert_eq!(
            CpuTicks::parse(&format!("cpu  {} {} 0 0\n", u64::MAX, u64::MAX)),
            None
        );
        // Kernels before 2.6.11 had no steal column.
        let old = CpuTicks::parse("cpu  1 2 3 4\n").unwrap();
        assert_eq!(old.steal, 0);
    }
}
