//! The attempt log: `/app/{app_id}/attempt/msg/{msg_id}` and `/app/{app_id}/attempt/endpoint/{endpoint_id}`,
//! filtered by `status` (0 success, 2 failure, as Svix's message status), `status_code_class` (0 for "no
//! response", 100 … 500), `event_types`, `before` and `after`.

use axum::extract::{OriginalUri, Path, State};
use axum::routing::get;
use axum::{Json, Router};

use super::{apps, endpoints};
use crate::convert;
use crate::error::{ApiError, ApiResult};
use crate::model::{ListResponse, MessageAttemptOut};
use crate::query::Query;
use crate::state::AppState;
use herald_store::AttemptFilter;

/// The attempt filters of a listing's query string.
fn filter(query: &Query) -> ApiResult<AttemptFilter> {
    let success = match query.get(&["status"]) {
        None => None,
        Some("0") => Some(true),
        Some("2") => Some(false),
        Some(other) => {
            return Err(ApiError::validation(format!(
                "status: expected 0 (success) or 2 (failure), got {other:?}"
            )));
        }
    };
    let status_code_class = match query.get(&["status_code_class", "statusCodeClass"]) {
        None => None,
        Some(text) => match text.parse::<u16>() {
            Ok(class @ (0 | 100 | 200 | 300 | 400 | 500)) => Some(class),
            _ => {
                return Err(ApiError::validation(format!(
                    "status_code_class: expected 0, 100, 200, 300, 400 or 500, got {text:?}"
                )));
            }
        },
    };
    Ok(AttemptFilter {
        success,
        status_code_class,
        event_types: query.list(&["event_types", "eventTypes"])?,
        before: query.time_ms(&["before"])?,
        after: query.time_ms(&["after"])?,
    })
}

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/app/{app_id}/attempt/msg/{msg_id}", get(by_message))
        .route("/app/{app_id}/attempt/endpoint/{endpoint_id}", get(by_endpoint))
}

async fn by_message(
    State(state): State<AppState>,
    Path((app_id, msg_id)): Path<(String, String)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<MessageAttemptOut>>> {
    let query = Query::of(&uri);
    let (page, filter) = (query.page()?, filter(&query)?);
    let app = apps::find(&state, &app_id).await?;
    let message = state
        .store
        .get_message(&app.id, &msg_id)
        .await
        .map_err(|e| ApiError::from_store(e, "message"))?;
    let found = state
        .store
        .list_attempts_by_message(&app.id, &message.id, &filter, &page)
        .await
        .map_err(|e| ApiError::from_store(e, "attempt"))?;
    Ok(Json(convert::list(found, convert::attempt)))
}

async fn by_endpoint(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<MessageAttemptOut>>> {
    let query = Query::of(&uri);
    let (page, filter) = (query.page()?, filter(&query)?);
    let app = apps::find(&state, &app_id).await?;
    let endpoint = endpoints::find(&state, &app.id, &endpoint_id).await?;
    let found = state
        .store
        .list_attempts_by_endpoint(&app.id, &endpoint.id, &filter, &page)
        .await
        .map_err(|e| ApiError::from_store(e, "attempt"))?;
    Ok(Json(convert::list(found, convert::attempt)))
}
