//! HTTP errors: every failure is answered as JSON `{"code": …, "detail": …}` with the matching status.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::store::StoreError;

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    /// The status.
    pub status: StatusCode,
    /// A stable machine-readable code.
    pub code: &'static str,
    /// A human explanation.
    pub detail: String,
}

#[derive(Serialize)]
struct Body<'a> {
    code: &'a str,
    detail: &'a str,
}

impl HttpError {
    /// Build an error.
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            code,
            detail: detail.into(),
        }
    }

    /// 401 for a request whose signature did not verify. Deliberately the same for every reason (missing
    /// header, wrong secret, old timestamp…): the reason is logged and counted, never told to the caller.
    pub fn unverified() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "signature verification failed",
        )
    }

    /// 401 for the admin API.
    pub fn unauthenticated(detail: &str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "authentication_failed", detail)
    }

    /// 404.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", detail)
    }

    /// 422: a field is invalid; `detail` names it.
    pub fn validation(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "validation", detail)
    }

    /// 400: the request could not be read.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", detail)
    }

    /// 413.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body exceeds {limit} bytes"),
        )
    }

    /// 503: the store failed (`storage_full` when it is full, `store_corrupt` when its file is damaged,
    /// `store_unavailable` otherwise). The error is logged, not shown.
    pub fn store(error: &StoreError) -> Self {
        use herald_sql::custody::Fault;
        tracing::error!(%error, "inbox store failure");
        let fault = error.fault().unwrap_or(Fault::Unavailable);
        let detail = match fault {
            Fault::Full => "the inbox's disk is full; nothing was stored, retry later",
            Fault::Corrupt => "the inbox's database file is damaged; nothing was stored, retry later",
            Fault::Unavailable => "the store is unavailable; retry later",
        };
        Self::new(StatusCode::SERVICE_UNAVAILABLE, fault.code(), detail)
    }
}

impl From<StoreError> for HttpError {
    fn from(error: StoreError) -> Self {
        Self::store(&error)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = Body {
            code: self.code,
            detail: &self.detail,
        };
        (self.status, Json(body)).into_response()
    }
}

/// Shorthand for handler results.
pub(crate) type HttpResult<T> = Result<T, HttpError>;
