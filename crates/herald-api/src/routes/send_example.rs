//! `POST /app/{app_id}/endpoint/{endpoint_id}/send-example` (Svix's `v1.endpoint.send-example`): a real
//! message carrying an event type's example payload, delivered to that one endpoint only (whatever it
//! subscribes to) and answered as a created message.
//!
//! The example is the event type's schema's `examples` entry `exampleIndex` (the first by default), as
//! Svix picks it: version `1` of the schemas when there is one, else the newest version. `svix.ping`, the
//! event type Svix's portal uses to test an endpoint, needs no declared event type and sends
//! `{"success": true}`. An event type without an example is a 422: there is nothing to send.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use herald_core::id::{AppIdOrUid, EndpointIdOrUid};
use herald_store::NewMessage;
use serde_json::Value;

use super::messages;
use crate::body::JsonBody;
use crate::convert;
use crate::error::{ApiError, ApiResult};
use crate::lookup;
use crate::model::{EventExampleIn, MessageOut};
use crate::state::AppState;
use crate::validate;

/// The test event type every endpoint can be sent, and its payload (as Svix has them).
const PING_EVENT_TYPE: &str = "svix.ping";
const PING_PAYLOAD: &str = r#"{"success": true}"#;

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/app/{app_id}/endpoint/{endpoint_id}/send-example", post(send_example))
}

/// The example `index` of an event type's `schemas` (JSON text keyed by version): version `1`'s when it
/// has one, else the newest version's. `Err` names what is missing, for the 422.
fn example_of(schemas: Option<&str>, index: usize) -> Result<Value, String> {
    let schemas: Value = schemas
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or(Value::Null);
    let versions = schemas.as_object();
    let schema = versions.and_then(|v| v.get("1")).or_else(|| {
        versions.and_then(|v| {
            v.iter()
                .filter_map(|(version, schema)| version.parse::<u64>().ok().map(|n| (n, schema)))
                .max_by_key(|(n, _)| *n)
                .map(|(_, schema)| schema)
        })
    });
    let examples = schema
        .and_then(|s| s.get("examples"))
        .and_then(Value::as_array)
        .filter(|examples| !examples.is_empty())
        .ok_or("its schema has no `examples` to send")?;
    let example = examples.get(index).ok_or_else(|| {
        format!(
            "its schema has {} example(s); there is none at index {index}",
            examples.len()
        )
    })?;
    if !example.is_object() {
        return Err(format!("its example at index {index} is not a JSON object"));
    }
    Ok(example.clone())
}

/// The payload to send, as JSON text.
async fn payload(state: &AppState, input: &EventExampleIn) -> ApiResult<String> {
    if let Some(payload) = &input.payload {
        if !payload.get().starts_with('{') {
            return Err(ApiError::body("payload", "must be a JSON object"));
        }
        return Ok(payload.get().to_owned());
    }
    let index = match input.example_index {
        None => 0,
        Some(index) => usize::try_from(index).map_err(|_| ApiError::body("exampleIndex", "must be 0 or more"))?,
    };
    if input.event_type == PING_EVENT_TYPE {
        return Ok(PING_PAYLOAD.to_owned());
    }
    let event_type = state
        .store
        .get_event_type(&input.event_type)
        .await
        .map_err(|e| ApiError::from_store(e, "event type"))?;
    let field = if input.example_index.is_some() {
        "exampleIndex"
    } else {
        "eventType"
    };
    let example = example_of(event_type.schemas.as_deref(), index)
        .map_err(|why| ApiError::body(field, format!("no example to send for {:?}: {why}", input.event_type)))?;
    Ok(example.to_string())
}

async fn send_example(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
    JsonBody(input): JsonBody<EventExampleIn>,
) -> ApiResult<(StatusCode, Json<MessageOut>)> {
    validate::name("eventType", &input.event_type, false)?;
    let app = lookup::app(&state, &app_id).await?;
    let endpoint = lookup::endpoint(&state, &app.id, &endpoint_id).await?;
    let payload = payload(&state, &input).await?;
    if payload.len() > state.limits.max_payload_bytes {
        return Err(ApiError::payload_too_large(state.limits.max_payload_bytes));
    }
    let new = NewMessage {
        app_id: app.id,
        event_id: None,
        event_type: input.event_type,
        channels: None,
        payload: Arc::from(payload.into_bytes()),
        idempotency_key: None,
        ordering_key: None,
        tags: None,
        deliver_at: None,
        to_endpoint: Some(endpoint.id),
        payload_retention_ms: None,
    };
    let ingested = messages::ingest(&state, new).await?;
    let (stored, _) = messages::stored_of(&ingested);
    Ok((StatusCode::ACCEPTED, Json(convert::message(stored, true))))
}

#[cfg(test)]
mod tests {
    use super::example_of;
    use serde_json::json;

    #[test]
    fn the_example_is_version_ones_else_the_newest_versions_by_index() {
        let schemas = json!({
            "1": {"type": "object", "examples": [{"a": 1}, {"b": 2}]},
            "2": {"examples": [{"c": 3}]},
        })
        .to_string();
        assert_eq!(example_of(Some(&schemas), 0), Ok(json!({"a": 1})));
        assert_eq!(example_of(Some(&schemas), 1), Ok(json!({"b": 2})));
        assert!(example_of(Some(&schemas), 2).is_err_and(|why| why.contains("2 example(s)")));
        let newest = json!({"2": {"examples": [{"c": 3}]}, "10": {"examples": [{"d": 4}]}}).to_string();
        assert_eq!(example_of(Some(&newest), 0), Ok(json!({"d": 4})));
    }

    #[test]
    fn without_examples_or_with_one_that_is_not_an_object_there_is_nothing_to_send() {
        for schemas in [
            None,
            Some("{}".to_owned()),
            Some(json!({"1": {"type": "object"}}).to_string()),
        ] {
            assert!(example_of(schemas.as_deref(), 0).is_err_and(|why| why.contains("no `examples`")));
        }
        let scalar = json!({"1": {"examples": [7]}}).to_string();
        assert!(example_of(Some(&scalar), 0).is_err_and(|why| why.contains("not a JSON object")));
    }
}
