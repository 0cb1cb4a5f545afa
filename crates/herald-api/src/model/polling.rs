//! The wire shapes of pull delivery: polling endpoints (a Herald resource beside the SDKs' `sink_id`
//! paths) and the SDKs' `PollingEndpointOut` (its messages are [`MessageOut`]s: the SDKs'
//! `PollingEndpointMessageOut` has the same fields), `PollingEndpointConsumerSeekIn`/
//! `Out`, `PollerV2PollOut`, `PollerV2MessageOut` and `PollerV2CommitIn`.

use std::collections::BTreeSet;

use herald_core::id::SinkId;
use time::OffsetDateTime;

use super::common::{Metadata, Patch, non_null};
use super::messages::MessageOut;

/// Body of `POST /api/v1/app/{app_id}/polling-endpoint`: a polling endpoint, filtered like an endpoint.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollingEndpointIn {
    /// Optional caller-chosen unique id within the application.
    #[serde(default)]
    pub uid: Option<String>,
    /// Human-readable description; defaults to `""`.
    #[serde(default)]
    pub description: String,
    /// Event types in the stream (`eventTypes`, alias `filterTypes`); absent or empty = all.
    #[serde(default, alias = "filterTypes", deserialize_with = "crate::sets::option::<_, 256>")]
    pub event_types: Option<BTreeSet<String>>,
    /// Channels in the stream; absent or empty = all.
    #[serde(default, deserialize_with = "crate::sets::option::<_, 10>")]
    pub channels: Option<BTreeSet<String>>,
    /// Free-form metadata; defaults to `{}`.
    #[serde(default)]
    pub metadata: Metadata,
    /// The key forwarded messages are signed with (`whsec_` + base64); generated when absent.
    #[serde(default)]
    pub secret: Option<String>,
}

/// Body of `PATCH /api/v1/app/{app_id}/polling-endpoint/{sink_id}`: absent keys keep their value, `null`
/// clears a nullable one.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollingEndpointPatch {
    /// New uid, or `null` to remove it.
    #[serde(default)]
    pub uid: Patch<String>,
    /// New description (non-nullable).
    #[serde(default, deserialize_with = "non_null")]
    pub description: Option<String>,
    /// New event types, or `null` for all.
    #[serde(default, alias = "filterTypes", deserialize_with = "crate::sets::patch::<_, 256>")]
    pub event_types: Patch<BTreeSet<String>>,
    /// New channels, or `null` for all.
    #[serde(default, deserialize_with = "crate::sets::patch::<_, 10>")]
    pub channels: Patch<BTreeSet<String>>,
    /// New metadata (non-nullable).
    #[serde(default, deserialize_with = "non_null")]
    pub metadata: Option<Metadata>,
}

/// A polling endpoint as answered.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PollingEndpointSinkOut {
    /// `sink_…` id: the `sink_id` of the poller paths.
    pub id: SinkId,
    /// The caller's uid, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Description.
    pub description: String,
    /// Event types in the stream; absent = all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_types: Option<BTreeSet<String>>,
    /// Channels in the stream; absent = all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<BTreeSet<String>>,
    /// Metadata.
    pub metadata: Metadata,
    /// Creation time.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last change.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// A page of a polled stream (the SDKs' `PollingEndpointOut`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct PollingEndpointOut {
    /// The messages, oldest first.
    pub data: Vec<MessageOut>,
    /// Where to continue: pass it back as `iterator`.
    pub iterator: String,
    /// Whether the stream holds nothing more at the moment.
    pub done: bool,
}

/// Body of `POST …/poller/{sink_id}/consumer/{consumer_id}/seek`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct PollingEndpointConsumerSeekIn {
    /// The consumer continues with the first message created at or after this time.
    #[serde(with = "time::serde::rfc3339")]
    pub after: OffsetDateTime,
}

/// Answer of a seek.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PollingEndpointConsumerSeekOut {
    /// The consumer's new position, as an iterator.
    pub iterator: String,
}

/// One message of a v2 poll: the message as everywhere else (the SDKs' `PollingEndpointMessageOut`), with
/// its offset.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PollerV2MessageOut {
    /// The message's offset in the stream: commit it once processed.
    pub offset: i64,
    /// The message.
    #[serde(flatten)]
    pub message: MessageOut,
}

/// Answer of a v2 poll.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PollerV2PollOut {
    /// The leased messages, oldest first.
    pub data: Vec<PollerV2MessageOut>,
    /// Whether the stream holds nothing more at the moment.
    pub done: bool,
}

/// Body of `POST …/polling-endpoint/{sink_id}/consumer/{consumer_id}/commit`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct PollerV2CommitIn {
    /// Everything up to this offset is processed.
    #[serde(deserialize_with = "crate::whole::required")]
    pub offset: i64,
}

/// Body of `POST /api/v1/app/{app_id}/polling-endpoint/{sink_id}/token`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollingEndpointTokenIn {
    /// Seconds until the token expires (1 s to 7 days; default 7 days).
    #[serde(default, deserialize_with = "crate::whole::option")]
    pub expiry: Option<u64>,
}

/// A polling endpoint token, shown once.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PollingEndpointTokenOut {
    /// The bearer token (`herald_sink_…`): it reads this polling endpoint's stream and nothing else.
    pub token: String,
}
