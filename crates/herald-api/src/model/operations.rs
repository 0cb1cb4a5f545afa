//! Operators' repairs: recover, replay, background tasks, cancellation, expunging and an endpoint's
//! delivery counts (`routes/operations.rs`).

use std::collections::BTreeMap;

use herald_core::id::{MessageIdOrEventId, TaskId};
use time::OffsetDateTime;

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
    pub id: TaskId,
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
    pub ids: Option<Vec<MessageIdOrEventId>>,
}

/// Answer of the bulk expunge (Svix `BulkExpungeContentsOut`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct BulkExpungeOut {
    /// Per message named: `expunged` or `not-found`.
    pub results: BTreeMap<String, &'static str>,
}

/// The answer to a cancellation (Herald extension).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelledOut {
    /// Pending deliveries cancelled.
    pub cancelled: u64,
}
