//! API errors: every failure is a JSON body with a stable `code` and the matching status, in the two
//! shapes of [`herald_edge::problem`] (the inbox's errors are the same): a sentence, or for 422 the list
//! of invalid values as Svix's `HTTPValidationError`. The SDKs raise their own validation exception from
//! a 422; `code` beside it is kept because both SDK generations ignore keys they do not know.
//!
//! Validation errors are built with [`ApiError::invalid`] (or its shorthands [`ApiError::body`],
//! [`ApiError::query`], [`ApiError::header`]), never from free text, so every 422 names its field.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use herald_store::StoreError;
use herald_store::custody::Fault;
use serde::Serialize;

pub use herald_edge::problem::{Detail, FieldError, Problem, Source};

/// An error answered to an API client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable machine-readable code.
    pub code: &'static str,
    /// A human explanation, or the invalid values of a 422.
    pub detail: Detail,
}

/// An error's body as a value, for an answer that carries errors inside it (a batch's per-message
/// results).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorOut {
    /// The error's `code`.
    pub code: &'static str,
    /// Its `detail`.
    pub detail: Detail,
}

impl ApiError {
    /// Build an error whose detail is a sentence (any status but 422: see [`ApiError::invalid`]).
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            code,
            detail: Detail::Text(detail.into()),
        }
    }

    /// 422: the value at `field` (a name, or a dotted path such as `headers.X-Foo` or `channels.0`) of
    /// `source` is invalid, because of `msg`.
    pub fn invalid(source: Source, field: &str, problem: Problem, msg: impl Into<String>) -> Self {
        Self::fields(vec![FieldError::new(source, field, problem, msg)])
    }

    /// 422: the value at `loc` (the source's name, then the path of keys and list indices) is invalid.
    pub fn located(loc: Vec<String>, problem: Problem, msg: impl Into<String>) -> Self {
        Self::fields(vec![FieldError::located(loc, problem, msg)])
    }

    /// 422 listing several invalid values at once (at least one).
    pub fn fields(errors: Vec<FieldError>) -> Self {
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: herald_edge::problem::VALIDATION,
            detail: Detail::Fields(errors),
        }
    }

    /// 422: the body field `field` has an unacceptable value.
    pub fn body(field: &str, msg: impl Into<String>) -> Self {
        Self::invalid(Source::Body, field, Problem::Value, msg)
    }

    /// 422: the query parameter `name` has an unacceptable value.
    pub fn query(name: &str, msg: impl Into<String>) -> Self {
        Self::invalid(Source::Query, name, Problem::Value, msg)
    }

    /// 422: the request header `name` has an unacceptable value.
    pub fn header(name: &str, msg: impl Into<String>) -> Self {
        Self::invalid(Source::Header, name, Problem::Value, msg)
    }

    /// The same error for a value nested at `path` (keys and list indices) inside the body: each invalid
    /// body value's `loc` gets `path` after its source, so `["body", "eventType"]` of one message of a
    /// batch becomes `["body", "messages", "3", "eventType"]` (a value found elsewhere keeps its `loc`).
    pub fn nested(mut self, path: &[String]) -> Self {
        if let Detail::Fields(errors) = &mut self.detail {
            for error in errors
                .iter_mut()
                .filter(|e| e.loc.first().map(String::as_str) == Some("body"))
            {
                let rest = error.loc.split_off(1);
                error.loc.extend(path.iter().cloned());
                error.loc.extend(rest);
            }
        }
        self
    }

    /// The same error for a value checked by a rule written for another place: each invalid value's `loc`
    /// becomes `field` of `source` (a path segment checked as a body's uid is named by its parameter).
    pub fn relocated(mut self, source: Source, field: &str) -> Self {
        if let Detail::Fields(errors) = &mut self.detail {
            for error in errors {
                error.loc = vec![source.as_str().to_owned(), field.to_owned()];
            }
        }
        self
    }

    /// The error as a value (see [`ErrorOut`]).
    pub fn to_out(&self) -> ErrorOut {
        ErrorOut {
            code: self.code,
            detail: self.detail.clone(),
        }
    }

    /// The invalid values of a 422 (empty for other errors).
    pub fn field_errors(&self) -> &[FieldError] {
        match &self.detail {
            Detail::Fields(errors) => errors,
            Detail::Text(_) => &[],
        }
    }

    /// The detail as one line of text (a 422's fields as `field: msg`, joined by `; `).
    pub fn detail_text(&self) -> String {
        self.detail.text()
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

    /// 503: nothing was stored because the storage failed (`storage_full` when it is full,
    /// `store_corrupt` when its file is damaged, `store_unavailable` otherwise); the client should retry
    /// later.
    pub fn store_fault(fault: Fault) -> Self {
        let detail = match fault {
            Fault::Full => "the store's disk is full; nothing was stored, retry later",
            Fault::Unavailable => "the store is unavailable; retry later",
            Fault::Corrupt => {
                "the store's database file is damaged; nothing was stored, retry once an operator restored it"
            }
        };
        Self::new(StatusCode::SERVICE_UNAVAILABLE, fault.code(), detail)
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
            StoreError::BadIterator => Self::query("iterator", "not an iterator this server issued"),
            other => {
                tracing::error!(error = %other, "store failure");
                Self::store_fault(other.fault().unwrap_or(Fault::Unavailable))
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        herald_edge::problem::response(self.status, self.code, &self.detail)
    }
}

/// Shorthand for handler results.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_422_is_answered_in_the_validation_shape() {
        let error = ApiError::invalid(Source::Body, "headers.X-Foo", Problem::Value, "too long");
        let body = serde_json::to_value(error.to_out()).expect("serialise");
        assert_eq!(
            body,
            json!({"code": "validation", "detail": [{"loc": ["body", "headers", "X-Foo"], "msg": "too long", "type": "value_error"}]})
        );
        assert_eq!(error.detail_text(), "headers.X-Foo: too long");
    }

    #[test]
    fn a_nested_error_names_its_whole_path() {
        let error = ApiError::body("eventType", "bad").nested(&["messages".to_owned(), "3".to_owned()]);
        assert_eq!(error.field_errors()[0].loc, ["body", "messages", "3", "eventType"]);
        let text = ApiError::not_found("application").nested(&["messages".to_owned()]);
        assert_eq!(text.detail, Detail::Text("application not found".into()));
    }

    #[test]
    fn a_relocated_error_names_its_new_place_and_a_nested_one_only_body_values() {
        let error = ApiError::body("uid", "bad").relocated(Source::Path, "app_id");
        assert_eq!(error.field_errors()[0].loc, ["path", "app_id"]);
        let kept = error.nested(&["application".to_owned()]);
        assert_eq!(kept.field_errors()[0].loc, ["path", "app_id"]);
        let text = ApiError::not_found("application").relocated(Source::Path, "app_id");
        assert_eq!(text.detail, Detail::Text("application not found".into()));
    }

    #[test]
    fn other_errors_keep_a_string_detail() {
        let error = ApiError::not_found("application");
        assert_eq!(error.detail, Detail::Text("application not found".into()));
        assert!(error.field_errors().is_empty());
    }
}
