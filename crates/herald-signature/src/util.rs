//! Small shared helpers: base64 engines, HMAC, timestamps, key prefixes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_PAD_INDIFFERENT};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::{SecretError, VerifyError};

/// HMAC-SHA256 as used by every scheme in this crate.
pub(crate) type HmacSha256 = Hmac<Sha256>;

/// Key prefixes recognised by [`strip_key_prefix`].
pub(crate) const WHSEC: &str = "whsec_";
pub(crate) const WHSK: &str = "whsk_";
pub(crate) const WHPK: &str = "whpk_";
const KNOWN_PREFIXES: [&str; 3] = [WHSEC, WHSK, WHPK];

/// A fresh HMAC-SHA256 instance keyed with `key` (any length, including 0).
pub(crate) fn hmac_sha256(key: &[u8]) -> HmacSha256 {
    match <HmacSha256 as KeyInit>::new_from_slice(key) {
        Ok(mac) => mac,
        // HMAC hashes over-long keys and pads short ones, so `new_from_slice`
        // cannot fail; this arm exists only because the trait is fallible.
        Err(_) => unreachable!("HMAC accepts keys of any length"),
    }
}

/// Feeds `{msg_id}.{timestamp}.{body}` into `mac`.
pub(crate) fn update_standard_content(mac: &mut HmacSha256, msg_id: &str, timestamp: i64, body: &[u8]) {
    mac.update(msg_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
}

/// `{msg_id}.{timestamp}.{body}` as one buffer (for Ed25519, which needs the
/// whole message).
pub(crate) fn standard_content(msg_id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
    let ts = timestamp.to_string();
    let mut out = Vec::with_capacity(msg_id.len() + ts.len() + body.len() + 2);
    out.extend_from_slice(msg_id.as_bytes());
    out.push(b'.');
    out.extend_from_slice(ts.as_bytes());
    out.push(b'.');
    out.extend_from_slice(body);
    out
}

/// Standard padded base64 (what we emit).
pub(crate) fn b64_encode(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Strict standard padded base64 (what signatures must use: one canonical
/// encoding per byte string).
pub(crate) fn b64_decode_strict(s: &str) -> Option<Vec<u8>> {
    STANDARD.decode(s).ok()
}

/// Standard base64 with or without padding (what keys may use).
pub(crate) fn b64_decode_key(s: &str) -> Result<Vec<u8>, SecretError> {
    STANDARD_PAD_INDIFFERENT
        .decode(s)
        .map_err(|_| SecretError::InvalidBase64)
}

/// Trims surrounding whitespace and removes `expected` if present.
///
/// A different known prefix is an error; no prefix at all is accepted. The
/// remainder must not be empty.
pub(crate) fn strip_key_prefix<'a>(s: &'a str, expected: &'static str) -> Result<&'a str, SecretError> {
    let s = s.trim();
    let rest = match s.strip_prefix(expected) {
        Some(rest) => rest,
        None => {
            if let Some(found) = KNOWN_PREFIXES.iter().find(|p| s.starts_with(**p)) {
                return Err(SecretError::WrongPrefix { expected, found });
            }
            s
        }
    };
    if rest.is_empty() {
        return Err(SecretError::Empty);
    }
    Ok(rest)
}

/// Parses a canonical unsigned decimal integer: ASCII digits only, no sign, no
/// whitespace, no leading zero (except `"0"`), fitting in an `i64`.
///
/// Canonical form matters because the signed content embeds the timestamp as
/// text: rejecting `0123` means the header text and the integer we re-format
/// can never disagree.
pub(crate) fn parse_timestamp(s: &str) -> Result<i64, VerifyError> {
    let bytes = s.as_bytes();
    if bytes.is_empty() || (bytes.len() > 1 && bytes[0] == b'0') {
        return Err(VerifyError::BadTimestamp);
    }
    let mut value: i64 = 0;
    for &b in bytes {
        if !b.is_ascii_digit() {
            return Err(VerifyError::BadTimestamp);
        }
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(i64::from(b - b'0')))
            .ok_or(VerifyError::BadTimestamp)?;
    }
    Ok(value)
}

/// Whole seconds in `d`, saturated to `i64::MAX`.
pub(crate) fn duration_secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// Checks `|now - timestamp| <= tolerance` (bounds inclusive).
pub(crate) fn check_tolerance(timestamp: i64, now_unix: i64, tolerance_secs: i64) -> Result<(), VerifyError> {
    // i128 so that extreme inputs cannot overflow.
    let age = i128::from(now_unix) - i128::from(timestamp);
    let tol = i128::from(tolerance_secs);
    if age > tol {
        Err(VerifyError::TooOld)
    } else if -age > tol {
        Err(VerifyError::TooNew)
    } else {
        Ok(())
    }
}

/// The current time in whole seconds since the Unix epoch (negative before
/// 1970, saturating at the `i64` range).
// This crate is embedded by receivers and depends on no other Herald crate: its one wall-clock read (the
// default `now` of verification, which callers may pass in instead) is here.
#[allow(clippy::disallowed_methods)]
pub(crate) fn unix_now() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => duration_secs(d),
        Err(e) => duration_secs(e.duration()).saturating_neg(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_strict() {
        assert_eq!(parse_timestamp("0"), Ok(0));
        assert_eq!(parse_timestamp("1614265330"), Ok(1_614_265_330));
        assert_eq!(parse_timestamp("9223372036854775807"), Ok(i64::MAX));
        for bad in [
            "",
            " 1",
            "1 ",
            "+1",
            "-1",
            "01",
            "00",
            "1.0",
            "1e3",
            "0x10",
            "9223372036854775808",
            "99999999999999999999999",
            "١٢٣", // non-ASCII digits
            "\u{0}",
        ] {
            assert_eq!(parse_timestamp(bad), Err(VerifyError::BadTimestamp), "{bad:?}");
        }
    }

    #[test]
    fn tolerance_is_inclusive_and_overflow_free() {
        assert_eq!(check_tolerance(100, 400, 300), Ok(()));
        assert_eq!(check_tolerance(100, 401, 300), Err(VerifyError::TooOld));
        assert_eq!(check_tolerance(400, 100, 300), Ok(()));
        assert_eq!(check_tolerance(401, 100, 300), Err(VerifyError::TooNew));
        assert_eq!(check_tolerance(i64::MAX, i64::MIN, i64::MAX), Err(VerifyError::TooNew));
        assert_eq!(check_tolerance(i64::MIN, i64::MAX, i64::MAX), Err(VerifyError::TooOld));
        assert_eq!(check_tolerance(5, 5, 0), Ok(()));
    }

    #[test]
    fn prefixes() {
        assert_eq!(strip_key_prefix("whsec_abc", WHSEC), Ok("abc"));
        assert_eq!(strip_key_prefix("  abc\n", WHSEC), Ok("abc"));
        assert_eq!(strip_key_prefix("whsec_", WHSEC), Err(SecretError::Empty));
        assert_eq!(strip_key_prefix("", WHSEC), Err(SecretError::Empty));
        assert_eq!(
            strip_key_prefix("whpk_abc", WHSK),
            Err(SecretError::WrongPrefix {
                expected: WHSK,
                found: WHPK
            })
        );
    }

    #[test]
    fn now_is_after_2020() {
        assert!(unix_now() > 1_577_836_800);
    }
}
