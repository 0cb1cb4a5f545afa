//! A bare HMAC-SHA256 over the raw body, for providers with their own header.
//!
//! Many providers sign webhooks the way GitHub does — an HMAC-SHA256 of the
//! raw body keyed with a shared secret — but put the tag in a header of their
//! own choosing, hex or base64, sometimes behind a prefix such as `sha256=`.
//! This module computes and checks the tag itself; finding and decoding the
//! header is up to the caller (see [`github`](crate::github) for one complete
//! scheme built on the same primitive).
//!
//! There is no timestamp in the signed content, so nothing here bounds
//! replays: deduplicate on an event id.
//!
//! # Examples
//!
//! ```
//! use herald_signature::body_hmac;
//!
//! let tag = body_hmac::sign(b"It's a Secret to Everybody", b"Hello, World!");
//! assert_eq!(
//!     hex::encode(tag),
//!     "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
//! );
//! body_hmac::verify(b"It's a Secret to Everybody", &tag, b"Hello, World!")?;
//! # Ok::<(), herald_signature::VerifyError>(())
//! ```

use hmac::Mac;

use crate::VerifyError;
use crate::util;

/// The HMAC-SHA256 of `body` keyed with `secret` (any length, including 0).
pub fn sign(secret: &[u8], body: &[u8]) -> [u8; 32] {
    let mut mac = util::hmac_sha256(secret);
    mac.update(body);
    mac.finalize().into_bytes().into()
}

/// Checks `tag` against the HMAC-SHA256 of `body` under `secret`, in constant
/// time.
///
/// # Errors
///
/// [`VerifyError::NoMatchingSignature`] if the tag does not match, including
/// when it is not 32 bytes long.
pub fn verify(secret: &[u8], tag: &[u8], body: &[u8]) -> Result<(), VerifyError> {
    let mut mac = util::hmac_sha256(secret);
    mac.update(body);
    mac.verify_slice(tag).map_err(|_| VerifyError::NoMatchingSignature)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejections() {
        let tag = sign(b"k", b"body");
        assert_eq!(verify(b"k", &tag, b"body"), Ok(()));
        assert_eq!(verify(b"k", &tag, b"bodY"), Err(VerifyError::NoMatchingSignature));
        assert_eq!(verify(b"K", &tag, b"body"), Err(VerifyError::NoMatchingSignature));
        assert_eq!(verify(b"k", &tag[..31], b"body"), Err(VerifyError::NoMatchingSignature));
        assert_eq!(verify(b"k", &[], b"body"), Err(VerifyError::NoMatchingSignature));
        // The same primitive as GitHub's scheme.
        assert_eq!(
            format!("sha256={}", hex::encode(sign(b"k", b"body"))),
            crate::github::sign(b"k", b"body")
        );
    }
}
