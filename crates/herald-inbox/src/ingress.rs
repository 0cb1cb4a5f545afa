//! `POST /in/{source}`: read the raw body (capped), verify it, store it, and only then acknowledge.
//!
//! The order is the whole point. Nothing of the request is parsed before its signature verified; a
//! request that does not verify gets a 401 that says nothing useful to whoever forged it, is counted,
//! and leaves no trace in the store. A verified one is committed (one fsync, shared with whatever else
//! arrived at the same moment) before the `200` is sent, so a `200` means the event survives a crash.

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::http::header::{self, HeaderName};
use herald_core::id::InboxEventId;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::Source;
use crate::error::{HttpError, HttpResult};
use crate::state::InboxState;
use crate::store::{NewEvent, Status};

/// The answer to a stored event.
#[derive(Debug, Serialize)]
pub(crate) struct Receipt {
    /// The inbox id (`evt_…`); for a duplicate, the original's.
    id: InboxEventId,
    /// Whether this event (source and event id) was already stored.
    duplicate: bool,
}

/// Request headers that describe this hop only, never forwarded (nor stored).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::HOST,
    header::CONTENT_LENGTH,
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::EXPECT,
    header::PROXY_AUTHORIZATION,
];

/// The header the forwarder adds; a caller may not set it.
pub(crate) const INBOX_ID_HEADER: &str = "herald-inbox-id";

pub(crate) async fn receive(
    State(state): State<InboxState>,
    source: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> HttpResult<Json<Receipt>> {
    let Path(name) = source.map_err(|e| HttpError::bad_request(e.body_text()))?;
    let source = state
        .sources
        .get(&name)
        .ok_or_else(|| HttpError::not_found(format!("no source named {name:?}")))?
        .clone();
    let body = read_capped(body, state.max_body_bytes).await.inspect_err(|e| {
        if e.code == "payload_too_large" {
            state.metrics.too_large(&source.name);
        }
    })?;

    let now = herald_core::clock::now().as_unix_secs();
    if let Some(timestamp) = headers
        .get(herald_signature::HEADER_TIMESTAMP)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
    {
        state.metrics.clock_skew(&source.name, timestamp, now);
    }
    if let Err(reason) = source.verifier.verify(&headers, &body, now) {
        state.metrics.rejected(&source.name, &reason);
        // Debug, not info: a flood of forgeries must not flood the logs too (the counters keep the tally).
        tracing::debug!(source = %source.name, %reason, "rejected an unverified request");
        return Err(HttpError::unverified());
    }

    let event = classify(&source, &headers, body);
    let bad_input = event.status == Status::BadInput;
    if let Some(problem) = &event.last_error {
        tracing::warn!(source = %source.name, event_id = %event.event_id, %problem, "stored a verified event as bad_input");
    }
    let inserted = state.store.insert(event).await?;
    state.metrics.stored(&source.name, inserted.duplicate, bad_input);
    if !inserted.duplicate && !bad_input {
        state.wake.notify_one();
    }
    Ok(Json(Receipt {
        id: inserted.id,
        duplicate: inserted.duplicate,
    }))
}

/// The whole body, or 413 past `cap` bytes (read no further), or 400 if the connection broke.
async fn read_capped(body: Body, cap: usize) -> HttpResult<bytes::Bytes> {
    // Declared over the cap (`Content-Length`): refused on the head, before a byte is read (the edge
    // then closes the connection, the rest of the body being still on its way).
    if axum::body::HttpBody::size_hint(&body).lower() > u64::try_from(cap).unwrap_or(u64::MAX) {
        return Err(HttpError::payload_too_large(cap));
    }
    match Limited::new(body, cap).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => Err(HttpError::payload_too_large(cap)),
        Err(error) => {
            // axum wraps the length error of hyper's own limit too.
            let too_large = std::iter::successors(Some(&*error as &(dyn std::error::Error + 'static)), |e| e.source())
                .any(|e| e.is::<LengthLimitError>());
            if too_large {
                Err(HttpError::payload_too_large(cap))
            } else {
                Err(HttpError::bad_request("the request body could not be read"))
            }
        }
    }
}

/// Turn a verified request into the row to store: find its event id (and, with the guard on, its
/// resource key and version). A verified request is always stored: if something cannot be found it is
/// kept as `bad_input`, deduplicated on a hash of its body, for an operator to look at.
pub(crate) fn classify(source: &Source, headers: &HeaderMap, body: bytes::Bytes) -> NewEvent {
    let needs_json = source.event_id.needs_json()
        || source
            .guard
            .as_ref()
            .is_some_and(|g| g.resource_key.needs_json() || g.version.needs_json());
    let json: Option<Value> = needs_json.then(|| serde_json::from_slice(&body).ok()).flatten();
    let mut problems = Vec::new();
    if needs_json && json.is_none() {
        problems.push("the body is not JSON".to_owned());
    }
    let event_id = source.event_id.read(headers, json.as_ref()).unwrap_or_else(|missing| {
        problems.push(format!("event id: {missing}"));
        format!("sha256:{}", hex::encode(Sha256::digest(&body)))
    });
    let (resource_key, version) = match &source.guard {
        Some(guard) => {
            let mut read = |what: &str, location: &crate::locate::Location| {
                location
                    .read(headers, json.as_ref())
                    .map_err(|missing| problems.push(format!("{what}: {missing}")))
                    .ok()
            };
            (
                read("resource key", &guard.resource_key),
                read("version", &guard.version),
            )
        }
        None => (None, None),
    };
    let (status, last_error) = if problems.is_empty() {
        (Status::Pending, None)
    } else {
        (Status::BadInput, Some(problems.join("; ")))
    };
    NewEvent {
        source: source.name.clone(),
        event_id,
        headers: forwardable_headers(headers),
        body,
        status,
        last_error,
        resource_key,
        version,
    }
}

/// The request headers kept for the handler: all but the hop-by-hop ones and our own `herald-inbox-id`,
/// in order. Values that are not UTF-8 are dropped (JSON stores text).
fn forwardable_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| !HOP_BY_HOP.contains(name) && name.as_str() != INBOX_ID_HEADER)
        .filter_map(|(name, value)| {
            let value = std::str::from_utf8(value.as_bytes()).ok()?;
            Some((name.as_str().to_owned(), value.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::InboxConfig;

    fn source(extra: &str) -> std::sync::Arc<Source> {
        let text = format!(
            "[[source]]\nname = \"s\"\nscheme = \"stripe\"\nsecrets = [\"k\"]\nforward_to = \"http://127.0.0.1:1/\"\n{extra}"
        );
        InboxConfig::from_toml(&text).unwrap().sources[0].clone()
    }

    #[test]
    fn finds_the_event_id_and_guard_fields() {
        let s = source("resource_key = \"/data/id\"\nversion = \"/data/version\"\n");
        let mut headers = HeaderMap::new();
        headers.insert("host", "x".parse().unwrap());
        headers.insert("stripe-signature", "t=1,v1=00".parse().unwrap());
        headers.insert(INBOX_ID_HEADER, "spoofed".parse().unwrap());
        let event = classify(
            &s,
            &headers,
            bytes::Bytes::from_static(br#"{"id":"evt_1","data":{"id":"inv","version":3}}"#),
        );
        assert_eq!(event.status, Status::Pending);
        assert_eq!(event.event_id, "evt_1");
        assert_eq!(event.resource_key.as_deref(), Some("inv"));
        assert_eq!(event.version.as_deref(), Some("3"));
        assert_eq!(
            event.headers,
            vec![("stripe-signature".to_owned(), "t=1,v1=00".to_owned())]
        );
    }

    #[test]
    fn poison_is_bad_input_deduplicated_by_body_hash() {
        let s = source("resource_key = \"/data/id\"\nversion = \"/data/version\"\n");
        let event = classify(&s, &HeaderMap::new(), bytes::Bytes::from_static(b"not json"));
        assert_eq!(event.status, Status::BadInput);
        assert!(event.event_id.starts_with("sha256:"));
        assert!(event.last_error.unwrap().contains("not JSON"));
        let missing = classify(
            &s,
            &HeaderMap::new(),
            bytes::Bytes::from_static(br#"{"id":"e","data":{"id":"r"}}"#),
        );
        assert_eq!(missing.status, Status::BadInput);
        assert_eq!(missing.event_id, "e");
        assert!(missing.last_error.unwrap().contains("version"));
        // Without the guard, a missing version does not matter.
        let plain = classify(
            &source(""),
            &HeaderMap::new(),
            bytes::Bytes::from_static(br#"{"id":"e"}"#),
        );
        assert_eq!(plain.status, Status::Pending);
    }
}
