//! A last line of defence: any error response that is not already JSON becomes `{code, detail}`.
//!
//! Herald's own handlers always answer JSON errors, but extractors and layers from axum and tower
//! (a path segment that is not UTF-8, a malformed query string, a body limit) answer in plain text.
//! Rather than wrap every one of them, this layer rewrites such responses in one place.

use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The most of a plain-text error body kept as the detail.
const MAX_DETAIL_BYTES: usize = 1024;

/// Rewrite a non-JSON 4xx/5xx response as a JSON error.
pub(crate) async fn as_json(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let body = axum::body::to_bytes(response.into_body(), MAX_DETAIL_BYTES)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).trim().to_owned();
    let detail = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    ApiError::new(status, code_for(status), detail).into_response()
}

/// The stable code for a status that arrived without one.
fn code_for(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::UNAUTHORIZED => "authentication_failed",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UNPROCESSABLE_ENTITY => "validation",
        StatusCode::TOO_MANY_REQUESTS => "rate_limited",
        s if s.is_server_error() => "server_error",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::extract::Request;
    use axum::middleware::Next;
    use axum::routing::get;
    use tower::ServiceExt;

    use super::*;

    async fn call(router: Router, uri: &str) -> (StatusCode, serde_json::Value) {
        let response = router
            .layer(axum::middleware::from_fn(|request, next: Next| async move {
                as_json(next.run(request).await).await
            }))
            .oneshot(Request::builder().uri(uri).body(Body::empty()).expect("request"))
            .await
            .expect("response");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 4096).await.expect("body");
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        )
    }

    #[tokio::test]
    async fn plain_text_errors_become_json() {
        let router = Router::new().route("/boom", get(|| async { (StatusCode::BAD_REQUEST, "no good") }));
        let (status, body) = call(router, "/boom").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["code"], "bad_request");
        assert_eq!(body["detail"], "no good");
    }

    #[tokio::test]
    async fn successes_and_json_errors_pass_untouched() {
        let router = Router::new()
            .route("/ok", get(|| async { "fine" }))
            .route("/json", get(|| async { ApiError::body("name", "too long") }));
        assert_eq!(call(router.clone(), "/ok").await.0, StatusCode::OK);
        let (status, body) = call(router, "/json").await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(body["detail"][0]["loc"], serde_json::json!(["body", "name"]));
    }

    #[test]
    fn codes_cover_the_common_statuses() {
        assert_eq!(code_for(StatusCode::BAD_REQUEST), "bad_request");
        assert_eq!(code_for(StatusCode::BAD_GATEWAY), "server_error");
    }
}
