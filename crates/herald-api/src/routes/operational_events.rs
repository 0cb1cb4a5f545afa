//! `GET /operational-event`: what Herald did on its own that operators must know about (e.g. an endpoint
//! disabled because it answered 410 Gone), oldest first. A Herald extension; the operational webhook that
//! pushes these events comes with the operations issue, and reads this same record.

use axum::extract::{OriginalUri, State};
use axum::routing::get;
use axum::{Json, Router};

use crate::convert;
use crate::error::{ApiError, ApiResult};
use crate::model::{ListResponse, OperationalEventOut};
use crate::query::Query;
use crate::state::AppState;

pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/operational-event", get(list))
}

async fn list(
    State(state): State<AppState>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Json<ListResponse<OperationalEventOut>>> {
    let page = Query::of(&uri).page()?;
    if page.reverse {
        return Err(ApiError::validation("iterator: this listing only pages forward"));
    }
    let after = match &page.after {
        Some(text) => text
            .parse::<i64>()
            .map_err(|_| ApiError::validation("iterator: not an iterator of this listing"))?,
        None => 0,
    };
    let mut found = state
        .store
        .list_operational_events(after, page.limit + 1)
        .await
        .map_err(|e| ApiError::from_store(e, "operational event"))?;
    let done = found.len() <= page.limit;
    found.truncate(page.limit);
    let iterator = found.last().map(|e| e.seq.to_string()).or(page.after.clone());
    Ok(Json(ListResponse {
        data: found.into_iter().map(convert::operational_event).collect(),
        iterator,
        prev_iterator: None,
        done,
    }))
}
