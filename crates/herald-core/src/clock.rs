//! Time as Herald stores it: [`Millis`], a point in time in Unix milliseconds, and [`now`], the one place
//! Herald reads the wall clock.
//!
//! A point in time and a span are different types: a [`Millis`] is a moment, a [`Duration`] (or a count of
//! milliseconds named `…_ms`) is a span. A moment plus or minus a span is a moment, the span between two
//! moments is [`Millis::duration_since`] (or the signed [`Millis::ms_since`]), and a moment plus a moment
//! does not compile, so a due time cannot be passed where a delay is expected, or the other way round.
//!
//! The pure logic in this crate never calls [`now`]; the I/O shells (store, engine, API) do, and hand the
//! value in. The raw `i64` appears only at the edges: the wire, and SQL, where the stores bind and read a
//! `Millis` as the integer column it is stored in (the `sqlx` feature).

use std::ops::{Add, Sub};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::OffsetDateTime;

/// A point in time in milliseconds since the Unix epoch, on whichever clock the caller uses consistently
/// (the wall clock's [`now`] in production, a virtual one in tests).
///
/// Arithmetic saturates: a moment far in the future (`Millis::MAX`, "never") plus a delay stays there
/// instead of wrapping into the past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(transparent))]
#[repr(transparent)]
pub struct Millis(i64);

impl Millis {
    /// The Unix epoch (1970-01-01T00:00:00Z): also the start of a virtual clock.
    pub const EPOCH: Millis = Millis(0);
    /// The latest moment: "never" where a due time is required.
    pub const MAX: Millis = Millis(i64::MAX);

    /// The moment `ms` milliseconds after the Unix epoch (before it when negative): for values read from
    /// storage or the wire, and for a virtual clock's moments in tests.
    pub const fn from_unix_ms(ms: i64) -> Self {
        Millis(ms)
    }

    /// Milliseconds since the Unix epoch: for storage and the wire only.
    pub const fn as_unix_ms(self) -> i64 {
        self.0
    }

    /// Whole seconds since the Unix epoch (rounded down): for wire formats that count in seconds
    /// (signature timestamps).
    pub const fn as_unix_secs(self) -> i64 {
        self.0.div_euclid(1_000)
    }

    /// `span` later (saturating).
    pub fn saturating_add(self, span: Duration) -> Self {
        Millis(self.0.saturating_add(duration_ms(span)))
    }

    /// `span` earlier (saturating).
    pub fn saturating_sub(self, span: Duration) -> Self {
        Millis(self.0.saturating_sub(duration_ms(span)))
    }

    /// `ms` milliseconds later, or earlier when negative (saturating): for spans kept as millisecond
    /// counts (a stored retention period, a bucket's width).
    pub const fn add_ms(self, ms: i64) -> Self {
        Millis(self.0.saturating_add(ms))
    }

    /// The span from `earlier` to `self`; zero when `earlier` is not earlier.
    pub fn duration_since(self, earlier: Millis) -> Duration {
        Duration::from_millis(u64::try_from(self.ms_since(earlier)).unwrap_or(0))
    }

    /// Milliseconds from `earlier` to `self`, negative when `earlier` is later (saturating): for ages and
    /// offsets shown or stored as millisecond counts.
    pub const fn ms_since(self, earlier: Millis) -> i64 {
        self.0.saturating_sub(earlier.0)
    }

    /// The moment a [`SystemTime`] names (saturating; before the epoch is negative).
    pub fn from_system_time(at: SystemTime) -> Self {
        match at.duration_since(UNIX_EPOCH) {
            Ok(after) => Millis(duration_ms(after)),
            Err(before) => Millis(duration_ms(before.duration()).saturating_neg()),
        }
    }

    /// The moment as a [`SystemTime`] (for HTTP dates); before the epoch reads as the epoch.
    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(u64::try_from(self.0).unwrap_or(0))
    }

    /// The moment as a date-time in UTC, for the wire (RFC 3339). A moment outside the years a
    /// date-time can hold reads as the epoch.
    pub fn to_datetime(self) -> OffsetDateTime {
        self.checked_datetime().unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    /// The moment as a date-time in UTC, `None` outside the years a date-time can hold.
    pub fn checked_datetime(self) -> Option<OffsetDateTime> {
        OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.0) * 1_000_000).ok()
    }

    /// The moment as RFC 3339 text in UTC (what the API and the operational events show), `None` outside
    /// the years a date-time can hold.
    pub fn to_rfc3339(self) -> Option<String> {
        self.checked_datetime()?
            .format(&time::format_description::well_known::Rfc3339)
            .ok()
    }

    /// The moment a date-time names, to the millisecond (saturating far outside the supported range).
    pub fn from_datetime(at: OffsetDateTime) -> Self {
        let ms = at.unix_timestamp_nanos() / 1_000_000;
        Millis(i64::try_from(ms).unwrap_or(if ms < 0 { i64::MIN } else { i64::MAX }))
    }
}

/// A span in whole milliseconds, saturating at `i64::MAX` (some 292 million years).
fn duration_ms(span: Duration) -> i64 {
    i64::try_from(span.as_millis()).unwrap_or(i64::MAX)
}

impl Add<Duration> for Millis {
    type Output = Millis;

    /// `span` later (saturating, as [`Millis::saturating_add`]).
    fn add(self, span: Duration) -> Millis {
        self.saturating_add(span)
    }
}

impl Sub<Duration> for Millis {
    type Output = Millis;

    /// `span` earlier (saturating, as [`Millis::saturating_sub`]).
    fn sub(self, span: Duration) -> Millis {
        self.saturating_sub(span)
    }
}

/// The wall clock now, to the millisecond (0 if the clock is before the epoch; saturating far in the
/// future). The one reading of the wall clock for everything Herald stores or decides with.
pub fn now() -> Millis {
    Millis::from_system_time(system_now()).max(Millis::EPOCH)
}

/// The wall clock as a [`SystemTime`], for the shells that need more than milliseconds (a benchmark's
/// microsecond arrival times). This is the one place Herald reads the wall clock (see `clippy.toml`).
#[allow(clippy::disallowed_methods)]
pub fn system_now() -> SystemTime {
    SystemTime::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_and_spans_combine_saturating() {
        let t = Millis::from_unix_ms(1_000);
        assert_eq!(t + Duration::from_millis(500), Millis::from_unix_ms(1_500));
        assert_eq!(t - Duration::from_secs(2), Millis::from_unix_ms(-1_000));
        assert_eq!(Millis::MAX + Duration::from_secs(1), Millis::MAX);
        assert_eq!(t.add_ms(-1_000), Millis::EPOCH);
        assert_eq!(Millis::MAX.add_ms(1), Millis::MAX);
        assert_eq!(
            Millis::from_unix_ms(1_500).duration_since(t),
            Duration::from_millis(500)
        );
        assert_eq!(
            t.duration_since(Millis::from_unix_ms(1_500)),
            Duration::ZERO,
            "never negative"
        );
        assert_eq!(t.ms_since(Millis::from_unix_ms(1_500)), -500);
        assert_eq!(Millis::MAX.ms_since(Millis::from_unix_ms(-1)), i64::MAX);
    }

    #[test]
    fn conversions_at_the_edges_round_trip() {
        let t = Millis::from_unix_ms(1_764_000_000_123);
        assert_eq!(Millis::from_system_time(t.to_system_time()), t);
        assert_eq!(Millis::from_datetime(t.to_datetime()), t);
        assert_eq!(t.to_datetime().unix_timestamp(), 1_764_000_000);
        assert_eq!(
            Millis::MAX.to_datetime(),
            OffsetDateTime::UNIX_EPOCH,
            "out of range reads as the epoch"
        );
        assert_eq!(
            Millis::from_system_time(UNIX_EPOCH - Duration::from_millis(5)),
            Millis::from_unix_ms(-5)
        );
        assert_eq!(serde_json_text(t), "1764000000123", "serde sees the bare number");
    }

    fn serde_json_text(t: Millis) -> String {
        serde_json::to_string(&t).unwrap_or_default()
    }
}
