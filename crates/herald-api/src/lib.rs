//! Herald's HTTP API: the Svix-compatible REST resources under `/api/v1`, bearer authentication and
//! JSON error mapping.
//!
//! [`service`] builds the whole HTTP service from an [`AppState`] — the API and the operators' dashboard
//! (`/dashboard/`); the `herald` binary serves it.

pub mod auth;
pub mod body;
mod contract;
mod convert;
mod credentials;
mod custom_headers;
mod dashboard;
pub mod error;
mod idempotency;
mod json_errors;
mod keys;
mod lookup;
pub mod metrics;
pub mod model;
mod not_offered;
mod openapi;
mod openapi_import;
mod query;
mod routes;
mod sets;
pub mod state;
mod tasks;
mod validate;
mod whole;

use axum::extract::Request;
use tower::Layer;
use tower::util::{MapRequest, MapRequestLayer};
use tower_http::normalize_path::{NormalizePath, NormalizePathLayer};

pub use error::{ApiError, ApiResult};
pub use state::{AppState, Limits, Portal, Shared};
pub use tasks::resume_interrupted;

/// The HTTP service [`service`] builds: a router behind Herald's path normalisation (see [`normalize`]).
pub type Service = MapRequest<NormalizePath<axum::Router>, fn(Request) -> Request>;

/// The complete API service: the routes, with a trailing slash trimmed from every request path first
/// (Svix clients use both spellings) and `Server: Herald` on every response.
pub fn service(state: AppState) -> Service {
    normalize(routes::router(state))
}

/// Wrap a router so that it accepts every path with or without a trailing slash — except the dashboard's
/// root, `/dashboard/`, which must stay apart from `/dashboard` (a redirect to it). Use it for any router
/// that serves [`service`] as a fallback, so that both see paths the same way.
pub fn normalize(router: axum::Router) -> Service {
    let keep_root: fn(Request) -> Request = dashboard::keep_root;
    MapRequestLayer::new(keep_root).layer(NormalizePathLayer::trim_trailing_slash().layer(router))
}
