//! Messages: `POST /app/{app_id}/msg` (the hot path), listing and reading.
//!
//! Creating a message answers 202 only once the message and one delivery per subscribed endpoint are
//! committed to disk (see the store's group commit); a repeated `eventId` or `idempotency-key` answers
//! with the original message and adds nothing.

use std::sync::Arc;

use axum::extract::{OriginalUri, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_store::{Ingested, MessageFilter, NewMessage, StoreError};

use super::apps;
use crate::body::JsonBody;
use crate::convert;
use crate::error::{ApiError, ApiResult};
use crate::lookup;
use crate::model::{ListResponse, MessageEndpointOut, MessageIn, MessageOut};
use crate::query::Query;
use crate::state::AppState;
use crate::validate;

/// Most channels a message may name.
const MAX_CHANNELS: usize = 5;
/// Longest `eventId` and `orderingKey`.
const MAX_KEY_LEN: usize = 256;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/app/{app_id}/msg", post(create).get(list))
        .route("/app/{app_id}/msg/{msg_id}", get(read))
        .route("/app/{app_id}/msg/{msg_id}/endpoint", get(deliveries))
}

fn store_error(error: StoreError) -> ApiError {
    ApiError::from_store(error, "message")
}

fn check(input: &MessageIn, state: &AppState) -> ApiResult<()> {
    if let Some(field) = input.unsupported_fields().first() {
        return Err(ApiError::body(field, "not supported by this server yet"));
    }
    validate::name("eventType", &input.event_type, false)?;
    if let Some(event_id) = &input.event_id {
        validate::text("eventId", event_id, true, MAX_KEY_LEN)?;
    }
    if let Some(channels) = &input.channels {
        validate::names("channels", channels, MAX_CHANNELS, true)?;
    }
    if let Some(key) = &input.ordering_key {
        validate::text("orderingKey", key, true, MAX_KEY_LEN)?;
    }
    if !input.payload_is_object() {
        return Err(ApiError::body("payload", "must be a JSON object"));
    }
    // The payload is kept byte for byte, but it must be JSON that every receiver's parser can read:
    // serde_json's defaults refuse nesting deeper than 128, lone surrogates and numbers out of range,
    // which a raw pass-through would otherwise store and echo into every listing.
    if let Err(error) = serde_json::from_str::<serde_json::Value>(input.payload.get()) {
        return Err(ApiError::body("payload", format!("not portable JSON: {error}")));
    }
    let size = input.payload.get().len();
    if size > state.limits.max_payload_bytes {
        return Err(ApiError::payload_too_large(state.limits.max_payload_bytes));
    }
    Ok(())
}

/// How long the payload is kept: `payloadRetentionPeriod` (days, as Svix) or `payloadRetentionHours`, at
/// most one of them; `None` leaves it to the app's default (the store applies it), if it has one.
fn payload_retention_ms(input: &MessageIn) -> ApiResult<Option<i64>> {
    const HOUR_MS: i64 = 3_600_000;
    let max_hours = validate::MAX_RETENTION_DAYS * 24;
    match (input.payload_retention_period, input.payload_retention_hours) {
        (Some(_), Some(_)) => Err(ApiError::body(
            "payloadRetentionHours",
            "give either payloadRetentionPeriod or payloadRetentionHours, not both",
        )),
        (Some(days), None) => {
            let days = validate::retention_days("payloadRetentionPeriod", days)?;
            Ok(Some(i64::from(days) * 24 * HOUR_MS))
        }
        (None, Some(hours)) if (1..=max_hours).contains(&hours) => Ok(Some(hours * HOUR_MS)),
        (None, Some(hours)) => Err(ApiError::body(
            "payloadRetentionHours",
            format!("must be between 1 and {max_hours} hours, got {hours}"),
        )),
        (None, None) => Ok(None),
    }
}

/// One span per ingest request (`ingest`): the application as given, then the message id and whether it
/// was new, so the request's log lines and its trace carry the `msg_…` that the dashboard shows.
#[tracing::instrument(name = "ingest", skip_all, fields(app = %app_id, msg = tracing::field::Empty, duplicate = tracing::field::Empty))]
async fn create(
    State(state): State<AppState>,
    Path(app_id): Path<String>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    JsonBody(mut input): JsonBody<MessageIn>,
) -> ApiResult<(StatusCode, Json<MessageOut>)> {
    check(&input, &state)?;
    let idempotency_key = crate::idempotency::key_of(&headers)?;
    let with_content = Query::of(&uri).flag("with_content", true)?;
    let app_id = match input.application.take() {
        Some(application) => apps::resolve_or_create(&state, &app_id, application).await?,
        None => lookup::app_id(&state, &app_id).await?,
    };
    let payload_retention_ms = payload_retention_ms(&input)?;
    let new = NewMessage {
        app_id,
        event_id: input.event_id,
        event_type: input.event_type,
        channels: input.channels.map(|set| set.into_iter().collect()),
        payload: Arc::from(input.payload.get().as_bytes()),
        idempotency_key,
        ordering_key: input.ordering_key,
        payload_retention_ms,
    };
    // Kept to compare with the stored message should the key turn out to be taken.
    let asked = new.idempotency_key.is_some().then(|| new.clone());
    let ingested = state
        .store
        .ingest(new)
        .await
        .map_err(|e| ApiError::from_store(e, "application"))?;
    let (stored, duplicate) = match &ingested {
        Ingested::Created { message, .. } => (message, false),
        Ingested::Duplicate(message) => (message, true),
    };
    if duplicate && let Some(asked) = &asked {
        crate::idempotency::check_same_message(asked, stored)?;
    }
    crate::metrics::ingested(duplicate);
    let span = tracing::Span::current();
    span.record("msg", stored.id.as_str());
    span.record("duplicate", duplicate);
    tracing::debug!(event_type = %stored.event_type, "message accepted");
    Ok((StatusCode::ACCEPTED, Json(convert::message(stored, with_content))))
}

async fn list(
    State(state): State<AppState>,
    Path(app_id): Path<String>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<MessageOut>>> {
    let query = Query::of(&uri);
    let page = query.page()?;
    let with_content = query.flag("with_content", true)?;
    let filter = MessageFilter {
        since: query.time_ms(&["since", "after"])?,
        until: query.time_ms(&["until", "before"])?,
        event_types: query.list(&["eventTypes", "event_types"])?,
        channel: query.get(&["channel"]).map(str::to_owned),
        oldest_first: false,
    };
    let app = lookup::app(&state, &app_id).await?;
    let found = state
        .store
        .list_messages(&app.id, &filter, &page)
        .await
        .map_err(store_error)?;
    Ok(Json(convert::list(found, |m| convert::message(&m, with_content))))
}

async fn read(
    State(state): State<AppState>,
    Path((app_id, msg_id)): Path<(String, String)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<MessageOut>> {
    let with_content = Query::of(&uri).flag("with_content", true)?;
    let app = lookup::app(&state, &app_id).await?;
    let message = state.store.get_message(&app.id, &msg_id).await.map_err(store_error)?;
    Ok(Json(convert::message(&message, with_content)))
}

/// The endpoints a message was fanned out to, each with its delivery's status (delivered, pending,
/// failed, dead).
async fn deliveries(
    State(state): State<AppState>,
    Path((app_id, msg_id)): Path<(String, String)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<MessageEndpointOut>>> {
    let page = Query::of(&uri).page()?;
    let app = lookup::app(&state, &app_id).await?;
    let message = state.store.get_message(&app.id, &msg_id).await.map_err(store_error)?;
    let found = state
        .store
        .list_deliveries_of_message(&app.id, &message.id, &page)
        .await
        .map_err(store_error)?;
    Ok(Json(convert::list(found, convert::message_endpoint)))
}
