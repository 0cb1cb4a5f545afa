//! The admin API under `/api/v1/inbox`: list and inspect events, replay them, read the counters.
//!
//! Every route needs `Authorization: Bearer {HERALD_ADMIN_TOKEN}`. Without a configured token the admin
//! API is disabled (every call gets 401): the inbox never invents a token for itself.

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::error::{HttpError, HttpResult};
use crate::metrics::Snapshot;
use crate::state::InboxState;
use crate::store::{ListQuery, Status, StoredEvent};

/// Default and largest page sizes.
const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 250;

/// Reject requests without the admin bearer token (compared by SHA-256 digest, in constant time).
pub(crate) async fn require_admin(
    State(state): State<InboxState>,
    request: Request,
    next: Next,
) -> HttpResult<Response> {
    let Some(expected) = state.admin_token_sha256 else {
        return Err(HttpError::unauthenticated(
            "the inbox admin API is disabled: set HERALD_ADMIN_TOKEN",
        ));
    };
    let presented = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")))
        .map(str::trim)
        .ok_or_else(|| HttpError::unauthenticated("missing or invalid bearer token"))?;
    let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
    if bool::from(digest.ct_eq(&expected)) {
        Ok(next.run(request).await)
    } else {
        Err(HttpError::unauthenticated("missing or invalid bearer token"))
    }
}

/// An event as the admin API shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EventOut {
    id: String,
    source: String,
    event_id: String,
    status: Status,
    attempts: u32,
    /// While pending: when the next attempt is due.
    next_attempt_at: Option<String>,
    received_at: String,
    updated_at: String,
    last_error: Option<String>,
    resource_key: Option<String>,
    version: Option<String>,
    replays: i64,
    /// Single-event view only: the stored headers, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<Vec<(String, String)>>,
    /// Single-event view only: the body as text when it is UTF-8...
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<String>,
    /// ...and as base64 when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

/// Unix milliseconds as RFC 3339.
fn rfc3339(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

impl EventOut {
    fn summary(event: StoredEvent) -> Self {
        Self {
            next_attempt_at: (event.status == Status::Pending).then(|| rfc3339(event.next_attempt_at)),
            received_at: rfc3339(event.received_at),
            updated_at: rfc3339(event.updated_at),
            id: event.id,
            source: event.source,
            event_id: event.event_id,
            status: event.status,
            attempts: event.attempts,
            last_error: event.last_error,
            resource_key: event.resource_key,
            version: event.version,
            replays: event.replays,
            headers: None,
            body: None,
            body_base64: None,
        }
    }

    fn full(event: StoredEvent) -> Self {
        let headers = event.headers.clone();
        let (body, body_base64) = match std::str::from_utf8(&event.body) {
            Ok(text) => (Some(text.to_owned()), None),
            Err(_) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(&event.body)),
            ),
        };
        Self {
            headers: Some(headers),
            body,
            body_base64,
            ..Self::summary(event)
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListParams {
    source: Option<String>,
    status: Option<String>,
    limit: Option<usize>,
    iterator: Option<String>,
}

/// A page of events, Svix-style.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EventPage {
    data: Vec<EventOut>,
    iterator: Option<String>,
    prev_iterator: Option<String>,
    done: bool,
}

/// `GET /api/v1/inbox/event`: newest first, filtered by `source` and `status`.
pub(crate) async fn list(
    State(state): State<InboxState>,
    params: Result<Query<ListParams>, QueryRejection>,
) -> HttpResult<Json<EventPage>> {
    let Query(params) = params.map_err(|e| HttpError::validation(e.body_text()))?;
    let status = match params.status.as_deref() {
        Some(text) => Some(text.parse::<Status>().map_err(|_| {
            HttpError::validation(format!(
                "status: {text:?} is not one of pending, forwarded, stale, bad_input, dead"
            ))
        })?),
        None => None,
    };
    let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(HttpError::validation(format!(
            "limit: must be between 1 and {MAX_LIMIT}"
        )));
    }
    let query = ListQuery {
        source: params.source,
        status,
        limit,
        before: params.iterator,
    };
    let mut events = state.store.list(&query).await?;
    let done = events.len() <= limit;
    events.truncate(limit);
    let iterator = events.last().map(|e| e.id.clone());
    Ok(Json(EventPage {
        data: events.into_iter().map(EventOut::summary).collect(),
        iterator,
        prev_iterator: None,
        done,
    }))
}

/// `GET /api/v1/inbox/event/{id}`: one event with its headers and body.
pub(crate) async fn get(
    State(state): State<InboxState>,
    id: Result<Path<String>, PathRejection>,
) -> HttpResult<Json<EventOut>> {
    let Path(id) = id.map_err(|e| HttpError::bad_request(e.body_text()))?;
    let event = state
        .store
        .get(&id)
        .await?
        .ok_or_else(|| HttpError::not_found("event not found"))?;
    Ok(Json(EventOut::full(event)))
}

/// `POST /api/v1/inbox/event/{id}/replay`: forward one event again, whatever its status, bypassing the
/// version guard. Answers 202 with the event, now pending.
pub(crate) async fn replay_one(
    State(state): State<InboxState>,
    id: Result<Path<String>, PathRejection>,
) -> HttpResult<(StatusCode, Json<EventOut>)> {
    let Path(id) = id.map_err(|e| HttpError::bad_request(e.body_text()))?;
    if !state.store.replay(&id, herald_core::clock::now_ms()).await? {
        return Err(HttpError::not_found("event not found"));
    }
    state.wake.notify_one();
    let event = state
        .store
        .get(&id)
        .await?
        .ok_or_else(|| HttpError::not_found("event not found"))?;
    Ok((StatusCode::ACCEPTED, Json(EventOut::summary(event))))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Window {
    since: String,
    until: Option<String>,
}

/// How many events a window replay made pending again.
#[derive(Debug, Serialize)]
pub(crate) struct Replayed {
    replayed: u64,
}

/// `POST /api/v1/inbox/source/{source}/replay` with `{"since": RFC 3339, "until": RFC 3339?}`: forward
/// again every event of the source received at or after `since` and before `until` (default: now),
/// bypassing the version guard. Answers 202 with the count.
pub(crate) async fn replay_window(
    State(state): State<InboxState>,
    source: Result<Path<String>, PathRejection>,
    window: Result<Json<Window>, JsonRejection>,
) -> HttpResult<(StatusCode, Json<Replayed>)> {
    let Path(source) = source.map_err(|e| HttpError::bad_request(e.body_text()))?;
    if !state.sources.contains_key(&source) {
        return Err(HttpError::not_found(format!("no source named {source:?}")));
    }
    let Json(window) = window.map_err(|e| HttpError::bad_request(e.body_text()))?;
    let now = herald_core::clock::now_ms();
    let since = parse_time("since", &window.since)?;
    let until = match &window.until {
        Some(text) => parse_time("until", text)?,
        // Everything received so far, including this very millisecond.
        None => now.saturating_add(1),
    };
    if until <= since {
        return Err(HttpError::validation("until: must be after since"));
    }
    let replayed = state.store.replay_window(&source, since, until, now).await?;
    if replayed > 0 {
        state.wake.notify_one();
    }
    Ok((StatusCode::ACCEPTED, Json(Replayed { replayed })))
}

fn parse_time(field: &str, text: &str) -> HttpResult<i64> {
    let time = OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|_| HttpError::validation(format!("{field}: {text:?} is not an RFC 3339 date-time")))?;
    i64::try_from(time.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| HttpError::validation(format!("{field}: out of range")))
}

/// `GET /api/v1/inbox/stats`: the counters since start.
pub(crate) async fn stats(State(state): State<InboxState>) -> Json<Snapshot> {
    Json(state.metrics.snapshot())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(parse_time("since", "1970-01-01T00:00:01.5Z"), Ok(1500));
        assert_eq!(parse_time("since", &rfc3339(1_700_000_000_123)), Ok(1_700_000_000_123));
        assert!(
            parse_time("since", "yesterday")
                .unwrap_err()
                .detail
                .starts_with("since:")
        );
    }
}
