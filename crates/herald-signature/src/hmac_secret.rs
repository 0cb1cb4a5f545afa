//! The symmetric `whsec_` secret and `v1` (HMAC-SHA256) signatures.

use std::fmt;
use std::str::FromStr;

use hmac::Mac;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::SecretError;
use crate::util::{self, WHSEC};

/// A Standard Webhooks symmetric secret, used for `v1` (HMAC-SHA256)
/// signatures.
///
/// Its text form is `whsec_` followed by the standard base64 encoding of the
/// key bytes, e.g. `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`.
///
/// The key bytes are wiped from memory when the value is dropped, [`Debug`]
/// prints only the key length, and equality is checked in constant time.
///
/// # Examples
///
/// ```
/// use herald_signature::HmacSecret;
///
/// let secret = HmacSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// let signature = secret.sign(
///     "msg_p5jXN8AQM9LWM0D4loKWxJek",
///     1614265330,
///     br#"{"test": 2432232314}"#,
/// );
/// assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
/// assert!(!format!("{secret:?}").contains("MfKQ"));
/// # Ok::<(), herald_signature::SecretError>(())
/// ```
#[derive(Clone)]
pub struct HmacSecret {
    key: Zeroizing<Vec<u8>>,
}

impl HmacSecret {
    /// The prefix of the text form, `whsec_`.
    pub const PREFIX: &'static str = WHSEC;

    /// Wraps raw key bytes.
    ///
    /// Any non-empty length is accepted, so that secrets created elsewhere can
    /// be imported; code that *generates* secrets is responsible for using
    /// 24–64 random bytes (the Herald contract).
    ///
    /// # Errors
    ///
    /// [`SecretError::Empty`] if `bytes` is empty.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SecretError> {
        if bytes.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Self {
            key: Zeroizing::new(bytes.to_vec()),
        })
    }

    /// Parses the text form.
    ///
    /// The `whsec_` prefix is optional, base64 padding is optional, and
    /// surrounding whitespace (a trailing newline from a file, say) is
    /// ignored. The base64 must use the standard alphabet.
    ///
    /// # Errors
    ///
    /// * [`SecretError::Empty`] if nothing is left after the prefix;
    /// * [`SecretError::WrongPrefix`] for a `whsk_` or `whpk_` key;
    /// * [`SecretError::InvalidBase64`] if the rest is not base64.
    ///
    /// # Examples
    ///
    /// ```
    /// use herald_signature::HmacSecret;
    ///
    /// let a = HmacSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")?;
    /// let b = HmacSecret::parse("C2FVsBQIhrscChlQIMV+b5sSYspob7oD")?;
    /// assert_eq!(a, b);
    /// # Ok::<(), herald_signature::SecretError>(())
    /// ```
    pub fn parse(s: &str) -> Result<Self, SecretError> {
        let b64 = util::strip_key_prefix(s, WHSEC)?;
        let key = Zeroizing::new(util::b64_decode_key(b64)?);
        if key.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Self { key })
    }

    /// The text form: `whsec_` followed by padded standard base64.
    ///
    /// [`HmacSecret::parse`] accepts the result.
    pub fn to_whsec(&self) -> String {
        format!("{WHSEC}{}", util::b64_encode(&self.key))
    }

    /// The key length in bytes (never zero).
    pub fn len(&self) -> usize {
        self.key.len()
    }

    /// Always `false`: an `HmacSecret` cannot be empty. Present because
    /// [`len`](Self::len) is.
    pub fn is_empty(&self) -> bool {
        self.key.is_empty()
    }

    /// Signs a message the Standard Webhooks way and returns the `v1` entry
    /// for the `webhook-signature` header: `v1,` followed by the base64
    /// HMAC-SHA256 of `{msg_id}.{timestamp}.{body}`.
    ///
    /// `body` must be exactly the bytes that will be sent. To sign with several
    /// keys during a rotation, join the entries with
    /// [`signature_header`](crate::signature_header).
    ///
    /// Verifiers in this crate reject negative timestamps, so sign with the
    /// real current time in seconds.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", util::b64_encode(&self.mac(msg_id, timestamp, body)))
    }

    /// The raw 32-byte HMAC-SHA256 of `{msg_id}.{timestamp}.{body}`.
    pub(crate) fn mac(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> [u8; 32] {
        let mut mac = util::hmac_sha256(&self.key);
        util::update_standard_content(&mut mac, msg_id, timestamp, body);
        mac.finalize().into_bytes().into()
    }
}

impl fmt::Debug for HmacSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HmacSecret")
            .field("len", &self.key.len())
            .finish_non_exhaustive()
    }
}

/// Constant-time comparison of the key bytes (the length is not secret).
impl PartialEq for HmacSecret {
    fn eq(&self, other: &Self) -> bool {
        self.key.as_slice().ct_eq(other.key.as_slice()).into()
    }
}

impl Eq for HmacSecret {}

/// Same as [`HmacSecret::parse`].
impl FromStr for HmacSecret {
    type Err = SecretError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_variants() {
        let padded = HmacSecret::parse("whsec_AAECAwQ=").unwrap();
        let unpadded = HmacSecret::parse("whsec_AAECAwQ").unwrap();
        let bare = HmacSecret::parse("AAECAwQ=").unwrap();
        assert_eq!(padded, unpadded);
        assert_eq!(padded, bare);
        assert_eq!(padded.len(), 5);
        assert!(!padded.is_empty());
        assert_eq!(padded.to_whsec(), "whsec_AAECAwQ=");
        assert_eq!(" whsec_AAECAwQ=\n".parse::<HmacSecret>().unwrap(), padded);
    }

    #[test]
    fn parse_rejects() {
        assert_eq!(HmacSecret::parse(""), Err(SecretError::Empty));
        assert_eq!(HmacSecret::parse("whsec_"), Err(SecretError::Empty));
        assert_eq!(HmacSecret::parse("whsec_!!!"), Err(SecretError::InvalidBase64));
        assert_eq!(HmacSecret::parse("whsec_AAE CAwQ="), Err(SecretError::InvalidBase64));
        // URL-safe alphabet is not standard base64.
        assert_eq!(HmacSecret::parse("whsec_-_-_"), Err(SecretError::InvalidBase64));
        assert!(matches!(
            HmacSecret::parse("whpk_AAECAwQ="),
            Err(SecretError::WrongPrefix { .. })
        ));
        assert_eq!(HmacSecret::from_bytes(&[]), Err(SecretError::Empty));
    }

    #[test]
    fn debug_is_redacted() {
        let s = HmacSecret::from_bytes(b"super secret key bytes!!").unwrap();
        let dbg = format!("{s:?}");
        assert_eq!(dbg, "HmacSecret { len: 24, .. }");
    }

    #[test]
    fn inequality() {
        let a = HmacSecret::from_bytes(b"aaaa").unwrap();
        let b = HmacSecret::from_bytes(b"aaab").unwrap();
        let c = HmacSecret::from_bytes(b"aaa").unwrap();
        assert_ne!(a, b);
        assert_ne!(a, c);
    }
}
