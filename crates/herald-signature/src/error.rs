//! Error types.

/// Why a signed webhook was rejected.
///
/// Every variant is a distinct reason so that receivers can log (and, for the
/// clock-related ones, report) precisely what went wrong. None of them carries
/// secret material or the computed signature, so errors are safe to log and to
/// return to the sender.
///
/// For the Standard Webhooks [`Verifier`](crate::Verifier) the checks run in
/// this order, and the first failure is returned:
///
/// 1. a required header is empty → [`MissingHeader`](Self::MissingHeader);
/// 2. the timestamp is not a canonical decimal integer →
///    [`BadTimestamp`](Self::BadTimestamp);
/// 3. the timestamp is outside the tolerance window →
///    [`TooOld`](Self::TooOld) / [`TooNew`](Self::TooNew);
/// 4. the signature header holds no well-formed `version,signature` entry →
///    [`MalformedSignatureHeader`](Self::MalformedSignatureHeader);
/// 5. no entry verifies against any key →
///    [`NoMatchingSignature`](Self::NoMatchingSignature).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// A required header was absent or empty. The payload is the header name,
    /// for example `"webhook-id"`.
    #[error("missing or empty `{0}` header")]
    MissingHeader(&'static str),

    /// The timestamp is not a canonical unsigned decimal integer that fits in
    /// an `i64`: only ASCII digits are allowed, with no sign, no surrounding
    /// whitespace and no leading zero (except for `0` itself).
    #[error("timestamp is not a canonical unsigned decimal integer")]
    BadTimestamp,

    /// The timestamp lies further in the past than the tolerance allows.
    /// The message may be a replay, or the sender's clock is behind.
    #[error("timestamp is too old (outside the tolerance window)")]
    TooOld,

    /// The timestamp lies further in the future than the tolerance allows.
    /// The sender's clock is ahead of ours (or ours is behind).
    #[error("timestamp is too far in the future (outside the tolerance window)")]
    TooNew,

    /// The signature header could not be parsed at all.
    ///
    /// For Standard Webhooks this means that not a single space-separated
    /// entry has the shape `v<digits>[<lowercase letters>],<non-empty value>`
    /// (for example the header `"garbage"` or `"v1,"`). A header that holds
    /// well-formed entries of unknown versions only (say `v2,abc`) is *not*
    /// malformed: it yields [`NoMatchingSignature`](Self::NoMatchingSignature).
    ///
    /// For Stripe it means the header has no single `t=` item; for GitHub that
    /// the value is not `sha256=` followed by 64 hex digits.
    #[error("signature header is malformed")]
    MalformedSignatureHeader,

    /// The header was well formed but none of its signatures of a known
    /// version verified against any of the keys. Signatures of unknown
    /// versions, undecodable base64 and signatures of the wrong length all end
    /// up here.
    #[error("no signature matches")]
    NoMatchingSignature,
}

/// Why a key or secret could not be parsed or constructed.
///
/// None of the variants echoes the rejected input, so the error can be logged
/// without leaking a (possibly almost correct) secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The secret (after removing the prefix and surrounding whitespace) is
    /// empty.
    #[error("secret is empty")]
    Empty,

    /// The text after the prefix is not valid standard base64 (alphabet
    /// `A–Z a–z 0–9 + /`, padding optional).
    #[error("secret is not valid base64")]
    InvalidBase64,

    /// The string carries the prefix of a different kind of key, for example a
    /// `whpk_` public key passed where a `whsk_` secret key was expected.
    #[error("expected a `{expected}` key, found a `{found}` key")]
    WrongPrefix {
        /// The prefix this parser accepts.
        expected: &'static str,
        /// The prefix that was found.
        found: &'static str,
    },

    /// The decoded key has the wrong number of bytes.
    #[error("key is {actual} bytes long, expected {expected}")]
    InvalidLength {
        /// The required length in bytes.
        expected: usize,
        /// The length that was found.
        actual: usize,
    },

    /// The public half of a `whsk_` key is not the one derived from its seed.
    #[error("the public key in the secret key does not match its seed")]
    MismatchedKeypair,

    /// The bytes are not a usable Ed25519 public key (not a valid curve point,
    /// or a point of small order that no signature could ever verify against).
    #[error("not a valid Ed25519 public key")]
    InvalidPublicKey,
}
