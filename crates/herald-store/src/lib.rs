//! Herald's durable store.
//!
//! [`Store`] is everything the API and the delivery engine need from storage. [`SqlStore`] implements it
//! once, each statement one SQL text for both dialects, on an embedded SQLite file
//! ([`sqlite::SqliteStore`]) or on PostgreSQL ([`postgres::PgStore`]), where any number of nodes can share
//! one database (see [`Ownership`]); only what the dialects truly do differently (bulk inserts, leases
//! and fencing, retention, notifications) is written per dialect. The store owns *custody*:
//! [`Store::ingest`] returns only after the message and its whole fan-out are on disk, and it commits many
//! concurrent requests per fsync (group commit) so durability does not cost throughput.

pub mod bounded;
pub mod crypto;
mod dialect;
mod events;
mod group_commit;
pub mod metrics;
mod page;
mod plan;
pub mod polling;
mod portable;
pub mod postgres;
mod rows;
mod sealing;
mod sql;
pub mod sqlite;
mod statement;
mod subscribers;
#[cfg(feature = "testdb")]
pub mod testdb;

use std::sync::Arc;
use std::time::Duration;

use herald_core::clock::Millis;
use herald_core::id::{
    AppId, AppIdOrUid, AttemptId, EndpointId, EndpointIdOrUid, MessageId, MessageIdOrEventId, SinkId, TaskId,
};
use herald_core::model::{
    Application, Attempt, AttemptTrigger, BackgroundTask, DeliveryStatus, DisabledReason, Endpoint, EventType, Message,
    OperationalEvent, PreviousSecret, TaskKind, TaskState,
};

/// The storage plumbing this store shares with the inbox's ([`herald_sql`]): its types are part of this
/// crate's own signatures (`StoreOptions`, `StoreError::fault`, `StoreError::Damaged`), so they are handed on here.
pub use herald_sql::{custody, integrity, is_postgres_url};

pub use crypto::{CryptoError, SecretCipher};
pub use dialect::SqlStore;
pub use page::{Page, PageRequest};
pub use polling::{ConsumerOffset, PollingEndpoint, PollingStore, StreamEntry, StreamPage, scan as scan_stream};

/// Errors from the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The object does not exist.
    #[error("not found")]
    NotFound,
    /// A unique field (named) is already taken.
    #[error("{0} already exists")]
    Conflict(&'static str),
    /// A pagination iterator that this store did not issue.
    #[error("invalid iterator")]
    BadIterator,
    /// The database failed or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Migrations failed at start-up.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value could not be decoded (e.g. corrupt JSON text).
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    /// The store is shutting down.
    #[error("the store is shutting down")]
    Closed,
    /// The database did not answer within the bound of [`custody::DatabaseTimeouts`].
    #[error("the database did not answer within {0:?}")]
    TimedOut(Duration),
    /// A failure shared by every request of a group commit (the underlying error, as text).
    #[error("database error: {0}")]
    Batch(String),
    /// The storage is full (the disk, or the database's quota): nothing was written; retry once space
    /// is freed.
    #[error("storage full: {0}")]
    StorageFull(String),
    /// The database reports its file damaged (what it said): nothing was written.
    #[error("the database file is damaged: {0}")]
    FileCorrupt(String),
    /// The start-up check found the SQLite file damaged (see [`integrity`]).
    #[error(transparent)]
    Damaged(#[from] integrity::Damaged),
    /// The secret key given to the store does not open the secrets stored with it (refused at open, so a
    /// wrong key never signs with garbage), or a stored secret does not decrypt.
    #[error("secret key: {0}")]
    SecretKey(String),
}

impl StoreError {
    /// The storage fault behind this error, if it is one (see [`custody::fault_of`]).
    pub fn fault(&self) -> Option<custody::Fault> {
        match self {
            StoreError::Database(error) => custody::fault_of(error),
            StoreError::StorageFull(_) => Some(custody::Fault::Full),
            StoreError::FileCorrupt(_) | StoreError::Damaged(_) => Some(custody::Fault::Corrupt),
            StoreError::Batch(_) | StoreError::Closed | StoreError::TimedOut(_) => Some(custody::Fault::Unavailable),
            _ => None,
        }
    }

    /// The error every request of a failed group commit gets: [`StoreError::StorageFull`] when the
    /// storage is full, [`StoreError::Batch`] otherwise.
    pub(crate) fn shared_by_batch(error: &StoreError) -> StoreError {
        match error.fault() {
            Some(custody::Fault::Full) => StoreError::StorageFull(error.to_string()),
            Some(custody::Fault::Corrupt) => StoreError::FileCorrupt(error.to_string()),
            _ => StoreError::Batch(error.to_string()),
        }
    }
}

/// Shorthand for store results.
pub type StoreResult<T> = Result<T, StoreError>;

impl From<custody::TimedOut> for StoreError {
    fn from(timed_out: custody::TimedOut) -> Self {
        StoreError::TimedOut(timed_out.0)
    }
}

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

/// A message to ingest. The store assigns its id and creation time when it commits it, so ids follow
/// commit order (a reader paging by id never skips a message that committed late), and it fans the
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
        /// The message as stored.
        message: Message,
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

/// An endpoint's attempts in one time bucket (see [`Store::attempt_buckets`]).
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

/// What one [`Store::requeue_selected`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequeueChunk {
    /// Deliveries made pending.
    pub queued: u64,
    /// The highest old `seq` taken; `None` when nothing was left to take.
    pub last_seq: Option<i64>,
}

herald_sql::bounded_trait! {
/// Everything Herald keeps. Implemented per backend; every method is safe to call concurrently. On
/// PostgreSQL every `async` call is bounded on the client's side ([`bounded::BoundedStore`]).
pub trait Store: [PollingStore + Send + Sync + 'static], bounded in bounded::BoundedStore {
    /// Read a value from the store's own key-value table (e.g. the admin token's hash).
    async fn meta_get(&self, key: &str) -> StoreResult<Option<String>>;
    /// Write a value to the key-value table.
    async fn meta_set(&self, key: &str, value: &str) -> StoreResult<()>;

    /// Create an application; `Conflict("uid")` if its uid is taken.
    async fn create_app(&self, app: &Application) -> StoreResult<()>;
    /// Find an application by id or uid.
    async fn get_app(&self, id_or_uid: &AppIdOrUid) -> StoreResult<Application>;
    /// List applications, oldest first.
    async fn list_apps(&self, page: &PageRequest, filter: &AppFilter) -> StoreResult<Page<Application>>;
    /// Replace an application's fields (by id).
    async fn update_app(&self, app: &Application) -> StoreResult<()>;
    /// Delete an application and everything it owns.
    async fn delete_app(&self, id: &AppId) -> StoreResult<()>;

    /// Create an event type; `Conflict("name")` if it exists.
    async fn create_event_type(&self, event_type: &EventType) -> StoreResult<()>;
    /// Find an event type by name.
    async fn get_event_type(&self, name: &str) -> StoreResult<EventType>;
    /// List event types by name (from Z to A when `descending`).
    async fn list_event_types(
        &self,
        page: &PageRequest,
        include_archived: bool,
        descending: bool,
    ) -> StoreResult<Page<EventType>>;
    /// Replace an event type's fields.
    async fn update_event_type(&self, event_type: &EventType) -> StoreResult<()>;
    /// Delete an event type.
    async fn delete_event_type(&self, name: &str) -> StoreResult<()>;

    /// Create an endpoint; `Conflict("uid")` if its uid is taken within the app. Records an
    /// `endpoint.created` operational event in the same transaction.
    ///
    /// Every backend stores the endpoint's `secret` and `headers` encrypted with the store's
    /// [`SecretCipher`] (context: the endpoint id) and decrypts them on every read that returns an
    /// [`Endpoint`].
    async fn create_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()>;
    /// Find an endpoint of an app by id or uid.
    async fn get_endpoint(&self, app_id: &AppId, id_or_uid: &EndpointIdOrUid) -> StoreResult<Endpoint>;
    /// Find an endpoint by id alone (for the delivery engine).
    async fn get_endpoint_by_id(&self, id: &EndpointId) -> StoreResult<Endpoint>;
    /// List an app's endpoints, oldest first, or newest first when `newest_first` (Svix's default order).
    async fn list_endpoints(&self, app_id: &AppId, page: &PageRequest, newest_first: bool) -> StoreResult<Page<Endpoint>>;
    /// Every endpoint of an app (for fan-out).
    async fn app_endpoints(&self, app_id: &AppId) -> StoreResult<Vec<Endpoint>>;
    /// Replace an endpoint's fields (by id), except its `secret`: only
    /// [`Store::rotate_endpoint_secret`] changes that, so an update read before a rotation can never undo
    /// it. Records an `endpoint.updated` operational event in the same transaction.
    async fn update_endpoint(&self, endpoint: &Endpoint) -> StoreResult<()>;
    /// Make `new_secret` the endpoint's signing key, in one transaction. The key it replaces keeps signing
    /// until `old_expires_at` (it is not kept at all unless that is after `now`), and every older key
    /// still signing expires no later than that either: a rotation with no grace period (a compromised
    /// key) leaves only the new key. Expired keys are removed. `NotFound` if the endpoint does not exist.
    async fn rotate_endpoint_secret(
        &self,
        endpoint_id: &EndpointId,
        new_secret: &str,
        old_expires_at: Millis,
        now: Millis,
    ) -> StoreResult<()>;
    /// The keys an endpoint rotated away from that still sign at `now` (`expires_at > now`), most
    /// recently rotated first. Empty for an unknown endpoint.
    async fn previous_secrets(&self, endpoint_id: &EndpointId, now: Millis) -> StoreResult<Vec<PreviousSecret>>;
    /// Delete an endpoint and its pending deliveries. Records an `endpoint.deleted` operational event in
    /// the same transaction.
    async fn delete_endpoint(&self, id: &EndpointId) -> StoreResult<()>;

    /// Find a message of an app by id (or event id).
    async fn get_message(&self, app_id: &AppId, id: &MessageIdOrEventId) -> StoreResult<Message>;
    /// List an app's messages, newest first.
    async fn list_messages(
        &self,
        app_id: &AppId,
        filter: &MessageFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Message>>;

    /// Endpoints that have pending deliveries (read at start-up).
    async fn endpoints_with_pending(&self) -> StoreResult<Vec<EndpointId>>;
    /// Pending deliveries of an endpoint with `seq > after_seq`, in `seq` order.
    async fn load_pending(&self, endpoint_id: &EndpointId, after_seq: i64, limit: usize) -> StoreResult<Vec<PendingDelivery>>;
    /// Append attempts and update their deliveries, all in one transaction, with the `message.attempt.*`
    /// operational events they cause (see [`Store::unsent_operational_events`]).
    async fn record_attempts(&self, records: &[AttemptRecord]) -> StoreResult<()>;
    /// Mark these deliveries dead without an attempt (their time window ended while they waited), if
    /// they are still pending, each with a `message.attempt.exhausted` operational event
    /// (`reason: "expired"`) in the same transaction.
    async fn expire_deliveries(&self, seqs: &[i64], now: Millis) -> StoreResult<()>;
    /// Mark dead every pending delivery of an endpoint whose time window started before `created_before`
    /// (its message's creation, or when it was re-queued; the endpoint is paused or its breaker open, so
    /// they waited past their window), each with a `message.attempt.exhausted` event as
    /// [`Store::expire_deliveries`]; returns how many.
    async fn expire_waiting(&self, endpoint_id: &EndpointId, created_before: Millis, now: Millis) -> StoreResult<u64>;
    /// Pending deliveries of an endpoint and the age of the oldest.
    async fn endpoint_backlog(&self, endpoint_id: &EndpointId) -> StoreResult<Backlog>;
    /// Disable an endpoint with a reason (stored, and given in the event, as [`DisabledReason::as_str`]'s
    /// text) and record an `endpoint.disabled` operational event, in one transaction. Returns `false` if it
    /// was already disabled or is gone (nothing recorded then).
    async fn disable_endpoint(&self, endpoint_id: &EndpointId, reason: &DisabledReason, now: Millis) -> StoreResult<bool>;
    /// Set an endpoint's disabled flag and reason, but only if its reason is still `expected_reason` (so an
    /// ownership check never overrides what a client or Herald decided since); `true` if it changed.
    async fn set_endpoint_state(
        &self,
        endpoint_id: &EndpointId,
        expected_reason: &DisabledReason,
        disabled: bool,
        reason: Option<&DisabledReason>,
        now: Millis,
    ) -> StoreResult<bool>;
    /// Operational events, oldest first, with `seq > after`.
    async fn list_operational_events(&self, after: i64, limit: usize) -> StoreResult<Vec<OperationalEvent>>;
    /// Operational events, newest first, with `seq < before` (from the newest when `None`).
    async fn list_operational_events_newest(
        &self,
        before: Option<i64>,
        limit: usize,
    ) -> StoreResult<Vec<OperationalEvent>>;
    /// An endpoint's attempts made in `[since, until)`, counted in buckets of `bucket_ms` from `since`,
    /// oldest bucket first; buckets without an attempt are left out.
    async fn attempt_buckets(
        &self,
        endpoint_id: &EndpointId,
        since: Millis,
        until: Millis,
        bucket_ms: i64,
    ) -> StoreResult<Vec<AttemptBucket>>;
    /// Operational events not yet sent to the operational webhook, oldest first, with `seq > after`.
    ///
    /// Every backend records operational events in the same transaction as what they report:
    /// `endpoint.created`, `endpoint.updated` and `endpoint.deleted` in [`Store::create_endpoint`],
    /// [`Store::update_endpoint`] and [`Store::delete_endpoint`]; `endpoint.disabled` in
    /// [`Store::disable_endpoint`]; and in [`Store::record_attempts`] `message.attempt.failing` (a delivery's
    /// 4th attempt failed), `message.attempt.exhausted` (a delivery ended dead or failed for good) and
    /// `message.attempt.recovered` (a delivery succeeded after one of those two was recorded for the same
    /// message and endpoint); `message.attempt.exhausted` also in [`Store::expire_deliveries`] and
    /// [`Store::expire_waiting`], and `endpoint.updated` in [`Store::rotate_endpoint_secret`]. Events about a
    /// delivery carry its message and endpoint ids.
    async fn unsent_operational_events(&self, after: i64, limit: usize) -> StoreResult<Vec<OperationalEvent>>;
    /// Mark an operational event as handled by the operational webhook (sent, or given up on).
    async fn mark_operational_event_sent(&self, seq: i64, now: Millis) -> StoreResult<()>;

    /// Record an application-scoped token (its digest only); `NotFound` if the application does not exist.
    async fn create_app_token(&self, token: &AppToken) -> StoreResult<()>;
    /// The token with this digest, if it exists and has not expired at `now`.
    async fn find_app_token(&self, token_sha256: &str, now: Millis) -> StoreResult<Option<AppToken>>;
    /// Make every token of an application — or, with `sessions`, only those issued for one of these
    /// sessions — expire at `at` at the latest (revocation, with an optional grace period); returns how
    /// many tokens were shortened.
    async fn expire_app_tokens(&self, app_id: &AppId, sessions: Option<&[String]>, at: Millis) -> StoreResult<u64>;
    /// Make the one token with this digest expire at `at` at the latest (a logout); `NotFound` if there is
    /// none.
    async fn expire_app_token(&self, token_sha256: &str, at: Millis) -> StoreResult<()>;

    /// One small retention batch, each part in its own short transaction: delete up to `limit` attempts
    /// created before `attempts_before`; expunge up to `limit` payloads whose expiry is at or before `now`
    /// and that no pending delivery still needs (as [`Store::expunge_payload`]: metadata and attempts stay);
    /// and delete up to `limit` operational events created before `attempts_before` that the operational
    /// webhook has handled (events not yet sent stay, however old). The caller repeats it while a part comes
    /// back full.
    async fn retention_step(&self, attempts_before: Millis, now: Millis, limit: usize) -> StoreResult<RetentionStep>;

    /// Attempts of a message, newest first.
    async fn list_attempts_by_message(
        &self,
        app_id: &AppId,
        message_id: &MessageId,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Attempt>>;
    /// Attempts to an endpoint, newest first.
    async fn list_attempts_by_endpoint(
        &self,
        app_id: &AppId,
        endpoint_id: &EndpointId,
        filter: &AttemptFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<Attempt>>;
    /// The deliveries of a message, one per endpoint it was fanned out to, by endpoint id.
    async fn list_deliveries_of_message(
        &self,
        app_id: &AppId,
        message_id: &MessageId,
        page: &PageRequest,
    ) -> StoreResult<Page<DeliveryView>>;
    /// A delivery's status and attempt count (for tests and operators).
    async fn delivery_state(&self, message_id: &MessageId, endpoint_id: &EndpointId) -> StoreResult<(DeliveryStatus, u32)>;

    /// The response remembered for an idempotency key in `scope`, if it was stored at or after `since`.
    async fn idempotent_response(&self, scope: &str, key: &str, since: Millis) -> StoreResult<Option<Remembered>>;
    /// Remember a response for an idempotency key (the first one stored wins), and forget responses
    /// stored before `expire_before`.
    async fn remember_response(
        &self,
        scope: &str,
        key: &str,
        remembered: &Remembered,
        now: Millis,
        expire_before: Millis,
    ) -> StoreResult<()>;

    /// Send a finished delivery (delivered, failed, dead or cancelled) again: it becomes pending with a new
    /// sequence number (so it sorts after everything the scheduler has read), a fresh retry schedule whose
    /// time window starts `now`, and `trigger` as the reason of its next attempt.
    async fn requeue_delivery(
        &self,
        message_id: &MessageId,
        endpoint_id: &EndpointId,
        trigger: AttemptTrigger,
        now: Millis,
    ) -> StoreResult<Requeue>;
    /// Deliveries of an endpoint that `selection` takes.
    async fn count_selected(&self, selection: &RequeueSelection) -> StoreResult<u64>;
    /// Re-queue up to `limit` of those, lowest `seq` first (as [`Store::requeue_delivery`] with the
    /// selection's trigger), in one transaction. Re-queued deliveries are pending under new `seq`s above
    /// every `through_seq` taken before, so calling again takes the next ones and never the same delivery
    /// twice.
    async fn requeue_selected(&self, selection: &RequeueSelection, limit: usize, now: Millis) -> StoreResult<RequeueChunk>;
    /// The highest delivery `seq` given out so far (0 when none): a bulk re-queue that goes no higher
    /// takes only deliveries that existed when it started.
    async fn last_delivery_seq(&self) -> StoreResult<i64>;
    /// Messages of an app created in `[since, until)`.
    async fn count_messages(&self, app_id: &AppId, since: Millis, until: Millis) -> StoreResult<u64>;
    /// Scan up to `limit` messages of the endpoint's app created in `[since, until)` with an id after
    /// `after` (in id order) and give the endpoint a delivery of every one it subscribes to and has none of
    /// (trigger: recover, window from `now`). Returns (the last id scanned, deliveries created); no id
    /// when the scan is over.
    async fn add_missing_deliveries(
        &self,
        endpoint: &Endpoint,
        since: Millis,
        until: Millis,
        after: Option<&MessageId>,
        limit: usize,
        now: Millis,
    ) -> StoreResult<(Option<MessageId>, u64)>;
    /// Cancel the pending deliveries of a message, of an endpoint, or of one message to one endpoint (at
    /// least one is given), within an app; returns the (endpoint id, seq) of each.
    async fn cancel_pending(
        &self,
        app_id: &AppId,
        message_id: Option<&MessageId>,
        endpoint_id: Option<&EndpointId>,
        now: Millis,
    ) -> StoreResult<Vec<(EndpointId, i64)>>;
    /// Remove a message's payload (it becomes `{}` and is marked expunged); metadata and attempts stay.
    async fn expunge_payload(&self, app_id: &AppId, message_id: &MessageId) -> StoreResult<()>;
    /// Expunge up to `limit` payloads of an app's messages created at or before `before` that still have
    /// theirs, in one transaction, cancelling their pending deliveries (nothing is left to send). Returns
    /// how many were expunged and the (endpoint id, seq) of each delivery cancelled; fewer than `limit`
    /// means none is left.
    async fn expunge_app_payloads(
        &self,
        app_id: &AppId,
        before: Millis,
        limit: usize,
        now: Millis,
    ) -> StoreResult<(u64, Vec<(EndpointId, i64)>)>;
    /// Remove the response body stored with one attempt of a message (it becomes empty).
    async fn expunge_attempt_response(&self, app_id: &AppId, message_id: &MessageId, attempt_id: &AttemptId) -> StoreResult<()>;
    /// Deliveries of an app, newest first, optionally of one endpoint, one status and messages with one tag.
    async fn list_deliveries(
        &self,
        app_id: &AppId,
        endpoint_id: Option<&EndpointId>,
        filter: &DeliveryFilter,
        page: &PageRequest,
    ) -> StoreResult<Page<DeliveryRecord>>;
    /// Deliveries of an endpoint by status, over messages created in `[since, until)`.
    async fn endpoint_stats(&self, endpoint_id: &EndpointId, since: Millis, until: Millis) -> StoreResult<DeliveryStats>;
    /// Record a new background task.
    async fn create_task(&self, task: &BackgroundTask) -> StoreResult<()>;
    /// Update a task's state, progress and data.
    async fn update_task(&self, task: &BackgroundTask) -> StoreResult<()>;
    /// Every task, newest first unless not `newest_first`, optionally in one state and of one kind.
    async fn list_tasks(
        &self,
        state: Option<TaskState>,
        kind: Option<TaskKind>,
        page: &PageRequest,
        newest_first: bool,
    ) -> StoreResult<Page<BackgroundTask>>;
    /// A task by id; `app_id` restricts it to one application.
    async fn get_task(&self, id: &TaskId, app_id: Option<&AppId>) -> StoreResult<BackgroundTask>;
    /// Close the background tasks a stopped process left running — on SQLite every task still running when
    /// a process starts (`starting`), on PostgreSQL, shared by nodes, those that made no progress for a
    /// minute: those whose kind is in `resume` are claimed for the caller to carry on (their `updated_at`
    /// becomes `now`; two callers never claim the same task) and returned, the others are marked failed.
    /// Returns the claimed tasks and how many were failed.
    async fn take_interrupted_tasks(
        &self,
        now: Millis,
        starting: bool,
        resume: &[TaskKind],
    ) -> StoreResult<(Vec<BackgroundTask>, u64)>;

    /// Whether the database answers.
    async fn ping(&self) -> StoreResult<()>;
}
unbounded {
    /// Commit a message and its deliveries durably, deduplicating on event id and idempotency key.
    /// `NotFound` when the application does not exist (e.g. it was deleted a moment ago).
    ///
    /// Bounded by the store itself, not by [`bounded::BoundedStore`]: a message answered with an error
    /// is never committed afterwards. On PostgreSQL its request waits for the group-commit writer to take
    /// it for at most the bound of every call, then (`TimedOut`) it is given back unwritten; once taken,
    /// it waits for its batch, which the writer gives up after the same bound.
    async fn ingest(&self, new: NewMessage) -> StoreResult<Ingested>;
    /// [`Store::ingest`] for many messages at once, answered per message in the order given. They are
    /// queued at the group-commit writer in that order, so they share its commits and are created in
    /// that order (one ordering key's messages keep it); should a commit fail, or a message's wait run
    /// out before the writer took it, none of the messages queued after it is written either (each is
    /// answered with an error), so what was stored is always a prefix of each ordering key's messages.
    async fn ingest_many(&self, batch: Vec<NewMessage>) -> StoreResult<Vec<StoreResult<Ingested>>>;

    /// The stream of committed changes the delivery engine acts on ([`Change`]), in commit order: the
    /// deliveries [`Store::ingest`] committed on this node, and every endpoint change, re-queue and
    /// cancellation the store committed (on PostgreSQL, endpoint changes of every node too). It can be
    /// taken once; later calls return `None`.
    fn take_changes(&self) -> Option<ChangeStream>;

    /// The node is stopping: hand over whatever this node holds for others (PostgreSQL: its partition
    /// leases, so that other nodes take its work over at once instead of after the lease time).
    async fn shutdown(&self) {}

    /// Which delivery work this node may do, when several nodes share the store; `None` (the default)
    /// means this node does all of it.
    fn ownership(&self) -> Option<Arc<dyn Ownership>> {
        None
    }
}
forwarded {
    async fn ingest(&self, new: NewMessage) -> StoreResult<Ingested> {
        self.inner.ingest(new).await
    }

    async fn ingest_many(&self, batch: Vec<NewMessage>) -> StoreResult<Vec<StoreResult<Ingested>>> {
        self.inner.ingest_many(batch).await
    }

    fn take_changes(&self) -> Option<ChangeStream> {
        self.inner.take_changes()
    }

    async fn shutdown(&self) {
        self.shutdown_within().await;
    }

    fn ownership(&self) -> Option<Arc<dyn Ownership>> {
        self.inner.ownership()
    }
}
}

/// The number of delivery partitions endpoints hash into. Fixed: every node must agree on it.
pub const PARTITIONS: i32 = 256;

/// The delivery partition of an endpoint: FNV-1a of its id, so every node computes the same one.
pub fn partition_of(endpoint_id: &str) -> i32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in endpoint_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    // The remainder is below PARTITIONS, so it always fits.
    i32::try_from(hash % PARTITIONS.unsigned_abs() as u64).unwrap_or(0)
}

/// Scale-out: which endpoints this node delivers for. Nodes sharing a store own disjoint partitions of
/// the endpoints (see [`partition_of`]), so per-endpoint caps, rate limits and breakers hold across the
/// cluster with no per-delivery coordination.
pub trait Ownership: Send + Sync + 'static {
    /// Whether this node may send the endpoint's deliveries now.
    fn owns(&self, endpoint_id: &str) -> bool;
    /// Changes the delivery engine must act on. It can be taken once; later calls return `None`.
    fn take_events(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<OwnershipEvent>>;
}

/// A change in what this node should deliver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnershipEvent {
    /// These endpoints, owned by this node, may have pending deliveries that it has not seen: their
    /// partition was just taken over, or another node ingested messages for them.
    Work(Vec<EndpointId>),
    /// These partitions were given up or lost: stop scheduling their endpoints (what is in flight
    /// finishes; its results are fenced). The engine forgets their queues even if a partition is owned
    /// again by the time it reads this: a queue kept across a lapse would hold a cursor past deliveries
    /// committed while this node did not own it, and skip them; the takeover announces the partition's
    /// backlog afresh ([`OwnershipEvent::Work`], always after this event).
    Released(Vec<i32>),
    /// Every delivery up to this `seq` is committed, and the endpoints this node owns among them have
    /// been announced (by [`OwnershipEvent::Work`] before this event, or by this node's own commit feed).
    ///
    /// Sent after each look for new work. The engine needs it because deliveries reach it by two roads —
    /// its own commit feed at once, other nodes' through the store a little later — and an endpoint's
    /// queue reads the store only past the highest `seq` it holds: a delivery committed by another node
    /// just before one of this node's must be announced before this node's is taken straight from the
    /// feed, or the queue would move past it (see the engine's `accept_committed`).
    Seen(i64),
}

/// Settings of the store beyond its URL.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// PostgreSQL: how long a partition lease lasts without renewal (the fail-over bound).
    pub lease_ttl: Duration,
    /// PostgreSQL: how long a node keeps a partition it gives up after it stopped sending to it, so
    /// that its attempts in flight end before another node starts (the longest attempt).
    pub release_drain: Duration,
    /// PostgreSQL: attempts older than this are dropped, a day partition at a time.
    pub attempt_retention: Duration,
    /// PostgreSQL: how long the database may keep a request waiting before it is answered 503.
    pub database: custody::DatabaseTimeouts,
    /// SQLite: how much of the file is checked before it is served (see [`integrity`]).
    pub sqlite_check: integrity::SqliteCheck,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(10),
            release_drain: Duration::from_secs(16),
            attempt_retention: Duration::from_secs(30 * 24 * 3600),
            database: custody::DatabaseTimeouts::default(),
            sqlite_check: integrity::SqliteCheck::default(),
        }
    }
}

/// A change the store committed that the delivery engine must act on (see [`Store::take_changes`]). The
/// store announces each after its commit, from the one place that wrote it, so the API only writes and
/// the engine hears every change in one stream.
#[derive(Debug, Clone)]
pub enum Change {
    /// Deliveries [`Store::ingest`] committed on this node (the commit feed): straight into the queues.
    Committed(Vec<PendingDelivery>),
    /// An endpoint was created, changed (its fields, keys or state) or deleted: reload it. On PostgreSQL
    /// also every other node's, by notification.
    Endpoint(EndpointId),
    /// Deliveries of an endpoint became pending outside ingest (resend, recover, replay): read its
    /// backlog from the store.
    Backlog(EndpointId),
    /// Pending deliveries (endpoint, seq) were cancelled: never send them.
    Cancelled(Vec<(EndpointId, i64)>),
    /// An endpoint was written held for its ownership check (created so, changed while held, or asked to
    /// prove itself again): run the check. Announced only on the node that wrote it, never by
    /// notification, so one node sends the challenge however many share the database. Follows that
    /// write's [`Change::Endpoint`].
    VerificationDue(EndpointId),
}

/// The changes a store committed, in commit order (see [`Store::take_changes`]).
pub type ChangeStream = tokio::sync::mpsc::UnboundedReceiver<Change>;

/// A shared handle to any store.
pub type SharedStore = Arc<dyn Store>;

/// Open the store named by a database URL (`sqlite://PATH` or `postgres://…`) with these options, run
/// its migrations, and check that `cipher` holds the key its secrets were encrypted with (`SecretKey`
/// error otherwise); secrets stored before encryption existed are encrypted then.
pub async fn open_with(database_url: &str, cipher: SecretCipher, options: &StoreOptions) -> StoreResult<SharedStore> {
    if database_url.starts_with("sqlite:") {
        integrity::check(database_url, options.sqlite_check).await?;
        Ok(Arc::new(sqlite::SqliteStore::open(database_url, cipher).await?))
    } else if is_postgres_url(database_url) {
        let store = postgres::PgStore::open(database_url, cipher, options).await?;
        let bound = store.bound();
        Ok(Arc::new(bounded::BoundedStore::new(Arc::new(store), bound)))
    } else {
        Err(StoreError::Corrupt(format!(
            "unsupported database URL {database_url:?}: expected sqlite://PATH or postgres://…"
        )))
    }
}

/// Run the migrations of the database at `database_url` and nothing else (`herald migrate`).
pub async fn migrate(database_url: &str) -> StoreResult<()> {
    if database_url.starts_with("sqlite:") {
        integrity::check(database_url, integrity::SqliteCheck::Basic).await?;
        sqlite::migrate(database_url).await
    } else if is_postgres_url(database_url) {
        postgres::migrate(database_url).await
    } else {
        Err(StoreError::Corrupt(format!(
            "unsupported database URL {database_url:?}: expected sqlite://PATH or postgres://…"
        )))
    }
}
