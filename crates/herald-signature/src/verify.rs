//! Standard Webhooks verification.

use std::time::Duration;

use subtle::ConstantTimeEq;

use crate::util;
use crate::{Ed25519PublicKey, Ed25519SigningKey, HmacSecret, VerifyError};

/// The default timestamp tolerance: five minutes, in both directions.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// Name of the header carrying the message id (`webhook-id`).
pub const HEADER_ID: &str = "webhook-id";
/// Name of the header carrying the Unix timestamp in seconds
/// (`webhook-timestamp`).
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// Name of the header carrying the signatures (`webhook-signature`).
pub const HEADER_SIGNATURE: &str = "webhook-signature";

/// Joins signature entries into a `webhook-signature` header value.
///
/// During a key rotation every still-valid key signs the message and the
/// entries are sent together, separated by single spaces; a receiver accepts
/// the message if any entry verifies against any of its keys.
///
/// # Examples
///
/// ```
/// use herald_signature::{signature_header, Ed25519SigningKey, HmacSecret};
///
/// let old = HmacSecret::from_bytes(&[1; 24])?;
/// let new = HmacSecret::from_bytes(&[2; 24])?;
/// let asym = Ed25519SigningKey::from_seed(&[3; 32]);
/// let (id, ts, body) = ("msg_1", 1_700_000_000, b"{}".as_slice());
///
/// let header = signature_header(&[
///     old.sign(id, ts, body),
///     new.sign(id, ts, body),
///     asym.sign(id, ts, body),
/// ]);
/// assert_eq!(header.split(' ').count(), 3);
/// # Ok::<(), herald_signature::SecretError>(())
/// ```
pub fn signature_header(signatures: &[String]) -> String {
    signatures.join(" ")
}

/// A key a [`Verifier`] accepts signatures from.
///
/// Build one with `From`: `VerifyKey::from(secret)` or `secret.into()`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerifyKey {
    /// A symmetric secret; matches `v1,` entries.
    Hmac(HmacSecret),
    /// An Ed25519 public key; matches `v1a,` entries.
    Ed25519(Ed25519PublicKey),
}

impl From<HmacSecret> for VerifyKey {
    fn from(secret: HmacSecret) -> Self {
        Self::Hmac(secret)
    }
}

impl From<Ed25519PublicKey> for VerifyKey {
    fn from(key: Ed25519PublicKey) -> Self {
        Self::Ed25519(key)
    }
}

/// Uses the public half of the key pair.
impl From<&Ed25519SigningKey> for VerifyKey {
    fn from(key: &Ed25519SigningKey) -> Self {
        Self::Ed25519(key.public_key())
    }
}

/// Verifies Standard Webhooks signatures against a set of keys.
///
/// A message is accepted when its timestamp is within the tolerance of `now`
/// (five minutes by default, in both directions, bounds inclusive) and at
/// least one entry of the `webhook-signature` header verifies against at least
/// one key:
///
/// * the header is a list of `version,base64` entries separated by spaces
///   (repeated spaces are tolerated);
/// * `v1` entries are compared, in constant time, with the HMAC-SHA256 of
///   `{id}.{timestamp}.{body}` under each [`VerifyKey::Hmac`] key;
/// * `v1a` entries are checked with strict Ed25519 verification under each
///   [`VerifyKey::Ed25519`] key;
/// * entries of other versions (`v2,…`) are ignored, as are tokens that are
///   not `version,value` at all, provided at least one well-formed entry is
///   present (see [`VerifyError::MalformedSignatureHeader`]);
/// * signatures must be padded standard base64 of the right length (32 bytes
///   for `v1`, 64 for `v1a`); anything else simply does not match. Nothing in
///   the header can make verification panic.
///
/// Verification works on the raw body bytes: verify *before* parsing the body,
/// and hand the same bytes to the parser afterwards. After verification,
/// deduplicate on the message id: the timestamp window bounds replays, it does
/// not prevent them.
///
/// Verification is pure; the clock is read only by
/// [`verify_now`](Self::verify_now).
///
/// # Examples
///
/// ```
/// use herald_signature::{HmacSecret, Verifier, VerifyError};
///
/// let secret = HmacSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// let verifier = Verifier::new(vec![secret.clone().into()]);
///
/// let body = br#"{"type":"invoice.paid"}"#;
/// let now = 1_700_000_000;
/// let signature = secret.sign("msg_1", now, body);
///
/// verifier.verify("msg_1", "1700000000", &signature, body, now + 10)?;
/// assert_eq!(
///     verifier.verify("msg_1", "1700000000", &signature, b"tampered", now),
///     Err(VerifyError::NoMatchingSignature),
/// );
/// assert_eq!(
///     verifier.verify("msg_1", "1700000000", &signature, body, now + 3600),
///     Err(VerifyError::TooOld),
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Verifier {
    keys: Vec<VerifyKey>,
    tolerance_secs: i64,
}

impl Verifier {
    /// A verifier that accepts signatures from any of `keys`, with the default
    /// tolerance of five minutes.
    ///
    /// With no keys every message is rejected with
    /// [`VerifyError::NoMatchingSignature`].
    pub fn new(keys: Vec<VerifyKey>) -> Self {
        Self {
            keys,
            tolerance_secs: util::duration_secs(DEFAULT_TOLERANCE),
        }
    }

    /// Sets how far the timestamp may be from `now`, in either direction.
    ///
    /// The bound is inclusive and counted in whole seconds (sub-second parts
    /// are dropped). `Duration::ZERO` requires the timestamp to equal `now`.
    pub fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance_secs = util::duration_secs(tolerance);
        self
    }

    /// The tolerance in effect, in whole seconds.
    pub fn tolerance(&self) -> Duration {
        Duration::from_secs(self.tolerance_secs.unsigned_abs())
    }

    /// The keys this verifier accepts.
    pub fn keys(&self) -> &[VerifyKey] {
        &self.keys
    }

    /// Verifies a message, taking the current time as an argument.
    ///
    /// * `msg_id` — the `webhook-id` header;
    /// * `timestamp_header` — the `webhook-timestamp` header, verbatim;
    /// * `signature_header` — the `webhook-signature` header, verbatim;
    /// * `body` — the raw request body;
    /// * `now_unix` — the current time in seconds since the Unix epoch.
    ///
    /// # Errors
    ///
    /// The first failing check, in the order documented on [`VerifyError`].
    /// An empty header gives [`VerifyError::MissingHeader`] with the header
    /// name ([`HEADER_ID`], [`HEADER_TIMESTAMP`] or [`HEADER_SIGNATURE`]).
    pub fn verify(
        &self,
        msg_id: &str,
        timestamp_header: &str,
        signature_header: &str,
        body: &[u8],
        now_unix: i64,
    ) -> Result<(), VerifyError> {
        self.verify_inner(msg_id, timestamp_header, signature_header, body, Some(now_unix))
    }

    /// Like [`verify`](Self::verify), reading the system clock for `now`.
    ///
    /// # Errors
    ///
    /// As for [`verify`](Self::verify).
    pub fn verify_now(
        &self,
        msg_id: &str,
        timestamp_header: &str,
        signature_header: &str,
        body: &[u8],
    ) -> Result<(), VerifyError> {
        self.verify(msg_id, timestamp_header, signature_header, body, util::unix_now())
    }

    /// Like [`verify`](Self::verify) but without the tolerance check.
    ///
    /// The timestamp must still be well formed, because it is part of the
    /// signed content. Meant for fixed test vectors and for re-checking stored
    /// messages; **do not use it on live traffic**, where the timestamp check
    /// is what limits replays.
    ///
    /// # Errors
    ///
    /// As for [`verify`](Self::verify), minus [`VerifyError::TooOld`] and
    /// [`VerifyError::TooNew`].
    pub fn verify_ignoring_timestamp(
        &self,
        msg_id: &str,
        timestamp_header: &str,
        signature_header: &str,
        body: &[u8],
    ) -> Result<(), VerifyError> {
        self.verify_inner(msg_id, timestamp_header, signature_header, body, None)
    }

    fn verify_inner(
        &self,
        msg_id: &str,
        timestamp_header: &str,
        signature_header: &str,
        body: &[u8],
        now_unix: Option<i64>,
    ) -> Result<(), VerifyError> {
        if msg_id.is_empty() {
            return Err(VerifyError::MissingHeader(HEADER_ID));
        }
        if timestamp_header.is_empty() {
            return Err(VerifyError::MissingHeader(HEADER_TIMESTAMP));
        }
        if signature_header.trim().is_empty() {
            return Err(VerifyError::MissingHeader(HEADER_SIGNATURE));
        }
        let timestamp = util::parse_timestamp(timestamp_header)?;
        if let Some(now) = now_unix {
            util::check_tolerance(timestamp, now, self.tolerance_secs)?;
        }

        let entries = parse_entries(signature_header);
        if entries.is_empty() {
            return Err(VerifyError::MalformedSignatureHeader);
        }

        let mut matched = subtle::Choice::from(0u8);
        // Each expected value is computed at most once per key, and only if an
        // entry of the matching version is present.
        let has_v1 = entries.iter().any(|e| e.version == "v1");
        let has_v1a = entries.iter().any(|e| e.version == "v1a");
        let mut content: Option<Vec<u8>> = None;

        for key in &self.keys {
            match key {
                VerifyKey::Hmac(secret) if has_v1 => {
                    let expected = secret.mac(msg_id, timestamp, body);
                    for entry in entries.iter().filter(|e| e.version == "v1") {
                        if let Some(sig) = util::b64_decode_strict(entry.value) {
                            // `ct_eq` on slices of different lengths is false
                            // (lengths are public), the bytes compare in
                            // constant time.
                            matched |= sig.as_slice().ct_eq(expected.as_slice());
                        }
                    }
                }
                VerifyKey::Ed25519(public) if has_v1a => {
                    let content = content.get_or_insert_with(|| util::standard_content(msg_id, timestamp, body));
                    for entry in entries.iter().filter(|e| e.version == "v1a") {
                        let Some(sig) = util::b64_decode_strict(entry.value) else {
                            continue;
                        };
                        let Ok(sig) = <&[u8; 64]>::try_from(sig.as_slice()) else {
                            continue;
                        };
                        if public.verify_raw(content, sig) {
                            return Ok(());
                        }
                    }
                }
                _ => {}
            }
        }

        if bool::from(matched) {
            Ok(())
        } else {
            Err(VerifyError::NoMatchingSignature)
        }
    }
}

/// One well-formed `version,value` entry of a `webhook-signature` header.
#[derive(Debug, PartialEq, Eq)]
struct Entry<'a> {
    version: &'a str,
    value: &'a str,
}

/// The well-formed entries of a `webhook-signature` header, in order.
///
/// An entry is well formed when its version is `v`, one or more ASCII digits,
/// then optional lowercase ASCII letters (`v1`, `v1a`, `v2`, `v10b`…) and its
/// value is non-empty. Other tokens are skipped.
fn parse_entries(header: &str) -> Vec<Entry<'_>> {
    header
        .split(' ')
        .filter_map(|token| {
            let (version, value) = token.split_once(',')?;
            (is_version(version) && !value.is_empty()).then_some(Entry { version, value })
        })
        .collect()
}

fn is_version(v: &str) -> bool {
    let Some(rest) = v.strip_prefix('v') else {
        return false;
    };
    let letters = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    letters.len() < rest.len() && letters.bytes().all(|b| b.is_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        for ok in ["v1", "v1a", "v2", "v10", "v10b", "v1ab"] {
            assert!(is_version(ok), "{ok}");
        }
        for bad in ["", "v", "va", "1", "V1", "v1A", "v1-", "v1a1", "v 1", "vv1"] {
            assert!(!is_version(bad), "{bad}");
        }
    }

    #[test]
    fn entries() {
        assert_eq!(parse_entries(""), vec![]);
        assert_eq!(parse_entries("v1,"), vec![]);
        assert_eq!(parse_entries("garbage"), vec![]);
        assert_eq!(parse_entries(",abc"), vec![]);
        assert_eq!(
            parse_entries("  v1,abc  junk v2,x=,y v1a,zz"),
            vec![
                Entry {
                    version: "v1",
                    value: "abc"
                },
                Entry {
                    version: "v2",
                    value: "x=,y"
                },
                Entry {
                    version: "v1a",
                    value: "zz"
                },
            ]
        );
    }

    fn verifier() -> (HmacSecret, Verifier) {
        let secret = HmacSecret::from_bytes(&[9; 32]).unwrap();
        (secret.clone(), Verifier::new(vec![secret.into()]))
    }

    #[test]
    fn error_order_and_kinds() {
        let (secret, v) = verifier();
        let sig = secret.sign("id", 100, b"b");
        assert_eq!(
            v.verify("", "100", &sig, b"b", 100),
            Err(VerifyError::MissingHeader(HEADER_ID))
        );
        assert_eq!(
            v.verify("id", "", &sig, b"b", 100),
            Err(VerifyError::MissingHeader(HEADER_TIMESTAMP))
        );
        assert_eq!(
            v.verify("id", "100", "  ", b"b", 100),
            Err(VerifyError::MissingHeader(HEADER_SIGNATURE))
        );
        assert_eq!(v.verify("id", "+100", &sig, b"b", 100), Err(VerifyError::BadTimestamp));
        assert_eq!(v.verify("id", "100", &sig, b"b", 1000), Err(VerifyError::TooOld));
        assert_eq!(
            v.verify("id", "100", "v1,", b"b", 100),
            Err(VerifyError::MalformedSignatureHeader)
        );
        assert_eq!(
            v.verify("id", "100", "nonsense", b"b", 100),
            Err(VerifyError::MalformedSignatureHeader)
        );
        assert_eq!(
            v.verify("id", "100", "v2,abcd", b"b", 100),
            Err(VerifyError::NoMatchingSignature)
        );
        assert_eq!(
            v.verify("id", "100", "v1,@@@", b"b", 100),
            Err(VerifyError::NoMatchingSignature)
        );
        assert_eq!(v.verify("id", "100", &sig, b"b", 100), Ok(()));
        assert_eq!(v.verify_ignoring_timestamp("id", "100", &sig, b"b"), Ok(()));
        let junk_then_sig = format!("junk v1, {sig}");
        assert_eq!(v.verify("id", "100", &junk_then_sig, b"b", 100), Ok(()));
    }

    #[test]
    fn versions_bind_to_key_types() {
        let sk = Ed25519SigningKey::from_seed(&[5; 32]);
        let v = Verifier::new(vec![VerifyKey::from(&sk)]);
        let sig = sk.sign("id", 100, b"b");
        assert_eq!(v.verify("id", "100", &sig, b"b", 100), Ok(()));
        // A v1a signature relabelled v1 is not accepted.
        let relabelled = sig.replacen("v1a,", "v1,", 1);
        assert_eq!(
            v.verify("id", "100", &relabelled, b"b", 100),
            Err(VerifyError::NoMatchingSignature)
        );
        // Unpadded base64 is not accepted.
        let unpadded = sig.trim_end_matches('=');
        assert_eq!(
            v.verify("id", "100", unpadded, b"b", 100),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn no_keys_rejects() {
        let (secret, _) = verifier();
        let v = Verifier::new(vec![]);
        let sig = secret.sign("id", 100, b"b");
        assert_eq!(
            v.verify("id", "100", &sig, b"b", 100),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn tolerance_accessors() {
        let v = Verifier::new(vec![]);
        assert_eq!(v.tolerance(), DEFAULT_TOLERANCE);
        let v = v.with_tolerance(Duration::from_millis(1_999));
        assert_eq!(v.tolerance(), Duration::from_secs(1));
        assert!(v.keys().is_empty());
        let huge = Verifier::new(vec![]).with_tolerance(Duration::MAX);
        assert_eq!(huge.tolerance(), Duration::from_secs(i64::MAX as u64));
    }
}
