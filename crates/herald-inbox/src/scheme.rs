//! Signature verification per scheme, on the raw body, with every configured secret.
//!
//! All the cryptography is `herald-signature`'s; this module only finds the headers each scheme uses and
//! tries each secret of a source (any may match, so secrets can be rotated without downtime).

use std::time::Duration;

use axum::http::HeaderMap;
use base64::Engine as _;
use herald_signature::{Ed25519PublicKey, HmacSecret, Verifier, VerifyError, VerifyKey, body_hmac, github, stripe};

/// How the `hmac` scheme's header value is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Hexadecimal, either case.
    Hex,
    /// Standard base64, padded or not.
    Base64,
}

/// A source's verification: its scheme with its secrets, ready to check requests. Its `Debug` shows how
/// many secrets it holds, never them.
#[derive(Clone)]
pub enum SchemeVerifier {
    /// Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature`); `v1` with `whsec_`
    /// secrets, `v1a` with `whpk_` public keys.
    StandardWebhooks(Verifier),
    /// Stripe's `Stripe-Signature`, keyed with each whole secret string.
    Stripe {
        /// The endpoint secrets, verbatim.
        secrets: Vec<String>,
        /// How far `t` may be from now.
        tolerance: Duration,
    },
    /// GitHub's `X-Hub-Signature-256`.
    GitHub {
        /// The webhook secrets, verbatim.
        secrets: Vec<String>,
    },
    /// An HMAC-SHA256 of the raw body in a header of the provider's choosing.
    Hmac {
        /// The secrets, verbatim (as UTF-8 bytes).
        secrets: Vec<String>,
        /// The header carrying the tag.
        header: axum::http::HeaderName,
        /// How the tag is encoded.
        encoding: Encoding,
        /// Text before the encoded tag, e.g. `sha256=`.
        prefix: String,
    },
}

/// Secrets as `Debug` shows them: how many.
struct Count<'a>(&'a [String]);

impl std::fmt::Debug for Count<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} redacted>", self.0.len())
    }
}

impl std::fmt::Debug for SchemeVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // Its keys' own `Debug` shows none of their bytes.
            Self::StandardWebhooks(verifier) => f.debug_tuple("StandardWebhooks").field(verifier).finish(),
            Self::Stripe { secrets, tolerance } => f
                .debug_struct("Stripe")
                .field("secrets", &Count(secrets))
                .field("tolerance", tolerance)
                .finish(),
            Self::GitHub { secrets } => f.debug_struct("GitHub").field("secrets", &Count(secrets)).finish(),
            Self::Hmac {
                secrets,
                header,
                encoding,
                prefix,
            } => f
                .debug_struct("Hmac")
                .field("secrets", &Count(secrets))
                .field("header", header)
                .field("encoding", encoding)
                .field("prefix", prefix)
                .finish(),
        }
    }
}

impl SchemeVerifier {
    /// A Standard Webhooks verifier from `whsec_…` secrets and/or `whpk_…` public keys.
    ///
    /// # Errors
    ///
    /// The position of the first secret that parses as neither, with the reason.
    pub fn standard_webhooks(secrets: &[String], tolerance: Duration) -> Result<Self, (usize, String)> {
        let keys = secrets
            .iter()
            .enumerate()
            .map(|(index, secret)| {
                if secret.trim_start().starts_with(Ed25519PublicKey::PREFIX) {
                    Ed25519PublicKey::parse(secret).map(VerifyKey::from)
                } else {
                    HmacSecret::parse(secret).map(VerifyKey::from)
                }
                .map_err(|e| (index, e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::StandardWebhooks(Verifier::new(keys).with_tolerance(tolerance)))
    }

    /// Verify a request's raw `body` and `headers` at `now_unix` (seconds).
    ///
    /// # Errors
    ///
    /// Why it was rejected (for logs and metrics; never sent back to the caller). With several secrets,
    /// the error of the last one tried.
    pub fn verify(&self, headers: &HeaderMap, body: &[u8], now_unix: i64) -> Result<(), VerifyError> {
        match self {
            Self::StandardWebhooks(verifier) => verifier.verify(
                header(headers, herald_signature::HEADER_ID),
                header(headers, herald_signature::HEADER_TIMESTAMP),
                header(headers, herald_signature::HEADER_SIGNATURE),
                body,
                now_unix,
            ),
            Self::Stripe { secrets, tolerance } => any_secret(secrets, |secret| {
                stripe::verify(secret, header(headers, stripe::HEADER), body, now_unix, *tolerance)
            }),
            Self::GitHub { secrets } => any_secret(secrets, |secret| {
                github::verify(secret.as_bytes(), header(headers, github::HEADER), body)
            }),
            Self::Hmac {
                secrets,
                header: name,
                encoding,
                prefix,
            } => {
                let value = header(headers, name.as_str()).trim();
                if value.is_empty() {
                    return Err(VerifyError::MissingHeader("configured signature header"));
                }
                let encoded = value
                    .strip_prefix(prefix.as_str())
                    .ok_or(VerifyError::MalformedSignatureHeader)?;
                let tag = match encoding {
                    Encoding::Hex => hex::decode(encoded).ok(),
                    Encoding::Base64 => base64::engine::general_purpose::STANDARD_NO_PAD
                        .decode(encoded.trim_end_matches('='))
                        .ok(),
                }
                .ok_or(VerifyError::MalformedSignatureHeader)?;
                any_secret(secrets, |secret| body_hmac::verify(secret.as_bytes(), &tag, body))
            }
        }
    }

    /// The header that carries the event id by default for this scheme, if it has one.
    pub fn default_event_id(&self) -> Option<&'static str> {
        match self {
            Self::StandardWebhooks(_) => Some(herald_signature::HEADER_ID),
            Self::GitHub { .. } => Some("X-GitHub-Delivery"),
            // Stripe's id is in the body (`/id`); see the configuration defaults.
            Self::Stripe { .. } | Self::Hmac { .. } => None,
        }
    }
}

/// A header's value as text; empty when absent or not UTF-8 (each scheme reports an empty header as
/// missing).
fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
        .unwrap_or("")
}

/// Accept if any secret verifies; otherwise the last error.
fn any_secret(secrets: &[String], check: impl Fn(&str) -> Result<(), VerifyError>) -> Result<(), VerifyError> {
    let mut last = VerifyError::NoMatchingSignature;
    for secret in secrets {
        match check(secret) {
            Ok(()) => return Ok(()),
            Err(error) => last = error,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap()))
            .collect()
    }

    #[test]
    fn hmac_scheme_with_prefix_and_both_encodings() {
        let tag = body_hmac::sign(b"s2", b"body");
        for (encoding, text) in [
            (Encoding::Hex, hex::encode(tag)),
            (Encoding::Base64, base64::engine::general_purpose::STANDARD.encode(tag)),
        ] {
            let v = SchemeVerifier::Hmac {
                secrets: vec!["s1".into(), "s2".into()],
                header: "x-sig".parse().unwrap(),
                encoding,
                prefix: "sha256=".into(),
            };
            let good = headers(&[("x-sig", &format!("sha256={text}"))]);
            assert_eq!(v.verify(&good, b"body", 0), Ok(()));
            assert_eq!(v.verify(&good, b"Body", 0), Err(VerifyError::NoMatchingSignature));
            let unprefixed = headers(&[("x-sig", &text)]);
            assert_eq!(
                v.verify(&unprefixed, b"body", 0),
                Err(VerifyError::MalformedSignatureHeader)
            );
            assert!(matches!(
                v.verify(&HeaderMap::new(), b"body", 0),
                Err(VerifyError::MissingHeader(_))
            ));
            let garbage = headers(&[("x-sig", "sha256=!!")]);
            assert_eq!(
                v.verify(&garbage, b"body", 0),
                Err(VerifyError::MalformedSignatureHeader)
            );
        }
    }

    #[test]
    fn standard_webhooks_accepts_any_of_its_keys() {
        let a = HmacSecret::from_bytes(&[1; 24]).unwrap();
        let b = HmacSecret::from_bytes(&[2; 24]).unwrap();
        let v = SchemeVerifier::standard_webhooks(&[a.to_whsec(), b.to_whsec()], Duration::from_secs(300)).unwrap();
        for secret in [&a, &b] {
            let sig = secret.sign("msg_1", 1000, b"{}");
            let h = headers(&[
                ("webhook-id", "msg_1"),
                ("webhook-timestamp", "1000"),
                ("webhook-signature", &sig),
            ]);
            assert_eq!(v.verify(&h, b"{}", 1000), Ok(()));
            assert_eq!(v.verify(&h, b"{}", 2000), Err(VerifyError::TooOld));
        }
        assert_eq!(
            SchemeVerifier::standard_webhooks(&["whsec_ok+A".into(), "whsec_!!".into()], Duration::ZERO)
                .unwrap_err()
                .0,
            1
        );
        assert_eq!(
            SchemeVerifier::standard_webhooks(&[a.to_whsec()], Duration::ZERO)
                .unwrap()
                .default_event_id(),
            Some("webhook-id")
        );
    }

    #[test]
    fn standard_webhooks_takes_ed25519_public_keys_too() {
        let signing = herald_signature::Ed25519SigningKey::from_seed(&[7; 32]);
        let public = signing.public_key().to_whpk();
        let hmac = HmacSecret::from_bytes(&[1; 24]).unwrap().to_whsec();
        let v = SchemeVerifier::standard_webhooks(&[hmac, public], Duration::from_secs(300)).unwrap();
        let sig = signing.sign("msg_1", 1000, b"{}");
        let h = headers(&[
            ("webhook-id", "msg_1"),
            ("webhook-timestamp", "1000"),
            ("webhook-signature", &sig),
        ]);
        assert_eq!(v.verify(&h, b"{}", 1000), Ok(()));
        assert_eq!(v.verify(&h, b"{ }", 1000), Err(VerifyError::NoMatchingSignature));
    }
}
