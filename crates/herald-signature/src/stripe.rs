//! Stripe's `Stripe-Signature` scheme.
//!
//! The header looks like `t=1700000000,v1=5257a8…,v0=…`: a Unix timestamp and
//! one or more `v1` signatures, each the lowercase hex HMAC-SHA256 of
//! `{t}.{raw body}` keyed with the endpoint secret *as UTF-8 text* (the whole
//! `whsec_…` string, not base64-decoded). `v0` and other schemes are ignored.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use herald_signature::stripe;
//!
//! let secret = "whsec_test_secret";
//! let body = br#"{"id":"evt_test","object":"event"}"#;
//! let header = stripe::sign(secret, 1_700_000_000, body);
//! stripe::verify(secret, &header, body, 1_700_000_042, Duration::from_secs(300))?;
//! # Ok::<(), herald_signature::VerifyError>(())
//! ```

use std::time::Duration;

use hmac::Mac;

use crate::VerifyError;
use crate::util;

/// Name of the header Stripe sends (`Stripe-Signature`).
pub const HEADER: &str = "Stripe-Signature";

/// Stripe's default tolerance, five minutes.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// Builds a `Stripe-Signature` header value, `t={timestamp},v1={hex}`.
///
/// Useful to test a Stripe receiver without Stripe.
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    format!("t={timestamp},v1={}", hex::encode(mac(secret, timestamp, body)))
}

/// Verifies a `Stripe-Signature` header against `secret`.
///
/// * `secret` — the endpoint secret exactly as Stripe shows it (`whsec_…`);
/// * `header` — the `Stripe-Signature` header, verbatim;
/// * `body` — the raw request body;
/// * `now_unix` — the current time in seconds since the Unix epoch;
/// * `tolerance` — how far `t` may be from `now_unix` (whole seconds, bounds
///   inclusive). Unlike Stripe's own libraries, which only reject old
///   timestamps, this checks both directions.
///
/// The header is a comma-separated list of `key=value` items. Exactly one `t`
/// item is required; every `v1` item is a candidate signature (lowercase or
/// uppercase hex), compared in constant time; other items are ignored.
///
/// # Errors
///
/// * [`VerifyError::MissingHeader`] if `header` is empty;
/// * [`VerifyError::MalformedSignatureHeader`] if there is no `t` item or more
///   than one;
/// * [`VerifyError::BadTimestamp`] if `t` is not a canonical decimal integer;
/// * [`VerifyError::TooOld`] / [`VerifyError::TooNew`] outside the tolerance;
/// * [`VerifyError::NoMatchingSignature`] if no `v1` item matches (including
///   when there is none).
pub fn verify(secret: &str, header: &str, body: &[u8], now_unix: i64, tolerance: Duration) -> Result<(), VerifyError> {
    if header.trim().is_empty() {
        return Err(VerifyError::MissingHeader(HEADER));
    }
    let (timestamp, candidates) = parse_header(header)?;
    util::check_tolerance(timestamp, now_unix, util::duration_secs(tolerance))?;

    let mut template = util::hmac_sha256(secret.as_bytes());
    template.update(timestamp.to_string().as_bytes());
    template.update(b".");
    template.update(body);

    let matched = candidates.iter().any(|candidate| {
        let mut tag = [0u8; 32];
        // Wrong length or non-hex: cannot match.
        hex::decode_to_slice(candidate, &mut tag).is_ok() && template.clone().verify_slice(&tag).is_ok()
    });
    if matched {
        Ok(())
    } else {
        Err(VerifyError::NoMatchingSignature)
    }
}

/// Like [`verify`], reading the system clock for `now`.
///
/// # Errors
///
/// As for [`verify`].
pub fn verify_now(secret: &str, header: &str, body: &[u8], tolerance: Duration) -> Result<(), VerifyError> {
    verify(secret, header, body, util::unix_now(), tolerance)
}

/// Splits the header into the parsed `t` and the `v1` candidates.
fn parse_header(header: &str) -> Result<(i64, Vec<&str>), VerifyError> {
    let mut timestamp: Option<&str> = None;
    let mut candidates: Vec<&str> = Vec::new();
    for item in header.split(',') {
        let Some((key, value)) = item.trim().split_once('=') else {
            continue;
        };
        match key {
            "t" if timestamp.is_some() => return Err(VerifyError::MalformedSignatureHeader),
            "t" => timestamp = Some(value),
            "v1" => candidates.push(value),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(VerifyError::MalformedSignatureHeader)?;
    Ok((util::parse_timestamp(timestamp)?, candidates))
}

fn mac(secret: &str, timestamp: i64, body: &[u8]) -> [u8; 32] {
    let mut mac = util::hmac_sha256(secret.as_bytes());
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: Duration = DEFAULT_TOLERANCE;

    #[test]
    fn round_trip_and_errors() {
        let h = sign("s", 1000, b"body");
        assert_eq!(verify("s", &h, b"body", 1000, TOL), Ok(()));
        assert_eq!(
            verify("s", &h, b"body!", 1000, TOL),
            Err(VerifyError::NoMatchingSignature)
        );
        assert_eq!(
            verify("t", &h, b"body", 1000, TOL),
            Err(VerifyError::NoMatchingSignature)
        );
        assert_eq!(verify("s", &h, b"body", 1300, TOL), Ok(()));
        assert_eq!(verify("s", &h, b"body", 1301, TOL), Err(VerifyError::TooOld));
        assert_eq!(verify("s", &h, b"body", 700, TOL), Ok(()));
        assert_eq!(verify("s", &h, b"body", 699, TOL), Err(VerifyError::TooNew));
        assert_eq!(
            verify("s", "", b"body", 1000, TOL),
            Err(VerifyError::MissingHeader(HEADER))
        );
        assert_eq!(
            verify("s", "v1=00", b"body", 1000, TOL),
            Err(VerifyError::MalformedSignatureHeader)
        );
        assert_eq!(
            verify("s", "t=1000,t=1000", b"body", 1000, TOL),
            Err(VerifyError::MalformedSignatureHeader)
        );
        assert_eq!(
            verify("s", "t=-1000,v1=00", b"body", 1000, TOL),
            Err(VerifyError::BadTimestamp)
        );
        assert_eq!(
            verify("s", "t=1000", b"body", 1000, TOL),
            Err(VerifyError::NoMatchingSignature)
        );
        assert_eq!(
            verify("s", "t=1000,v1=zz", b"body", 1000, TOL),
            Err(VerifyError::NoMatchingSignature)
        );
        // Several v1 entries (secret rotation), v0 ignored, spaces tolerated.
        let sig = &h[h.find("v1=").unwrap()..];
        let multi = format!("t=1000, v0=abc, v1={}, {sig}", "0".repeat(64));
        assert_eq!(verify("s", &multi, b"body", 1000, TOL), Ok(()));
        // Upper-case hex is accepted.
        assert_eq!(
            verify(
                "s",
                &h.to_uppercase().replace("T=", "t=").replace("V1=", "v1="),
                b"body",
                1000,
                TOL
            ),
            Ok(())
        );
        assert_eq!(verify_now("s", &h, b"body", TOL), Err(VerifyError::TooOld));
    }
}
