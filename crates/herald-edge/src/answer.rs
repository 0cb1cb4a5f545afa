//! The answers the edge gives by itself — to a malformed or slow request, under overload, after a
//! panic — always JSON `{code, detail}`, like every error of Herald's applications.

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::head::Refusal;
use crate::problem::Detail;

/// The JSON body of an error (see [`crate::problem`]).
pub(crate) fn json_body(code: &str, detail: &str) -> Bytes {
    Bytes::from(crate::problem::body(code, &Detail::Text(detail.to_owned())))
}

/// The whole response to a refused request, as bytes on the wire (the front writes it itself, with
/// hyper out of the way). It always closes the connection.
pub(crate) fn wire(refusal: &Refusal) -> Vec<u8> {
    let body = json_body(refusal.code, &refusal.detail);
    let retry = if refusal.status == StatusCode::SERVICE_UNAVAILABLE {
        "retry-after: 1\r\n"
    } else {
        ""
    };
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{retry}date: {}\r\n\r\n",
        refusal.status.as_str(),
        refusal.status.canonical_reason().unwrap_or(""),
        body.len(),
        httpdate::fmt_http_date(herald_core::clock::now().to_system_time()),
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// The same answer as an `http` response, for the service wrapper (it closes the connection too).
pub(crate) fn response(refusal: &Refusal) -> Response<Bytes> {
    let mut response = Response::new(json_body(refusal.code, &refusal.detail));
    *response.status_mut() = refusal.status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
    if refusal.status == StatusCode::SERVICE_UNAVAILABLE {
        headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// 503 for a connection or a request body over its cap.
pub(crate) fn busy(detail: &str) -> Refusal {
    Refusal::new(StatusCode::SERVICE_UNAVAILABLE, "server_busy", detail)
}

/// 408 for a request that arrived too slowly.
pub(crate) fn too_slow(detail: &str) -> Refusal {
    Refusal::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_answer_is_a_complete_json_response() {
        let bytes = wire(&busy("too many open connections"));
        let text = String::from_utf8(bytes).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{head}");
        assert!(head.contains("content-type: application/json"));
        assert!(head.contains("connection: close"));
        assert!(head.contains("retry-after: 1"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["code"], "server_busy");
        assert_eq!(json["detail"], "too many open connections");
    }
}
