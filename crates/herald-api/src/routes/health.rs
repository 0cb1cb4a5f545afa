//! `GET /api/v1/health`: whether this node and its store answer, and take writes.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::state::AppState;

/// 200 when the store answers and takes writes (after a write failed on a storage fault, the store
/// probes with a write until one commits); 503 otherwise, with `database`: `full` (writes fail for lack
/// of space), `corrupt` (the database reported its file damaged: until a restart) or `unreachable` (the
/// store does not answer, or does not take writes).
pub(super) async fn health(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    match state.store.ping().await {
        Ok(()) => (StatusCode::OK, Json(json!({"status": "ok", "database": "ok"}))),
        Err(error) => {
            let database = error
                .fault()
                .map_or("unreachable", herald_store::custody::Fault::health);
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable", "database": database})),
            )
        }
    }
}
