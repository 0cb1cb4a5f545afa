//! The retry schedule: when the next attempt of a failed delivery happens, and when a delivery is dead.
//!
//! A schedule is the list of delays *between* attempts. The first attempt is immediate, so a schedule of
//! eight delays means nine attempts. The default is dense early (most failures clear within seconds) and
//! bounded (an event nobody accepted in two days is stale): 5 s, 1 min, 5 min, 30 min, 2 h, 6 h, 12 h, 24 h.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How far a scheduled delay may stray either way, as a fraction (±20 %). Jitter spreads the retries of
/// many deliveries that failed together so that a recovering endpoint is not hit by them all at once.
pub const JITTER_FRACTION: f64 = 0.2;

/// A retry schedule: the delays between consecutive attempts of one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule {
    delays: Vec<Duration>,
}

/// Why a schedule string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// One item was not a number followed by a unit (`ms`, `s`, `m`, `h`, `d`).
    #[error("invalid delay {0:?}: expected a number and a unit such as 500ms, 5s, 1m, 2h or 1d")]
    InvalidDelay(String),
    /// The schedule had no delays at all.
    #[error("a retry schedule needs at least one delay")]
    Empty,
    /// More delays than Herald accepts; an attempt counter this large means a configuration mistake.
    #[error("a retry schedule may have at most {max} delays")]
    TooLong {
        /// The maximum accepted length.
        max: usize,
    },
}

impl RetrySchedule {
    /// The most delays a schedule may list.
    pub const MAX_LEN: usize = 50;

    /// Build a schedule from explicit delays.
    pub fn new(delays: Vec<Duration>) -> Result<Self, ScheduleError> {
        if delays.is_empty() {
            return Err(ScheduleError::Empty);
        }
        if delays.len() > Self::MAX_LEN {
            return Err(ScheduleError::TooLong { max: Self::MAX_LEN });
        }
        Ok(Self { delays })
    }

    /// The delays between attempts.
    pub fn delays(&self) -> &[Duration] {
        &self.delays
    }

    /// How many attempts a delivery gets in all (the first one plus one per delay).
    pub fn max_attempts(&self) -> u32 {
        // MAX_LEN keeps this far below u32::MAX.
        self.delays.len() as u32 + 1
    }

    /// The whole window from the first attempt to the last scheduled one, without jitter.
    pub fn window(&self) -> Duration {
        self.delays.iter().sum()
    }

    /// A delivery's time window, counted from its message's creation: the schedule's whole window with
    /// every delay stretched by the largest jitter. A delivery that has waited this long without being
    /// delivered (its endpoint paused, or its circuit open) is dead instead of being attempted.
    pub fn lifetime(&self) -> Duration {
        self.window().mul_f64(1.0 + JITTER_FRACTION)
    }

    /// The delay before the next attempt after `attempts_made` attempts have failed, or `None` when the
    /// delivery has had all its attempts and is dead.
    ///
    /// `jitter` is a number in `[-1, 1]` (the caller draws it at random); it moves the delay by up to
    /// [`JITTER_FRACTION`] of itself either way. Values outside the range are clamped.
    pub fn delay_after(&self, attempts_made: u32, jitter: f64) -> Option<Duration> {
        let index = usize::try_from(attempts_made.checked_sub(1)?).ok()?;
        let base = *self.delays.get(index)?;
        let factor = 1.0 + JITTER_FRACTION * jitter.clamp(-1.0, 1.0);
        Some(base.mul_f64(factor))
    }
}

impl Default for RetrySchedule {
    fn default() -> Self {
        const MIN: u64 = 60;
        const HOUR: u64 = 3600;
        let secs = [5, MIN, 5 * MIN, 30 * MIN, 2 * HOUR, 6 * HOUR, 12 * HOUR, 24 * HOUR];
        Self {
            delays: secs.into_iter().map(Duration::from_secs).collect(),
        }
    }
}

impl FromStr for RetrySchedule {
    type Err = ScheduleError;

    /// Parse a comma-separated list such as `5s,1m,5m,30m,2h,6h,12h,24h` (spaces allowed).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let delays = s
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(parse_duration)
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(delays)
    }
}

impl fmt::Display for RetrySchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<String> = self.delays.iter().map(|d| format_duration(*d)).collect();
        f.write_str(&items.join(","))
    }
}

/// Parse one human duration: an unsigned integer followed by `ms`, `s`, `m`, `h` or `d`.
pub fn parse_duration(item: &str) -> Result<Duration, ScheduleError> {
    let invalid = || ScheduleError::InvalidDelay(item.to_owned());
    let split = item.find(|c: char| !c.is_ascii_digit()).ok_or_else(invalid)?;
    let (digits, unit) = item.split_at(split);
    if digits.is_empty() {
        return Err(invalid());
    }
    let value: u64 = digits.parse().map_err(|_| invalid())?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(invalid()),
    };
    value
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(invalid)
}

/// Format a duration in the largest unit that divides it exactly (the inverse of [`parse_duration`]).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [("d", 86_400_000u128), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms != 0 && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_schedule_has_nine_attempts_over_about_45_hours() {
        let s = RetrySchedule::default();
        assert_eq!(s.max_attempts(), 9);
        let hours = s.window().as_secs_f64() / 3600.0;
        assert!((44.0..46.0).contains(&hours), "{hours}");
        assert_eq!(s.to_string(), "5s,1m,5m,30m,2h,6h,12h,1d");
    }

    #[test]
    fn parses_and_round_trips() {
        let s: RetrySchedule = "100ms, 200ms,5s,1m,2h,1d".parse().unwrap();
        assert_eq!(s.delays()[0], Duration::from_millis(100));
        assert_eq!(s.delays()[5], Duration::from_secs(86_400));
        assert_eq!(s.to_string().parse::<RetrySchedule>().unwrap(), s);
    }

    #[test]
    fn rejects_bad_schedules() {
        for bad in ["", ",", "5", "s", "5x", "-5s", "5 s", "1.5s", "99999999999999999999s"] {
            assert!(bad.parse::<RetrySchedule>().is_err(), "{bad:?} accepted");
        }
        let long = vec!["1s"; RetrySchedule::MAX_LEN + 1].join(",");
        assert_eq!(
            long.parse::<RetrySchedule>(),
            Err(ScheduleError::TooLong {
                max: RetrySchedule::MAX_LEN
            })
        );
    }

    #[test]
    fn delay_after_walks_the_schedule_then_stops() {
        let s: RetrySchedule = "1s,2s".parse().unwrap();
        assert_eq!(s.delay_after(0, 0.0), None, "no attempt made yet: nothing to retry");
        assert_eq!(s.delay_after(1, 0.0), Some(Duration::from_secs(1)));
        assert_eq!(s.delay_after(2, 0.0), Some(Duration::from_secs(2)));
        assert_eq!(s.delay_after(3, 0.0), None, "third attempt was the last");
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        let s: RetrySchedule = "10s".parse().unwrap();
        assert_eq!(s.delay_after(1, 1.0), Some(Duration::from_secs(12)));
        assert_eq!(s.delay_after(1, -1.0), Some(Duration::from_secs(8)));
        assert_eq!(s.delay_after(1, 7.0), Some(Duration::from_secs(12)), "clamped");
        for i in 0..=100 {
            let j = f64::from(i) / 50.0 - 1.0;
            let d = s.delay_after(1, j).unwrap();
            assert!(d >= Duration::from_secs(8) && d <= Duration::from_secs(12));
        }
    }
}
