//! Application-scoped tokens: the bodies of `/api/v1/auth/…` (`routes/tenancy.rs`).

use herald_core::id::AppId;
use time::OffsetDateTime;

use super::apps::ApplicationIn;

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
    pub app_id: Option<AppId>,
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
