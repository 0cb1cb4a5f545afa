//! Messages: `POST /app/{app_id}/msg` (the hot path), `POST /app/{app_id}/msg-batch` (many at once, a
//! Herald extension), listing and reading.
//!
//! Creating a message answers 202 only once the message and one delivery per subscribed endpoint are
//! committed to disk (see the store's group commit); a repeated `eventId` or `idempotency-key` answers
//! with the original message and adds nothing.

use std::sync::Arc;

use tracing::Instrument as _;

use axum::extract::{OriginalUri, Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_core::clock::Millis;
use herald_core::id::{AppId, AppIdOrUid, MessageIdOrEventId};
use herald_core::model::Message;
use herald_store::{Ingested, MessageFilter, NewMessage, StoreError};

use super::apps;
use crate::body::JsonBody;
use crate::convert;
use crate::error::{ApiError, ApiResult, Problem, Source};
use crate::idempotency::IdempotencyKey;
use crate::lookup;
use crate::model::{
    ListResponse, MAX_BATCH_MESSAGES, MessageBatchIn, MessageBatchItemOut, MessageBatchOut, MessageEndpointOut,
    MessageIn, MessageOut,
};
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
        .route("/app/{app_id}/msg-batch", post(create_batch))
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
    if let Some(tags) = &input.tags {
        validate::tags("tags", tags)?;
    }
    if let Some(at) = input.deliver_at {
        validate::deliver_at(at, herald_core::clock::now())?;
    }
    if let Some(key) = &input.ordering_key {
        validate::text("orderingKey", key, true, MAX_KEY_LEN)?;
    }
    if !input.payload_is_object() {
        return Err(ApiError::body("payload", "must be a JSON object"));
    }
    // The payload is kept byte for byte, but it must be JSON that every receiver's parser can read.
    if let Err(error) = validate::portable_json(input.payload.get()) {
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

/// The message to store for `input`, which [`check`] accepted (the app already resolved to its id).
fn new_message(input: MessageIn, app_id: &AppId, idempotency_key: Option<String>) -> ApiResult<NewMessage> {
    let payload_retention_ms = payload_retention_ms(&input)?;
    Ok(NewMessage {
        app_id: app_id.clone(),
        event_id: input.event_id,
        event_type: input.event_type,
        channels: input.channels.map(|set| set.into_iter().collect()),
        payload: Arc::from(input.payload.get().as_bytes()),
        idempotency_key,
        ordering_key: input.ordering_key,
        tags: input.tags.map(|set| set.into_iter().collect()),
        // Within the horizon: `check` saw to it.
        deliver_at: input.deliver_at.map(Millis::from_datetime),
        to_endpoint: None,
        payload_retention_ms,
    })
}

/// `POST /app/{app_id}/msg`, in its span (`ingest`): the application as given, then the message id and
/// whether it was new, so the request's log lines and its trace carry the `msg_…` that the dashboard
/// shows.
///
/// The span is opened only where it is used: when traces are exported ([`Shared::trace_requests`]) or
/// the filter lets `debug` through (the "message accepted" line). At the default `info` a successful
/// request writes no line, and the span's fields, formatted at its opening and at each record, took
/// about 3 % of a node's CPU under ingest.
///
/// [`Shared::trace_requests`]: crate::state::Shared::trace_requests
async fn create(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    OriginalUri(uri): OriginalUri,
    idempotency_key: IdempotencyKey,
    JsonBody(input): JsonBody<MessageIn>,
) -> ApiResult<(StatusCode, Json<MessageOut>)> {
    let span = if herald_telemetry::span_wanted(state.trace_requests) {
        tracing::info_span!(
            "ingest",
            app = %app_id,
            msg = tracing::field::Empty,
            duplicate = tracing::field::Empty
        )
    } else {
        tracing::Span::none()
    };
    accept(state, app_id, uri, idempotency_key, input, &span)
        .instrument(span.clone())
        .await
}

/// [`create`]'s work, inside its `span`.
async fn accept(
    state: AppState,
    app_id: AppIdOrUid,
    uri: axum::http::Uri,
    idempotency_key: IdempotencyKey,
    mut input: MessageIn,
    span: &tracing::Span,
) -> ApiResult<(StatusCode, Json<MessageOut>)> {
    check(&input, &state)?;
    let idempotency_key = idempotency_key.checked()?;
    let with_content = Query::of(&uri).flag("with_content", true)?;
    let app_id = apps::id_or_create(&state, &app_id, input.application.take()).await?;
    let new = new_message(input, &app_id, idempotency_key)?;
    // Kept to compare with the stored message should the key turn out to be taken.
    let asked = new.idempotency_key.is_some().then(|| new.clone());
    let ingested = ingest(&state, new).await?;
    let (stored, duplicate) = stored_of(&ingested);
    if duplicate && let Some(asked) = &asked {
        crate::idempotency::check_same_message(asked, stored)?;
    }
    span.record("msg", stored.id.as_str());
    span.record("duplicate", duplicate);
    tracing::debug!(event_type = %stored.event_type, "message accepted");
    Ok((StatusCode::ACCEPTED, Json(convert::message(stored, with_content))))
}

/// Hand a message to the store, which answers once it and its deliveries are committed: the stored
/// message, and whether it is an earlier one that this one repeats (by `eventId` or idempotency key).
/// The answer is the store's own, read through [`stored_of`], so the message is not copied on the hot path.
pub(super) async fn ingest(state: &AppState, new: NewMessage) -> ApiResult<Ingested> {
    state
        .store
        .ingest(new)
        .await
        .map_err(|e| ApiError::from_store(e, "application"))
}

/// The stored message of an ingest and whether it was there already (counted in the metrics).
pub(super) fn stored_of(ingested: &Ingested) -> (&Message, bool) {
    let (stored, duplicate) = match ingested {
        Ingested::Created { message, .. } => (&**message, false),
        Ingested::Duplicate(message) => (message, true),
    };
    crate::metrics::ingested(duplicate);
    (stored, duplicate)
}

/// `POST /app/{app_id}/msg-batch` (Herald extension): many messages in one request, each as
/// `POST /app/{app_id}/msg` would take it, with an `eventId` each (so that a retry of the whole request
/// adds nothing). Every message is checked before any is stored (one invalid message is a 422 naming it
/// by its index); then all are queued at the group-commit writer in the order given, so they share its
/// commits and one ordering key's messages are created in that order. The answer lists one result per
/// message. A storage failure answers the whole request 503, even if some messages committed before
/// it: a retry with the same body finds those by their `eventId`.
#[tracing::instrument(name = "ingest_batch", skip_all, fields(app = %app_id, messages = tracing::field::Empty))]
async fn create_batch(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    OriginalUri(uri): OriginalUri,
    JsonBody(input): JsonBody<MessageBatchIn>,
) -> ApiResult<Json<MessageBatchOut>> {
    let with_content = Query::of(&uri).flag("with_content", true)?;
    let count = input.messages.len();
    if !(1..=MAX_BATCH_MESSAGES).contains(&count) {
        return Err(ApiError::body(
            "messages",
            format!("from 1 to {MAX_BATCH_MESSAGES} messages at a time, got {count}"),
        ));
    }
    tracing::Span::current().record("messages", count);
    for (index, message) in input.messages.iter().enumerate() {
        let at = ["messages".to_owned(), index.to_string()];
        check(message, &state).map_err(|e| e.nested(&at))?;
        payload_retention_ms(message).map_err(|e| e.nested(&at))?;
        if message.application.is_some() {
            return Err(ApiError::body(
                &format!("messages.{index}.application"),
                "a batch does not create the application; create it first",
            ));
        }
        if message.event_id.is_none() {
            return Err(ApiError::invalid(
                Source::Body,
                &format!("messages.{index}.eventId"),
                Problem::Missing,
                "every message of a batch needs an eventId (so that a retry stores nothing twice)",
            ));
        }
    }
    let app_id = lookup::app_id(&state, &app_id).await?;
    let batch = input
        .messages
        .into_iter()
        .map(|message| new_message(message, &app_id, None))
        .collect::<ApiResult<Vec<_>>>()?;
    let outcomes = state
        .store
        .ingest_many(batch)
        .await
        .map_err(|e| ApiError::from_store(e, "application"))?;
    // A failed write is never answered 2xx, not even inside a list: the whole request fails, and its
    // retry is harmless (every message has its eventId).
    if let Some(fault) = outcomes
        .iter()
        .find_map(|o| o.as_ref().err().and_then(StoreError::fault))
    {
        return Err(ApiError::store_fault(fault));
    }
    let data = outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Ok(ingested) => MessageBatchItemOut {
                status: StatusCode::ACCEPTED.as_u16(),
                message: Some(convert::message(stored_of(&ingested).0, with_content)),
                error: None,
            },
            Err(error) => {
                let error = ApiError::from_store(error, "application");
                MessageBatchItemOut {
                    status: error.status.as_u16(),
                    message: None,
                    error: Some(error.to_out()),
                }
            }
        })
        .collect();
    Ok(Json(MessageBatchOut { data }))
}

async fn list(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<MessageOut>>> {
    let query = Query::of(&uri);
    let page = query.page()?;
    let with_content = query.flag("with_content", true)?;
    let filter = MessageFilter {
        since: query.time(&["since", "after"])?,
        until: query.time(&["until", "before"])?,
        event_types: query.list(&["eventTypes", "event_types"])?,
        channel: query.get(&["channel"]).map(str::to_owned),
        tag: query.get(&["tag"]).map(str::to_owned),
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
    Path((app_id, msg_id)): Path<(AppIdOrUid, MessageIdOrEventId)>,
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
    Path((app_id, msg_id)): Path<(AppIdOrUid, MessageIdOrEventId)>,
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
