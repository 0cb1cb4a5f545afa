//! A sender's key of either kind, so code that signs for many endpoints need not care which scheme each
//! one uses.

use crate::util::WHSK;
use crate::{Ed25519PublicKey, Ed25519SigningKey, HmacSecret, SecretError};

/// A key that signs Standard Webhooks messages: a `whsec_` secret (`v1`, HMAC-SHA256) or a `whsk_`
/// Ed25519 key (`v1a`).
///
/// # Examples
///
/// ```
/// use herald_signature::SigningKey;
///
/// let hmac = SigningKey::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// assert!(hmac.sign("msg_1", 1_700_000_000, b"{}").starts_with("v1,"));
/// assert!(hmac.public_key().is_none());
///
/// let ed = SigningKey::parse(
///     "whsk_AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyB5tVYuj+ZU+UB4sRLoqYunkB+FOuaVvtfg45ELrQSWZA==",
/// )?;
/// assert!(ed.sign("msg_1", 1_700_000_000, b"{}").starts_with("v1a,"));
/// assert_eq!(
///     ed.public_key().map(|k| k.to_whpk()).as_deref(),
///     Some("whpk_ebVWLo/mVPlAeLES6KmLp5AfhTrmlb7X4OORC60ElmQ="),
/// );
/// # Ok::<(), herald_signature::SecretError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SigningKey {
    /// A symmetric secret; signs `v1,` entries.
    Hmac(HmacSecret),
    /// An Ed25519 key pair; signs `v1a,` entries.
    Ed25519(Ed25519SigningKey),
}

impl SigningKey {
    /// Parses a `whsk_…` key as Ed25519 and anything else as an HMAC secret (`whsec_…`, or bare base64).
    ///
    /// # Errors
    ///
    /// As [`Ed25519SigningKey::parse`] or [`HmacSecret::parse`]; a `whpk_` public key is refused with
    /// [`SecretError::WrongPrefix`] (it cannot sign).
    pub fn parse(s: &str) -> Result<Self, SecretError> {
        // An unprefixed key is read as an HMAC secret: Ed25519 keys are recognised by their prefix only.
        if s.trim_start().starts_with(WHSK) {
            Ed25519SigningKey::parse(s).map(Self::Ed25519)
        } else {
            HmacSecret::parse(s).map(Self::Hmac)
        }
    }

    /// The `webhook-signature` entry for this key: `v1,…` or `v1a,…`.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        match self {
            Self::Hmac(secret) => secret.sign(msg_id, timestamp, body),
            Self::Ed25519(key) => key.sign(msg_id, timestamp, body),
        }
    }

    /// The public key receivers verify with, for an Ed25519 key.
    pub fn public_key(&self) -> Option<Ed25519PublicKey> {
        match self {
            Self::Hmac(_) => None,
            Self::Ed25519(key) => Some(key.public_key()),
        }
    }

    /// The text form: `whsec_…` or `whsk_…`.
    pub fn to_text(&self) -> String {
        match self {
            Self::Hmac(secret) => secret.to_whsec(),
            Self::Ed25519(key) => key.to_whsk(),
        }
    }
}

impl From<HmacSecret> for SigningKey {
    fn from(secret: HmacSecret) -> Self {
        Self::Hmac(secret)
    }
}

impl From<Ed25519SigningKey> for SigningKey {
    fn from(key: Ed25519SigningKey) -> Self {
        Self::Ed25519(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatches_on_prefix() {
        let ed = Ed25519SigningKey::from_seed(&[9; 32]);
        assert_eq!(SigningKey::parse(&ed.to_whsk()), Ok(SigningKey::Ed25519(ed.clone())));
        let hmac = HmacSecret::from_bytes(&[3; 24]).unwrap();
        assert_eq!(SigningKey::parse(&hmac.to_whsec()), Ok(SigningKey::Hmac(hmac.clone())));
        // Bare base64 is an HMAC secret, as `HmacSecret::parse` reads it.
        assert_eq!(SigningKey::parse(&hmac.to_whsec()[6..]), Ok(SigningKey::Hmac(hmac)));
        assert!(matches!(
            SigningKey::parse(&ed.public_key().to_whpk()),
            Err(SecretError::WrongPrefix { .. })
        ));
        assert_eq!(SigningKey::from(ed.clone()).to_text(), ed.to_whsk());
    }
}
