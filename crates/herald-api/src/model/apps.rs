//! Applications: the bodies of `/api/v1/app` (`routes/apps.rs`).

use herald_core::id::AppId;
use time::OffsetDateTime;

use super::common::{Metadata, Patch, ThrottleRateOut, non_null, null_as_default, null_resets};

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
    pub id: AppId,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use time::macros::datetime;

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
    fn application_out_field_names() {
        let id = AppId::new();
        let out = ApplicationOut {
            id: id.clone(),
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
            json!({"id":id.as_str(),"name":"n","throttleRate":3,"rateLimit":3,"metadata":{},"verifyEndpoints":false,
                   "createdAt":"2024-05-01T12:00:00.5Z","updatedAt":"2024-05-01T12:00:00.5Z"})
        );
        let out = ApplicationOut {
            throttle_rate: ThrottleRateOut(None),
            ..out
        };
        let v = serde_json::to_value(&out).unwrap();
        assert!(v.get("throttleRate").is_none() && v.get("rateLimit").is_none());
    }
}
