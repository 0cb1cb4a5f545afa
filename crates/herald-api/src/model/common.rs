//! What every resource's wire types share: the request-side field semantics ([`Patch`] and the
//! `deserialize_with` helpers [`non_null`], [`null_as_default`], [`null_resets`]), the dual-name outputs
//! ([`ThrottleRateOut`], [`FilterTypesOut`]), the listing page ([`ListResponse`]), [`Metadata`],
//! [`JsonObject`] and the error body [`HttpError`].

use std::collections::{BTreeMap, BTreeSet};

use serde::de::{Deserialize, Deserializer};
use serde::ser::{Serialize, SerializeMap, Serializer};

/// Free-form string-to-string metadata attached to applications and endpoints.
pub type Metadata = BTreeMap<String, String>;

/// JSON object holding an event type's schemas, keyed by schema version (`"1"`, …).
pub type JsonObject = serde_json::Map<String, serde_json::Value>;

/// One field of a PATCH body, telling apart "absent" (leave unchanged), `null` (clear) and a
/// value (set).
///
/// Use it only for fields Svix marks `nullable`, and **always** with `#[serde(default)]`: the
/// default supplies [`Patch::Absent`] for a missing key. (Without `default`, serde would feed a
/// missing key to `deserialize_option` and it would come out as [`Patch::Null`].) Non-nullable
/// PATCH fields use `Option<T>` with [`non_null`] instead, so an explicit `null` is refused.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Patch<T> {
    /// The key was not in the body: keep the stored value.
    #[default]
    Absent,
    /// The key was present with `null`: clear the stored value.
    Null,
    /// The key was present with a value: replace the stored value.
    Value(T),
}

impl<T> Patch<T> {
    /// True when the key was not in the body.
    pub fn is_absent(&self) -> bool {
        matches!(self, Patch::Absent)
    }

    /// `None` when absent, `Some(None)` for `null`, `Some(Some(v))` for a value.
    pub fn into_update(self) -> Option<Option<T>> {
        match self {
            Patch::Absent => None,
            Patch::Null => Some(None),
            Patch::Value(v) => Some(Some(v)),
        }
    }

    /// Applies the patch to a stored nullable value (absent: unchanged; null: cleared; value: set).
    pub fn apply_to(self, target: &mut Option<T>) {
        match self {
            Patch::Absent => {}
            Patch::Null => *target = None,
            Patch::Value(v) => *target = Some(v),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Patch<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Only reached when the key is present (missing keys take `#[serde(default)]`).
        Ok(match Option::<T>::deserialize(deserializer)? {
            None => Patch::Null,
            Some(v) => Patch::Value(v),
        })
    }
}

/// `deserialize_with` for an optional but non-nullable field: a missing key gives `None` (pair it
/// with `#[serde(default)]`), a value gives `Some`, and an explicit `null` is an error naming the
/// expected type, as Svix refuses `null` for non-nullable fields.
pub fn non_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// `deserialize_with` for a field with a natural default (`""`, `{}`, `false`): an explicit `null` means
/// the default, as with Svix — the SDKs send `null` for an argument left `None` (e.g. Python's
/// `metadata=None`). Pair it with `#[serde(default)]` for the missing key.
pub fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Option::<T>::deserialize(deserializer).map(Option::unwrap_or_default)
}

/// `deserialize_with` for a PATCH field with a natural default: absent keeps the stored value (pair it
/// with `#[serde(default)]`), `null` resets it to the default (`""`, `{}`, `false`), a value sets it.
pub fn null_resets<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    null_as_default(deserializer).map(Some)
}

/// Writes one value under two keys into a flattened map, or nothing when the value is `None`.
fn serialize_two_keys<S, T>(serializer: S, current: &str, legacy: &str, value: &Option<T>) -> Result<S::Ok, S::Error>
where
    S: Serializer,
    T: Serialize,
{
    match value {
        None => serializer.serialize_map(Some(0))?.end(),
        Some(v) => {
            let mut map = serializer.serialize_map(Some(2))?;
            map.serialize_entry(current, v)?;
            map.serialize_entry(legacy, v)?;
            map.end()
        }
    }
}

/// Output rate limit (messages/second), written as both `throttleRate` (SDK 2.x) and
/// `rateLimit` (OpenAPI document, SDK 1.x); omitted when unset. Use with `#[serde(flatten)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ThrottleRateOut(pub Option<u16>);

impl Serialize for ThrottleRateOut {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_two_keys(serializer, "throttleRate", "rateLimit", &self.0)
    }
}

/// Output event-type filter of an endpoint, written as both `filterTypes` (OpenAPI document) and
/// `eventTypes` (SDK 2.x); omitted when the endpoint receives every event type. Use with
/// `#[serde(flatten)]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FilterTypesOut(pub Option<BTreeSet<String>>);

impl Serialize for FilterTypesOut {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_two_keys(serializer, "filterTypes", "eventTypes", &self.0)
    }
}

/// One page of a listing. `iterator` and `prevIterator` are always written (possibly `null`):
/// the SDK requires the `iterator` key.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListResponse<T> {
    /// The items of this page.
    pub data: Vec<T>,
    /// Cursor for the next page (pass back as `?iterator=`), `null` when there is none.
    pub iterator: Option<String>,
    /// Cursor for the previous page, `null` when there is none.
    pub prev_iterator: Option<String>,
    /// True when this is the last page.
    pub done: bool,
}

/// Error body for every non-422 error status: `{"code": "...", "detail": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HttpError {
    /// Machine-readable error code, e.g. `not_found`, `conflict`, `validation`.
    pub code: String,
    /// Human-readable explanation.
    pub detail: String,
}

impl HttpError {
    /// Builds an error body from a code and a detail message.
    pub fn new(code: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn error_bodies() {
        let v = serde_json::to_value(HttpError::new("not_found", "no such app")).unwrap();
        assert_eq!(v, json!({"code":"not_found","detail":"no such app"}));
    }
}
