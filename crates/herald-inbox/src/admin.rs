//! The admin API under `/api/v1/inbox`: list and inspect events, replay them, read the counters.
//!
//! Every route needs `Authorization: Bearer {HERALD_ADMIN_TOKEN}`. Without a configured token the admin
//! API is disabled (every call gets 401): the inbox never invents a token for itself.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use base64::Engine as _;
use herald_core::clock::Millis;
use herald_core::id::InboxEventId;
use herald_edge::problem::{FieldError, Problem, Source};
use serde::Serialize;
use serde_json::Value;
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
    id: InboxEventId,
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

/// A moment as RFC 3339 (empty outside the years a date-time can hold).
fn rfc3339(at: Millis) -> String {
    at.to_rfc3339().unwrap_or_default()
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

/// The query parameters of an admin route, checked as the sender checks its own: a name the route does
/// not take, or one given twice, is a 422 naming it.
struct QueryParams(Vec<(&'static str, String)>);

impl QueryParams {
    /// `raw` (the query string, if any) read against the names the route takes.
    fn read(raw: Option<&str>, taken: &[&'static str]) -> HttpResult<Self> {
        let mut found: Vec<(&'static str, String)> = Vec::new();
        for (name, value) in url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            let Some(known) = taken.iter().copied().find(|t| *t == name) else {
                return Err(HttpError::field(FieldError::unknown_query(&name, taken)));
            };
            if found.iter().any(|(seen, _)| *seen == known) {
                return Err(HttpError::invalid(
                    Source::Query,
                    known,
                    Problem::Value,
                    "given more than once",
                ));
            }
            found.push((known, value.into_owned()));
        }
        Ok(Self(found))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }
}

/// For the routes that take no query parameter.
pub(crate) async fn no_query(RawQuery(raw): RawQuery, request: Request, next: Next) -> HttpResult<Response> {
    QueryParams::read(raw.as_deref(), &[])?;
    Ok(next.run(request).await)
}

/// The listing's page size: 1 to [`MAX_LIMIT`], [`DEFAULT_LIMIT`] when not given.
fn limit(text: Option<&str>) -> HttpResult<usize> {
    let Some(text) = text else {
        return Ok(DEFAULT_LIMIT);
    };
    let invalid = |problem, msg: String| HttpError::invalid(Source::Query, "limit", problem, msg);
    let number: i64 = text
        .parse()
        .map_err(|_| invalid(Problem::Type, format!("expected an integer, got {text:?}")))?;
    usize::try_from(number)
        .ok()
        .filter(|n| (1..=MAX_LIMIT).contains(n))
        .ok_or_else(|| {
            invalid(
                Problem::Value,
                format!("expected an integer from 1 to {MAX_LIMIT}, got {number}"),
            )
        })
}

/// A page of events, Svix-style.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EventPage {
    data: Vec<EventOut>,
    iterator: Option<InboxEventId>,
    prev_iterator: Option<String>,
    done: bool,
}

/// `GET /api/v1/inbox/event`: newest first, filtered by `source` and `status`.
pub(crate) async fn list(State(state): State<InboxState>, RawQuery(raw): RawQuery) -> HttpResult<Json<EventPage>> {
    let params = QueryParams::read(raw.as_deref(), &["source", "status", "limit", "iterator"])?;
    let status = match params.get("status") {
        Some(text) => Some(text.parse::<Status>().map_err(|_| {
            HttpError::invalid(
                Source::Query,
                "status",
                Problem::Value,
                format!("expected one of pending, forwarded, stale, bad_input, dead, got {text:?}"),
            )
        })?),
        None => None,
    };
    let limit = limit(params.get("limit"))?;
    let iterator = match params.get("iterator").map(InboxEventId::parse) {
        // An event id this inbox issued: the page starts after it.
        Some(Ok(id)) => Some(id),
        Some(Err(_)) => {
            return Err(HttpError::invalid(
                Source::Query,
                "iterator",
                Problem::Value,
                "not an iterator this inbox issued (the `iterator` of a previous page)",
            ));
        }
        None => None,
    };
    let source = params.get("source").map(str::to_owned);
    let query = ListQuery {
        source,
        status,
        limit,
        before: iterator,
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

/// The event a path's `{id}` names: 400 for a path that cannot be read, 404 for a text that is no event id
/// (the same answer as an id no event has: nothing is stored under it).
fn event_id(path: Result<Path<String>, PathRejection>) -> HttpResult<InboxEventId> {
    let Path(text) = path.map_err(|e| HttpError::bad_request(e.body_text()))?;
    InboxEventId::parse(&text).map_err(|_| HttpError::not_found("event not found"))
}

/// `GET /api/v1/inbox/event/{id}`: one event with its headers and body.
pub(crate) async fn get(
    State(state): State<InboxState>,
    id: Result<Path<String>, PathRejection>,
) -> HttpResult<Json<EventOut>> {
    let id = event_id(id)?;
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
    let id = event_id(id)?;
    if !state.store.replay(&id, herald_core::clock::now()).await? {
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

/// The body of a window replay, `{"since": …, "until": …}`: a JSON object (else 400, as the sender
/// answers), `since` a text, `until` a text or absent (or null); any other key is a 422 naming it.
fn window(body: &[u8]) -> HttpResult<(String, Option<String>)> {
    let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) else {
        return Err(HttpError::bad_request("the request body must be a JSON object"));
    };
    const TAKEN: [&str; 2] = ["since", "until"];
    if let Some(extra) = fields.keys().find(|key| !TAKEN.contains(&key.as_str())) {
        return Err(HttpError::invalid(
            Source::Body,
            extra,
            Problem::Extra,
            "unknown field: this operation takes since, until",
        ));
    }
    let text = |name: &str| match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(HttpError::invalid(
            Source::Body,
            name,
            Problem::Type,
            "expected an RFC 3339 date-time as a string",
        )),
    };
    let since =
        text("since")?.ok_or_else(|| HttpError::invalid(Source::Body, "since", Problem::Missing, "field required"))?;
    Ok((since, text("until")?))
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
    body: Bytes,
) -> HttpResult<(StatusCode, Json<Replayed>)> {
    let Path(source) = source.map_err(|e| HttpError::bad_request(e.body_text()))?;
    if !state.sources.contains_key(&source) {
        return Err(HttpError::not_found(format!("no source named {source:?}")));
    }
    let (since, until) = window(&body)?;
    let now = herald_core::clock::now();
    let since = parse_time("since", &since)?;
    let until = match &until {
        Some(text) => parse_time("until", text)?,
        // Everything received so far, including this very millisecond.
        None => now.add_ms(1),
    };
    if until <= since {
        return Err(HttpError::invalid(
            Source::Body,
            "until",
            Problem::Value,
            "must be after since",
        ));
    }
    let replayed = state.store.replay_window(&source, since, until, now).await?;
    if replayed > 0 {
        state.wake.notify_one();
    }
    Ok((StatusCode::ACCEPTED, Json(Replayed { replayed })))
}

fn parse_time(field: &str, text: &str) -> HttpResult<Millis> {
    let invalid = |msg: String| HttpError::invalid(Source::Body, field, Problem::Value, msg);
    let time = OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|_| invalid(format!("expected an RFC 3339 date-time, got {text:?}")))?;
    // RFC 3339 years end at 9999: every one fits in Unix milliseconds.
    Ok(Millis::from_datetime(time))
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
        let at = Millis::from_unix_ms;
        assert_eq!(rfc3339(at(0)), "1970-01-01T00:00:00Z");
        assert_eq!(parse_time("since", "1970-01-01T00:00:01.5Z"), Ok(at(1500)));
        assert_eq!(
            parse_time("since", &rfc3339(at(1_700_000_000_123))),
            Ok(at(1_700_000_000_123))
        );
        assert!(
            parse_time("since", "yesterday")
                .unwrap_err()
                .detail
                .text()
                .starts_with("since:")
        );
    }
}
