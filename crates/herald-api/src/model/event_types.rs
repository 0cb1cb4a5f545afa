//! Event types: the bodies of `/api/v1/event-type` (`routes/event_types.rs`) and of its OpenAPI import
//! (`routes/event_type_import.rs`).

use time::OffsetDateTime;

use super::common::{JsonObject, Patch, null_as_default, null_resets};

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
