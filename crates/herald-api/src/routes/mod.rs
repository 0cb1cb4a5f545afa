//! The REST resources, one module each, and the router that composes them.

mod apps;
mod attempts;
mod endpoint_secrets;
mod endpoints;

pub(crate) use endpoint_secrets::signature_type;
mod event_types;
mod health;
mod messages;
mod operational_events;
mod operations;
mod tenancy;

pub(crate) use apps::resolve_id as resolve_app_id;

use axum::Router;
use axum::http::{StatusCode, Uri};
use axum::middleware;
use axum::routing::get;

use crate::error::ApiError;
use crate::state::AppState;

/// Every `/api/v1` route, and the dashboard's static pages next to them (outside `/api/v1` and without
/// authentication: they hold no data). Paths carry no trailing slash; the service wrapper in
/// [`crate::service`] trims one from requests, so both spellings work.
pub fn router(state: AppState) -> Router {
    let authenticated = Router::new()
        .merge(apps::routes())
        .merge(event_types::routes())
        .merge(endpoints::routes())
        .merge(endpoint_secrets::routes())
        .merge(messages::routes())
        .merge(attempts::routes())
        .merge(operational_events::routes())
        .merge(operations::routes())
        .merge(tenancy::routes())
        // Inside authentication: only authenticated requests are remembered or replayed.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::idempotency::replay_or_remember,
        ))
        .route_layer(middleware::from_fn_with_state(state.clone(), crate::auth::authenticate));
    Router::new()
        .nest(
            "/api/v1",
            authenticated
                .route("/health", get(health::health))
                .route("/openapi.json", get(crate::openapi::document)),
        )
        .merge(crate::dashboard::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(crate::json_errors::ensure_json_errors))
        .with_state(state)
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route for {}", uri.path()),
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this method is not allowed on this path",
    )
}
