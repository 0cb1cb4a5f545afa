//! The attempt log: `/app/{app_id}/attempt/msg/{msg_id}` and `/app/{app_id}/attempt/endpoint/{endpoint_id}`.

use axum::extract::{OriginalUri, Path, State};
use axum::routing::get;
use axum::{Json, Router};

use super::{apps, endpoints};
use crate::convert;
use crate::error::{ApiError, ApiResult};
use crate::model::{ListResponse, MessageAttemptOut};
use crate::query::Query;
use crate::state::AppState;

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
    let page = Query::of(&uri).page()?;
    let app = apps::find(&state, &app_id).await?;
    let message = state
        .store
        .get_message(&app.id, &msg_id)
        .await
        .map_err(|e| ApiError::from_store(e, "message"))?;
    let found = state
        .store
        .list_attempts_by_message(&app.id, &message.id, &page)
        .await
        .map_err(|e| ApiError::from_store(e, "attempt"))?;
    Ok(Json(convert::list(found, convert::attempt)))
}

async fn by_endpoint(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<MessageAttemptOut>>> {
    let page = Query::of(&uri).page()?;
    let app = apps::find(&state, &app_id).await?;
    let endpoint = endpoints::find(&state, &app.id, &endpoint_id).await?;
    let found = state
        .store
        .list_attempts_by_endpoint(&app.id, &endpoint.id, &page)
        .await
        .map_err(|e| ApiError::from_store(e, "attempt"))?;
    Ok(Json(convert::list(found, convert::attempt)))
}
