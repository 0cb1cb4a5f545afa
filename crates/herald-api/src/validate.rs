//! Field validation shared by the resources. Every error names its field.
//!
//! The caps are documented in the OpenAPI document (`maxLength`, `maxProperties`, …) and in the README;
//! a value over one is a 422, never truncated, so what is stored is what was sent.

use herald_core::clock::Millis;
use std::time::Duration;

use crate::error::{ApiError, Source};
use crate::model::Metadata;

/// The longest uid, name (of an application or event type) or channel accepted, in characters.
pub(crate) const MAX_NAME_LEN: usize = 256;
/// The longest description (endpoints, event types), in characters.
pub(crate) const MAX_DESCRIPTION_LEN: usize = 4096;
/// The longest endpoint URL, in bytes.
pub(crate) const MAX_URL_LEN: usize = 4096;
/// The most metadata entries an application or endpoint may carry.
pub(crate) const MAX_METADATA_ENTRIES: usize = 64;
/// The longest metadata key, in characters.
pub(crate) const MAX_METADATA_KEY_LEN: usize = 256;
/// The longest metadata value, in characters.
pub(crate) const MAX_METADATA_VALUE_LEN: usize = 4096;

/// A `uid`, event-type name or channel: 1–256 of `[A-Za-z0-9_.-]` (channels also allow `:`).
pub(crate) fn name(field: &str, value: &str, allow_colon: bool) -> Result<(), ApiError> {
    let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') || (allow_colon && c == ':');
    if value.is_empty() || value.len() > MAX_NAME_LEN || !value.chars().all(valid_char) {
        let extra = if allow_colon { ", ':'" } else { "" };
        return Err(ApiError::body(
            field,
            format!("must be 1 to {MAX_NAME_LEN} characters of letters, digits, '-', '_', '.'{extra}"),
        ));
    }
    Ok(())
}

/// How far ahead a message's `deliverAt` may be: 24 hours, Svix's limit. A later time is a 422; an
/// earlier one (the past included) is accepted, and a past one means at once.
pub(crate) const MAX_SCHEDULE_AHEAD: Duration = Duration::from_secs(24 * 3600);

/// A message's `deliverAt`, checked against the horizon at `now`.
pub(crate) fn deliver_at(at: time::OffsetDateTime, now: Millis) -> Result<Millis, ApiError> {
    let at = Millis::from_datetime(at);
    if at > now + MAX_SCHEDULE_AHEAD {
        return Err(ApiError::body(
            "deliverAt",
            "must be at most 24 hours ahead (a time already past delivers at once)",
        ));
    }
    Ok(at)
}

/// The most tags a message may carry (Svix's `maxItems`).
pub(crate) const MAX_TAGS: usize = 5;
/// The longest message tag, in characters (Svix's `maxLength`).
pub(crate) const MAX_TAG_LEN: usize = 128;

/// Whether `value` is a message tag as Svix defines one: 1 to [`MAX_TAG_LEN`] of letters, digits and
/// `-`, `_`, `.`, `/`, `\`, `#` (the pattern `^[a-zA-Z0-9\-_./\\#]+$`).
fn is_tag(value: &str) -> bool {
    let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | '\\' | '#');
    !value.is_empty() && value.len() <= MAX_TAG_LEN && value.chars().all(valid_char)
}

/// A message's `tags` (their count is capped as sent, see [`crate::sets`]), or the one tag a body filters
/// on, under `field`. The `tag` filter of the listings is checked against the same pattern by the query
/// contract ([`crate::contract`]).
pub(crate) fn tags<'a>(field: &str, values: impl IntoIterator<Item = &'a String>) -> Result<(), ApiError> {
    match values.into_iter().find(|tag| !is_tag(tag)) {
        Some(_) => Err(ApiError::body(
            field,
            format!("each must be 1 to {MAX_TAG_LEN} characters of letters, digits, '-', '_', '.', '/', '\\', '#'"),
        )),
        None => Ok(()),
    }
}

/// A uid must also not look like an id of the same kind, or lookups by "id or uid" would be ambiguous.
pub(crate) fn uid(value: &str, kind: herald_core::id::IdKind) -> Result<(), ApiError> {
    name("uid", value, false)?;
    if value.starts_with(kind.prefix()) {
        return Err(ApiError::body(
            "uid",
            format!("must not start with {:?}, the prefix of ids", kind.prefix()),
        ));
    }
    Ok(())
}

/// Each item of a list field, and its length.
pub(crate) fn names<'a>(
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
        return Err(ApiError::body(field, format!("at most {max} items")));
    }
    Ok(())
}

/// A human field of bounded length (non-empty when `required`), without control characters other than
/// tab and line breaks: a NUL in particular would be cut or refused by some receivers and databases.
pub(crate) fn text(field: &str, value: &str, required: bool, max: usize) -> Result<(), ApiError> {
    if required && value.trim().is_empty() {
        return Err(ApiError::body(field, "must not be empty"));
    }
    // Characters, as JSON Schema's `maxLength` counts them (the document states these bounds so).
    let length = value.chars().count();
    if length > max {
        return Err(ApiError::body(field, format!("at most {max} characters, got {length}")));
    }
    if let Some(c) = value
        .chars()
        .find(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
    {
        return Err(ApiError::body(
            field,
            format!("must not contain control characters (found U+{:04X})", u32::from(c)),
        ));
    }
    Ok(())
}

/// An endpoint URL's length, before it is parsed.
pub(crate) fn url_length(field: &str, value: &str) -> Result<(), ApiError> {
    if value.len() > MAX_URL_LEN {
        return Err(ApiError::body(
            field,
            format!("at most {MAX_URL_LEN} bytes, got {}", value.len()),
        ));
    }
    Ok(())
}

/// Metadata: at most [`MAX_METADATA_ENTRIES`] entries, keys of 1 to [`MAX_METADATA_KEY_LEN`] bytes and
/// values of at most [`MAX_METADATA_VALUE_LEN`], neither with control characters.
pub(crate) fn metadata(metadata: &Metadata) -> Result<(), ApiError> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(ApiError::body(
            "metadata",
            format!("at most {MAX_METADATA_ENTRIES} entries, got {}", metadata.len()),
        ));
    }
    for (key, value) in metadata {
        if key.is_empty() || key.chars().count() > MAX_METADATA_KEY_LEN || key.chars().any(char::is_control) {
            return Err(ApiError::body(
                "metadata",
                format!("keys must be 1 to {MAX_METADATA_KEY_LEN} characters without control characters"),
            ));
        }
        // The key is in `loc`; Svix's loc is a path of keys, and metadata keys are the client's own.
        if let Err(error) = text("metadata", value, false, MAX_METADATA_VALUE_LEN) {
            let msg = error.field_errors().first().map(|e| e.msg.clone()).unwrap_or_default();
            let loc = vec!["body".to_owned(), "metadata".to_owned(), key.clone()];
            return Err(ApiError::located(loc, crate::error::Problem::Value, msg));
        }
    }
    Ok(())
}

/// The longest payload retention accepted (ten years), in days.
pub(crate) const MAX_RETENTION_DAYS: i64 = 3_650;

/// A payload retention period in days (`payloadRetentionPeriod` of a message or an application): 1 to
/// [`MAX_RETENTION_DAYS`].
pub(crate) fn retention_days(field: &str, days: i64) -> Result<u32, ApiError> {
    match u32::try_from(days) {
        Ok(valid) if (1..=MAX_RETENTION_DAYS).contains(&days) => Ok(valid),
        _ => Err(ApiError::body(
            field,
            format!("must be between 1 and {MAX_RETENTION_DAYS} days, got {days}"),
        )),
    }
}

/// The uid of an object that a PUT creates because `path_segment` (the path parameter `path_param`)
/// named nothing; the segment's type says which kind of object, so which prefix is Herald's.
///
/// An id cannot be chosen by a client, so a segment shaped like an id of `kind` is simply not found;
/// otherwise the segment becomes the uid (a segment that cannot be one is a 422 naming the parameter),
/// and a body that names a different uid is refused.
pub(crate) fn uid_for_put<K: herald_core::id::Kind>(
    (path_param, path_segment): (&str, &herald_core::id::IdOrUid<K>),
    body_uid: Option<&str>,
    what: &str,
) -> Result<String, ApiError> {
    let (path_segment, kind) = (path_segment.as_str(), K::KIND);
    if kind.matches(path_segment) {
        return Err(ApiError::not_found(what));
    }
    uid(path_segment, kind).map_err(|error| error.relocated(Source::Path, path_param))?;
    match body_uid {
        Some(given) if given != path_segment => Err(ApiError::body(
            "uid",
            "must equal the path segment when PUT creates the object",
        )),
        _ => Ok(path_segment.to_owned()),
    }
}

/// Check that `json` is JSON every receiver's parser can read: serde_json's defaults refuse nesting deeper
/// than 128, lone surrogates and numbers out of range, which a raw pass-through would otherwise store and
/// echo into every listing. The text is walked, not built into a value: building one allocated for every
/// node of every payload on the ingest path.
pub(crate) fn portable_json(json: &str) -> Result<(), serde_json::Error> {
    serde_json::from_str::<Walked>(json).map(|_| ())
}

/// Any JSON value, walked and dropped (see [`portable_json`]): the parser checks what it reads (depth,
/// string escapes, numbers) on the way.
struct Walked;

impl<'de> serde::Deserialize<'de> for Walked {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Walked)
    }
}

impl<'de> serde::de::Visitor<'de> for Walked {
    type Value = Walked;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Walked, E> {
        Ok(Walked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Walked, E> {
        Ok(Walked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Walked, E> {
        Ok(Walked)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Walked, E> {
        Ok(Walked)
    }

    fn visit_str<E>(self, _: &str) -> Result<Walked, E> {
        Ok(Walked)
    }

    fn visit_unit<E>(self) -> Result<Walked, E> {
        Ok(Walked)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut items: A) -> Result<Walked, A::Error> {
        while items.next_element::<Walked>()?.is_some() {}
        Ok(Walked)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut entries: A) -> Result<Walked, A::Error> {
        while entries.next_entry::<Walked, Walked>()?.is_some() {}
        Ok(Walked)
    }
}

#[cfg(test)]
mod tests {
    use super::portable_json;

    /// The walk refuses exactly what building a `serde_json::Value` refuses.
    #[test]
    fn portable_json_agrees_with_building_a_value() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let cases = [
            r#"{"a":[1,-2,3.5e10,true,false,null,"x\n\u00e9\ud83d\ude00"],"b":{"c":{}}}"#.to_owned(),
            r#"{"lone":"\ud800"}"#.to_owned(),
            r#"{"low":"\udc00x"}"#.to_owned(),
            r#"{"big":1e400}"#.to_owned(),
            r#"{"neg":-1e400}"#.to_owned(),
            r#"{"int":18446744073709551616}"#.to_owned(),
            r#"{"dup":1,"dup":2}"#.to_owned(),
            r#"{"a":1,}"#.to_owned(),
            r#"{"a":01}"#.to_owned(),
            "{\"ctl\":\"\u{1}\"}".to_owned(),
            r#"{"a":1} x"#.to_owned(),
            format!("{{\"d\":{}}}", deep(127)),
            format!("{{\"d\":{}}}", deep(128)),
            deep(129),
        ];
        for case in &cases {
            let value = serde_json::from_str::<serde_json::Value>(case).is_ok();
            assert_eq!(portable_json(case).is_ok(), value, "{case:.80}");
        }
        assert!(portable_json(&cases[0]).is_ok());
        assert!(portable_json(&cases[1]).is_err(), "a lone surrogate passed");
        assert!(portable_json(&cases[3]).is_err(), "1e400 passed");
        assert!(portable_json(&cases[13]).is_err(), "nesting past 128 passed");
    }
}
