//! The JSON body extractor: size-capped, and every failure a JSON error with the right status.
//!
//! axum's own `Json` answers rejections in plain text; Herald's clients always get `{code, detail}`:
//! 413 over the limit, 400 for bytes that are not JSON, 422 for JSON of the wrong shape (naming the field).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

/// A JSON request body of type `T`, plus the raw bytes it came from.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.limits.max_body_bytes;
        let bytes = read_body(request, limit).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

async fn read_body(request: Request, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(request.into_body(), limit).await.map_err(|error| {
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
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        json_error(&path, &error.into_inner())
    })?;
    deserializer.end().map_err(|error| json_error("", &error))?;
    Ok(value)
}

fn json_error(path: &str, error: &serde_json::Error) -> ApiError {
    match error.classify() {
        serde_json::error::Category::Data => {
            let at = if path.is_empty() || path == "." {
                String::new()
            } else {
                format!("{path}: ")
            };
            ApiError::validation(format!("{at}{}", strip_position(&error.to_string())))
        }
        _ => ApiError::bad_request(format!("malformed JSON: {error}")),
    }
}

/// serde_json appends " at line L column C" to data errors; the field path says more.
fn strip_position(message: &str) -> &str {
    message.rfind(" at line ").map_or(message, |i| &message[..i])
}
