//! Operational events: what `/api/v1/operational-event` lists (`routes/operational_events.rs`).

use herald_core::id::AppId;
use time::OffsetDateTime;

/// Something Herald did on its own that operators must know about (Herald extension).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationalEventOut {
    /// Position in the log (increasing).
    pub id: String,
    /// E.g. `endpoint.disabled`.
    pub event_type: String,
    /// The application concerned.
    pub app_id: AppId,
    /// The event's data, e.g. `{"endpointId": …, "appId": …, "reason": …}`.
    pub data: serde_json::Value,
    /// When it happened.
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
}
