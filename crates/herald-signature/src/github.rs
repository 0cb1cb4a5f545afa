//! GitHub's `X-Hub-Signature-256` scheme.
//!
//! The header is `sha256=` followed by the lowercase hex HMAC-SHA256 of the
//! raw body, keyed with the webhook secret as UTF-8 bytes. There is no
//! timestamp, so nothing bounds replays: deduplicate on the
//! `X-GitHub-Delivery` header.
//!
//! # Examples
//!
//! ```
//! use herald_signature::github;
//!
//! let header = github::sign(b"It's a Secret to Everybody", b"Hello, World!");
//! assert_eq!(
//!     header,
//!     "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
//! );
//! github::verify(b"It's a Secret to Everybody", &header, b"Hello, World!")?;
//! # Ok::<(), herald_signature::VerifyError>(())
//! ```

use hmac::Mac;

use crate::VerifyError;
use crate::util;

/// Name of the header GitHub sends (`X-Hub-Signature-256`).
pub const HEADER: &str = "X-Hub-Signature-256";

/// Builds an `X-Hub-Signature-256` header value, `sha256={hex}`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = util::hmac_sha256(secret);
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Verifies an `X-Hub-Signature-256` header against `secret`, in constant
/// time.
///
/// # Errors
///
/// * [`VerifyError::MissingHeader`] if `header` is empty;
/// * [`VerifyError::MalformedSignatureHeader`] unless the header is `sha256=`
///   followed by exactly 64 hex digits (either case);
/// * [`VerifyError::NoMatchingSignature`] if the signature does not match.
pub fn verify(secret: &[u8], header: &str, body: &[u8]) -> Result<(), VerifyError> {
    if header.trim().is_empty() {
        return Err(VerifyError::MissingHeader(HEADER));
    }
    let hex_sig = header
        .strip_prefix("sha256=")
        .ok_or(VerifyError::MalformedSignatureHeader)?;
    let mut tag = [0u8; 32];
    hex::decode_to_slice(hex_sig, &mut tag).map_err(|_| VerifyError::MalformedSignatureHeader)?;
    let mut mac = util::hmac_sha256(secret);
    mac.update(body);
    mac.verify_slice(&tag).map_err(|_| VerifyError::NoMatchingSignature)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors() {
        let h = sign(b"k", b"body");
        assert_eq!(verify(b"k", &h, b"body"), Ok(()));
        assert_eq!(
            verify(b"k", &h.to_uppercase().replace("SHA256=", "sha256="), b"body"),
            Ok(())
        );
        assert_eq!(verify(b"k", &h, b"bodY"), Err(VerifyError::NoMatchingSignature));
        assert_eq!(verify(b"K", &h, b"body"), Err(VerifyError::NoMatchingSignature));
        assert_eq!(verify(b"k", "", b"body"), Err(VerifyError::MissingHeader(HEADER)));
        assert_eq!(
            verify(b"k", "sha1=00", b"body"),
            Err(VerifyError::MalformedSignatureHeader)
        );
        assert_eq!(
            verify(b"k", "sha256=", b"body"),
            Err(VerifyError::MalformedSignatureHeader)
        );
        assert_eq!(
            verify(b"k", &h[..h.len() - 2], b"body"),
            Err(VerifyError::MalformedSignatureHeader)
        );
        assert_eq!(
            verify(b"k", &format!("{h}00"), b"body"),
            Err(VerifyError::MalformedSignatureHeader)
        );
        assert_eq!(
            verify(b"k", "sha256=zz", b"body"),
            Err(VerifyError::MalformedSignatureHeader)
        );
        // Empty secret is still a valid HMAC key.
        assert_eq!(verify(b"", &sign(b"", b"x"), b"x"), Ok(()));
    }
}
