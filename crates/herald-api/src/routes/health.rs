//! `GET /api/v1/health`: whether this node and its store answer, and take writes.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use herald_store::custody::Fault;
use serde_json::{Value, json};

use crate::state::AppState;

/// 200 when the store answers and takes writes (after a write failed on a storage fault, the store
/// probes with a write until one commits); 503 otherwise, with `database`: `full` (writes fail for lack
/// of space) or `unreachable` (the store does not answer, or does not take writes).
pub(super) async fn health(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    match state.store.ping().await {
        Ok(()) => (StatusCode::OK, Json(json!({"status": "ok", "database": "ok"}))),
        Err(error) => {
            let database = match error.fault() {
                Some(Fault::Full) => "full",
                _ => "unreachable",
            };
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable", "database": database})),
            )
        }
    }
}
