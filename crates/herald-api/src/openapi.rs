//! `GET /api/v1/openapi.json`: the OpenAPI 3.1 description of this API.
//!
//! The document is the hand-written `openapi.json` at the root of this crate, compiled into the
//! binary, so the server always describes the routes it was built with. It is served without a
//! token, like `/health`, so that tools can fetch it before they hold one. `tests/openapi.rs` checks
//! that it lists exactly the routes the router serves and that every `$ref` in it resolves.

use axum::http::header;
use axum::response::IntoResponse;

/// The OpenAPI document, byte for byte as it is in the repository.
pub(crate) const DOCUMENT: &str = include_str!("../openapi.json");

/// Answer the OpenAPI document as `application/json`.
pub(crate) async fn document() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT)
}
