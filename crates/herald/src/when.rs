//! The times operators type: RFC 3339 (`2026-12-01T14:00:00Z`), a plain date (`2026-12-01`, midnight UTC)
//! or a time ago (`30m`, `1h`, `2d`), each turned into the RFC 3339 the API takes.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;

/// What every error says the accepted forms are.
const FORMS: &str =
    "use RFC 3339 (2026-12-01T14:00:00Z), a date (2026-12-01, midnight UTC) or a time ago (30m, 1h, 2d)";

/// `text` as a moment, relative to `now` for a time ago.
pub(crate) fn parse_at(text: &str, now: OffsetDateTime) -> Result<OffsetDateTime, String> {
    let text = text.trim();
    if let Ok(at) = OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(at);
    }
    if let Ok(date) = time::Date::parse(text, format_description!("[year]-[month]-[day]")) {
        return Ok(date.midnight().assume_utc());
    }
    let ago = text.strip_suffix(" ago").unwrap_or(text);
    if let Ok(duration) = herald_core::retry::parse_duration(ago) {
        return time::Duration::try_from(duration)
            .ok()
            .and_then(|d| now.checked_sub(d))
            .ok_or_else(|| format!("{text:?} is too long ago; {FORMS}"));
    }
    Err(format!("{text:?} is not a time; {FORMS}"))
}

/// A command-line time (clap value parser): RFC 3339 text for the API.
pub(crate) fn parse(text: &str) -> Result<String, String> {
    parse_at(text, herald_core::clock::now().to_datetime()).map(rfc3339)
}

/// A moment as RFC 3339 in UTC, to the second unless it has a fraction.
pub(crate) fn rfc3339(at: OffsetDateTime) -> String {
    at.to_offset(time::UtcOffset::UTC)
        .format(&Rfc3339)
        .unwrap_or_else(|_| at.unix_timestamp().to_string())
}

/// Unix milliseconds as RFC 3339.
pub(crate) fn from_millis(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).map_or_else(|_| ms.to_string(), rfc3339)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const NOW: OffsetDateTime = datetime!(2026-12-01 14:30:00 UTC);

    #[test]
    fn the_three_forms_are_accepted() {
        assert_eq!(
            parse_at("2026-11-29T14:00:00Z", NOW),
            Ok(datetime!(2026-11-29 14:00:00 UTC))
        );
        assert_eq!(
            parse_at("2026-11-29T15:00:00+01:00", NOW),
            Ok(datetime!(2026-11-29 14:00:00 UTC))
        );
        assert_eq!(parse_at("2026-12-01", NOW), Ok(datetime!(2026-12-01 00:00:00 UTC)));
        assert_eq!(parse_at("30m", NOW), Ok(datetime!(2026-12-01 14:00:00 UTC)));
        assert_eq!(parse_at("2d", NOW), Ok(datetime!(2026-11-29 14:30:00 UTC)));
        assert_eq!(parse_at("1h ago", NOW), Ok(datetime!(2026-12-01 13:30:00 UTC)));
        assert_eq!(rfc3339(parse_at("2026-12-01", NOW).unwrap()), "2026-12-01T00:00:00Z");
        assert_eq!(from_millis(1_764_590_400_000), "2025-12-01T12:00:00Z");
    }

    #[test]
    fn an_error_gives_an_example_of_each_form() {
        for bad in ["yesterday", "2026-13-01", "5x", "", "2026-12-01 14:00"] {
            let error = parse_at(bad, NOW).unwrap_err();
            for example in ["2026-12-01T14:00:00Z", "2026-12-01", "1h"] {
                assert!(error.contains(example), "{bad}: {error}");
            }
        }
    }
}
