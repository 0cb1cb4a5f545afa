//! Encryption of secrets at rest: endpoint signing keys and custom headers are sealed with
//! XChaCha20-Poly1305 under the operator's key before they reach the database, and opened when read.
//!
//! Pure functions over bytes, shared by every backend. A sealed value is text,
//! `enc1:` + base64(nonce ‖ ciphertext ‖ tag), so it fits the text columns plaintext secrets used to live
//! in, and a value without the prefix is recognisably one written before encryption (it is migrated at
//! start). The nonce is 24 random bytes per value (XChaCha's extended nonce makes random nonces safe for
//! any number of values). The *context* (e.g. the endpoint id) is authenticated as associated data, so a
//! sealed value copied onto another row does not open there.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

/// Bytes in a secret key.
pub const SECRET_KEY_BYTES: usize = 32;

/// The prefix of every sealed value (the `1` versions the format).
pub(crate) const SEALED_PREFIX: &str = "enc1:";
const NONCE_BYTES: usize = 24;
const TAG_BYTES: usize = 16;

/// Why a key or a sealed value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    /// The configured key is not base64 of exactly 32 bytes.
    #[error("the secret key must be the base64 encoding of exactly {SECRET_KEY_BYTES} bytes")]
    BadKey,
    /// The value is not in the sealed format.
    #[error("the value is not encrypted")]
    NotSealed,
    /// The value does not open under this key and context: the wrong key, or tampering.
    #[error("the value does not decrypt with this key (wrong key, or the data was altered)")]
    Undecryptable,
}

/// Seals and opens secrets with one key. Cheap to clone; [`Debug`] never shows the key.
#[derive(Clone)]
pub struct SecretCipher {
    aead: XChaCha20Poly1305,
}

impl fmt::Debug for SecretCipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretCipher(<redacted>)")
    }
}

impl SecretCipher {
    /// A cipher using these key bytes.
    pub fn from_key(key: &[u8; SECRET_KEY_BYTES]) -> Self {
        Self {
            aead: XChaCha20Poly1305::new(&(*key).into()),
        }
    }

    /// A cipher using the key written as standard base64 (surrounding whitespace ignored).
    ///
    /// # Errors
    ///
    /// [`CryptoError::BadKey`] unless the text decodes to exactly 32 bytes.
    pub fn from_base64(text: &str) -> Result<Self, CryptoError> {
        let bytes = Zeroizing::new(STANDARD.decode(text.trim()).map_err(|_| CryptoError::BadKey)?);
        let key: &[u8; SECRET_KEY_BYTES] = bytes.as_slice().try_into().map_err(|_| CryptoError::BadKey)?;
        Ok(Self::from_key(key))
    }

    /// A new random key, as the base64 text [`from_base64`](Self::from_base64) reads.
    pub fn generate_key() -> Zeroizing<String> {
        let key = Zeroizing::new(rand::random::<[u8; SECRET_KEY_BYTES]>());
        Zeroizing::new(STANDARD.encode(key.as_slice()))
    }

    /// Encrypt `plaintext`, bound to `context`, with a fresh random nonce.
    pub fn seal(&self, plaintext: &str, context: &str) -> String {
        let nonce: [u8; NONCE_BYTES] = rand::random();
        let payload = Payload {
            msg: plaintext.as_bytes(),
            aad: context.as_bytes(),
        };
        // Encryption fails only for messages beyond the cipher's 256 GiB limit; secrets are tiny.
        let sealed = self
            .aead
            .encrypt(&XNonce::from(nonce), payload)
            .unwrap_or_else(|_| unreachable!("XChaCha20-Poly1305 encrypts anything shorter than 256 GiB"));
        let mut out = Vec::with_capacity(NONCE_BYTES + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        format!("{SEALED_PREFIX}{}", STANDARD.encode(out))
    }

    /// Decrypt a value [`seal`](Self::seal) produced with the same key and context.
    ///
    /// # Errors
    ///
    /// [`CryptoError::NotSealed`] for a value not in the sealed format (e.g. a plaintext secret from
    /// before encryption); [`CryptoError::Undecryptable`] for the wrong key, the wrong context, or
    /// altered data.
    pub fn open(&self, sealed: &str, context: &str) -> Result<Zeroizing<String>, CryptoError> {
        let encoded = sealed.strip_prefix(SEALED_PREFIX).ok_or(CryptoError::NotSealed)?;
        let bytes = STANDARD.decode(encoded).map_err(|_| CryptoError::Undecryptable)?;
        if bytes.len() < NONCE_BYTES + TAG_BYTES {
            return Err(CryptoError::Undecryptable);
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_BYTES);
        let nonce: [u8; NONCE_BYTES] = nonce.try_into().map_err(|_| CryptoError::Undecryptable)?;
        let payload = Payload {
            msg: ciphertext,
            aad: context.as_bytes(),
        };
        let plain = Zeroizing::new(
            self.aead
                .decrypt(&XNonce::from(nonce), payload)
                .map_err(|_| CryptoError::Undecryptable)?,
        );
        String::from_utf8(plain.to_vec())
            .map(Zeroizing::new)
            .map_err(|_| CryptoError::Undecryptable)
    }

    /// Whether `value` is in the sealed format (says nothing about which key sealed it).
    pub fn is_sealed(value: &str) -> bool {
        value.starts_with(SEALED_PREFIX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cipher(byte: u8) -> SecretCipher {
        SecretCipher::from_key(&[byte; SECRET_KEY_BYTES])
    }

    #[test]
    fn round_trip_with_fresh_nonces() {
        let c = cipher(1);
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let a = c.seal(secret, "ep_1");
        let b = c.seal(secret, "ep_1");
        assert_ne!(a, b, "every value gets its own nonce");
        assert!(SecretCipher::is_sealed(&a));
        assert!(!a.contains("MfKQ9r8G"));
        assert_eq!(c.open(&a, "ep_1").unwrap().as_str(), secret);
        assert_eq!(c.open(&b, "ep_1").unwrap().as_str(), secret);
        assert_eq!(c.open(&c.seal("", "x"), "x").unwrap().as_str(), "");
    }

    #[test]
    fn wrong_key_context_or_tampering_fails() {
        let sealed = cipher(1).seal("whsec_AAAA", "ep_1");
        assert_eq!(cipher(2).open(&sealed, "ep_1"), Err(CryptoError::Undecryptable));
        assert_eq!(cipher(1).open(&sealed, "ep_2"), Err(CryptoError::Undecryptable));
        let mut bytes = STANDARD.decode(&sealed[SEALED_PREFIX.len()..]).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let altered = format!("{SEALED_PREFIX}{}", STANDARD.encode(&bytes));
        assert_eq!(cipher(1).open(&altered, "ep_1"), Err(CryptoError::Undecryptable));
        assert_eq!(cipher(1).open("enc1:AAAA", "ep_1"), Err(CryptoError::Undecryptable));
        assert_eq!(cipher(1).open("enc1:!!", "ep_1"), Err(CryptoError::Undecryptable));
        assert_eq!(cipher(1).open("whsec_AAAA", "ep_1"), Err(CryptoError::NotSealed));
    }

    #[test]
    fn keys_from_text() {
        let text = SecretCipher::generate_key();
        let c = SecretCipher::from_base64(&format!(" {}\n", text.as_str())).unwrap();
        let again = SecretCipher::from_base64(&text).unwrap();
        assert_eq!(again.open(&c.seal("s", "x"), "x").unwrap().as_str(), "s");
        assert_eq!(SecretCipher::from_base64("AAAA").err(), Some(CryptoError::BadKey));
        assert_eq!(
            SecretCipher::from_base64("not base64!").err(),
            Some(CryptoError::BadKey)
        );
        assert_eq!(format!("{c:?}"), "SecretCipher(<redacted>)");
    }
}
