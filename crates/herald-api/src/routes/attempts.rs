//! The attempt log: `/app/{app_id}/attempt/msg/{msg_id}` (also filtered by `endpoint_id`) and
//! `/app/{app_id}/attempt/endpoint/{endpoint_id}` (which expands each attempt's message with
//! `with_msg=true`), filtered by `status` (0 success, 2 failure, as Svix's message status),
//! `status_code_class` (0 for "no response", 100 … 500), `event_types`, `before` and `after`; and one
//! attempt, `/app/{app_id}/msg/{msg_id}/attempt/{attempt_id}`.

use std::collections::HashMap;

use axum::extract::{OriginalUri, Path, State};
use axum::routing::get;
use axum::{Json, Router};
use herald_core::id::{AppIdOrUid, EndpointIdOrUid, MessageId, MessageIdOrEventId};
use herald_core::model::{Attempt, Message};

use crate::convert;
use crate::error::{ApiError, ApiResult};
use crate::lookup;
use crate::model::{ListResponse, MessageAttemptOut};
use crate::query::Query;
use crate::state::AppState;
use herald_store::{AttemptFilter, Page, PageRequest};

/// A message has few attempts (its retry schedule, times its endpoints): a filter the store does not
/// know is applied while walking them, this many at a time.
const SCAN_PAGE: usize = PageRequest::MAX_LIMIT;

/// The attempt filters of a listing's query string.
fn filter(query: &Query<'_>) -> ApiResult<AttemptFilter> {
    let success = match query.get(&["status"]) {
        None => None,
        Some("0") => Some(true),
        Some("2") => Some(false),
        Some(other) => {
            return Err(ApiError::query(
                "status",
                format!("expected 0 (success) or 2 (failure), got {other:?}"),
            ));
        }
    };
    let status_code_class = match query.get(&["status_code_class", "statusCodeClass"]) {
        None => None,
        Some(text) => match text.parse::<u16>() {
            Ok(class @ (0 | 100 | 200 | 300 | 400 | 500)) => Some(class),
            _ => {
                return Err(ApiError::query(
                    "status_code_class",
                    format!("expected 0, 100, 200, 300, 400 or 500, got {text:?}"),
                ));
            }
        },
    };
    Ok(AttemptFilter {
        success,
        status_code_class,
        event_types: query.list(&["event_types", "eventTypes"])?,
        tag: query.get(&["tag"]).map(str::to_owned),
        channel: query.get(&["channel"]).map(str::to_owned),
        before: query.time(&["before"])?,
        after: query.time(&["after"])?,
    })
}

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/app/{app_id}/attempt/msg/{msg_id}", get(by_message))
        .route("/app/{app_id}/attempt/endpoint/{endpoint_id}", get(by_endpoint))
        .route("/app/{app_id}/msg/{msg_id}/attempt/{attempt_id}", get(one))
}

async fn message(state: &AppState, app_id: &AppIdOrUid, msg_id: &MessageIdOrEventId) -> ApiResult<Message> {
    let app = lookup::app(state, app_id).await?;
    state
        .store
        .get_message(&app.id, msg_id)
        .await
        .map_err(|e| ApiError::from_store(e, "message"))
}

/// One page of a message's attempts that pass `keep`, walking the store's pages: the iterator stays the
/// store's (the id of the last attempt returned), so the next page resumes right after it.
async fn scan_message(
    state: &AppState,
    message: &Message,
    filter: &AttemptFilter,
    page: &PageRequest,
    keep: impl Fn(&Attempt) -> bool,
) -> ApiResult<Page<Attempt>> {
    let mut request = PageRequest {
        limit: SCAN_PAGE,
        ..page.clone()
    };
    let mut kept = Vec::new();
    loop {
        let found = state
            .store
            .list_attempts_by_message(&message.app_id, &message.id, filter, &request)
            .await
            .map_err(|e| ApiError::from_store(e, "attempt"))?;
        let mut items = found.items;
        // A reverse page comes in listing order: walk it from its far end.
        if page.reverse {
            items.reverse();
        }
        kept.extend(items.into_iter().filter(|a| keep(a)));
        let next = if page.reverse {
            found.prev_iterator
        } else {
            found.iterator
        };
        match next {
            Some(next) if kept.len() <= page.limit && !found.done => {
                request = PageRequest::new(Some(SCAN_PAGE), Some(next));
            }
            _ => break,
        }
    }
    // Up to one more than asked was kept: it only tells whether more exist.
    Ok(Page::assemble(kept, page, |a| a.id.to_string()))
}

async fn by_message(
    State(state): State<AppState>,
    Path((app_id, msg_id)): Path<(AppIdOrUid, MessageIdOrEventId)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<MessageAttemptOut>>> {
    let query = Query::of(&uri);
    let (page, filter) = (query.page()?, filter(&query)?);
    let message = message(&state, &app_id, &msg_id).await?;
    let found = match query.get(&["endpoint_id", "endpointId"]) {
        None => state
            .store
            .list_attempts_by_message(&message.app_id, &message.id, &filter, &page)
            .await
            .map_err(|e| ApiError::from_store(e, "attempt"))?,
        Some(endpoint) => {
            // An endpoint's uid names it as well as its id.
            let endpoint = lookup::endpoint(&state, &message.app_id, &EndpointIdOrUid::new(endpoint)).await?;
            scan_message(&state, &message, &filter, &page, |a| a.endpoint_id == endpoint.id).await?
        }
    };
    Ok(Json(convert::list(found, convert::attempt)))
}

/// `GET /app/{app_id}/msg/{msg_id}/attempt/{attempt_id}`: one attempt of the message.
async fn one(
    State(state): State<AppState>,
    Path((app_id, msg_id, attempt_id)): Path<(AppIdOrUid, MessageIdOrEventId, String)>,
) -> ApiResult<Json<MessageAttemptOut>> {
    let message = message(&state, &app_id, &msg_id).await?;
    let found = scan_message(
        &state,
        &message,
        &AttemptFilter::default(),
        &PageRequest::first(1),
        |a| a.id == attempt_id.as_str(),
    )
    .await?;
    let attempt = found
        .items
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::not_found("attempt"))?;
    Ok(Json(convert::attempt(attempt)))
}

async fn by_endpoint(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<MessageAttemptOut>>> {
    let query = Query::of(&uri);
    let (page, filter) = (query.page()?, filter(&query)?);
    let app = lookup::app(&state, &app_id).await?;
    let endpoint = lookup::endpoint(&state, &app.id, &endpoint_id).await?;
    let found = state
        .store
        .list_attempts_by_endpoint(&app.id, &endpoint.id, &filter, &page)
        .await
        .map_err(|e| ApiError::from_store(e, "attempt"))?;
    if !query.flag("with_msg", false)? {
        return Ok(Json(convert::list(found, convert::attempt)));
    }
    // `with_msg=true`: each attempt carries its message (with its payload, as Svix's expansion does).
    let with_content = query.flag("with_content", true)?;
    let mut messages: HashMap<MessageId, Message> = HashMap::new();
    for attempt in &found.items {
        if !messages.contains_key(&attempt.message_id) {
            let message = state
                .store
                .get_message(&app.id, &(&attempt.message_id).into())
                .await
                .map_err(|e| ApiError::from_store(e, "message"))?;
            messages.insert(attempt.message_id.clone(), message);
        }
    }
    Ok(Json(convert::list(found, |attempt| {
        let msg = messages
            .get(&attempt.message_id)
            .map(|m| convert::message(m, with_content));
        MessageAttemptOut {
            msg,
            ..convert::attempt(attempt)
        }
    })))
}
