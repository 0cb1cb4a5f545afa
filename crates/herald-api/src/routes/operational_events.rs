//! `GET /operational-event`: what Herald did on its own that operators must know about (e.g. an endpoint
//! disabled because it answered 410 Gone), oldest first, or newest first with `order=descending` (the
//! dashboard's view). A Herald extension; the operational webhook pushes these same events.

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
    let query = Query::of(&uri);
    let page = query.page()?;
    if page.reverse {
        return Err(ApiError::query("iterator", "this listing only pages in its own order"));
    }
    let newest_first = match query.get(&["order"]) {
        None | Some("ascending") => false,
        Some("descending") => true,
        Some(other) => {
            return Err(ApiError::query(
                "order",
                format!("expected ascending or descending, got {other:?}"),
            ));
        }
    };
    let anchor = match &page.after {
        Some(text) => Some(
            text.parse::<i64>()
                .map_err(|_| ApiError::query("iterator", "not an iterator of this listing"))?,
        ),
        None => None,
    };
    let found = if newest_first {
        state.store.list_operational_events_newest(anchor, page.limit + 1).await
    } else {
        state
            .store
            .list_operational_events(anchor.unwrap_or(0), page.limit + 1)
            .await
    };
    let mut found = found.map_err(|e| ApiError::from_store(e, "operational event"))?;
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
