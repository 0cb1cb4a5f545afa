//! The REST resources, one module each, and the router that composes them.

mod apps;
mod attempt_stats;
mod attempts;
mod endpoint_secrets;
mod endpoints;
mod event_type_import;
mod event_types;
mod health;
mod messages;
mod operational_events;
mod operations;
mod poller;
mod polling_endpoints;
mod precheck;
mod send_example;
mod stats;
mod tenancy;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::error::ApiError;
use crate::state::AppState;

/// Every `/api/v1` route, and the dashboard's static pages next to them (outside `/api/v1` and without
/// authentication: they hold no data). Paths carry no trailing slash; the service wrapper in
/// [`crate::service`] trims one from requests, so both spellings work.
pub(crate) fn router(state: AppState) -> Router {
    // A document the query contract cannot read fails here, at start-up, not on a first request.
    crate::contract::load();
    let dashboard = crate::dashboard::routes(&state.portal);
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
        .merge(stats::routes())
        .merge(attempt_stats::routes())
        .merge(precheck::routes())
        .merge(send_example::routes())
        .merge(event_type_import::routes())
        .merge(polling_endpoints::routes())
        .merge(poller::routes())
        .route_layer(middleware::from_fn_with_state(state.clone(), guard));
    Router::new()
        .nest(
            "/api/v1",
            authenticated.route("/health", get(health::health)).route(
                "/openapi.json",
                get(crate::openapi::handler(state.limits.max_request_timeout_ms)),
            ),
        )
        .merge(crate::metrics::routes())
        .merge(dashboard)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(around))
        .with_state(state)
}

// Why two functions, not one layer per concern: axum wraps every route in each layer it is given, and a
// `from_fn` layer clones the whole stack beneath it for each request it passes on (every `Route` a boxed
// service, cloned deeply, the state with it) — with six layers that was a dozen allocations per request
// and a tenth of a node's CPU under ingest. So the checks run in sequence inside one layer each.

/// What every authenticated route passes, in this order: authentication (and an application token's
/// access), then idempotent replay — so only authenticated requests are remembered or replayed — then,
/// innermost, the query contract — so only an authenticated request learns which query parameters an
/// operation takes.
async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let request = match crate::auth::admit(&state, request).await {
        Ok(request) => request,
        Err(error) => return error.into_response(),
    };
    crate::idempotency::replay_or_remember(&state, request, |request| async move {
        match crate::contract::refusal(&request) {
            Some(refusal) => refusal,
            None => next.run(request).await,
        }
    })
    .await
}

/// What every request passes, routed or not: counted and timed by its route (see
/// [`crate::metrics::track`]), its error answered as JSON if it was not already (see
/// [`crate::json_errors`]), and named `Server: Herald/…` unless it names a server itself.
async fn around(request: Request, next: Next) -> Response {
    let mut response = crate::metrics::track(request, |request| async move {
        crate::json_errors::as_json(next.run(request).await).await
    })
    .await;
    response.headers_mut().entry(header::SERVER).or_insert(SERVER.clone());
    response
}

/// This server's `Server` header.
static SERVER: HeaderValue = HeaderValue::from_static(concat!("Herald/", env!("CARGO_PKG_VERSION")));

/// `501 not_implemented` naming the product, when the path belongs to one Herald does not offer (an SDK
/// user must not mistake it for a wrong base URL or a wrong method).
fn not_offered(uri: &Uri) -> Option<ApiError> {
    crate::not_offered::feature(uri.path()).map(|product| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_implemented",
            format!("{product}: not offered by this server"),
        )
    })
}

/// No route matched: 501 for a product Herald does not offer, else 404.
///
/// The body is read (and dropped) first: a response sent while the request body is still unread makes
/// the connection close after it without a `connection: close`, and a client reusing it (the SDKs do)
/// sees its next request fail.
async fn not_found(uri: Uri, _body: Bytes) -> ApiError {
    if let Some(error) = not_offered(&uri) {
        return error;
    }
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route for {}", uri.path()),
    )
}

/// The path is routed, not for this method: 501 when the path names a product Herald does not offer
/// (`POST …/msg/bulk-expunge` looks like a message's path), else 405.
/// The body is read first, as in [`not_found`].
async fn method_not_allowed(uri: Uri, _body: Bytes) -> ApiError {
    if let Some(error) = not_offered(&uri) {
        return error;
    }
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this method is not allowed on this path",
    )
}
