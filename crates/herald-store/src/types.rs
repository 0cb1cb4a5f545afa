//! The data the [`Store`](crate::Store) trait takes and answers, beside the model types of `herald_core::model`.

use std::sync::Arc;

use herald_core::clock::Millis;
use herald_core::id::{AppId, EndpointId, SinkId};
use herald_core::model::{Application, Attempt, AttemptTrigger, DeliveryStatus, Endpoint, Message, PreviousSecret};

/// A response remembered for an idempotency key, and the request it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remembered {
    /// The HTTP status answered.
    pub status: u16,
    /// The body answered.
    pub body: Vec<u8>,
    /// A digest of the request (method, path, query and body), to refuse the key's reuse for another
    /// request; `None` for responses remembered before digests were kept.
    pub request_digest: Option<String>,
}

/// A message to ingest. The store assigns its id and creation time in the batch that commits it, so ids
/// follow commit order (a reader paging by id never skips a message that committed late) — across
/// PostgreSQL nodes as far as their clocks agree (see `postgres::remembered`) — and it fans the
/// message out to the app's enabled, subscribed endpoints *inside the same transaction*, so the fan-out
/// always matches the endpoints as committed.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// The application's id.
    pub app_id: AppId,
    /// The producer's own unique id for the event, if given (deduplicated per app).
    pub event_id: Option<String>,
    /// The event type name.
    pub event_type: String,
    /// Channels the message is published on.
    pub channels: Option<Vec<String>>,
    /// The exact payload bytes.
    pub payload: Arc<[u8]>,
    /// The producer's `idempotency-key` header, if any.
    pub idempotency_key: Option<String>,
    /// The message's ordering key, for endpoints in ordered mode.
    pub ordering_key: Option<String>,
    /// Its tags (each indexed, see [`MessageFilter::tag`]).
    pub tags: Option<Vec<String>>,
    /// When its deliveries are first due (scheduled delivery); `None` for at once. Its deliveries are
    /// committed with it, their first attempt due then.
    pub deliver_at: Option<Millis>,
    /// Deliver to this one endpoint of the application (by id) instead of to its subscribers: an event
    /// type's example sent to one endpoint. An id the application does not have gets no delivery.
    pub to_endpoint: Option<EndpointId>,
    /// How long after its creation the payload is kept (`payloadRetentionPeriod`); `None` keeps it. The
    /// retention job expunges it once that has passed and no delivery of it is pending.
    pub payload_retention_ms: Option<i64>,
}

/// A delivery created by ingest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedDelivery {
    /// Its store sequence number.
    pub seq: i64,
    /// Its endpoint.
    pub endpoint_id: EndpointId,
}

/// The result of an ingest.
#[derive(Debug, Clone)]
pub enum Ingested {
    /// A new message, committed with its deliveries.
    Created {
        /// The message as stored, shared with the deliveries handed to the engine.
        message: Arc<Message>,
        /// Its deliveries.
        deliveries: Vec<CreatedDelivery>,
    },
    /// The event id or idempotency key was seen before: this is the original message, nothing was added.
    Duplicate(Message),
}

/// A pending delivery read back for the scheduler.
#[derive(Debug, Clone)]
pub struct PendingDelivery {
    /// Store sequence number.
    pub seq: i64,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The message, with its payload (shared across the fan-out).
    pub message: Arc<Message>,
    /// Attempts made so far.
    pub attempts: u32,
    /// When the next attempt is due.
    pub next_attempt_at: Millis,
    /// When the delivery's time window starts: the message's creation, or when it was re-queued.
    pub window_start: Millis,
    /// Why its next attempt is made.
    pub trigger: AttemptTrigger,
}

/// A finished attempt and the delivery's new state, as the delivery engine reports it.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    /// The delivery.
    pub delivery_seq: i64,
    /// The message's application.
    pub app_id: AppId,
    /// The attempt to append to the log.
    pub attempt: Attempt,
    /// The delivery's status after it.
    pub status: DeliveryStatus,
    /// When the next attempt is due (meaningful while pending).
    pub next_attempt_at: Millis,
}

/// What the delivery engine sends an endpoint's deliveries with (see
/// [`DeliveryStore::sending_records`](crate::DeliveryStore::sending_records)).
#[derive(Debug, Clone)]
pub struct SendingRecord {
    /// The endpoint, its secret opened.
    pub endpoint: Endpoint,
    /// The keys it rotated away from that still sign, most recently rotated first.
    pub previous_secrets: Vec<PreviousSecret>,
    /// Its application.
    pub app: Application,
}

/// How many deliveries wait for an endpoint, and since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Backlog {
    /// Pending deliveries, counted up to [`Backlog::COUNT_CAP`].
    pub pending: u64,
    /// More than [`Backlog::COUNT_CAP`] wait: `pending` is a lower bound.
    pub capped: bool,
    /// Creation time of the oldest pending delivery's message.
    pub oldest_created_at: Option<Millis>,
}

impl Backlog {
    /// The most pending deliveries counted exactly. Counting is a walk of the endpoint's pending index,
    /// and the health block that shows it is read often (dashboards poll it): a million-delivery backlog
    /// took seconds per read, the cap keeps one read to a fraction of a second.
    pub const COUNT_CAP: u64 = 100_000;

    /// From a count of at most `COUNT_CAP + 1` rows and the oldest pending delivery's creation time.
    pub fn from_count(counted: i64, oldest_created_at: Option<Millis>) -> Self {
        let counted = u64::try_from(counted).unwrap_or(0);
        Self {
            pending: counted.min(Self::COUNT_CAP),
            capped: counted > Self::COUNT_CAP,
            oldest_created_at,
        }
    }
}

/// Where one message's delivery to one endpoint stands.
#[derive(Debug, Clone)]
pub struct DeliveryView {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The delivery's status.
    pub status: DeliveryStatus,
    /// Attempts made so far.
    pub attempts: u32,
    /// When the next attempt is due (while pending).
    pub next_attempt_at: Millis,
    /// When the delivery last changed.
    pub updated_at: Millis,
}

/// A delivery with its message, for an endpoint's or an application's delivery listings.
#[derive(Debug, Clone)]
pub struct DeliveryRecord {
    /// Its store sequence number (the listing's sort key).
    pub seq: i64,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The message.
    pub message: Message,
    /// The delivery's status.
    pub status: DeliveryStatus,
    /// Attempts made so far.
    pub attempts: u32,
    /// When the next attempt is due (while pending).
    pub next_attempt_at: Millis,
    /// When the delivery last changed.
    pub updated_at: Millis,
    /// The latest attempt, if any.
    pub last_attempt: Option<Attempt>,
}

/// What became of a request to send a delivery again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// It is pending again, with this new sequence number.
    Queued(i64),
    /// It was still pending: nothing changed.
    AlreadyPending,
    /// Its message's payload was expunged: there is nothing to send.
    Expunged,
}

/// Deliveries of one endpoint by status, over messages created in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeliveryStats {
    /// Delivered.
    pub delivered: u64,
    /// Waiting for an attempt.
    pub pending: u64,
    /// Failed for good or dead.
    pub failed: u64,
    /// Cancelled by an operator.
    pub cancelled: u64,
}

/// An endpoint's attempts in one time bucket (see [`Store::attempt_buckets`](crate::Store::attempt_buckets)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttemptBucket {
    /// Which bucket: it starts `index × bucket_ms` after the window's start.
    pub index: i64,
    /// Attempts that succeeded.
    pub succeeded: u64,
    /// Attempts that failed.
    pub failed: u64,
    /// The sum of their response times, in milliseconds.
    pub total_duration_ms: i64,
    /// The slowest response time, in milliseconds.
    pub max_duration_ms: i64,
}

/// Filters for listing attempts.
#[derive(Debug, Clone, Default)]
pub struct AttemptFilter {
    /// Only successful (`Some(true)`) or failed (`Some(false)`) attempts.
    pub success: Option<bool>,
    /// Only attempts whose response status is in this class (100, 200 … 500), or 0 for "no response".
    pub status_code_class: Option<u16>,
    /// Only attempts of messages of these event types.
    pub event_types: Option<Vec<String>>,
    /// Only attempts of messages with this tag.
    pub tag: Option<String>,
    /// Only attempts of messages on this channel.
    pub channel: Option<String>,
    /// Only attempts made before this time.
    pub before: Option<Millis>,
    /// Only attempts made at or after this time.
    pub after: Option<Millis>,
}

/// Which applications a listing takes, and in which order (the filters are Svix's `exclude_apps_with_…`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppFilter {
    /// Newest first (by id) instead of oldest first.
    pub newest_first: bool,
    /// Leave out applications without endpoints.
    pub exclude_without_endpoints: bool,
    /// Leave out applications that have endpoints, all of them disabled.
    pub exclude_only_disabled: bool,
    /// Leave out applications that have endpoints, all of them delivering to Svix Play
    /// ([`SVIX_PLAY_URL_PREFIX`]).
    pub exclude_only_svix_play: bool,
}

/// Where Svix Play's endpoint URLs start (Svix's hosted webhook inspector).
pub const SVIX_PLAY_URL_PREFIX: &str = "https://play.svix.com/";

/// Which deliveries of an application (or one endpoint) a listing takes: those of messages matching every
/// filter that is set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryFilter {
    /// Only deliveries in this state.
    pub status: Option<DeliveryStatus>,
    /// Only messages with this tag.
    pub tag: Option<String>,
    /// Only messages on this channel.
    pub channel: Option<String>,
    /// Only messages of these event types.
    pub event_types: Option<Vec<String>>,
    /// Only messages created before this time.
    pub before: Option<Millis>,
    /// Only messages created at or after this time.
    pub after: Option<Millis>,
}

/// An application-scoped bearer token, as stored: only its digest, never the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppToken {
    /// Hex SHA-256 of the token.
    pub token_sha256: String,
    /// The one application it may see and change.
    pub app_id: AppId,
    /// Whether it may only read (GET).
    pub read_only: bool,
    /// The one polling endpoint of the application it may read (its stream and its consumers' offsets,
    /// nothing else); `None` for a token of the whole application.
    pub sink_id: Option<SinkId>,
    /// The session it was issued for (`sessionId`), if any: `expire-all` may end only some sessions.
    pub session_id: Option<String>,
    /// When it was issued.
    pub created_at: Millis,
    /// When it stops working.
    pub expires_at: Millis,
}

/// What one retention step removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionStep {
    /// Attempts deleted.
    pub attempts_deleted: u64,
    /// Payloads expunged.
    pub payloads_expunged: u64,
    /// Operational events deleted (sent or not: the log is bounded even without an operational webhook).
    pub events_deleted: u64,
}

impl RetentionStep {
    /// Whether any part of the step came back with `limit` rows (there may be more to do).
    pub fn was_full(&self, limit: usize) -> bool {
        let limit = limit as u64;
        self.attempts_deleted >= limit || self.payloads_expunged >= limit || self.events_deleted >= limit
    }
}

/// Filters for listing messages.
#[derive(Debug, Clone, Default)]
pub struct MessageFilter {
    /// Only messages created at or after this time.
    pub since: Option<Millis>,
    /// Only messages created before this time.
    pub until: Option<Millis>,
    /// Only these event types.
    pub event_types: Option<Vec<String>>,
    /// Only messages on this channel.
    pub channel: Option<String>,
    /// Only messages with this tag (read from the tag index, so a rare tag costs no scan).
    pub tag: Option<String>,
    /// List oldest first (the reconciliation listing) instead of newest first.
    pub oldest_first: bool,
}

/// Which deliveries of one endpoint a bulk re-queue takes (recover, bulk replay): finished ones (never
/// pending) of messages created in `[since, until)` whose payload was not expunged, narrowed by the
/// filters that are set.
#[derive(Debug, Clone)]
pub struct RequeueSelection {
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// Only deliveries in one of these states (pending ones are ignored: they are going out anyway).
    pub statuses: Vec<DeliveryStatus>,
    /// Messages created at or after this time.
    pub since: Millis,
    /// Messages created before this time.
    pub until: Millis,
    /// Only messages of these event types.
    pub event_types: Option<Vec<String>>,
    /// Only messages on this channel.
    pub channel: Option<String>,
    /// Only messages with this tag (each candidate looked up in the tag index by its key).
    pub tag: Option<String>,
    /// Only deliveries whose latest attempt got a response of this class (100, 200, … 500), or none
    /// (0: no attempt, or no HTTP response).
    pub status_class: Option<i64>,
    /// Only deliveries with a `seq` above this one (a resumed task's progress).
    pub after_seq: i64,
    /// Only deliveries with a `seq` at most this one (what existed when the task started).
    pub through_seq: i64,
    /// The reason their next attempt is made.
    pub trigger: AttemptTrigger,
}

/// What one [`Store::requeue_selected`](crate::Store::requeue_selected) call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequeueChunk {
    /// Deliveries made pending.
    pub queued: u64,
    /// The highest old `seq` taken; `None` when nothing was left to take.
    pub last_seq: Option<i64>,
}
