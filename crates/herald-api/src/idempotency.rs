//! Idempotent POSTs: a repeated `idempotency-key` gets the first answer again instead of a second object,
//! and a key reused for a different request is refused.
//!
//! The Svix SDKs send an `idempotency-key` with every POST and retry after timeouts and 5xx answers, so
//! without this a create that succeeded but whose answer was lost would be repeated. Successful answers
//! are remembered for 24 hours per (credentials, key), with a digest of the request they answered
//! (method, path, query and body). A retry — the same request with the same key — gets the remembered
//! answer, even if the object has since been deleted (as Stripe does); the same key with any other
//! request is a 422 naming `idempotency-key`, because answering it with the first request's result would
//! silently drop what the client asked for this time.
//!
//! Message creation is left to its own, stronger mechanism: its key is stored with the message, in the
//! same transaction, and compared with the message by [`check_same_message`]. Issuing an application
//! token is never remembered: the answer holds the token, which is stored only as a digest.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use herald_core::clock;
use herald_core::model::Message;
use herald_store::{NewMessage, Remembered};
use sha2::{Digest, Sha256};

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// How long an answer is remembered.
const KEEP: Duration = Duration::from_secs(24 * 60 * 60);
/// The largest answer remembered (larger ones are passed through unremembered).
const MAX_REMEMBERED_BYTES: usize = 1024 * 1024;
/// The longest key accepted (the shortest is one character).
pub(crate) const MAX_KEY_LEN: usize = 256;
/// The header.
const HEADER: &str = "idempotency-key";

/// The request's `idempotency-key`, if it has one: 1 to 256 visible ASCII characters, or a 422.
pub(crate) fn key_of(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let Some(value) = headers.get(HEADER) else {
        return Ok(None);
    };
    let visible = value.as_bytes().iter().all(|b| (0x21..=0x7e).contains(b));
    if value.is_empty() || value.len() > MAX_KEY_LEN || !visible {
        return Err(ApiError::header(
            HEADER,
            format!("must be 1 to {MAX_KEY_LEN} visible ASCII characters"),
        ));
    }
    Ok(value.to_str().ok().map(str::to_owned))
}

/// The request's `idempotency-key` as [`key_of`] reads it, taken from the request's head without copying
/// its other headers (axum's `HeaderMap` extractor clones them all, on the ingest path). Checked when the
/// handler asks ([`IdempotencyKey::checked`]), so the body's errors still come first.
pub(crate) struct IdempotencyKey(ApiResult<Option<String>>);

impl IdempotencyKey {
    /// The key, or the 422 for a malformed one.
    pub(crate) fn checked(self) -> ApiResult<Option<String>> {
        self.0
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for IdempotencyKey {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(key_of(&parts.headers)))
    }
}

/// The 422 for a key already used with another request.
fn reused() -> ApiError {
    ApiError::header(
        HEADER,
        "already used with a different request (another body, path or query) in the last 24 hours; \
         use a new key for a new request",
    )
}

/// A message create that repeats the key of `stored`: refused unless it asks for the same message. A
/// duplicate found by its `eventId` is Svix's deduplication and always answers the stored message.
pub(crate) fn check_same_message(new: &NewMessage, stored: &Message) -> ApiResult<()> {
    if new.idempotency_key.is_none() || (new.event_id.is_some() && new.event_id == stored.event_id) {
        return Ok(());
    }
    // Channels and tags are sets.
    let set = |list: &Option<Vec<String>>| {
        let mut sorted = list.clone().unwrap_or_default();
        sorted.sort();
        sorted.dedup();
        sorted
    };
    let same = new.event_id == stored.event_id
        && new.event_type == stored.event_type
        && set(&new.channels) == set(&stored.channels)
        && set(&new.tags) == set(&stored.tags)
        && new.deliver_at == stored.deliver_at
        && new.ordering_key == stored.ordering_key
        // An expunged payload (retention, or an operator) can no longer be compared.
        && (stored.payload.is_empty() || new.payload == stored.payload);
    if same { Ok(()) } else { Err(reused()) }
}

/// Replay the remembered answer for a repeated key, refuse a key reused for another request, or `run` the
/// request and remember a successful answer.
pub(crate) async fn replay_or_remember<Run, Answer>(state: &AppState, request: Request, run: Run) -> Response
where
    Run: FnOnce(Request) -> Answer,
    Answer: Future<Output = Response>,
{
    if request.method() != Method::POST {
        return run(request).await;
    }
    let key = match key_of(request.headers()) {
        Ok(Some(key)) => key,
        Ok(None) => return run(request).await,
        Err(error) => return error.into_response(),
    };
    if !remembers(request.uri().path()) {
        return run(request).await;
    }
    let (parts, body) = request.into_parts();
    let body = match crate::body::read(body, state.limits.max_body_bytes).await {
        Ok(body) => body,
        Err(error) => return error.into_response(),
    };
    let scope = scope(&parts.headers);
    let digest = request_digest(&parts.method, &parts.uri, &body);
    let now = clock::now();
    match state.store.idempotent_response(&scope, &key, now - KEEP).await {
        Ok(Some(remembered)) if remembered.request_digest.as_ref().is_some_and(|d| *d != digest) => {
            return reused().into_response();
        }
        Ok(Some(remembered)) => return replay(remembered),
        Ok(None) => {}
        Err(error) => return ApiError::from_store(error, "idempotency key").into_response(),
    }
    let response = run(Request::from_parts(parts, Body::from(body))).await;
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
    let remembered = Remembered {
        status: parts.status.as_u16(),
        body: bytes.to_vec(),
        request_digest: Some(digest),
    };
    if let Err(error) = state
        .store
        .remember_response(&scope, &key, &remembered, now, now - KEEP)
        .await
    {
        // The answer itself is right; only a later retry would not find it.
        tracing::warn!(%error, "could not remember an idempotent answer");
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// Whether answers to POSTs on `path` are remembered: all but message creation (see the module doc) and
/// token issuing (an issued token must never be stored in clear; a retried request gets another token).
fn remembers(path: &str) -> bool {
    !(path.ends_with("/msg") || path.contains("/auth/app-portal-access/"))
}

/// Keys are scoped by the credentials, so one client can never be answered with another's object.
fn scope(headers: &HeaderMap) -> String {
    let credentials = headers.get(AUTHORIZATION).map_or(&b""[..], HeaderValue::as_bytes);
    let digest = crate::auth::token_digest(&String::from_utf8_lossy(credentials));
    format!("{} POST", hex::encode(digest))
}

/// What a retry must repeat exactly: method, path with query, and body bytes (SHA-256, hex).
fn request_digest(method: &Method, uri: &axum::http::Uri, body: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(method.as_str().as_bytes());
    hasher.update(b"\n");
    hasher.update(uri.path_and_query().map_or("", |p| p.as_str()).as_bytes());
    hasher.update(b"\n");
    hasher.update(body);
    hex::encode(hasher.finalize())
}

fn replay(remembered: Remembered) -> Response {
    let status = StatusCode::from_u16(remembered.status).unwrap_or(StatusCode::OK);
    let mut response = (status, remembered.body).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn keys_are_one_to_256_visible_ascii_characters() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(HEADER, HeaderValue::from_str(value).expect("header value"));
            key_of(&headers)
        };
        assert_eq!(with("a").expect("valid"), Some("a".to_owned()));
        assert!(with(&"k".repeat(256)).is_ok());
        for bad in ["", "has space", &"k".repeat(257)] {
            let error = with(bad).expect_err(bad);
            assert_eq!(error.field_errors()[0].loc, ["header", HEADER]);
        }
        assert_eq!(key_of(&HeaderMap::new()).expect("none"), None);
    }

    #[test]
    fn a_message_key_reused_for_another_message_is_refused() {
        let app_id = herald_core::id::AppId::new();
        let stored = Message {
            id: herald_core::id::MessageId::new(),
            app_id: app_id.clone(),
            event_id: None,
            event_type: "a.b".into(),
            channels: Some(vec!["x".into(), "y".into()]),
            payload: Arc::from(&b"{\"n\":1}"[..]),
            ordering_key: None,
            tags: Some(vec!["t".into()]),
            deliver_at: None,
            created_at: herald_core::clock::Millis::EPOCH,
        };
        let new = NewMessage {
            app_id,
            event_id: None,
            event_type: "a.b".into(),
            channels: Some(vec!["y".into(), "x".into()]),
            payload: Arc::from(&b"{\"n\":1}"[..]),
            idempotency_key: Some("k".into()),
            ordering_key: None,
            tags: Some(vec!["t".into()]),
            deliver_at: None,
            to_endpoint: None,
            payload_retention_ms: None,
        };
        assert!(check_same_message(&new, &stored).is_ok());
        let other = NewMessage {
            payload: Arc::from(&b"{\"n\":2}"[..]),
            ..new.clone()
        };
        assert!(check_same_message(&other, &stored).is_err());
        let retagged = NewMessage {
            tags: Some(vec!["u".into()]),
            ..new.clone()
        };
        assert!(check_same_message(&retagged, &stored).is_err());
        let retyped = NewMessage {
            event_type: "a.c".into(),
            ..new
        };
        assert!(check_same_message(&retyped, &stored).is_err());
    }
}
