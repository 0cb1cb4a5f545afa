//! Field validation shared by the resources. Every error names its field.

use crate::error::ApiError;

/// The longest uid, name or channel accepted.
const MAX_NAME_LEN: usize = 256;

/// A `uid`, event-type name or channel: 1–256 of `[A-Za-z0-9_.-]` (channels also allow `:`).
pub fn name(field: &str, value: &str, allow_colon: bool) -> Result<(), ApiError> {
    let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') || (allow_colon && c == ':');
    if value.is_empty() || value.len() > MAX_NAME_LEN || !value.chars().all(valid_char) {
        let extra = if allow_colon { ", ':'" } else { "" };
        return Err(ApiError::validation(format!(
            "{field}: must be 1 to {MAX_NAME_LEN} characters of letters, digits, '-', '_', '.'{extra}"
        )));
    }
    Ok(())
}

/// A uid must also not look like an id of the same kind, or lookups by "id or uid" would be ambiguous.
pub fn uid(value: &str, kind: herald_core::id::IdKind) -> Result<(), ApiError> {
    name("uid", value, false)?;
    if value.starts_with(kind.prefix()) {
        return Err(ApiError::validation(format!(
            "uid: must not start with {:?}, the prefix of ids",
            kind.prefix()
        )));
    }
    Ok(())
}

/// Each item of a list field, and its length.
pub fn names<'a>(
    field: &str,
    values: impl IntoIterator<Item = &'a String>,
    max: usize,
    allow_colon: bool,
) -> Result<(), ApiError> {
    let mut count = 0;
    for value in values {
        count += 1;
        name(field, value, allow_colon)?;
    }
    if count > max {
        return Err(ApiError::validation(format!("{field}: at most {max} items")));
    }
    Ok(())
}

/// A non-empty human field of bounded length.
pub fn text(field: &str, value: &str, required: bool, max: usize) -> Result<(), ApiError> {
    if required && value.trim().is_empty() {
        return Err(ApiError::validation(format!("{field}: must not be empty")));
    }
    if value.len() > max {
        return Err(ApiError::validation(format!("{field}: at most {max} bytes")));
    }
    Ok(())
}

/// The longest payload retention accepted (ten years), in days.
pub const MAX_RETENTION_DAYS: i64 = 3_650;

/// A payload retention period in days (`payloadRetentionPeriod` of a message or an application): 1 to
/// [`MAX_RETENTION_DAYS`].
pub fn retention_days(field: &str, days: i64) -> Result<u32, ApiError> {
    match u32::try_from(days) {
        Ok(valid) if (1..=MAX_RETENTION_DAYS).contains(&days) => Ok(valid),
        _ => Err(ApiError::validation(format!(
            "{field}: must be between 1 and {MAX_RETENTION_DAYS} days, got {days}"
        ))),
    }
}

/// The uid of an object that a PUT creates because `path_segment` named nothing.
///
/// An id cannot be chosen by a client, so a segment shaped like an id of `kind` is simply not found;
/// otherwise the segment becomes the uid, and a body that names a different uid is refused.
pub fn uid_for_put(
    path_segment: &str,
    body_uid: Option<&str>,
    kind: herald_core::id::IdKind,
    what: &str,
) -> Result<String, ApiError> {
    if kind.matches(path_segment) {
        return Err(ApiError::not_found(what));
    }
    uid(path_segment, kind)?;
    match body_uid {
        Some(given) if given != path_segment => Err(ApiError::validation(
            "uid: must equal the path segment when PUT creates the object",
        )),
        _ => Ok(path_segment.to_owned()),
    }
}
