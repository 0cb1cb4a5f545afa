//! `GET /app/{app_id}/endpoint/{endpoint_id}/attempt-stats` (Svix's `v1.endpoint.get-attempt-stats`): how
//! many attempts to the endpoint succeeded and failed over a window, and how many of its deliveries were
//! canceled. The window is `[since, until)`; without `since` it starts at the beginning of the attempt log
//! (whose length the retention setting bounds), without `until` it ends now; an `until` before `since` is
//! an empty window (zero of each).

use axum::extract::{OriginalUri, Path, State};
use axum::routing::get;
use axum::{Json, Router};
use herald_core::clock::{self, Millis};
use herald_core::id::{AppIdOrUid, EndpointIdOrUid};

use crate::error::{ApiError, ApiResult};
use crate::lookup;
use crate::model::EndpointAttemptStatsOut;
use crate::query::Query;
use crate::state::AppState;

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/app/{app_id}/endpoint/{endpoint_id}/attempt-stats", get(attempt_stats))
}

async fn attempt_stats(
    State(state): State<AppState>,
    Path((app_id, endpoint_id)): Path<(AppIdOrUid, EndpointIdOrUid)>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<EndpointAttemptStatsOut>> {
    let query = Query::of(&uri);
    let since = query.time(&["since"])?.unwrap_or(Millis::EPOCH);
    // A window that ends before it starts holds nothing (the document cannot state a rule between two
    // parameters, so none is imposed): it counts zero.
    let until = query.time(&["until"])?.unwrap_or_else(clock::now).max(since);
    let app = lookup::app(&state, &app_id).await?;
    let endpoint = lookup::endpoint(&state, &app.id, &endpoint_id).await?;
    let store_error = |e| ApiError::from_store(e, "endpoint");
    // The whole window as one bucket.
    let buckets = state
        .store
        .attempt_buckets(&endpoint.id, since, until, until.ms_since(since).max(1))
        .await
        .map_err(store_error)?;
    let deliveries = state
        .store
        .endpoint_stats(&endpoint.id, since, until)
        .await
        .map_err(store_error)?;
    Ok(Json(EndpointAttemptStatsOut {
        success: buckets.iter().map(|b| b.succeeded).sum(),
        fail: buckets.iter().map(|b| b.failed).sum(),
        canceled: deliveries.cancelled,
    }))
}
