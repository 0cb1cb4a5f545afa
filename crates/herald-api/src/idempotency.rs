//! Idempotent POSTs: a repeated `idempotency-key` gets the first answer again instead of a second object.
//!
//! The Svix SDKs send an `idempotency-key` with every POST and retry after timeouts and 5xx answers, so
//! without this a create that succeeded but whose answer was lost would be repeated. Successful answers
//! are remembered for 24 hours per (credentials, method, path, key). Message creation is left to its own,
//! stronger mechanism: its key is stored with the message, in the same transaction. Issuing an
//! application token is never remembered: the answer holds the token, which is stored only as a digest.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use herald_core::clock::now_ms;

use crate::error::ApiError;
use crate::state::AppState;

/// How long an answer is remembered.
const KEEP_MS: i64 = 24 * 60 * 60 * 1000;
/// The largest answer remembered (larger ones are passed through unremembered).
const MAX_REMEMBERED_BYTES: usize = 1024 * 1024;
/// The longest key accepted.
const MAX_KEY_LEN: usize = 256;

/// Replay the remembered answer for a repeated key, or run the request and remember a successful answer.
pub async fn replay_or_remember(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some((scope, key)) = idempotency_scope(&request) else {
        return next.run(request).await;
    };
    let now = now_ms();
    match state.store.idempotent_response(&scope, &key, now - KEEP_MS).await {
        Ok(Some((status, body))) => return replay(status, body),
        Ok(None) => {}
        Err(error) => return ApiError::from_store(error, "idempotency key").into_response(),
    }
    let response = next.run(request).await;
    if !response.status().is_success() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_REMEMBERED_BYTES).await else {
        return ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "the answer could not be read",
        )
        .into_response();
    };
    if let Err(error) = state
        .store
        .remember_response(&scope, &key, parts.status.as_u16(), &bytes, now, now - KEEP_MS)
        .await
    {
        // The answer itself is right; only a later retry would not find it.
        tracing::warn!(%error, "could not remember an idempotent answer");
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// The (scope, key) of a POST that carries a usable key, except message creation and token issuing.
fn idempotency_scope(request: &Request) -> Option<(String, String)> {
    let path = request.uri().path();
    // An issued token must never be stored in clear, which remembering its answer would do; a retried
    // request simply gets another token.
    if request.method() != Method::POST || path.ends_with("/msg") || path.contains("/auth/app-portal-access/") {
        return None;
    }
    let key = request.headers().get("idempotency-key")?.to_str().ok()?;
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return None;
    }
    // Scoped by the credentials, so one client can never be answered with another's object.
    let credentials = request
        .headers()
        .get(AUTHORIZATION)
        .map_or(&b""[..], HeaderValue::as_bytes);
    let digest = crate::auth::token_digest(&String::from_utf8_lossy(credentials));
    let scope = format!("{} POST {}", hex::encode(digest), request.uri().path());
    Some((scope, key.to_owned()))
}

fn replay(status: u16, body: Vec<u8>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut response = (status, body).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
