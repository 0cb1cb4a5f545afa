//! The router: the ingress route, the admin API and the health check.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::middleware;
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::error::HttpError;
use crate::state::InboxState;
use crate::{admin, ingress};

/// `POST /in/{source}` and the admin API, without the health check or a fallback (so that it can be
/// merged into another service).
pub(crate) fn routes(state: InboxState) -> Router {
    // Every admin route checks its query string as the sender's do: the listing reads its own
    // parameters, the others take none.
    let take_no_query = Router::new()
        .route("/api/v1/inbox/event/{id}", get(admin::get))
        .route("/api/v1/inbox/event/{id}/replay", post(admin::replay_one))
        .route("/api/v1/inbox/source/{source}/replay", post(admin::replay_window))
        .route("/api/v1/inbox/stats", get(admin::stats))
        .route_layer(middleware::from_fn(admin::no_query));
    let admin = Router::new()
        .route("/api/v1/inbox/event", get(admin::list))
        .merge(take_no_query)
        .route_layer(middleware::from_fn_with_state(state.clone(), admin::require_admin));
    Router::new()
        .route("/in/{source}", post(ingress::receive))
        .merge(admin)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// Everything, standalone: [`routes`] plus `GET /api/v1/health`, `GET /metrics` (the process's
/// Prometheus series, admin token; inside `herald serve` the sender's `/metrics` shows them) and a JSON
/// 404 for other paths.
pub(crate) fn standalone(state: InboxState) -> Router {
    let scrape = Router::new()
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), admin::require_admin));
    routes(state.clone())
        .merge(
            Router::new()
                .route("/api/v1/health", get(health))
                .merge(scrape)
                .with_state(state),
        )
        .fallback(not_found)
}

async fn metrics() -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        herald_telemetry::registry::render(),
    )
}

/// `GET /api/v1/health`: whether the inbox and its store answer (same shape as `herald serve`'s).
async fn health(State(state): State<InboxState>) -> (StatusCode, axum::Json<Value>) {
    match state.store.ping().await {
        Ok(()) => (StatusCode::OK, axum::Json(json!({"status": "ok", "database": "ok"}))),
        Err(error) => {
            let database = error.fault().map_or("unreachable", herald_sql::custody::Fault::health);
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(json!({"status": "unavailable", "database": database})),
            )
        }
    }
}

async fn not_found(uri: Uri) -> HttpError {
    HttpError::not_found(format!("no route for {}", uri.path()))
}

async fn method_not_allowed() -> HttpError {
    HttpError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this method is not allowed on this path",
    )
}
