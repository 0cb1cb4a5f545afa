//! Wire types of the Svix-compatible API.
//!
//! Field names, required fields and types follow Svix's OpenAPI document (`openapi.json` in
//! svix/svix-webhooks) *and* what the official `svix` Python SDK 2.9.1 actually sends and
//! validates. Where the two disagree, inputs accept both spellings and outputs emit both:
//!
//! * the OpenAPI document says `rateLimit` and `filterTypes`; SDK 2.9.1 sends and reads
//!   `throttleRate` and `eventTypes`. Inputs take either name (serde `alias`); outputs write both
//!   keys with the same value ([`ThrottleRateOut`], [`FilterTypesOut`]).
//! * SDK 2.9.1 *requires* some response fields the OpenAPI document does not list
//!   (`EventTypeOut.deprecated`, `MessageAttemptOut.responseDurationMs` and `statusText`).
//!
//! Conventions:
//! * `*In` / `*Update` / `*Patch` types are request bodies: `Deserialize`, unknown fields ignored.
//! * `*Out` types are response bodies: `Serialize`. A field the SDK declares as `Optional[...]
//!   = None` is skipped when `None`; a field the SDK declares without a default is always written
//!   (as `null` when empty) because pydantic then requires the key to be present.
//! * Timestamps are RFC 3339 (`time::serde::rfc3339`), e.g. `2024-05-01T12:00:00.123456789Z`;
//!   the SDK truncates to microseconds, which is harmless.
//! * Set-valued fields (`filterTypes`, `channels`) are `BTreeSet`s: duplicates collapse and the
//!   output order is stable, as with Svix's own set types.

use std::collections::{BTreeMap, BTreeSet};

use serde::de::{Deserialize, Deserializer};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::value::RawValue;
use time::OffsetDateTime;

/// Free-form string-to-string metadata attached to applications and endpoints.
pub type Metadata = BTreeMap<String, String>;

/// JSON object holding an event type's schemas, keyed by schema version (`"1"`, …).
pub type JsonObject = serde_json::Map<String, serde_json::Value>;

// ---------------------------------------------------------------------------------------------
// Helpers: PATCH semantics, non-nullable optional fields, dual-name outputs.
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Applications
// ---------------------------------------------------------------------------------------------

/// Body of `POST /api/v1/app` and `PUT /api/v1/app/{app_id}`: creates or replaces an application.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationIn {
    /// Human-readable application name (required, non-empty).
    pub name: String,
    /// Optional caller-chosen unique id, accepted wherever the `app_…` id is.
    #[serde(default)]
    pub uid: Option<String>,
    /// Maximum messages per second for this application (`throttleRate`, alias `rateLimit`).
    #[serde(default, alias = "rateLimit", deserialize_with = "crate::whole::option")]
    pub throttle_rate: Option<u16>,
    /// Free-form metadata; defaults to `{}`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: Metadata,
    /// New endpoints must echo a signed challenge before they receive anything (Herald extension).
    #[serde(default, deserialize_with = "null_as_default")]
    pub verify_endpoints: bool,
    /// Days the payload of each new message is kept when the message sets no retention of its own
    /// (Herald extension; `null` or absent: kept).
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub payload_retention_period: Option<i64>,
}

/// Body of `PATCH /api/v1/app/{app_id}`: only the keys present change.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationPatch {
    /// New name (non-nullable: `null` is refused).
    #[serde(default, deserialize_with = "non_null")]
    pub name: Option<String>,
    /// New uid, or `null` to remove it.
    #[serde(default)]
    pub uid: Patch<String>,
    /// New rate limit, or `null` to remove it (`throttleRate`, alias `rateLimit`).
    #[serde(default, alias = "rateLimit", deserialize_with = "crate::whole::patch")]
    pub throttle_rate: Patch<u16>,
    /// Require the ownership check for new endpoints (`null` resets it to false; Herald extension).
    #[serde(default, deserialize_with = "null_resets")]
    pub verify_endpoints: Option<bool>,
    /// New default payload retention in days, or `null` to keep payloads (Herald extension).
    #[serde(default, deserialize_with = "crate::whole::patch")]
    pub payload_retention_period: Patch<i64>,
    /// New metadata, replacing the old map (`null` resets it to the default).
    #[serde(default, deserialize_with = "null_resets")]
    pub metadata: Option<Metadata>,
}

/// An application as returned by the API (SDK requires `createdAt`, `updatedAt`, `metadata`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationOut {
    /// Application id (`app_…`).
    pub id: String,
    /// Caller-chosen unique id, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Human-readable application name.
    pub name: String,
    /// Rate limit, written as `throttleRate` and `rateLimit`.
    #[serde(flatten)]
    pub throttle_rate: ThrottleRateOut,
    /// New endpoints must pass the ownership check (Herald extension).
    pub verify_endpoints: bool,
    /// Default payload retention of new messages, in days, if set (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_retention_period: Option<u32>,
    /// Free-form metadata (always present, `{}` when empty).
    pub metadata: Metadata,
    /// Creation time.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last modification time.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

// ---------------------------------------------------------------------------------------------
// Event types
// ---------------------------------------------------------------------------------------------

/// Body of `POST /api/v1/event-type`: declares an event type.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeIn {
    /// Event type name, e.g. `user.signup` (pattern `^[a-zA-Z0-9\-_.]+$`, ≤ 256 chars).
    pub name: String,
    /// Human-readable description (required).
    pub description: String,
    /// Whether the event type is archived (hidden); defaults to false.
    #[serde(default, deserialize_with = "null_as_default")]
    pub archived: bool,
    /// Whether the event type is deprecated; defaults to false.
    #[serde(default, deserialize_with = "null_as_default")]
    pub deprecated: bool,
    /// JSON Schemas of the payload keyed by version (`{"1": {…}}`).
    #[serde(default)]
    pub schemas: Option<JsonObject>,
    /// Feature flag gating visibility (older single-flag form).
    #[serde(default)]
    pub feature_flag: Option<String>,
    /// Feature flags gating visibility (SDK 2.x form).
    #[serde(default)]
    pub feature_flags: Option<Vec<String>>,
    /// Display group of the event type.
    #[serde(default)]
    pub group_name: Option<String>,
}

/// Body of `PUT /api/v1/event-type/{name}` (Svix `EventTypeUpdate`, SDK `EventTypeUpsertIn`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeUpdate {
    /// Human-readable description (required).
    pub description: String,
    /// Whether the event type is archived; defaults to false.
    #[serde(default, deserialize_with = "null_as_default")]
    pub archived: bool,
    /// Whether the event type is deprecated; defaults to false.
    #[serde(default, deserialize_with = "null_as_default")]
    pub deprecated: bool,
    /// JSON Schemas of the payload keyed by version.
    #[serde(default)]
    pub schemas: Option<JsonObject>,
    /// Feature flag gating visibility (older single-flag form).
    #[serde(default)]
    pub feature_flag: Option<String>,
    /// Feature flags gating visibility (SDK 2.x form).
    #[serde(default)]
    pub feature_flags: Option<Vec<String>>,
    /// Display group of the event type.
    #[serde(default)]
    pub group_name: Option<String>,
}

/// Body of `PATCH /api/v1/event-type/{name}`: only the keys present change.
#[derive(Debug, Clone, PartialEq, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventTypePatch {
    /// New description (`null` resets it to the default).
    #[serde(default, deserialize_with = "null_resets")]
    pub description: Option<String>,
    /// New archived flag (`null` resets it to the default).
    #[serde(default, deserialize_with = "null_resets")]
    pub archived: Option<bool>,
    /// New deprecated flag (`null` resets it to the default).
    #[serde(default, deserialize_with = "null_resets")]
    pub deprecated: Option<bool>,
    /// New schemas, or `null` to remove them.
    #[serde(default)]
    pub schemas: Patch<JsonObject>,
    /// New single feature flag, or `null` to remove it.
    #[serde(default)]
    pub feature_flag: Patch<String>,
    /// New feature flags, or `null` to remove them.
    #[serde(default)]
    pub feature_flags: Patch<Vec<String>>,
    /// New display group, or `null` to remove it.
    #[serde(default)]
    pub group_name: Patch<String>,
}

/// Body of `POST /api/v1/event-type/import/openapi` (Svix `EventTypeImportOpenApiIn`).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeImportIn {
    /// The OpenAPI document as a JSON object.
    #[serde(default)]
    pub spec: Option<serde_json::Value>,
    /// The OpenAPI document as JSON text.
    #[serde(default)]
    pub spec_raw: Option<String>,
    /// Archive the event types the document does not name.
    #[serde(default)]
    pub replace_all: Option<bool>,
    /// Answer what would change, change nothing.
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// Answer of the import (Svix `EventTypeImportOpenApiOut`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct EventTypeImportOut {
    /// What was (or would be) changed.
    pub data: EventTypeImportResult,
}

/// What an import changed (Svix `EventTypeImportOpenApiOutData`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct EventTypeImportResult {
    /// Names of the event types created, replaced or archived.
    pub modified: Vec<String>,
    /// On a dry run, the event types the document declares (Svix spells this key in snake case).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_modify: Option<Vec<EventTypeFromOpenApiOut>>,
}

/// One event type as read from the document (Svix `EventTypeFromOpenApi`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeFromOpenApiOut {
    /// Event type name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Payload schemas keyed by version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schemas: Option<JsonObject>,
    /// Deprecated flag.
    pub deprecated: bool,
    /// Group name, if the document gives one (`x-svix-group-name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_name: Option<String>,
    /// Feature flags, if the document gives some (`x-svix-feature-flags`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feature_flags: Option<Vec<String>>,
}

/// An event type as returned by the API (SDK requires `deprecated`, `createdAt`, `updatedAt`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeOut {
    /// Event type name.
    pub name: String,
    /// Human-readable description.
    pub description: String,
    /// Whether the event type is archived.
    pub archived: bool,
    /// Whether the event type is deprecated (required by SDK 2.9.1).
    pub deprecated: bool,
    /// JSON Schemas of the payload keyed by version, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schemas: Option<JsonObject>,
    /// Single feature flag, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feature_flag: Option<String>,
    /// Feature flags, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feature_flags: Option<Vec<String>>,
    /// Display group, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_name: Option<String>,
    /// Creation time.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last modification time.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

// ---------------------------------------------------------------------------------------------
// Endpoints
// ---------------------------------------------------------------------------------------------

/// Body of `POST /api/v1/app/{app_id}/endpoint`: creates an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointIn {
    /// Destination URL (required; checked against the SSRF policy by the handler).
    pub url: String,
    /// Human-readable description; defaults to `""`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub description: String,
    /// Optional caller-chosen unique id within the application.
    #[serde(default)]
    pub uid: Option<String>,
    /// Whether the endpoint starts disabled; defaults to false.
    #[serde(default, deserialize_with = "null_as_default")]
    pub disabled: bool,
    /// Event types delivered to this endpoint (`filterTypes`, alias `eventTypes`); `None` = all.
    #[serde(default, alias = "eventTypes", deserialize_with = "crate::sets::option::<_, 256>")]
    pub filter_types: Option<BTreeSet<String>>,
    /// Channels this endpoint listens to; `None` = all.
    #[serde(default, deserialize_with = "crate::sets::option::<_, 10>")]
    pub channels: Option<BTreeSet<String>>,
    /// Maximum messages per second (`throttleRate`, alias `rateLimit`).
    #[serde(default, alias = "rateLimit", deserialize_with = "crate::whole::option")]
    pub throttle_rate: Option<u16>,
    /// Requests in flight at most (Herald extension, 1–1000); the operator's default when absent.
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub max_concurrency: Option<u32>,
    /// `"none"` (default) or `"key"`: messages sharing an `orderingKey` are delivered one at a time, in order
    /// (Herald extension).
    #[serde(default)]
    pub ordering: Option<String>,
    /// Time allowed for one attempt, in milliseconds (Herald extension; 100 up to the operator's bound);
    /// the operator's default when absent.
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub request_timeout_ms: Option<u32>,
    /// The names the signature headers are sent under: `"webhook"`, `"svix"` or `"both"` (Herald
    /// extension); the operator's setting when absent or `null`.
    #[serde(default)]
    pub signature_headers: Option<String>,
    /// Signing key: `whsec_` + base64 (HMAC, `v1`) or `whsk_` + base64 (Ed25519, `v1a`); generated by the
    /// server when `None`, of the kind `signatureType` names.
    #[serde(default)]
    pub secret: Option<String>,
    /// `"hmac"` (default) or `"ed25519"` (Herald extension): the kind of key generated when no `secret` is
    /// given. With a `secret`, it must match the secret's kind.
    #[serde(default)]
    pub signature_type: Option<String>,
    /// Free-form metadata; defaults to `{}`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: Metadata,
    /// Custom headers added to every delivery (SDK 2.x sends them on create).
    #[serde(default)]
    pub headers: Option<BTreeMap<String, String>>,
    /// Deprecated endpoint version; accepted and ignored.
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub version: Option<u16>,
}

/// Body of `PUT /api/v1/app/{app_id}/endpoint/{endpoint_id}` (Svix `EndpointUpdate`, SDK
/// `EndpointUpsertIn`): replaces an endpoint's settings; the secret is not part of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointUpdate {
    /// Destination URL (required).
    pub url: String,
    /// Human-readable description; defaults to `""`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub description: String,
    /// Optional caller-chosen unique id within the application.
    #[serde(default)]
    pub uid: Option<String>,
    /// Whether the endpoint is disabled; defaults to false.
    #[serde(default, deserialize_with = "null_as_default")]
    pub disabled: bool,
    /// Event types delivered (`filterTypes`, alias `eventTypes`); `None` = all.
    #[serde(default, alias = "eventTypes", deserialize_with = "crate::sets::option::<_, 256>")]
    pub filter_types: Option<BTreeSet<String>>,
    /// Channels listened to; `None` = all.
    #[serde(default, deserialize_with = "crate::sets::option::<_, 10>")]
    pub channels: Option<BTreeSet<String>>,
    /// Maximum messages per second (`throttleRate`, alias `rateLimit`).
    #[serde(default, alias = "rateLimit", deserialize_with = "crate::whole::option")]
    pub throttle_rate: Option<u16>,
    /// Requests in flight at most (Herald extension, 1–1000); the operator's default when absent.
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub max_concurrency: Option<u32>,
    /// `"none"` (default) or `"key"`: messages sharing an `orderingKey` are delivered one at a time, in order
    /// (Herald extension).
    #[serde(default)]
    pub ordering: Option<String>,
    /// Time allowed for one attempt, in milliseconds (Herald extension; 100 up to the operator's bound);
    /// the operator's default when absent.
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub request_timeout_ms: Option<u32>,
    /// The names the signature headers are sent under: `"webhook"`, `"svix"` or `"both"` (Herald
    /// extension); the operator's setting when absent or `null`.
    #[serde(default)]
    pub signature_headers: Option<String>,
    /// Free-form metadata; defaults to `{}`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: Metadata,
    /// Deprecated endpoint version; accepted and ignored.
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub version: Option<u16>,
}

/// Body of `PATCH /api/v1/app/{app_id}/endpoint/{endpoint_id}`: only the keys present change.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPatch {
    /// New destination URL (non-nullable).
    #[serde(default, deserialize_with = "non_null")]
    pub url: Option<String>,
    /// New description (`null` resets it to the default).
    #[serde(default, deserialize_with = "null_resets")]
    pub description: Option<String>,
    /// New uid, or `null` to remove it.
    #[serde(default)]
    pub uid: Patch<String>,
    /// New disabled flag (`null` resets it to the default).
    #[serde(default, deserialize_with = "null_resets")]
    pub disabled: Option<bool>,
    /// New event-type filter, or `null` for all types (`filterTypes`, alias `eventTypes`).
    #[serde(default, alias = "eventTypes", deserialize_with = "crate::sets::patch::<_, 256>")]
    pub filter_types: Patch<BTreeSet<String>>,
    /// New channel filter, or `null` for all channels.
    #[serde(default, deserialize_with = "crate::sets::patch::<_, 10>")]
    pub channels: Patch<BTreeSet<String>>,
    /// New rate limit, or `null` to remove it (`throttleRate`, alias `rateLimit`).
    #[serde(default, alias = "rateLimit", deserialize_with = "crate::whole::patch")]
    pub throttle_rate: Patch<u16>,
    /// New concurrency cap, or `null` for the operator's default.
    #[serde(default, deserialize_with = "crate::whole::patch")]
    pub max_concurrency: Patch<u32>,
    /// New ordering mode (`"none"` or `"key"`; non-nullable).
    #[serde(default, deserialize_with = "non_null")]
    pub ordering: Option<String>,
    /// New attempt timeout in milliseconds, or `null` for the operator's default.
    #[serde(default, deserialize_with = "crate::whole::patch")]
    pub request_timeout_ms: Patch<u32>,
    /// New signature header names (`"webhook"`, `"svix"` or `"both"`), or `null` for the operator's
    /// setting.
    #[serde(default)]
    pub signature_headers: Patch<String>,
    /// New signing secret, or `null` to have the server generate one.
    #[serde(default)]
    pub secret: Patch<String>,
    /// New metadata, replacing the old map (`null` resets it to the default).
    #[serde(default, deserialize_with = "null_resets")]
    pub metadata: Option<Metadata>,
    /// Deprecated endpoint version; accepted and ignored.
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub version: Option<u16>,
}

/// An endpoint as returned by the API (SDK requires `description`, `metadata`, timestamps).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointOut {
    /// Endpoint id (`ep_…`).
    pub id: String,
    /// Caller-chosen unique id, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Destination URL.
    pub url: String,
    /// Human-readable description (always present, `""` when empty).
    pub description: String,
    /// Whether the endpoint is disabled.
    pub disabled: bool,
    /// Event-type filter, written as `filterTypes` and `eventTypes`; omitted = all types.
    #[serde(flatten)]
    pub filter_types: FilterTypesOut,
    /// Channel filter; omitted = all channels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<BTreeSet<String>>,
    /// Rate limit, written as `throttleRate` and `rateLimit`.
    #[serde(flatten)]
    pub throttle_rate: ThrottleRateOut,
    /// Requests in flight at most, when set on the endpoint (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    /// `"none"` or `"key"` (Herald extension).
    pub ordering: &'static str,
    /// Time allowed for one attempt in milliseconds, when set on the endpoint (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u32>,
    /// The names the signature headers are sent under, when set on the endpoint (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature_headers: Option<&'static str>,
    /// Why Herald disabled the endpoint, when it did (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<String>,
    /// `"hmac"` (`v1` signatures) or `"ed25519"` (`v1a`), from the current key (Herald extension).
    pub signature_type: &'static str,
    /// The `whpk_…` key receivers verify `v1a` signatures with, for Ed25519 endpoints (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// Flow-control state, on `GET` of one endpoint (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<EndpointHealthOut>,
    /// Free-form metadata (always present).
    pub metadata: Metadata,
    /// Deprecated version number required by the OpenAPI document; always 1.
    pub version: u16,
    /// Creation time.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last modification time.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// An endpoint's flow-control state: its circuit breaker and its queue (Herald extension).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointHealthOut {
    /// `closed`, `open` or `half_open`.
    pub state: &'static str,
    /// Failed attempts since the last success.
    pub consecutive_failures: u32,
    /// When the current run of failures began.
    #[serde(with = "time::serde::rfc3339::option")]
    pub failing_since: Option<OffsetDateTime>,
    /// When the breaker opened (while open or half-open).
    #[serde(with = "time::serde::rfc3339::option")]
    pub opened_at: Option<OffsetDateTime>,
    /// When the next probe may go out (while open).
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_probe_at: Option<OffsetDateTime>,
    /// The endpoint asked (`Retry-After` on 429/503) to be left alone until then.
    #[serde(with = "time::serde::rfc3339::option")]
    pub held_until: Option<OffsetDateTime>,
    /// Requests in flight now.
    pub in_flight: u32,
    /// Requests allowed in flight now (lower than the cap while ramping up after a recovery).
    pub concurrency_limit: u32,
    /// Deliveries waiting (pending in the store), counted up to `Backlog::COUNT_CAP`.
    pub queue_depth: u64,
    /// More deliveries wait than were counted: `queue_depth` is a lower bound.
    pub queue_depth_capped: bool,
    /// Creation time of the oldest waiting delivery's message.
    #[serde(with = "time::serde::rfc3339::option")]
    pub oldest_pending_at: Option<OffsetDateTime>,
    /// The outcome classes of the endpoint's last attempts on the node that delivers for it, oldest first.
    pub recent_outcomes: Vec<&'static str>,
}

/// Body of `GET …/endpoint/{endpoint_id}/secret`: the current signing secret.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSecretOut {
    /// The current signing key, `whsec_` + base64 (or `whsk_…` for Ed25519 endpoints).
    pub key: String,
    /// For Ed25519 endpoints, the `whpk_…` public key receivers verify with (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
}

/// Body of `POST …/endpoint/{endpoint_id}/secret/rotate` (Svix `EndpointSecretRotateIn`, plus
/// `gracePeriodSeconds`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSecretRotateIn {
    /// The new key (`whsec_…` or `whsk_…`); generated, of the current key's kind, when absent.
    #[serde(default)]
    pub key: Option<String>,
    /// How long the replaced key (and any older one still valid) keeps signing next to the new one, in
    /// seconds; 24 hours when absent. `0` revokes them at once (a compromised key).
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub grace_period_seconds: Option<u64>,
}

/// Body of `PUT …/endpoint/{endpoint_id}/headers` (Svix `EndpointHeadersIn`): replaces every custom header.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct EndpointHeadersIn {
    /// Header name to value.
    pub headers: BTreeMap<String, String>,
}

/// Body of `PATCH …/endpoint/{endpoint_id}/headers` (Svix `EndpointHeadersPatchIn`): a value sets a
/// header, `null` removes it, the names in `deleteHeaders` are removed (the 2.x SDKs' only way, their
/// `headers` map holds strings), others are kept.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointHeadersPatchIn {
    /// Header name to new value, or `null` to remove it.
    pub headers: BTreeMap<String, Option<String>>,
    /// Names of headers to remove (any case).
    #[serde(default)]
    pub delete_headers: Option<Vec<String>>,
}

/// Body of `GET …/endpoint/{endpoint_id}/headers` (Svix `EndpointHeadersOut`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct EndpointHeadersOut {
    /// The headers whose values are not credentials, name to value.
    pub headers: BTreeMap<String, String>,
    /// Names of the headers whose values are credentials (e.g. `authorization`); their values are not
    /// shown.
    pub sensitive: BTreeSet<String>,
}

// ---------------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------------

/// Body of `POST /api/v1/app/{app_id}/msg`: a message to fan out to the subscribed endpoints.
///
/// Fields that change delivery semantics and that Herald must either implement or refuse with a
/// 422 naming the field (never silently ignore):
/// * `deliverAt` — scheduled delivery: its deliveries' first attempt is due then (at most
///   [`crate::validate::MAX_SCHEDULE_AHEAD_MS`] ahead; a past time means at once);
/// * `transformationsParams` — `rawPayload` replaces the delivered body and `headers` (e.g.
///   `content-type`) change the request; the SDK's `message_in_raw()` sends `payload: {}` with
///   `transformationsParams.rawPayload`, so ignoring it would deliver `{}`;
/// * `application` — implicitly creates the application when the path's id/uid does not exist
///   (ignored by Svix when the application exists).
///
/// `tags` are stored, echoed and indexed for the `tag` filter; they do not change delivery. `payloadRetentionPeriod` and
/// `payloadRetentionHours` set when the retention job expunges the payload.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageIn {
    /// Producer's idempotency id, unique per application (`eventId`).
    #[serde(default)]
    pub event_id: Option<String>,
    /// Event type name (required).
    pub event_type: String,
    /// The webhook body exactly as posted (must be a JSON object; alias `data`).
    #[serde(alias = "data")]
    pub payload: Box<RawValue>,
    /// Channels the message is sent on (1–5 items when present).
    #[serde(default, deserialize_with = "crate::sets::option::<_, 5>")]
    pub channels: Option<BTreeSet<String>>,
    /// Deliveries with the same key go one at a time to endpoints with `ordering: "key"` (Herald
    /// extension; e.g. the id of the resource the event is about).
    #[serde(default)]
    pub ordering_key: Option<String>,
    /// Free-form tags the message can be listed by (at most five, capped as sent).
    #[serde(
        default,
        deserialize_with = "crate::sets::option::<_, { crate::validate::MAX_TAGS }>"
    )]
    pub tags: Option<BTreeSet<String>>,
    /// Create-application-on-the-fly request (changes semantics, see above).
    #[serde(default)]
    pub application: Option<ApplicationIn>,
    /// Transformation parameters incl. `rawPayload` / `headers` (changes semantics, see above).
    #[serde(default)]
    pub transformations_params: Option<serde_json::Value>,
    /// When the deliveries are first attempted (scheduled delivery, see above).
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub deliver_at: Option<OffsetDateTime>,
    /// Payload retention in days: the retention job expunges the payload after that.
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub payload_retention_period: Option<i64>,
    /// Payload retention in hours (exclusive with the period).
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub payload_retention_hours: Option<i64>,
}

impl MessageIn {
    /// Names (wire spelling) of the fields set in this body whose semantics Herald does not
    /// implement yet and must refuse with a 422.
    pub fn unsupported_fields(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.transformations_params.is_some() {
            out.push("transformationsParams");
        }
        out
    }

    /// True when the payload is a JSON object, as Svix requires (and as the SDK's `MessageOut`
    /// needs to parse it back).
    pub fn payload_is_object(&self) -> bool {
        self.payload.get().starts_with('{')
    }
}

/// The payload written back when the caller asked `with_content=false` (SDK 2.x default).
pub fn empty_payload() -> Box<RawValue> {
    RawValue::from_string("{}".to_owned()).expect("`{}` is valid JSON")
}

/// A message as returned by the API. `payload` is required by the SDK and must be an object.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageOut {
    /// Message id (`msg_…`).
    pub id: String,
    /// Producer's idempotency id, if given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// Event type name.
    pub event_type: String,
    /// Stored body byte-for-byte, or [`empty_payload`] when `with_content=false`.
    pub payload: Box<RawValue>,
    /// Channels the message was sent on, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<BTreeSet<String>>,
    /// Tags of the message, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeSet<String>>,
    /// Ingest time.
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
    /// When its deliveries were scheduled for (`deliverAt`), if they were.
    #[serde(skip_serializing_if = "Option::is_none", with = "time::serde::rfc3339::option")]
    pub deliver_at: Option<OffsetDateTime>,
}

// ---------------------------------------------------------------------------------------------
// Attempts
// ---------------------------------------------------------------------------------------------

/// Delivery status, serialized as an integer (0 Success, 1 Pending, 2 Fail, 3 Sending,
/// 4 Canceled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageStatus {
    /// Delivered (2xx).
    Success = 0,
    /// Waiting for a (re)try.
    Pending = 1,
    /// Failed for good (terminal 4xx, or retries exhausted).
    Fail = 2,
    /// An attempt is in flight.
    Sending = 3,
    /// Cancelled; Svix only reports it when the caller passes `expanded_statuses=true`
    /// (otherwise it is reported as Success).
    Canceled = 4,
}

impl MessageStatus {
    /// The matching `statusText` value.
    pub fn text(self) -> MessageStatusText {
        match self {
            MessageStatus::Success => MessageStatusText::Success,
            MessageStatus::Pending => MessageStatusText::Pending,
            MessageStatus::Fail => MessageStatusText::Fail,
            MessageStatus::Sending => MessageStatusText::Sending,
            MessageStatus::Canceled => MessageStatusText::Canceled,
        }
    }

    /// Parses the integer form (e.g. the `status` query parameter).
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => MessageStatus::Success,
            1 => MessageStatus::Pending,
            2 => MessageStatus::Fail,
            3 => MessageStatus::Sending,
            4 => MessageStatus::Canceled,
            _ => return None,
        })
    }
}

impl Serialize for MessageStatus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(*self as u8)
    }
}

impl<'de> Deserialize<'de> for MessageStatus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = u8::deserialize(deserializer)?;
        MessageStatus::from_code(code)
            .ok_or_else(|| serde::de::Error::custom(format_args!("invalid message status {code}, expected 0-4")))
    }
}

/// Delivery status as text (`statusText`, required by SDK 2.9.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageStatusText {
    /// `"success"`.
    Success,
    /// `"pending"`.
    Pending,
    /// `"fail"`.
    Fail,
    /// `"sending"`.
    Sending,
    /// `"canceled"`.
    Canceled,
}

/// Why an attempt was made, serialized as an integer (0 Scheduled, 1 Manual).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageAttemptTriggerType {
    /// Normal delivery or scheduled retry.
    Scheduled = 0,
    /// Resend requested by a user (resend / replay / recover).
    Manual = 1,
}

impl Serialize for MessageAttemptTriggerType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(*self as u8)
    }
}

impl<'de> Deserialize<'de> for MessageAttemptTriggerType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match u8::deserialize(deserializer)? {
            0 => Ok(MessageAttemptTriggerType::Scheduled),
            1 => Ok(MessageAttemptTriggerType::Manual),
            other => Err(serde::de::Error::custom(format_args!(
                "invalid trigger type {other}, expected 0 or 1"
            ))),
        }
    }
}

/// One delivery attempt as returned by the attempt listings (all fields but `msg` required).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageAttemptOut {
    /// Attempt id (`atmpt_…`).
    pub id: String,
    /// Id of the message delivered.
    pub msg_id: String,
    /// Id of the endpoint attempted.
    pub endpoint_id: String,
    /// URL the attempt was sent to.
    pub url: String,
    /// Response body (capped), or an error description when there was no response.
    pub response: String,
    /// HTTP status of the response; 0 when no response was received.
    pub response_status_code: u16,
    /// Time from sending to the end of the response, in milliseconds.
    pub response_duration_ms: i64,
    /// Outcome of this attempt (integer enum).
    pub status: MessageStatus,
    /// Outcome of this attempt as text; must match `status` (see [`MessageStatus::text`]).
    pub status_text: MessageStatusText,
    /// Why the attempt was made (integer enum).
    pub trigger_type: MessageAttemptTriggerType,
    /// Why the attempt was made: `scheduled`, `manual` (resend) or `recover` (Herald extension).
    pub trigger: &'static str,
    /// Herald extension: the outcome class (`success`, `server_error`, `client_error`, `gone`,
    /// `retryable_client_error`, `unexpected_status`, `timeout`, `connect_error`, `blocked`), which says
    /// *why* an attempt failed when there was no HTTP status to tell
    /// ([`herald_core::outcome::OutcomeClass::as_str`]).
    pub outcome: &'static str,
    /// Time of the attempt.
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
    /// The message itself, when the listing was asked to expand it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msg: Option<MessageOut>,
}

/// An endpoint a message was fanned out to, and where that delivery stands (Svix's
/// `MessageEndpointOut`, plus Herald's `deliveryStatus` and `attempts`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageEndpointOut {
    /// The endpoint, as `EndpointOut`.
    #[serde(flatten)]
    pub endpoint: EndpointOut,
    /// Svix status: 0 delivered, 1 pending, 2 failed (terminal or dead), 4 cancelled.
    pub status: MessageStatus,
    /// `status` as text.
    pub status_text: MessageStatusText,
    /// When the next attempt is due, while pending.
    #[serde(skip_serializing_if = "Option::is_none", with = "time::serde::rfc3339::option")]
    pub next_attempt: Option<OffsetDateTime>,
    /// Herald extension: `pending`, `delivered`, `failed` (a terminal answer), `dead` (every scheduled
    /// attempt failed) or `cancelled`.
    pub delivery_status: &'static str,
    /// Herald extension: attempts made so far.
    pub attempts: u32,
}

// ---------------------------------------------------------------------------------------------
// Listing and errors
// ---------------------------------------------------------------------------------------------

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

/// Body of `POST …/endpoint/{endpoint_id}/recover` and `…/replay-missing` (Svix `RecoverIn`/`ReplayIn`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RepairIn {
    /// Start of the window (messages created at or after it).
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
    /// End of the window (messages created before it); now when absent.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub until: Option<OffsetDateTime>,
}

/// Body of `POST …/endpoint/{endpoint_id}/bulk-replay` (Svix `BulkReplayIn`): which of the messages sent
/// to the endpoint to send again.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BulkReplayIn {
    /// Start of the window (messages created at or after it).
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
    /// End of the window (messages created before it); now when absent.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub until: Option<OffsetDateTime>,
    /// Only messages of these event types.
    #[serde(default)]
    pub event_types: Option<Vec<String>>,
    /// Only messages on this channel.
    #[serde(default)]
    pub channel: Option<String>,
    /// Only messages with this tag.
    #[serde(default)]
    pub tag: Option<String>,
    /// Only deliveries in this state (Svix `MessageStatus`: 0 success, 1 pending, 2 fail, 3 sending,
    /// 4 canceled).
    #[serde(default)]
    pub status: Option<i64>,
    /// Only deliveries whose latest attempt got a response of this class (Svix `StatusCodeClass`: 0 none,
    /// 100, 200, 300, 400, 500).
    #[serde(default)]
    pub status_code_class: Option<i64>,
}

/// A background task, as started (Svix `RecoverOut`/`ReplayOut`) or read back (`BackgroundTaskOut`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackgroundTaskOut {
    /// `qtask_…` id.
    pub id: String,
    /// `running`, `finished` or `failed` ([`herald_core::model::TaskState`]).
    pub status: &'static str,
    /// What it does ([`herald_core::model::TaskKind`]).
    pub task: &'static str,
    /// Parameters and results.
    pub data: serde_json::Value,
    /// Items handled so far (Herald extension).
    pub processed: u64,
    /// Items to handle, as counted at the start (Herald extension).
    pub total: u64,
    /// When it started (Herald extension).
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Its last progress (Herald extension).
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// A message as attempted to one endpoint (Svix `EndpointMessageOut`), with Herald's delivery fields.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointMessageOut {
    /// The message's fields.
    #[serde(flatten)]
    pub message: MessageOut,
    /// The delivery's status as Svix's integer.
    pub status: MessageStatus,
    /// The same as text.
    pub status_text: MessageStatusText,
    /// When the next attempt is due, while pending.
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_attempt: Option<OffsetDateTime>,
    /// The endpoint (Herald extension).
    pub endpoint_id: String,
    /// `pending`, `delivered`, `failed`, `dead` or `cancelled` (Herald extension).
    pub delivery_status: &'static str,
    /// Attempts made (Herald extension).
    pub attempts: u32,
    /// The latest attempt, if any (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<MessageAttemptOut>,
}

/// Deliveries of an endpoint by status over a window (Svix `EndpointStats`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStatsOut {
    /// Delivered.
    pub success: u64,
    /// Failed for good or dead.
    pub fail: u64,
    /// Waiting for an attempt.
    pub pending: u64,
    /// In flight (Herald counts them as pending).
    pub sending: u64,
    /// Canceled before delivery (Svix's spelling, which the SDKs require).
    pub canceled: u64,
    /// The same count under Herald's earlier spelling, kept for existing clients.
    pub cancelled: u64,
}

/// Body of `POST /app/{app_id}/msg/bulk-expunge` (Svix `BulkExpungeContentsIn`).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct BulkExpungeIn {
    /// The messages (ids or `eventId`s) whose payloads to remove.
    #[serde(default)]
    pub ids: Option<Vec<String>>,
}

/// Answer of the bulk expunge (Svix `BulkExpungeContentsOut`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct BulkExpungeOut {
    /// Per message named: `expunged` or `not-found`.
    pub results: BTreeMap<String, &'static str>,
}

/// Body of `POST /app/{app_id}/msg-batch` (Herald extension): many messages in one request.
#[derive(Debug, serde::Deserialize)]
pub struct MessageBatchIn {
    /// The messages, in the order they are to be created (1 to [`MAX_BATCH_MESSAGES`]).
    pub messages: Vec<MessageIn>,
}

/// Most messages one `POST /app/{app_id}/msg-batch` may carry.
pub const MAX_BATCH_MESSAGES: usize = 500;

/// Answer of `POST /app/{app_id}/msg-batch`: one result per message, in the order given.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MessageBatchOut {
    /// The results.
    pub data: Vec<MessageBatchItemOut>,
}

/// One message's result in a [`MessageBatchOut`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct MessageBatchItemOut {
    /// What `POST /app/{app_id}/msg` would have answered for this message alone: 202, or the error's
    /// status.
    pub status: u16,
    /// The message (new, or the one this `eventId` already names), when `status` is 202.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<MessageOut>,
    /// Why the message was not stored, otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::error::ErrorOut>,
}

/// Answer of `GET …/endpoint/{endpoint_id}/attempt-stats` (Svix `EndpointAttemptStats`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct EndpointAttemptStatsOut {
    /// Attempts that succeeded in the window.
    pub success: u64,
    /// Attempts that failed in the window.
    pub fail: u64,
    /// Deliveries of the window's messages canceled before they were made.
    pub canceled: u64,
}

/// Body of `POST /app/{app_id}/endpoint/{endpoint_id}/send-example` (Svix `EventExampleIn`).
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventExampleIn {
    /// The event type whose example is sent.
    pub event_type: String,
    /// Which of its schema's `examples` (from 0, the default).
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub example_index: Option<i64>,
    /// A payload to send instead of the schema's example (a JSON object).
    #[serde(default)]
    pub payload: Option<Box<RawValue>>,
}

/// Body of `POST /app/{app_id}/msg/precheck/active` (Svix `MessagePrecheckIn`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessagePrecheckIn {
    /// The event type the message would have.
    pub event_type: String,
    /// The channels it would be sent on, if any.
    #[serde(default)]
    pub channels: Option<BTreeSet<String>>,
}

/// Answer of the precheck (Svix `MessagePrecheckOut`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct MessagePrecheckOut {
    /// Whether any enabled endpoint would get such a message.
    pub active: bool,
}

/// An endpoint's attempts per time bucket (Svix `AttemptStatisticsResponse`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptStatisticsResponse {
    /// Start of the first bucket.
    #[serde(with = "time::serde::rfc3339")]
    pub start_date: OffsetDateTime,
    /// End of the window.
    #[serde(with = "time::serde::rfc3339")]
    pub end_date: OffsetDateTime,
    /// `FiveMinutes` or `OneDay`: the length of each bucket.
    pub period: &'static str,
    /// The series, one value per bucket.
    pub data: AttemptStatisticsData,
}

/// The series of [`AttemptStatisticsResponse`], oldest bucket first (absent for an empty window).
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptStatisticsData {
    /// Successful attempts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_count: Option<Vec<u64>>,
    /// Failed attempts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_count: Option<Vec<u64>>,
    /// Average response time in milliseconds, `null` without attempts (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub average_duration_ms: Option<Vec<Option<i64>>>,
    /// Slowest response time in milliseconds, `null` without attempts (Herald extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_duration_ms: Option<Vec<Option<i64>>>,
}

/// The answer to a cancellation (Herald extension).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelledOut {
    /// Pending deliveries cancelled.
    pub cancelled: u64,
}

/// Body of `POST /api/v1/auth/app-portal-access/{app_id}`: issue an application-scoped token.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppPortalAccessIn {
    /// Seconds until the token expires (1 to 7 days; default 7 days).
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub expiry: Option<u64>,
    /// The token may only read (`GET`).
    #[serde(default)]
    pub read_only: Option<bool>,
    /// Descriptive; accepted and ignored.
    #[serde(default)]
    pub feature_flags: Option<Vec<String>>,
    /// The session the token is for: `expire-all` with `sessionIds` can end it alone.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Create the application (with the path segment as its uid) when it does not exist.
    #[serde(default)]
    pub application: Option<ApplicationIn>,
    /// Finer-grained permissions (not supported: refused with a 422 rather than granting more).
    #[serde(default)]
    pub capabilities: Option<serde_json::Value>,
}

/// Answer of `POST /api/v1/auth/app-portal-access/{app_id}`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AppPortalAccessOut {
    /// The dashboard's absolute URL with the token in the fragment (`…/dashboard/#key=…`): opening it
    /// logs in for this application.
    pub url: String,
    /// The bearer token; shown only here, Herald keeps only its digest.
    pub token: String,
}

/// Answer of `GET /api/v1/auth/token`: what the presented token is (Herald extension).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfoOut {
    /// `admin` or `app`.
    pub kind: &'static str,
    /// The application of an application token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_id: Option<String>,
    /// Whether the token may only read (`GET`).
    pub read_only: bool,
    /// When an application token stops working.
    #[serde(skip_serializing_if = "Option::is_none", with = "time::serde::rfc3339::option")]
    pub expires_at: Option<OffsetDateTime>,
}

/// Body of `POST /api/v1/auth/app/{app_id}/expire-all`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationTokenExpireIn {
    /// Seconds the tokens keep working (a grace period); default 0, at once.
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub expiry: Option<u64>,
    /// Expire only the tokens issued with one of these `sessionId`s (empty or absent: every token).
    #[serde(default)]
    pub session_ids: Option<Vec<String>>,
}

/// Something Herald did on its own that operators must know about (Herald extension).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationalEventOut {
    /// Position in the log (increasing).
    pub id: String,
    /// E.g. `endpoint.disabled`.
    pub event_type: String,
    /// The application concerned.
    pub app_id: String,
    /// The event's data, e.g. `{"endpointId": …, "appId": …, "reason": …}`.
    pub data: serde_json::Value,
    /// When it happened.
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
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
    use serde_json::{Value, json};
    use time::macros::datetime;

    #[test]
    fn endpoint_in_accepts_event_types_alias_and_defaults() {
        // What svix 2.9.1 sends for EndpointIn(url=..., event_types=[...]).
        let ep: EndpointIn = serde_json::from_str(
            r#"{"url":"https://example.com/hook","eventTypes":["user.signup","user.signup"],
                "throttleRate":5,"somethingNew":true}"#,
        )
        .unwrap();
        assert_eq!(ep.url, "https://example.com/hook");
        assert_eq!(ep.filter_types, Some(BTreeSet::from(["user.signup".to_owned()])));
        assert_eq!(ep.throttle_rate, Some(5));
        assert_eq!(ep.description, "");
        assert!(!ep.disabled);
        assert!(ep.metadata.is_empty());

        // The OpenAPI spelling works too.
        let ep: EndpointIn = serde_json::from_str(r#"{"url":"https://x","filterTypes":["a"],"rateLimit":1}"#).unwrap();
        assert_eq!(ep.filter_types, Some(BTreeSet::from(["a".to_owned()])));
        assert_eq!(ep.throttle_rate, Some(1));
    }

    #[test]
    fn endpoint_patch_tells_absent_from_null() {
        let p: EndpointPatch = serde_json::from_str(r#"{"description":"d","eventTypes":null}"#).unwrap();
        assert_eq!(p.description.as_deref(), Some("d"));
        assert_eq!(p.filter_types, Patch::Null);
        assert!(p.channels.is_absent());
        assert!(p.throttle_rate.is_absent());
        assert_eq!(p.url, None);

        let p: EndpointPatch = serde_json::from_str(r#"{"channels":["c1"],"uid":null}"#).unwrap();
        assert_eq!(p.channels, Patch::Value(BTreeSet::from(["c1".to_owned()])));
        assert_eq!(p.uid, Patch::Null);
        assert!(p.filter_types.is_absent());

        let mut stored = Some(BTreeSet::from(["x".to_owned()]));
        Patch::<BTreeSet<String>>::Null.apply_to(&mut stored);
        assert_eq!(stored, None);

        // Non-nullable fields refuse an explicit null.
        let err = serde_json::from_str::<EndpointPatch>(r#"{"url":null}"#).unwrap_err();
        assert!(err.to_string().contains("null"), "{err}");
    }

    #[test]
    fn application_patch_null_vs_absent() {
        let p: ApplicationPatch = serde_json::from_str(r#"{"throttleRate":null}"#).unwrap();
        assert_eq!(p.throttle_rate, Patch::Null);
        assert!(p.uid.is_absent());
        assert_eq!(p.name, None);
        let p: ApplicationPatch = serde_json::from_str(r#"{"rateLimit":7,"name":"n"}"#).unwrap();
        assert_eq!(p.throttle_rate, Patch::Value(7));
        assert_eq!(p.name.as_deref(), Some("n"));
    }

    #[test]
    fn message_in_keeps_payload_bytes_and_flags_unsupported_fields() {
        let body = r#"{"eventId":"evt-1","eventType":"user.signup",
            "payload": {"b": 1.50, "a":"\u00e9"  },"tags":["t"]}"#;
        let m: MessageIn = serde_json::from_str(body).unwrap();
        assert_eq!(m.payload.get(), r#"{"b": 1.50, "a":"\u00e9"  }"#);
        assert!(m.payload_is_object());
        assert_eq!(m.event_id.as_deref(), Some("evt-1"));
        assert!(m.unsupported_fields().is_empty());

        let m: MessageIn = serde_json::from_str(
            r#"{"eventType":"x","data":{},"deliverAt":"2030-01-01T00:00:00Z",
                "transformationsParams":{"rawPayload":"hi"}}"#,
        )
        .unwrap();
        assert_eq!(m.payload.get(), "{}");
        assert_eq!(m.deliver_at, Some(datetime!(2030-01-01 0:00 UTC)));
        assert_eq!(m.unsupported_fields(), vec!["transformationsParams"]);

        let m: MessageIn = serde_json::from_str(r#"{"eventType":"x","payload":[1]}"#).unwrap();
        assert!(!m.payload_is_object());
    }

    #[test]
    fn application_out_field_names() {
        let out = ApplicationOut {
            id: "app_1".into(),
            uid: None,
            name: "n".into(),
            throttle_rate: ThrottleRateOut(Some(3)),
            verify_endpoints: false,
            payload_retention_period: None,
            metadata: Metadata::new(),
            created_at: datetime!(2024-05-01 12:00:00.5 UTC),
            updated_at: datetime!(2024-05-01 12:00:00.5 UTC),
        };
        let v = serde_json::to_value(&out).unwrap();
        assert_eq!(
            v,
            json!({"id":"app_1","name":"n","throttleRate":3,"rateLimit":3,"metadata":{},"verifyEndpoints":false,
                   "createdAt":"2024-05-01T12:00:00.5Z","updatedAt":"2024-05-01T12:00:00.5Z"})
        );
        let out = ApplicationOut {
            throttle_rate: ThrottleRateOut(None),
            ..out
        };
        let v = serde_json::to_value(&out).unwrap();
        assert!(v.get("throttleRate").is_none() && v.get("rateLimit").is_none());
    }

    #[test]
    fn endpoint_out_writes_both_filter_names() {
        let out = EndpointOut {
            id: "ep_1".into(),
            uid: Some("u".into()),
            url: "https://x".into(),
            description: String::new(),
            disabled: false,
            filter_types: FilterTypesOut(Some(BTreeSet::from(["a.b".to_owned()]))),
            channels: None,
            throttle_rate: ThrottleRateOut(None),
            max_concurrency: None,
            ordering: "none",
            request_timeout_ms: None,
            signature_headers: None,
            disabled_reason: None,
            signature_type: "hmac",
            public_key: None,
            health: None,
            metadata: Metadata::new(),
            version: 1,
            created_at: datetime!(2024-05-01 12:00 UTC),
            updated_at: datetime!(2024-05-01 12:00 UTC),
        };
        let v = serde_json::to_value(&out).unwrap();
        assert_eq!(v["filterTypes"], json!(["a.b"]));
        assert_eq!(v["eventTypes"], json!(["a.b"]));
        assert_eq!(v["description"], json!(""));
        assert_eq!(v["createdAt"], json!("2024-05-01T12:00:00Z"));
        assert!(v.get("channels").is_none());
    }

    #[test]
    fn message_and_attempt_out_shapes() {
        let msg = MessageOut {
            id: "msg_1".into(),
            event_id: None,
            event_type: "a.b".into(),
            payload: RawValue::from_string(r#"{"x": 1.50}"#.into()).unwrap(),
            channels: None,
            tags: None,
            timestamp: datetime!(2024-05-01 12:00 UTC),
            deliver_at: None,
        };
        let text = serde_json::to_string(&msg).unwrap();
        assert!(text.contains(r#""payload":{"x": 1.50}"#), "{text}");
        assert!(!text.contains("eventId") && !text.contains("deliverAt"));

        let att = MessageAttemptOut {
            id: "atmpt_1".into(),
            msg_id: "msg_1".into(),
            endpoint_id: "ep_1".into(),
            url: "https://x".into(),
            response: "ok".into(),
            response_status_code: 200,
            response_duration_ms: 12,
            status: MessageStatus::Success,
            status_text: MessageStatus::Success.text(),
            trigger_type: MessageAttemptTriggerType::Scheduled,
            trigger: "scheduled",
            outcome: "success",
            timestamp: datetime!(2024-05-01 12:00 UTC),
            msg: None,
        };
        let v = serde_json::to_value(&att).unwrap();
        assert_eq!(v["status"], json!(0));
        assert_eq!(v["statusText"], json!("success"));
        assert_eq!(v["triggerType"], json!(0));
        assert_eq!(v["responseStatusCode"], json!(200));
        assert_eq!(v["responseDurationMs"], json!(12));
        assert_eq!(v["msgId"], json!("msg_1"));
        assert_eq!(v["endpointId"], json!("ep_1"));

        let page = ListResponse {
            data: vec![att],
            iterator: None,
            prev_iterator: None,
            done: true,
        };
        let v = serde_json::to_value(&page).unwrap();
        assert_eq!(v["iterator"], Value::Null);
        assert!(v.as_object().unwrap().contains_key("iterator"));
        assert_eq!(v["prevIterator"], Value::Null);
        assert_eq!(v["done"], json!(true));

        assert_eq!(serde_json::from_str::<MessageStatus>("2").unwrap(), MessageStatus::Fail);
        assert!(serde_json::from_str::<MessageStatus>("9").is_err());
    }

    #[test]
    fn error_bodies() {
        let v = serde_json::to_value(HttpError::new("not_found", "no such app")).unwrap();
        assert_eq!(v, json!({"code":"not_found","detail":"no such app"}));
    }
}
