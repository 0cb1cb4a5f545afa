//! Latency statistics: samples in microseconds in, p50 / p99 / max out.

use serde::Serialize;

use crate::receiver::Arrival;

/// Summary of a set of latency samples. All values are in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencyStats {
    /// Number of samples.
    pub count: usize,
    /// Median (nearest rank).
    pub p50_us: u64,
    /// 99th percentile (nearest rank).
    pub p99_us: u64,
    /// Largest sample.
    pub max_us: u64,
    /// Arithmetic mean.
    pub mean_us: u64,
}

impl LatencyStats {
    /// Summarise `samples` (any order); `None` when there are none.
    pub fn from_samples(mut samples: Vec<u64>) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        Some(Self::from_sorted(&samples))
    }

    /// Summarise samples sorted in ascending order; the slice must not be empty.
    fn from_sorted(sorted: &[u64]) -> Self {
        let total: u128 = sorted.iter().map(|&s| u128::from(s)).sum();
        let count = sorted.len();
        Self {
            count,
            p50_us: percentile(sorted, 50.0),
            p99_us: percentile(sorted, 99.0),
            max_us: sorted[count - 1],
            mean_us: u64::try_from(total / count as u128).unwrap_or(u64::MAX),
        }
    }

    /// Median in milliseconds.
    pub fn p50_ms(&self) -> f64 {
        us_to_ms(self.p50_us)
    }

    /// 99th percentile in milliseconds.
    pub fn p99_ms(&self) -> f64 {
        us_to_ms(self.p99_us)
    }

    /// Maximum in milliseconds.
    pub fn max_ms(&self) -> f64 {
        us_to_ms(self.max_us)
    }
}

/// The median and range of a few figures (one per round or per run), as the performance notes give them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// Median (nearest rank: the middle one of an odd count, the lower middle one of an even count).
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; `None` when there are none (or one is not a number).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut sorted: Vec<f64> = values.into_iter().collect();
        if sorted.is_empty() || sorted.iter().any(|v| v.is_nan()) {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        Some(Self {
            median: sorted[sorted.len().div_ceil(2) - 1],
            min: sorted[0],
            max: sorted[sorted.len() - 1],
        })
    }
}

/// Nearest-rank percentile of a sorted, non-empty slice (`p` in 0–100).
fn percentile(sorted: &[u64], p: f64) -> u64 {
    let n = sorted.len();
    // Nearest rank: the smallest value with at least p % of the samples at or below it.
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// Microseconds to milliseconds.
pub fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// `count` events over `seconds`, per second (0 when no time passed).
pub fn rate(count: u64, seconds: f64) -> f64 {
    if seconds > 0.0 { count as f64 / seconds } else { 0.0 }
}

/// The deliveries of one phase as reported.
#[derive(Debug, Clone, Serialize)]
pub struct DeliverySummary {
    /// Deliveries the phase should produce (accepted messages × subscribed endpoints).
    pub expected: u64,
    /// Deliveries received.
    pub delivered: u64,
    /// Whether all expected deliveries arrived before the wait timed out.
    pub complete: bool,
    /// From the start of the phase's load to the last arrival, in seconds.
    pub seconds: f64,
    /// Deliveries per second over that time.
    pub deliveries_per_s: f64,
    /// Lag from send (`sent_at_us`) to arrival.
    pub lag: Option<LatencyStats>,
}

impl DeliverySummary {
    /// Summarise `arrivals` of a phase whose load started at `started_at_us`.
    pub fn of(expected: u64, delivered: u64, arrivals: &[Arrival], started_at_us: u64) -> Self {
        let last = arrivals.iter().map(|a| a.arrived_at_us).max().unwrap_or(started_at_us);
        let seconds = last.saturating_sub(started_at_us) as f64 / 1e6;
        Self {
            expected,
            delivered,
            complete: delivered >= expected,
            seconds,
            deliveries_per_s: rate(delivered, seconds),
            lag: LatencyStats::from_samples(arrivals.iter().map(Arrival::lag_us).collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_gives_the_middle_figure_and_the_range() {
        let odd = Spread::of([30.0, 10.0, 50.0, 20.0, 40.0]).expect("five figures");
        assert_eq!((odd.median, odd.min, odd.max), (30.0, 10.0, 50.0));
        let even = Spread::of([4.0, 1.0, 3.0, 2.0]).expect("four figures");
        assert_eq!((even.median, even.min, even.max), (2.0, 1.0, 4.0));
        assert_eq!(Spread::of([]), None);
        assert_eq!(Spread::of([1.0, f64::NAN]), None);
    }

    #[test]
    fn empty_has_no_stats() {
        assert_eq!(LatencyStats::from_samples(Vec::new()), None);
    }

    #[test]
    fn nearest_rank() {
        let samples: Vec<u64> = (1..=100).rev().collect();
        let stats = LatencyStats::from_samples(samples).unwrap();
        assert_eq!(stats.count, 100);
        assert_eq!(stats.p50_us, 50);
        assert_eq!(stats.p99_us, 99);
        assert_eq!(stats.max_us, 100);
        assert_eq!(stats.mean_us, 50);
        let one = LatencyStats::from_samples(vec![7]).unwrap();
        assert_eq!((one.p50_us, one.p99_us, one.max_us), (7, 7, 7));
    }

    #[test]
    fn p99_sees_the_tail() {
        let mut samples = vec![1_000; 990];
        samples.extend([50_000; 10]);
        let stats = LatencyStats::from_samples(samples).unwrap();
        assert_eq!(stats.p50_us, 1_000);
        assert_eq!(stats.p99_us, 1_000);
        let mut samples = vec![1_000; 989];
        samples.extend([50_000; 11]);
        assert_eq!(LatencyStats::from_samples(samples).unwrap().p99_us, 50_000);
    }
}
