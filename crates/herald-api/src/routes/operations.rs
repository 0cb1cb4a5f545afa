//! Operators' tools: find what went missing and repair it.
//!
//! - `GET /app/{app_id}/events`: the reconciliation listing — every message of the app created in a window,
//!   oldest first, with a cursor that stays valid while new messages arrive (receivers' repair path).
//! - `POST /app/{app_id}/msg/{msg_id}/endpoint/{endpoint_id}/resend`: send one message to one endpoint again.
//! - `POST /app/{app_id}/endpoint/{endpoint_id}/recover`, `…/replay-missing` and `…/bulk-replay`: bulk
//!   repairs, run as background tasks (`GET /background-task/{task_id}`).
//! - `POST /app/{app_id}/msg/{msg_id}/cancel`, `POST /app/{app_id}/endpoint/{endpoint_id}/cancel`: cancel
//!   pending deliveries; `DELETE /app/{app_id}/msg/{msg_id}/content`: expunge a payload, and
//!   `POST /app/{app_id}/msg/bulk-expunge` several, `POST /app/{app_id}/msg/expunge-all-contents` all (a
//!   background task); `DELETE /app/{app_id}/msg/{msg_id}/attempt/{attempt_id}/content`: an attempt's
//!   stored response body.
//! - `GET /app/{app_id}/endpoint/{endpoint_id}/msg` and `GET /app/{app_id}/delivery`: deliveries with their
//!   latest attempt, filterable by status (dead letters: `deliveryStatus=dead`);
//!   `GET /app/{app_id}/endpoint/{endpoint_id}/stats`.

use axum::extract::{OriginalUri, Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use herald_core::clock::{self, Millis};
use herald_core::id::{AppId, AppIdOrUid, EndpointId, EndpointIdOrUid, MessageId, MessageIdOrEventId};
use herald_core::model::{AttemptTrigger, DeliveryStatus, TaskKind, TaskState};
use herald_store::{DeliveryFilter, MessageFilter, Requeue};

use crate::body::JsonBody;
use crate::convert;
use crate::error::{ApiError, ApiResult};
use crate::lookup;
use crate::model::{
    BackgroundTaskOut, BulkExpungeIn, BulkExpungeOut, BulkReplayIn, CancelledOut, EndpointMessageOut, EndpointStatsOut,
    ListResponse, MessageOut, RepairIn,
};
use crate::query::Query;
use crate::state::AppState;
use crate::tasks::{self, Repair, ReplayFilter};
use crate::validate;

/// The most messages one bulk expunge names.
const MAX_BULK_EXPUNGE: usize = 1_000;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/app/{app_id}/events", get(events))
        .route("/app/{app_id}/msg/{msg_id}/endpoint/{endpoint_id}/resend", post(resend))
        .route("/app/{app_id}/endpoint/{endpoint_id}/recover", post(recover))
        .route(
            "/app/{app_id}/endpoint/{endpoint_id}/replay-missing",
            post(replay_missing),
        )
        .route("/app/{app_id}/endpoint/{endpoint_id}/bulk-replay", post(bulk_replay))
        .route("/background-task", get(tasks_list))
        .route("/background-task/{task_id}", get(task))
        .route("/app/{app_id}/msg/{msg_id}/cancel", post(cancel_message))
        .route("/app/{app_id}/endpoint/{endpoint_id}/cancel", post(cancel_endpoint))
        .route("/app/{app_id}/msg/{msg_id}/content", delete(expunge))
        .route("/app/{app_id}/msg/bulk-expunge", post(bulk_expunge))
        .route("/app/{app_id}/msg/expunge-all-contents", post(expunge_all))
        .route(
            "/app/{app_id}/msg/{msg_id}/attempt/{attempt_id}/content",
            delete(expunge_attempt),
        )
        .route("/app/{app_id}/endpoint/{endpoint_id}/msg", get(endpoint_messages))
        .route("/app/{app_id}/delivery", get(app_deliveries))
        .route("/app/{app_id}/endpoint/{endpoint_id}/stats", get(stats))
}

fn store_error(what: &'static str) -> impl Fn(herald_store::StoreError) -> ApiError {
    move |e| ApiError::from_store(e, what)
}

async fn events(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<MessageOut>>> {
    let query = Query::of(&uri);
    let page = query.page()?;
    if page.reverse {
        return Err(ApiError::query("iterator", "the event listing only pages forward"));
    }
    let with_content = query.flag("with_content", true)?;
    let filter = MessageFilter {
        since: query.time(&["since", "after"])?,
        until: query.time(&["until", "before"])?,
        event_types: query.list(&["eventTypes", "event_types"])?,
        channel: query.get(&["channel"]).map(str::to_owned),
        tag: None,
        oldest_first: true,
    };
    let app = lookup::app(&state, &app_id).await?;
    let found = state
        .store
        .list_messages(&app.id, &filter, &page)
        .await
        .map_err(store_error("message"))?;
    // An empty page keeps the caller's position, so polling with the last iterator picks up exactly
    // the messages created since.
    let resume = page.after.clone();
    let mut out = convert::list(found, |m| convert::message(&m, with_content));
    out.prev_iterator = None;
    if out.iterator.is_none() {
        out.iterator = resume;
    }
    Ok(Json(out))
}

/// Queue the message for the endpoint again; answers 202 with `{}` (Svix's `EmptyResponse`, which the SDKs
/// parse).
async fn resend(
    State(state): State<AppState>,
    Path((app_id, msg_id, endpoint_id)): Path<(AppIdOrUid, MessageIdOrEventId, EndpointIdOrUid)>,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
    let app = lookup::app(&state, &app_id).await?;
    let message = state
        .store
        .get_message(&app.id, &msg_id)
        .await
        .map_err(store_error("message"))?;
    let endpoint = lookup::endpoint(&state, &app.id, &endpoint_id).await?;
    let outcome = state
        .store
        .requeue_delivery(&message.id, &endpoint.id, AttemptTrigger::Manual, clock::now())
        .await
        .map_err(|e| match e {
            herald_store::StoreError::NotFound => ApiError::not_found("delivery of this message to this endpoint"),
            other => ApiError::from_store(other, "delivery"),
        })?;
    match outcome {
        Requeue::Queued(_) => Ok((StatusCode::ACCEPTED, Json(serde_json::json!({})))),
        Requeue::AlreadyPending => Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            "the delivery of this message to this endpoint is still pending; it will be attempted on schedule",
        )),
        Requeue::Expunged => Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            "the message's payload was expunged; there is nothing to resend",
        )),
    }
}

/// The window of a repair. One that ends before it starts is empty, like `until = since`: the task finds
/// nothing to do (the document cannot state a rule between two fields, so none is imposed).
fn window(since: time::OffsetDateTime, until: Option<time::OffsetDateTime>) -> (Millis, Millis) {
    let since = Millis::from_datetime(since);
    let until = until.map_or_else(clock::now, Millis::from_datetime).max(since);
    (since, until)
}

async fn start_repair(
    state: &AppState,
    repair: Repair,
    app_id: &AppIdOrUid,
    endpoint_id: &EndpointIdOrUid,
    (since, until): (Millis, Millis),
) -> ApiResult<(StatusCode, Json<BackgroundTaskOut>)> {
    let app = lookup::app(state, app_id).await?;
    let endpoint = lookup::endpoint(state, &app.id, endpoint_id).await?;
    let task = tasks::start(state, repair, endpoint, since, until)
        .await
        .map_err(store_error("background task"))?;
    Ok((StatusCode::ACCEPTED, Json(convert::task(task))))
}

async fn recover(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
    JsonBody(input): JsonBody<RepairIn>,
) -> ApiResult<(StatusCode, Json<BackgroundTaskOut>)> {
    let window = window(input.since, input.until);
    start_repair(&state, Repair::Recover, &app_id, &endpoint_id, window).await
}

async fn replay_missing(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
    JsonBody(input): JsonBody<RepairIn>,
) -> ApiResult<(StatusCode, Json<BackgroundTaskOut>)> {
    let window = window(input.since, input.until);
    start_repair(&state, Repair::ReplayMissing, &app_id, &endpoint_id, window).await
}

/// The most event types a bulk replay names.
const MAX_REPLAY_EVENT_TYPES: usize = 250;

/// `POST …/endpoint/{endpoint_id}/bulk-replay`: send the endpoint again the messages of the window it was
/// sent — delivered, failed or cancelled alike — narrowed by the filters given.
async fn bulk_replay(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
    JsonBody(input): JsonBody<BulkReplayIn>,
) -> ApiResult<(StatusCode, Json<BackgroundTaskOut>)> {
    if let Some(types) = &input.event_types {
        validate::names("eventTypes", types, MAX_REPLAY_EVENT_TYPES, false)?;
    }
    if let Some(channel) = &input.channel {
        validate::name("channel", channel, true)?;
    }
    if let Some(tag) = &input.tag {
        validate::tags("tag", [tag])?;
    }
    if let Some(status) = input.status
        && !(0..=4).contains(&status)
    {
        return Err(ApiError::body(
            "status",
            format!("expected 0 (success), 1 (pending), 2 (fail), 3 (sending) or 4 (canceled), got {status}"),
        ));
    }
    if let Some(class) = input.status_code_class
        && !matches!(class, 0 | 100 | 200 | 300 | 400 | 500)
    {
        return Err(ApiError::body(
            "statusCodeClass",
            format!("expected 0, 100, 200, 300, 400 or 500, got {class}"),
        ));
    }
    let filter = ReplayFilter {
        event_types: input.event_types,
        channel: input.channel,
        tag: input.tag,
        status: input.status,
        status_code_class: input.status_code_class,
    };
    let window = window(input.since, input.until);
    start_repair(&state, Repair::BulkReplay(filter), &app_id, &endpoint_id, window).await
}

/// `GET /background-task`: every application's tasks (admin only), newest first unless
/// `order=ascending`, filtered by `status` and `task` (the document's contract checked their values).
async fn tasks_list(
    State(state): State<AppState>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<BackgroundTaskOut>>> {
    let query = Query::of(&uri);
    let page = query.page()?;
    let newest_first = query.descending(true);
    let status = query.named("status", TaskState::parse)?;
    let kind = query.named("task", TaskKind::parse)?;
    let found = state
        .store
        .list_tasks(status, kind, &page, newest_first)
        .await
        .map_err(store_error("background task"))?;
    Ok(Json(convert::list(found, convert::task)))
}

async fn task(State(state): State<AppState>, Path(task_id): Path<String>) -> ApiResult<Json<BackgroundTaskOut>> {
    let task = state
        .store
        .get_task(&lookup::id(&task_id, "background task")?, None)
        .await
        .map_err(store_error("background task"))?;
    Ok(Json(convert::task(task)))
}

async fn cancel(
    state: &AppState,
    app_id: &AppId,
    message_id: Option<&MessageId>,
    endpoint_id: Option<&EndpointId>,
) -> ApiResult<u64> {
    let cancelled = state
        .store
        .cancel_pending(app_id, message_id, endpoint_id, clock::now())
        .await
        .map_err(store_error("delivery"))?;
    Ok(cancelled.len() as u64)
}

async fn cancel_message(
    State(state): State<AppState>,
    Path((app_id, msg_id)): Path<(AppIdOrUid, MessageIdOrEventId)>,
) -> ApiResult<Json<CancelledOut>> {
    let app = lookup::app(&state, &app_id).await?;
    let message = state
        .store
        .get_message(&app.id, &msg_id)
        .await
        .map_err(store_error("message"))?;
    let cancelled = cancel(&state, &app.id, Some(&message.id), None).await?;
    Ok(Json(CancelledOut { cancelled }))
}

async fn cancel_endpoint(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
) -> ApiResult<Json<CancelledOut>> {
    let app = lookup::app(&state, &app_id).await?;
    let endpoint = lookup::endpoint(&state, &app.id, &endpoint_id).await?;
    let cancelled = cancel(&state, &app.id, None, Some(&endpoint.id)).await?;
    Ok(Json(CancelledOut { cancelled }))
}

/// Expunging a payload also cancels the message's pending deliveries: there is nothing left to send.
async fn expunge(
    State(state): State<AppState>,
    Path((app_id, msg_id)): Path<(AppIdOrUid, MessageIdOrEventId)>,
) -> ApiResult<StatusCode> {
    let app = lookup::app(&state, &app_id).await?;
    expunge_one(&state, &app.id, &msg_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Cancel the pending deliveries of the message (by id or `eventId`) and remove its payload.
async fn expunge_one(state: &AppState, app_id: &AppId, msg_id: &MessageIdOrEventId) -> ApiResult<()> {
    let message = state
        .store
        .get_message(app_id, msg_id)
        .await
        .map_err(store_error("message"))?;
    cancel(state, app_id, Some(&message.id), None).await?;
    state
        .store
        .expunge_payload(app_id, &message.id)
        .await
        .map_err(store_error("message"))
}

/// `POST /app/{app_id}/msg/bulk-expunge`: [`expunge`] for each message named (by id or `eventId`),
/// answering per name `expunged` or `not-found`.
async fn bulk_expunge(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    JsonBody(input): JsonBody<BulkExpungeIn>,
) -> ApiResult<Json<BulkExpungeOut>> {
    let ids = input.ids.unwrap_or_default();
    if ids.len() > MAX_BULK_EXPUNGE {
        return Err(ApiError::body(
            "ids",
            format!("at most {MAX_BULK_EXPUNGE} messages at a time, got {}", ids.len()),
        ));
    }
    let app = lookup::app(&state, &app_id).await?;
    let mut results = std::collections::BTreeMap::new();
    for id in ids {
        let outcome = match expunge_one(&state, &app.id, &id).await {
            Ok(()) => "expunged",
            Err(error) if error.status == StatusCode::NOT_FOUND => "not-found",
            Err(error) => return Err(error),
        };
        // Answered under the name as given.
        results.insert(id.as_str().to_owned(), outcome);
    }
    Ok(Json(BulkExpungeOut { results }))
}

/// `POST /app/{app_id}/msg/expunge-all-contents`: expunge every payload of the application (messages
/// created until now), cancelling their pending deliveries, as a background task.
async fn expunge_all(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
) -> ApiResult<(StatusCode, Json<BackgroundTaskOut>)> {
    let app = lookup::app(&state, &app_id).await?;
    let task = tasks::start_purge(&state, &app.id)
        .await
        .map_err(store_error("background task"))?;
    Ok((StatusCode::ACCEPTED, Json(convert::task(task))))
}

/// `DELETE /app/{app_id}/msg/{msg_id}/attempt/{attempt_id}/content`: forget the response body an
/// endpoint answered to one attempt (e.g. it echoed something sensitive); the attempt stays.
async fn expunge_attempt(
    State(state): State<AppState>,
    Path((app_id, msg_id, attempt_id)): Path<(AppIdOrUid, MessageIdOrEventId, String)>,
) -> ApiResult<StatusCode> {
    let app = lookup::app(&state, &app_id).await?;
    let message = state
        .store
        .get_message(&app.id, &msg_id)
        .await
        .map_err(store_error("message"))?;
    state
        .store
        .expunge_attempt_response(&app.id, &message.id, &lookup::id(&attempt_id, "attempt")?)
        .await
        .map_err(store_error("attempt"))?;
    Ok(StatusCode::NO_CONTENT)
}

/// The `deliveryStatus` filter (Herald's names) or Svix's integer `status`.
fn status_filter(query: &Query<'_>) -> ApiResult<Option<DeliveryStatus>> {
    if let Some(name) = query.get(&["deliveryStatus", "delivery_status"]) {
        return convert::delivery_status_named(name).map(Some).ok_or_else(|| {
            ApiError::query(
                "deliveryStatus",
                format!("expected pending, delivered, failed, dead or cancelled, got {name:?}"),
            )
        });
    }
    match query.get(&["status"]) {
        None => Ok(None),
        Some("0") => Ok(Some(DeliveryStatus::Delivered)),
        Some("1") => Ok(Some(DeliveryStatus::Pending)),
        Some("4") => Ok(Some(DeliveryStatus::Cancelled)),
        Some(other) => Err(ApiError::query(
            "status",
            format!(
                "expected 0 (success), 1 (pending) or 4 (canceled), got {other:?}; \
             use deliveryStatus=failed or deliveryStatus=dead for failures"
            ),
        )),
    }
}

async fn list_deliveries(
    state: &AppState,
    app_id: &AppIdOrUid,
    endpoint_id: Option<&EndpointIdOrUid>,
    uri: &axum::http::Uri,
) -> ApiResult<Json<ListResponse<EndpointMessageOut>>> {
    let query = Query::of(uri);
    let page = query.page()?;
    let filter = DeliveryFilter {
        status: status_filter(&query)?,
        tag: query.get(&["tag"]).map(str::to_owned),
        channel: query.get(&["channel"]).map(str::to_owned),
        event_types: query.list(&["event_types", "eventTypes"])?,
        before: query.time(&["before"])?,
        after: query.time(&["after"])?,
    };
    let with_content = query.flag("with_content", true)?;
    let app = lookup::app(state, app_id).await?;
    let endpoint = match endpoint_id {
        Some(id) => Some(lookup::endpoint(state, &app.id, id).await?.id),
        None => None,
    };
    let found = state
        .store
        .list_deliveries(&app.id, endpoint.as_ref(), &filter, &page)
        .await
        .map_err(store_error("delivery"))?;
    Ok(Json(convert::list(found, |r| {
        convert::endpoint_message(r, with_content)
    })))
}

async fn endpoint_messages(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<EndpointMessageOut>>> {
    list_deliveries(&state, &app_id, Some(&endpoint_id), &uri).await
}

async fn app_deliveries(
    State(state): State<AppState>,
    Path(app_id): Path<AppIdOrUid>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<EndpointMessageOut>>> {
    let endpoint = Query::of(&uri)
        .get(&["endpointId", "endpoint_id"])
        .map(EndpointIdOrUid::new);
    list_deliveries(&state, &app_id, endpoint.as_ref(), &uri).await
}

async fn stats(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<EndpointStatsOut>> {
    let query = Query::of(&uri);
    let since = query.time(&["since"])?.unwrap_or(Millis::EPOCH);
    let until = query.time(&["until"])?.unwrap_or(Millis::MAX);
    let app = lookup::app(&state, &app_id).await?;
    let endpoint = lookup::endpoint(&state, &app.id, &endpoint_id).await?;
    let s = state
        .store
        .endpoint_stats(&endpoint.id, since, until)
        .await
        .map_err(store_error("endpoint"))?;
    Ok(Json(EndpointStatsOut {
        success: s.delivered,
        fail: s.failed,
        pending: s.pending,
        sending: 0,
        canceled: s.cancelled,
        cancelled: s.cancelled,
    }))
}
