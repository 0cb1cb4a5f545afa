//! An endpoint's signing keys and custom headers: `GET …/secret`, `POST …/secret/rotate`, and
//! `GET/PUT/PATCH …/headers`.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_core::clock;
use herald_core::id::{AppIdOrUid, EndpointIdOrUid};
use herald_core::model::Endpoint;
use herald_signature::SigningKey;

use crate::body::{JsonBody, parse_json};
use crate::custom_headers;
use crate::error::{ApiError, ApiResult};
use crate::keys::{KeyKind, generate_key, parse_key, secret_out};
use crate::lookup;
use crate::model::{
    EndpointHeadersIn, EndpointHeadersOut, EndpointHeadersPatchIn, EndpointSecretOut, EndpointSecretRotateIn,
};
use crate::state::AppState;

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

async fn find(state: &AppState, app_id: &AppIdOrUid, endpoint_id: &EndpointIdOrUid) -> ApiResult<Endpoint> {
    let app = lookup::app(state, app_id).await?;
    lookup::endpoint(state, &app.id, endpoint_id).await
}

async fn secret(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
) -> ApiResult<Json<EndpointSecretOut>> {
    let endpoint = find(&state, &app_id, &endpoint_id).await?;
    Ok(Json(secret_out(endpoint.secret)))
}

/// Rotate the signing key. The body is optional (`{}` and no body both generate a key of the current
/// kind and keep the old one for the default grace period). Answers 200 with the new key
/// (`EndpointSecretOut`, which the 2.x SDKs parse; the 1.x SDKs ignore the body).
async fn rotate(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
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
    let now = clock::now();
    let old_expires_at = now + Duration::from_secs(grace);
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
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
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
    endpoint.updated_at = clock::now();
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
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
    JsonBody(input): JsonBody<EndpointHeadersIn>,
) -> ApiResult<StatusCode> {
    let headers = custom_headers::validate("headers", &input.headers)?;
    let endpoint = find(&state, &app_id, &endpoint_id).await?;
    save_headers(&state, endpoint, headers).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn patch_headers(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
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
