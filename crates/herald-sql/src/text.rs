//! PostgreSQL's `text` cannot hold NUL, but Herald's free-text values may contain one (they round-trip
//! exactly on SQLite, and a receiver's response body is whatever it sent). Such values are stored
//! escaped: U+FFFF — a noncharacter, never meaningful in interchange — escapes NUL (`U+FFFF 0`) and
//! itself (`U+FFFF U+FFFF`). The mapping is injective, so equality lookups and unique keys on escaped
//! values behave as on the originals.
//!
//! Both stores use it: `herald inbox` stores what the network sends it on PostgreSQL too, with the same
//! escaping.

use std::borrow::Cow;

const ESCAPE: char = '\u{FFFF}';

/// The stored form of a value.
pub fn escape(value: &str) -> Cow<'_, str> {
    if !value.contains(['\0', ESCAPE]) {
        return Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        match c {
            '\0' => {
                out.push(ESCAPE);
                out.push('0');
            }
            ESCAPE => {
                out.push(ESCAPE);
                out.push(ESCAPE);
            }
            other => out.push(other),
        }
    }
    Cow::Owned(out)
}

/// An optional value's stored form.
pub fn escape_opt(value: Option<&str>) -> Option<Cow<'_, str>> {
    value.map(escape)
}

/// The original of a stored value.
pub fn unescape(stored: String) -> String {
    if !stored.contains(ESCAPE) {
        return stored;
    }
    let mut out = String::with_capacity(stored.len());
    let mut chars = stored.chars();
    while let Some(c) = chars.next() {
        if c != ESCAPE {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('0') => out.push('\0'),
            Some(ESCAPE) => out.push(ESCAPE),
            // Not written by `escape`: keep it as it is.
            Some(other) => {
                out.push(ESCAPE);
                out.push(other);
            }
            None => out.push(ESCAPE),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_stays_injective() {
        for value in ["plain", "nul\0byte", "\u{FFFF}", "\u{FFFF}0", "\0\u{FFFF}\0", ""] {
            assert_eq!(unescape(escape(value).into_owned()), value);
            assert!(!escape(value).contains('\0'));
        }
        assert_ne!(escape("\0"), escape("\u{FFFF}0"));
        assert!(matches!(escape("plain"), Cow::Borrowed(_)));
    }
}
