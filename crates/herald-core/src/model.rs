//! The domain records Herald stores and serves. Moments are [`Millis`]; spans are millisecond counts named `…_ms`.

use std::collections::BTreeMap;
use std::sync::Arc;

pub use herald_signature::HeaderNames;

use crate::clock::Millis;
use crate::id::{AppId, AttemptId, EndpointId, MessageId, TaskId};
use crate::outcome::OutcomeClass;

/// Free-form string labels a client attaches to an application or endpoint.
pub type Metadata = BTreeMap<String, String>;

/// Custom HTTP headers an endpoint adds to every request, by lower-case name.
pub type Headers = BTreeMap<String, String>;

/// A tenant: the owner of endpoints and messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Application {
    /// Its id.
    pub id: AppId,
    /// Optional client-chosen unique id, accepted wherever the id is.
    pub uid: Option<String>,
    /// Human name.
    pub name: String,
    /// Default deliveries per second for the app's endpoints, if limited.
    pub rate_limit: Option<u32>,
    /// New endpoints must echo a signed challenge before they are enabled (ownership check).
    pub verify_endpoints: bool,
    /// Days a message's payload is kept when the message sets no retention of its own
    /// (`payloadRetentionPeriod`); `None` keeps payloads until expunged by hand.
    pub payload_retention_days: Option<u32>,
    /// Client labels.
    pub metadata: Metadata,
    /// Creation time.
    pub created_at: Millis,
    /// Last change.
    pub updated_at: Millis,
}

/// A kind of event producers publish (global, like Svix's event types).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventType {
    /// The unique name, e.g. `invoice.paid`.
    pub name: String,
    /// What the event means.
    pub description: String,
    /// Archived types are hidden from listings but still deliverable.
    pub archived: bool,
    /// Marked for removal.
    pub deprecated: bool,
    /// Optional feature flag gating visibility (Svix's older single-flag form).
    pub feature_flag: Option<String>,
    /// Feature flags gating visibility (Svix's `featureFlags`).
    pub feature_flags: Option<Vec<String>>,
    /// The display group (Svix's `groupName`).
    pub group_name: Option<String>,
    /// JSON schemas by version, kept as raw JSON text.
    pub schemas: Option<String>,
    /// Creation time.
    pub created_at: Millis,
    /// Last change.
    pub updated_at: Millis,
}

/// Why Herald disabled an endpoint: stored as `disabled_reason` and shown as `disabledReason`, both as
/// the text [`DisabledReason::as_str`] gives, which [`DisabledReason::parse`] reads back exactly. The store
/// parses it on reading, the API prints it on answering; in between, the engine, the ownership check and
/// the API tell the states apart by variant instead of by comparing strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DisabledReason {
    /// Held until its ownership check passes (`awaiting ownership verification`).
    AwaitingVerification,
    /// Its ownership check failed. The whole text, which begins with `ownership verification failed`
    /// (built by [`DisabledReason::verification_failed`]).
    VerificationFailed(String),
    /// Herald disabled it on its own (a 410 answer, attempts failing for too long): the reason.
    Automatic(String),
}

impl DisabledReason {
    /// The text of [`DisabledReason::AwaitingVerification`].
    const AWAITING_VERIFICATION: &'static str = "awaiting ownership verification";
    /// The beginning of the text of [`DisabledReason::VerificationFailed`].
    const VERIFICATION_FAILED: &'static str = "ownership verification failed";

    /// The reason a stored or shown text names.
    pub fn parse(text: &str) -> Self {
        if text == Self::AWAITING_VERIFICATION {
            Self::AwaitingVerification
        } else if text.starts_with(Self::VERIFICATION_FAILED) {
            Self::VerificationFailed(text.to_owned())
        } else {
            Self::Automatic(text.to_owned())
        }
    }

    /// A failed ownership check, `why` saying how it failed.
    pub fn verification_failed(why: &str) -> Self {
        Self::VerificationFailed(format!("{}: {why}", Self::VERIFICATION_FAILED))
    }

    /// The text stored and shown.
    pub fn as_str(&self) -> &str {
        match self {
            Self::AwaitingVerification => Self::AWAITING_VERIFICATION,
            Self::VerificationFailed(text) | Self::Automatic(text) => text,
        }
    }

    /// The text stored and shown, owned.
    pub fn into_text(self) -> String {
        match self {
            Self::AwaitingVerification => Self::AWAITING_VERIFICATION.to_owned(),
            Self::VerificationFailed(text) | Self::Automatic(text) => text,
        }
    }

    /// Whether the endpoint is held because of its ownership check (pending or failed).
    pub fn held_by_verification(&self) -> bool {
        matches!(self, Self::AwaitingVerification | Self::VerificationFailed(_))
    }
}

/// A receiver's URL and what it subscribes to. `Debug` leaves the secret out.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Its id.
    pub id: EndpointId,
    /// The owning application's id.
    pub app_id: AppId,
    /// Optional client-chosen id, unique within the app.
    pub uid: Option<String>,
    /// Where deliveries go.
    pub url: String,
    /// Human description.
    pub description: String,
    /// Event types delivered here; `None` or empty means all.
    pub filter_types: Option<Vec<String>>,
    /// Channels delivered here; `None` or empty means all.
    pub channels: Option<Vec<String>>,
    /// A disabled endpoint receives nothing; its deliveries wait.
    pub disabled: bool,
    /// Why Herald disabled it, when Herald did (e.g. a 410 answer, a pending ownership check).
    pub disabled_reason: Option<DisabledReason>,
    /// Deliveries per second, if limited (Svix's `throttleRate`), paced evenly.
    pub rate_limit: Option<u32>,
    /// The most requests in flight to this endpoint; `None` for the operator's default.
    pub max_concurrency: Option<u32>,
    /// Whether deliveries sharing an ordering key go one at a time, in order.
    pub ordering: Ordering,
    /// Time allowed for one attempt, in milliseconds; `None` for the operator's default.
    pub request_timeout_ms: Option<u32>,
    /// The names its signature headers are sent under (`webhook-*`, `svix-*` or both); `None` for the
    /// operator's setting (`HERALD_SIGNATURE_HEADERS`).
    pub signature_headers: Option<HeaderNames>,
    /// Endpoint version (Svix field; informational).
    pub version: i32,
    /// Client labels.
    pub metadata: Metadata,
    /// The current signing key: `whsec_…` (HMAC, `v1`) or `whsk_…` (Ed25519, `v1a`). Keys it replaced
    /// that still sign during their grace period are kept apart (see [`PreviousSecret`]).
    pub secret: String,
    /// Custom headers sent with every request (never the signature or transport headers).
    pub headers: Headers,
    /// Creation time.
    pub created_at: Millis,
    /// Last change.
    pub updated_at: Millis,
}

/// A signing key an endpoint rotated away from, which still signs (next to the current one) until it
/// expires, so receivers can switch keys without rejecting anything. `Debug` leaves the key out.
#[derive(Clone, PartialEq, Eq)]
pub struct PreviousSecret {
    /// The key, `whsec_…` or `whsk_…`.
    pub secret: String,
    /// When it stopped being the current key.
    pub rotated_at: Millis,
    /// From this time on it no longer signs.
    pub expires_at: Millis,
}

impl std::fmt::Debug for PreviousSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreviousSecret")
            .field("secret", &"<redacted>")
            .field("rotated_at", &self.rotated_at)
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id)
            .field("app_id", &self.app_id)
            .field("uid", &self.uid)
            .field("url", &self.url)
            .field("filter_types", &self.filter_types)
            .field("channels", &self.channels)
            .field("disabled", &self.disabled)
            .field("secret", &"<redacted>")
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Whether a message of `event_type` on `channels` is delivered to this endpoint.
    ///
    /// An endpoint without filter types takes every type; one without channels takes every channel. An
    /// endpoint *with* channels takes only messages that name at least one of them.
    pub fn subscribes_to(&self, event_type: &str, channels: Option<&[String]>) -> bool {
        filters_match(
            self.filter_types.as_deref(),
            self.channels.as_deref(),
            event_type,
            channels,
        )
    }
}

/// The subscription rule of endpoints and polling endpoints: a message of `event_type` on `channels` passes
/// `filter_types` (none or empty: every type) and `wanted_channels` (none or empty: every channel; else the
/// message must name at least one of them).
pub fn filters_match(
    filter_types: Option<&[String]>,
    wanted_channels: Option<&[String]>,
    event_type: &str,
    channels: Option<&[String]>,
) -> bool {
    let type_ok = match filter_types {
        Some(types) if !types.is_empty() => types.iter().any(|t| t == event_type),
        _ => true,
    };
    let channel_ok = match wanted_channels {
        Some(wanted) if !wanted.is_empty() => channels.is_some_and(|given| given.iter().any(|c| wanted.contains(c))),
        _ => true,
    };
    type_ok && channel_ok
}

/// How an endpoint orders its deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ordering {
    /// No order: deliveries go out in parallel, up to the endpoint's concurrency cap (the default).
    #[default]
    Unordered,
    /// Deliveries of messages with the same `orderingKey` go one at a time, in message order.
    Key,
}

impl Ordering {
    /// The name used by the API and the store.
    pub const fn as_str(self) -> &'static str {
        match self {
            Ordering::Unordered => "none",
            Ordering::Key => "key",
        }
    }

    /// The mode named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "none" => Some(Ordering::Unordered),
            "key" => Some(Ordering::Key),
            _ => None,
        }
    }
}

/// A published event, kept byte-for-byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Its id; also the `webhook-id` of every attempt.
    pub id: MessageId,
    /// The owning application's id.
    pub app_id: AppId,
    /// The producer's own unique id for the event, if given (deduplicated per app).
    pub event_id: Option<String>,
    /// The event type name.
    pub event_type: String,
    /// Channels the message is published on.
    pub channels: Option<Vec<String>>,
    /// The exact JSON bytes the producer posted as `payload`. Shared: a fan-out never copies it.
    pub payload: Arc<[u8]>,
    /// Deliveries with the same key go one at a time to endpoints in ordered mode (e.g. a resource id).
    pub ordering_key: Option<String>,
    /// Free-form tags the message can be listed by (`tags`); they do not change its delivery.
    pub tags: Option<Vec<String>>,
    /// When its deliveries are first attempted (`deliverAt`, scheduled delivery); `None` for at once.
    pub deliver_at: Option<Millis>,
    /// Creation time.
    pub created_at: Millis,
}

impl Message {
    /// When the first attempt of each of its deliveries is due: its `deliverAt`, or its creation when it
    /// has none or when that time had already passed at creation.
    pub fn due_at(&self) -> Millis {
        self.deliver_at.map_or(self.created_at, |at| at.max(self.created_at))
    }
}

/// Where a delivery (one message to one endpoint) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryStatus {
    /// Waiting for its next attempt.
    Pending,
    /// The endpoint accepted it.
    Delivered,
    /// A terminal failure (a 4xx other than 408/425/429); no more attempts.
    Failed,
    /// Every scheduled attempt failed.
    Dead,
    /// Cancelled by an operator.
    Cancelled,
}

/// Something operators are told about (e.g. an endpoint was disabled), recorded for operational webhooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationalEvent {
    /// Store-assigned, increasing.
    pub seq: i64,
    /// The event type, e.g. `endpoint.disabled`.
    pub event_type: String,
    /// The application concerned.
    pub app_id: AppId,
    /// The event's data as JSON text.
    pub data: String,
    /// When it happened.
    pub created_at: Millis,
}

impl DeliveryStatus {
    /// The integer stored in the database.
    pub const fn code(self) -> i64 {
        match self {
            DeliveryStatus::Pending => 0,
            DeliveryStatus::Delivered => 1,
            DeliveryStatus::Failed => 2,
            DeliveryStatus::Dead => 3,
            DeliveryStatus::Cancelled => 4,
        }
    }

    /// The status stored as `code`, if it is one.
    pub const fn from_code(code: i64) -> Option<Self> {
        Some(match code {
            0 => DeliveryStatus::Pending,
            1 => DeliveryStatus::Delivered,
            2 => DeliveryStatus::Failed,
            3 => DeliveryStatus::Dead,
            4 => DeliveryStatus::Cancelled,
            _ => return None,
        })
    }
}

/// Why an attempt was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttemptTrigger {
    /// By the schedule.
    #[default]
    Scheduled,
    /// By an operator (resend).
    Manual,
    /// By a bulk repair: recover or replay-missing.
    Recover,
}

impl AttemptTrigger {
    /// The integer stored in the database.
    pub const fn code(self) -> i64 {
        match self {
            AttemptTrigger::Scheduled => 0,
            AttemptTrigger::Manual => 1,
            AttemptTrigger::Recover => 2,
        }
    }

    /// The trigger stored as `code` (unknown codes read as scheduled).
    pub const fn from_code(code: i64) -> Self {
        match code {
            1 => AttemptTrigger::Manual,
            2 => AttemptTrigger::Recover,
            _ => AttemptTrigger::Scheduled,
        }
    }

    /// The stable name shown by the API.
    pub const fn as_str(self) -> &'static str {
        match self {
            AttemptTrigger::Scheduled => "scheduled",
            AttemptTrigger::Manual => "manual",
            AttemptTrigger::Recover => "recover",
        }
    }
}

/// Where a background task stands: stored as `state` and shown as `status`, both as the text
/// [`TaskState::as_str`] gives (Svix's `BackgroundTaskStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// At work (or interrupted by a stop and not yet carried on or failed).
    Running,
    /// Done.
    Finished,
    /// Gave up: its `data` says why.
    Failed,
}

impl TaskState {
    /// Every state, in the order of [`TaskState::as_str`]'s names.
    pub const ALL: [TaskState; 3] = [TaskState::Running, TaskState::Finished, TaskState::Failed];

    /// The name stored and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            TaskState::Running => "running",
            TaskState::Finished => "finished",
            TaskState::Failed => "failed",
        }
    }

    /// The state named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == name)
    }
}

/// What a background task does: stored as `kind` and shown as `task`, both as the text
/// [`TaskKind::as_str`] gives (the names Svix's `BackgroundTaskType` uses for the same work).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskKind {
    /// Re-queue an endpoint's failed and dead deliveries of a window (`endpoint.recover`).
    Recover,
    /// Give an endpoint the messages of a window it never got (`endpoint.replay`).
    ReplayMissing,
    /// Send an endpoint again the messages of a window it was sent, narrowed by filters
    /// (`endpoint.bulk-replay`).
    BulkReplay,
    /// Expunge the payload of every message of an application (`application.purge_content`).
    PurgeContent,
}

impl TaskKind {
    /// Every kind Herald runs.
    pub const ALL: [TaskKind; 4] = [
        TaskKind::Recover,
        TaskKind::ReplayMissing,
        TaskKind::BulkReplay,
        TaskKind::PurgeContent,
    ];

    /// The name stored and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            TaskKind::Recover => "endpoint.recover",
            TaskKind::ReplayMissing => "endpoint.replay",
            TaskKind::BulkReplay => "endpoint.bulk-replay",
            TaskKind::PurgeContent => "application.purge_content",
        }
    }

    /// The kind named `name`, if Herald runs it (Svix names kinds Herald has no task of).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

/// A bulk operation running in the background (recover, replay-missing), with its progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackgroundTask {
    /// Its id.
    pub id: TaskId,
    /// What it does.
    pub kind: TaskKind,
    /// The application concerned.
    pub app_id: AppId,
    /// Where it stands.
    pub state: TaskState,
    /// Items handled so far.
    pub processed: u64,
    /// Items to handle, as counted when the task started.
    pub total: u64,
    /// The task's parameters and results as JSON text.
    pub data: String,
    /// When it started.
    pub created_at: Millis,
    /// Its last progress.
    pub updated_at: Millis,
}

/// One HTTP attempt of one delivery; the attempt log is append-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// Its id.
    pub id: AttemptId,
    /// The message.
    pub message_id: MessageId,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The URL the attempt went to (the endpoint may change later).
    pub url: String,
    /// 1 for the first attempt of the delivery, and so on.
    pub attempt_number: u32,
    /// Whether it was delivered.
    pub success: bool,
    /// What its result means (stored as [`OutcomeClass::as_str`]).
    pub outcome: OutcomeClass,
    /// The HTTP status, when there was an answer.
    pub response_status: Option<u16>,
    /// The start of the response body (capped), or a description of the error.
    pub response: String,
    /// How long the attempt took.
    pub duration_ms: i64,
    /// Why it was made.
    pub trigger: AttemptTrigger,
    /// When it started.
    pub created_at: Millis,
}

impl Attempt {
    /// When it ended: its start plus how long it took (the delivery's change time, an event's time).
    pub fn finished_at(&self) -> Millis {
        self.created_at.add_ms(self.duration_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(types: Option<&[&str]>, channels: Option<&[&str]>) -> Endpoint {
        let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        Endpoint {
            id: EndpointId::new(),
            app_id: AppId::new(),
            uid: None,
            url: "https://example.com".into(),
            description: String::new(),
            filter_types: types.map(owned),
            channels: channels.map(owned),
            disabled: false,
            disabled_reason: None,
            rate_limit: None,
            max_concurrency: None,
            ordering: Ordering::Unordered,
            request_timeout_ms: None,
            signature_headers: None,
            version: 1,
            metadata: Metadata::new(),
            secret: "whsec_x".into(),
            headers: Headers::new(),
            created_at: Millis::EPOCH,
            updated_at: Millis::EPOCH,
        }
    }

    #[test]
    fn subscription_rules() {
        let chans = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let all = endpoint(None, None);
        assert!(all.subscribes_to("a", None));
        assert!(all.subscribes_to("a", Some(&chans(&["x"]))));
        assert!(endpoint(Some(&[]), Some(&[])).subscribes_to("a", None));
        let typed = endpoint(Some(&["a", "b"]), None);
        assert!(typed.subscribes_to("b", None));
        assert!(!typed.subscribes_to("c", None));
        let chan = endpoint(None, Some(&["x", "y"]));
        assert!(chan.subscribes_to("a", Some(&chans(&["z", "y"]))));
        assert!(!chan.subscribes_to("a", Some(&chans(&["z"]))));
        assert!(
            !chan.subscribes_to("a", None),
            "a channel endpoint skips channel-less messages"
        );
        let both = endpoint(Some(&["a"]), Some(&["x"]));
        assert!(both.subscribes_to("a", Some(&chans(&["x"]))));
        assert!(!both.subscribes_to("b", Some(&chans(&["x"]))));
    }

    #[test]
    fn a_disabled_reason_reads_back_its_own_text() {
        for reason in [
            DisabledReason::AwaitingVerification,
            DisabledReason::verification_failed("the endpoint answered 500"),
            DisabledReason::Automatic("the endpoint answered 410 Gone".to_owned()),
        ] {
            assert_eq!(DisabledReason::parse(reason.as_str()), reason);
            assert_eq!(reason.clone().into_text(), reason.as_str());
        }
        assert_eq!(
            DisabledReason::AwaitingVerification.as_str(),
            "awaiting ownership verification"
        );
        assert_eq!(
            DisabledReason::verification_failed("no echo").as_str(),
            "ownership verification failed: no echo"
        );
        assert!(DisabledReason::parse("ownership verification failed: x").held_by_verification());
        assert!(!DisabledReason::parse("gone").held_by_verification());
    }

    #[test]
    fn task_states_and_kinds_read_back_their_own_names() {
        for state in TaskState::ALL {
            assert_eq!(TaskState::parse(state.as_str()), Some(state));
        }
        for kind in TaskKind::ALL {
            assert_eq!(TaskKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(TaskState::parse("Running"), None);
        assert_eq!(
            TaskKind::parse("application.stats"),
            None,
            "a Svix kind Herald never runs"
        );
    }
}
