//! Asymmetric `whsk_` / `whpk_` keys and `v1a` (Ed25519) signatures.

use std::fmt;
use std::str::FromStr;

use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use zeroize::Zeroizing;

use crate::SecretError;
use crate::util::{self, WHPK, WHSK};

/// A Standard Webhooks Ed25519 secret key, used for `v1a` signatures.
///
/// Its text form is `whsk_` followed by the standard base64 encoding of the
/// 32-byte seed and the 32-byte public key (64 bytes in all). Hand the matching
/// [`Ed25519PublicKey`] (`whpk_…`) to receivers: they can verify, but not
/// forge, signatures.
///
/// The seed is wiped from memory on drop and [`Debug`] prints only the public
/// key.
///
/// # Examples
///
/// ```
/// use herald_signature::{Ed25519SigningKey, VerifyKey, Verifier};
///
/// let key = Ed25519SigningKey::from_seed(&[7; 32]);
/// let signature = key.sign("msg_1", 1_700_000_000, b"{}");
/// assert!(signature.starts_with("v1a,"));
///
/// let verifier = Verifier::new(vec![VerifyKey::from(key.public_key())]);
/// verifier.verify("msg_1", "1700000000", &signature, b"{}", 1_700_000_000)?;
/// # Ok::<(), herald_signature::VerifyError>(())
/// ```
#[derive(Clone)]
pub struct Ed25519SigningKey {
    key: SigningKey,
}

impl Ed25519SigningKey {
    /// The prefix of the text form, `whsk_`.
    pub const PREFIX: &'static str = WHSK;

    /// Derives the key pair from a 32-byte seed (the Ed25519 "secret key").
    ///
    /// The seed must come from a cryptographically secure random source.
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        Self {
            key: SigningKey::from_bytes(seed),
        }
    }

    /// Parses the text form `whsk_` + base64(seed ‖ public key).
    ///
    /// The prefix and base64 padding are optional and surrounding whitespace
    /// is ignored. The embedded public key must be the one derived from the
    /// seed.
    ///
    /// # Errors
    ///
    /// * [`SecretError::Empty`] if nothing is left after the prefix;
    /// * [`SecretError::WrongPrefix`] for a `whsec_` or `whpk_` key;
    /// * [`SecretError::InvalidBase64`] if the rest is not base64;
    /// * [`SecretError::InvalidLength`] unless it decodes to 64 bytes;
    /// * [`SecretError::MismatchedKeypair`] if the public half does not
    ///   belong to the seed.
    pub fn parse(s: &str) -> Result<Self, SecretError> {
        let b64 = util::strip_key_prefix(s, WHSK)?;
        let bytes = Zeroizing::new(util::b64_decode_key(b64)?);
        let pair: &[u8; 64] = bytes.as_slice().try_into().map_err(|_| SecretError::InvalidLength {
            expected: 64,
            actual: bytes.len(),
        })?;
        let key = SigningKey::from_keypair_bytes(pair).map_err(|_| SecretError::MismatchedKeypair)?;
        Ok(Self { key })
    }

    /// The text form: `whsk_` + padded standard base64 of seed ‖ public key.
    pub fn to_whsk(&self) -> String {
        let pair = Zeroizing::new(self.key.to_keypair_bytes());
        format!("{WHSK}{}", util::b64_encode(pair.as_slice()))
    }

    /// The public key that verifies this key's signatures.
    pub fn public_key(&self) -> Ed25519PublicKey {
        Ed25519PublicKey {
            key: self.key.verifying_key(),
        }
    }

    /// Signs a message the Standard Webhooks way and returns the `v1a` entry
    /// for the `webhook-signature` header: `v1a,` followed by the base64
    /// Ed25519 signature of `{msg_id}.{timestamp}.{body}`.
    ///
    /// Ed25519 signatures are deterministic: the same inputs always give the
    /// same string.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        let content = util::standard_content(msg_id, timestamp, body);
        let signature: Signature = self.key.sign(&content);
        format!("v1a,{}", util::b64_encode(&signature.to_bytes()))
    }
}

impl fmt::Debug for Ed25519SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ed25519SigningKey")
            .field("public_key", &self.public_key().to_whpk())
            .finish_non_exhaustive()
    }
}

/// Constant-time comparison of the seeds.
impl PartialEq for Ed25519SigningKey {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for Ed25519SigningKey {}

/// Same as [`Ed25519SigningKey::parse`].
impl FromStr for Ed25519SigningKey {
    type Err = SecretError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// A Standard Webhooks Ed25519 public key, used to verify `v1a` signatures.
///
/// Its text form is `whpk_` followed by the standard base64 encoding of the
/// 32-byte public key. It is not secret: [`Debug`] and
/// [`Display`](fmt::Display) print the text form.
///
/// # Examples
///
/// ```
/// use herald_signature::Ed25519PublicKey;
///
/// let pk = Ed25519PublicKey::parse("whpk_ebVWLo/mVPlAeLES6KmLp5AfhTrmlb7X4OORC60ElmQ=")?;
/// assert_eq!(pk.to_whpk(), "whpk_ebVWLo/mVPlAeLES6KmLp5AfhTrmlb7X4OORC60ElmQ=");
/// # Ok::<(), herald_signature::SecretError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ed25519PublicKey {
    key: VerifyingKey,
}

impl Ed25519PublicKey {
    /// The prefix of the text form, `whpk_`.
    pub const PREFIX: &'static str = WHPK;

    /// Wraps the 32 bytes of a compressed Ed25519 public key.
    ///
    /// # Errors
    ///
    /// [`SecretError::InvalidPublicKey`] if the bytes are not a curve point, or
    /// are a small-order point (no signature verifies against those under
    /// strict verification, so they are refused up front).
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<Self, SecretError> {
        let key = VerifyingKey::from_bytes(bytes).map_err(|_| SecretError::InvalidPublicKey)?;
        if key.is_weak() {
            return Err(SecretError::InvalidPublicKey);
        }
        Ok(Self { key })
    }

    /// Parses the text form `whpk_` + base64(public key).
    ///
    /// The prefix and base64 padding are optional and surrounding whitespace
    /// is ignored.
    ///
    /// # Errors
    ///
    /// * [`SecretError::Empty`] if nothing is left after the prefix;
    /// * [`SecretError::WrongPrefix`] for a `whsec_` or `whsk_` key;
    /// * [`SecretError::InvalidBase64`] if the rest is not base64;
    /// * [`SecretError::InvalidLength`] unless it decodes to 32 bytes;
    /// * [`SecretError::InvalidPublicKey`] as for
    ///   [`from_bytes`](Self::from_bytes).
    pub fn parse(s: &str) -> Result<Self, SecretError> {
        let b64 = util::strip_key_prefix(s, WHPK)?;
        let bytes = util::b64_decode_key(b64)?;
        let raw: &[u8; 32] = bytes.as_slice().try_into().map_err(|_| SecretError::InvalidLength {
            expected: 32,
            actual: bytes.len(),
        })?;
        Self::from_bytes(raw)
    }

    /// The text form: `whpk_` + padded standard base64 of the public key.
    pub fn to_whpk(&self) -> String {
        format!("{WHPK}{}", util::b64_encode(self.key.as_bytes()))
    }

    /// The 32 bytes of the compressed public key.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// Strict Ed25519 verification of `signature` over `content`.
    pub(crate) fn verify_raw(&self, content: &[u8], signature: &[u8; 64]) -> bool {
        self.key
            .verify_strict(content, &Signature::from_bytes(signature))
            .is_ok()
    }
}

impl fmt::Debug for Ed25519PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Ed25519PublicKey").field(&self.to_whpk()).finish()
    }
}

/// Prints the `whpk_` text form.
impl fmt::Display for Ed25519PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_whpk())
    }
}

/// Same as [`Ed25519PublicKey::parse`].
impl FromStr for Ed25519PublicKey {
    type Err = SecretError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl From<&Ed25519SigningKey> for Ed25519PublicKey {
    fn from(key: &Ed25519SigningKey) -> Self {
        key.public_key()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let sk = Ed25519SigningKey::from_seed(&[42; 32]);
        let parsed = Ed25519SigningKey::parse(&sk.to_whsk()).unwrap();
        assert_eq!(parsed, sk);
        let pk = sk.public_key();
        assert_eq!(Ed25519PublicKey::parse(&pk.to_whpk()).unwrap(), pk);
        assert_eq!(pk.to_string(), pk.to_whpk());
        assert_eq!(Ed25519PublicKey::from(&sk), pk);
        // Without prefix and padding.
        let bare = sk.to_whsk()[5..].trim_end_matches('=').to_owned();
        assert_eq!(bare.parse::<Ed25519SigningKey>().unwrap(), sk);
    }

    #[test]
    fn debug_hides_seed() {
        let sk = Ed25519SigningKey::from_seed(&[42; 32]);
        let dbg = format!("{sk:?}");
        assert!(dbg.contains("whpk_"));
        assert!(!dbg.contains(&sk.to_whsk()[5..20]));
    }

    #[test]
    fn rejects() {
        let sk = Ed25519SigningKey::from_seed(&[1; 32]);
        let other = Ed25519SigningKey::from_seed(&[2; 32]);
        let mut pair = [0u8; 64];
        pair[..32].copy_from_slice(&[1; 32]);
        pair[32..].copy_from_slice(&other.public_key().to_bytes());
        let mismatched = format!("whsk_{}", util::b64_encode(&pair));
        assert_eq!(
            Ed25519SigningKey::parse(&mismatched),
            Err(SecretError::MismatchedKeypair)
        );
        assert_eq!(
            Ed25519SigningKey::parse("whsk_AAAA"),
            Err(SecretError::InvalidLength {
                expected: 64,
                actual: 3
            })
        );
        assert_eq!(
            Ed25519PublicKey::parse(&sk.to_whsk()),
            Err(SecretError::WrongPrefix {
                expected: WHPK,
                found: WHSK
            })
        );
        assert_eq!(
            Ed25519SigningKey::parse(&sk.public_key().to_whpk()),
            Err(SecretError::WrongPrefix {
                expected: WHSK,
                found: WHPK
            })
        );
        assert_eq!(
            Ed25519PublicKey::parse("whpk_AAAA"),
            Err(SecretError::InvalidLength {
                expected: 32,
                actual: 3
            })
        );
        // The identity point has small order.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert_eq!(
            Ed25519PublicKey::from_bytes(&identity),
            Err(SecretError::InvalidPublicKey)
        );
        assert_eq!(Ed25519PublicKey::parse("whpk_"), Err(SecretError::Empty));
        assert_eq!(Ed25519PublicKey::parse("whpk_%%"), Err(SecretError::InvalidBase64));
    }
}
