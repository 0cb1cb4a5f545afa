//! API errors: every failure is a JSON body `{"code": …, "detail": …}` with the matching status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use herald_store::StoreError;

use crate::model::HttpError;

/// An error answered to an API client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable machine-readable code.
    pub code: &'static str,
    /// A human explanation; validation errors name the field.
    pub detail: String,
}

impl ApiError {
    /// Build an error.
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            code,
            detail: detail.into(),
        }
    }

    /// 422: a field's value is invalid. `detail` should name the field.
    pub fn validation(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "validation", detail)
    }

    /// 400: the request could not be read at all (e.g. malformed JSON).
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", detail)
    }

    /// 404 for the named kind of object.
    pub fn not_found(what: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", format!("{what} not found"))
    }

    /// 401: no or wrong credentials.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_failed",
            "missing or invalid bearer token",
        )
    }

    /// 413: the body exceeds the configured limit.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body exceeds {limit} bytes"),
        )
    }

    /// Map a store error for an object of kind `what`.
    pub fn from_store(error: StoreError, what: &str) -> Self {
        match error {
            StoreError::NotFound => Self::not_found(what),
            StoreError::Conflict(field) => Self::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("{what} with this {field} already exists"),
            ),
            StoreError::BadIterator => Self::validation("iterator: not an iterator this server issued"),
            other => {
                tracing::error!(error = %other, "store failure");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the store is unavailable; retry later",
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(HttpError::new(self.code, self.detail))).into_response()
    }
}

/// Shorthand for handler results.
pub type ApiResult<T> = Result<T, ApiError>;
