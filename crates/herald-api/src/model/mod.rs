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
//!
//! One file a resource, named after the routes that serve it (`routes/apps.rs` answers with the types of
//! `model/apps.rs`), so one resource is read in two places: `apps`, `event_types`, `endpoints` (with an
//! endpoint's secret, headers and `send-example`), `messages` (with the batch and the precheck),
//! `attempts` (the status enums and the delivery views built on them), `operations`, `stats`, `tenancy`,
//! `operational_events` and `polling` (pull delivery). What they all use is in `common`. This file only
//! names them: every type is re-exported by name below, so `crate::model::X` is the one path callers use
//! and the list says which file holds it. The types stay apart from their handlers so that `convert.rs`,
//! `keys.rs` and the validators can build them without importing a route.

mod apps;
mod attempts;
mod common;
mod endpoints;
mod event_types;
mod messages;
mod operational_events;
mod operations;
mod polling;
mod stats;
mod tenancy;

pub use apps::{ApplicationIn, ApplicationOut, ApplicationPatch};
pub use attempts::{
    EndpointMessageOut, MessageAttemptOut, MessageAttemptTriggerType, MessageEndpointOut, MessageStatus,
    MessageStatusText,
};
pub use common::{
    FilterTypesOut, HttpError, JsonObject, ListResponse, Metadata, Patch, ThrottleRateOut, non_null, null_as_default,
    null_resets,
};
pub use endpoints::{
    EndpointHeadersIn, EndpointHeadersOut, EndpointHeadersPatchIn, EndpointHealthOut, EndpointIn, EndpointOut,
    EndpointPatch, EndpointSecretOut, EndpointSecretRotateIn, EndpointUpdate, EventExampleIn,
};
pub use event_types::{
    EventTypeFromOpenApiOut, EventTypeImportIn, EventTypeImportOut, EventTypeImportResult, EventTypeIn, EventTypeOut,
    EventTypePatch, EventTypeUpdate,
};
pub use messages::{
    MAX_BATCH_MESSAGES, MessageBatchIn, MessageBatchItemOut, MessageBatchOut, MessageIn, MessageOut, MessagePrecheckIn,
    MessagePrecheckOut, empty_payload,
};
pub use operational_events::OperationalEventOut;
pub use operations::{
    BackgroundTaskOut, BulkExpungeIn, BulkExpungeOut, BulkReplayIn, CancelledOut, EndpointStatsOut, RepairIn,
};
pub use polling::{
    PollerV2CommitIn, PollerV2MessageOut, PollerV2PollOut, PollingEndpointConsumerSeekIn,
    PollingEndpointConsumerSeekOut, PollingEndpointIn, PollingEndpointOut, PollingEndpointPatch,
    PollingEndpointSinkOut, PollingEndpointTokenIn, PollingEndpointTokenOut,
};
pub use stats::{AttemptStatisticsData, AttemptStatisticsResponse, EndpointAttemptStatsOut};
pub use tenancy::{AppPortalAccessIn, AppPortalAccessOut, ApplicationTokenExpireIn, TokenInfoOut};
