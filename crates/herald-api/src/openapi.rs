//! `GET /api/v1/openapi.json`: the OpenAPI 3.1 description of this API.
//!
//! The document is the hand-written `openapi.json` at the root of this crate, compiled into the
//! binary, so the server always describes the routes it was built with. It is served without a
//! token, like `/health`, so that tools can fetch it before they hold one. `tests/openapi.rs` checks
//! that it lists exactly the routes the router serves and that every `$ref` in it resolves.
//!
//! One bound in it is the operator's to set: the longest attempt timeout an endpoint may ask for
//! (`HERALD_MAX_REQUEST_TIMEOUT`). The repository's document states the default; the served one states
//! the bound this server was started with ([`served`]), so it says exactly what the server accepts.

use axum::body::Bytes;
use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The OpenAPI document, byte for byte as it is in the repository.
pub(crate) const DOCUMENT: &str = include_str!("../openapi.json");

/// The bound on `requestTimeoutMs` the repository's document states: `HERALD_MAX_REQUEST_TIMEOUT`'s
/// default, in milliseconds.
pub(crate) const DOCUMENTED_MAX_REQUEST_TIMEOUT_MS: u32 = 60_000;

/// The key of the endpoint schemas' attempt-timeout property, as the document spells it.
const REQUEST_TIMEOUT_PROPERTY: &str = "\"requestTimeoutMs\": {";

/// The document as this server serves it: [`DOCUMENT`] with each `requestTimeoutMs` property's
/// `maximum` set to `max_request_timeout_ms`, the bound the server enforces. Only the properties that
/// state a maximum (the request bodies) change; every other byte is the repository's.
pub(crate) fn served(max_request_timeout_ms: u32) -> String {
    let documented = format!("\"maximum\": {DOCUMENTED_MAX_REQUEST_TIMEOUT_MS}");
    let configured = format!("\"maximum\": {max_request_timeout_ms}");
    let mut out = String::with_capacity(DOCUMENT.len());
    let mut rest = DOCUMENT;
    while let Some(at) = rest.find(REQUEST_TIMEOUT_PROPERTY) {
        let (before, property) = rest.split_at(at);
        out.push_str(before);
        // The property's schema holds no nested object: it ends at the first closing brace.
        let end = property.find('}').unwrap_or(property.len());
        out.push_str(&property[..end].replacen(&documented, &configured, 1));
        rest = &property[end..];
    }
    out.push_str(rest);
    out
}

/// The handler of `GET /openapi.json`: the document [`served`] makes for `max_request_timeout_ms`, built
/// once, answered as `application/json`.
pub(crate) fn handler(
    max_request_timeout_ms: u32,
) -> impl Fn() -> std::future::Ready<Response> + Clone + Send + Sync + 'static {
    let body = Bytes::from(served(max_request_timeout_ms));
    move || std::future::ready(([(header::CONTENT_TYPE, "application/json")], body.clone()).into_response())
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// Every `requestTimeoutMs` property of the document's schemas, by schema name.
    fn bounds(document: &str) -> Vec<(String, Option<u64>)> {
        let document: Value = serde_json::from_str(document).expect("the served document is JSON");
        let schemas = document["components"]["schemas"].as_object().expect("schemas");
        schemas
            .iter()
            .filter_map(|(name, schema)| {
                let property = schema["properties"].get("requestTimeoutMs")?;
                Some((name.clone(), property.get("maximum").and_then(Value::as_u64)))
            })
            .collect()
    }

    #[test]
    fn the_served_document_states_the_configured_bound_on_every_request_body() {
        let bounded: Vec<_> = bounds(&served(90_000))
            .into_iter()
            .filter(|(_, maximum)| maximum.is_some())
            .collect();
        let names: Vec<_> = bounded.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["EndpointIn", "EndpointPatch", "EndpointUpdate"]);
        assert!(
            bounded.iter().all(|(_, maximum)| *maximum == Some(90_000)),
            "{bounded:?}"
        );
        // The answers state no maximum: an endpoint may keep a timeout set under an earlier, higher bound.
        assert!(bounds(DOCUMENT).iter().any(|(_, maximum)| maximum.is_none()));
    }

    #[test]
    fn with_the_default_bound_the_served_document_is_the_repositorys() {
        assert_eq!(served(DOCUMENTED_MAX_REQUEST_TIMEOUT_MS), DOCUMENT);
        let changed = served(1_000);
        assert_eq!(changed.len(), DOCUMENT.len() - 3, "only the three maxima change");
    }
}
