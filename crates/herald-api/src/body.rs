//! The JSON body extractor: size-capped, and every failure a JSON error with the right status.
//!
//! axum's own `Json` answers rejections in plain text; Herald's clients always get `{code, detail}`:
//! 413 over the limit, 400 for bytes that are not JSON, 422 for JSON of the wrong shape (the field in `loc`).

use axum::body::{Bytes, HttpBody};
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use crate::error::{ApiError, Problem, Source};
use crate::state::AppState;

/// A JSON request body of type `T`, plus the raw bytes it came from.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.limits.max_body_bytes;
        let bytes = read(request.into_body(), limit).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// A whole request body, at most `limit` bytes (413 beyond, 400 if it cannot be read).
pub(crate) async fn read(body: axum::body::Body, limit: usize) -> Result<Bytes, ApiError> {
    // A body whose `Content-Length` is already over the limit is refused on its head, before a byte of
    // it is read: the client hears at once (instead of after sending it all, or never if it waits for
    // `100 Continue`), and the server does not wait for what it would refuse anyway. The edge closes
    // such a connection after the answer, since the rest of the body is still on its way.
    if body.size_hint().lower() > u64::try_from(limit).unwrap_or(u64::MAX) {
        return Err(ApiError::payload_too_large(limit));
    }
    axum::body::to_bytes(body, limit).await.map_err(|error| {
        let too_large = std::iter::successors(Some(&error as &(dyn std::error::Error + 'static)), |e| e.source())
            .any(|e| e.is::<http_body_util::LengthLimitError>());
        if too_large {
            ApiError::payload_too_large(limit)
        } else {
            ApiError::bad_request("the request body could not be read")
        }
    })
}

/// Parse JSON, telling malformed bytes (400) from a wrong shape (422).
///
/// Every request body of this API is a JSON object; an array would otherwise be read positionally
/// into the fields of the target struct, so anything but an object is refused up front.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(_) => return Err(ApiError::bad_request("the request body must be a JSON object")),
        None => {
            return Err(ApiError::bad_request(
                "the request body is empty; a JSON object is required",
            ));
        }
    }
    // Nearly every body is read once, without tracking where the parser is: the tracking allocates each
    // object key it passes. A body that fails is read again with it, to name the field that failed.
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let loc = body_location(error.path());
        json_error(loc, &error.into_inner())
    })?;
    deserializer
        .end()
        .map_err(|error| json_error(vec![Source::Body.as_str().to_owned()], &error))?;
    Ok(value)
}

/// `loc` of a body field: `body`, then each object key and list index on the way to it.
fn body_location(path: &serde_path_to_error::Path) -> Vec<String> {
    use serde_path_to_error::Segment;
    let mut loc = vec![Source::Body.as_str().to_owned()];
    loc.extend(path.iter().filter_map(|segment| match segment {
        Segment::Seq { index } => Some(index.to_string()),
        Segment::Map { key } => Some(key.clone()),
        Segment::Enum { variant } => Some(variant.clone()),
        Segment::Unknown => None,
    }));
    loc
}

/// A body that is JSON but of the wrong shape is a 422 at `loc`; anything else is unreadable (400).
fn json_error(mut loc: Vec<String>, error: &serde_json::Error) -> ApiError {
    if error.classify() != serde_json::error::Category::Data {
        return ApiError::bad_request(format!("malformed JSON: {error}"));
    }
    let message = strip_position(&error.to_string()).to_owned();
    // serde reports a missing field at its parent; Svix (and the SDKs' users) expect it named in `loc`.
    if let Some(field) = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        loc.push(field.to_owned());
        return ApiError::located(loc, Problem::Missing, "field required");
    }
    // Sending a field and its alias (`throttleRate` and `rateLimit`) is reported as a duplicate of the
    // field: it is named in `loc` like any other invalid field.
    if let Some(field) = message
        .strip_prefix("duplicate field `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        loc.push(field.to_owned());
        return ApiError::located(loc, Problem::Value, message);
    }
    let problem = if message.starts_with("invalid type:") {
        Problem::Type
    } else {
        Problem::Value
    };
    ApiError::located(loc, problem, message)
}

/// serde_json appends " at line L column C" to data errors; the field path says more.
fn strip_position(message: &str) -> &str {
    message.rfind(" at line ").map_or(message, |i| &message[..i])
}
