//! Herald's HTTP API: the Svix-compatible REST resources under `/api/v1`, bearer authentication and
//! JSON error mapping.
//!
//! [`service`] builds the whole HTTP service from an [`AppState`]; the `herald` binary serves it.

pub mod auth;
pub mod body;
mod convert;
mod custom_headers;
pub mod error;
mod idempotency;
mod json_errors;
pub mod model;
mod openapi;
mod query;
mod routes;
pub mod state;
mod tasks;
mod validate;

use axum::extract::Request;
use axum::http::{HeaderValue, header};
use tower::Layer;
use tower_http::normalize_path::{NormalizePath, NormalizePathLayer};
use tower_http::set_header::SetResponseHeaderLayer;

pub use error::{ApiError, ApiResult};
pub use state::{AppState, Limits};

/// The complete API service: the routes, with a trailing slash trimmed from every request path first
/// (Svix clients use both spellings) and `Server: Herald` on every response.
pub fn service(state: AppState) -> NormalizePath<axum::Router> {
    let server = HeaderValue::from_static(concat!("Herald/", env!("CARGO_PKG_VERSION")));
    let router = routes::router(state).layer(SetResponseHeaderLayer::if_not_present(header::SERVER, server));
    NormalizePathLayer::trim_trailing_slash().layer(router)
}

/// Convert the service for `axum::serve`.
pub fn make_service(
    state: AppState,
) -> axum::extract::connect_info::IntoMakeServiceWithConnectInfo<NormalizePath<axum::Router>, std::net::SocketAddr> {
    axum::ServiceExt::<Request>::into_make_service_with_connect_info::<std::net::SocketAddr>(service(state))
}
