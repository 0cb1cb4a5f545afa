//! Signing keys as the API takes and shows them: their two kinds (`signatureType`), a client's key
//! validated, a fresh key generated, the key an endpoint is created with, and the answer naming one.
//! Endpoints, polling endpoints and the wire conversions all use them, so they belong to no one resource.

use base64::Engine as _;
use herald_signature::{Ed25519SigningKey, HmacSecret, SigningKey};

use crate::error::{ApiError, ApiResult};
use crate::model::EndpointSecretOut;

/// HMAC key sizes accepted (bytes), per the Standard Webhooks recommendation.
const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;
/// Bytes of randomness in a generated HMAC key.
const GENERATED_SECRET_BYTES: usize = 32;

/// The two kinds of signing key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyKind {
    /// `whsec_`, `v1` signatures.
    Hmac,
    /// `whsk_`, `v1a` signatures.
    Ed25519,
}

impl KeyKind {
    /// The `signatureType` named `name`.
    pub(crate) fn parse(name: &str) -> ApiResult<Self> {
        match name {
            "hmac" => Ok(Self::Hmac),
            "ed25519" => Ok(Self::Ed25519),
            other => Err(ApiError::body(
                "signatureType",
                format!("must be \"hmac\" or \"ed25519\", got {other:?}"),
            )),
        }
    }

    pub(crate) fn of(key: &SigningKey) -> Self {
        match key {
            SigningKey::Hmac(_) => Self::Hmac,
            SigningKey::Ed25519(_) => Self::Ed25519,
        }
    }
}

/// The `signatureType` an endpoint shows for its current key (`hmac` if it does not parse: that is what
/// every key used to be).
pub(crate) fn signature_type(key: Option<&SigningKey>) -> &'static str {
    match key.map(KeyKind::of) {
        Some(KeyKind::Ed25519) => "ed25519",
        _ => "hmac",
    }
}

/// A client-supplied key, validated, in canonical text form; `field` names it in errors.
pub(crate) fn parse_key(field: &str, text: &str) -> ApiResult<String> {
    let key = SigningKey::parse(text).map_err(|e| ApiError::body(field, format!("{e}")))?;
    if let SigningKey::Hmac(secret) = &key
        && !SECRET_BYTES.contains(&secret.len())
    {
        return Err(ApiError::body(
            field,
            format!(
                "the key must be {} to {} bytes long, got {}",
                SECRET_BYTES.start(),
                SECRET_BYTES.end(),
                secret.len()
            ),
        ));
    }
    Ok(key.to_text())
}

/// A fresh random key of `kind`.
pub(crate) fn generate_key(kind: KeyKind) -> String {
    match kind {
        KeyKind::Hmac => {
            let bytes: [u8; GENERATED_SECRET_BYTES] = rand::random();
            format!(
                "{}{}",
                HmacSecret::PREFIX,
                base64::engine::general_purpose::STANDARD.encode(bytes)
            )
        }
        KeyKind::Ed25519 => {
            let seed = zeroize::Zeroizing::new(rand::random::<[u8; 32]>());
            Ed25519SigningKey::from_seed(&seed).to_whsk()
        }
    }
}

/// The key an endpoint is created with: the given one (whose kind must match `signatureType`, when that
/// is given too) or a fresh one of the kind asked for.
pub(crate) fn initial_key(given: Option<&str>, signature_type: Option<&str>) -> ApiResult<String> {
    let kind = signature_type.map(KeyKind::parse).transpose()?;
    match given {
        Some(text) => {
            let key = parse_key("secret", text)?;
            if let Some(kind) = kind
                && SigningKey::parse(&key).map(|k| KeyKind::of(&k)).ok() != Some(kind)
            {
                return Err(ApiError::body(
                    "signatureType",
                    "does not match the kind of the given secret (whsec_ is hmac, whsk_ is ed25519)",
                ));
            }
            Ok(key)
        }
        None => Ok(generate_key(kind.unwrap_or(KeyKind::Hmac))),
    }
}

/// The answer naming a signing key, with its public key for Ed25519 keys.
pub(crate) fn secret_out(key: String) -> EndpointSecretOut {
    let public_key = SigningKey::parse(&key)
        .ok()
        .and_then(|k| k.public_key())
        .map(|k| k.to_whpk());
    EndpointSecretOut { key, public_key }
}
