//! HTTP errors: every failure is answered as JSON `{"code": …, "detail": …}` with the matching status,
//! in the sender's two shapes ([`herald_edge::problem`]): a sentence, or for 422 the list of invalid
//! values, each with its `loc`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use herald_edge::problem::{Detail, FieldError, Problem, Source};

use crate::store::StoreError;

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    /// The status.
    pub status: StatusCode,
    /// A stable machine-readable code.
    pub code: &'static str,
    /// A human explanation, or the invalid values of a 422.
    pub detail: Detail,
}

impl HttpError {
    /// Build an error whose detail is a sentence (any status but 422: see [`HttpError::invalid`]).
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            code,
            detail: Detail::Text(detail.into()),
        }
    }

    /// 422: the value at `field` of `source` is invalid, because of `msg`.
    pub fn invalid(source: Source, field: &str, problem: Problem, msg: impl Into<String>) -> Self {
        Self::field(FieldError::new(source, field, problem, msg))
    }

    /// 422 for one invalid value.
    pub fn field(error: FieldError) -> Self {
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: herald_edge::problem::VALIDATION,
            detail: Detail::Fields(vec![error]),
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
        herald_edge::problem::response(self.status, self.code, &self.detail)
    }
}

/// Shorthand for handler results.
pub(crate) type HttpResult<T> = Result<T, HttpError>;
