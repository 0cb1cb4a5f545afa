//! The body of every error Herald answers over HTTP — the sender's API, the inbox and this edge alike:
//! JSON `{"code": …, "detail": …}`, with a stable `code` and the matching status.
//!
//! Two shapes, as Svix answers them and as its SDKs parse them:
//! - every status but 422: `detail` is a sentence, `{"code": "not_found", "detail": "application not found"}`;
//! - 422: `{"code": "validation", "detail": [{"loc": ["body", "name"], "msg": "…", "type": "value_error"}]}`
//!   (Svix's `HTTPValidationError`): `detail` lists each invalid value, `loc` says where it was (`body`,
//!   `query`, `header` or `path`, then the field's path).
//!
//! Both applications build their errors from these types, so a client reads the inbox's 422 exactly as
//! the sender's.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::Serialize;

/// Where an invalid value was found: the first element of a validation error's `loc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A field of the JSON request body.
    Body,
    /// A query-string parameter.
    Query,
    /// A request header.
    Header,
    /// A segment of the path.
    Path,
}

impl Source {
    /// The name used in `loc`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Source::Body => "body",
            Source::Query => "query",
            Source::Header => "header",
            Source::Path => "path",
        }
    }
}

/// What kind of invalid value: a validation error's `type` (the vocabulary Svix uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// The value has the right type but is not acceptable (too long, out of range, malformed, …).
    Value,
    /// The value has the wrong JSON type.
    Type,
    /// A required value is missing.
    Missing,
    /// A parameter or field this operation does not take.
    Extra,
}

impl Problem {
    /// The name used in `type`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Problem::Value => "value_error",
            Problem::Type => "type_error",
            Problem::Missing => "value_error.missing",
            Problem::Extra => "value_error.extra",
        }
    }
}

/// One invalid value, as Svix's `ValidationError`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// Where: the source, then the field's path (object keys, and list indices as decimal strings).
    pub loc: Vec<String>,
    /// What is wrong with it, for a human.
    pub msg: String,
    /// The kind of problem (`value_error`, `type_error`, `value_error.missing`, `value_error.extra`).
    #[serde(rename = "type")]
    pub kind: &'static str,
}

impl FieldError {
    /// The value at `field` (a name, or a dotted path such as `headers.X-Foo` or `channels.0`) of `source`
    /// is invalid, because of `msg`.
    pub fn new(source: Source, field: &str, problem: Problem, msg: impl Into<String>) -> Self {
        let mut loc = vec![source.as_str().to_owned()];
        loc.extend(field.split('.').filter(|part| !part.is_empty()).map(str::to_owned));
        // `loc` always names the value after its source (the document promises two items at least): a
        // query parameter with an empty name (`?=x`) is named by its empty name.
        if loc.len() == 1 {
            loc.push(field.to_owned());
        }
        Self::located(loc, problem, msg)
    }

    /// The value at `loc` (the source's name, then the path of keys and list indices) is invalid.
    pub fn located(loc: Vec<String>, problem: Problem, msg: impl Into<String>) -> Self {
        Self {
            loc,
            msg: msg.into(),
            kind: problem.as_str(),
        }
    }

    /// The query parameter `name` is not one the operation takes (`taken`, by name).
    pub fn unknown_query(name: &str, taken: &[&str]) -> Self {
        let msg = if taken.is_empty() {
            "unknown query parameter: this operation takes none".to_owned()
        } else {
            format!("unknown query parameter: this operation takes {}", taken.join(", "))
        };
        Self::new(Source::Query, name, Problem::Extra, msg)
    }

    /// `field: msg`, as a log line or a summary shows it.
    pub fn summary(&self) -> String {
        format!("{}: {}", self.loc[1..].join("."), self.msg)
    }
}

/// An error's `detail`: a sentence, or for 422 the list of invalid values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Detail {
    /// Every status but 422.
    Text(String),
    /// 422: each invalid value with its location.
    Fields(Vec<FieldError>),
}

impl Detail {
    /// The detail as one line of text (a 422's fields as `field: msg`, joined by `; `).
    pub fn text(&self) -> String {
        match self {
            Detail::Text(text) => text.clone(),
            Detail::Fields(errors) => errors.iter().map(FieldError::summary).collect::<Vec<_>>().join("; "),
        }
    }
}

/// The code of every 422.
pub const VALIDATION: &str = "validation";

#[derive(Serialize)]
struct Body<'a> {
    code: &'a str,
    detail: &'a Detail,
}

/// The JSON text of an error's body.
pub fn body(code: &str, detail: &Detail) -> String {
    // Serialising these types cannot fail (no maps with non-string keys, no foreign `Serialize`).
    serde_json::to_string(&Body { code, detail }).unwrap_or_default()
}

/// The whole answer: `status`, `content-type: application/json` and the body.
pub fn response(status: StatusCode, code: &str, detail: &Detail) -> Response {
    (status, axum::Json(Body { code, detail })).into_response()
}

/// A JSON `404 not_found` for a path nothing serves: the fallback of a router Herald serves.
pub async fn no_route(uri: http::Uri) -> Response {
    response(
        StatusCode::NOT_FOUND,
        "not_found",
        &Detail::Text(format!("no route for {}", uri.path())),
    )
}

/// A JSON `405 method_not_allowed` for a path served with other methods.
pub async fn wrong_method() -> Response {
    response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        &Detail::Text("this method is not allowed on this path".to_owned()),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn parsed(code: &str, detail: &Detail) -> Value {
        serde_json::from_str(&body(code, detail)).expect("JSON")
    }

    #[test]
    fn a_422_is_svix_validation_shape_with_the_code_beside() {
        let detail = Detail::Fields(vec![FieldError::new(
            Source::Body,
            "headers.X-Foo",
            Problem::Value,
            "too long",
        )]);
        assert_eq!(
            parsed(VALIDATION, &detail),
            json!({"code": "validation", "detail": [{"loc": ["body", "headers", "X-Foo"], "msg": "too long", "type": "value_error"}]})
        );
        assert_eq!(detail.text(), "headers.X-Foo: too long");
    }

    #[test]
    fn a_parameter_with_an_empty_name_is_still_named_in_loc() {
        let error = FieldError::new(Source::Query, "", Problem::Extra, "unknown");
        assert_eq!(error.loc, ["query", ""]);
    }

    #[test]
    fn other_errors_keep_a_string_detail() {
        let detail = Detail::Text("application not found".into());
        assert_eq!(
            parsed("not_found", &detail),
            json!({"code": "not_found", "detail": "application not found"})
        );
    }
}
