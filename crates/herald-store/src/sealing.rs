//! How every backend seals endpoint secrets and custom headers with the store's [`SecretCipher`]: the
//! contexts values are bound to, reading values stored before encryption, and the key check value kept
//! in `meta`. The backends only run the SQL around these rules (`sqlite/secrets.rs`,
//! `postgres/secrets.rs`).

use herald_core::model::Headers;

use crate::crypto::{CryptoError, SEALED_PREFIX, SecretCipher};
use crate::{StoreError, StoreResult};

/// The meta key of a value sealed with the store's key, opened at every start to prove the key is right
/// before anything is signed with it.
pub(crate) const KEY_CHECK: &str = "secret_key_check";
const KEY_CHECK_TEXT: &str = "herald secret key check";

/// A `LIKE` pattern matching sealed values (to find rows from before encryption).
pub(crate) fn sealed_pattern() -> String {
    format!("{SEALED_PREFIX}%")
}

/// What a sealed endpoint secret is bound to (its row), so it cannot be moved to another endpoint.
fn secret_context(endpoint_id: &str) -> String {
    format!("{endpoint_id}/secret")
}

fn headers_context(endpoint_id: &str) -> String {
    format!("{endpoint_id}/headers")
}

pub(crate) fn seal_secret(cipher: &SecretCipher, endpoint_id: &str, secret: &str) -> String {
    cipher.seal(secret, &secret_context(endpoint_id))
}

pub(crate) fn seal_headers(cipher: &SecretCipher, endpoint_id: &str, headers: &Headers) -> String {
    let json = serde_json::to_string(headers).unwrap_or_else(|_| "{}".to_owned());
    cipher.seal(&json, &headers_context(endpoint_id))
}

/// Open a stored value; a value that is not sealed is a row from before encryption, read as it is (the
/// start-up migration seals those, so this only matters for rows it has not reached).
fn open_value(cipher: &SecretCipher, stored: &str, context: &str) -> StoreResult<String> {
    match cipher.open(stored, context) {
        Ok(plain) => Ok(plain.as_str().to_owned()),
        Err(CryptoError::NotSealed) => Ok(stored.to_owned()),
        Err(error) => Err(StoreError::SecretKey(format!("{context}: {error}"))),
    }
}

pub(crate) fn open_secret(cipher: &SecretCipher, endpoint_id: &str, stored: &str) -> StoreResult<String> {
    open_value(cipher, stored, &secret_context(endpoint_id))
}

pub(crate) fn open_headers(cipher: &SecretCipher, endpoint_id: &str, stored: &str) -> StoreResult<Headers> {
    let json = open_value(cipher, stored, &headers_context(endpoint_id))?;
    serde_json::from_str(&json).map_err(|e| StoreError::Corrupt(format!("headers column: {e}")))
}

fn wrong_key() -> StoreError {
    StoreError::SecretKey(
        "the configured secret key does not decrypt this database's endpoint secrets; start with the key they \
         were encrypted with"
            .to_owned(),
    )
}

/// A new key check value for `meta` (`KEY_CHECK`).
pub(crate) fn new_key_check(cipher: &SecretCipher) -> String {
    cipher.seal(KEY_CHECK_TEXT, KEY_CHECK)
}

/// Refuse `cipher` unless it opens the stored key check value.
pub(crate) fn verify_key_check(cipher: &SecretCipher, stored: &str) -> StoreResult<()> {
    cipher.open(stored, KEY_CHECK).map(drop).map_err(|_| wrong_key())
}

/// With no key check value stored yet: refuse `cipher` unless it opens a sealed secret found in the
/// endpoint table (the check value was lost), if there is one.
pub(crate) fn verify_sample(cipher: &SecretCipher, endpoint_id: &str, sealed_secret: &str) -> StoreResult<()> {
    cipher
        .open(sealed_secret, &secret_context(endpoint_id))
        .map(drop)
        .map_err(|_| wrong_key())
}

/// An endpoint's stored secret and headers, sealed (they may be plain text, from before encryption).
pub(crate) fn reseal(
    cipher: &SecretCipher,
    endpoint_id: &str,
    stored_secret: &str,
    stored_headers: &str,
) -> StoreResult<(String, String)> {
    let secret = open_secret(cipher, endpoint_id, stored_secret)?;
    let headers = open_headers(cipher, endpoint_id, stored_headers)?;
    Ok((
        seal_secret(cipher, endpoint_id, &secret),
        seal_headers(cipher, endpoint_id, &headers),
    ))
}
