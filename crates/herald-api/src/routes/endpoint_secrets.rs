//! An endpoint's signing keys and custom headers: `GET …/secret`, `POST …/secret/rotate`, and
//! `GET/PUT/PATCH …/headers`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use herald_core::clock::now_ms;
use herald_core::model::Endpoint;
use herald_signature::{Ed25519SigningKey, HmacSecret, SigningKey};

use super::{apps, endpoints};
use crate::body::{JsonBody, parse_json};
use crate::custom_headers;
use crate::error::{ApiError, ApiResult};
use crate::model::{
    EndpointHeadersIn, EndpointHeadersOut, EndpointHeadersPatchIn, EndpointSecretOut, EndpointSecretRotateIn,
};
use crate::state::AppState;

/// HMAC key sizes accepted (bytes), per the Standard Webhooks recommendation.
const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;
/// Bytes of randomness in a generated HMAC key.
const GENERATED_SECRET_BYTES: usize = 32;
/// How long a replaced key keeps signing when the rotation does not say: a day, as Svix does, so
/// receivers that poll their configuration daily never reject a request.
pub(super) const DEFAULT_GRACE_SECONDS: u64 = 24 * 3600;
/// The longest grace period: a replaced key should not sign for long.
const MAX_GRACE_SECONDS: u64 = 7 * 24 * 3600;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/app/{app_id}/endpoint/{endpoint_id}/secret", get(secret))
        .route("/app/{app_id}/endpoint/{endpoint_id}/secret/rotate", post(rotate))
        .route(
            "/app/{app_id}/endpoint/{endpoint_id}/headers",
            get(headers).put(replace_headers).patch(patch_headers),
        )
}

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

    fn of(key: &SigningKey) -> Self {
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

async fn find(state: &AppState, app_id: &str, endpoint_id: &str) -> ApiResult<Endpoint> {
    let app = apps::find(state, app_id).await?;
    endpoints::find(state, &app.id, endpoint_id).await
}

async fn secret(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> ApiResult<Json<EndpointSecretOut>> {
    let endpoint = find(&state, &app_id, &endpoint_id).await?;
    Ok(Json(secret_out(endpoint.secret)))
}

/// The answer naming a signing key, with its public key for Ed25519 keys.
pub(crate) fn secret_out(key: String) -> EndpointSecretOut {
    let public_key = SigningKey::parse(&key)
        .ok()
        .and_then(|k| k.public_key())
        .map(|k| k.to_whpk());
    EndpointSecretOut { key, public_key }
}

/// Rotate the signing key. The body is optional (`{}` and no body both generate a key of the current
/// kind and keep the old one for the default grace period). Answers 200 with the new key
/// (`EndpointSecretOut`, which the 2.x SDKs parse; the 1.x SDKs ignore the body).
async fn rotate(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Json<EndpointSecretOut>> {
    let input: EndpointSecretRotateIn = if body.iter().all(u8::is_ascii_whitespace) {
        EndpointSecretRotateIn::default()
    } else {
        parse_json(&body)?
    };
    let grace = input.grace_period_seconds.unwrap_or(DEFAULT_GRACE_SECONDS);
    if grace > MAX_GRACE_SECONDS {
        return Err(ApiError::body(
            "gracePeriodSeconds",
            format!("at most {MAX_GRACE_SECONDS} (7 days), got {grace}"),
        ));
    }
    let endpoint = find(&state, &app_id, &endpoint_id).await?;
    let new_key = match input.key.as_deref() {
        Some(text) => parse_key("key", text)?,
        None => {
            let current = SigningKey::parse(&endpoint.secret).ok();
            generate_key(current.as_ref().map_or(KeyKind::Hmac, KeyKind::of))
        }
    };
    let now = now_ms();
    // `grace` is at most a week, so this cannot overflow.
    let old_expires_at = now + i64::try_from(grace).unwrap_or(0) * 1_000;
    state
        .store
        .rotate_endpoint_secret(&endpoint.id, &new_key, old_expires_at, now)
        .await
        .map_err(|e| ApiError::from_store(e, "endpoint"))?;
    state.endpoint_applied(&endpoint.id).await;
    Ok(Json(secret_out(new_key)))
}

async fn headers(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> ApiResult<Json<EndpointHeadersOut>> {
    let endpoint = find(&state, &app_id, &endpoint_id).await?;
    let (sensitive, plain): (Vec<_>, Vec<_>) = endpoint
        .headers
        .into_iter()
        .partition(|(name, _)| custom_headers::is_sensitive(name));
    Ok(Json(EndpointHeadersOut {
        headers: plain.into_iter().collect(),
        sensitive: sensitive.into_iter().map(|(name, _)| name).collect(),
    }))
}

async fn save_headers(state: &AppState, mut endpoint: Endpoint, headers: herald_core::model::Headers) -> ApiResult<()> {
    endpoint.headers = headers;
    endpoint.updated_at = now_ms();
    state
        .store
        .update_endpoint(&endpoint)
        .await
        .map_err(|e| ApiError::from_store(e, "endpoint"))?;
    state.endpoint_applied(&endpoint.id).await;
    Ok(())
}

async fn replace_headers(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    JsonBody(input): JsonBody<EndpointHeadersIn>,
) -> ApiResult<StatusCode> {
    let headers = custom_headers::validate("headers", &input.headers)?;
    let endpoint = find(&state, &app_id, &endpoint_id).await?;
    save_headers(&state, endpoint, headers).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn patch_headers(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    JsonBody(input): JsonBody<EndpointHeadersPatchIn>,
) -> ApiResult<StatusCode> {
    let endpoint = find(&state, &app_id, &endpoint_id).await?;
    let headers = custom_headers::merge(
        "headers",
        &endpoint.headers,
        &input.headers,
        input.delete_headers.as_deref().unwrap_or_default(),
    )?;
    save_headers(&state, endpoint, headers).await?;
    Ok(StatusCode::NO_CONTENT)
}
